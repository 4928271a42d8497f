"""The ``tidelog`` source on a local[2] session reading a served store through ``http://``
(spec/BUNDLES.md SPK-40..SPK-42): the planner, the streaming source runner and every executor
reach the store only through ``tidelog serve``'s API (here a ``ServiceThread`` in this process,
which owns the store), never its directory."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from test_spark_net_units import serve
from test_spark_source import stream_to_parquet

import tidelog
from tidelog.adapters.spark import acknowledge_checkpoint, committed_offset
from tidelog.hooks import Checkpoint, EngineTopics, hooks
from tidelog.records import Record

pytestmark = pytest.mark.spark


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[tidelog.Store, str]]:
    with serve(tmp_path) as (store, url):
        yield store, url


def test_SPK_40_41_batch_read_through_the_owner_every_row_exactly_once(
    spark: Any, served: tuple[tidelog.Store, str]
) -> None:
    """Sealed segments, the unsealed tail and a tombstone (the leading one of a capped topic,
    TMB-1), read by executors over the network: every live record once and exact, the gap as
    rows covering it once (SPK-4, clipped per task)."""
    store, url = served
    t = store.topic("ev", cap_records=2000, durability="memory")
    for i in range(3):
        t.append_many([b"a%d-%d" % (i, j) for j in range(1000)], tag=f"t{i}")
    hooks(store, Checkpoint).checkpoint()
    t.append_many([b"tail%d" % j for j in range(700)], node="n")  # unsealed: 3001..3700
    log: Any = hooks(store, EngineTopics).topics["ev"].log
    assert log.chunks and log.payloads
    floor = t.state().evict_floor
    assert floor > 1
    expected = [r for r in t.read(0, 100_000) if isinstance(r, Record)]
    assert expected[0].seq == floor and expected[-1].seq == 3700

    df = (
        spark.read.format("tidelog")
        .option("topic", "ev")
        .option("fromSeq", 1)
        .option("tombstones", "rows")
        .option("partitionRecords", 700)
        .load(url)
    )
    assert df.rdd.getNumPartitions() == 6  # 3700 seqs / 700
    rows = df.collect()
    live = sorted((r.seq, r.tag, r.node, bytes(r.payload)) for r in rows if r.gap_to is None)
    assert live == [(r.seq, r.tag, r.node, r.payload) for r in expected]
    gaps = sorted((r.seq, r.gap_to) for r in rows if r.gap_to is not None)
    covered = [s for a, b in gaps for s in range(a, b + 1)]
    assert covered == list(range(1, floor))  # each lost seq once, across the tasks

    with pytest.raises(Exception, match="tombstone"):
        spark.read.format("tidelog").option("topic", "ev").option("fromSeq", 1).load(url).count()


def test_SPK_40_streaming_through_the_owner_commits_and_trims_only_what_was_delivered(
    spark: Any, served: tuple[tidelog.Store, str], tmp_path: Path
) -> None:
    """SPK-9/SPK-10 over the network: the source's commits move the durable subscriber through
    the service, so trim=acked deletes what the sink committed and nothing it has not; a
    restart resumes exactly; acknowledge_checkpoint closes the one-batch lag."""
    store, url = served
    out = tmp_path / "out"
    t = store.topic("ev")
    t.append_many([b"a%d" % i for i in range(100)])

    def run() -> Any:
        return stream_to_parquet(spark, url, out, maxRecordsPerTrigger=30)  # type: ignore[arg-type]

    q = run()
    sizes = [p["numInputRows"] for p in q.recentProgress if p["numInputRows"]]
    assert sizes == [30, 30, 30, 10]
    assert committed_offset(str(out / "ck")) == 100
    assert t.subscriber("pq").hwm == 90  # the last batch is not acknowledged by Spark
    assert t.state().earliest_seq == 91  # trimmed: only what the sink has

    t.append_many([b"b%d" % i for i in range(50)])
    hooks(store, Checkpoint).checkpoint()
    t.append_many([b"c%d" % i for i in range(20)])  # and a tail again
    run()
    df = spark.read.parquet(str(out / "data"))
    got = sorted((r.seq, bytes(r.payload)) for r in df.select("seq", "payload").collect())
    want = [(i + 1, b"a%d" % i) for i in range(100)]
    want += [(101 + i, b"b%d" % i) for i in range(50)] + [(151 + i, b"c%d" % i) for i in range(20)]
    assert got == want  # every record exactly once across the restart
    assert t.subscriber("pq").hwm == 160  # 101..130, 131..160 acknowledged, 161..170 not
    assert t.state().earliest_seq == 161  # nothing undelivered was trimmed
    assert acknowledge_checkpoint(store, "ev", "pq", str(out / "ck")) == 170
    assert t.state().count == 0
