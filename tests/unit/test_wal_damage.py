"""Damage in WAL files, told apart from a torn tail (spec/SPEC.md FLT-1, FLT-2; spec/FORMATS.md
WAL-1, WAL-5, WAL-10, WAL-16): a SYNCED frame after the place where a log stops proves the bytes
there were durable, so a defect there is damage and recovery refuses with ``Corrupt`` naming
file and offset, writing nothing, and ``verify`` says the same. Without such a proof the stop is
a torn tail, as a power loss leaves it."""

from __future__ import annotations

import os
import random
import shutil
import threading
import time
from pathlib import Path

import pytest

import tidelog
from tidelog.backends.file import FileBackend
from tidelog.backends.file.format import wal as walfmt
from tidelog.backends.file.verify import verify_store
from tidelog.backends.file.wal import WalOptions, WalShard
from tidelog.fsio import OsFS
from tidelog.hooks import hooks

QUIET = "background=false&commit_interval_ms=60000&checkpoint_bytes=1GiB&wal_file_bytes=1MiB"


def _backend(store: tidelog.Store) -> FileBackend:
    """The file backend itself: these tests look at its own internals (by its class, REG-5)."""
    return hooks(store, FileBackend)


def _newest_wal(root: Path) -> Path:
    names = sorted(n for n in os.listdir(root / "wal") if walfmt.parse_file_name(n) is not None)
    return root / "wal" / names[-1]


def _write(root: Path, n: int, *, crash: bool, size: int = 60) -> list[bytes]:
    """``n`` fsync single appends (each acknowledged once synced), then a clean close or a
    crash (``abandon``: nothing more is written, like SIGKILL after the last ack)."""
    payloads = [bytes([65 + i % 26]) * size + i.to_bytes(4, "big") for i in range(n)]
    store = tidelog.open(f"file://{root}?{QUIET}")
    t = store.topic("t", durability="fsync")
    for p in payloads:
        t.append(p)
    if crash:
        _backend(store).abandon()
    else:
        store.close()
    return payloads


def _frames(path: Path) -> list[walfmt.Frame]:
    return walfmt.scan_file(path.read_bytes()).frames


def _records(root: Path) -> list[bytes]:
    with tidelog.open(f"file://{root}?{QUIET}") as store:
        return [r.payload for r in store.topic("t").read(after=0, limit=10_000)]


def _flip(path: Path, offset: int) -> None:
    image = bytearray(path.read_bytes())
    image[offset] ^= 0x10
    path.write_bytes(bytes(image))


def _wal_errors(root: Path) -> list[str]:
    return [p.rule for p in verify_store(OsFS(), str(root)).errors]


def test_WAL_16_a_SYNCED_frame_proves_each_sync_before_the_next_op(tmp_path: Path) -> None:
    """WAL-16: fsync single appends (one write + sync each): every op after the first is
    preceded by a SYNCED frame of the file's gen whose offset is the end of the op before it;
    a clean close ends with one covering everything, on a later page, then FILE_END."""
    _write(tmp_path, 5, crash=False)
    path = _newest_wal(tmp_path)
    gen = walfmt.parse_file_name(path.name)
    frames = _frames(path)
    kinds = [f.type for f in frames]
    assert kinds.count(walfmt.FrameType.APPEND) == 5
    marks = [f for f in frames if f.type == walfmt.FrameType.SYNCED]
    for f in frames[1:]:
        if f.type == walfmt.FrameType.APPEND:
            before = frames[frames.index(f) - 1]
            assert before.type == walfmt.FrameType.SYNCED
            assert before.seq == gen and before.ts == before.offset  # synced up to itself
    assert all(m.seq == gen and m.flags & walfmt.BATCH_END for m in marks)
    # the close's proof: a SYNCED frame where the synced bytes end, and a far copy of it on the
    # next page, beyond the log's end (a lost page cannot take the last op and its proof too)
    proof = marks[-1]
    assert frames[-1] == proof and proof.ts == proof.offset
    lost = bytearray(path.read_bytes())
    lost[:4096] = bytes(4096)  # the page with the last op, its proof and FILE_END: gone
    far = walfmt.durable_proof(bytes(lost), proof.ts - 1, gen)
    assert far is not None and far.offset == 4096 and far.synced == proof.ts
    assert walfmt.scan_file(path.read_bytes()).sealed


def test_WAL_16_FLT_1_damage_followed_by_acknowledged_frames_is_refused(tmp_path: Path) -> None:
    """FLT-1, FLT-2, WAL-16 (the reported loss): one damaged byte in an acknowledged frame of
    the newest WAL file, with valid acknowledged frames after it, is damage: open raises
    ``Corrupt`` naming the file and the offset, changes no byte, and hands out no seq again;
    ``verify`` reports the same error. Before WAL-16 recovery took it for a torn tail, dropped
    every later frame and reused their seqs."""
    _write(tmp_path, 20, crash=True)
    path = _newest_wal(tmp_path)
    victim = [f for f in _frames(path) if f.type == walfmt.FrameType.APPEND][7]
    _flip(path, victim.offset + 40)  # inside the payload
    before = path.read_bytes()
    with pytest.raises(tidelog.Corrupt) as err:
        tidelog.open(f"file://{tmp_path}?{QUIET}")
    assert err.value.code == "corrupt"
    assert str(path) in err.value.message and f"offset {victim.offset}" in err.value.message
    assert "WAL-16" in err.value.message
    assert path.read_bytes() == before  # nothing truncated, sealed or zeroed
    assert "WAL-16" in _wal_errors(tmp_path)
    with pytest.raises(tidelog.Corrupt):  # and it stays refused: nothing was "repaired"
        tidelog.open(f"file://{tmp_path}?{QUIET}")


def test_WAL_16_damage_in_frames_a_snapshot_absorbed_is_harmless(tmp_path: Path) -> None:
    """WAL-16, FLT-2: a clean close seals every record into segments; damage in the WAL frames
    that snapshot absorbed is never read by recovery (every record intact) and verify, saying
    what recovery does, only warns."""
    payloads = _write(tmp_path, 20, crash=False)
    path = _newest_wal(tmp_path)
    victim = [f for f in _frames(path) if f.type == walfmt.FrameType.APPEND][7]
    _flip(path, victim.offset + 40)
    report = verify_store(OsFS(), str(tmp_path))
    assert report.errors == []
    assert [(p.rule, p.offset) for p in report.warnings] == [("WAL-16", victim.offset)]
    assert _records(tmp_path) == payloads


def test_WAL_16_a_torn_last_op_is_still_a_torn_tail(tmp_path: Path) -> None:
    """WAL-5, WAL-16: the last op's frame damaged after a crash, with nothing synced after it,
    is what a torn write leaves: recovery discards it (the op was never proven durable: the
    residual WAL-16 states), keeps every op before it, and verify only warns."""
    payloads = _write(tmp_path, 6, crash=True)
    path = _newest_wal(tmp_path)
    last = [f for f in _frames(path) if f.type == walfmt.FrameType.APPEND][-1]
    _flip(path, last.offset + 40)
    report = verify_store(OsFS(), str(tmp_path))
    assert report.errors == [] and report.warnings == []  # version 3: a torn end is silent
    assert _records(tmp_path) == payloads[:-1]


def test_WAL_16_an_idle_shard_proves_its_last_sync(tmp_path: Path) -> None:
    """WAL-16: a shard quiet for a committer tick after a sync places and syncs a SYNCED
    frame covering it, on a later page (and then no more: a SYNCED frame never begets
    another)."""
    lock = threading.RLock()
    options = WalOptions(file_bytes=1 << 20, prealloc="none", commit_interval_ms=5)
    shard = WalShard(OsFS(), str(tmp_path), 0, 1, bytes(16), options, 1, lock)
    try:
        frame = walfmt.encode_append(
            1, 1, 0, None, None, b"x", batch_end=True, durable=True, seed=1
        )
        with lock:
            op = shard.submit(frame, 1)
        shard.wait_synced(op)
        end = walfmt.HEADER_SIZE + len(frame)
        path = tmp_path / "wal" / walfmt.file_name(1)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            marks = [f for f in _frames(path) if f.type == walfmt.FrameType.SYNCED]
            if marks and shard.synced == shard.written:
                break
            time.sleep(0.005)
        # the proof where the synced bytes end, and its far copy on the next page
        assert [(m.offset, m.ts) for m in marks] == [(end, end)]
        lost = bytes(4096) + path.read_bytes()[4096:]  # the first page lost
        assert walfmt.durable_proof(lost, end - 1, 1) == walfmt.DurableProof(4096, end)
        time.sleep(0.05)  # several more ticks: no more
        assert len([f for f in _frames(path) if f.type == walfmt.FrameType.SYNCED]) == 1
    finally:
        shard.close()


def test_WAL_10_a_header_gen_that_disagrees_with_the_name_is_refused(tmp_path: Path) -> None:
    """WAL-10 (reported: writer recovery skipped such a file and its records silently): a WAL
    file named for one gen whose valid header says another is refused by recovery, as verify
    reports it."""
    _write(tmp_path, 3, crash=True)
    path = _newest_wal(tmp_path)
    gen = walfmt.parse_file_name(path.name)
    assert gen is not None
    moved = path.with_name(walfmt.file_name(gen + 1))
    path.rename(moved)
    assert "WAL-10" in _wal_errors(tmp_path)
    with pytest.raises(tidelog.Corrupt, match="WAL-10"):
        tidelog.open(f"file://{tmp_path}?{QUIET}")
    assert moved.exists()


def test_WAL_1_a_damaged_header_over_frames_is_refused(tmp_path: Path) -> None:
    """WAL-1, FLT-1: frames are written only after a file's header is durable, so a newest
    file whose header is not valid but which holds non-zero bytes after it is damage (it was
    removed as "never completed", with every record in it)."""
    _write(tmp_path, 3, crash=True)
    path = _newest_wal(tmp_path)
    _flip(path, 20)  # the header's gen: its CRC fails
    with pytest.raises(tidelog.Corrupt, match="WAL-1"):
        tidelog.open(f"file://{tmp_path}?{QUIET}")
    assert path.exists()
    assert _wal_errors(tmp_path)


def test_WAL_1_a_newest_file_without_header_or_frames_is_removed(tmp_path: Path) -> None:
    """WAL-1: what a crash right after creating a file leaves (a header never written, zeros
    after it) is still removed quietly, and nothing is lost."""
    payloads = _write(tmp_path, 3, crash=True)
    old = _newest_wal(tmp_path)
    store = tidelog.open(f"file://{tmp_path}?{QUIET}")  # seals the old file, starts a new one
    _backend(store).abandon()
    empty = _newest_wal(tmp_path)
    assert empty != old
    empty.write_bytes(bytes(4096))  # its header never reached the disk
    assert _records(tmp_path) == payloads
    assert not empty.exists()


def test_WAL_5_damage_in_an_older_file_is_refused_even_with_no_frames_after(
    tmp_path: Path,
) -> None:
    """WAL-5, FLT-1: an older file of a shard was synced before the next was created, so a log
    ending early in it is damage, whether or not the newer files hold frames yet (recovery
    used to accept it when they did not)."""
    _write(tmp_path, 60, crash=True, size=30_000)  # 1 MiB files: several of them
    names = sorted(n for n in os.listdir(tmp_path / "wal") if walfmt.parse_file_name(n))
    assert len(names) >= 2
    older = tmp_path / "wal" / names[-2]
    newest = tmp_path / "wal" / names[-1]
    victim = [f for f in _frames(older) if f.type == walfmt.FrameType.APPEND][-1]
    _flip(older, victim.offset + 100)
    gen = walfmt.parse_file_name(newest.name)
    assert gen is not None
    head = newest.read_bytes()[: walfmt.HEADER_SIZE]  # the newest: a header, nothing else
    newest.write_bytes(head + bytes(4096))
    with pytest.raises(tidelog.Corrupt, match=f"{older.name}: damaged at offset {victim.offset}"):
        tidelog.open(f"file://{tmp_path}?{QUIET}")


def test_WAL_16_a_read_only_view_rereads_before_refusing(tmp_path: Path) -> None:
    """WAL-16, XPR-1: a view that read the bytes at the log's end before the writer wrote
    them, and a SYNCED frame after them, reads them again and goes on; real damage is
    refused after that one re-read."""
    from tidelog.backends.file import recovery

    _write(tmp_path, 6, crash=True)
    path = _newest_wal(tmp_path)
    gen = walfmt.parse_file_name(path.name)
    assert gen is not None
    image = path.read_bytes()
    appends = [f for f in _frames(path) if f.type == walfmt.FrameType.APPEND]
    at = appends[2].offset
    sid = walfmt.decode_header(image).store_id

    class Stale:
        """The bytes from ``at`` read as zeros by the first read that covers them."""

        def __init__(self) -> None:
            self.stale = True

        def size(self) -> int:
            return len(image)

        def pread(self, n: int, off: int) -> bytes:
            got = bytearray(image[off : off + n])
            if self.stale and off <= at < off + n:
                self.stale = False
                got[at - off : at - off + 40] = bytes(40)
            return bytes(got)

    result, _ = recovery._scan_copied(Stale(), str(path), walfmt.HEADER_SIZE, sid, gen)
    assert [f.seq for f in result.frames if f.type == walfmt.FrameType.APPEND] == [
        f.seq for f in appends
    ]
    _flip(path, at + 40)
    with pytest.raises(tidelog.Corrupt, match="WAL-16"):
        tidelog.open(f"file://{tmp_path}?{QUIET}&readonly=true")


@pytest.mark.parametrize("crash", [False, True], ids=["clean-close", "crash"])
def test_FLT_1_every_single_byte_flip_of_the_newest_wal_is_refused_or_harmless(
    tmp_path: Path, crash: bool
) -> None:
    """FLT-1, FLT-2 over the whole newest WAL file (seeded sample of offsets, every frame and
    the header): after a flip, opening either raises ``Corrupt`` (and verify reports an error)
    or returns every acknowledged record intact; after a crash, also the documented residual
    (WAL-16): only the last op, with nothing synced after it, may be taken for a torn tail.
    Never fewer records otherwise, never a different payload."""
    payloads = _write(tmp_path / "orig", 12, crash=crash)
    path = _newest_wal(tmp_path / "orig")
    end = walfmt.scan_file(path.read_bytes()).end
    rng = random.Random(1234)
    offsets = sorted(set(range(0, 64, 4)) | {rng.randrange(64, end + 64) for _ in range(60)})
    counts = {"refused": 0, "intact": 0, "residual": 0}
    for off in offsets:
        root = tmp_path / f"c{off}"
        shutil.copytree(tmp_path / "orig", root)
        _flip(_newest_wal(root), off)
        try:
            got = _records(root)
        except tidelog.Corrupt:
            counts["refused"] += 1
            assert _wal_errors(root), f"offset {off}: open refused, verify found nothing"
            continue
        assert not _wal_errors(root), f"offset {off}: open went on, verify reports an error"
        if got == payloads:
            counts["intact"] += 1
        else:
            assert crash and got == payloads[:-1], f"offset {off}: {len(got)} records"
            counts["residual"] += 1
    print(f"\nWAL flips ({'crash' if crash else 'clean'}): {len(offsets)} cases, {counts}")
    assert counts["refused"] > 0


def test_WAL_16_the_fast_SYNCED_encoder_writes_the_control_frame_WAL_8_defines() -> None:
    """WAL-8, WAL-9, WAL-16: ``encode_synced`` (one pack and one XXH3, on every fsync append's
    path) is byte for byte the control frame ``encode_control`` makes: type 18, BATCH_END,
    seq = gen, ts = the offset, body ``{}``, seeded with the gen."""
    for gen, synced in ((1, 64), (7, 123_456), (2**63, 2**40), (2**64 - 1, 0)):
        slow = walfmt.encode_control(walfmt.FrameType.SYNCED, 0, {}, seq=gen, ts=synced, seed=gen)
        assert walfmt.encode_synced(gen, synced) == slow
        assert len(slow) == walfmt.SYNCED_SIZE


def test_WAL_16_FLT_1_damage_in_a_file_after_a_rotation_is_refused(tmp_path: Path) -> None:
    """FLT-1, WAL-16 in every WAL file, not only the first: after rotations, one damaged byte in
    an acknowledged frame of the newest file, with acknowledged frames after it, is refused as
    damage. (When a rotation kept the previous file's SYNCED mark, the files after the first
    carried no SYNCED frames, so recovery took this for a torn tail and dropped every
    acknowledged record after it.)"""
    root = tmp_path / "s"
    store = tidelog.open(
        f"file://{root}?{QUIET.replace('wal_file_bytes=1MiB', 'wal_file_bytes=64KiB')}"
    )
    t = store.topic("t", durability="fsync")
    for i in range(1000):
        t.append(b"%06d" % i * 10)
    _backend(store).abandon()
    names = sorted(n for n in os.listdir(root / "wal") if walfmt.parse_file_name(n) is not None)
    assert len(names) >= 3
    path = root / "wal" / names[-1]  # the newest: an older file's damage is refused anyway
    appends = [f for f in _frames(path) if f.type == walfmt.FrameType.APPEND]
    assert len(appends) >= 40
    victim = appends[len(appends) // 2]
    _flip(path, victim.offset + 40)
    with pytest.raises(tidelog.Corrupt) as err:
        tidelog.open(f"file://{root}?{QUIET}")
    assert str(path) in err.value.message and f"offset {victim.offset}" in err.value.message
