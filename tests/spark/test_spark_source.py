"""The ``tidelog`` PySpark data source end to end on a local[2] session (spec/BUNDLES.md SPK-*).

Every test keeps its store open in this process while Spark works on it: Spark's executors and
its streaming source runner are other processes, so they can only use read-only views and
requests to this owner (SPK-2); a test passing proves they never needed the writer lock.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

import tidelog
from tidelog.adapters.spark import acknowledge_checkpoint, committed_offset
from tidelog.bundle import BundleRecord, RecordBundle
from tidelog.clock import FakeClock
from tidelog.records import Record

pytestmark = pytest.mark.spark

OWNER_OPTIONS = "progress_flush_ms=10"  # the owner applies Spark's requests within ~10 ms


def owner(root: Path, **kw: Any) -> tidelog.Store:
    return tidelog.open(f"file://{root}?{OWNER_OPTIONS}", **kw)


def read(spark: Any, root: Path, topic: str, **options: object) -> Any:
    reader = spark.read.format("tidelog").option("topic", topic)
    for key, value in options.items():
        reader = reader.option(key, value)
    return reader.load(str(root))


def records(store: tidelog.Store, topic: str) -> list[Record]:
    return [r for r in store.topic(topic, create=False).read(limit=100_000)]  # type: ignore[misc]


# -- batch read ---------------------------------------------------------------------------------
def test_SPK_3_batch_read_round_trip_partitions_and_bounds(spark: Any, tmp_path: Path) -> None:
    """SPK-3: the six-column schema, one task per seq range, every record once and exact;
    fromSeq/toSeq and fromTs/toTs bounds (ts never decreases along seq, TOP-5). SPK-2: this
    process owns the store throughout; Spark's executors only ever open read-only views."""
    root = tmp_path / "s"
    clock = FakeClock(1_700_000_000_000)
    with owner(root, clock=clock) as store:
        t = store.topic("ev")
        for i in range(5):
            t.append_many([b"p%d-%d" % (i, j) for j in range(10)], tag=f"t{i}")
            clock.advance(1000)
        t.append(b"", node="node-1")
        t.append(b"\x00\xff", tag="x", node="y")
        expected = records(store, "ev")

        df = read(spark, root, "ev", partitionRecords=16)
        assert df.schema.simpleString() == (
            "struct<topic:string,seq:bigint,ts:timestamp,tag:string,node:string,payload:binary>"
        )
        assert df.rdd.getNumPartitions() == 4  # 52 seqs / 16
        rows = df.orderBy("seq").collect()
        assert [(r.seq, r.tag, r.node, bytes(r.payload)) for r in rows] == [
            (r.seq, r.tag, r.node, r.payload) for r in expected
        ]
        assert {r.topic for r in rows} == {"ev"}
        assert [int(r.ts.timestamp() * 1000) for r in rows] == [r.ts for r in expected]

        bounded = read(spark, root, "ev", fromSeq=10, toSeq=20).select("seq").collect()
        assert sorted(r.seq for r in bounded) == list(range(10, 21))
        since = read(spark, root, "ev", fromTs=1_700_000_001_000, toTs="2023-11-14T22:13:22Z")
        assert sorted(r.tag for r in since.select("tag").distinct().collect()) == ["t1", "t2"]


def test_SPK_4_tombstones_fail_the_query_or_become_rows(spark: Any, tmp_path: Path) -> None:
    """SPK-4: a read that meets an involuntary gap fails naming it (default), or with
    tombstones=rows returns a row with the gap's range and no payload."""
    root = tmp_path / "s"
    with owner(root) as store:
        t = store.topic("capped", cap_records=10)  # no subscriber: the cap evicts (RET-2)
        for i in range(25):
            t.append(b"x%d" % i)
        assert t.state().evict_floor == 16
        assert read(spark, root, "capped").count() == 10  # from evict_floor by default
        with pytest.raises(Exception, match=r"seqs 1\.\.15 were lost"):
            read(spark, root, "capped", fromSeq=1).collect()
        df = read(spark, root, "capped", fromSeq=1, tombstones="rows", partitionRecords=8)
        assert df.columns[-1] == "gap_to"
        gaps = df.where("gap_to is not null").orderBy("seq").collect()
        # the gap 1..15 crosses the partitions 1..8 and 9..16: clipped, never repeated
        assert [(g.seq, g.gap_to, g.payload, g.ts) for g in gaps] == [
            (1, 8, None, None),
            (9, 15, None, None),
        ]
        assert df.where("gap_to is null").count() == 10


# -- bundle slots -------------------------------------------------------------------------------
def test_SPK_5_bundle_slot_read_with_drift(spark: Any, tmp_path: Path) -> None:
    """SPK-5: option slot=N reads a bundle slot's columns (dictionaries decoded, unsigned
    widened, drifted schemas merged, missing columns null) behind the bundle's `_seq`."""
    root = tmp_path / "s"
    status = pa.DictionaryArray.from_arrays(pa.array([0, 1], pa.int8()), pa.array(["ok", "bad"]))
    v1 = pa.record_batch({"n": pa.array([1, 2], pa.uint32()), "status": status})
    v2 = pa.record_batch({"n": pa.array([3], pa.uint32()), "extra": [1.5]})
    device = pa.record_batch({"fw": ["1.0"]})
    with owner(root) as store:
        t = store.topic("b")
        t.append_bundle(RecordBundle({0: v1, 1: device}))
        t.append_bundle(RecordBundle({1: device}))  # no slot 0: no rows
        t.append_bundle(RecordBundle({0: v2}))
        df = read(spark, root, "b", slot=0)
        assert df.schema.simpleString() == (
            "struct<_seq:bigint,n:bigint,status:string,extra:double>"
        )
        got = [tuple(r) for r in df.orderBy("_seq", "n").collect()]
        assert got == [(1, 1, "ok", None), (1, 2, "bad", None), (3, 3, None, 1.5)]
        assert [tuple(r) for r in read(spark, root, "b", slot=1).collect()] == [
            (1, "1.0"),
            (2, "1.0"),
        ]
        explicit = (
            spark.read.format("tidelog")
            .schema("_seq long, n long")
            .option("topic", "b")
            .option("slot", 0)
            .load(str(root))
        )
        with pytest.raises(Exception, match="not in the read schema"):
            explicit.collect()  # `status` is not in the given schema: no silent column drop


# -- batch write ----------------------------------------------------------------------------------
def staging_of(root: Path) -> Path:
    return root.parent / f".{root.name}.spark-staging"


def test_SPK_6_SPK_7_batch_write_round_trip(spark: Any, tmp_path: Path) -> None:
    """SPK-6/7: executors stage files, the commit appends every row in one ingest: consecutive
    seqs, labels kept, topic created with topic.* config; staged files are gone afterwards."""
    root = tmp_path / "s"
    rows = [
        (bytes([i]) * i, f"t{i % 3}" if i % 2 else None, "n" if i % 5 == 0 else None)
        for i in range(1, 101)
    ]
    df = spark.createDataFrame(rows, "payload binary, tag string, node string").repartition(3)
    with owner(root) as store:
        (
            df.write.format("tidelog")
            .mode("append")
            .option("topic", "w")
            .option("topic.durability", "disk")
            .save(str(root))
        )
        got = records(store, "w")
        assert sorted((r.payload, r.tag, r.node) for r in got) == sorted(rows)
        assert [r.seq for r in got] == list(range(1, 101))
        assert store.topic("w").config.durability == "disk"
        # bundles: each Arrow batch Spark hands the writer becomes one record
        tele = spark.range(0, 30).selectExpr("id", "cast(id * 1.5 as double) as v").coalesce(1)
        tele.write.format("tidelog").mode("append").option("topic", "tb").option("slot", 2).save(
            str(root)
        )
        bundles = store.topic("tb").read_bundles()
        assert all(isinstance(b, BundleRecord) and b.bundle.present() == [2] for b in bundles)
        batch = pa.Table.from_batches([b.bundle[2] for b in bundles])  # type: ignore[union-attr]
        assert sorted(batch.column("id").to_pylist()) == list(range(30))
    assert not staging_of(root).exists()
    with pytest.raises(Exception, match="append-only"):
        df.write.format("tidelog").mode("overwrite").option("topic", "w").save(str(root))


def test_SPK_7_writer_abort_leaves_nothing(spark: Any, tmp_path: Path) -> None:
    """SPK-7: one task fails (a null payload): the job aborts, no row becomes visible, and
    nothing staged remains, whether the other tasks finished, still ran when the driver
    aborted (their attempt directory is renamed away first) or never started."""
    root = tmp_path / "s"
    rows = [(None if i == 77 else b"ok", None) for i in range(100)]
    df = spark.createDataFrame(rows, "payload binary, tag string").repartition(4)
    with owner(root) as store:
        store.topic("w").append(b"before")
        with pytest.raises(Exception, match="holds nulls"):
            df.write.format("tidelog").mode("append").option("topic", "w").save(str(root))
        assert [r.payload for r in records(store, "w")] == [b"before"]
    assert not staging_of(root).exists()


# -- streaming -------------------------------------------------------------------------------------
def stream_to_parquet(spark: Any, root: Path, out: Path, **options: object) -> Any:
    reader = spark.readStream.format("tidelog")
    for key, value in {"topic": "ev", "subscriber": "pq", **options}.items():
        reader = reader.option(key, value)
    query = (
        reader.load(str(root))
        .writeStream.format("parquet")
        .option("path", str(out / "data"))
        .option("checkpointLocation", str(out / "ck"))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination(120)
    assert query.exception() is None
    return query


def test_SPK_9_to_12_streaming_round_trip_restart_and_commit_lag(
    spark: Any, tmp_path: Path
) -> None:
    """SPK-9 admission control (maxRecordsPerTrigger) under availableNow; SPK-10 the source's
    commit trims through the subscriber one batch late, acknowledge_checkpoint closes the gap;
    SPK-12 a restart from the checkpoint resumes exactly: no loss, no duplicates."""
    root, out = tmp_path / "s", tmp_path / "out"
    with owner(root) as store:
        t = store.topic("ev")
        t.append_many([b"a%d" % i for i in range(100)])
        q = stream_to_parquet(spark, root, out, maxRecordsPerTrigger=30)
        sizes = [p["numInputRows"] for p in q.recentProgress if p["numInputRows"]]
        assert sizes == [30, 30, 30, 10]
        assert committed_offset(str(out / "ck")) == 100
        # the last batch (91..100) was never acknowledged by Spark: kept, everything else trimmed
        assert t.subscriber("pq").hwm == 90
        assert t.state().earliest_seq == 91

        t.append_many([b"b%d" % i for i in range(50)])
        stream_to_parquet(spark, root, out, maxRecordsPerTrigger=30)
        df = spark.read.parquet(str(out / "data"))
        seqs = sorted(r.seq for r in df.select("seq").collect())
        assert seqs == list(range(1, 151))  # restart: exactly once
        assert t.subscriber("pq").hwm == 130  # 101..130 acked when 131..150 was planned
        assert acknowledge_checkpoint(store, "ev", "pq", str(out / "ck")) == 150
        assert t.state().count == 0


def test_SPK_9_starting_offsets_and_subscriber_registration(spark: Any, tmp_path: Path) -> None:
    """SPK-9: a new query registers its subscriber first (so nothing it has not read is
    trimmed); startingOffsets=latest reads only what comes after the query starts."""
    root, out = tmp_path / "s", tmp_path / "out"
    with owner(root) as store:
        t = store.topic("ev")
        t.append_many([b"old"] * 5)
        stream_to_parquet(spark, root, out, startingOffsets="latest", subscriber="late")
        assert t.subscriber("late").hwm == 5
        assert not (out / "data").exists() or spark.read.parquet(str(out / "data")).count() == 0


def test_SPK_11_stream_sink_is_idempotent_on_a_replayed_batch(spark: Any, tmp_path: Path) -> None:
    """SPK-11: tidelog -> tidelog. Losing the checkpoint's record of the last committed batch
    (a crash after the sink's ingest, before Spark's commit log) makes Spark replay that batch
    on restart: the producer mark (spark-<queryId>, batchId + 1) refuses the duplicate."""
    root, ck = tmp_path / "s", tmp_path / "ck"

    def run() -> Any:
        query = (
            spark.readStream.format("tidelog")
            .option("topic", "in")
            .option("subscriber", "cp")
            .option("maxRecordsPerTrigger", 20)
            .load(str(root))
            .select("payload", "tag")
            .writeStream.format("tidelog")
            .option("topic", "out")
            .option("checkpointLocation", str(ck))
            .trigger(availableNow=True)
            .start(str(root))
        )
        query.awaitTermination(120)
        assert query.exception() is None
        return query

    with owner(root) as store:
        store.topic("in").append_many([b"m%d" % i for i in range(40)], tag="x")
        first = run()
        assert len(records(store, "out")) == 40
        os.unlink(ck / "commits" / "1")  # the crash: batch 1 applied, its commit not recorded
        shutil.rmtree(ck / "commits" / ".1.crc", ignore_errors=True)
        for crc in (ck / "commits").glob(".1.crc"):
            crc.unlink()
        replay = run()
        assert replay.id == first.id  # same query: same producer id
        assert [p["batchId"] for p in replay.recentProgress if p["numInputRows"]] == [1]
        out = records(store, "out")
        assert sorted(r.payload for r in out) == sorted(b"m%d" % i for i in range(40))
        store.topic("in").append_many([b"n%d" % i for i in range(5)])
        run()
        assert len(records(store, "out")) == 45
    assert not staging_of(root).exists()  # every micro-batch's attempt directory is gone
