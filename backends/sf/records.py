"""Slot format 2's dual-slot record files and header flags (spec/FORWARD.md SF-23..SF-25).

Pure codecs, no I/O: the 64-byte ``AKW1`` (``.ack-watermark``) and ``SFM1`` (``sf-manifest.bin``)
records, where a generation's record goes in the 8192-byte file, which of the two halves is the
file's value, and the ``MANIFEST_REQUIRED`` header flag. The bytes are questdb 6.0.0's (Rust
client 7.2.0); tests/unit/data/sf-v2/ holds files that client wrote.
"""

from __future__ import annotations

import struct
from typing import Final, NamedTuple

from tidelog.errors import BadArgument

from .format import WATERMARK_MAGIC, crc32c

__all__ = [
    "MANIFEST_MAGIC",
    "RECORD_VERSION",
    "RECORD_SIZE",
    "RECORD_HALF",
    "DUAL_FILE_SIZE",
    "MANIFEST_REQUIRED",
    "FLAGS_OFFSET",
    "Record",
    "encode_record",
    "decode_record",
    "record_offset",
    "select",
    "read_dual",
    "watermark_record",
    "manifest_record",
    "valid_watermark",
    "valid_manifest",
    "header_flags",
]

MANIFEST_MAGIC: Final = 0x314D4653  # b"SFM1" little-endian
RECORD_VERSION: Final = 1
RECORD_SIZE: Final = 64
RECORD_HALF: Final = 4096
DUAL_FILE_SIZE: Final = 2 * RECORD_HALF
MANIFEST_REQUIRED: Final = 0x01  # header byte 5, bit 0 (SF-25)
FLAGS_OFFSET: Final = 5
CRC_OFFSET: Final = 60
_MAX_I64: Final = (1 << 63) - 1

# magic u32 | version u32 | generation i64 | first i64 | second i64 | 28 reserved
_BODY: Final = struct.Struct("<IIqqq28x")
assert _BODY.size == CRC_OFFSET


class Record(NamedTuple):
    """One valid record (SF-24): ``first``/``second`` are the acked FSN and 0 (watermark) or
    the head and active baseSeq (manifest)."""

    generation: int
    first: int
    second: int


def record_offset(generation: int) -> int:
    """Where generation ``generation`` is written: even in the first half, odd in the second."""
    return (generation & 1) * RECORD_HALF


def encode_record(magic: int, generation: int, first: int, second: int) -> bytes:
    """The 64-byte record: fields, 28 zero bytes, CRC-32C of bytes 0..59 (SF-24)."""
    if not 0 < generation <= _MAX_I64:
        raise BadArgument(f"record generation {generation} outside 1..2**63-1")
    body = _BODY.pack(magic, RECORD_VERSION, generation, first, second)
    return body + crc32c(body).to_bytes(4, "little")


def decode_record(data: bytes | bytearray | memoryview, magic: int) -> Record | None:
    """The record at the start of ``data``, or None when short, of another magic or version,
    its CRC fails or its generation is not > 0. Never raises; ranges are ``select``'s job."""
    if len(data) < RECORD_SIZE:
        return None
    body = bytes(data[:CRC_OFFSET])
    got_magic, version, generation, first, second = _BODY.unpack(body)
    if got_magic != magic or version != RECORD_VERSION:
        return None
    if int.from_bytes(data[CRC_OFFSET:RECORD_SIZE], "little") != crc32c(body):
        return None
    if generation <= 0:
        return None
    return Record(generation, first, second)


def valid_watermark(rec: Record) -> bool:
    return rec.first >= -1


def valid_manifest(rec: Record) -> bool:
    return rec.first >= 0 and rec.second >= rec.first


def select(low: Record | None, high: Record | None) -> Record | None:
    """The file's value from its two (already range-checked) halves: the larger generation,
    the half at 4096 (``high``) on a tie (SF-24)."""
    if low is None or high is None:
        return low or high
    return low if low.generation > high.generation else high


def read_dual(data: bytes | bytearray | memoryview, magic: int) -> Record | None:
    """The value of an 8192-byte dual-slot file, or None (wrong size, no valid record)."""
    if len(data) != DUAL_FILE_SIZE:
        return None
    valid = valid_watermark if magic == WATERMARK_MAGIC else valid_manifest
    halves = [decode_record(data[o : o + RECORD_SIZE], magic) for o in (0, RECORD_HALF)]
    low, high = (r if r is not None and valid(r) else None for r in halves)
    return select(low, high)


def watermark_record(generation: int, fsn: int) -> bytes:
    """An ``AKW1`` record: acked FSN (>= -1), second field 0."""
    if fsn < -1:
        raise BadArgument(f"watermark FSN {fsn} below -1")
    return encode_record(WATERMARK_MAGIC, generation, fsn, 0)


def manifest_record(generation: int, head: int, active: int) -> bytes:
    """An ``SFM1`` record: head and active baseSeq (0 <= head <= active)."""
    if not 0 <= head <= active:
        raise BadArgument(f"manifest bases head={head} active={active} out of order")
    return encode_record(MANIFEST_MAGIC, generation, head, active)


def header_flags(data: bytes | bytearray | memoryview) -> int:
    """Header byte 5 of a segment (SF-3, SF-25); 0 for a file too short to have it."""
    return data[FLAGS_OFFSET] if len(data) > FLAGS_OFFSET else 0
