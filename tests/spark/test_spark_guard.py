"""The freshness guard on a local[2] session (spec/BUNDLES.md SPK-13..SPK-16).

Spark's executors here are Python workers on this host, so they see the store as the driver
does. The tests make them see it otherwise with a data source subclass (defined in the test, so
Spark ships it by value) whose executor-side ``read``/``write`` first installs what another host
would show: a copy of the store directory taken before more appends (a stale view), or no
staging directory at all. Everything else is the adapter's own code, planned on the driver.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

import tidelog
from tidelog.records import Record

pytestmark = pytest.mark.spark

OWNER = "progress_flush_ms=10"


def _stale_source(name: str, root: Path, stale: Path) -> type[Any]:
    """A ``tidelog`` source whose executors read the copy at ``stale`` for the store ``root``:
    the planner and the streaming source runner see the real store."""
    from tidelog.adapters.spark.source import TidelogDataSource, TidelogReader, TidelogStreamReader

    root_s, stale_s = str(root), str(stale)

    def stale_read(read: Any, self: Any, partition: Any) -> Iterator[pa.RecordBatch]:
        from tidelog.adapters.spark import reading

        reading._forget(root_s)  # this executor process's cached view: the old copy
        reading._views[root_s] = (tidelog.open(f"file://{stale_s}", readonly=True), {})
        try:
            yield from read(self, partition)
        finally:
            reading._forget(root_s)

    class StaleReader(TidelogReader):  # type: ignore[misc]
        def read(self, partition: Any) -> Iterator[pa.RecordBatch]:
            return stale_read(TidelogReader.read, self, partition)

    class StaleStreamReader(TidelogStreamReader):  # type: ignore[misc]
        def read(self, partition: Any) -> Iterator[pa.RecordBatch]:
            return stale_read(TidelogStreamReader.read, self, partition)

    class StaleSource(TidelogDataSource):  # type: ignore[misc]
        @classmethod
        def name(cls) -> str:
            return name

        def reader(self, schema: Any) -> Any:
            return StaleReader(self._opts(), schema)

        def streamReader(self, schema: Any) -> Any:
            return StaleStreamReader(self._opts(), schema)

    return StaleSource


def _stores(tmp_path: Path, store: tidelog.Store, t: tidelog.Topic) -> Path:
    """1,000 records, a copy of the store directory, then 1,000 more."""
    t.append_many([b"x%d" % i for i in range(1000)])
    store.flush()
    stale = tmp_path / "stale"
    shutil.copytree(tmp_path / "s", stale)
    t.append_many([b"y%d" % i for i in range(1000)])
    return stale


def test_SPK_12_SPK_14_stream_with_a_stale_executor_fails_and_trims_nothing_undelivered(
    spark: Any, tmp_path: Path
) -> None:
    """SPK-13, SPK-14, SPK-15, SPK-10, SPK-12: a streaming query (trim=acked, 800 records per
    micro-batch) whose executors see 1,000 of the store's 2,000 records. Without the guard the
    query finished "successfully" with 1,000 rows in Parquet, acknowledged through 1,600 and
    the owner deleted 600 records no sink had. With it, the second micro-batch's task fails
    with stale_view, the query fails, Spark acknowledges only the first batch, and every
    record after it is still in the store: a deployment outside SPK-13 fails, it does not
    lose records."""
    root = tmp_path / "s"
    with tidelog.open(f"file://{root}?{OWNER}") as store:
        t = store.topic("ev", trim="acked")
        stale = _stores(tmp_path, store, t)
        spark.dataSource.register(_stale_source("tidelog_stale_stream", root, stale))
        query = (
            spark.readStream.format("tidelog_stale_stream")
            .option("topic", "ev")
            .option("startingOffsets", "earliest")
            .option("maxRecordsPerTrigger", 800)
            .option("freshnessTimeoutMs", 300)
            .load(str(root))
            .writeStream.format("parquet")
            .option("checkpointLocation", str(tmp_path / "ck"))
            .trigger(availableNow=True)
            .start(str(tmp_path / "out"))
        )
        try:
            with pytest.raises(Exception) as info:
                query.awaitTermination(240)
                raise AssertionError("the query finished without an error")
        finally:
            query.stop()
        message = str(info.value)
        assert "stale_view" in message or "behind the driver's plan" in message, message
        assert "its head 1000, the plan's end 1600" in message
        delivered = spark.read.parquet(str(tmp_path / "out")).count()
        assert delivered == 800
        assert t.subscriber("spark").hwm <= delivered
        kept = [r.seq for r in t.read(after=0, limit=5000) if isinstance(r, Record)]
        assert kept[-1] == 2000 and kept[0] <= delivered + 1 and len(kept) == 2001 - kept[0]


def test_SPK_14_batch_read_with_a_stale_executor_fails_instead_of_returning_short(
    spark: Any, tmp_path: Path
) -> None:
    """SPK-14: a batch read planned over 2,000 records whose executors see 1,000 fails with
    stale_view (before the guard: count() said 1,000, without an error)."""
    root = tmp_path / "s"
    with tidelog.open(f"file://{root}?{OWNER}") as store:
        stale = _stores(tmp_path, store, store.topic("ev"))
        spark.dataSource.register(_stale_source("tidelog_stale_batch", root, stale))
        df = (
            spark.read.format("tidelog_stale_batch")
            .option("topic", "ev")
            .option("partitionRecords", 1500)
            .option("freshnessTimeoutMs", 300)
            .load(str(root))
        )
        with pytest.raises(Exception, match=r"behind the driver's plan .topic 'ev': its head 1000"):
            df.count()
        # the same read through the plain source, whose executors see the store: all of it
        plain = spark.read.format("tidelog").option("topic", "ev").load(str(root))
        assert plain.count() == 2000


def test_SPK_16_a_write_whose_executor_cannot_see_the_staging_directory_says_so(
    spark: Any, tmp_path: Path
) -> None:
    """SPK-16: a write task whose host has no staging directory (nor its parent) fails naming
    the path and the host, not "the write job was aborted"; nothing is appended."""
    from tidelog.adapters.spark.source import TidelogDataSource, TidelogWriter

    root, gone = tmp_path / "s", tmp_path / "elsewhere"
    gone_s = str(gone)

    class BlindWriter(TidelogWriter):  # type: ignore[misc]
        def write(self, iterator: Any) -> Any:
            shutil.rmtree(gone_s, ignore_errors=True)  # this host has no such directory
            return TidelogWriter.write(self, iterator)

    class BlindSource(TidelogDataSource):  # type: ignore[misc]
        @classmethod
        def name(cls) -> str:
            return "tidelog_blind"

        def writer(self, schema: Any, overwrite: bool) -> Any:
            return BlindWriter(self._opts())

    spark.dataSource.register(BlindSource)
    with tidelog.open(f"file://{root}?{OWNER}") as store:
        store.topic("ev")
        df = spark.createDataFrame([(b"a",), (b"b",)], "payload binary")
        with pytest.raises(Exception) as info:
            (
                df.write.format("tidelog_blind")
                .option("topic", "ev")
                .option("stagingDir", str(gone / "staging"))
                .mode("append")
                .save(str(root))
            )
        message = str(info.value)
        assert "does not exist on executor host" in message and gone_s in message, message
        assert "the write job was aborted" not in message
        assert store.topic("ev").state().head_seq == 0
