"""Spark reads of every place a record can be, beside ``spark.read.parquet`` of the same rows, in
one run (not a test; prints a table; spec/BUNDLES.md SPK-3, SPK-30):

    python bench/spark_tiers.py [--rows 2000000] [--payload 100] [--runs 3] [--master local[2]]
                                [--no-s3] [--cold-cache 1]

Four stores of the same ``--rows`` records of ``--payload`` random bytes (one topic):

* ``sealed``: closed, every record in sealed segments in the store directory (hot);
* ``cold``: every sealed segment relocated to a cold tier in a local directory
  (``hot_retain_segments=0``, spec/TIERING.md TIER-4), read with option ``cold``;
* ``cold-s3``: the same on moto's threaded S3 server on 127.0.0.1 in this process (needs
  ``moto[server]``; else not measured, and said so);
* ``tail``: its owner kept open with checkpoints held off, so every record is still only in the
  WAL (the unsealed tail, which each read-only view replays into memory).

Also scanned: ``cold+`` and ``cold+s3``, the same cold tiers read alone as ``cold+URL`` locations
(SPK-31..SPK-33: no hot store), and ``null``, the ceiling of Spark's Python data source path
here: a source that reads nothing and yields pre-built batches of the log schema, as many tasks
and rows as the sealed read.

The cold cases read with ``coldCacheSegments=--cold-cache`` (default 1): a Python worker keeps
at most that many fetched segments, so every scan fetches its segments again (the cost of a
first read of the history, not of a warm cache). Spark copies the sealed DataFrame to Parquet
once; then every source is scanned ``--runs`` times, alternating, with the ``noop`` sink after
two warm-up scans each. Also reported: the adapter's Python-side read of the same tasks alone, on
one core, without Spark. Rates are medians with min–max over the runs.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import random
import shutil
import statistics
import tempfile
import time
from collections.abc import Iterator
from typing import Any

import tidelog
from tidelog.adapters.spark import coldsource, source
from tidelog.adapters.spark.options import parse_options
from tidelog.bench.spark_read import python_side, rates
from tidelog.hooks import Checkpoint, EngineTopics, hooks

SEGMENT = 500_000
CHUNK = 10_000


def build(root: str, rows: int, payload: int, **options: Any) -> tidelog.Store:
    """An open store holding ``rows`` records of topic ``bench`` (the same bytes every call)."""
    store = tidelog.open(f"file://{root}", segment_max_records=SEGMENT, **options)
    t = store.topic("bench", durability="disk", trim="none")
    data = random.Random(7).randbytes(payload * CHUNK)  # incompressible, the same each call
    for start in range(0, rows, CHUNK):
        n = min(CHUNK, rows - start)
        t.append_many([data[i * payload : (i + 1) * payload] for i in range(n)], tag="b")
    return store


def build_cold(root: str, rows: int, payload: int, cold: str) -> str:
    """A closed store whose every sealed segment is in the cold tier ``cold``; says where."""
    store = build(root, rows, payload, cold=cold, hot_retain_segments=0)
    for _ in range(2):  # the first seals the tail, the second relocates what it sealed
        hooks(store, Checkpoint).checkpoint()
    store.close()
    return placement(root, {"cold": cold})


def placement(root: str, options: dict[str, Any]) -> str:
    """Where a read-only view finds the topic's records: cold, hot sealed, the WAL."""
    with tidelog.open(f"file://{root}", readonly=True, **options) as view:
        chunks = hooks(view, EngineTopics).topics["bench"].log.chunks
        head = view.topic("bench").state().head_seq
        cold = sum(c.count for c in chunks if type(c).__name__ == "ColdChunk")
        sealed = sum(c.count for c in chunks if type(c).__name__ in ("ColdChunk", "SegChunk"))
    return f"{cold / head:.0%} cold, {(sealed - cold) / head:.0%} hot sealed, rest in the WAL"


@contextlib.contextmanager
def moto_s3() -> Iterator[str | None]:
    """A cold URL in a bucket of moto's S3 server on 127.0.0.1 (None without moto), with the
    credentials in the URL: Spark's Python workers do not inherit this process's environment."""
    try:
        import pyarrow.fs as pafs
        from moto.server import ThreadedMotoServer
    except ImportError:
        yield None
        return
    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # no line per request
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0)
    server.start()
    try:
        host, port = server.get_host_and_port()
        endpoint = f"{host}:{port}"
        pafs.S3FileSystem(
            endpoint_override=endpoint, scheme="http", region="us-east-1",
            access_key="bench", secret_key="bench", allow_bucket_creation=True,
        ).create_dir("tier")  # fmt: skip
        yield (
            f"s3://bench:bench@tier/cold?endpoint_override={endpoint}&scheme=http&region=us-east-1"
        )
    finally:
        server.stop()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, default=2_000_000)
    ap.add_argument("--payload", type=int, default=100)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--master", default="local[2]")
    ap.add_argument("--no-s3", action="store_true", help="skip the S3 cold tier")
    ap.add_argument("--cold-cache", type=int, default=1, help="coldCacheSegments of the reads")
    ap.add_argument("--dir", default=None, help="work directory (default: a temporary one)")
    args = ap.parse_args()

    work = args.dir or tempfile.mkdtemp(prefix="tidelog-spark-tiers-")
    paths = {k: os.path.join(work, k) for k in ("sealed", "cold", "cold-s3", "tail", "colddir")}
    for path in [*paths.values(), os.path.join(work, "parquet")]:
        shutil.rmtree(path, ignore_errors=True)
    owner: tidelog.Store | None = None
    from tidelog.adapters.spark.demo import spark_session

    with contextlib.ExitStack() as stack:
        s3 = None if args.no_s3 else stack.enter_context(moto_s3())
        cases: dict[str, dict[str, str]] = {"sealed": {}}
        cache = {"coldCacheSegments": str(args.cold_cache)}
        cases["cold"] = {"cold": paths["colddir"], **cache}
        if s3 is not None:
            cases["cold-s3"] = {"cold": s3, **cache}
        cases["tail"] = {}
        paths["cold+"] = "cold+" + paths["colddir"]
        cases["cold+"] = dict(cache)
        if s3 is not None:
            paths["cold+s3"] = "cold+" + s3
            cases["cold+s3"] = dict(cache)
        print(f"{args.rows:,} records x {args.payload} B per store, in {work}", flush=True)
        for name, options in cases.items():
            if name.startswith("cold+"):
                continue  # the cold tiers of the cold cases
            t0 = time.perf_counter()
            if name == "sealed":
                build(paths[name], args.rows, args.payload).close()
                where = placement(paths[name], {})
            elif name == "tail":  # no checkpoint seals anything while the scans run
                owner = build(paths[name], args.rows, args.payload, checkpoint_bytes="64GiB")
                stack.callback(owner.close)
                owner.flush()
                where = placement(paths[name], {})
            else:
                where = build_cold(paths[name], args.rows, args.payload, options["cold"])
            print(f"  {name:<8} built in {time.perf_counter() - t0:5.1f} s: {where}", flush=True)
        if s3 is None:
            print("  cold-s3  not measured: " + ("--no-s3" if args.no_s3 else "moto missing"))

        print("\nadapter read without Spark (1 core, the Spark read's tasks), rows/s:")
        for name, options in cases.items():
            side = cold_side if name.startswith("cold+") else python_side
            side(paths[name], args.rows, options)  # warm-up: the view opens
            py = [side(paths[name], args.rows, options) for _ in range(args.runs)]
            print(f"  {name:<8} {rates(args.rows, py)}", flush=True)

        spark = spark_session(args.master, app="tidelog-spark-tiers-bench")
        stack.callback(spark.stop)
        # a new reader per case: DataFrameReader.options adds to the reader it is called on
        scans = {
            k: spark.read.format("tidelog").option("topic", "bench").options(**o).load(paths[k])
            for k, o in cases.items()
        }
        parquet = os.path.join(work, "parquet")
        t0 = time.perf_counter()
        scans["sealed"].write.parquet(parquet)
        print(f"\nParquet copy written by Spark in {time.perf_counter() - t0:.1f} s")
        spark.dataSource.register(_null_source())
        sealed = parse_options({"path": paths["sealed"], "topic": "bench"})
        tasks = len(source._partitions(sealed, 1, args.rows))  # the sealed read's
        null = spark.read.format("tidelog-null").option("rows", str(args.rows))
        scans = {"parquet": spark.read.parquet(parquet), **scans}
        scans["null"] = null.option("tasks", str(tasks)).load()
        times, loads = scan(scans, args.runs)
        print(
            f"\nSpark scan of {args.rows:,} rows (6 columns, {args.payload} B payload), "
            f"{args.master}, {args.runs} runs each, alternating; load average (1 min) after "
            f"each round: {' '.join(f'{x:.1f}' for x in loads)}"
        )
        print(f"  {'source':<9} {'rows/s median [min–max]':>36}   x parquet   runs (s)")
        base = statistics.median(times["parquet"])
        for name, ts in times.items():
            runs = " ".join(f"{t:.2f}" for t in ts)
            ratio = base / statistics.median(ts)
            print(f"  {name:<9} {rates(args.rows, ts):>36}   {ratio:9.2f}   {runs}")
    if not args.dir:
        shutil.rmtree(work, ignore_errors=True)


def cold_side(location: str, rows: int, extra: dict[str, str]) -> float:
    """``python_side`` of a ``cold+URL`` location: the tasks the driver plans (SPK-32), read one
    after another in this process as executors read them (SPK-33)."""
    opts = parse_options({"path": location, "topic": "bench", **extra})
    t0 = time.perf_counter()
    n = sum(
        b.num_rows
        for lo, hi, plan in coldsource.plan_partitions(opts)
        for b in coldsource.read_cold(opts, lo, hi, plan)
    )
    assert n == rows, (n, rows)
    return time.perf_counter() - t0


def scan(scans: dict[str, Any], runs: int) -> tuple[dict[str, list[float]], list[float]]:
    """Seconds per ``noop`` scan of each DataFrame: two warm-ups each (workers open their
    views), then ``runs`` rounds, one scan of each per round; and the load average after each
    round."""
    for df in scans.values():
        for _ in range(2):
            df.write.format("noop").mode("overwrite").save()
    times: dict[str, list[float]] = {k: [] for k in scans}
    loads: list[float] = []
    for _ in range(runs):
        for name, df in scans.items():
            t0 = time.perf_counter()
            df.write.format("noop").mode("overwrite").save()
            times[name].append(time.perf_counter() - t0)
        loads.append(os.getloadavg()[0])
    return times, loads


def _null_source() -> Any:
    """The ``tidelog-null`` source: options ``rows`` and ``tasks``; each task yields pre-built
    batches of 65,536 rows of the log schema (100-byte payloads) and reads nothing."""
    from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition

    from tidelog.adapters.spark.columns import log_ddl

    class Part(InputPartition):
        def __init__(self, rows: int) -> None:
            self.rows = rows

    class Reader(DataSourceReader):
        def __init__(self, rows: int, tasks: int) -> None:
            self.rows, self.tasks = rows, tasks

        def partitions(self) -> list[Part]:
            per, extra = divmod(self.rows, self.tasks)
            return [Part(per + (1 if i < extra else 0)) for i in range(self.tasks)]

        def read(self, partition: InputPartition) -> Iterator[Any]:
            import pyarrow as pa

            from tidelog.adapters.spark.columns import log_schema

            n = 65_536
            batch = pa.RecordBatch.from_arrays(
                [
                    pa.repeat(pa.scalar("bench", pa.string()), n),
                    pa.array(range(n), pa.int64()),
                    pa.array([0] * n, pa.timestamp("us", tz="UTC")),
                    pa.repeat(pa.scalar("b", pa.string()), n),
                    pa.nulls(n, pa.string()),
                    pa.array([os.urandom(100)] * n, pa.binary()),
                ],
                schema=log_schema(False),
            )
            left = getattr(partition, "rows", 0)
            while left > 0:
                yield batch if left >= n else batch.slice(0, left)
                left -= n

    class Source(DataSource):
        @classmethod
        def name(cls) -> str:
            return "tidelog-null"

        def schema(self) -> str:
            return log_ddl(False)

        def reader(self, schema: Any) -> Reader:
            options: dict[str, str] = dict(self.options)
            return Reader(int(options["rows"]), int(options["tasks"]))

    return Source


if __name__ == "__main__":
    main()
