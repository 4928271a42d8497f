"""``verify_store``: a hand-built store directory is clean; each kind of damage is reported with
the right path, byte offset, rule id and severity (spec/FORMATS.md)."""

from __future__ import annotations

import os
import shutil
import struct
import tempfile
from dataclasses import dataclass
from pathlib import Path

import crc32c
import pytest
import xxhash
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tidelog.backends.file.format import progress as prg
from tidelog.backends.file.format import segment as seg
from tidelog.backends.file.format import shard_dir_name, topic_dir_name, wal
from tidelog.backends.file.format import snapshot as snap
from tidelog.backends.file.verify import verify_store
from tidelog.errors import Locked
from tidelog.fsio import OsFS
from tidelog.report import Problem, Report

STORE_ID = bytes.fromhex("00112233445566778899aabbccddeeff")
TID = 0x2A
TS = 1_700_000_000_000


@dataclass
class Store:
    root: Path
    snapshot: Path
    wal_file: Path
    wal_frames: list[bytes]
    data: Path
    idx: Path
    progress: Path

    @property
    def topic(self) -> Path:
        return self.data.parent

    def frame_offset(self, i: int) -> int:
        return wal.HEADER_SIZE + sum(map(len, self.wal_frames[:i]))


def snapshot_body(**extra: object) -> dict[str, object]:
    return {"version": 1, "store_id": STORE_ID.hex(), "next_topic_id": TID + 1, **extra}


def wal_bytes(frames: list[bytes], *, gen: int = 1, shard: int = 0, count: int = 1) -> bytes:
    """A preallocated WAL file: header, frames, zeros (version 2: unseeded frames, zero tail)."""
    head = wal.encode_header(gen, shard, count, TS, STORE_ID, version=2)
    return head + b"".join(frames) + bytes(4096)


def default_frames() -> list[bytes]:
    create = {"name": "events", "incarnation": 1, "config": {"durability": "fsync"}}
    return [
        wal.encode_control(wal.FrameType.TOPIC_CREATE, TID, create, durable=True),
        wal.encode_append(TID, 3, TS, "sensor-7", None, b"three", batch_end=False, durable=True),
        wal.encode_append(TID, 4, TS, None, "node-ü", b"", batch_end=True, durable=True),
        wal.encode_control(wal.FrameType.SUB_REGISTER, TID, {"name": "exporter", "base": 0}),
        wal.encode_control(wal.FrameType.EVICT, TID, {"reason": "cap"}, seq=1),
    ]


def write(path: Path, data: bytes) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return path


def build_store(tmp_path: Path) -> Store:
    """One snapshot, one WAL file with a few frames, one segment pair, one progress file, and
    the lock files: everything through the codecs, nothing through the backend."""
    root = tmp_path / "store"
    snapshot = write(root / "meta" / snap.file_name(1), snap.encode_snapshot(1, snapshot_body()))
    frames = default_frames()
    wal_file = write(root / "wal" / wal.file_name(1), wal_bytes(frames))
    topic = root / "topics" / topic_dir_name(TID)
    data, idx = seg.build_segment(
        TID, 1, [(1, TS, "a", None, b"first"), (2, TS + 1, None, None, b"second")]
    )
    data_path = write(topic / seg.data_name(1), data)
    idx_path = write(topic / seg.idx_name(1), idx)
    progress = write(topic / prg.file_name("exporter"), prg.encode_progress(1, [3], 0, [(2, 2)]))
    write(root / ".lock", b"")
    write(root / ".lock.pid", b"4242\n")
    return Store(root, snapshot, wal_file, frames, data_path, idx_path, progress)


@pytest.fixture
def store(tmp_path: Path) -> Store:
    return build_store(tmp_path)


def check(root: Path) -> Report:
    return verify_store(OsFS(), str(root))


def only(report: Report) -> Problem:
    assert len(report.problems) == 1, [str(p) for p in report.problems]
    return report.problems[0]


def find(report: Report, rule: str) -> Problem:
    hits = [p for p in report.problems if p.rule == rule]
    assert hits, [str(p) for p in report.problems]
    return hits[0]


# --- a clean store --------------------------------------------------------------------------------


def test_clean_store_is_ok(store: Store) -> None:
    """LAY-1, LAY-2, WAL-1, SEG-7, PRG-1, SNAP-4: a well-formed store has no problems at all."""
    report = check(store.root)
    assert report.problems == []
    assert report.ok
    assert report.files_checked == 6  # snapshot, WAL, .data, .idx, progress, .lock.pid


def test_verify_neither_takes_nor_removes_the_lock(store: Store) -> None:
    """LOCK-1, LOCK-3: verify is read-only: it works while a writer holds .lock, and leaves both
    lock files in place; the lock stays exclusive."""
    fs = OsFS()
    holder = fs.open(str(store.root / ".lock"))
    holder.lock()
    try:
        assert verify_store(fs, str(store.root)).ok
        second = fs.open(str(store.root / ".lock"))
        with pytest.raises(Locked):
            second.lock()
        second.close()
    finally:
        holder.close()
    assert (store.root / ".lock").exists() and (store.root / ".lock.pid").exists()


def test_sharded_wal_layout_is_ok(store: Store) -> None:
    """WAL-2, WAL-10: shard-NN/ directories hold files whose header names that shard; several
    generations per shard are replayed in order."""
    store.wal_file.unlink()
    for shard in (0, 1):
        for gen in (1, 2):
            write(
                store.root / "wal" / shard_dir_name(shard) / wal.file_name(gen),
                wal_bytes(default_frames(), gen=gen, shard=shard, count=2),
            )
    assert check(store.root).problems == []


# --- not a store (LAY-1) --------------------------------------------------------------------------


def test_missing_root_is_one_error(tmp_path: Path) -> None:
    """LAY-1: a missing path, a plain file, a directory without meta/ or without a snapshot:
    exactly one clear error each."""
    cases = {
        tmp_path / "nope": "no such",
        write(tmp_path / "file", b"x"): "not a directory",
        tmp_path: "no meta/",
    }
    for path, words in cases.items():
        problem = only(check(path))
        assert (problem.rule, problem.severity, problem.path) == ("LAY-1", "error", str(path))
        assert words in problem.message
    (tmp_path / "empty" / "meta").mkdir(parents=True)
    write(tmp_path / "empty" / "wal" / "garbage", b"x")
    problem = only(check(tmp_path / "empty"))
    assert problem.rule == "LAY-1" and "no snapshot" in problem.message


# --- segments (SEG) -------------------------------------------------------------------------------


def test_flipped_byte_in_sealed_segment_frame(store: Store) -> None:
    """SEG-2: a flipped payload byte in a sealed record is an error at that frame's offset."""
    index = seg.read_index(store.idx.read_bytes())
    data = bytearray(store.data.read_bytes())
    data[index.offsets[1] + seg.RECORD_HEADER_SIZE + 2] ^= 0x20
    store.data.write_bytes(data)
    problem = only(check(store.root))
    assert (problem.path, problem.offset, problem.rule) == (
        str(store.data),
        index.offsets[1],
        "SEG-2",
    )
    assert problem.severity == "error"


def test_truncated_idx(store: Store) -> None:
    """SEG-9 (SEG-6 for version 1): a truncated .idx is an error on the .idx."""
    store.idx.write_bytes(store.idx.read_bytes()[:-5])
    problem = only(check(store.root))
    assert (problem.path, problem.rule, problem.severity) == (str(store.idx), "SEG-9", "error")


def test_missing_idx_and_missing_data(store: Store) -> None:
    """SEG-7: a .data without its .idx, or an .idx without its .data, is an error."""
    store.idx.unlink()
    problem = only(check(store.root))
    assert (problem.path, problem.rule, problem.severity) == (str(store.data), "SEG-7", "error")
    assert seg.idx_name(1) in problem.message
    _, other_idx = seg.build_segment(TID, 10, [(10, 0, None, None, b"x")])
    write(store.topic / seg.idx_name(10), other_idx)
    report = check(store.root)
    paths = {(p.path, p.rule) for p in report.problems}
    assert (str(store.topic / seg.idx_name(10)), "SEG-7") in paths


def test_segment_header_mismatches(store: Store) -> None:
    """SEG-1: the .data header names the topic of its directory and the first seq of its name."""
    moved = store.root / "topics" / topic_dir_name(7)
    shutil.copytree(store.topic, moved)
    problem = find(check(store.root), "SEG-1")
    assert (problem.path, problem.offset) == (str(moved / seg.data_name(1)), 16)
    shutil.rmtree(moved)
    store.data.rename(store.topic / seg.data_name(5))
    store.idx.rename(store.topic / seg.idx_name(5))
    report = check(store.root)
    assert find(report, "SEG-1").offset == 24
    assert not report.ok


def test_idx_of_another_segment(store: Store) -> None:
    """SEG-4: an .idx whose header names another first seq than its .data."""
    _, idx = seg.build_segment(TID, 2, [(2, 0, None, None, b"x")])
    store.idx.write_bytes(idx)
    problem = find(check(store.root), "SEG-4")
    assert problem.path == str(store.idx)


def test_idx_entry_disagrees_with_data(store: Store) -> None:
    """SEG-5: entry i must describe frame i exactly; the problem points at the entry."""
    raw = bytearray(store.idx.read_bytes())
    entry = seg.IDX_HEADER_SIZE + 1 * seg.ENTRY_SIZE
    struct.pack_into("<Q", raw, entry + 8, 12345)  # entry 1's ts
    body = bytes(raw[:-8])
    store.idx.write_bytes(body + struct.pack("<Q", xxhash.xxh3_64_intdigest(body)))
    problem = only(check(store.root))
    assert (problem.path, problem.offset, problem.rule) == (str(store.idx), entry, "SEG-5")
    assert "ts 12345" in problem.message


def test_idx_count_and_pad_checks(store: Store) -> None:
    """SEG-5: count must equal the frames in .data, pads must be zero."""
    raw = bytearray(store.idx.read_bytes()[:-8])
    raw[seg.IDX_HEADER_SIZE + 18] = 1  # a pad byte of entry 0
    store.idx.write_bytes(bytes(raw) + struct.pack("<Q", xxhash.xxh3_64_intdigest(bytes(raw))))
    assert "pad" in only(check(store.root)).message
    _, idx = seg.build_segment(TID, 1, [(1, TS, "a", None, b"first")])
    store.idx.write_bytes(idx)  # one entry, but the .data holds two frames
    problem = only(check(store.root))
    assert (problem.rule, problem.offset) == ("SEG-5", 12)


def test_data_trailing_bytes(store: Store) -> None:
    """SEG-3: frames fill the .data exactly; trailing bytes are an error at their offset."""
    size = store.data.stat().st_size
    store.data.write_bytes(store.data.read_bytes() + b"\x07\x00")
    problem = only(check(store.root))
    assert (problem.path, problem.offset, problem.rule) == (str(store.data), size, "SEG-3")


def test_overlapping_segments(store: Store) -> None:
    """SEG-7: a segment starting inside the previous one is an error."""
    data, idx = seg.build_segment(TID, 2, [(2, 0, None, None, b"x"), (3, 0, None, None, b"y")])
    write(store.topic / seg.data_name(2), data)
    write(store.topic / seg.idx_name(2), idx)
    problem = only(check(store.root))
    assert (problem.rule, problem.path) == ("SEG-7", str(store.topic / seg.data_name(2)))
    assert "inside the previous segment" in problem.message


# --- WAL ------------------------------------------------------------------------------------------


def test_torn_tail_in_last_wal_file_is_a_warning(store: Store) -> None:
    """WAL-5: a torn frame in the newest WAL file is the expected crash tail: a warning at the
    frame's offset, and the store is still ok."""
    raw = bytearray(store.wal_file.read_bytes())
    at = store.frame_offset(4)
    raw[at + 20] ^= 0xFF
    store.wal_file.write_bytes(raw)
    report = check(store.root)
    problem = only(report)
    assert (problem.path, problem.offset, problem.rule) == (str(store.wal_file), at, "WAL-5")
    assert problem.severity == "warning" and report.ok
    assert "torn tail: recovery truncates here, nothing acknowledged is lost" in problem.message


def test_torn_frame_in_older_wal_file_is_an_error(store: Store) -> None:
    """WAL-5: the same damage in a WAL file that is not the shard's newest is an error."""
    newer = write(store.root / "wal" / wal.file_name(2), wal_bytes(default_frames(), gen=2))
    raw = bytearray(store.wal_file.read_bytes())
    at = store.frame_offset(1)
    raw[at + 40] ^= 0x01
    store.wal_file.write_bytes(raw)
    report = check(store.root)
    problem = find(report, "WAL-5")
    assert (problem.path, problem.offset, problem.severity) == (str(store.wal_file), at, "error")
    assert not report.ok
    assert all(p.path != str(newer) for p in report.problems)


def test_torn_batch_at_the_tail(store: Store) -> None:
    """WAL-7: a log ending inside a batch: a warning in the newest file (replay discards it), an
    error in an older one."""
    frames = default_frames()[:2]  # the APPEND of seq 3 without its BATCH_END partner
    store.wal_file.write_bytes(wal_bytes(frames))
    problem = only(check(store.root))
    assert (problem.rule, problem.severity, problem.offset) == (
        "WAL-7",
        "warning",
        store.frame_offset(1),
    )
    write(store.root / "wal" / wal.file_name(2), wal_bytes(default_frames(), gen=2))
    problem = only(check(store.root))
    assert (problem.rule, problem.severity, problem.path) == ("WAL-7", "error", str(store.wal_file))


def test_batch_with_broken_seq_run(store: Store) -> None:
    """WAL-7: within a batch each topic's APPEND seqs are consecutive."""
    frames = [
        wal.encode_append(TID, 3, TS, None, None, b"", batch_end=False, durable=False),
        wal.encode_append(TID, 5, TS, None, None, b"", batch_end=True, durable=False),
        wal.encode_append(TID + 1, 1, TS, None, None, b"", batch_end=False, durable=False),
        wal.encode_append(TID, 6, TS, None, None, b"", batch_end=False, durable=False),
        wal.encode_append(TID + 1, 2, TS, None, None, b"", batch_end=True, durable=False),
    ]
    store.wal_file.write_bytes(wal_bytes(frames))
    problem = only(check(store.root))
    assert (problem.rule, problem.offset) == ("WAL-7", wal.HEADER_SIZE + len(frames[0]))


def test_append_batch_frames_in_wal(store: Store) -> None:
    """WAL-14, WAL-7: APPEND_BATCH runs verify clean, their records count in the batch's seq
    run; a checksum-valid batch whose lengths disagree with data_len is an error."""
    good = [
        wal.encode_append_batch(TID, 3, TS, None, None, [b"a", b"b"], batch_end=False,
                                durable=True),
        wal.encode_append(TID, 5, TS, "t", None, b"c", batch_end=True, durable=True),
    ]  # fmt: skip
    store.wal_file.write_bytes(wal_bytes(good))
    assert check(store.root).problems == []
    broken = [good[0], wal.encode_append(TID, 6, TS, None, None, b"", batch_end=True,
                                         durable=True)]  # fmt: skip
    store.wal_file.write_bytes(wal_bytes(broken))
    problem = only(check(store.root))
    assert (problem.rule, problem.offset) == ("WAL-7", wal.HEADER_SIZE + len(good[0]))
    data = struct.pack("<III", 2, 1, 5) + b"ab"  # lengths add up to 6, the data holds 2
    body = struct.pack("<BBQQQHHI", 16, wal.BATCH_END, TID, 3, TS, 0, 0, len(data)) + data
    digest = struct.pack("<Q", xxhash.xxh3_64_intdigest(body))
    bad = struct.pack("<I", len(body) + 8) + body + digest
    store.wal_file.write_bytes(wal_bytes([bad]))
    problem = only(check(store.root))
    assert (problem.rule, problem.severity, problem.offset) == ("WAL-14", "error", wal.HEADER_SIZE)


def test_stale_bytes_after_clean_end(store: Store) -> None:
    """WAL-4: non-zero bytes after the zero frame_len are leftovers: a warning at their offset."""
    raw = bytearray(store.wal_file.read_bytes())
    end = store.frame_offset(len(store.wal_frames))
    raw[end + 100] = 0x55
    store.wal_file.write_bytes(raw)
    problem = only(check(store.root))
    assert (problem.rule, problem.severity, problem.offset) == ("WAL-4", "warning", end + 100)


def test_wal_header_damage(store: Store) -> None:
    """WAL-1: a bad header in an older file is an error; a newest file whose header never
    reached the disk (all zeros) is a warning."""
    write(store.root / "wal" / wal.file_name(2), bytes(8192))
    problem = only(check(store.root))
    assert (problem.rule, problem.severity, problem.offset) == ("WAL-1", "warning", 0)
    raw = bytearray(store.wal_file.read_bytes())
    raw[20] ^= 1
    store.wal_file.write_bytes(raw)
    problem = find(check(store.root), "WAL-1")
    assert (problem.path, problem.severity) == (str(store.wal_file), "error")
    assert "CRC32C" in problem.message


def test_foreign_and_misplaced_wal_files(store: Store) -> None:
    """WAL-2, WAL-10: another store's id, the wrong shard, or a name disagreeing with the
    header's gen are errors."""
    raw = bytearray(store.wal_file.read_bytes())
    other = wal.encode_header(1, 0, 1, TS, b"\xff" * 16, version=2)
    raw[:64] = other
    store.wal_file.write_bytes(raw)
    problem = only(check(store.root))
    assert (problem.rule, problem.offset) == ("WAL-2", 40)
    assert "foreign" in problem.message
    store.wal_file.unlink()
    write(store.root / "wal" / "shard-01" / wal.file_name(1), wal_bytes([], shard=0, count=2))
    assert only(check(store.root)).rule == "WAL-2"
    shutil.rmtree(store.root / "wal" / "shard-01")
    write(store.root / "wal" / wal.file_name(3), wal_bytes([], gen=4))
    problem = only(check(store.root))
    assert (problem.rule, problem.offset) == ("WAL-10", 16)
    (store.root / "wal" / wal.file_name(3)).unlink()
    write(store.root / "wal" / wal.file_name(3), wal_bytes([], gen=3, shard=1, count=2))
    assert only(check(store.root)).rule == "WAL-2"  # a shard file in the flat wal/


def test_bad_frames_in_wal(store: Store) -> None:
    """WAL-3, WAL-6, WAL-8, WAL-9: APPEND seq 0 and a non-JSON control body are errors; an
    unknown type and reserved flags are warnings."""

    def raw_frame(ftype: int, flags: int, seq: int, data: bytes) -> bytes:
        body = struct.pack("<BBQQQHHI", ftype, flags, TID, seq, 0, 0, 0, len(data)) + data
        digest = xxhash.xxh3_64_intdigest(body)
        return struct.pack("<I", len(body) + 8) + body + struct.pack("<Q", digest)

    frames = [
        raw_frame(1, wal.BATCH_END, 0, b"x"),
        raw_frame(wal.FrameType.EVICT, wal.BATCH_END, 1, b"{oops"),
        raw_frame(99, wal.BATCH_END, 0, b"future"),
        raw_frame(wal.FrameType.TOPIC_DROP, wal.BATCH_END | 0x80, 0, b"{}"),
    ]
    store.wal_file.write_bytes(wal_bytes(frames))
    report = check(store.root)
    got = [(p.rule, p.severity, p.offset) for p in report.problems]
    offsets = [wal.HEADER_SIZE + sum(map(len, frames[:i])) for i in range(4)]
    assert got == [
        ("WAL-3", "error", offsets[0]),
        ("WAL-9", "error", offsets[1]),
        ("WAL-8", "warning", offsets[2]),
        ("WAL-6", "warning", offsets[3]),
    ]


# --- snapshots (SNAP) -----------------------------------------------------------------------------


def test_bad_latest_snapshot_with_older_valid_one_is_a_warning(store: Store) -> None:
    """SNAP-2, SNAP-4: the newest snapshot fails its checksum but an older one is valid:
    recovery falls back, so a warning on the newest file."""
    newest = write(
        store.root / "meta" / snap.file_name(2), snap.encode_snapshot(2, snapshot_body(x=1))
    )
    raw = bytearray(newest.read_bytes())
    raw[40] ^= 0x04
    newest.write_bytes(raw)
    report = check(store.root)
    problem = only(report)
    assert (problem.path, problem.rule, problem.severity) == (str(newest), "SNAP-2", "warning")
    assert "falls back to snapshot 1" in problem.message and report.ok


def test_no_valid_snapshot_is_an_error(store: Store) -> None:
    """SNAP-4: with every snapshot damaged the store cannot be opened."""
    store.snapshot.write_bytes(store.snapshot.read_bytes()[:-1])
    report = check(store.root)
    problem = find(report, "SNAP-2")
    assert (problem.path, problem.severity) == (str(store.snapshot), "error")
    assert not report.ok


def test_snapshot_named_for_another_n(store: Store) -> None:
    """SNAP-1: the header's n must equal the file name's."""
    write(store.root / "meta" / snap.file_name(0), snap.encode_snapshot(5, snapshot_body()))
    problem = only(check(store.root))
    assert (problem.rule, problem.severity) == ("SNAP-1", "warning")
    assert "superseded by snapshot 1" in problem.message


def test_snapshot_without_store_id(store: Store) -> None:
    """SNAP-3: without a store_id WAL files cannot be cross-checked: a warning."""
    store.snapshot.write_bytes(snap.encode_snapshot(1, {"version": 1}))
    problem = only(check(store.root))
    assert (problem.rule, problem.severity, problem.path) == (
        "SNAP-3",
        "warning",
        str(store.snapshot),
    )


# --- progress files (PRG) -------------------------------------------------------------------------


def test_garbage_progress_file(store: Store) -> None:
    """PRG-1: a progress file that is not one is an error on that file."""
    store.progress.write_bytes(b"this is not a progress file at all, really")
    problem = only(check(store.root))
    assert (problem.path, problem.rule, problem.severity) == (str(store.progress), "PRG-1", "error")


def test_progress_warnings_and_bad_gap(store: Store) -> None:
    """PRG-2, PRG-6, PRG-7: unknown flags are a warning; an impossible gap is an error; the
    name must be a subscriber name."""
    raw = bytearray(store.progress.read_bytes()[:-4])
    struct.pack_into("<H", raw, 12, 2)
    store.progress.write_bytes(bytes(raw) + struct.pack("<I", crc32c.crc32c(bytes(raw))))
    problem = only(check(store.root))
    assert (problem.rule, problem.severity) == ("PRG-2", "warning")
    struct.pack_into("<QQ", raw, 40, 9, 3)  # gap 9..3
    store.progress.write_bytes(bytes(raw) + struct.pack("<I", crc32c.crc32c(bytes(raw))))
    assert find(check(store.root), "PRG-6").severity == "error"
    store.progress.unlink()
    write(store.topic / "quiver.sub.bad name", b"")
    assert only(check(store.root)).rule == "LAY-2"


def test_PRG_10_version_2_progress_checks(store: Store) -> None:
    """PRG-10: a version 2 progress file (three gaps) verifies clean; one whose gaps overlap is
    an error naming the file and PRG-10."""
    good = prg.encode_progress(1, [3], 0, [(2, 2), (5, 6), (9, 9)])
    store.progress.write_bytes(good)
    assert check(store.root).problems == []
    raw = bytearray(good[:-4])
    struct.pack_into("<Q", raw, 64, 2)  # the second gap 2..6 overlaps the first, 2..2
    store.progress.write_bytes(bytes(raw) + struct.pack("<I", crc32c.crc32c(bytes(raw))))
    problem = only(check(store.root))
    assert (problem.path, problem.rule, problem.severity) == (
        str(store.progress),
        "PRG-10",
        "error",
    )


# --- layout (LAY, LOCK) ---------------------------------------------------------------------------


def test_unknown_entries_are_warnings(store: Store) -> None:
    """LAY-2: anything outside the layout is reported as a warning, nothing else changes."""
    extras = [
        write(store.root / "notes.txt", b"hi"),
        write(store.root / "meta" / "snapshot.0007.bin", b""),
        write(store.root / "wal" / "CURRENT", b"wal-1"),
        write(store.topic / "seg-1.data", b""),
        write(store.root / "topics" / "events", b""),
    ]
    report = check(store.root)
    assert report.ok
    assert sorted(p.path for p in report.problems) == sorted(map(str, extras))
    assert {(p.rule, p.severity) for p in report.problems} == {("LAY-2", "warning")}


def test_leftover_tmp_files_are_warnings(store: Store) -> None:
    """LAY-3, PRG-7: a .tmp of a progress file or snapshot is an interrupted atomic write."""
    tmps = [
        write(store.topic / (prg.file_name("exporter") + ".tmp"), b"partial"),
        write(store.root / "meta" / (snap.file_name(2) + ".tmp"), b"partial"),
    ]
    report = check(store.root)
    assert report.ok
    assert sorted(p.path for p in report.problems) == sorted(map(str, tmps))
    assert {p.rule for p in report.problems} == {"LAY-3"}


@pytest.mark.parametrize(("content", "warns"), [(b"", False), (b"17\n", False), (b"pid?", True)])
def test_lock_pid_file_content(store: Store, content: bytes, warns: bool) -> None:
    """LOCK-2: .lock.pid holds a decimal PID and a newline, or nothing."""
    (store.root / ".lock.pid").write_bytes(content)
    report = check(store.root)
    assert [p.rule for p in report.problems] == (["LOCK-2"] if warns else [])
    assert report.ok


def test_problem_renders_path_offset_and_rule() -> None:
    """LAY-2: a Problem prints as 'severity: path @ offset: [rule] message'."""
    p = Problem("/s/wal/x.log", 64, "WAL-5", "warning", "torn tail")
    assert str(p) == "warning: /s/wal/x.log @ 64: [WAL-5] torn tail"
    assert str(Problem("/s", None, "LAY-1", "error", "no")) == "error: /s: [LAY-1] no"


# --- garbage never makes verify raise -------------------------------------------------------------


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_verify_never_raises_on_garbage(data: st.DataObject) -> None:
    """LAY-1, WAL-5, SEG-2, PRG-1, SNAP-2: random bytes in place of, or appended to, any file
    of the store: verify returns a report and never raises."""
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "store"
        built = build_store(Path(tmp))
        files = [built.snapshot, built.wal_file, built.data, built.idx, built.progress]
        for path in data.draw(st.lists(st.sampled_from(files), min_size=1, max_size=5)):
            garbage = data.draw(st.binary(max_size=200))
            if data.draw(st.booleans()):
                path.write_bytes(garbage)
            else:
                cut = data.draw(st.integers(0, os.path.getsize(path)))
                path.write_bytes(path.read_bytes()[:cut] + garbage)
        report = check(root)
        assert isinstance(report, Report)
        assert all(p.severity in ("error", "warning") for p in report.problems)
