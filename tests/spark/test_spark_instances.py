"""The ``tidelog`` Spark source on a store of several instances (spec/BUNDLES.md SPK-50,
spec/INSTANCES.md INST-12): a batch read on a local[2] session while this process holds both
instances' slots, the options it refuses at planning, and SPK-14/SPK-15's guard per instance
without a session."""

from __future__ import annotations

import json
import os
import pickle
from pathlib import Path
from typing import Any

import pytest

import tidelog
from tidelog.adapters.spark.guard import Planned, StaleView
from tidelog.adapters.spark.options import parse_options
from tidelog.backends.instances import merged
from tidelog.clock import FakeClock
from tidelog.errors import BadOption

pytestmark = pytest.mark.spark

SMALL = "wal_file_bytes=1MiB&progress_flush_ms=10"


def _writers(root: Path, clock: FakeClock) -> tuple[tidelog.Store, tidelog.Store]:
    uri = f"file://{root}?instances=2&{SMALL}"
    return tidelog.open(uri, clock=clock), tidelog.open(uri, clock=clock)


def _fill(root: Path) -> tuple[tidelog.Store, tidelog.Store, dict[tuple[int, int], bytes]]:
    """Instance 0: 7 records, instance 1: 4 (one a tagged record), ts 1000 ms apart."""
    clock = FakeClock(1_700_000_000_000)
    a, b = _writers(root, clock)
    want: dict[tuple[int, int], bytes] = {}
    ta, tb = a.topic("ev"), b.topic("ev")
    for i in range(7):
        want[(0, ta.append(b"a%d" % i))] = b"a%d" % i
        clock.advance(1000)
        if i < 4:
            want[(1, tb.append(b"b%d" % i, tag="t" if i == 2 else None))] = b"b%d" % i
            clock.advance(1000)
    return a, b, want


def _read(spark: Any, location: str, **options: object) -> Any:
    reader = spark.read.format("tidelog").option("topic", "ev")
    for key, value in options.items():
        reader = reader.option(key, value)
    return reader.load(location)


def test_SPK_50_batch_read_every_instance_with_its_column(spark: Any, tmp_path: Path) -> None:
    """SPK-50, INST-12: `load("file:///root?instances=2")` (or option instances=auto) reads
    every instance's copy, each cut into its own seq ranges (partitionRecords), every record
    once with its instance and that instance's seq; fromTs/toTs bound every instance."""
    root = tmp_path / "s"
    a, b, want = _fill(root)
    try:
        df = _read(spark, f"file://{root}?instances=2", partitionRecords=3)
        assert df.columns == ["topic", "seq", "ts", "tag", "node", "payload", "instance"]
        assert df.rdd.getNumPartitions() == 3 + 2  # 7 records of 0 by 3, 4 of 1 by 3
        rows = df.collect()
        assert {(r.instance, r.seq): bytes(r.payload) for r in rows} == want
        assert len(rows) == len(want)
        assert [r.tag for r in rows if r.instance == 1 and r.seq == 3] == ["t"]
        auto = _read(spark, str(root), instances="auto").collect()
        assert sorted((r.instance, r.seq) for r in auto) == sorted(want)
        start = 1_700_000_000_000 + 2000
        bounded = _read(spark, str(root), instances="2", fromTs=start, toTs=start + 3000)
        got = sorted((r.instance, bytes(r.payload)) for r in bounded.collect())
        assert got == [(0, b"a1"), (0, b"a2"), (1, b"b1"), (1, b"b2")]
    finally:
        a.close()
        b.close()


def test_SPK_50_instance_without_the_topic_and_an_untaken_slot(spark: Any, tmp_path: Path) -> None:
    """SPK-50: an instance whose writer never opened the topic, and a slot no writer took,
    contribute nothing; a topic in no instance is no_such_topic at planning."""
    root = tmp_path / "s"
    with tidelog.open(f"file://{root}?instances=3&{SMALL}") as one:
        t = one.topic("ev")
        t.append_many([b"x", b"y"])
        rows = _read(spark, f"file://{root}?instances=3").collect()
        assert [(r.instance, r.seq, bytes(r.payload)) for r in rows] == [
            (0, 1, b"x"),
            (0, 2, b"y"),
        ]
        with pytest.raises(Exception, match=r"no_such_topic|does not exist"):
            spark.read.format("tidelog").option("topic", "nope").load(
                f"file://{root}?instances=3"
            ).collect()


def test_SPK_50_refusals_at_planning(spark: Any, tmp_path: Path) -> None:
    """SPK-50, INST-1, INST-12: fromSeq/toSeq and slot with instances, a count other than the
    store's and instances on a single store are bad_option at planning; without the option
    the store is refused as before."""
    root, single = tmp_path / "s", tmp_path / "single"
    a, b, _ = _fill(root)
    tidelog.open(f"file://{single}?{SMALL}").close()
    try:
        for options, why in (
            ({"fromSeq": 2}, "fromSeq"),
            ({"slot": 0}, "slot"),
            ({"instances": "3"}, "has 2 instances"),
        ):
            with pytest.raises(Exception, match=why):
                _read(spark, f"file://{root}?instances=2", **options).collect()
        with pytest.raises(Exception, match="single-instance"):
            _read(spark, str(single), instances="2").collect()
        with pytest.raises(Exception, match="INST-1"):
            _read(spark, str(root)).collect()
    finally:
        a.close()
        b.close()


def _stream(spark: Any, root: Path, out: Path, **options: object) -> Any:
    reader = spark.readStream.format("tidelog")
    for key, value in {"topic": "ev", "subscriber": "pq", **options}.items():
        reader = reader.option(key, value)
    query = (
        reader.load(f"file://{root}?instances=2")
        .writeStream.format("parquet")
        .option("path", str(out / "data"))
        .option("checkpointLocation", str(out / "ck"))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination(180)
    assert query.exception() is None
    return query


def test_SPK_51_streaming_read_with_the_cursor_as_offset(spark: Any, tmp_path: Path) -> None:
    """SPK-51, INST-15..INST-17: a streaming read of an instances store; its offsets are INST-8
    cursors, maxRecordsPerTrigger shared among the instances; the merged subscriber is
    committed one batch late (SPK-10); a restart from the checkpoint reads only what came
    since, every record of both instances exactly once (SPK-12)."""
    root, out = tmp_path / "s", tmp_path / "out"
    a, b, want = _fill(root)
    try:
        q = _stream(spark, root, out, maxRecordsPerTrigger=4)
        sizes = [p["numInputRows"] for p in q.recentProgress if p["numInputRows"]]
        assert sizes == [4, 4, 2, 1]  # 2 of each instance per trigger while it has them
        assert json.loads(q.lastProgress["sources"][0]["endOffset"]) == {"cursor": "7.4"}
        sub = merged(a.topic("ev")).subscribe("pq")
        assert sub.hwm == "6.4"  # the last batch is acknowledged by the next one (SPK-10)
        for i in range(7, 9):
            want[(0, a.topic("ev").append(b"a%d" % i))] = b"a%d" % i
        want[(1, b.topic("ev").append(b"b4"))] = b"b4"
        _stream(spark, root, out, maxRecordsPerTrigger=4)
        rows = spark.read.parquet(str(out / "data")).collect()
        assert sorted((r.instance, r.seq) for r in rows) == sorted(want)  # once each
        assert {(r.instance, r.seq): bytes(r.payload) for r in rows} == want
        assert sub.hwm == "7.4"
    finally:
        a.close()
        b.close()


def test_SPK_50_options_parse_instances_from_uri_or_option(tmp_path: Path) -> None:
    """SPK-50: `?instances=` of a file:// URI and option instances give the same options; a
    count outside 1..256 is bad_option naming INST-1."""
    by_uri = parse_options({"path": f"file://{tmp_path}?instances=4", "topic": "ev"})
    by_option = parse_options({"path": str(tmp_path), "topic": "ev", "instances": "4"})
    assert by_uri == by_option and by_uri.instances == "4"
    assert parse_options({"path": str(tmp_path), "topic": "ev"}).instances is None
    with pytest.raises(BadOption, match="INST-1"):
        parse_options({"path": str(tmp_path), "topic": "ev", "instances": "0"})


def _cut(opts: Any, lo: int, hi: int) -> list[tuple[int, int]]:
    """Tasks of 100 seqs (SPK-3's cut with partitionRecords=100)."""
    from tidelog.adapters.spark import reading

    return reading.split(lo, hi, 100)


def test_SPK_50_a_task_checks_its_instance_plan(tmp_path: Path) -> None:
    """SPK-50, SPK-14, SPK-15 per instance: a task of instance 1 planned up to a seq its
    instance's view does not reach fails with StaleView naming that instance's directory,
    never returns short; a task within the plan reads its rows (pickled as Spark ships it)."""
    from tidelog.adapters.spark import instances, reading

    root = tmp_path / "s"
    a, b, _ = _fill(root)
    try:
        opts = parse_options(
            {"path": f"file://{root}?instances=2", "topic": "ev", "freshnessTimeoutMs": "100"}
        )
        parts = pickle.loads(pickle.dumps(instances.partitions(opts, _cut)))
        assert [(p.instance, p.lo, p.hi) for p in parts] == [(0, 1, 7), (1, 1, 4)]
        rows = [r for p in parts for batch in instances.read(opts, p) for r in batch.to_pylist()]
        assert len(rows) == 11 and {r["instance"] for r in rows} == {0, 1}
        ahead = Planned(parts[1].planned.store_id, parts[1].planned.incarnation, 9)
        late = instances.InstanceRange(1, 1, 9, ahead)
        with pytest.raises(StaleView, match=str(root / "instances" / "1")):
            list(instances.read(opts, late))
    finally:
        a.close()
        b.close()
        for i in (0, 1):
            reading._forget(str(root / "instances" / str(i)))


def test_SPK_51_starting_offsets_seq_refused(tmp_path: Path) -> None:
    """SPK-51: a seq as startingOffsets names no position of a topic of several instances:
    bad_option when the stream reader is made (planning)."""
    from pyspark.sql.pandas.types import from_arrow_schema

    from tidelog.adapters.spark import instances

    root = tmp_path / "s"
    with tidelog.open(f"file://{root}?instances=2&{SMALL}") as store:
        store.topic("ev").append(b"x")
        base = {"path": f"file://{root}?instances=2", "topic": "ev"}
        opts = parse_options({**base, "startingOffsets": "5"})
        user = from_arrow_schema(instances.schema(opts))
        with pytest.raises(BadOption, match="SPK-51"):
            instances.InstancesStreamReader(
                opts,
                user,
                _cut,
            )
        latest = parse_options({**base, "startingOffsets": "latest", "subscriber": "z"})
        reader = instances.InstancesStreamReader(latest, user, _cut)
        try:
            assert reader.initialOffset() == {"cursor": "1.0"}
            assert merged(store.topic("ev")).subscribe("z").hwm == "1.0"  # registered at head
        finally:
            reader.stop()


def test_SPK_52_a_write_goes_into_instance_0(spark: Any, tmp_path: Path) -> None:
    """SPK-52, SPK-6: a batch write of an instances store is one ingest into instance 0's copy
    of the topic (applied by the writer process holding it, XPR-2), its rows once, after the
    records already there; instance 1 gets nothing; the staging directory is beside the root,
    never inside it, and gone after the commit. A topic with no copy in instance 0 and
    topic.<key> options are refused at planning, nothing written."""
    from tidelog.backends.instances import merged

    root = tmp_path / "s"
    a, b, want = _fill(root)
    try:
        df = spark.createDataFrame([(b"w%d" % i,) for i in range(5)], "payload binary")
        df.write.format("tidelog").option("topic", "ev").mode("append").save(
            f"file://{root}?instances=2"
        )
        items, _ = merged(a.topic("ev")).read(None, 1000)
        by = {(e.instance, e.item.seq): e.item.payload for e in items}
        written = {k: v for k, v in by.items() if k not in want}
        assert sorted(written.values()) == [b"w%d" % i for i in range(5)]
        assert {k[0] for k in written} == {0} and min(k[1] for k in written) == 8
        assert sorted(os.listdir(root / "instances")) == ["0", "1"]  # nothing staged inside
        staging = tmp_path / ".s.spark-staging"  # beside the root (SPK-6's default place)
        assert not staging.exists() or not list(staging.iterdir())
        with pytest.raises(Exception, match=r"topic\.<key>"):
            df.write.format("tidelog").option("topic", "ev").option(
                "topic.durability", "fsync"
            ).mode("append").save(f"file://{root}?instances=2")
        b.topic("only1").append(b"x")
        with pytest.raises(Exception, match="no copy in instance 0"):
            df.write.format("tidelog").option("topic", "only1").mode("append").save(
                f"file://{root}?instances=2"
            )
        assert a.topic("ev").state().head_seq == 12  # 7 + 5: the refused writes wrote nothing
    finally:
        a.close()
        b.close()


def test_SPK_52_streaming_from_instances_into_instance_0(spark: Any, tmp_path: Path) -> None:
    """SPK-51, SPK-52, SPK-11: a streaming query reads topic `ev` of an instances store and
    writes its payloads into topic `out` of the same store: every micro-batch is one ingest into
    instance 0's copy with the query's producer mark, each record once."""
    root = tmp_path / "s"
    a, b, want = _fill(root)
    try:
        a.topic("out")  # instance 0's copy, opened by its writer (SPK-52)
        location = f"file://{root}?instances=2"
        query = (
            spark.readStream.format("tidelog")
            .option("topic", "ev")
            .option("maxRecordsPerTrigger", 4)
            .load(location)
            .select("payload")
            .writeStream.format("tidelog")
            .option("topic", "out")
            .option("checkpointLocation", str(tmp_path / "ck"))
            .trigger(availableNow=True)
            .start(location)
        )
        query.awaitTermination(180)
        assert query.exception() is None
        out = merged(a.topic("out")).read(None, 1000).items
        assert {e.instance for e in out} == {0}
        assert sorted(e.item.payload for e in out) == sorted(want.values())
    finally:
        a.close()
        b.close()
