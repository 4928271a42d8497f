"""Sealed segments: ``seg-<first_seq>.data`` record frames + ``.idx`` fixed-stride index (SEG-1..).

The record frame is seed 000 §3.2's close variant of the WAL frame (no type byte, no topic id:
a segment holds one topic's appends only). ``read_record`` runs on every read of a sealed
record and ``read_index`` on recovery over possibly millions of entries, so both avoid
per-byte Python work: the index columns are pulled out with strided slices, not a loop.
"""

from __future__ import annotations

import re
import struct
import sys
from array import array
from collections.abc import Iterable
from dataclasses import dataclass
from typing import NamedTuple

import xxhash

from tidelog.errors import BadArgument, TooLarge

from . import FormatCorrupt

__all__ = [
    "DATA_MAGIC",
    "IDX_MAGIC",
    "VERSION",
    "HEADER_SIZE",
    "RECORD_HEADER_SIZE",
    "RECORD_OVERHEAD",
    "ENTRY_SIZE",
    "FOOTER_SIZE",
    "HAS_TAG",
    "HAS_NODE",
    "MAX_DATA_SIZE",
    "SegmentHeader",
    "SegmentIndex",
    "RecordInfo",
    "DataProblem",
    "DataScan",
    "SegmentBuilder",
    "encode_record",
    "build_segment",
    "decode_data_header",
    "read_index",
    "read_record",
    "scan_data",
    "data_name",
    "idx_name",
    "parse_name",
]

DATA_MAGIC = b"TDLSEGD1"
IDX_MAGIC = b"TDLSEGI1"
VERSION = 1
HEADER_SIZE = 32

# .data: magic | version u16 | header_size u16 | reserved u32 | topic_id | first_seq
_DATA_HEADER = struct.Struct("<8sHHIQQ")
# .idx: magic | version u16 | header_size u16 | count u32 | topic_id | first_seq
_IDX_HEADER = struct.Struct("<8sHHIQQ")
# frame_len | flags | seq | ts | node_len | tag_len | data_len
_RECORD = struct.Struct("<IBQQHHI")
RECORD_HEADER_SIZE = _RECORD.size  # 29
RECORD_OVERHEAD = RECORD_HEADER_SIZE + 8  # 37: header + XXH3-64 trailer
_LEN_FIXED = RECORD_OVERHEAD - 4  # 33: the fixed part of frame_len
# offset u32 | length u32 | ts u64 | flags u8 | 3 zero pad bytes
_ENTRY = struct.Struct("<IIQB3x")
ENTRY_SIZE = _ENTRY.size  # 20
FOOTER_SIZE = 8
_U32 = struct.Struct("<I")
_U64 = struct.Struct("<Q")

HAS_TAG = 0x01
HAS_NODE = 0x02
#: idx offsets are u32 (SEG-8): a .data file must stay below 4 GiB.
MAX_DATA_SIZE = (1 << 32) - 1

_STREAM_AT = 4096  # see wal._STREAM_AT: hash large payloads in pieces instead of copying twice
_NAME = re.compile(r"seg-([0-9]{20})\.(data|idx)")

# array typecodes with exactly 4 and 8 bytes on this platform ('I' is 4 almost everywhere).
_U32_CODE = "I" if array("I").itemsize == 4 else "L"
_U64_CODE = "Q"
_BIG_ENDIAN = sys.byteorder == "big"


class SegmentHeader(NamedTuple):
    topic_id: int
    first_seq: int


class RecordInfo(NamedTuple):
    offset: int
    length: int
    seq: int
    ts: int
    flags: int


class DataProblem(NamedTuple):
    offset: int
    rule: str
    detail: str


class DataScan(NamedTuple):
    """The frames of a .data file up to the first problem (None when the whole file is valid)."""

    header: SegmentHeader
    frames: list[RecordInfo]
    problem: DataProblem | None


@dataclass(frozen=True)
class SegmentIndex:
    """A decoded .idx: entry ``i`` describes seq ``first_seq + i`` (SEG-5)."""

    topic_id: int
    first_seq: int
    count: int
    offsets: array[int]
    lengths: array[int]
    tss: array[int]
    flags: array[int]

    @property
    def last_seq(self) -> int:
        """The highest seq in the segment (``first_seq - 1`` when empty)."""
        return self.first_seq + self.count - 1

    @property
    def data_size(self) -> int:
        """The size the .data file must have."""
        if not self.count:
            return HEADER_SIZE
        return int(self.offsets[-1]) + int(self.lengths[-1])


# --- encoding -------------------------------------------------------------------------------------


def encode_record(
    seq: int, ts: int, tag: str | None, node: str | None, payload: bytes | bytearray | memoryview
) -> bytes:
    """One .data record frame (SEG-2); tag/node None and "" differ through HAS_TAG/HAS_NODE."""
    flags = 0
    tb = nb = b""
    if tag is not None:
        tb = tag.encode("utf-8")
        flags |= HAS_TAG
    if node is not None:
        nb = node.encode("utf-8")
        flags |= HAS_NODE
    n = len(payload)
    try:
        head = _RECORD.pack(_LEN_FIXED + len(nb) + len(tb) + n, flags, seq, ts, len(nb), len(tb), n)
    except struct.error as exc:
        raise BadArgument(f"segment record field out of range ({exc})") from None
    if n < _STREAM_AT:
        body = head + nb + tb + payload
        return body + _U64.pack(xxhash.xxh3_64_intdigest(body[4:]))
    h = xxhash.xxh3_64(head[4:])
    h.update(nb)
    h.update(tb)
    h.update(payload)
    return b"".join((head, nb, tb, payload, _U64.pack(h.intdigest())))


class SegmentBuilder:
    """Accumulates a gapless run of one topic's records into (.data, .idx) bytes (SEG-3)."""

    def __init__(self, topic_id: int, first_seq: int) -> None:
        if first_seq < 1:
            raise BadArgument(f"first_seq must be >= 1, got {first_seq}")
        self.topic_id = topic_id
        self.first_seq = first_seq
        self.next_seq = first_seq
        self.size = HEADER_SIZE
        self._parts: list[bytes] = [
            _DATA_HEADER.pack(DATA_MAGIC, VERSION, HEADER_SIZE, 0, topic_id, first_seq)
        ]
        self._entries: list[bytes] = []

    def add(
        self,
        seq: int,
        ts: int,
        tag: str | None,
        node: str | None,
        payload: bytes | bytearray | memoryview,
    ) -> None:
        if seq != self.next_seq:
            raise BadArgument(
                f"segment records must be consecutive: got seq {seq}, expected {self.next_seq}"
            )
        frame = encode_record(seq, ts, tag, node, payload)
        if self.size + len(frame) > MAX_DATA_SIZE:
            raise TooLarge(f"segment would exceed {MAX_DATA_SIZE} bytes (u32 idx offsets)")
        self._entries.append(_ENTRY.pack(self.size, len(frame), ts, frame[4]))
        self._parts.append(frame)
        self.size += len(frame)
        self.next_seq += 1

    @property
    def count(self) -> int:
        return len(self._entries)

    def finish(self) -> tuple[bytes, bytes]:
        """The .data and .idx file contents."""
        head = _IDX_HEADER.pack(
            IDX_MAGIC, VERSION, HEADER_SIZE, self.count, self.topic_id, self.first_seq
        )
        idx = b"".join((head, *self._entries))
        return b"".join(self._parts), idx + _U64.pack(xxhash.xxh3_64_intdigest(idx))


def build_segment(
    topic_id: int,
    first_seq: int,
    records: Iterable[tuple[int, int, str | None, str | None, bytes | bytearray | memoryview]],
) -> tuple[bytes, bytes]:
    """(.data, .idx) bytes for ``records`` = (seq, ts, tag, node, payload), consecutive from
    ``first_seq``."""
    builder = SegmentBuilder(topic_id, first_seq)
    for seq, ts, tag, node, payload in records:
        builder.add(seq, ts, tag, node, payload)
    return builder.finish()


# --- decoding -------------------------------------------------------------------------------------


def _check_header(
    buf: bytes | bytearray | memoryview, magic: bytes, what: str, rule: str
) -> tuple[int, int, int]:
    """(the u32 at offset 12, topic_id, first_seq): .data and .idx headers share a layout."""
    if len(buf) < HEADER_SIZE:
        raise FormatCorrupt(rule, f"{what}: {len(buf)} bytes, shorter than the header")
    got, version, header_size, word, topic_id, first_seq = _DATA_HEADER.unpack_from(buf)
    if got != magic:
        raise FormatCorrupt(rule, f"{what}: bad magic {bytes(got)!r}, expected {magic!r}")
    if version != VERSION:
        raise FormatCorrupt(rule, f"{what}: unsupported version {version} (reader knows {VERSION})")
    if header_size != HEADER_SIZE:
        raise FormatCorrupt(rule, f"{what}: header_size {header_size}, expected {HEADER_SIZE}")
    if first_seq < 1:
        raise FormatCorrupt(rule, f"{what}: first_seq {first_seq} (seqs start at 1)")
    return word, topic_id, first_seq


def decode_data_header(buf: bytes | bytearray | memoryview) -> SegmentHeader:
    """The .data header (SEG-1); Corrupt naming the problem."""
    _, topic_id, first_seq = _check_header(buf, DATA_MAGIC, ".data header", "SEG-1")
    return SegmentHeader(topic_id, first_seq)


def _column(region: bytes, count: int, at: int, size: int, code: str) -> array[int]:
    """Field bytes ``[at, at+size)`` of every 20-byte entry as an array, by strided slicing:
    ``size`` C-level copies instead of ``count`` Python iterations."""
    raw = bytearray(size * count)
    for k in range(size):
        raw[k::size] = region[at + k :: ENTRY_SIZE]
    out = array(code)
    out.frombytes(raw)
    if _BIG_ENDIAN and size > 1:
        out.byteswap()
    return out


def read_index(
    buf: bytes | bytearray | memoryview,
    *,
    topic_id: int | None = None,
    first_seq: int | None = None,
) -> SegmentIndex:
    """Decode and check an .idx (SEG-4, SEG-6); optionally that it belongs to ``topic_id`` and
    ``first_seq`` (the .data header or file name). Corrupt naming the problem."""
    count, tid, fseq = _check_header(buf, IDX_MAGIC, ".idx header", "SEG-4")
    expected = HEADER_SIZE + count * ENTRY_SIZE + FOOTER_SIZE
    if len(buf) != expected:
        raise FormatCorrupt("SEG-6", f".idx: {len(buf)} bytes, count {count} needs {expected}")
    mv = memoryview(buf)
    (stored,) = _U64.unpack_from(mv, expected - FOOTER_SIZE)
    if xxhash.xxh3_64_intdigest(mv[: expected - FOOTER_SIZE]) != stored:
        raise FormatCorrupt("SEG-6", ".idx: XXH3-64 footer mismatch")
    if topic_id is not None and tid != topic_id:
        raise FormatCorrupt("SEG-4", f".idx: topic_id {tid:#x}, expected {topic_id:#x}")
    if first_seq is not None and fseq != first_seq:
        raise FormatCorrupt("SEG-4", f".idx: first_seq {fseq}, expected {first_seq}")
    region = bytes(mv[HEADER_SIZE : expected - FOOTER_SIZE])
    return SegmentIndex(
        topic_id=tid,
        first_seq=fseq,
        count=count,
        offsets=_column(region, count, 0, 4, _U32_CODE),
        lengths=_column(region, count, 4, 4, _U32_CODE),
        tss=_column(region, count, 8, 8, _U64_CODE),
        flags=array("B", region[16::ENTRY_SIZE]),
    )


def _decode(
    mv: memoryview, offset: int, length: int
) -> tuple[int, int, int, str | None, str | None, memoryview]:
    """(seq, ts, flags, tag, node, payload) of the frame at ``offset``; Corrupt if damaged."""
    end = offset + length
    if offset < HEADER_SIZE or length < RECORD_OVERHEAD or end > len(mv):
        raise FormatCorrupt(
            "SEG-2", f"segment record at offset {offset}: {length} bytes do not fit the file"
        )
    frame_len, flags, seq, ts, nl, tl, dl = _RECORD.unpack_from(mv, offset)
    if frame_len + 4 != length or _LEN_FIXED + nl + tl + dl != frame_len:
        raise FormatCorrupt("SEG-2", f"segment record at offset {offset}: length fields disagree")
    (stored,) = _U64.unpack_from(mv, end - 8)
    if xxhash.xxh3_64_intdigest(mv[offset + 4 : end - 8]) != stored:
        raise FormatCorrupt("SEG-2", f"segment record at offset {offset}: XXH3-64 mismatch")
    at = offset + RECORD_HEADER_SIZE
    try:
        node = str(mv[at : at + nl], "utf-8") if flags & HAS_NODE else None
        tag = str(mv[at + nl : at + nl + tl], "utf-8") if flags & HAS_TAG else None
    except UnicodeDecodeError:
        raise FormatCorrupt(
            "SEG-2", f"segment record at offset {offset}: tag/node not UTF-8"
        ) from None
    return seq, ts, flags, tag, node, mv[at + nl + tl : end - 8]


def read_record(
    data_buf: bytes | bytearray | memoryview, offset: int, length: int, expected_seq: int
) -> tuple[int, int, str | None, str | None, memoryview]:
    """The record framed at ``offset`` (``length`` bytes, from the .idx), checksum-verified
    (SEG-2): (seq, ts, tag, node, payload view). Corrupt with the offset on any mismatch: in a
    sealed segment that is real corruption, never a torn tail."""
    seq, ts, _, tag, node, payload = _decode(memoryview(data_buf), offset, length)
    if seq != expected_seq:
        raise FormatCorrupt(
            "SEG-3", f"segment record at offset {offset}: seq {seq}, expected {expected_seq}"
        )
    return seq, ts, tag, node, payload


def _next_record(mv: memoryview, pos: int, expected_seq: int) -> RecordInfo | DataProblem:
    left = len(mv) - pos
    if left < 4:
        return DataProblem(pos, "SEG-3", f"{left} trailing bytes after the last record")
    (frame_len,) = _U32.unpack_from(mv, pos)
    if frame_len < _LEN_FIXED or frame_len + 4 > left:
        return DataProblem(pos, "SEG-2", f"frame_len {frame_len} does not fit ({left} bytes left)")
    try:
        seq, ts, flags, *_ = _decode(mv, pos, frame_len + 4)
    except FormatCorrupt as exc:
        return DataProblem(pos, exc.rule, exc.detail)
    if seq != expected_seq:
        return DataProblem(pos, "SEG-3", f"record seq {seq}, expected {expected_seq}")
    return RecordInfo(pos, frame_len + 4, seq, ts, flags)


def scan_data(data_buf: bytes | bytearray | memoryview) -> DataScan:
    """Walk every frame of a .data file (for ``verify``): checksums (SEG-2), consecutive seqs
    filling the file exactly (SEG-3). Raises Corrupt only for a bad header (SEG-1)."""
    header = decode_data_header(data_buf)
    mv = memoryview(data_buf)
    frames: list[RecordInfo] = []
    pos = HEADER_SIZE
    while pos < len(mv):
        got = _next_record(mv, pos, header.first_seq + len(frames))
        if isinstance(got, DataProblem):
            return DataScan(header, frames, got)
        frames.append(got)
        pos += got.length
    return DataScan(header, frames, None)


# --- names ----------------------------------------------------------------------------------------


def data_name(first_seq: int) -> str:
    """``seg-<first_seq:020d>.data``: 20 decimal digits, so names sort in seq order."""
    return f"seg-{first_seq:020d}.data"


def idx_name(first_seq: int) -> str:
    return f"seg-{first_seq:020d}.idx"


def parse_name(name: str) -> tuple[int, str] | None:
    """(first_seq, "data" | "idx") for a segment file name, else None."""
    m = _NAME.fullmatch(name)
    return (int(m.group(1)), m.group(2)) if m else None
