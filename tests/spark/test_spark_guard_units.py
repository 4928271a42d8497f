"""The freshness guard without a Spark session (spec/BUNDLES.md SPK-13..SPK-16): the adapter's
driver-side and executor-side objects, pickled as Spark ships them, with an executor whose view
of the store is older than the driver's (a copy of the store directory taken before more
appends, installed as that process's cached view: what a stale network filesystem shows).
"""

from __future__ import annotations

import pickle
import shutil
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

import tidelog
from tidelog.adapters.spark import reading
from tidelog.adapters.spark.guard import Planned, StagingGone, StaleView, StoreNotVisible, host
from tidelog.adapters.spark.options import SourceOptions, parse_options
from tidelog.hooks import Checkpoint, hooks
from tidelog.records import Record

OWNER = "progress_flush_ms=10"  # the owner applies the source's commit requests within ~10 ms


def _opts(root: Path, **extra: str) -> SourceOptions:
    return parse_options({"path": str(root), "topic": "ev", "freshnessTimeoutMs": "200", **extra})


def _stale_copy(store: tidelog.Store, root: Path, to: Path) -> None:
    """A byte copy of the store directory as it is now (same store_id: the same store's past)."""
    store.flush()
    shutil.copytree(root, to)


class _ExecutorView:
    """This process plays an executor whose cached view of ``root`` is the copy at ``stale``
    (the view cache is per process, keyed by the store path: SPK-2)."""

    def __init__(self, root: Path, stale: Path) -> None:
        self.root, self.stale = str(root), stale

    def __enter__(self) -> _ExecutorView:
        reading._forget(self.root)
        reading._views[self.root] = (tidelog.open(f"file://{self.stale}", readonly=True), {})
        return self

    def __exit__(self, *exc: object) -> None:
        reading._forget(self.root)


def _rows(batches: Iterator[pa.RecordBatch]) -> list[int]:
    return [s for b in batches for s in b.column("seq").to_pylist()]


def test_SPK_14_a_view_behind_the_plan_waits_then_fails_the_task(tmp_path: Path) -> None:
    """SPK-14: a partition carries the store's id, the topic's incarnation and the planner's
    head; a task whose view's head is below the partition's end refreshes for
    freshnessTimeoutMs, then fails with stale_view naming the path, the host and both heads,
    instead of returning the 50 rows its view has of a 100-row range."""
    root, stale = tmp_path / "s", tmp_path / "stale"
    with tidelog.open(f"file://{root}") as store:
        t = store.topic("ev")
        t.append_many([b"a"] * 100)
        hooks(store, Checkpoint).checkpoint()  # sealed segments: the columnar path too
        t.append_many([b"b"] * 50)
        _stale_copy(store, root, stale)
        t.append_many([b"c"] * 150)
        opts = _opts(root)
        planned = reading.plan(opts)
        assert planned.head == 300 and len(planned.store_id) == 32
        assert reading.seq_bounds(opts) == (1, 300)
        with _ExecutorView(root, stale):
            assert _rows(reading.read_log(opts, 1, 150, planned)) == list(range(1, 151))
            t0 = time.monotonic()
            with pytest.raises(StaleView) as info:
                list(reading.read_log(opts, 101, 200, planned))
            assert time.monotonic() - t0 >= 0.2  # it waited for the view to catch up
            assert info.value.code == "stale_view"
            message = str(info.value)
            assert f"view of {root} on host {host()} is behind the driver's plan" in message
            assert "its head 150, the plan's end 200" in message and "SPK-13" in message
            with pytest.raises(StaleView, match="its head 150, the plan's end 300"):
                list(
                    reading.read_slot(
                        parse_options({**_raw(opts), "slot": "0"}),
                        1,
                        300,
                        pa.schema([("_seq", pa.int64())]),
                        planned,
                    )
                )


def _raw(opts: SourceOptions) -> dict[str, str]:
    return {"path": opts.root, "topic": opts.topic, "freshnessTimeoutMs": "200"}


def test_SPK_14_a_view_that_catches_up_within_the_timeout_reads_the_whole_range(
    tmp_path: Path,
) -> None:
    """SPK-14: the wait is bounded but real: a view that reaches the plan's end while the task
    waits (the planner saw records this process's view did not yet) reads the full range."""
    root = tmp_path / "s"
    with tidelog.open(f"file://{root}") as store:
        t = store.topic("ev")
        t.append_many([b"a"] * 10)
        opts = parse_options({"path": str(root), "topic": "ev", "freshnessTimeoutMs": "20000"})
        now = reading.plan(opts)
        ahead = Planned(now.store_id, now.incarnation, 20)  # the driver saw 10 more
        timer = threading.Timer(0.3, lambda: t.append_many([b"b"] * 10))
        timer.start()
        try:
            t0 = time.monotonic()
            assert _rows(reading.read_log(opts, 1, 20, ahead)) == list(range(1, 21))
            assert time.monotonic() - t0 >= 0.25
        finally:
            timer.join()


def test_SPK_14_another_store_or_a_recreated_topic_fails_at_once(tmp_path: Path) -> None:
    """SPK-14: a view of another store at the plan's path (another store_id, after reopening the
    view once) or of a later incarnation of the topic fails the task without waiting."""
    root, other = tmp_path / "s", tmp_path / "other"
    with tidelog.open(f"file://{other}") as store:
        store.topic("ev").append_many([b"o"] * 5)
    with tidelog.open(f"file://{root}") as store:
        store.topic("ev").append_many([b"a"] * 5)
        opts = parse_options({"path": str(root), "topic": "ev", "freshnessTimeoutMs": "60000"})
        planned = reading.plan(opts)
        with _ExecutorView(root, other):
            t0 = time.monotonic()
            # the cached view is reopened once: it is the plan's store, the read succeeds
            assert _rows(reading.read_log(opts, 1, 5, planned)) == [1, 2, 3, 4, 5]
        foreign = Planned("00" * 16, planned.incarnation, planned.head)
        with pytest.raises(StaleView, match=r"is another store \(store_id [0-9a-f]{32}"):
            list(reading.read_log(opts, 1, 5, foreign))
        store.drop_topic("ev")
        store.topic("ev").append_many([b"new"] * 5)
        with pytest.raises(StaleView, match="dropped and re-created since the driver planned"):
            list(reading.read_log(opts, 1, 5, planned))
        assert time.monotonic() - t0 < 30  # neither waited for freshnessTimeoutMs


def test_SPK_15_a_read_never_returns_short_but_voluntary_removals_read_silently(
    tmp_path: Path,
) -> None:
    """SPK-15: a read that runs out of records before its range's end, with its view's head
    below that end, fails (even with no plan to check first); deleted seqs, at the start, the
    middle and the end of the range, are absent without an error (TMB-4), so the check is
    the view's head, not a row count."""
    root, stale = tmp_path / "s", tmp_path / "stale"
    with tidelog.open(f"file://{root}") as store:
        t = store.topic("ev")
        t.append_many([b"a"] * 20, tag="keep")
        _stale_copy(store, root, stale)
        t.append_many([b"b"] * 5, tag="gone")
        t.append_many([b"c"] * 10, tag="keep")
        t.append_many([b"d"] * 5, tag="gone")
        assert t.delete(tag="gone") == 10
        opts = _opts(root)
        got = _rows(reading.read_log(opts, 1, 40))
        assert got == list(range(1, 21)) + list(range(26, 36))  # 30 rows for 40 seqs: fine
        short = r"its head 20, the plan's end 40; read up to 20"
        with _ExecutorView(root, stale), pytest.raises(StaleView, match=short):
            list(reading.read_log(opts, 1, 40))


def test_SPK_10_SPK_14_the_stream_source_never_commits_what_was_not_delivered(
    tmp_path: Path,
) -> None:
    """SPK-10, SPK-14, SPK-15, the scenario of a stale executor under a streaming query with
    trim=acked, driven as Spark drives the source: plan on the runner, read on an executor
    copy, commit batch N-1 while planning batch N. The executor sees 1,000 of 2,000 records.
    Without the guard its tasks returned short and the source acknowledged (and the owner
    trimmed) 600 records no sink ever had; with it, the batch's task fails, Spark commits
    nothing more, and every record above the last delivered batch stays in the store."""
    pytest.importorskip("pyspark")
    from pyspark.sql.streaming.datasource import ReadMaxRows
    from pyspark.sql.types import StructType

    from tidelog.adapters.spark.source import TidelogStreamReader

    root, stale = tmp_path / "s", tmp_path / "stale"
    with tidelog.open(f"file://{root}?{OWNER}") as store:
        t = store.topic("ev", trim="acked")
        opts = parse_options(
            {
                "path": str(root),
                "topic": "ev",
                "startingOffsets": "earliest",
                "freshnessTimeoutMs": "200",
            }
        )
        runner = TidelogStreamReader(opts, StructType.fromJson(_log_struct()))
        start = runner.initialOffset()  # registers the subscriber before any record
        t.append_many([b"x"] * 1000)
        _stale_copy(store, root, stale)
        t.append_many([b"y"] * 1000)
        executor = pickle.loads(pickle.dumps(runner))
        delivered: list[int] = []
        previous: dict[str, int] | None = None
        failure: Exception | None = None
        while True:
            end = runner.latestOffset(start, ReadMaxRows(800))
            if end == start:
                break
            if previous is not None:
                runner.commit(previous)  # Spark acks batch N-1 while planning batch N
            parts = pickle.loads(pickle.dumps(runner.partitions(start, end)))
            try:
                with _ExecutorView(root, stale):  # the runner, above, sees the real store
                    rows = [s for p in parts for s in _rows(executor.read(p))]
            except StaleView as exc:
                failure = exc  # the task fails: the micro-batch (and the query) fails
                break
            delivered += rows  # the sink commits the batch
            previous, start = end, end
        assert isinstance(failure, StaleView), f"{len(delivered)} rows read, no failure"
        assert "its head 1000, the plan's end 1600" in str(failure)
        assert delivered == list(range(1, 801))
        assert t.subscriber("spark").hwm <= max(delivered)  # acked only what was delivered
        kept = [r.seq for r in t.read(after=0, limit=5000) if isinstance(r, Record)]
        assert kept[0] <= 801 and kept[-1] == 2000 and len(kept) == 2001 - kept[0]


def _log_struct() -> dict[str, Any]:
    def f(name: str, kind: str) -> dict[str, Any]:
        return {"name": name, "type": kind, "nullable": True, "metadata": {}}

    names = [("topic", "string"), ("seq", "long"), ("ts", "timestamp"), ("tag", "string")]
    names += [("node", "string"), ("payload", "binary")]
    return {"type": "struct", "fields": [f(n, k) for n, k in names]}


# -- SPK-16: a store this host cannot see --------------------------------------------------------
def test_SPK_16_a_read_task_on_a_host_without_the_store_says_so(tmp_path: Path) -> None:
    """SPK-16: a task (a fresh executor process: no cached view) whose host has nothing at the
    store's path, or a directory without meta/, fails with io_error naming the path, its host,
    the store the driver planned from and the supported deployments (SPK-13: local mode, or
    executors on the store's host), not "not a tidelog store"; the planner says "on driver
    host"."""
    root = tmp_path / "s"
    with tidelog.open(f"file://{root}") as store:
        store.topic("ev").append_many([b"a"] * 5)
    opts = _opts(root)
    planned = reading.plan(opts)
    reading._forget(str(root))
    shutil.rmtree(root)
    with pytest.raises(StoreNotVisible) as info:
        list(reading.read_log(opts, 1, 5, planned))
    assert info.value.code == "io_error"
    assert str(info.value).startswith(f"{root} does not exist on executor host {host()}")
    assert f"planned this read from store {planned.store_id}" in str(info.value)
    assert "SPK-13" in str(info.value)
    root.mkdir()  # an empty mount point, say
    with pytest.raises(StoreNotVisible, match=r"holds no tidelog store \(no meta/\) on executor"):
        list(reading.read_log(opts, 1, 5, planned))
    with pytest.raises(StoreNotVisible, match=f"on driver host {host()}: no store to read"):
        reading.plan(_opts(tmp_path / "nowhere"))


def test_SPK_16_a_write_task_on_a_host_without_the_staging_directory_says_so(
    tmp_path: Path,
) -> None:
    """SPK-16: a write task that finds no attempt directory says "aborted" only on the
    driver's host with the staging directory's parent present (SPK-7's case); when that parent
    is missing on its host, or it runs on another host than the driver, it names the path and
    the hosts instead."""
    pytest.importorskip("pyspark")
    from tidelog.adapters.spark.source import TidelogWriter

    batch = pa.record_batch({"payload": [b"x"]})
    base = tmp_path / "data"
    opts = parse_options({"path": str(base / "s"), "topic": "w"})
    task = pickle.loads(pickle.dumps(TidelogWriter(opts)))  # shipping creates the attempt
    assert task._origin == (str(base), host())
    shutil.rmtree(base)  # this "executor host" has no /…/data
    with pytest.raises(StoreNotVisible) as info:
        task.write(iter([batch]))
    message = str(info.value)
    assert "aborted" not in message and f"does not exist on executor host {host()}" in message
    assert str(base) in message and "SPK-13" in message

    task = pickle.loads(pickle.dumps(TidelogWriter(opts)))
    shutil.rmtree(base / ".s.spark-staging")
    task._origin = (str(base), "driver-host")  # the driver ran elsewhere
    with pytest.raises(StoreNotVisible, match="created by the driver on host driver-host"):
        task.write(iter([batch]))
    task._origin = (str(base), host())  # same host, parent there: the attempt was removed
    with pytest.raises(StagingGone, match="the write job was aborted"):
        task.write(iter([batch]))
