"""Byte layouts of a QuestDB store-and-forward slot (spec/FORWARD.md SF-1..SF-6).

Pure codecs, no I/O: the 24-byte segment header, the CRC-32C frame envelope, the 16-byte
``.ack-watermark`` record, segment file names, and the recovery walk over a segment's bytes.
Every multi-byte integer is little-endian and written explicitly so (SF-3, SF-4: the
reference client relies on native order; portable clients must not).

``scan_frames`` is on the recovery path and must survive anything a crash leaves behind: it never
raises and never yields a frame whose checksum fails.

The sync record and the watermark check (spec/FORWARD.md SF-17) are tidelog's own, in
``.tidelog-sync``: the segment and watermark bytes stay exactly SF-3..SF-6's.
"""

from __future__ import annotations

import re
import struct
from array import array
from typing import Final, NamedTuple

import crc32c as _crc32c

from tidelog.errors import BadArgument, Corrupt

__all__ = [
    "SEGMENT_MAGIC",
    "SEGMENT_VERSION",
    "HEADER_SIZE",
    "FRAME_HEADER_SIZE",
    "WATERMARK_MAGIC",
    "WATERMARK_SIZE",
    "LEGACY_SEGMENT",
    "SegmentHeader",
    "FrameScan",
    "crc32c",
    "encode_header",
    "decode_header",
    "encode_frame",
    "scan_frames",
    "torn_tail_bytes",
    "encode_watermark",
    "decode_watermark",
    "segment_name",
    "is_segment_name",
    "segment_generation",
    "frame_end",
    "SYNC_MAGIC",
    "SYNC_RECORD_SIZE",
    "SYNC_COPY_OFFSETS",
    "WMCHECK_OFFSET",
    "WMCHECK_SIZE",
    "SyncRecord",
    "encode_sync_record",
    "decode_sync_record",
    "encode_watermark_check",
    "decode_watermark_check",
]

SEGMENT_MAGIC: Final = 0x31304653  # b"SF01" read as a little-endian uint32
SEGMENT_VERSION: Final = 1
HEADER_SIZE: Final = 24
FRAME_HEADER_SIZE: Final = 8  # crc32c (u32) + payloadLen (i32)
WATERMARK_MAGIC: Final = 0x31574B41  # b"AKW1" little-endian
WATERMARK_SIZE: Final = 16
LEGACY_SEGMENT: Final = "sf-initial.sfa"
MAX_GENERATION: Final = (1 << 64) - 1

# magic u32 | version u8 | flags u8 | reserved u16 | baseSeq (u64 on the wire, read signed so a
# set top bit is the "negative baseSeq" the scanner must refuse) | createdMicros i64
_HEADER: Final = struct.Struct("<IBBHqq")
_FRAME_HEAD: Final = struct.Struct("<Ii")
_LEN: Final = struct.Struct("<i")
_WATERMARK: Final = struct.Struct("<IIq")
_SEGMENT_RE: Final = re.compile(r"sf-([0-9a-f]{16})\.sfa")

# SF-17: .tidelog-sync. Two copies of the sync record (in separate 4 KiB blocks, so a torn write
# of one never touches the other), then the watermark check in a block of its own.
SYNC_MAGIC: Final = 0x31534C54  # b"TLS1" little-endian
SYNC_RECORD_SIZE: Final = 64
SYNC_COPY_OFFSETS: Final = (0, 4096)
SYNC_APPEND: Final = 1  # flags bit 0: every frame from syncedEnd on was synced before the next
SYNC_LEGACY: Final = 2  # flags bit 1: the segment is sf-initial.sfa
WMCHECK_MAGIC: Final = 0x31574C54  # b"TLW1" little-endian
WMCHECK_OFFSET: Final = 8192
WMCHECK_SIZE: Final = 16
# magic u32 | flags u8 | 3 reserved | counter u64 | generation u64 | baseSeq i64 |
# createdMicros i64 | syncedEnd i64 | syncedFrames i64 | reserved u32 ; then crc32c u32
_SYNC: Final = struct.Struct("<IB3xQQqqqq4x")
_WMCHECK: Final = struct.Struct("<IIq")

assert _HEADER.size == HEADER_SIZE and _WATERMARK.size == WATERMARK_SIZE
assert _SYNC.size + 4 == SYNC_RECORD_SIZE and _WMCHECK.size == WMCHECK_SIZE


def crc32c(data: bytes | bytearray | memoryview) -> int:
    """CRC-32C (Castagnoli, reflected, init and final xor 0xFFFFFFFF): ``crc32c(b"123456789")``
    is ``0xE3069283``."""
    return int(_crc32c.crc32c(data))


class SegmentHeader(NamedTuple):
    base_seq: int
    created_micros: int


def encode_header(base_seq: int, created_micros: int, flags: int = 0) -> bytes:
    """The 24-byte segment header (SF-3); ``flags`` is 0 in slot format 1 and
    ``MANIFEST_REQUIRED`` in slot format 2 (SF-25)."""
    if base_seq < 0 or base_seq >= 1 << 63:
        raise BadArgument(f"baseSeq must be in [0, 2**63), got {base_seq}")
    return _HEADER.pack(SEGMENT_MAGIC, SEGMENT_VERSION, flags, 0, base_seq, created_micros)


def decode_header(data: bytes | bytearray | memoryview, where: str = "segment") -> SegmentHeader:
    """Validate and decode a segment header (SF-7); ``Corrupt`` names the field.

    ``flags`` and ``reserved`` are not checked: SF-7 validates only magic, version and baseSeq,
    and a later revision of the format gives header byte 5 a meaning (SF-3).
    """
    if len(data) < HEADER_SIZE:
        raise Corrupt(f"{where}: {len(data)} bytes, a segment needs at least {HEADER_SIZE}")
    magic, version, _flags, _reserved, base_seq, created = _HEADER.unpack_from(data, 0)
    if magic != SEGMENT_MAGIC:
        raise Corrupt(f"{where}: bad magic 0x{magic:08x} (expected 0x{SEGMENT_MAGIC:08x} 'SF01')")
    if version != SEGMENT_VERSION:
        raise Corrupt(f"{where}: unsupported version {version} (expected {SEGMENT_VERSION})")
    if base_seq < 0:
        raise Corrupt(f"{where}: negative baseSeq {base_seq}")
    return SegmentHeader(base_seq, created)


def encode_frame(payload: bytes | bytearray | memoryview) -> bytes:
    """One frame: crc32c(payloadLen || payload), payloadLen, payload (SF-4)."""
    n = len(payload)
    if n >= 1 << 31:
        raise BadArgument(f"frame payload of {n} bytes does not fit an int32 length")
    body = _LEN.pack(n) + bytes(payload)
    return crc32c(body).to_bytes(4, "little") + body


class FrameScan(NamedTuple):
    """Result of walking a segment's frames (SF-7)."""

    offsets: array[int]  # start offset of every verified frame, in order (typecode "q")
    last_good: int  # end of the last verified frame: the append cursor
    torn_tail: int  # non-zero bytes in the 8 bytes after last_good (0 = clean)


def frame_end(data: bytes | bytearray | memoryview, pos: int, *, check: bool = True) -> int | None:
    """The end of the frame at ``pos``, or None when its length is negative or overruns the data
    (SF-4, SF-7: a torn-tail boundary) or, with ``check``, its CRC does not match. Never raises."""
    view = memoryview(data)
    size = len(view)
    if pos < 0 or pos + FRAME_HEADER_SIZE > size:
        return None
    crc, n = _FRAME_HEAD.unpack_from(view, pos)
    if n < 0 or n > size - pos - FRAME_HEADER_SIZE:
        return None
    if check and crc32c(view[pos + 4 : pos + FRAME_HEADER_SIZE + n]) != crc:
        return None
    return pos + FRAME_HEADER_SIZE + int(n)


def scan_frames(data: bytes | bytearray | memoryview) -> FrameScan:
    """Walk frames from offset 24 until one overruns the file or fails its CRC. Never raises."""
    view = memoryview(data)
    size = len(view)
    offsets = array("q")
    pos = HEADER_SIZE
    while (end := frame_end(view, pos)) is not None:
        offsets.append(pos)
        pos = end
    last_good = min(pos, size) if size >= HEADER_SIZE else size
    return FrameScan(offsets, last_good, torn_tail_bytes(view, last_good))


def torn_tail_bytes(data: bytes | bytearray | memoryview, last_good: int) -> int:
    """How many of the bytes in ``[last_good, last_good + min(8, size - last_good))`` are
    non-zero: a writer attempted a frame there and did not finish it (SF-7)."""
    window = bytes(data[last_good : last_good + FRAME_HEADER_SIZE])
    return len(window) - window.count(0)


def encode_watermark(fsn: int) -> bytes:
    """The 16-byte ``.ack-watermark`` record (SF-6): magic, reserved 0, fsn."""
    return _WATERMARK.pack(WATERMARK_MAGIC, 0, fsn)


def decode_watermark(data: bytes | bytearray | memoryview) -> int | None:
    """The watermark FSN, or None when the record is unusable (short, bad magic, non-zero
    reserved word, negative FSN): recovery then falls back to ``lowestBaseSeq - 1`` (SF-6).
    """
    if len(data) < WATERMARK_SIZE:
        return None
    magic, reserved, fsn = _WATERMARK.unpack_from(data, 0)
    if magic != WATERMARK_MAGIC or reserved != 0 or fsn < 0:
        return None
    return int(fsn)


def segment_name(generation: int) -> str:
    """``sf-<gen:016x>.sfa`` (SF-5)."""
    if not 0 <= generation <= MAX_GENERATION:
        raise BadArgument(f"generation {generation} outside 0..2**64-1")
    return f"sf-{generation:016x}.sfa"


def is_segment_name(name: str) -> bool:
    """Whether ``name`` is a segment file: ``sf-<16 hex>.sfa`` or the legacy ``sf-initial.sfa``."""
    return name == LEGACY_SEGMENT or _SEGMENT_RE.fullmatch(name) is not None


def segment_generation(name: str) -> int | None:
    """The generation encoded in a segment file name; None for ``sf-initial.sfa``, which has
    none and is skipped when seeding the next generation (SF-5)."""
    m = _SEGMENT_RE.fullmatch(name)
    if m is None:
        if name == LEGACY_SEGMENT:
            return None
        raise BadArgument(f"{name!r} is not a segment file name")
    return int(m.group(1), 16)


class SyncRecord(NamedTuple):
    """What a slot made durable in one segment (SF-17): every byte below ``synced_end`` (a frame
    boundary, ``synced_frames`` frames above the header) was durable when it was written."""

    counter: int
    generation: int | None  # None: the legacy sf-initial.sfa
    base_seq: int
    created_micros: int
    synced_end: int
    synced_frames: int
    append: bool  # every later frame of the segment was synced before the next was written


def encode_sync_record(rec: SyncRecord) -> bytes:
    """The 64-byte sync record: fields, then CRC-32C over them (SF-17)."""
    flags = (SYNC_APPEND if rec.append else 0) | (SYNC_LEGACY if rec.generation is None else 0)
    body = _SYNC.pack(
        SYNC_MAGIC, flags, rec.counter, rec.generation or 0, rec.base_seq, rec.created_micros,
        rec.synced_end, rec.synced_frames,
    )  # fmt: skip
    return body + crc32c(body).to_bytes(4, "little")


def decode_sync_record(data: bytes | bytearray | memoryview) -> SyncRecord | None:
    """A sync record, or None when short, of another magic, or its CRC fails (never raises)."""
    if len(data) < SYNC_RECORD_SIZE:
        return None
    body = bytes(data[: _SYNC.size])
    magic, flags, counter, gen, base, created, end, frames = _SYNC.unpack(body)
    stored = int.from_bytes(data[_SYNC.size : SYNC_RECORD_SIZE], "little")
    if magic != SYNC_MAGIC or crc32c(body) != stored:
        return None
    legacy = bool(flags & SYNC_LEGACY)
    return SyncRecord(counter, None if legacy else gen, base, created, end, frames,
                      bool(flags & SYNC_APPEND))  # fmt: skip


def _wmcheck_crc(fsn_bytes: bytes) -> int:
    return crc32c(WMCHECK_MAGIC.to_bytes(4, "little") + fsn_bytes)


def encode_watermark_check(fsn: int) -> bytes:
    """The 16-byte watermark check (SF-17): magic, CRC-32C over magic and fsn, fsn."""
    raw = fsn.to_bytes(8, "little", signed=True)
    return _WMCHECK.pack(WMCHECK_MAGIC, _wmcheck_crc(raw), fsn)


def decode_watermark_check(data: bytes | bytearray | memoryview) -> int | None:
    """The checked FSN, or None when short, of another magic or its CRC fails."""
    if len(data) < WMCHECK_SIZE:
        return None
    magic, crc, fsn = _WMCHECK.unpack_from(data, 0)
    if magic != WMCHECK_MAGIC or crc != _wmcheck_crc(bytes(data[8:16])) or fsn < 0:
        return None
    return int(fsn)
