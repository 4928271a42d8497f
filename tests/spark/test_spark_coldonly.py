"""Spark reads of a cold tier alone, ``cold+URL`` (spec/BUNDLES.md SPK-31..SPK-33): a local
directory and moto's S3 server on 127.0.0.1, with the hot store deleted before Spark reads,
a pinned manifest version, a collected one."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest
from test_spark_cold import SMALL, cold_store

import tidelog
from tidelog.backends.file import coldread
from tidelog.hooks import Checkpoint, hooks
from tidelog.records import Record

pytestmark = pytest.mark.spark


def load(spark: Any, cold: str, **options: object) -> Any:
    reader = spark.read.format("tidelog").option("topic", "ev")
    for key, value in options.items():
        reader = reader.option(key, value)
    return reader.load(f"cold+{cold}")


def seqs(spark: Any, cold: str, **options: object) -> list[int]:
    return [r.seq for r in load(spark, cold, **options).orderBy("seq").collect()]


def check_cold_only(spark: Any, tmp_path: Path, cold: str) -> None:
    """The store's cold history read by Spark from the cold tier alone (the hot directory is
    deleted first) equals open_cold's read: rows, the eviction tombstone, deleted seqs."""
    root = tmp_path / "s"
    cold_store(root, cold).close()
    shutil.rmtree(root)
    with coldread.open_cold(cold) as view:
        want = [(r.seq, r.tag, r.payload) for r in view.read("ev", 0, 1000)
                if isinstance(r, Record)]  # fmt: skip
    assert [w[0] for w in want] == list(range(14, 41))
    rows = load(spark, cold).orderBy("seq").collect()
    assert [(r.seq, r.tag, bytes(r.payload)) for r in rows] == want
    assert {r.topic for r in rows} == {"ev"}
    gaps = load(spark, cold, fromSeq=1, tombstones="rows", partitionRecords=7).orderBy("seq")
    got = gaps.collect()
    assert [(g.seq, g.gap_to) for g in got if g.gap_to is not None] == [(1, 5)]
    assert [g.seq for g in got if g.gap_to is None] == [w[0] for w in want]
    with pytest.raises(Exception, match=r"seqs 1\.\.5 were lost"):
        load(spark, cold, fromSeq=1).collect()


def test_SPK_31_to_33_reads_a_local_cold_tier_alone(spark: Any, tmp_path: Path) -> None:
    """SPK-31..SPK-33: cold+<dir> reads every cold record once with no hot store anywhere,
    tombstones as SPK-4; a streaming read and a write are bad_option naming SPK-31."""
    cold = str(tmp_path / "cold")
    check_cold_only(spark, tmp_path, cold)
    assert seqs(spark, f"file://{cold}", toSeq=20) == list(range(14, 21))
    stream = spark.readStream.format("tidelog").option("topic", "ev").load(f"cold+{cold}")
    with pytest.raises(Exception, match="SPK-31"):
        query = stream.writeStream.format("noop").start()
        try:
            query.awaitTermination(60)
        finally:
            query.stop()
    df = spark.createDataFrame([(b"x",)], "payload binary")
    with pytest.raises(Exception, match="SPK-31"):
        df.write.format("tidelog").option("topic", "ev").mode("append").save(f"cold+{cold}")


def test_SPK_33_reads_a_cold_tier_alone_on_an_s3_endpoint(
    spark: Any, tmp_path: Path, s3_url: str
) -> None:
    """SPK-31..SPK-33, TIER-2: the same reads from a bucket of moto's S3 server, executors
    reading the segments by ranged reads through pyarrow.fs (credentials in the URL: the
    executors started before this test)."""
    check_cold_only(spark, tmp_path, s3_url.replace("s3://", "s3://testing:testing@", 1))


def test_SPK_32_a_pinned_version_within_the_grace_and_a_collected_one(
    spark: Any, tmp_path: Path
) -> None:
    """SPK-32, SPK-33, TIER-10: option manifest pins a version: after a newer version dropped
    two segments, the pinned one still reads whole within cold_grace_ms, the newest reads only
    what it names; once the grace is over and the version collected, reading it fails with
    not_found naming the version, never fewer rows."""
    root, cold = tmp_path / "s", str(tmp_path / "cold")
    cold_store(root, cold).close()
    with coldread.open_cold(cold) as view:
        pinned = view.version
    with tidelog.open(f"file://{root}?{SMALL}", cold=cold) as store:  # grace: 10 minutes
        store.topic("ev").delete(before_seq=31)
        hooks(store, Checkpoint).checkpoint()
    assert seqs(spark, cold, manifest=pinned) == list(range(14, 41))
    assert seqs(spark, cold) == list(range(31, 41))
    with tidelog.open(f"file://{root}?{SMALL}", cold=cold, cold_grace_ms=0) as store:
        store.topic("ev").delete(before_seq=33)  # a new version: the collection runs
        hooks(store, Checkpoint).checkpoint()
    assert seqs(spark, cold) == list(range(33, 41))
    assert not (Path(cold) / next(Path(cold).iterdir()).name / "manifest"
                / f"manifest-{pinned:016x}.json").exists()  # fmt: skip
    with pytest.raises(Exception, match=f"manifest version {pinned} .* is gone"):
        seqs(spark, cold, manifest=pinned)
