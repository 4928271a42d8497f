"""WAL recycling (spec/FORMATS.md WAL-15): version-3 WAL files seed every frame's XXH3-64 with
the file's gen and end with FILE_END, so a checkpoint's retired files can be reused for new
ones (their blocks already written) without their old frames ever replaying. Crash states of
the same are in tests/crash/test_file_crash.py (``test_WAL_15_...``)."""

from __future__ import annotations

import os
import struct
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

import tidelog
from tidelog.backends.file import FileBackend
from tidelog.backends.file.format import wal as walfmt
from tidelog.backends.file.verify import verify_store
from tidelog.fsio import OsFS
from tidelog.hooks import hooks

SMALL = "background=false&wal_file_bytes=64KiB&checkpoint_bytes=1GiB&commit_interval_ms=60000"


def _backend(store: tidelog.Store) -> FileBackend:
    """The file backend itself: these tests look at its own internals (by its class, REG-5)."""
    return hooks(store, FileBackend)


def _names(root: Path) -> tuple[list[str], list[str]]:
    names = sorted(os.listdir(root / "wal"))
    return (
        [n for n in names if walfmt.parse_file_name(n) is not None],
        [n for n in names if walfmt.parse_spare_name(n) is not None],
    )


# --- the format: seeded checksums, FILE_END, reseed --------------------------------------------

frames_st = st.lists(
    st.tuples(st.binary(max_size=300), st.sampled_from((None, "t"))), min_size=1, max_size=6
)


@given(frames=frames_st, gen=st.integers(1, 2**64 - 1), other=st.integers(0, 2**64 - 1))
def test_WAL_15_frames_only_scan_under_their_own_gen(
    frames: list[tuple[bytes, str | None]], gen: int, other: int
) -> None:
    """WAL-3, WAL-15: a frame checksummed with one gen's seed is the end of the log under any
    other (a stale frame of a recycled file never replays); ``reseed`` re-seals a chunk of
    frames for another gen, and nothing else in it changes."""
    chunk = b"".join(
        walfmt.encode_append(1, i + 1, 5, tag, None, p, batch_end=True, durable=True, seed=gen)
        for i, (p, tag) in enumerate(frames)
    )
    mine = walfmt.scan(chunk, 0, seed=gen)
    assert mine.status == "clean" and len(mine.frames) == len(frames)
    if other != gen:
        theirs = walfmt.scan(chunk, 0, seed=other)
        assert (theirs.frames, theirs.status, theirs.end) == ([], "torn", 0)
    moved = walfmt.reseed(chunk, other)
    assert len(moved) == len(chunk)
    got = walfmt.scan(moved, 0, seed=other)
    assert [f[:8] for f in got.frames] == [f[:8] for f in mine.frames]


def test_WAL_15_scan_stops_after_FILE_END_and_never_reads_what_follows() -> None:
    """WAL-15: FILE_END ends the log (``sealed``; not a frame of the result): valid frames of
    the same gen after it are never returned, by ``scan``, ``scan_file`` or ``WalScanner``."""
    gen = 9
    head = walfmt.encode_header(gen, 0, 1, 0, bytes(16))
    one = walfmt.encode_append(1, 1, 5, None, None, b"a", batch_end=True, durable=True, seed=gen)
    two = walfmt.encode_append(1, 2, 5, "t", None, b"b", batch_end=True, durable=True, seed=gen)
    end = walfmt.encode_file_end(gen)
    assert len(end) == walfmt.FILE_END_SIZE
    image = head + one + end + two + bytes(100)
    for result in (walfmt.scan_file(image), walfmt.scan(image, seed=gen)):
        assert [f.seq for f in result.frames] == [1]
        assert result.sealed and result.status == "clean" and result.detail == "FILE_END"
        assert result.end == len(head + one + end)
    scanner = walfmt.WalScanner(image, seed=gen)
    assert [f.seq for f in scanner] == [1]
    assert scanner.sealed and scanner.end == len(head + one + end)
    labelled_first = head + two + end + one  # FILE_END reached through the labelled-frame path
    got = walfmt.scan_file(labelled_first)
    assert [f.seq for f in got.frames] == [2] and got.sealed
    unsealed = walfmt.scan_file(head + one + bytes(64))
    assert not unsealed.sealed and unsealed.status == "clean"


# --- the writer: spares, recycling, FILE_END at rotation and close --------------------------------


def _fill(store: tidelog.Store, rounds: int, per_round: int = 9) -> list[int]:
    t = store.topic("t", durability="fsync")
    seqs = []
    for r in range(rounds):
        seqs += [t.append(bytes([r % 256]) * 9000) for _ in range(per_round)]
        _backend(store).checkpoint()
    return seqs


def test_WAL_15_checkpoints_keep_spares_and_rotation_recycles_them(tmp_path: Path) -> None:
    """WAL-15: retired files become spares (at most ``wal_recycle`` per shard), new files are
    made from them, every file but the newest ends with FILE_END, the recycled files hold an
    older gen's frames after their log's end, and every record is back after a reopen; verify
    finds nothing wrong with any of it."""
    root = tmp_path / "s"
    uri = f"file://{root}?{SMALL}&wal_recycle=2"
    store = tidelog.open(uri)
    seqs = _fill(store, 6)
    shard = _backend(store).shards[0]
    assert shard.stats["recycled"] >= 3
    files, spares = _names(root)
    assert 1 <= len(spares) <= 2
    images = {n: (root / "wal" / n).read_bytes() for n in files}
    newest = max(files)
    stale = 0
    for name, image in images.items():
        result = walfmt.scan_file(image)
        assert result.sealed == (name != newest)
        stale += walfmt.first_nonzero(image, result.end) is not None
    assert stale, "no recycled file holds an older gen's bytes after its end"
    assert verify_store(OsFS(), str(root)).problems == []
    store.close()
    assert walfmt.scan_file((root / "wal" / newest).read_bytes()).sealed  # closed cleanly
    with tidelog.open(uri) as again:
        assert _backend(again).clean_open
        assert [r.seq for r in again.topic("t").read(0, 1000)] == seqs
    assert verify_store(OsFS(), str(root)).problems == []


def test_WAL_16_every_file_after_a_rotation_proves_its_syncs(tmp_path: Path) -> None:
    """WAL-16, WAL-15: in every WAL file, not only the first, each durable single append after
    the file's first rides behind a SYNCED frame proving the bytes before it durable (before
    the fix the mark of the last SYNCED frame placed was kept across a rotation, and a new
    file got none until its log passed that offset of the previous file)."""
    root = tmp_path / "s"
    with tidelog.open(f"file://{root}?{SMALL}") as store:
        t = store.topic("t", durability="fsync")
        for i in range(800):
            t.append(b"%04d" % i * 25)
        files, _ = _names(root)
        assert len(files) >= 3
        for name in files:
            frames = walfmt.scan_file((root / "wal" / name).read_bytes()).frames
            appends = sum(f.type == walfmt.FrameType.APPEND for f in frames)
            synced = [f for f in frames if f.type == walfmt.FrameType.SYNCED]
            assert appends > 100 and len(synced) >= appends - 1, name
            assert {f.seq for f in synced} == {walfmt.parse_file_name(name)}


def test_WAL_15_wal_recycle_0_deletes_retired_files(tmp_path: Path) -> None:
    root = tmp_path / "s"
    with tidelog.open(f"file://{root}?{SMALL}&wal_recycle=0") as store:
        _fill(store, 4)
        assert _backend(store).shards[0].stats["recycled"] == 0
        assert _names(root)[1] == []


def test_WAL_15_spares_beyond_the_option_are_removed_at_open(tmp_path: Path) -> None:
    root = tmp_path / "s"
    with tidelog.open(f"file://{root}?{SMALL}&wal_recycle=3") as store:
        _fill(store, 6)
    assert len(_names(root)[1]) >= 2
    with tidelog.open(f"file://{root}?{SMALL}&wal_recycle=1"):
        assert len(_names(root)[1]) <= 1  # one kept (or already taken for the new file)


def test_WAL_15_files_a_crash_recovery_replayed_are_never_recycled(tmp_path: Path) -> None:
    """WTAIL-2, WAL-15: records recovery found are served from the mapped WAL file until a
    checkpoint seals them; a reader may still hold that map, so the file is deleted when
    retired, never reused (its bytes must not change under the map)."""
    root = tmp_path / "s"
    uri = f"file://{root}?{SMALL}&wal_recycle=8"
    store = tidelog.open(uri)
    t = store.topic("t", durability="fsync")
    seqs = [t.append(bytes([i]) * 9000) for i in range(20)]
    _backend(store).abandon()  # power loss
    replayed = set(_names(root)[0])
    assert len(replayed) >= 2
    with tidelog.open(uri) as again:
        _backend(again).checkpoint()
        kept = {walfmt.file_name(walfmt.parse_spare_name(n) or 0) for n in _names(root)[1]}
        assert kept & replayed == set()
        assert [r.seq for r in again.topic("t").read(0, 100)] == seqs


def test_WAL_15_an_older_version_3_file_without_FILE_END_is_damage(tmp_path: Path) -> None:
    """WAL-15, WAL-5: in a file that is not its shard's newest, a log that ends without
    FILE_END lost frames: verify reports an error, and recovery refuses (FLT-1)."""
    root = tmp_path / "s"
    uri = f"file://{root}?{SMALL}&wal_recycle=0"
    store = tidelog.open(uri)
    t = store.topic("t", durability="fsync")
    for i in range(12):  # two files
        t.append(bytes([i]) * 9000)
    _backend(store).abandon()
    files = _names(root)[0]
    assert len(files) == 2
    older = root / "wal" / files[0]
    image = bytearray(older.read_bytes())
    end = walfmt.scan_file(bytes(image)).end
    first = walfmt.HEADER_SIZE
    (frame_len,) = struct.unpack_from("<I", image, first)
    image[first + frame_len] ^= 0xFF  # the first frame's checksum: everything after is lost
    older.write_bytes(bytes(image))
    problems = verify_store(OsFS(), str(root)).problems
    # WAL-16 names the proof (a SYNCED frame after the damage) where WAL-15 would only say
    # "no FILE_END": either is the error recovery's refusal matches
    assert any(p.rule in ("WAL-15", "WAL-16") and p.path == str(older) for p in problems)
    assert end > first
    with pytest.raises(tidelog.Corrupt, match="damaged at offset"):
        tidelog.open(uri)


def test_WAL_1_WAL_15_a_store_with_version_2_wal_files_upgrades(tmp_path: Path) -> None:
    """WAL-1, WAL-15: a store whose WAL files are version 2 (unseeded frames, zeros after the
    end: what tidelog wrote before recycling) opens after a crash with every acknowledged
    record; new frames go to version-3 files; a checkpoint deletes the old files (never made
    spares: recovery replayed them); close, reopen and verify find everything."""
    root = tmp_path / "s"
    uri = f"file://{root}?{SMALL}"
    store = tidelog.open(uri)
    t = store.topic("t", durability="fsync")
    seqs = [t.append(b"old-%d" % i) for i in range(30)]
    _backend(store).abandon()
    (name,) = _names(root)[0]
    path = root / "wal" / name
    image = path.read_bytes()
    header = walfmt.decode_header(image)
    end = walfmt.scan_file(image).end
    downgraded = (
        walfmt.encode_header(header.gen, 0, 1, header.created_ms, header.store_id, version=2)
        + walfmt.reseed(image[walfmt.HEADER_SIZE : end], 0)
    )
    path.write_bytes(downgraded + bytes(len(image) - len(downgraded)))
    assert walfmt.decode_header(path.read_bytes()).version == 2
    with tidelog.open(uri) as again:
        t2 = again.topic("t")
        seqs += [t2.append(b"new-%d" % i) for i in range(30)]
        versions = {walfmt.decode_header((root / "wal" / n).read_bytes()).version
                    for n in _names(root)[0]}  # fmt: skip
        assert versions == {2, 3}
        _backend(again).checkpoint()
        assert name not in _names(root)[0] and not _names(root)[1]
    with tidelog.open(uri) as third:
        assert [r.seq for r in third.topic("t").read(0, 100)] == seqs
    assert verify_store(OsFS(), str(root)).problems == []


def test_DUR_1_a_crash_after_a_clean_close_is_not_a_clean_open(tmp_path: Path) -> None:
    """DUR-1, DUR-3, FLT-7: a store closed cleanly, reopened, appended to and then abandoned
    (a crash) reopens as a crash: its WAL holds ops after the clean snapshot. Whether it does
    is read from the recovery plan before the plan frees its frames (WalPlan.release), which
    would otherwise count none and take the crash for a clean close (no heads raised over
    reserved seqs, seqs reused)."""
    from tidelog.hooks import Abandon

    uri = f"file://{tmp_path / 's'}"
    with tidelog.open(uri) as store:
        store.topic("t", durability="disk").append(b"a")
    store = tidelog.open(uri)
    assert _backend(store).clean_open
    store.topic("t").append(b"b")
    store.flush()
    hooks(store, Abandon).abandon()
    with tidelog.open(uri) as again:
        assert not _backend(again).clean_open
        items = again.topic("t").read(0, 100)
        assert [r.payload for r in items if isinstance(r, tidelog.Record)] == [b"a", b"b"]
        assert isinstance(items[-1], tidelog.Tombstone)  # DUR-3: the raised head's loss range
