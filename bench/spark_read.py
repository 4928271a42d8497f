"""Spark read throughput: ``spark.read.format("tidelog")`` vs ``spark.read.parquet`` of the same
rows, measured side by side in one run (not a test; prints a table).

    python bench/spark_read.py [--rows 2000000] [--payload 100] [--runs 5] [--master local[2]]
                               [--tail] [--net]

The store is built first (one topic, ``--rows`` records of ``--payload`` random bytes, closed so
every record sits in sealed segments; with ``--tail`` the owner stays open with checkpoints held
off, so every record is still only in the WAL: the unsealed tail that streaming reads of fresh
data meet, which read-only views replay into memory), then Spark copies the tidelog DataFrame
to Parquet once, then both are scanned ``--runs`` times each, alternating, with the ``noop`` sink
(every column is materialised, nothing is written). Also reported: the adapter's Python-side
read alone, on one core, without Spark (the ceiling for one executor). Rates are medians with
min–max over the runs. With ``--net`` the store's owner also serves it on 127.0.0.1
(``tidelog serve``'s app on a thread of this process) and a third scan reads it through
``http://``: every task an Arrow read of the owner (spec/BUNDLES.md SPK-40, SERVICE.md SVC-61).
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
from tidelog.hooks import EngineTopics, hooks
from tidelog.service.server import ServiceThread


def build_store(root: str, rows: int, payload: int, tail: bool) -> tidelog.Store | None:
    """The store; with ``tail`` its owner, left open (nothing sealed), else None (closed)."""
    chunk = 10_000
    # tail: no checkpoint before the scans (so none seals the records) and no close
    held = "&checkpoint_bytes=64GiB" if tail else ""
    store = tidelog.open(f"file://{root}?segment_max_records=500000{held}")
    t = store.topic("bench", durability="disk", trim="none")
    data = os.urandom(payload * chunk)
    for start in range(0, rows, chunk):
        n = min(chunk, rows - start)
        t.append_many([data[i * payload : (i + 1) * payload] for i in range(n)], tag="b")
    if not tail:
        store.close()
        return None
    store.flush()
    return store


def sealed_share(root: str) -> float:
    """The share of the topic's records a read-only view finds in sealed segments."""
    store = reading.view(root)
    sealed = sum(c.count for c in hooks(store, EngineTopics).topics["bench"].log.chunks)
    return sealed / max(store.topic("bench").state().head_seq, 1)


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


def serve_store(root: str, owner: tidelog.Store | None) -> tuple[tidelog.Store, ServiceThread]:
    """``--net``: the owner (opened again when the build closed it) serving the store."""
    store = owner if owner is not None else tidelog.open(f"file://{root}")
    return store, ServiceThread(store).start()


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
    ap.add_argument("--tail", action="store_true", help="read the unsealed tail (see above)")
    ap.add_argument("--net", action="store_true", help="also read through the owner (see above)")
    args = ap.parse_args()

    work = args.dir or tempfile.mkdtemp(prefix="tidelog-spark-bench-")
    root, parquet = os.path.join(work, "store"), os.path.join(work, "parquet")
    shutil.rmtree(root, ignore_errors=True)
    shutil.rmtree(parquet, ignore_errors=True)
    print(f"building {args.rows:,} records x {args.payload} B in {root} ...", flush=True)
    t0 = time.perf_counter()
    owner = build_store(root, args.rows, args.payload, args.tail)
    print(f"  store built in {time.perf_counter() - t0:.1f} s")
    print(f"  read-only view opened in {open_view(root):.2f} s (once per executor worker)")
    print(f"  {sealed_share(root):.0%} of the records in sealed segments, the rest in the WAL")
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
    # fromTs=0 keeps every record but takes the public read path (Topic.read per record, SPK-3):
    # what every read of the unsealed tail took before its columnar path
    public = {**extra, "fromTs": "0"}
    if args.tail:
        py = [python_side(root, args.rows, public) for _ in range(max(1, args.runs // 2))]
        print(f"  ... through Topic.read (fromTs=0), rows/s: {rates(args.rows, py)}")
    service = None
    if args.net:
        owner, service = serve_store(root, owner)
        python_side(service.url, args.rows, extra)  # warm-up
        py = [python_side(service.url, args.rows, extra) for _ in range(args.runs)]
        print(f"  ... through the owner (http://, no Spark), rows/s: {rates(args.rows, py)}")

    spark = spark_session(args.master, app="tidelog-spark-read-bench")
    try:
        tl = spark.read.format("tidelog").option("topic", "bench").options(**extra).load(root)
        t0 = time.perf_counter()
        tl.write.parquet(parquet)
        print(f"  Parquet copy written by Spark in {time.perf_counter() - t0:.1f} s")
        pq = spark.read.parquet(parquet)
        assert pq.count() == args.rows
        scans = {"tidelog": tl, "parquet": pq}
        if args.tail:
            reader = spark.read.format("tidelog").option("topic", "bench").options(**public)
            scans["public"] = reader.load(root)
        if service is not None:
            scans["net"] = spark.read.format("tidelog").option("topic", "bench").options(**extra)
            scans["net"] = scans["net"].load(service.url)
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
        for name in [n for n in scans if n != "parquet"]:
            ratios = [p / t for p, t in zip(times["parquet"], times[name], strict=True)]
            ratio = statistics.median(times["parquet"]) / statistics.median(times[name])
            print(
                f"  {name} / parquet: {ratio:.2f} (medians); per alternating pair "
                f"{min(ratios):.2f}–{max(ratios):.2f}"
            )
    finally:
        spark.stop()
        if service is not None:
            service.stop()
        if owner is not None:
            owner.close()
        if not args.dir:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
