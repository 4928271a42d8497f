"""``tidelog demo``: telemetry bundles -> a file store -> Spark Structured Streaming -> Parquet.

1. This process owns the store (``file://./tidelog-data``, fsync durability) and applies the
   requests Spark's processes send it (XPR-2) on its maintenance tick.
2. Producer threads append synthetic telemetry ``RecordBundle``s (slot 0: readings, whose schema
   drifts half-way; slot 1: occasional device info) while Spark starts, into a bundle topic
   (``payload="bundles"``) whose checkpoints seal Quiver ``.qseg`` segments (QSEG-12).
3. A streaming query reads slot 0 (``maxRecordsPerTrigger`` bundles per micro-batch) and writes
   Parquet; Spark's source commits acknowledge through the durable subscriber, so the store trims
   what the sink has (SPK-10); the last batch is acknowledged from the checkpoint at the end.
4. The Parquet output is checked: every produced row exactly once, every bundle's seq present.
"""

from __future__ import annotations

import contextlib
import glob
import json
import os
import shutil
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

import tidelog
from tidelog.bundle import RecordBundle
from tidelog.errors import NotAvailable
from tidelog.uri import redact_url

from .checkpoint import acknowledge_checkpoint
from .diskuse import footprint, trim_report

__all__ = ["DemoConfig", "DemoResult", "run", "make_bundle", "READINGS_DDL", "spark_session"]

TOPIC = "telemetry"
SUBSCRIBER = "spark-demo"
WAL_FILE_BYTES = 4 << 20  # small WAL files: trimmed data leaves the disk a file at a time
#: slot 0 as the DataFrame sees it: `_seq` (the bundle's seq) + the union of both schema variants
READINGS_DDL = (
    "_seq long, sensor int, bundle long, row int, event_time timestamp, "
    "temperature double, status string, humidity float"
)
_STATUS = pa.array(["ok", "warn", "fail"])
_LOG4J = """\
rootLogger.level = error
rootLogger.appenderRef.console.ref = console
appender.console.type = Console
appender.console.name = console
appender.console.target = SYSTEM_ERR
appender.console.layout.type = PatternLayout
appender.console.layout.pattern = %d{HH:mm:ss} %p %c{1}: %m%n
"""


@dataclass(frozen=True)
class DemoConfig:
    records: int = 2000  # bundles (tidelog records)
    rows: int = 100  # rows of slot 0 per bundle
    producers: int = 4
    master: str = "local[2]"
    data: str = "./tidelog-data"
    out: str = "./tidelog-demo-out"
    max_per_trigger: int = 500
    trigger_ms: int = 500
    seed: int | None = None
    timeout_s: float = 600.0
    cold: str | None = None  # the store's cold tier (spec/TIERING.md TIER-1; SPK-30)


@dataclass
class DemoResult:
    ok: bool
    rows: list[tuple[str, str]]
    problems: list[str] = field(default_factory=list)


def make_bundle(rng: Any, sensor: int, bundle: int, rows: int, drift: bool) -> Any:
    """One telemetry arrival (``rng``: a ``numpy.random.Generator``). Slot 0 (readings) gains a
    ``humidity`` column once ``drift`` is set (schema drift); its ``status`` is
    ``dictionary<int8, string>`` (key types survive the store exactly); slot 1 (device info,
    one row) rides along on every 10th bundle (optional slots)."""
    import numpy as np

    now_ms = int(time.time() * 1000)
    status = np.where(rng.random(rows) < 0.9, 0, rng.integers(1, 3, rows)).astype(np.int8)
    columns: dict[str, pa.Array] = {
        "sensor": pa.array(np.full(rows, sensor, np.int32)),
        "bundle": pa.array(np.full(rows, bundle, np.int64)),
        "row": pa.array(np.arange(rows, dtype=np.int32)),
        "event_time": pa.array(
            np.arange(now_ms - rows, now_ms, dtype=np.int64), pa.timestamp("ms", tz="UTC")
        ),
        "temperature": pa.array(rng.normal(20.0, 2.0, rows)),
        "status": pa.DictionaryArray.from_arrays(pa.array(status), _STATUS),
    }
    if drift:
        columns["humidity"] = pa.array(rng.uniform(30, 60, rows).astype(np.float32))
    slots: dict[int, pa.RecordBatch] = {0: pa.record_batch(columns)}
    if bundle % 10 == 0:
        slots[1] = pa.record_batch(
            {
                "sensor": pa.array([sensor], pa.int32()),
                "firmware": pa.array([f"1.{sensor % 3}.0"]),
                "uptime_s": pa.array([bundle * 5], pa.uint32()),
            }
        )
    return RecordBundle(slots)


def spark_session(master: str, app: str = "tidelog-demo", **conf: str) -> Any:
    """A quiet local-mode SparkSession whose Python workers run this interpreter (so they import
    this tidelog), with the ``tidelog`` format registered."""
    try:
        from pyspark.sql import SparkSession
    except ImportError:
        raise NotAvailable(
            "the Spark demo needs PySpark: pip install 'tidelog[spark]' (or run `tidelog demo "
            "--local` for the in-process pipeline)"
        ) from None
    if not (shutil.which("java") or os.environ.get("JAVA_HOME")):
        raise NotAvailable("the Spark demo needs Java 17+ (java on PATH or JAVA_HOME)")
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    # Spark starts its Python workers with `python -m ...` in this process's directory: in a
    # checkout that puts the ./tidelog source folder (no adapters/ in it: setup.py maps the
    # folders) ahead of the installed package. Workers inherit the environment of the JVM,
    # started below from this one: PYTHONSAFEPATH keeps the current directory off sys.path.
    os.environ["PYTHONSAFEPATH"] = "1"
    log4j = os.path.join(tempfile.gettempdir(), "tidelog-spark-log4j2.properties")
    with open(log4j, "w", encoding="utf-8") as f:
        f.write(_LOG4J)
    builder = (
        SparkSession.builder.master(master)
        .appName(app)
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.driver.extraJavaOptions", f"-Dlog4j2.configurationFile={log4j}")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.sql.streaming.numRecentProgressUpdates", "10000")
    )
    for key, value in conf.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    from . import register

    register(spark)
    return spark


class _Producers:
    def __init__(self, cfg: DemoConfig, topic: tidelog.Topic) -> None:
        n = cfg.producers
        self.quotas = [cfg.records // n + (i < cfg.records % n) for i in range(n)]
        self.done = [0] * n
        self.errors: list[BaseException] = []
        self.t0 = 0.0
        self.t_end = 0.0
        self.threads = [
            threading.Thread(target=self._run, args=(cfg, topic, i), daemon=True, name=f"p{i}")
            for i in range(n)
        ]

    def _run(self, cfg: DemoConfig, topic: tidelog.Topic, i: int) -> None:
        try:
            import numpy as np

            rng = np.random.default_rng(None if cfg.seed is None else [cfg.seed, i])
            quota = self.quotas[i]
            for k in range(quota):
                bundle = make_bundle(rng, i, k, cfg.rows, drift=k >= quota // 2)
                topic.append_bundle(bundle, tag=f"sensor-{i}")  # fsync: durable on return
                self.done[i] = k + 1
        except BaseException as exc:
            self.errors.append(exc)
        finally:
            self.t_end = max(self.t_end, time.perf_counter())

    def start(self) -> None:
        self.t0 = time.perf_counter()
        for t in self.threads:
            t.start()

    def alive(self) -> bool:
        return any(t.is_alive() for t in self.threads)


def _end_seq(progress: Any) -> int | None:
    if not progress or not progress.get("sources"):
        return None
    end = progress["sources"][0].get("endOffset")
    if not end:
        return None
    return int(json.loads(end)["seq"]) if isinstance(end, str) else int(end["seq"])


def _verify(table: pa.Table, cfg: DemoConfig, quotas: list[int], head: int) -> list[str]:
    """Every produced row exactly once; every bundle's seq present; nothing extra."""
    problems: list[str] = []
    expected = sum(quotas) * cfg.rows
    if table.num_rows != expected:
        problems.append(f"{table.num_rows} rows in Parquet, {expected} produced")
    keys = table.group_by(["sensor", "bundle", "row"]).aggregate([("row", "count")])
    dup = pc.sum(pc.subtract(keys["row_count"], 1)).as_py() or 0
    if dup:
        problems.append(f"{dup} duplicated rows")
    bundles = table.group_by(["sensor", "bundle"]).aggregate([("row", "count_distinct")])
    short = pc.sum(pc.not_equal(bundles["row_count_distinct"], cfg.rows)).as_py() or 0
    if short:
        problems.append(f"{short} bundles with missing rows")
    for sensor, quota in enumerate(quotas):
        got = pc.count_distinct(
            bundles.filter(pc.equal(bundles["sensor"], sensor))["bundle"]
        ).as_py()
        if got != quota:
            problems.append(f"sensor {sensor}: {got} of {quota} bundles")
    seqs = pc.unique(table["_seq"])
    if len(seqs) != head or pc.min(seqs).as_py() != 1 or pc.max(seqs).as_py() != head:
        problems.append(f"{len(seqs)} distinct bundle seqs in Parquet, topic head is {head}")
    bad = pc.sum(pc.is_null(table["temperature"])).as_py()
    if bad:
        problems.append(f"{bad} rows lost their temperature")
    return problems


def run(cfg: DemoConfig, progress: Callable[..., Any] | None = None) -> DemoResult:
    """Run the pipeline; ``progress(kind, **values)`` is called as it goes (the CLI draws it)."""
    say = progress or (lambda kind, **kw: None)
    data = os.path.abspath(cfg.data)
    out = os.path.abspath(cfg.out)
    parquet, checkpoint = os.path.join(out, "parquet"), os.path.join(out, "checkpoint")
    shutil.rmtree(out, ignore_errors=True)
    t_start = time.perf_counter()
    # progress_flush_ms: requests from Spark are applied within ~20 ms; small WAL files so that
    # trimmed data leaves a file at a time, once the file is full and checkpointed (it may stay
    # as a spare for reuse, WAL-15: the report says so).
    # a cold tier, when given, goes to the store and to every view Spark opens (SPK-30)
    cold: dict[str, Any] = {}
    if cfg.cold is not None:  # TIER-1: a local tier is an absolute path
        cold["cold"] = cfg.cold if "://" in cfg.cold else os.path.abspath(cfg.cold)
    store = tidelog.open(
        f"file://{data}",
        progress_flush_ms=20,
        wal_file_bytes=WAL_FILE_BYTES,
        prealloc="none",
        **cold,
    )
    spark = None
    try:
        if TOPIC in store.topics():
            store.drop_topic(TOPIC)  # a fresh run: the check counts every record of the topic
        topic = store.topic(
            TOPIC, durability="fsync", trim="acked", retention="backpressure", payload="bundles"
        )
        topic.subscribe(SUBSCRIBER, start="earliest")  # before any append: nothing is skipped
        producers = _Producers(cfg, topic)
        producers.start()  # producing overlaps Spark's start-up
        say("start", total=cfg.records)

        t_spark = time.perf_counter()
        spark = spark_session(cfg.master)
        spark_startup = time.perf_counter() - t_spark
        say("spark", seconds=spark_startup)
        query = (
            spark.readStream.format("tidelog")
            .schema(READINGS_DDL)
            .option("topic", TOPIC)
            .option("slot", 0)
            .option("subscriber", SUBSCRIBER)
            .option("startingOffsets", "earliest")
            .option("maxRecordsPerTrigger", cfg.max_per_trigger)
            .options(**cold)
            .load(data)
            .writeStream.format("parquet")
            .option("path", parquet)
            .option("checkpointLocation", checkpoint)
            .trigger(processingTime=f"{cfg.trigger_ms} milliseconds")
            .start()
        )
        t_query = time.perf_counter()
        drained, t_drained = 0, t_query
        while True:
            if producers.errors:
                raise producers.errors[0]
            exc = query.exception()
            if exc is not None:
                raise exc
            p = query.lastProgress
            end = _end_seq(p)
            if end is not None and end > drained:
                drained, t_drained = end, time.perf_counter()
            say("tick", produced=sum(producers.done), drained=drained)
            if not producers.alive() and drained >= topic.state().head_seq:
                break
            if time.perf_counter() - t_start > cfg.timeout_s:
                raise TimeoutError(f"the demo did not drain within {cfg.timeout_s:g} s")
            time.sleep(0.1)
        query.stop()
        batches = [p for p in query.recentProgress if p["numInputRows"]]
        head = topic.state().head_seq
        say("drained", produced=sum(producers.done), drained=drained)

        # The source's commit lags one micro-batch (SPK-10): acknowledge what the checkpoint
        # shows the sink committed, then let the close-time checkpoint reclaim the space.
        store.flush()
        disk_before = footprint(data)
        sealed = len(glob.glob(os.path.join(data, "topics", "*", "seg-*.qseg")))
        live_before = topic.state().count
        hwm = acknowledge_checkpoint(store, TOPIC, SUBSCRIBER, checkpoint)
        state = topic.state()
        store.close()  # its checkpoint drops the trimmed segments and retires old WAL files
        disk_after = footprint(data)

        table = spark.read.parquet(parquet).toArrow()
        problems = _verify(table, cfg, producers.quotas, head)
        if hwm != head or state.count != 0:
            problems.append(f"not fully trimmed: hwm={hwm}, head={head}, live={state.count}")
        rows_in = sum(producers.done) * cfg.rows
        t_in = max(producers.t_end - producers.t0, 1e-9)
        t_out = max(t_drained - t_query, 1e-9)
        # steady state: micro-batches after the first (which pays Python worker start-up)
        steady_s = sum(p["durationMs"]["triggerExecution"] for p in batches[1:]) / 1000
        steady_rows = sum(p["numInputRows"] for p in batches[1:])
        first_s = batches[0]["durationMs"]["triggerExecution"] / 1000 if batches else 0.0
        ok = not problems and head == cfg.records
        rows = [
            ("store", f"file://{data} (topic {TOPIC!r}, durability fsync, trim acked)"),
            *[
                ("cold tier", f"{redact_url(url)} (.qseg segments stay hot, TIER-4)")
                for url in cold.values()
            ],
            ("records in", f"{head:,} bundles = {rows_in:,} rows, {cfg.producers} producers"),
            (
                "records out",
                f"{pc.count_distinct(table['_seq']).as_py():,} bundles = "
                f"{table.num_rows:,} rows in {parquet}",
            ),
            ("micro-batches", f"{len(batches)} (maxRecordsPerTrigger={cfg.max_per_trigger})"),
            ("live records", f"{live_before:,} before the final ack -> {state.count} after"),
            ("sealed segments", f"{sealed} Quiver .qseg file(s) on disk before the final ack"),
            *trim_report(disk_before, disk_after, live_before - state.count, WAL_FILE_BYTES),
            ("rate in", f"{head / t_in:,.0f} bundles/s = {rows_in / t_in:,.0f} rows/s (fsync)"),
            (
                "rate out",
                f"{head / t_out:,.0f} bundles/s = {table.num_rows / t_out:,.0f} rows/s "
                f"from query start (first batch {first_s:.1f} s: Python workers "
                "start)",
            ),
            (
                "rate out steady",
                f"{steady_rows / steady_s:,.0f} rows/s over micro-batches 2.."
                if steady_s
                else "n/a (one micro-batch)",
            ),
            ("spark start-up", f"{spark_startup:.1f} s ({cfg.master})"),
            ("elapsed", f"{time.perf_counter() - t_start:.1f} s"),
        ]
        return DemoResult(ok, rows, problems)
    finally:
        if spark is not None:
            with contextlib.suppress(Exception):
                for q in spark.streams.active:
                    q.stop()
            spark.stop()
        store.close()
