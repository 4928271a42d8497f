"""Spark read throughput: ``spark.read.format("tidelog")`` vs ``spark.read.parquet`` of the same
rows, measured side by side in one run (not a test; prints a table).

    python bench/spark_read.py [--rows 2000000] [--payload 100] [--runs 5] [--master local[2]]

The store is built first (one topic, ``--rows`` records of ``--payload`` random bytes, closed so
every record sits in sealed segments), then Spark copies the tidelog DataFrame to Parquet once,
then both are scanned ``--runs`` times each, alternating, with the ``noop`` sink (every column is
materialised, nothing is written). Also reported: the adapter's Python-side read alone, on one
core, without Spark (the ceiling for one executor). Rates are medians with min–max over the runs.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
import time

import tidelog
from tidelog.adapters.spark import reading, source
from tidelog.adapters.spark.demo import spark_session
from tidelog.adapters.spark.options import parse_options


def build_store(root: str, rows: int, payload: int) -> float:
    t0 = time.perf_counter()
    chunk = 10_000
    with tidelog.open(f"file://{root}", segment_max_records=500_000) as store:
        t = store.topic("bench", durability="disk", trim="none")
        data = os.urandom(payload * chunk)
        for start in range(0, rows, chunk):
            n = min(chunk, rows - start)
            t.append_many([data[i * payload : (i + 1) * payload] for i in range(n)], tag="b")
    return time.perf_counter() - t0


def open_view(root: str) -> float:
    """What each executor Python worker pays once: opening its read-only view (XPR-1)."""
    t0 = time.perf_counter()
    reading.view(root)
    return time.perf_counter() - t0


def python_side(root: str, rows: int, extra: dict[str, str]) -> float:
    """The tasks the Spark read plans (same ranges), read one after another in this process."""
    opts = parse_options({"path": root, "topic": "bench", **extra})
    t0 = time.perf_counter()
    n = 0
    for part in source._partitions(opts, 1, rows):
        lo, hi = part.lo, part.hi
        n += sum(b.num_rows for b in reading.read_log(opts, lo, hi))
    assert n == rows, (n, rows)
    return time.perf_counter() - t0


def rates(rows: int, times: list[float]) -> str:
    """rows/s as median [min–max] over the runs."""
    return (
        f"{rows / statistics.median(times):>12,.0f} "
        f"[{rows / max(times):,.0f}–{rows / min(times):,.0f}]"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, default=2_000_000)
    ap.add_argument("--payload", type=int, default=100)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--master", default="local[2]")
    ap.add_argument(
        "--partition-records",
        type=int,
        default=None,
        help="default: the source's default sizing (partitionBytes, 128 MiB of payload per task)",
    )
    ap.add_argument("--dir", default=None, help="work directory (default: a temporary one)")
    args = ap.parse_args()

    work = args.dir or tempfile.mkdtemp(prefix="tidelog-spark-bench-")
    root, parquet = os.path.join(work, "store"), os.path.join(work, "parquet")
    shutil.rmtree(root, ignore_errors=True)
    shutil.rmtree(parquet, ignore_errors=True)
    print(f"building {args.rows:,} records x {args.payload} B in {root} ...", flush=True)
    print(f"  store built in {build_store(root, args.rows, args.payload):.1f} s")
    print(f"  read-only view opened in {open_view(root):.2f} s (once per executor worker)")
    extra = (
        {} if args.partition_records is None else {"partitionRecords": str(args.partition_records)}
    )
    tasks = len(
        source._partitions(parse_options({"path": root, "topic": "bench", **extra}), 1, args.rows)
    )
    print(f"  {tasks} read tasks ({extra or 'default sizing'})")
    python_side(root, args.rows, extra)  # warm-up
    py = [python_side(root, args.rows, extra) for _ in range(args.runs)]
    print(f"  adapter read without Spark (1 core), rows/s: {rates(args.rows, py)}")

    spark = spark_session(args.master, app="tidelog-spark-read-bench")
    try:
        tl = spark.read.format("tidelog").option("topic", "bench").options(**extra).load(root)
        t0 = time.perf_counter()
        tl.write.parquet(parquet)
        print(f"  Parquet copy written by Spark in {time.perf_counter() - t0:.1f} s")
        pq = spark.read.parquet(parquet)
        assert pq.count() == args.rows
        scans = {"tidelog": tl, "parquet": pq}
        times: dict[str, list[float]] = {k: [] for k in scans}
        for df in scans.values():  # warm-up, not counted: workers open their views
            for _ in range(2):
                df.write.format("noop").mode("overwrite").save()
        for _ in range(args.runs):
            for name, df in scans.items():
                t0 = time.perf_counter()
                df.write.format("noop").mode("overwrite").save()
                times[name].append(time.perf_counter() - t0)
        print(
            f"\nSpark scan of {args.rows:,} rows (6 columns, {args.payload} B payload), "
            f"{args.master}, {args.runs} runs each, alternating:"
        )
        print(f"  {'source':<9} {'rows/s median [min–max]':>36}   runs (s)")
        for name, ts in times.items():
            runs = " ".join(f"{t:.2f}" for t in ts)
            print(f"  {name:<9} {rates(args.rows, ts):>36}   {runs}")
        ratios = [p / t for p, t in zip(times["parquet"], times["tidelog"], strict=True)]
        ratio = statistics.median(times["parquet"]) / statistics.median(times["tidelog"])
        print(
            f"  tidelog / parquet: {ratio:.2f} (medians); per alternating pair "
            f"{min(ratios):.2f}–{max(ratios):.2f}"
        )
    finally:
        spark.stop()
        if not args.dir:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
