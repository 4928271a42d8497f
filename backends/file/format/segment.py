"""Sealed segments: ``seg-<first_seq>.data`` record frames + ``.idx`` fixed-stride index (SEG-1..).

The record frame (SEG-2) is a close variant of the WAL frame (no type byte, no topic id:
a segment holds one topic's appends only). ``read_index`` runs on recovery over possibly
millions of entries, so it avoids per-entry Python work: the index columns are pulled out with
strided slices, not a loop. Writers write ``.idx`` version 2 (spec/FORMATS-seg2.md SEG-9..13):
the version-1 entries plus block checksums over the ``.data`` (SEG-10), which let a read verify
the bytes it returns with one C-speed call per ~64 KiB, and label runs (SEG-11), which give every
record's tag and node without decoding its frame. Version 1 is still read.
"""

from __future__ import annotations

import operator
import re
import struct
import sys
from array import array
from bisect import bisect_left, bisect_right
from collections.abc import Iterable, Sequence
from itertools import accumulate, repeat
from typing import Any, NamedTuple

import xxhash

from tidelog.errors import BadArgument, TooLarge
from tidelog.fsio import whole_object

from . import FormatCorrupt

__all__ = [
    "index_as_version_1",
    "cut_blocks",
    "encode_index",
    "DATA_MAGIC",
    "IDX_MAGIC",
    "VERSION",
    "HEADER_SIZE",
    "IDX_VERSION",
    "IDX_HEADER_SIZE",
    "BLOCK_BYTES",
    "NO_STRING",
    "RECORD_HEADER_SIZE",
    "DATA_VERSION_RUNS",
    "IDX_VERSION_RUNS",
    "RUN_HEADER_SIZE",
    "RUN_FRAME_BYTES",
    "RunFrame",
    "read_run",
    "RECORD_OVERHEAD",
    "ENTRY_SIZE",
    "FOOTER_SIZE",
    "HAS_TAG",
    "HAS_NODE",
    "MAX_DATA_SIZE",
    "SegmentHeader",
    "SegmentIndex",
    "LabelRuns",
    "label_runs",
    "RecordInfo",
    "DataProblem",
    "DataScan",
    "SegmentBuilder",
    "encode_record",
    "build_segment",
    "decode_data_header",
    "read_index",
    "read_record",
    "block_hash",
    "scan_data",
    "data_name",
    "idx_name",
    "parse_name",
]

DATA_MAGIC = b"TDLSEGD1"
IDX_MAGIC = b"TDLSEGI1"
VERSION = 1  # .data (and .idx version 1)
HEADER_SIZE = 32
IDX_VERSION = 2  # the index of a version-1 .data (SEG-9); read_index also reads version 1
#: spec/FORMATS-seg3.md: .data version 2 holds run frames (SEG-14..16), described by an .idx
#: version 3 (SEG-17). What the checkpoint writes (format/seal.py).
DATA_VERSION_RUNS = 2
IDX_VERSION_RUNS = 3
#: SEG-18: tidelog ends a run frame once its ts + lengths + payloads reach this many bytes.
RUN_FRAME_BYTES = 64 << 10
IDX_HEADER_SIZE = 56
#: SEG-10: tidelog ends a block at the first frame boundary this many bytes after its start.
BLOCK_BYTES = 64 << 10
#: SEG-11: a run's tag or node reference meaning "none".
NO_STRING = 0xFFFFFFFF

# .data: magic | version u16 | header_size u16 | reserved u32 | topic_id | first_seq
_DATA_HEADER = struct.Struct("<8sHHIQQ")
# .idx: magic | version u16 | header_size u16 | count u32 | topic_id | first_seq
_IDX_HEADER = struct.Struct("<8sHHIQQ")
# .idx v2 adds: data_size u64 | block_count | run_count | string_count | strings_size (u32s)
_IDX_HEADER2 = struct.Struct("<8sHHIQQQIIII")
_BLOCK = struct.Struct("<IIQ")  # first_slot | offset | xxh3
_RUN = struct.Struct("<III")  # first_slot | tag | node
# frame_len | flags | seq | ts | node_len | tag_len | data_len
_RECORD = struct.Struct("<IBQQHHI")
RECORD_HEADER_SIZE = _RECORD.size  # 29
# run frame (SEG-15): frame_len | flags | seq | count | node_len | tag_len
_RUN_HEAD = struct.Struct("<IBQIHH")
RUN_HEADER_SIZE = _RUN_HEAD.size  # 21
_RUN_FIXED = RUN_HEADER_SIZE + 8 - 4  # 25: the fixed part of a run frame's frame_len
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
    version: int = VERSION  # 1: record frames (SEG-2); 2: run frames (SEG-15)


class RecordInfo(NamedTuple):
    offset: int
    length: int
    seq: int
    ts: int
    flags: int
    tag: str | None = None
    node: str | None = None


class DataProblem(NamedTuple):
    offset: int
    rule: str
    detail: str


class DataScan(NamedTuple):
    """The records of a .data file up to the first problem (None when the whole file is
    valid). Version 1: one ``RecordInfo`` per frame (offset and length of the frame). Version 2:
    one per record, offset and length of its payload (what its .idx v3 entry holds), and
    ``runs`` the (first slot, offset) of every run frame (what the .idx blocks must be)."""

    header: SegmentHeader
    frames: list[RecordInfo]
    problem: DataProblem | None
    runs: list[tuple[int, int]] | None = None


class RunFrame(NamedTuple):
    """A decoded, checked run frame (SEG-15): records ``seq .. seq + count - 1``."""

    offset: int
    length: int  # the whole frame, frame_len field included
    flags: int
    seq: int
    tag: str | None
    node: str | None
    tss: array[int]
    lengths: array[int]
    payload_at: int  # .data offset of the first payload


class LabelRuns:
    """Maximal runs of consecutive slots with the same (tag, node) (SEG-11): run ``r`` holds
    slots ``firsts[r] .. firsts[r + 1] - 1`` (the last run ends at the segment's count). Per run
    also the UTF-8 byte lengths of its labels (``nls``, ``tls``) and the label bytes as a frame
    holds them (``labels``: node then tag), so a read finds the payload without decoding."""

    __slots__ = ("firsts", "tags", "nodes", "nls", "tls", "labels", "flags")

    def __init__(
        self, firsts: Sequence[int], tags: Sequence[str | None], nodes: Sequence[str | None]
    ) -> None:
        self.firsts = list(firsts)
        self.tags = list(tags)
        self.nodes = list(nodes)
        node_b = [b"" if n is None else n.encode("utf-8") for n in self.nodes]
        tag_b = [b"" if t is None else t.encode("utf-8") for t in self.tags]
        self.nls = [len(b) for b in node_b]
        self.tls = [len(b) for b in tag_b]
        self.labels = [n + t for n, t in zip(node_b, tag_b)]
        self.flags = [
            (t is not None) * HAS_TAG | (n is not None) * HAS_NODE
            for t, n in zip(self.tags, self.nodes)
        ]

    def __len__(self) -> int:
        return len(self.firsts)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, LabelRuns) and (self.firsts, self.tags, self.nodes) == (
            other.firsts,
            other.tags,
            other.nodes,
        )

    def __repr__(self) -> str:
        return f"LabelRuns({self.firsts}, {self.tags}, {self.nodes})"

    def run_of(self, i: int) -> int:
        """The run holding slot ``i``."""
        return bisect_right(self.firsts, i) - 1


def label_runs(tags: Sequence[str | None], nodes: Sequence[str | None]) -> LabelRuns:
    """The maximal runs of per-slot labels (SEG-11: what the writer stores)."""
    n = len(tags)
    if tags.count(None) == n and nodes.count(None) == n:  # no labels: the common case
        return LabelRuns([0], [None], [None]) if n else LabelRuns([], [], [])
    firsts: list[int] = []
    rt: list[str | None] = []
    rn: list[str | None] = []
    prev: tuple[str | None, str | None] | None = None
    for i, pair in enumerate(zip(tags, nodes)):
        if pair != prev:
            firsts.append(i)
            rt.append(pair[0])
            rn.append(pair[1])
            prev = pair
    return LabelRuns(firsts, rt, rn)


class SegmentIndex:
    """A decoded .idx: entry ``i`` describes seq ``first_seq + i`` (SEG-5). A version-2 index
    also carries its blocks (SEG-10: first slots, .data offsets, XXH3-64s) and label runs
    (SEG-11); a version-1 index has no blocks and ``runs`` None.

    The ``offsets``, ``lengths`` and ``tss`` columns are cut out of the (checked, immutable)
    entry bytes on first use, not when the index is read: opening a store touches only what
    it needs (flags, data_size, blocks, runs), and a segment nobody reads is never decoded."""

    __slots__ = (
        "topic_id",
        "first_seq",
        "count",
        "flags",
        "version",
        "block_slots",
        "block_offsets",
        "block_hashes",
        "runs",
        "_entries",
        "_columns",
        "_data_size",
    )

    def __init__(
        self,
        topic_id: int,
        first_seq: int,
        count: int,
        entries: bytes | memoryview,
        *,
        version: int = 1,
        data_size: int | None = None,
        block_slots: array[int] | None = None,
        block_offsets: array[int] | None = None,
        block_hashes: array[int] | None = None,
        runs: LabelRuns | None = None,
        flags: array[int] | None = None,
        columns: tuple[array[int], array[int], array[int]] | None = None,
    ) -> None:
        """``columns``: (offsets, lengths, tss) when the caller has them (the writer, which
        encoded ``entries`` from them: seal.build_indexed); else cut from ``entries`` when
        first used."""
        self.topic_id = topic_id
        self.first_seq = first_seq
        self.count = count
        self._entries = entries
        self._columns = columns
        self.flags = array("B", bytes(entries[16::ENTRY_SIZE])) if flags is None else flags
        self.version = version
        self.block_slots = array(_U32_CODE) if block_slots is None else block_slots
        self.block_offsets = array(_U32_CODE) if block_offsets is None else block_offsets
        self.block_hashes = array(_U64_CODE) if block_hashes is None else block_hashes
        self.runs = runs
        if data_size is None:  # version 1: where the last entry's frame ends
            data_size = HEADER_SIZE
            if count:
                offset, length, *_ = _ENTRY.unpack_from(entries, (count - 1) * ENTRY_SIZE)
                data_size = offset + length
        self._data_size = data_size

    def release(self) -> None:
        """Let go of the entry bytes of an index never decoded (a view of its mapped .idx,
        which keeps the map alive): its segment is closed. Decoding afterwards raises."""
        if self._columns is None:
            self._entries = b""

    def entry_offset(self, i: int) -> int:
        """Entry ``i``'s offset, without decoding the columns."""
        if self._columns is not None:
            return self._columns[0][i]
        return int(_U32.unpack_from(self._entries, i * ENTRY_SIZE)[0])

    def _decoded(self) -> tuple[array[int], array[int], array[int]]:
        columns = self._columns
        if columns is None:
            region, count = self._entries, self.count
            columns = self._columns = (
                _column(region, count, 0, 4, _U32_CODE),
                _column(region, count, 4, 4, _U32_CODE),
                _column(region, count, 8, 8, _U64_CODE),
            )
            self._entries = b""
        return columns

    @property
    def offsets(self) -> array[int]:
        return self._decoded()[0]

    @property
    def lengths(self) -> array[int]:
        return self._decoded()[1]

    @property
    def tss(self) -> array[int]:
        return self._decoded()[2]

    @property
    def last_seq(self) -> int:
        """The highest seq in the segment (``first_seq - 1`` when empty)."""
        return self.first_seq + self.count - 1

    @property
    def data_size(self) -> int:
        """The size the .data file must have."""
        return self._data_size

    def block_end(self, k: int) -> tuple[int, int]:
        """(first slot after block ``k``, .data offset where it ends) (SEG-10)."""
        if k + 1 < len(self.block_slots):
            return int(self.block_slots[k + 1]), int(self.block_offsets[k + 1])
        return self.count, self.data_size


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


def cut_blocks(offsets: Sequence[int], count: int) -> list[tuple[int, int]]:
    """SEG-10 as tidelog cuts: (first slot, .data offset) of each block, a block ending at the
    first frame boundary at least ``BLOCK_BYTES`` after its start. ``offsets[i]`` is frame
    ``i``'s offset (ascending); one bisect per block, no loop per record."""
    blocks: list[tuple[int, int]] = []
    i = 0
    while i < count:
        blocks.append((i, offsets[i]))
        i = bisect_left(offsets, offsets[i] + BLOCK_BYTES, i + 1, count)
    return blocks


def encode_index(
    topic_id: int,
    first_seq: int,
    data: bytes | None,
    entries: bytes | bytearray,
    offsets: Sequence[int],
    tags: Sequence[str | None],
    nodes: Sequence[str | None],
    *,
    runs: LabelRuns | None = None,
    frames: Sequence[tuple[int, int]] | None = None,
    sums: tuple[int, Sequence[int]] | None = None,
) -> bytes:
    """The version-2 ``.idx`` (SEG-9) of ``data``, whose frames ``entries`` (packed SEG-5
    entries, one per record) describe: header, entries, blocks (SEG-10), label runs, strings
    (SEG-11) and footer. ``offsets[i]`` is frame ``i``'s offset; ``tags``/``nodes`` its labels
    (or ``runs``, already cut). With ``frames`` (the (first slot, offset) of every run frame of
    a version-2 .data), the version-3 ``.idx`` (SEG-17), whose blocks are those frames; with
    ``sums`` (the .data size and each block's XXH3-64, as its writer computed them), ``data``
    is not needed."""
    count = len(entries) // ENTRY_SIZE
    cuts = cut_blocks(offsets, count) if frames is None else frames
    if sums is None:
        assert data is not None
        mv = memoryview(data)
        size = len(data)
        ends = [off for _, off in cuts[1:]] + [size]
        hashes: Sequence[int] = [
            xxhash.xxh3_64_intdigest(mv[off:end]) for (_, off), end in zip(cuts, ends)
        ]
    else:
        size, hashes = sums
    blocks = [_BLOCK.pack(slot, off, h) for (slot, off), h in zip(cuts, hashes)]
    if runs is None:
        runs = label_runs(tags, nodes)
    strings: dict[str, int] = {}
    encoded: list[bytes] = []

    def ref(text: str | None) -> int:
        if text is None:
            return NO_STRING
        got = strings.get(text)
        if got is None:
            got = strings[text] = len(strings)
            encoded.append(text.encode("utf-8"))
        return got

    run_rows = [
        _RUN.pack(first, ref(tag), ref(node))
        for first, tag, node in zip(runs.firsts, runs.tags, runs.nodes)
    ]
    string_ends = array(_U32_CODE, accumulate(len(e) for e in encoded))
    if _BIG_ENDIAN:
        string_ends.byteswap()
    text = b"".join(encoded)
    head = _IDX_HEADER2.pack(
        IDX_MAGIC,
        IDX_VERSION if frames is None else IDX_VERSION_RUNS,
        IDX_HEADER_SIZE,
        count,
        topic_id,
        first_seq,
        size,
        len(blocks),
        len(run_rows),
        len(encoded),
        len(text),
    )
    idx = b"".join((head, entries, *blocks, *run_rows, string_ends.tobytes(), text))
    return idx + _U64.pack(xxhash.xxh3_64_intdigest(idx))


def index_as_version_1(idx: bytes) -> bytes:
    """A version-2 ``.idx`` rewritten as version 1, what an earlier tidelog wrote (FORMATS.md
    §4.3: the 32-byte header, the same entries, the footer): for golden vectors and tests of
    readers of both versions."""
    count, topic_id, first_seq = struct.unpack_from("<IQQ", idx, 12)
    body = _IDX_HEADER.pack(IDX_MAGIC, VERSION, HEADER_SIZE, count, topic_id, first_seq)
    body += idx[IDX_HEADER_SIZE : IDX_HEADER_SIZE + count * ENTRY_SIZE]
    return body + _U64.pack(xxhash.xxh3_64_intdigest(body))


class SegmentBuilder:
    """Accumulates a gapless run of one topic's records into (.data, .idx) bytes (SEG-3), the
    index in version 2 (SEG-9): entries, blocks (SEG-10) and label runs (SEG-11)."""

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
        self._offsets: list[int] = []
        self._tags: list[str | None] = []
        self._nodes: list[str | None] = []

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
        self._offsets.append(self.size)
        self._tags.append(tag)
        self._nodes.append(node)
        self._parts.append(frame)
        self.size += len(frame)
        self.next_seq += 1

    @property
    def count(self) -> int:
        return len(self._entries)

    def finish(self) -> tuple[bytes, bytes]:
        """The .data and .idx file contents."""
        data = b"".join(self._parts)
        entries = b"".join(self._entries)
        idx = encode_index(
            self.topic_id, self.first_seq, data, entries, self._offsets, self._tags, self._nodes
        )
        return data, idx


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
    buf: bytes | bytearray | memoryview,
    magic: bytes,
    what: str,
    rule: str,
    sizes: dict[int, int] | None = None,
) -> tuple[int, int, int, int]:
    """(version, the u32 at offset 12, topic_id, first_seq): .data and .idx headers share their
    first 32 bytes. ``sizes`` maps each version the reader knows to its header_size."""
    sizes = sizes or {VERSION: HEADER_SIZE}
    if len(buf) < HEADER_SIZE:
        raise FormatCorrupt(rule, f"{what}: {len(buf)} bytes, shorter than the header")
    got, version, header_size, word, topic_id, first_seq = _DATA_HEADER.unpack_from(buf)
    if got != magic:
        raise FormatCorrupt(rule, f"{what}: bad magic {bytes(got)!r}, expected {magic!r}")
    if version not in sizes:
        known = " or ".join(map(str, sizes))
        raise FormatCorrupt(rule, f"{what}: unsupported version {version} (reader knows {known})")
    if header_size != sizes[version]:
        raise FormatCorrupt(rule, f"{what}: header_size {header_size}, expected {sizes[version]}")
    if first_seq < 1:
        raise FormatCorrupt(rule, f"{what}: first_seq {first_seq} (seqs start at 1)")
    return version, word, topic_id, first_seq


def decode_data_header(buf: bytes | bytearray | memoryview) -> SegmentHeader:
    """The .data header (SEG-1, SEG-14: version 1 or 2); Corrupt naming the problem."""
    sizes = {VERSION: HEADER_SIZE, DATA_VERSION_RUNS: HEADER_SIZE}
    version, reserved, topic_id, first_seq = _check_header(
        buf, DATA_MAGIC, ".data header", "SEG-1", sizes
    )
    if reserved:
        raise FormatCorrupt("SEG-1", f".data header: reserved field {reserved:#x}, expected 0")
    return SegmentHeader(topic_id, first_seq, version)


def _column(
    region: bytes | memoryview, count: int, at: int, size: int, code: str, stride: int = ENTRY_SIZE
) -> array[int]:
    """Field bytes ``[at, at+size)`` of every ``stride``-byte row as an array, by strided
    slicing: ``size`` C-level copies instead of ``count`` Python iterations."""
    raw = bytearray(size * count)
    for k in range(size):
        raw[k::size] = region[at + k :: stride]
    out = array(code)
    out.frombytes(raw)
    if _BIG_ENDIAN and size > 1:
        out.byteswap()
    return out


def _ascending(values: Sequence[int], count: int) -> bool:
    """SEG-10/SEG-11 tables: starts at slot 0, strictly increasing, below ``count``."""
    return (
        bool(values)
        and values[0] == 0
        and values[-1] < count
        and all(map(operator.lt, values, values[1:]))
    )


def read_index(
    buf: bytes | bytearray | memoryview,
    *,
    topic_id: int | None = None,
    first_seq: int | None = None,
) -> SegmentIndex:
    """Decode and check an .idx of version 1 (SEG-4, SEG-6) or 2 (SEG-9..SEG-11); optionally
    that it belongs to ``topic_id`` and ``first_seq`` (the .data header or file name). Corrupt
    naming the problem."""
    sizes = {1: HEADER_SIZE, 2: IDX_HEADER_SIZE, IDX_VERSION_RUNS: IDX_HEADER_SIZE}
    version, count, tid, fseq = _check_header(buf, IDX_MAGIC, ".idx header", "SEG-4", sizes)
    mv = memoryview(buf)
    size_rule = {1: "SEG-6", 2: "SEG-9", 3: "SEG-17"}[version]
    if version == 1:
        head, blocks, runs, nstrings, text_size, data_size = HEADER_SIZE, 0, 0, 0, 0, 0
    elif len(buf) < IDX_HEADER_SIZE:
        raise FormatCorrupt(size_rule, f".idx: {len(buf)} bytes, shorter than the header")
    else:
        head = IDX_HEADER_SIZE
        *_, data_size, blocks, runs, nstrings, text_size = _IDX_HEADER2.unpack_from(mv)
    entries_end = head + count * ENTRY_SIZE
    tables = blocks * _BLOCK.size + runs * _RUN.size + nstrings * 4 + text_size
    expected = entries_end + tables + FOOTER_SIZE
    if len(buf) != expected:
        raise FormatCorrupt(
            size_rule, f".idx: {len(buf)} bytes, its header's counts need {expected}"
        )
    (stored,) = _U64.unpack_from(mv, expected - FOOTER_SIZE)
    if xxhash.xxh3_64_intdigest(mv[: expected - FOOTER_SIZE]) != stored:
        raise FormatCorrupt(size_rule, ".idx: XXH3-64 footer mismatch")
    if topic_id is not None and tid != topic_id:
        raise FormatCorrupt("SEG-4", f".idx: topic_id {tid:#x}, expected {topic_id:#x}")
    if first_seq is not None and fseq != first_seq:
        raise FormatCorrupt("SEG-4", f".idx: first_seq {fseq}, expected {first_seq}")
    # a view, not a copy: over a mapped .idx the entries stay in the page cache until a read
    # decodes them (a copy of every .idx was most of a clean open's time). The flags column is
    # cut from the whole mmap or bytes when there is one (fsio.whole_object: 10x faster)
    src: Any = whole_object(mv)
    flags = array("B", bytes((mv if src is None else src)[head + 16 : entries_end : ENTRY_SIZE]))
    index = SegmentIndex(tid, fseq, count, mv[head:entries_end], flags=flags)
    if version == 1:
        return index
    return _read_tables(index, bytes(mv[entries_end : expected - FOOTER_SIZE]), data_size, blocks,
                        runs, nstrings, version)  # fmt: skip


def _read_tables(
    index: SegmentIndex,
    tables: bytes,
    data_size: int,
    blocks: int,
    runs: int,
    nstrings: int,
    version: int,
) -> SegmentIndex:
    """The version-2/3 tables after the entries: blocks, runs, strings (SEG-9..SEG-11, SEG-17)."""
    count = index.count
    rule = "SEG-9" if version == 2 else "SEG-17"
    if (blocks == 0 or runs == 0) != (count == 0):
        raise FormatCorrupt(rule, f".idx: {blocks} blocks and {runs} runs for {count} records")
    # version 2: the last entry is the last frame; version 3: its payload, then the checksum
    # (verify also checks every entry against the .data)
    ends_at = index.data_size + (8 if version == IDX_VERSION_RUNS and count else 0)
    if data_size != ends_at:
        raise FormatCorrupt(rule, f".idx: data_size {data_size}, its last entry ends at "
                            f"{index.data_size}")  # fmt: skip
    at = blocks * _BLOCK.size
    block_region, run_region = tables[:at], tables[at : at + runs * _RUN.size]
    at += runs * _RUN.size
    ends = array(_U32_CODE, tables[at : at + nstrings * 4])
    if _BIG_ENDIAN:
        ends.byteswap()
    text = tables[at + nstrings * 4 :]
    slots = _column(block_region, blocks, 0, 4, _U32_CODE, _BLOCK.size)
    offsets = _column(block_region, blocks, 4, 4, _U32_CODE, _BLOCK.size)
    if count and not _ascending(slots, count):
        raise FormatCorrupt("SEG-10" if version == 2 else "SEG-17",
                            ".idx: block first slots not ascending from 0")  # fmt: skip
    if version == 2 and list(offsets) != list(map(index.entry_offset, slots)):
        raise FormatCorrupt("SEG-10", ".idx: a block's offset is not its first entry's")
    if (
        version == IDX_VERSION_RUNS
        and count
        and not (
            offsets[0] == HEADER_SIZE
            and offsets[-1] < data_size
            and all(map(operator.lt, offsets, offsets[1:]))
        )
    ):
        raise FormatCorrupt("SEG-17", ".idx: run frame offsets not ascending from 32")
    firsts = _column(run_region, runs, 0, 4, _U32_CODE, _RUN.size)
    if count and not _ascending(firsts, count):
        raise FormatCorrupt("SEG-11", ".idx: run first slots not ascending from 0")
    if any(map(operator.gt, ends, ends[1:])) or (ends[-1] if nstrings else 0) != len(text):
        raise FormatCorrupt("SEG-11", ".idx: string ends out of order or past the text")
    try:
        strings = list(map(str, map(text.__getitem__, map(slice, [0, *ends], ends)),
                           repeat("utf-8")))  # fmt: skip
    except UnicodeDecodeError:
        raise FormatCorrupt("SEG-11", ".idx: a tag or node string is not UTF-8") from None
    lookup: dict[int, str | None] = dict(enumerate(strings))
    lookup[NO_STRING] = None

    def labels(column: array[int]) -> list[str | None]:
        if not lookup.keys() >= set(column):
            raise FormatCorrupt("SEG-11", ".idx: a run names a string that does not exist")
        return list(map(lookup.__getitem__, column))

    label_runs_ = LabelRuns(
        firsts,
        labels(_column(run_region, runs, 4, 4, _U32_CODE, _RUN.size)),
        labels(_column(run_region, runs, 8, 4, _U32_CODE, _RUN.size)),
    )
    bounds = [*label_runs_.firsts, count]
    expected_flags = b"".join(
        bytes((f,)) * (b - a) for f, a, b in zip(label_runs_.flags, bounds, bounds[1:])
    )
    if expected_flags != index.flags.tobytes():
        raise FormatCorrupt("SEG-11", ".idx: entry flags disagree with the label runs")
    return SegmentIndex(
        index.topic_id,
        index.first_seq,
        count,
        index._entries,
        version=version,
        data_size=data_size,
        block_slots=slots,
        block_offsets=offsets,
        block_hashes=_column(block_region, blocks, 8, 8, _U64_CODE, _BLOCK.size),
        runs=label_runs_,
        flags=index.flags,
    )


def block_hash(data: bytes | bytearray | memoryview, start: int, end: int) -> int:
    """XXH3-64 of ``.data`` bytes [start, end) (a block, SEG-10)."""
    return xxhash.xxh3_64_intdigest(memoryview(data)[start:end])


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
        seq, ts, flags, tag, node, _ = _decode(mv, pos, frame_len + 4)
    except FormatCorrupt as exc:
        return DataProblem(pos, exc.rule, exc.detail)
    if seq != expected_seq:
        return DataProblem(pos, "SEG-3", f"record seq {seq}, expected {expected_seq}")
    return RecordInfo(pos, frame_len + 4, seq, ts, flags, tag, node)


def _u_array(raw: bytes | memoryview, code: str) -> array[int]:
    out = array(code)
    out.frombytes(raw)
    if _BIG_ENDIAN:
        out.byteswap()
    return out


def read_run(data_buf: bytes | bytearray | memoryview, offset: int, expected_seq: int) -> RunFrame:
    """The run frame at ``offset`` of a version-2 .data, checked (SEG-15, SEG-16: its seq is
    ``expected_seq``). Corrupt naming the frame's offset on any mismatch."""
    mv = memoryview(data_buf)
    left = len(mv) - offset
    if offset < HEADER_SIZE or left < _RUN_HEAD.size + 8:
        raise FormatCorrupt("SEG-16", f"run frame at offset {offset}: {left} bytes left, "
                            "too few for a frame")  # fmt: skip
    frame_len, flags, seq, count, nl, tl = _RUN_HEAD.unpack_from(mv, offset)
    where = f"run frame at offset {offset}"
    if frame_len + 4 > left or count < 1 or frame_len < _RUN_FIXED + nl + tl + 12 * count:
        raise FormatCorrupt("SEG-15", f"{where}: frame_len {frame_len} / count {count} do not "
                            f"fit ({left} bytes left)")  # fmt: skip
    end = offset + 4 + frame_len
    (stored,) = _U64.unpack_from(mv, end - 8)
    if xxhash.xxh3_64_intdigest(mv[offset + 4 : end - 8]) != stored:
        raise FormatCorrupt("SEG-15", f"{where}: XXH3-64 mismatch")
    at = offset + RUN_HEADER_SIZE
    ts_at = at + nl + tl
    len_at = ts_at + 8 * count
    tss = _u_array(mv[ts_at:len_at], _U64_CODE)
    lengths = _u_array(mv[len_at : len_at + 4 * count], _U32_CODE)
    payload_at = len_at + 4 * count
    if payload_at + sum(lengths) != end - 8 or flags & ~(HAS_TAG | HAS_NODE):
        raise FormatCorrupt("SEG-15", f"{where}: lengths or flags disagree with frame_len")
    if (not flags & HAS_NODE and nl) or (not flags & HAS_TAG and tl):
        raise FormatCorrupt("SEG-15", f"{where}: a label without its flag")
    try:
        node = str(mv[at : at + nl], "utf-8") if flags & HAS_NODE else None
        tag = str(mv[at + nl : ts_at], "utf-8") if flags & HAS_TAG else None
    except UnicodeDecodeError:
        raise FormatCorrupt("SEG-15", f"{where}: tag/node not UTF-8") from None
    if seq != expected_seq:
        raise FormatCorrupt("SEG-16", f"{where}: seq {seq}, expected {expected_seq}")
    return RunFrame(offset, end - offset, flags, seq, tag, node, tss, lengths, payload_at)


def _scan_runs(mv: memoryview, header: SegmentHeader) -> DataScan:
    records: list[RecordInfo] = []
    runs: list[tuple[int, int]] = []
    pos = HEADER_SIZE
    while pos < len(mv):
        try:
            run = read_run(mv, pos, header.first_seq + len(records))
        except FormatCorrupt as exc:
            return DataScan(header, records, DataProblem(pos, exc.rule, exc.detail), runs)
        runs.append((len(records), pos))
        offsets = accumulate(run.lengths, initial=run.payload_at)
        records += map(RecordInfo, offsets, run.lengths, range(run.seq, run.seq + len(run.tss)),
                       run.tss, repeat(run.flags), repeat(run.tag), repeat(run.node))  # fmt: skip
        pos += run.length
    return DataScan(header, records, None, runs)


def scan_data(data_buf: bytes | bytearray | memoryview) -> DataScan:
    """Walk every frame of a .data file (for ``verify``): checksums (SEG-2, SEG-15), consecutive
    seqs filling the file exactly (SEG-3, SEG-16). Raises Corrupt only for a bad header (SEG-1,
    SEG-14)."""
    header = decode_data_header(data_buf)
    mv = memoryview(data_buf)
    if header.version == DATA_VERSION_RUNS:
        return _scan_runs(mv, header)
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
