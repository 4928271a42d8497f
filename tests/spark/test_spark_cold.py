"""Spark reads of a store whose older segments are in a cold tier (spec/BUNDLES.md SPK-30,
spec/TIERING.md TIER-8): a local directory and moto's S3 server on 127.0.0.1. The store is
owned by this process; Spark's executors open read-only views with option ``cold``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from test_spark_source import stream_to_parquet

import tidelog
from tidelog.backends.file.coldchunk import ColdChunk
from tidelog.hooks import Checkpoint, EngineTopics, hooks
from tidelog.records import Record, Tombstone

pytestmark = pytest.mark.spark

SMALL = "progress_flush_ms=10&segment_max_records=10"


def cold_store(root: Path, cold: str) -> tidelog.Store:
    """Seqs 1..45 of topic ``ev``: 1..5 evicted (floor 6, a tombstone), 6..13 deleted
    (silent), 14..40 in cold segments, 41..45 hot: what tests/unit/test_tiering.py's
    TIER-9 test builds, so the cold part holds a floor and dead slots."""
    store = tidelog.open(f"file://{root}?{SMALL}", cold=cold, hot_retain_segments=1)
    t = store.topic("ev", cap_records=40)
    for lo in range(0, 40, 5):
        t.append_many([b"p%05d" % i for i in range(lo, lo + 5)], tag=f"t{lo % 3}")
    hooks(store, Checkpoint).checkpoint()
    t.append_many([b"x%d" % i for i in range(5)])  # the cap evicts 1..5
    t.delete(before_seq=14)
    hooks(store, Checkpoint).checkpoint()
    chunks = hooks(store, EngineTopics).topics["ev"].log.chunks
    assert [c.first_seq for c in chunks if isinstance(c, ColdChunk)] == [11, 21, 31]
    return store


def spark_read(spark: Any, root: Path, cold: str, **options: object) -> list[Any]:
    reader = spark.read.format("tidelog").option("topic", "ev").option("cold", cold)
    for key, value in options.items():
        reader = reader.option(key, value)
    return list(reader.load(str(root)).orderBy("seq").collect())


def check_reads(spark: Any, root: Path, store: tidelog.Store, cold: str) -> None:
    own = store.topic("ev").read(after=0, limit=1000)
    assert own[0] == Tombstone(1, 5) and own[1].seq == 14  # 6..13 deleted: silent
    records = [r for r in own if isinstance(r, Record)]
    rows = spark_read(spark, root, cold, partitionRecords=7)  # tasks across cold and hot
    assert [(r.seq, r.tag, bytes(r.payload)) for r in rows] == [
        (r.seq, r.tag, r.payload) for r in records
    ]
    gaps = spark_read(spark, root, cold, fromSeq=1, tombstones="rows", partitionRecords=7)
    assert [(g.seq, g.gap_to) for g in gaps if g.gap_to is not None] == [(1, 5)]
    assert [g.seq for g in gaps if g.gap_to is None] == [r.seq for r in records]
    with pytest.raises(Exception, match=r"seqs 1\.\.5 were lost"):
        spark_read(spark, root, cold, fromSeq=1)


def test_SPK_30_reads_through_a_local_cold_tier(spark: Any, tmp_path: Path) -> None:
    """SPK-30, TIER-8: with option cold, batch reads over cold and hot segments return every
    live record exactly once, the eviction tombstone as SPK-4 says, deleted seqs silent; a
    streaming query reads the cold history too. Without the option the read fails naming
    cold= (TIER-6), never fewer rows."""
    root, cold = tmp_path / "s", str(tmp_path / "cold")
    with cold_store(root, cold) as store:
        check_reads(spark, root, store, cold)
        with pytest.raises(Exception, match="cold="):
            spark.read.format("tidelog").option("topic", "ev").load(str(root)).collect()
        live = [r.seq for r in store.topic("ev").read(after=0, limit=1000) if isinstance(r, Record)]
        out = tmp_path / "out"
        stream_to_parquet(spark, root, out, cold=cold, startingOffsets="earliest")
        seqs = sorted(r.seq for r in spark.read.parquet(str(out / "data")).collect())
        assert seqs == live  # (the query's commits trimmed the store meanwhile, SPK-10)


def test_SPK_30_reads_through_a_cold_tier_on_an_s3_endpoint(
    spark: Any, tmp_path: Path, s3_url: str
) -> None:
    """SPK-30, TIER-2, TIER-8: the same reads with the cold tier in a bucket of moto's S3
    server on 127.0.0.1; the executors (started before this test) get the credentials in
    the URL."""
    url = s3_url.replace("s3://", "s3://testing:testing@", 1)
    root = tmp_path / "s"
    with cold_store(root, url) as store:
        check_reads(spark, root, store, url)


def test_SPK_30_options_and_a_request_to_a_store_nobody_owns(tmp_path: Path) -> None:
    """SPK-30: option cold (a relative path made absolute on the driver) and coldCacheSegments
    go to the read-only views; cold and the retention bounds to the brief owner open of a
    request while no process owns the store (XPR-3), which opens only with the cold tier."""
    from tidelog.adapters.spark import staging
    from tidelog.adapters.spark.options import parse_options
    from tidelog.errors import BadOption

    root, cold = tmp_path / "s", str(tmp_path / "cold")
    cold_store(root, cold).close()
    base = {"path": str(root), "topic": "ev"}
    opts = parse_options(
        {**base, "cold": cold, "coldCacheSegments": "2", "hotRetainSegments": "1",
         "hotRetainBytes": "1MiB"}
    )  # fmt: skip
    assert opts.view_options() == {"cold": cold, "cold_cache_segments": 2}
    assert opts.owner_options() == {
        "cold": cold, "hot_retain_segments": 1, "hot_retain_bytes": 1 << 20,
    }  # fmt: skip
    monkey = pytest.MonkeyPatch()
    with monkey.context() as m:
        m.chdir(tmp_path)
        assert parse_options({**base, "cold": "cold"}).cold == cold
    with pytest.raises(BadOption, match="hotRetainBytes"):
        parse_options({**base, "hotRetainBytes": "lots"})
    body = {"op": "subscribe", "topic": "ev", "subscriber": "s", "start": "earliest"}
    with pytest.raises(Exception, match="cold="):
        staging.request(parse_options({**base, "requestTimeout": "5"}), dict(body))
    assert staging.request(opts, dict(body))["ok"]
    with tidelog.open(f"file://{root}", cold=cold) as store:
        assert store.topic("ev").subscriber("s").hwm == 13  # earliest: before seq 14
