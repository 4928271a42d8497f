"""QuestDB SF slots byte for byte, and the recovery scan over hand-built slots (spec/FORWARD.md
SF-1..SF-16; SPEC FSN-5).

Slots are built here with ``struct`` and an independent bitwise CRC-32C, never with the codecs
under test, so a symmetric bug in encoder and decoder cannot hide. Recovery results are also
checked against the model's ``recovery_seed`` through ``ForwarderModel.restart``.
"""

from __future__ import annotations

import errno
import logging
import os
import struct
from pathlib import Path
from typing import Any

import pytest

import tidelog
from tidelog.backends.sf import format as fmt
from tidelog.backends.sf.recovery import FAILED_FILE, WATERMARK_FILE, recover
from tidelog.backends.sf.slot import Slot, check_sender_id, write_failed
from tidelog.errors import (
    Backpressure,
    BadArgument,
    Corrupt,
    Locked,
    NotAvailable,
    StorageError,
    TooLarge,
)
from tidelog.fsio import OsFS
from tidelog.model.fsn import ForwarderModel


# --- an independent encoder -----------------------------------------------------------------
def crc32c_bitwise(data: bytes) -> int:
    """CRC-32C by the book: reflected polynomial 0x82F63B78, init and xorout 0xFFFFFFFF."""
    crc = 0xFFFFFFFF
    for byte in data:
        crc ^= byte
        for _ in range(8):
            crc = (crc >> 1) ^ (0x82F63B78 if crc & 1 else 0)
    return crc ^ 0xFFFFFFFF


def header(base: int, created: int = 0, magic: bytes = b"SF01", version: int = 1) -> bytes:
    return magic + struct.pack("<BBHqq", version, 0, 0, base, created)


def frame(payload: bytes) -> bytes:
    body = struct.pack("<i", len(payload)) + payload
    return struct.pack("<I", crc32c_bitwise(body)) + body


def segment(base: int, payloads: list[bytes], size: int = 512, tail: bytes = b"") -> bytes:
    data = header(base, 1_700_000_000_000_000) + b"".join(frame(p) for p in payloads) + tail
    assert len(data) <= size
    return data.ljust(size, b"\0")


def watermark(fsn: int, magic: int = 0x31574B41, reserved: int = 0) -> bytes:
    return struct.pack("<IIq", magic, reserved, fsn)


def make_slot(root: Path, files: dict[str, bytes], sender: str = "s1") -> Path:
    slot = root / sender
    slot.mkdir(parents=True, exist_ok=True)
    for name, data in files.items():
        (slot / name).write_bytes(data)
    return slot


def fr(n: int) -> bytes:
    return f"payload-{n}".encode()


def model_seed(segments: list[tuple[int, int]], wm: int | None) -> tuple[int, int]:
    m = ForwarderModel()
    m.restart(segments, wm)
    return m.acked_fsn, m.published_fsn


# --- golden bytes (SF-3, SF-4, SF-6) -----------------------------------------------------------
def test_SF_4_crc32c_is_castagnoli() -> None:
    """SF-4: the check value of CRC-32C, and agreement with the bitwise reference."""
    assert fmt.crc32c(b"123456789") == 0xE3069283 == crc32c_bitwise(b"123456789")
    for data in (b"", b"\0" * 4, bytes(range(256)) * 3):
        assert fmt.crc32c(data) == crc32c_bitwise(data)


def test_SF_3_header_golden_bytes() -> None:
    """SF-3: 24 bytes, magic "SF01" (0x31304653 LE), version 1, flags 0, reserved 0, baseSeq,
    createdMicros, little-endian."""
    got = fmt.encode_header(5, 1234)
    assert got == bytes.fromhex("53463031010000000500000000000000d204000000000000")
    assert got == header(5, 1234)
    assert fmt.decode_header(got) == (5, 1234)
    assert int.from_bytes(got[:4], "little") == fmt.SEGMENT_MAGIC == 0x31304653


def test_SF_4_frame_golden_bytes() -> None:
    """SF-4: crc32c(payloadLen || payload), payloadLen (int32 LE), payload."""
    got = fmt.encode_frame(b"hello")
    assert got == frame(b"hello")
    assert got[4:] == bytes.fromhex("05000000") + b"hello"
    assert got[:4] == crc32c_bitwise(bytes.fromhex("05000000") + b"hello").to_bytes(4, "little")
    assert got.hex() == "a1b1174e0500000068656c6c6f"
    assert fmt.encode_frame(b"") == frame(b"")


def test_SF_6_watermark_golden_bytes() -> None:
    """SF-6: 16 bytes: magic "AKW1" (0x31574B41 LE), reserved 0, fsn int64 LE."""
    got = fmt.encode_watermark(42)
    assert got == bytes.fromhex("414b5731000000002a00000000000000") == watermark(42)
    assert fmt.decode_watermark(got) == 42
    assert fmt.decode_watermark(watermark(42, magic=0)) is None  # fresh zero-filled file
    assert fmt.decode_watermark(watermark(42, reserved=1)) is None
    assert fmt.decode_watermark(watermark(-5)) is None
    assert fmt.decode_watermark(got[:15]) is None


def test_SF_5_segment_names() -> None:
    """SF-5: sf-<gen:016x>.sfa, lowercase; sf-initial.sfa is a segment without a generation."""
    assert fmt.segment_name(3) == "sf-0000000000000003.sfa"
    assert fmt.segment_name(0xABC) == "sf-0000000000000abc.sfa"
    assert fmt.segment_generation("sf-00000000000000ff.sfa") == 255
    assert fmt.segment_generation("sf-initial.sfa") is None
    assert fmt.is_segment_name("sf-initial.sfa")
    for bad in ("sf-00000000000000FF.sfa", "sf-1.sfa", "x.sfa", ".ack-watermark", ".lock"):
        assert not fmt.is_segment_name(bad)
    with pytest.raises(BadArgument):
        fmt.segment_generation("sf-1.sfa")
    with pytest.raises(BadArgument):
        fmt.segment_name(-1)


def test_SF_3_header_rejections() -> None:
    """SF-3, SF-8: bad magic, version, negative baseSeq and short headers are Corrupt."""
    with pytest.raises(Corrupt, match="magic"):
        fmt.decode_header(header(0, magic=b"SF02"))
    with pytest.raises(Corrupt, match="version"):
        fmt.decode_header(header(0, version=2))
    with pytest.raises(Corrupt, match="negative baseSeq"):
        fmt.decode_header(header(-1))
    with pytest.raises(Corrupt, match="at least 24"):
        fmt.decode_header(header(0)[:20])
    with pytest.raises(BadArgument):
        fmt.encode_header(-1, 0)


# --- the frame walk (SF-7) ---------------------------------------------------------------------
def test_SF_7_scan_stops_at_overrun_negative_length_and_bad_crc() -> None:
    """SF-7: the walk stops at the first frame whose length overruns the file or is negative,
    or whose CRC does not match; everything before it is kept."""
    good = [fr(0), fr(1)]
    clean = segment(0, good)
    scan = fmt.scan_frames(clean)
    assert len(scan.offsets) == 2 and scan.torn_tail == 0
    assert scan.last_good == 24 + sum(8 + len(p) for p in good)
    overrun = segment(0, good, tail=struct.pack("<Ii", 0, 10_000))
    assert len(fmt.scan_frames(overrun).offsets) == 2
    negative = segment(0, good, tail=struct.pack("<Ii", 0, -1))
    assert len(fmt.scan_frames(negative).offsets) == 2
    bad = bytearray(segment(0, [*good, fr(2)]))
    bad[fmt.scan_frames(clean).last_good + 8] ^= 0xFF  # a payload byte of the third frame
    scan = fmt.scan_frames(bytes(bad))
    assert len(scan.offsets) == 2 and scan.torn_tail > 0
    # Zero-filled space never parses as a frame: crc32c of four zero bytes is not 0.
    assert len(fmt.scan_frames(header(0) + bytes(100)).offsets) == 0


def test_SF_7_torn_tail_counts_nonzero_bytes_in_the_next_eight() -> None:
    """SF-7: the torn-tail count looks at [lastGood, lastGood + min(8, size - lastGood))."""
    assert fmt.torn_tail_bytes(b"\0" * 30, 24) == 0
    assert fmt.torn_tail_bytes(b"\0" * 24 + b"\1\0\2", 24) == 2
    assert fmt.torn_tail_bytes(b"\0" * 24 + b"\1" * 20, 24) == 8
    assert fmt.torn_tail_bytes(b"\0" * 24, 24) == 0


# --- recovery over hand-built slots (SF-7..SF-10, FSN-5) ------------------------------------
def test_SF_10_clean_contiguous_slot(tmp_path: Path) -> None:
    """SF-10, FSN-5: sorted by baseSeq (not by name), contiguous; ackedFsn = lowestBase - 1."""
    slot = make_slot(
        tmp_path,
        {
            "sf-0000000000000009.sfa": segment(10, [fr(10), fr(11)]),  # names need not sort
            "sf-0000000000000002.sfa": segment(12, [fr(12)]),
        },
    )
    rec = recover(OsFS(), str(slot))
    assert [s.base_seq for s in rec.segments] == [10, 12]
    assert (rec.acked_fsn, rec.published_fsn) == (9, 12) == model_seed([(10, 2), (12, 1)], None)
    assert rec.next_generation == 10 and not rec.watermark_used and rec.torn_tails == 0


def test_SF_10_gap_refuses_recovery(tmp_path: Path) -> None:
    """SF-10, FSN-5: prev.baseSeq + prev.frameCount != next.baseSeq is fatal, clearly."""
    slot = make_slot(
        tmp_path,
        {
            "sf-0000000000000000.sfa": segment(0, [fr(0), fr(1)]),
            "sf-0000000000000001.sfa": segment(3, [fr(3)]),
        },
    )
    with pytest.raises(Corrupt, match="not contiguous"):
        recover(OsFS(), str(slot))
    with pytest.raises(Corrupt):
        Slot.open(str(tmp_path), "s1")
    # The refused slot is not left locked.
    h = OsFS().open(str(slot / ".lock"))
    h.lock()
    h.close()


def test_SF_10_a_torn_frame_mid_slot_becomes_a_gap(tmp_path: Path) -> None:
    """SF-7, SF-10: a bad CRC inside a sealed segment cuts it short; the next segment then
    leaves a gap, and recovery refuses rather than skipping frames."""
    seg = bytearray(segment(0, [fr(0), fr(1)]))
    seg[24 + 8] ^= 0x01  # first payload byte of frame 0
    slot = make_slot(
        tmp_path,
        {"sf-0000000000000000.sfa": bytes(seg), "sf-0000000000000001.sfa": segment(2, [fr(2)])},
    )
    with pytest.raises(Corrupt, match="not contiguous"):
        recover(OsFS(), str(slot))


def test_SF_7_torn_tails_zero_and_garbage(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """SF-7: a clean partial fill reports no torn tail; a half-written frame is reported with a
    WARNING naming the count, and the frames before it are recovered."""
    partial = frame(fr(1))[:11]  # crc, length and 3 payload bytes
    nonzero = 8 - partial[:8].count(0)
    torn = segment(0, [fr(0)], tail=partial)
    slot = make_slot(tmp_path, {"sf-0000000000000000.sfa": torn})
    with caplog.at_level(logging.WARNING, logger="tidelog.sf"):
        rec = recover(OsFS(), str(slot))
    assert rec.segments[0].frame_count == 1 and rec.segments[0].torn_tail == nonzero > 0
    assert "torn tail" in caplog.text and f"{nonzero} non-zero bytes" in caplog.text
    assert (rec.acked_fsn, rec.published_fsn) == (-1, 0)
    caplog.clear()
    slot2 = make_slot(tmp_path, {"sf-0000000000000000.sfa": segment(0, [fr(0)])}, "s2")
    with caplog.at_level(logging.WARNING, logger="tidelog.sf"):
        assert recover(OsFS(), str(slot2)).torn_tails == 0
    assert "torn tail" not in caplog.text


def test_SF_7_garbage_tail_never_yields_frames(tmp_path: Path) -> None:
    """SF-7: random bytes after the last good frame are never returned as frames."""
    import random

    rng = random.Random(7)
    for i in range(50):
        garbage = rng.randbytes(rng.randint(1, 200))
        data = segment(0, [fr(0), fr(1)], tail=garbage, size=512)
        make_slot(tmp_path, {"sf-0000000000000000.sfa": data}, f"g{i}")
        with Slot.open(str(tmp_path), f"g{i}") as s:
            got = s.read(0, 100)
        assert got[:2] == [fr(0), fr(1)]
        assert len(got) == 2 or got[2] == garbage[8 : 8 + len(got[2])]  # only a CRC-valid frame


@pytest.mark.parametrize(
    ("data", "match"),
    [
        (header(0, magic=b"XXXX") + bytes(100), "magic"),
        (header(0, version=9) + bytes(100), "version"),
        (header(-7) + bytes(100), "negative baseSeq"),
        (b"\1" * 10, "shorter than a segment header"),
    ],
    ids=["bad-magic", "bad-version", "negative-baseSeq", "short"],
)
def test_SF_8_invalid_segments_fail_closed(tmp_path: Path, data: bytes, match: str) -> None:
    """SF-8: an invalid segment refuses recovery (never skip silently)."""
    slot = make_slot(
        tmp_path, {"sf-0000000000000000.sfa": segment(0, [fr(0)]), "sf-0000000000000001.sfa": data}
    )
    with pytest.raises(Corrupt, match=match):
        recover(OsFS(), str(slot))


def test_SF_8_all_zero_file_is_an_unborn_segment(tmp_path: Path) -> None:
    """SF-8: a file of zeros (a crash between create and header) holds no frame: it is
    reported, removed at open, and still counts for the next generation."""
    slot = make_slot(
        tmp_path,
        {
            "sf-0000000000000000.sfa": segment(0, [fr(0)]),
            "sf-0000000000000007.sfa": bytes(512),
            "sf-0000000000000008.sfa": b"",
        },
    )
    rec = recover(OsFS(), str(slot))
    assert rec.unborn == ["sf-0000000000000007.sfa", "sf-0000000000000008.sfa"]
    assert rec.next_generation == 9 and rec.published_fsn == 0
    with Slot.open(str(tmp_path), "s1", max_bytes=64, max_total_bytes=1024) as s:
        assert not (slot / "sf-0000000000000007.sfa").exists()
        while len(s.segment_names()) < 2:
            s.append(b"y" * 20)
        assert s.segment_names()[1] == "sf-0000000000000009.sfa"


def test_SF_10_watermark_is_used_only_within_published(tmp_path: Path) -> None:
    """SF-10, FSN-5: ackedFsn = max(lowestBase - 1, watermark) with watermark <= publishedFsn;
    a watermark above the frames on disk is corruption and is ignored."""
    segs = {"sf-0000000000000000.sfa": segment(5, [fr(5), fr(6), fr(7)])}
    cases = [
        (watermark(6), 6, True),  # inside the lowest segment: suppresses replay
        (watermark(2), 4, False),  # stale (trim ran first): lowestBase - 1 wins
        (watermark(7), 7, True),  # everything acked
        (watermark(8), 4, False),  # above publishedFsn: corrupt, ignored
        (watermark(1 << 40), 4, False),
        (watermark(6, magic=0), 4, False),  # never stamped
        (watermark(6, reserved=3), 4, False),
        (watermark(6)[:9], 4, False),  # torn
    ]
    for i, (wm, acked, used) in enumerate(cases):
        slot = make_slot(tmp_path, {**segs, WATERMARK_FILE: wm}, f"w{i}")
        rec = recover(OsFS(), str(slot))
        assert (rec.acked_fsn, rec.published_fsn) == (acked, 7), i
        assert rec.watermark_used is used, i
        assert rec.acked_fsn == model_seed([(5, 3)], fmt.decode_watermark(wm))[0]


def test_SF_5_legacy_initial_segment_is_accepted(tmp_path: Path) -> None:
    """SF-5: sf-initial.sfa is recovered like any segment and skipped when seeding generations."""
    slot = make_slot(
        tmp_path,
        {
            "sf-initial.sfa": segment(0, [fr(0), fr(1)]),
            "sf-0000000000000003.sfa": segment(2, [fr(2)]),
        },
    )
    rec = recover(OsFS(), str(slot))
    assert [s.generation for s in rec.segments] == [None, 3]
    assert (rec.acked_fsn, rec.published_fsn, rec.next_generation) == (-1, 2, 4)
    only = make_slot(tmp_path, {"sf-initial.sfa": segment(0, [fr(0)])}, "legacy")
    assert recover(OsFS(), str(only)).next_generation == 0
    with Slot.open(str(tmp_path), "legacy") as s:
        assert s.read(0) == [fr(0)]


def test_SF_10_empty_slot_is_a_fresh_start(tmp_path: Path) -> None:
    """SF-10, FSN-5: no segments -> ackedFsn = publishedFsn = -1, and a stale watermark from a
    fully drained session is removed."""
    slot = make_slot(tmp_path, {WATERMARK_FILE: watermark(99)})
    rec = recover(OsFS(), str(slot))
    assert (rec.acked_fsn, rec.published_fsn) == (-1, -1) == model_seed([], 99)
    with Slot.open(str(tmp_path), "s1") as s:
        assert not (slot / WATERMARK_FILE).exists()
        assert s.append(b"x") == 0


def test_SF_9_torn_tail_is_zeroed_before_appending(tmp_path: Path) -> None:
    """SF-9: frames F0, torn F1, intact F2 on disk. Reopen, append G1 as long as F1: without
    the zeroing, F2 (a stale frame of the previous session) would read back as FSN 2."""
    f1, f2 = b"A" * 20, b"stale frame"
    torn = bytearray(frame(f1))
    torn[10] ^= 0xFF
    data = segment(0, [fr(0)], tail=bytes(torn) + frame(f2))
    slot = make_slot(tmp_path, {"sf-0000000000000000.sfa": data})
    with Slot.open(str(tmp_path), "s1") as s:
        assert s.published_fsn == 0
        assert s.append(b"B" * 20) == 1
    raw = (slot / "sf-0000000000000000.sfa").read_bytes()
    end = 24 + len(frame(fr(0))) + len(frame(b"B" * 20))
    assert raw[end:].count(0) == len(raw) - end  # the stale bytes are gone
    with Slot.open(str(tmp_path), "s1") as s:
        assert s.read(0, 10) == [fr(0), b"B" * 20] and s.published_fsn == 1


# --- the slot at work (SF-1, SF-2, SF-5, SF-11..SF-16) --------------------------------------
def test_SF_1_sender_id_rules() -> None:
    """SF-1: a sender_id is one directory name."""
    assert check_sender_id("edge-7") == "edge-7"
    for bad in ("", "a/b", "a\\b", ".", "..", "x\0y", "tab\t", 7):
        with pytest.raises(BadArgument):
            check_sender_id(bad)


def test_SF_2_lock_names_the_holder_and_files_stay(tmp_path: Path) -> None:
    """SF-2: a second engine on the slot fails naming the holder PID; .lock.pid holds PID and a
    newline; neither file is removed on close; a missing .lock.pid reports holder=unknown."""
    s = Slot.open(str(tmp_path), "a")
    slot = tmp_path / "a"
    assert (slot / ".lock.pid").read_text("utf-8") == f"{os.getpid()}\n"
    with pytest.raises(Locked, match=f"holder={os.getpid()}"):
        Slot.open(str(tmp_path), "a")
    (slot / ".lock.pid").unlink()
    with pytest.raises(Locked, match="holder=unknown"):
        Slot.open(str(tmp_path), "a")
    s.close()
    assert (slot / ".lock").exists()
    Slot.open(str(tmp_path), "a").close()
    assert (slot / ".lock").exists() and (slot / ".lock.pid").exists()


def test_SF_5_segments_are_preallocated_and_rotate(tmp_path: Path) -> None:
    """SF-5, SF-3: each segment is created at sf_max_bytes (zero tail), baseSeq = first FSN,
    generations count up; reads cross segment boundaries."""
    with Slot.open(str(tmp_path), "a", max_bytes=128, max_total_bytes=4096) as s:
        for i in range(20):
            assert s.append(fr(i)) == i
        names = s.segment_names()
        assert names == [fmt.segment_name(g) for g in range(len(names))] and len(names) > 2
        assert s.read(0, 100) == [fr(i) for i in range(20)]
        assert s.read(5, 3) == [fr(5), fr(6), fr(7)]
        assert s.read(20) == []
    for name in names:
        raw = (tmp_path / "a" / name).read_bytes()
        assert len(raw) == 128
        base = fmt.decode_header(raw).base_seq
        scan = fmt.scan_frames(raw)
        assert raw[scan.last_good :].count(0) == 128 - scan.last_good
        assert base == sum(len(fmt.scan_frames((tmp_path / "a" / n).read_bytes()).offsets)
                           for n in names[: names.index(name)])  # fmt: skip


@pytest.mark.parametrize("fallocate", ["native", "unsupported"])
def test_SF_5_segments_hold_real_blocks_not_a_sparse_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fallocate: str
) -> None:
    """SF-5: a new segment's blocks are reserved at create time (posix_fallocate;
    where the file system has none, by writing the zeros): the file is never sparse, so a full
    disk fails the creation and never a later append."""
    size = 1 << 20
    if fallocate == "unsupported":

        def no_fallocate(fd: int, offset: int, length: int) -> None:
            raise OSError(errno.EOPNOTSUPP, "Operation not supported")

        monkeypatch.setattr(os, "posix_fallocate", no_fallocate)
    with Slot.open(str(tmp_path), "a", max_bytes=size, max_total_bytes=4 * size) as s:
        s.append(b"one frame")
        (name,) = s.segment_names()
    st = os.stat(tmp_path / "a" / name)
    assert st.st_size == size
    assert st.st_blocks * 512 >= size, f"sparse: {st.st_blocks * 512} bytes of blocks"


def test_SF_4_sealed_segments_are_read_through_a_map(tmp_path: Path) -> None:
    """SF-4, SF-7: recovery maps every segment; a sealed segment stays
    mapped (read-only) until it is trimmed and its frames are read from the mapping; the
    active one is read with pread (it is still being written)."""
    maps: list[str] = []

    class Counted:
        def __init__(self, inner: Any) -> None:
            self.inner = inner

        def map(self) -> memoryview:
            maps.append(os.path.basename(self.inner.path).removesuffix(".tmp"))
            return self.inner.map()  # type: ignore[no-any-return]

        def __getattr__(self, name: str) -> Any:
            return getattr(self.inner, name)

    class CountingFS(OsFS):
        def open(self, path: str, *, create: bool = True) -> Any:
            return Counted(super().open(path, create=create))

        def open_read(self, path: str) -> Any:
            return Counted(super().open_read(path))

    with Slot.open(str(tmp_path), "a", fs=CountingFS(), max_bytes=128, max_total_bytes=4096) as s:
        for i in range(30):
            s.append(fr(i))
        names = s.segment_names()
        assert len(names) >= 3 and maps == names[:-1]  # sealed at rotation
        views = [seg.view for seg in s._segments]
        assert all(isinstance(v, memoryview) for v in views[:-1]) and views[-1] is None
        assert s.read(0, 100) == [fr(i) for i in range(30)]
    maps.clear()
    with Slot.open(str(tmp_path), "a", fs=CountingFS(), max_bytes=128, max_total_bytes=4096) as s:
        # recovery maps each segment once; adoption maps the sealed ones again
        assert sorted(maps) == sorted(names + names[:-1])
        assert s.read(0, 100) == [fr(i) for i in range(30)]
        s.acknowledge(s.published_fsn)
        s.apply_acks()
        assert [seg.view for seg in s._segments] == [None]  # trimmed ones were unmapped


def test_SF_5_enospc_at_creation_unlinks_the_file(tmp_path: Path) -> None:
    """SF-5, SF-19: block reservation fails cleanly at create time, leaving no partial segment;
    the slot is poisoned until reopened."""

    class Full:
        """A handle whose block reservation fails as on a full disk."""

        def __init__(self, inner: Any) -> None:
            self.inner = inner

        def allocate(self, size: int) -> None:
            raise OSError(errno.ENOSPC, "No space left on device")

        def __getattr__(self, name: str) -> Any:
            return getattr(self.inner, name)

    class FullFS(OsFS):
        def open(self, path: str, *, create: bool = True) -> Any:
            h = super().open(path, create=create)
            return Full(h) if ".sfa" in path else h

    s = Slot.open(str(tmp_path), "a", fs=FullFS())
    with pytest.raises(StorageError, match="disk full") as info:
        s.append(b"x")
    assert info.value.errno == errno.ENOSPC
    assert not [n for n in os.listdir(tmp_path / "a") if ".sfa" in n]
    # SF-19: the failure poisons the slot; close releases it and raises; reopening works.
    with pytest.raises(StorageError, match="poisoned"):
        s.append(b"x")
    with pytest.raises(StorageError, match="poisoned"):
        s.close()
    with Slot.open(str(tmp_path), "a") as again:
        assert again.append(b"x") == 0


def test_SF_12_SF_13_trim_keeps_the_active_segment(tmp_path: Path) -> None:
    """SF-12: acknowledged sealed segments are unlinked after the watermark is written; SF-13:
    the active segment stays even when fully acknowledged, so FSNs continue after a restart
    (slot format 1: SF-23; format 2's trim is SF-29's)."""
    with Slot.open(str(tmp_path), "a", max_bytes=128, max_total_bytes=4096, slot_format=1) as s:
        for i in range(12):
            s.append(fr(i))
        first = s.segment_names()
        s.acknowledge(5)
        assert s.apply_acks() >= 1
        assert fmt.decode_watermark((tmp_path / "a" / WATERMARK_FILE).read_bytes()) == 5
        assert s.lowest_fsn() <= 6 and s.read(6, 1) == [fr(6)]
        s.acknowledge(100)  # clamped to publishedFsn (FSN-3)
        assert s.acked_fsn == 11
        s.apply_acks()
        assert s.segment_names() == first[-1:]
    with Slot.open(str(tmp_path), "a", max_bytes=128, max_total_bytes=4096, slot_format=1) as s:
        assert (s.acked_fsn, s.published_fsn) == (11, 11)
        assert s.append(b"next") == 12  # numbering continues (SF-13)
        assert s.read(12) == [b"next"]


def test_SF_14_backpressure_and_too_large(tmp_path: Path) -> None:
    """SF-14: the cap covers every segment; a full slot waits for trim up to the deadline, then
    raises Backpressure; a frame that cannot fit a segment is TooLarge; cap >= 2 segments."""
    with pytest.raises(BadArgument, match="two segments"):
        Slot.open(str(tmp_path), "x", max_bytes=128, max_total_bytes=200)
    with Slot.open(str(tmp_path), "a", max_bytes=64, max_total_bytes=128) as s:
        s.backpressure_reason = lambda: "custom reason"
        with pytest.raises(TooLarge):
            s.append(b"x" * 40)
        n = 0
        with pytest.raises(Backpressure, match="custom reason"):
            while True:
                s.append(fr(n), deadline_ms=0)
                n += 1
        assert s.backpressure_stalls == 1 and s.published_fsn == n - 1
        s.acknowledge(s.published_fsn)
        s.apply_acks()
        assert s.append(b"room", deadline_ms=0) == n


def test_SF_14_backpressure_waits_for_trim(tmp_path: Path) -> None:
    """SF-14: an append blocked on the cap proceeds as soon as a trim frees a segment."""
    import threading

    with Slot.open(str(tmp_path), "a", max_bytes=64, max_total_bytes=128) as s:
        while s.stats().segments < 2 or s.stats().total_bytes < 128:
            s.append(b"0123456789")
        s.append(b"0123456789") if s.read(s.published_fsn) else None
        result: list[int] = []
        t = threading.Thread(target=lambda: result.append(s.append(b"z" * 30, deadline_ms=30_000)))
        t.start()
        s.acknowledge(s.published_fsn)
        s.apply_acks()
        t.join(30)
        assert result and s.read(result[0]) == [b"z" * 30]


def test_SF_11_durabilities_sync_where_they_say(tmp_path: Path) -> None:
    """SF-11: memory never syncs; flush syncs on flush(); append syncs every append."""
    from tidelog.conformance.crashfs import RecordingFS

    for durability, appends_synced, flush_synced in (
        ("memory", False, False),
        ("flush", False, True),
        ("append", True, True),
    ):
        fs = RecordingFS(dirs=["/sf"])
        with Slot.open("/sf", "a", fs=fs, max_bytes=256, durability=durability) as s:
            s.append(b"zero")  # creates the segment (flush/append sync its header there)
            before = fs.stats.fdatasyncs
            s.append(b"one")
            assert (fs.stats.fdatasyncs > before) == appends_synced, durability
            before = fs.stats.fdatasyncs
            s.flush()
            assert (fs.stats.fdatasyncs > before) == (flush_synced and not appends_synced)
    with pytest.raises(BadArgument):
        Slot.open(str(tmp_path), "a", durability="sometimes")


def test_SF_16_failed_sentinel(tmp_path: Path) -> None:
    """SF-16: .failed holds a UTF-8 reason; a drainer opening a refused slot writes it while
    still holding the lock; the foreground sender ignores it."""
    slot = make_slot(
        tmp_path,
        {"sf-0000000000000000.sfa": segment(0, [fr(0)]), "sf-0000000000000001.sfa": segment(5, [])},
    )
    with pytest.raises(Corrupt):
        Slot.open(str(tmp_path), "s1", fail_marker=True)
    assert "recovery refused" in (slot / FAILED_FILE).read_text("utf-8")
    write_failed(OsFS(), str(slot), "operator note")
    assert (slot / FAILED_FILE).read_text("utf-8") == "operator note\n"
    ok = make_slot(tmp_path, {FAILED_FILE: b"old", "sf-0000000000000000.sfa": segment(0, [])}, "o")
    Slot.open(str(tmp_path), "o").close()  # the foreground does not care
    assert (ok / FAILED_FILE).exists()


# --- sf:// (SF-15) ----------------------------------------------------------------------------
def test_SF_15_sf_uri_is_a_one_topic_store(tmp_path: Path) -> None:
    """SF-15: sf:///<sf_dir>/<sender_id> exposes topic "frames": seq = FSN + 1, no labels;
    subscribers, queue mode, deletes and other topics are not_available; options validated."""
    from tidelog import registry

    assert (
        registry.BUILTIN["sf"] == "tidelog.backends.sf:open_backend"
    )  # no import needed to use it
    uri = f"sf://{tmp_path}/edge?sf_max_bytes=256&sf_durability=append"
    with tidelog.open(uri) as store:
        assert store.topics() == ["frames"]
        frames = store.topic("frames")
        assert frames.append_many([b"a", b"b"]) == [1, 2]
        assert frames.append(b"c") == 3
        items = frames.read(after=1)
        assert [(r.seq, r.payload, r.tag, r.node) for r in items] == [
            (2, b"b", None, None),
            (3, b"c", None, None),
        ]
        st = frames.state()
        assert (st.head_seq, st.earliest_seq, st.count, st.bytes) == (3, 1, 3, 3)
        assert store.capabilities.durability == frozenset({"fsync"})
        assert not store.capabilities.subscribers
        for call in (
            lambda: frames.subscribe("x"),
            lambda: frames.append(b"x", tag="t"),
            lambda: frames.delete(before_seq=2),
            lambda: store.topic("other"),
            lambda: frames.claim("n"),
        ):
            with pytest.raises(NotAvailable):
                call()
        with pytest.raises(tidelog.ConfigMismatch):
            store.topic("frames", durability="disk")
    with Slot.open(str(tmp_path), "edge") as s:  # the same bytes as any SF client
        assert s.read(0, 10) == [b"a", b"b", b"c"]
        s.acknowledge(0)
    with tidelog.open(f"sf://{tmp_path}/edge") as store:
        assert [r.seq for r in store.topic("frames").read()] == [1, 2, 3]  # retained (SF-13)
    with pytest.raises(tidelog.BadOption):
        tidelog.open(f"sf://{tmp_path}/edge?wal_shards=2")
    with pytest.raises(tidelog.BadURI):
        tidelog.open("sf://edge")
