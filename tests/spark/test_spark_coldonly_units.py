"""The Spark source's pieces for a cold tier alone (spec/BUNDLES.md SPK-31..SPK-33), without a
SparkSession: the options, the driver's pinned plan and an executor's read of one partition,
a version collected or an object gone between the two."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from test_spark_cold import SMALL, cold_store

import tidelog
from tidelog.adapters.spark import coldsource
from tidelog.adapters.spark.columns import TombstoneFound
from tidelog.adapters.spark.options import parse_options
from tidelog.backends.file import coldread
from tidelog.errors import BadOption, NotFound, StorageError
from tidelog.hooks import Checkpoint, hooks
from tidelog.records import Record

pytest.importorskip("numpy")


def opts(cold: str, **extra: str) -> Any:
    return parse_options({"path": f"cold+{cold}", "topic": "ev", **extra})


def rows(o: Any, parts: list[tuple[int, int, coldsource.ColdPlan]]) -> list[tuple[Any, ...]]:
    out: list[tuple[Any, ...]] = []
    for lo, hi, plan in parts:
        table = pa.Table.from_batches(list(coldsource.read_cold(o, lo, hi, plan)))
        out += zip(*(table.column(n).to_pylist() for n in ("seq", "tag", "payload")), strict=True)
    return out


def test_SPK_31_options_of_a_cold_tier_alone(tmp_path: Path, monkeypatch: Any) -> None:
    """SPK-31: cold+URL keeps its URL (a relative path made absolute on the driver); storeId
    and manifest are parsed; slot reads, option cold, and storeId/manifest with another
    location are bad_option; a write or a streaming read is refused naming SPK-31."""
    monkeypatch.chdir(tmp_path)
    o = parse_options({"path": "cold+c", "topic": "ev", "storeId": "AB" * 16, "manifest": "3"})
    assert o.root == f"cold+{tmp_path}/c"
    assert (o.store_id, o.manifest) == ("ab" * 16, 3)
    assert parse_options({"path": "cold+s3://b/p", "topic": "ev"}).root == "cold+s3://b/p"
    for bad in ({"slot": "0"}, {"cold": "/x"}):
        with pytest.raises(BadOption, match="SPK-3"):
            coldsource.check_cold(parse_options({"path": "cold+/c", "topic": "ev", **bad}))
    with pytest.raises(BadOption, match="SPK-31"):
        coldsource.check_cold(parse_options({"path": "/s", "topic": "ev", "manifest": "1"}))
    for what in ("a write", "a streaming read"):
        with pytest.raises(BadOption, match=f"{what} is not supported"):
            coldsource.refuse(o, what)
    coldsource.refuse(parse_options({"path": "/s", "topic": "ev"}), "a write")  # not cold
    with pytest.raises(BadOption, match="manifest"):
        parse_options({"path": "cold+/c", "topic": "ev", "manifest": "0"})


def test_SPK_32_SPK_33_plan_and_read_without_a_hot_store(tmp_path: Path) -> None:
    """SPK-32: the range cut evenly by volume as SPK-3 says (or per partitionRecords seqs),
    each partition naming the pinned version and the segments over its range; SPK-33: the
    partitions, read with the hot store deleted, give exactly the cold records of open_cold's
    read, tombstones as SPK-4."""
    root, cold = tmp_path / "s", str(tmp_path / "cold")
    cold_store(root, cold).close()
    shutil.rmtree(root)  # nothing but the cold tier from here on
    with coldread.open_cold(cold) as view:
        version = view.version
        want = [(r.seq, r.tag, r.payload) for r in view.read("ev", 0, 1000)
                if isinstance(r, Record)]  # fmt: skip
    assert [w[0] for w in want] == list(range(14, 41))
    o = opts(cold)
    parts = coldsource.plan_partitions(o)  # a few KiB: one task (SPK-3's 4 MiB floor)
    assert [(lo, hi, p.segments) for lo, hi, p in parts] == [(6, 40, (11, 21, 31))]
    assert rows(o, parts) == want
    # by volume: the first segment's .data bytes per seq (segment 11 holds seqs 11..20)
    per_seq = next(Path(cold).rglob("seg-00000000000000000011.data")).stat().st_size / 10
    o = opts(cold, partitionBytes=str(int(per_seq * 35 / 3) + 1))  # 35 seqs: 3 tasks
    parts = coldsource.plan_partitions(o)
    assert [(lo, hi, p.segments) for lo, hi, p in parts] == [
        (6, 17, (11,)), (18, 29, (11, 21)), (30, 40, (21, 31)),
    ]  # fmt: skip
    assert {(p.version, len(p.store_id)) for _, _, p in parts} == {(version, 32)}
    assert rows(o, parts) == want
    by7 = opts(cold, partitionRecords="7", fromSeq="1", tombstones="rows")
    parts7 = coldsource.plan_partitions(by7)
    assert [(lo, hi, p.segments) for lo, hi, p in parts7][:3] == [
        (1, 7, ()), (8, 14, (11,)), (15, 21, (11, 21)),
    ]  # fmt: skip
    got = rows(by7, parts7)
    assert got[0] == (1, None, None) and got[1:] == want  # the tombstone 1..5, then the rows
    with pytest.raises(TombstoneFound, match=r"seqs 1\.\.5 were lost"):
        rows(opts(cold, fromSeq="1"), coldsource.plan_partitions(opts(cold, fromSeq="1")))
    assert (
        rows(opts(cold, toSeq="15"), coldsource.plan_partitions(opts(cold, toSeq="15")))
        == (want[:2])
    )


def test_SPK_33_a_collected_version_or_a_vanished_object_fails_the_task(tmp_path: Path) -> None:
    """SPK-33, TIER-10: a partition whose pinned version was collected after planning fails
    with not_found naming the version; one whose object vanished with io_error naming the
    key: never fewer rows."""
    root, cold = tmp_path / "s", str(tmp_path / "cold")
    cold_store(root, cold).close()
    o = opts(cold, partitionRecords="15")
    parts = coldsource.plan_partitions(o)
    pinned = parts[0][2].version
    assert rows(o, parts[:1])  # this process now holds a view of the version
    with tidelog.open(f"file://{root}?{SMALL}", cold=cold, cold_grace_ms=0) as store:
        store.topic("ev").delete(before_seq=31)  # segments 11 and 21 leave the manifest
        hooks(store, Checkpoint).checkpoint()
    with pytest.raises(NotFound, match=f"manifest version {pinned} .* is gone"):
        rows(o, parts[1:2])
    with coldread.open_cold(cold) as view:
        assert [s["first_seq"] for s in view.segments("ev")] == [31]
    o = opts(cold)
    fresh = coldsource.plan_partitions(o)
    assert [(lo, hi, p.segments) for lo, hi, p in fresh] == [(6, 40, (31,))]  # deletes: silent
    data = next(Path(cold).rglob("seg-00000000000000000031.data"))
    data.unlink()
    with pytest.raises(StorageError, match=r"seg-00000000000000000031\.data"):
        rows(o, fresh)


def test_SPK_32_a_pinned_version_reads_whole_within_the_grace_period(tmp_path: Path) -> None:
    """SPK-32, SPK-33, TIER-10: option manifest pins a version; after a newer version dropped
    segments, the pinned one still reads every row it names (within cold_grace_ms), the newest
    only what it names."""
    root, cold = tmp_path / "s", str(tmp_path / "cold")
    cold_store(root, cold).close()
    with coldread.open_cold(cold) as view:
        pinned = view.version
    with tidelog.open(f"file://{root}?{SMALL}", cold=cold) as store:  # default grace: 10 min
        store.topic("ev").delete(before_seq=31)
        hooks(store, Checkpoint).checkpoint()
    old = opts(cold, manifest=str(pinned))
    assert [r[0] for r in rows(old, coldsource.plan_partitions(old))] == list(range(14, 41))
    new = opts(cold)
    assert [r[0] for r in rows(new, coldsource.plan_partitions(new))] == list(range(31, 41))
