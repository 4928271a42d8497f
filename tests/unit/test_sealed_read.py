"""The sequential read of sealed segments (SegChunk.records_into, the bulk path behind
``read()``) returns exactly what the per-record path returns, and verifies every record it
returns on every read (spec/FORMATS-seg2.md SEG-12: by block or by frame), raising ``Corrupt``;
segments sealed with a version-1 index still read; opening rebuilds the tag index from the label
runs (SEG-11)."""

from __future__ import annotations

import bisect
import os
import shutil
from pathlib import Path

import pytest

import tidelog
from tidelog.backends.file.format import segment as seg
from tidelog.backends.file.verify import verify_store
from tidelog.errors import Corrupt
from tidelog.fsio import OsFS
from tidelog.hooks import EngineTopics, hooks
from tidelog.records import Record


def _fill(root: Path) -> None:
    with tidelog.open(f"file://{root}") as store:
        t = store.topic("t", durability="disk")
        t.append_many([b"plain-%d" % i for i in range(300)])
        t.append_many([b"tagged-%d" % i for i in range(50)], tag="a", node="n1")
        t.append_records([(b"mixed-%d" % i, None if i % 2 else "b", "n2") for i in range(50)])
        t.delete(tag="a")  # dead slots inside a sealed segment
        t.append_many([b"late-%d" % i for i in range(100)])


def test_SEG_2_bulk_sealed_read_matches_per_record_reads(tmp_path: Path) -> None:
    root = tmp_path / "s"
    _fill(root)
    with tidelog.open(f"file://{root}") as store:  # closed and reopened: all sealed
        t = store.topic("t")
        log = hooks(store, EngineTopics).topics["t"].log  # the file backend's TopicLog
        assert log.chunks, "expected sealed segments"
        expected = [log.record(q) for q in log.live_between(1, t.state().head_seq)]
        for limit in (1, 7, 100, 10_000):
            got: list[object] = []
            cursor = 0
            while items := t.read(cursor, limit):
                got += items
                cursor = items[-1].seq  # type: ignore[union-attr]
            assert got == expected
        assert all(type(r) is Record for r in got)
        assert [r.seq for r in t.read(0, 1000, exclude_node="n2")] == [
            r.seq for r in expected if r.node != "n2"
        ]


def test_SEG_19_a_flipped_payload_byte_in_a_sealed_segment_raises_corrupt(tmp_path: Path) -> None:
    """SEG-15, SEG-19: a damaged payload byte makes its whole run frame unreadable (Corrupt
    naming the file and the frame's offset); records of other frames still read."""
    root = tmp_path / "s"
    _fill(root)
    (topic_dir,) = [d for d in (root / "topics").iterdir() if d.is_dir()]
    (data,) = sorted(topic_dir.glob("seg-*.data"))[:1]
    raw = bytearray(data.read_bytes())
    at = raw.find(b"plain-150")
    assert at > 0
    raw[at] ^= 0xFF
    data.write_bytes(bytes(raw))
    os.sync()
    index = seg.read_index(data.with_suffix(".idx").read_bytes())
    k = bisect.bisect_right(index.block_offsets, at) - 1  # the run frame holding the byte
    frame_at, (frame_end_slot, _) = index.block_offsets[k], index.block_end(k)
    with tidelog.open(f"file://{root}") as store:
        t = store.topic("t")
        first = hooks(store, EngineTopics).topics["t"].log.chunks[0].first_seq
        damaged = rf"seg-.*\.data: run frame at offset {frame_at}: XXH3-64 mismatch \(SEG-15\)"
        with pytest.raises(Corrupt, match=damaged):
            t.read(0, 1000)
        with pytest.raises(Corrupt, match=damaged):
            t.read(first + index.block_slots[k] - 1, 1)  # a point read of the frame's first
        after = t.read(first + frame_end_slot - 1, 3)  # the next frames read
        assert [r.payload for r in after] == [b"mixed-0", b"mixed-1", b"mixed-2"]


# --- index version 2: blocks and label runs (spec/FORMATS-seg2.md) ------------------------------


def _one_segment_store(root: Path) -> tuple[Path, Path]:
    """A closed store whose one topic is one sealed segment of plain, tagged, node-labelled
    and mixed records; its WAL directory is emptied (a clean close leaves nothing to
    replay), so each open and each verify below reads little more than the segment."""
    with tidelog.open(f"file://{root}") as store:
        t = store.topic("t", durability="disk")
        t.append_many([b"plain-%d" % i for i in range(5)])
        t.append_many([b"tag-%d" % i for i in range(4)], tag="a", node="n")
        t.append_records([(b"mix-%d" % i, None if i % 2 else "c", "m") for i in range(4)])
        t.append(b"")
    shutil.rmtree(root / "wal")
    (root / "wal").mkdir()
    (topic_dir,) = [d for d in (root / "topics").iterdir() if d.is_dir()]
    (data,) = topic_dir.glob("seg-*.data")
    return data, data.with_suffix(".idx")


def _read_all(root: Path, limit: int) -> list[object]:
    with tidelog.open(f"file://{root}", readonly=True) as store:
        t = store.topic("t")
        got: list[object] = []
        while items := t.read(got[-1].seq if got else 0, limit):  # type: ignore[attr-defined]
            got += items
        return got


def test_SEG_12_a_damaged_byte_anywhere_in_a_sealed_segment_is_corrupt(tmp_path: Path) -> None:
    """SEG-12, SEG-13: flip any byte of a sealed segment's .data or .idx: opening the store
    or reading raises Corrupt (both a whole-range read, verified by block, and reads of one
    record at a time, verified by frame), and ``verify`` reports an error on the pair."""
    root = tmp_path / "s"
    data, idx = _one_segment_store(root)
    expected = _read_all(root, 1000)
    assert len(expected) == 14 and _read_all(root, 1) == expected
    for path in (data, idx):
        original = path.read_bytes()
        for at in range(len(original)):
            damaged = bytearray(original)
            damaged[at] ^= 0xFF
            path.write_bytes(damaged)
            for limit in (1000, 1):
                with pytest.raises(Corrupt):
                    _read_all(root, limit)
            findings = verify_store(OsFS(), str(root)).problems
            assert any(
                p.severity == "error" and p.path in (str(data), str(idx)) for p in findings
            ), (path.name, at, [str(p) for p in findings])
        path.write_bytes(original)
    assert _read_all(root, 1000) == expected


def _as_record_frames(data: bytes) -> tuple[bytes, bytes]:
    """A .data version 2 (run frames) rewritten as version 1 (one frame per record), what an
    earlier tidelog wrote, with its version-2 index."""
    scan = seg.scan_data(data)
    assert scan.problem is None
    return seg.build_segment(scan.header.topic_id, scan.header.first_seq, [
        (f.seq, f.ts, f.tag, f.node, data[f.offset : f.offset + f.length]) for f in scan.frames
    ])  # fmt: skip


def test_SEG_12_a_version_1_segment_still_opens_reads_and_verifies(tmp_path: Path) -> None:
    """SEG-9, SEG-12: a store sealed with version-1 indexes reads exactly as with version 2
    (verified by frame: it has no blocks), keeps its tag index, and verifies clean."""
    root = tmp_path / "s"
    _fill(root)
    with tidelog.open(f"file://{root}") as store:
        expected = store.topic("t").read(0, 10_000)
    for idx in (root / "topics").glob("*/seg-*.idx"):
        data = idx.with_suffix(".data")
        v1_data, v2_idx = _as_record_frames(data.read_bytes())
        data.write_bytes(v1_data)
        idx.write_bytes(seg.index_as_version_1(v2_idx))
    assert verify_store(OsFS(), str(root)).problems == []
    with tidelog.open(f"file://{root}") as store:
        t = store.topic("t")
        log = hooks(store, EngineTopics).topics["t"].log
        assert {c.index.version for c in log.chunks} == {1}
        for limit in (1, 7, 10_000):
            got: list[object] = []
            while items := t.read(got[-1].seq if got else 0, limit):  # type: ignore[attr-defined]
                got += items
            assert got == expected
        assert [r.seq for r in t.read(0, 1000, exclude_node="n2")] == [
            r.seq
            for r in expected
            if r.node != "n2"  # type: ignore[union-attr]
        ]
        assert t.delete(tag="b") == 25  # the tag index was rebuilt from the frames


def test_SEG_11_opening_rebuilds_the_tag_index_from_label_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """SEG-11: with version-2 indexes, opening a store decodes no record frame to rebuild the
    tag index (it reads the label runs), and the index is right: deletes by tag and glob find
    exactly the live tagged records, dead slots excluded."""
    root = tmp_path / "s"
    _fill(root)

    def no_frame_decoding(*args: object) -> None:
        raise AssertionError("a frame was decoded while opening the store")

    monkeypatch.setattr(seg, "read_record", no_frame_decoding)
    store = tidelog.open(f"file://{root}")
    monkeypatch.undo()
    with store:
        t = store.topic("t")
        log = hooks(store, EngineTopics).topics["t"].log
        assert {c.index.version for c in log.chunks} == {seg.IDX_VERSION_RUNS}
        tagged_b = [r.seq for r in t.read(0, 10_000) if r.tag == "b"]  # type: ignore[union-attr]
        assert len(tagged_b) == 25
        assert t.delete(tag_glob="b*") == 25
        assert t.delete(tag="a") == 0  # deleted before the close: dead, not indexed again
        assert not [r for r in t.read(0, 10_000) if r.tag is not None]  # type: ignore[union-attr]


def test_DEL_5_the_tag_index_holds_ranges_rebuilt_from_runs_at_open(tmp_path: Path) -> None:
    """DEL-5, SEG-11: the tag index keeps a range per run of equally tagged appends (not a seq
    per record); a delete below a range's end keeps the rest of it; reopening rebuilds the
    same ranges from the label runs, leaving out the dead slots."""
    root = tmp_path / "s"
    with tidelog.open(f"file://{root}") as store:
        t = store.topic("t", durability="disk")
        t.append_many([b"x"] * 10_000, tag="a")  # seqs 1..10000
        for i in range(4):  # 10001 b, 10002 a, 10003 b, 10004 a
            t.append(b"y", tag="ba"[i % 2])
        log = hooks(store, EngineTopics).topics["t"].log
        assert list(log.tag_ranges["a"]) == [1, 10_000, 10_002, 10_002, 10_004, 10_004]
        assert t.delete(before_seq=5_001, tag="a") == 5_000
        assert list(log.tag_ranges["a"]) == [5_001, 10_000, 10_002, 10_002, 10_004, 10_004]
        t.append_many([b"z"] * 3, tag="a")  # 10005..10007 joins the last range
        assert list(log.tag_ranges["a"])[-2:] == [10_004, 10_007]
        before = log.examined
        assert t.delete(before_seq=10_003, tag="b") == 1
        assert log.examined - before <= 2  # the key and one seq: nothing per untagged record
    with tidelog.open(f"file://{root}") as store:
        log = hooks(store, EngineTopics).topics["t"].log
        assert list(log.tag_ranges["a"]) == [5_001, 10_000, 10_002, 10_002, 10_004, 10_007]
        assert list(log.tag_ranges["b"]) == [10_003, 10_003]
        assert store.topic("t").delete(tag_glob="*") == 5_000 + 1 + 4 + 1


def _fill_equal_sizes(root: Path) -> None:
    """Several run frames of equal-size payloads (read by one struct call per frame, whole or
    in part), a run of empty payloads, and a frame mixing sizes."""
    with tidelog.open(f"file://{root}") as store:
        t = store.topic("t", durability="disk")
        t.append_many([b"%015d" % i for i in range(12_000)])  # ~190 KB: several run frames
        t.append_many([b""] * 40)
        t.append_many([b"%d" % i for i in range(500)])  # sizes 1..3
        t.append_many([b"%031d" % i for i in range(3_000)], tag="x")


@pytest.mark.parametrize("version", [2, 1])
def test_SEG_15_SEG_3_equal_size_payloads_read_as_strides(tmp_path: Path, version: int) -> None:
    """SEG-15 (run frames: payloads back to back) and SEG-3 (version-1 frames back to back):
    equal-size payloads are cut by stride, a whole frame or part of one at a time; every read
    window returns exactly the per-record path's records, and a read still verifies."""
    root = tmp_path / "s"
    _fill_equal_sizes(root)
    if version == 1:
        for idx in (root / "topics").glob("*/seg-*.idx"):
            data = idx.with_suffix(".data")
            v1_data, v2_idx = _as_record_frames(data.read_bytes())
            data.write_bytes(v1_data)
            idx.write_bytes(seg.index_as_version_1(v2_idx))
    with tidelog.open(f"file://{root}") as store:
        t = store.topic("t")
        log = hooks(store, EngineTopics).topics["t"].log
        assert {c.index.version for c in log.chunks} == {1 if version == 1 else 3}
        if version == 2:
            assert max(len(c.index.block_slots) for c in log.chunks) > 2  # several frames
        head = t.state().head_seq
        expected = [log.record(q) for q in range(1, head + 1)]
        for after, limit in [(0, 100_000), (0, 1), (5, 3), (700, 5_000), (11_990, 60),
                             (12_030, 20), (11_000, 4_000), (head - 7, 100)]:
            got = t.read(after, limit)
            assert got == expected[after : after + limit], (after, limit)
            assert all(type(r) is Record and type(r.payload) is bytes for r in got)
