"""WAL files: a 64-byte file header, then XXH3-64-checksummed frames (spec/FORMATS.md WAL-1..).

The frame is WAL-3's, byte for byte. ``encode_append`` is on the single-append hot path, so
it is kept to one ``struct.pack``, one XXH3 call and one concatenation. ``encode_append_batch``
frames a whole run of records (WAL-14) with C-level calls only: lengths through ``map(len)``, one
join, one XXH3 pass; ``split_append_batch`` undoes it the same way on replay.
``scan`` is on the recovery path and must survive anything a crash leaves behind: it never
raises and never yields a frame whose checksum fails; it stops at the first frame it cannot
trust and says why.
"""

from __future__ import annotations

import re
import struct
import sys
from array import array
from collections.abc import Iterator, Sequence
from enum import IntEnum
from itertools import accumulate
from typing import Any, NamedTuple

import crc32c
import xxhash

from tidelog.errors import BadArgument

from . import FormatCorrupt, dumps_body, loads_body

__all__ = [
    "MAGIC",
    "VERSION",
    "HEADER_SIZE",
    "FRAME_HEADER_SIZE",
    "FRAME_OVERHEAD",
    "BATCH_DATA_MAX",
    "FrameType",
    "HAS_TAG",
    "HAS_NODE",
    "DURABLE",
    "BATCH_END",
    "KNOWN_FLAGS",
    "WalHeader",
    "Frame",
    "ScanResult",
    "WalScanner",
    "encode_header",
    "decode_header",
    "encode_append",
    "encode_plain",
    "encode_append_batch",
    "encode_run",
    "split_append_batch",
    "append_batch_lengths",
    "split_runs",
    "encode_control",
    "encode_file_end",
    "FILE_END_SIZE",
    "encode_synced",
    "SYNCED_SIZE",
    "DurableProof",
    "durable_proof",
    "reseed",
    "frame_seed",
    "scan",
    "scan_file",
    "split_batches",
    "batches_end",
    "first_nonzero",
    "file_name",
    "parse_file_name",
    "spare_name",
    "parse_spare_name",
]

MAGIC = b"TDLWAL01"
# written: 3 = frame checksums seeded with the file's gen and a FILE_END frame closing every
# file but the newest (WAL-15: files are recycled); 2 = may hold APPEND_BATCH frames (WAL-14)
VERSION = 3
VERSIONS = (1, 2, 3)  # read
HEADER_SIZE = 64

# magic | version | header_size | gen | shard | shard_count | created_ms | store_id | reserved
_HEADER = struct.Struct("<8sIIQIIQ16sI")
ALLOC_UNIT = 4096  # the header's ``reserved`` counts the file's size in these (WAL-1)
_U32 = struct.Struct("<I")
_U64 = struct.Struct("<Q")
_CRC_AT = _HEADER.size  # 60: the header CRC32C covers bytes [0, 60)

# frame_len | type | flags | topic_id | seq | ts | node_len | tag_len | data_len
_FRAME = struct.Struct("<IBBQQQHHI")
FRAME_HEADER_SIZE = _FRAME.size  # 38
FRAME_OVERHEAD = FRAME_HEADER_SIZE + 8  # 46: header + XXH3-64 trailer
# frame_len counts everything after itself: the fixed part of that is 46 - 4 = 42 bytes.
_LEN_FIXED = FRAME_OVERHEAD - 4

# Above this payload size hashing in pieces beats copying the frame twice (measured: for 1 MiB
# payloads the streaming form is ~18x faster; for 100 B payloads one concatenation is ~25% faster).
_STREAM_AT = 4096
_NO_SUM = bytes(8)  # the place of a frame's checksum, filled in once the rest is hashed


class FrameType(IntEnum):
    """Frame types (WAL-8). Numbers as WAL-8 fixes them."""

    APPEND = 1
    TOPIC_CREATE = 2
    TOPIC_DROP = 3
    ROUTER = 4
    REMOVE = 6
    EVICT = 7
    CHECKPOINT = 8
    QUEUE = 10
    HEAD_RESERVE = 11
    SUB_REGISTER = 12
    SUB_UNREGISTER = 13
    LOSS = 14
    PRODUCER = 15
    APPEND_BATCH = 16
    FILE_END = 17
    SYNCED = 18
    TIER = 19  # segments in the cold tier (spec/TIERING.md TIER-5)


_KNOWN_TYPES = frozenset(int(t) for t in FrameType)
_APPEND = int(FrameType.APPEND)
_APPEND_BATCH = int(FrameType.APPEND_BATCH)
_FILE_END = int(FrameType.FILE_END)
_SYNCED = int(FrameType.SYNCED)
_new = tuple.__new__

# APPEND_BATCH data (WAL-14): count u32 | count x u32 lengths | the payloads back to back.
# frame_len is a u32, so one frame holds at most this many data bytes (a larger run is split).
BATCH_DATA_MAX = 0xFFFF_FFFF - _LEN_FIXED - 2 * 0xFFFF
_BIG_ENDIAN = sys.byteorder == "big"
assert array("I").itemsize == 4

HAS_TAG = 0x01
HAS_NODE = 0x02
DURABLE = 0x04
BATCH_END = 0x08
KNOWN_FLAGS = HAS_TAG | HAS_NODE | DURABLE | BATCH_END

_FILE_NAME = re.compile(r"wal-([0-9a-f]{16})\.log")
_SPARE_NAME = re.compile(r"spare-([0-9a-f]{16})\.log")


# --- file header ----------------------------------------------------------------------------------


class WalHeader(NamedTuple):
    gen: int
    shard: int
    shard_count: int
    created_ms: int
    store_id: bytes
    version: int = VERSION
    header_size: int = HEADER_SIZE
    reserved: int = 0  # the file's size in ALLOC_UNITs when the header was written; 0: unknown

    @property
    def min_size(self) -> int:
        """The file is at least this long unless damaged (WAL-1: truncation is damage)."""
        return self.reserved * ALLOC_UNIT


def encode_header(
    gen: int,
    shard: int,
    shard_count: int,
    created_ms: int,
    store_id: bytes,
    version: int = VERSION,
    size: int = 0,
) -> bytes:
    """The 64-byte WAL file header (WAL-1); ``size``: the file's reserved size when its header
    is written (recorded in whole ALLOC_UNITs, rounded down; 0: none)."""
    if len(store_id) != 16:
        raise BadArgument(f"store_id must be 16 bytes, got {len(store_id)}")
    if not 0 <= shard < shard_count:
        raise BadArgument(f"shard {shard} is not in range for shard_count {shard_count}")
    if version not in VERSIONS:
        raise BadArgument(f"WAL version {version} is not one of {VERSIONS}")
    units = min(size // ALLOC_UNIT, 0xFFFFFFFF)
    head = _HEADER.pack(
        MAGIC, version, HEADER_SIZE, gen, shard, shard_count, created_ms, bytes(store_id), units
    )
    return head + _U32.pack(crc32c.crc32c(head))


def decode_header(buf: bytes | bytearray | memoryview) -> WalHeader:
    """Parse and check a WAL file header (WAL-1); raise Corrupt naming the first problem."""
    if len(buf) < HEADER_SIZE:
        raise FormatCorrupt(
            "WAL-1",
            f"WAL header: file is {len(buf)} bytes, shorter than the {HEADER_SIZE}-byte header",
        )
    magic, version, header_size, gen, shard, count, created, store_id, units = _HEADER.unpack_from(
        buf
    )
    if magic != MAGIC:
        raise FormatCorrupt("WAL-1", f"WAL header: bad magic {bytes(magic)!r}, expected {MAGIC!r}")
    # Version before CRC: a newer format may cover different bytes, so "unsupported version"
    # is the more useful message for a file written by a newer tidelog.
    if version not in VERSIONS:
        raise FormatCorrupt(
            "WAL-1",
            f"WAL header: unsupported version {version} (this reader knows "
            f"{', '.join(map(str, VERSIONS))})",
        )
    if header_size != HEADER_SIZE:
        raise FormatCorrupt(
            "WAL-1", f"WAL header: header_size {header_size}, expected {HEADER_SIZE}"
        )
    (stored,) = _U32.unpack_from(buf, _CRC_AT)
    actual = crc32c.crc32c(memoryview(buf)[:_CRC_AT])
    if stored != actual:
        raise FormatCorrupt(
            "WAL-1", f"WAL header: CRC32C mismatch (stored {stored:#010x}, computed {actual:#010x})"
        )
    if not 0 <= shard < count:
        raise FormatCorrupt(
            "WAL-1", f"WAL header: shard {shard} out of range for shard_count {count}"
        )
    return WalHeader(gen, shard, count, created, bytes(store_id), version, header_size, units)


def frame_seed(header: WalHeader) -> int:
    """The XXH3-64 seed of the file's frames (WAL-3): its gen from version 3 on (WAL-15: a
    recycled file's frames of an older gen then fail their checksum), 0 before."""
    return header.gen if header.version >= 3 else 0


# --- frames ---------------------------------------------------------------------------------------


class Frame(NamedTuple):
    """One checksum-valid frame. ``offset`` is where its frame_len field starts and ``length``
    the whole frame's size including that field, so ``offset + length`` is the next frame."""

    type: int
    flags: int
    topic_id: int
    seq: int
    ts: int
    node: str | None
    tag: str | None
    data: bytes
    offset: int
    length: int

    @property
    def body(self) -> dict[str, Any]:
        """The parsed JSON body of a control frame (WAL-9); Corrupt if it is not a JSON object."""
        if self.type == _APPEND or self.type == _APPEND_BATCH:
            raise TypeError("an APPEND frame carries payloads, not a JSON body")
        return loads_body(self.data, f"WAL frame at offset {self.offset}", "WAL-9")

    @property
    def batch_end(self) -> bool:
        return bool(self.flags & BATCH_END)

    @property
    def durable(self) -> bool:
        return bool(self.flags & DURABLE)


def _frame(
    ftype: int,
    flags: int,
    topic_id: int,
    seq: int,
    ts: int,
    nb: bytes,
    tb: bytes,
    data: bytes | bytearray | memoryview,
    seed: int = 0,
) -> bytes:
    n = len(data)
    try:
        head = _FRAME.pack(
            _LEN_FIXED + len(nb) + len(tb) + n, ftype, flags, topic_id, seq, ts, len(nb), len(tb), n
        )
    except struct.error as exc:
        raise BadArgument(f"WAL frame field out of range ({exc})") from None
    if n < _STREAM_AT:
        body = head + nb + tb + data
        return body + _U64.pack(xxhash.xxh3_64_intdigest(body[4:], seed))
    h = xxhash.xxh3_64(head[4:], seed)
    h.update(nb)
    h.update(tb)
    h.update(data)
    return b"".join((head, nb, tb, data, _U64.pack(h.intdigest())))


def encode_append(
    topic_id: int,
    seq: int,
    ts: int,
    tag: str | None,
    node: str | None,
    payload: bytes | bytearray | memoryview,
    *,
    batch_end: bool,
    durable: bool,
    seed: int = 0,
) -> bytes:
    """One APPEND frame (WAL-3). ``tag``/``node`` None and "" differ: HAS_TAG/HAS_NODE say which
    (WAL-6). ``batch_end`` marks the last frame of one op (WAL-7). ``seed``: the file's
    (``frame_seed``)."""
    flags, nb, tb = _labels(tag, node, batch_end, durable)
    return _frame(_APPEND, flags, topic_id, seq, ts, nb, tb, payload, seed)


_pack_head = _FRAME.pack
_pack_u64 = _U64.pack
_xxh3 = xxhash.xxh3_64_intdigest


def encode_plain(
    topic_id: int, seq: int, ts: int, payload: bytes, flags: int, seed: int, synced: int = 0
) -> bytes:
    """``encode_append`` of a record without tag or node, its ``flags`` given (``BATCH_END``,
    ``DURABLE``), byte for byte: the frame a lone durable append writes (``WalShard``'s direct
    path), without the calls ``encode_append`` makes per record (``_labels``, ``_frame``).
    ``synced``: if not 0, ``encode_synced(seed, synced)`` comes first (WAL-16: the SYNCED frame
    that rides with the op), built in the same join from the same layout (``_SYNCED_MID``).

    A second APPEND encoder beside ``encode_append``/``_frame``, kept for speed: a change to
    the APPEND frame (WAL-3) changes both, and so does one to the SYNCED frame here and in
    ``encode_synced``. tests/unit/test_wal_direct.py
    (``test_WAL_3_WAL_16_encode_plain_is_encode_append_without_labels``) pins them byte for
    byte."""
    n = len(payload)
    if n >= _STREAM_AT:
        frame = _frame(_APPEND, flags, topic_id, seq, ts, b"", b"", payload, seed)
        return encode_synced(seed, synced) + frame if synced else frame
    try:
        body = _pack_head(_LEN_FIXED + n, _APPEND, flags, topic_id, seq, ts, 0, 0, n) + payload
    except struct.error as exc:
        raise BadArgument(f"WAL frame field out of range ({exc})") from None
    if not synced:
        return body + _pack_u64(_xxh3(body[4:], seed))
    mark = _SYNCED_MID + _pack_gen_synced(seed, synced) + _SYNCED_POST  # as encode_synced
    return b"".join(
        (_SYNCED_LEN, mark, _pack_u64(_xxh3(mark, seed)), body, _pack_u64(_xxh3(body[4:], seed)))
    )


def _labels(
    tag: str | None, node: str | None, batch_end: bool, durable: bool
) -> tuple[int, bytes, bytes]:
    """(flags, node bytes, tag bytes) of a record frame (WAL-6)."""
    flags = (BATCH_END if batch_end else 0) | (DURABLE if durable else 0)
    if tag is None:
        tb = b""
    else:
        tb = tag.encode("utf-8")
        flags |= HAS_TAG
    if node is None:
        nb = b""
    else:
        nb = node.encode("utf-8")
        flags |= HAS_NODE
    return flags, nb, tb


def encode_run(
    topic_id: int,
    first_seq: int,
    ts: int,
    tag: str | None,
    node: str | None,
    payloads: Sequence[bytes],
    *,
    batch_end: bool,
    durable: bool,
    seed: int = 0,
    sizes: list[int] | None = None,
    total: int | None = None,
) -> bytes | bytearray:
    """The frame of one run of records sharing ts, tag and node: APPEND for one record,
    APPEND_BATCH for more (WAL-14). ``sizes``, ``total``: as ``encode_append_batch``'s."""
    if len(payloads) == 1:
        return encode_append(
            topic_id, first_seq, ts, tag, node, payloads[0], batch_end=batch_end,
            durable=durable, seed=seed,
        )  # fmt: skip
    return encode_append_batch(
        topic_id, first_seq, ts, tag, node, payloads, batch_end=batch_end, durable=durable,
        seed=seed, sizes=sizes, total=total,
    )  # fmt: skip


def encode_append_batch(
    topic_id: int,
    first_seq: int,
    ts: int,
    tag: str | None,
    node: str | None,
    payloads: Sequence[bytes],
    *,
    batch_end: bool,
    durable: bool,
    limit: int = BATCH_DATA_MAX,
    seed: int = 0,
    sizes: list[int] | None = None,
    total: int | None = None,
) -> bytes | bytearray:
    """APPEND_BATCH frames (WAL-14) for records ``first_seq ..`` of one run sharing ``ts``, tag
    and node: each payload's length in a u32 array, the payloads back to back, one XXH3-64 over
    all of it, with no Python-level loop per record. One frame, unless the data would exceed
    ``limit`` bytes (u32 ``data_len``): then consecutive frames, ``batch_end`` on the last.
    ``sizes``: the payloads' lengths, when the caller has taken them (a ``len`` per payload is
    most of what encoding a batch of small records costs); ``total``: their sum, when the
    caller has taken that too (the engine has, for its size checks)."""
    if not payloads:
        raise BadArgument("an APPEND_BATCH frame holds at least one record")
    flags, nb, tb = _labels(tag, node, batch_end, durable)
    n = len(payloads)
    if sizes is None:
        sizes = list(map(len, payloads))  # a list: summed without an int per item, then copied
    elif len(sizes) != n:
        raise BadArgument(f"{len(sizes)} sizes for {n} payloads")
    try:
        lens = array("I", sizes)
    except OverflowError:
        raise BadArgument("a payload of 4 GiB or more does not fit a WAL frame") from None
    size = 4 + 4 * n + (sum(sizes) if total is None else total)
    if size > limit:
        parts = split_runs(lens, limit)
        return b"".join(
            encode_append_batch(
                topic_id,
                first_seq + lo,
                ts,
                tag,
                node,
                payloads[lo:hi],
                batch_end=batch_end and hi == n,
                durable=durable,
                limit=limit,
                seed=seed,
                sizes=sizes[lo:hi],
            )
            for lo, hi in parts
        )
    if _BIG_ENDIAN:
        lens.byteswap()
    try:
        head = _FRAME.pack(
            _LEN_FIXED + len(nb) + len(tb) + size,
            _APPEND_BATCH,
            flags,
            topic_id,
            first_seq,
            ts,
            len(nb),
            len(tb),
            size,
        )
    except struct.error as exc:
        raise BadArgument(f"WAL frame field out of range ({exc})") from None
    # one buffer with room for the checksum, filled in place: ``body + checksum`` would copy
    # the whole frame again into fresh memory (page faults, on a VM as dear as the copy)
    # (one list: a tuple with ``*payloads`` would copy their references twice more)
    pieces: list[Any] = [head, nb, tb, _U32.pack(n), lens]
    pieces += payloads
    pieces.append(_NO_SUM)
    frame = bytearray().join(pieces)
    with memoryview(frame) as mv:
        _U64.pack_into(frame, len(frame) - 8, xxhash.xxh3_64_intdigest(mv[4:-8], seed))
    return frame


def split_runs(sizes: Sequence[int], limit: int = BATCH_DATA_MAX) -> list[tuple[int, int]]:
    """Cut a run of records with these payload sizes into [lo, hi) index ranges whose
    APPEND_BATCH data (4 + 4 per record + payloads) stays within ``limit`` bytes. Almost always
    one range; only runs of gigabytes are cut. Each record must fit alone."""
    n = len(sizes)
    if 4 + 4 * n + sum(sizes) <= limit:
        return [(0, n)]
    out: list[tuple[int, int]] = []
    lo, used = 0, 4
    for i, size in enumerate(sizes):
        if 4 + size + 4 > limit:
            raise BadArgument(f"a payload of {size} bytes does not fit a WAL frame")
        if used + 4 + size > limit:
            out.append((lo, i))
            lo, used = i, 4
        used += 4 + size
    out.append((lo, n))
    return out


def split_append_batch(data: bytes, where: str) -> list[bytes]:
    """The payloads of an APPEND_BATCH frame's ``data`` (WAL-14), with C-level calls only. The
    frame passed its checksum, so lengths that disagree with ``data_len`` are a writer bug, not
    a torn write: Corrupt naming ``where``."""
    n, lens = append_batch_lengths(data, where)
    start = 4 + 4 * n
    if n == 1:
        return [data[start:]]
    ends = list(accumulate(lens, initial=start))
    return list(map(data.__getitem__, map(slice, ends, ends[1:])))


def append_batch_lengths(data: bytes | memoryview, where: str) -> tuple[int, array[int]]:
    """(count, payload lengths) of an APPEND_BATCH frame's ``data`` (WAL-14), checked: the
    lengths must add up to what ``data_len`` leaves after the table (else Corrupt naming
    ``where``: a writer bug, since the frame passed its checksum)."""
    size = len(data)
    if size < 8:
        raise FormatCorrupt("WAL-14", f"{where}: APPEND_BATCH data of {size} bytes")
    (n,) = _U32.unpack_from(data, 0)
    start = 4 + 4 * n
    if n == 0 or start > size:
        raise FormatCorrupt("WAL-14", f"{where}: APPEND_BATCH count {n} in {size} data bytes")
    lens = array("I")
    lens.frombytes(data[4:start])
    if _BIG_ENDIAN:
        lens.byteswap()
    # equal lengths (one append_many of equal payloads): one byte compare instead of an int
    # object per record in sum() (most of a crash recovery's per-record work, WTAIL-1)
    total = lens[0] * n if lens.tobytes() == lens[:1].tobytes() * n else sum(lens)
    if start + total != size:
        raise FormatCorrupt(
            "WAL-14",
            f"{where}: APPEND_BATCH lengths add up to {total} bytes, data_len leaves "
            f"{size - start}",
        )
    return n, lens


def encode_control(
    ftype: int,
    topic_id: int,
    body: dict[str, Any] | bytes,
    *,
    seq: int = 0,
    ts: int = 0,
    durable: bool = False,
    batch_end: bool = True,
    seed: int = 0,
) -> bytes:
    """A control frame whose ``data`` is ``body`` as compact JSON (WAL-9), or ``body`` itself
    when the caller encoded it already with ``dumps_body`` (a body it writes again and again).
    A control op is a batch of its own unless the caller chains it into a multi-frame op
    (``batch_end=False``)."""
    if ftype in (_APPEND, _APPEND_BATCH) or not 0 <= ftype <= 255:
        raise BadArgument(f"{ftype} is not a control frame type")
    flags = (BATCH_END if batch_end else 0) | (DURABLE if durable else 0)
    data = body if isinstance(body, bytes) else dumps_body(body)
    return _frame(ftype, flags, topic_id, seq, ts, b"", b"", data, seed)


def encode_file_end(seed: int) -> bytes:
    """The FILE_END frame that closes a version-3 file's log (WAL-15)."""
    return encode_control(_FILE_END, 0, {}, seed=seed)


FILE_END_SIZE = len(encode_file_end(0))  # room a writer keeps for it at the end of a file


SYNCED_SIZE = FRAME_OVERHEAD + len(dumps_body({}))  # 48


def encode_synced(gen: int, synced: int) -> bytes:
    """The SYNCED frame (WAL-16) a writer places in the file of ``gen`` once every byte of it
    before offset ``synced`` is durable: ``seq`` is the file's gen (so a recycled file's older
    SYNCED frames never match ``durable_proof``'s search), ``ts`` the offset. The control frame
    ``encode_control`` would make, byte for byte, without its JSON encoding: one rides with
    every fsync append, so it is one pack and one XXH3."""
    mark = _SYNCED_MID + _pack_gen_synced(gen, synced) + _SYNCED_POST  # what the XXH3 covers
    return b"".join((_SYNCED_LEN, mark, _pack_u64(_xxh3(mark, gen))))


# The SYNCED frame's one layout (WAL-16), for ``encode_synced``, ``encode_plain`` and
# ``durable_proof`` alike: its head is fixed but for seq (the gen) and ts (the offset), so it is
# built as the fixed bytes around one pack of those two, with no Python call of its own and no
# slice for the checksum: no dearer than one pack of all ten fields, which every fsync append
# pays (``encode_plain``).
_SYNCED_FIXED = struct.pack(
    "<IBBQQQHHI2s", SYNCED_SIZE - 4, _SYNCED, BATCH_END, 0, 0, 0, 0, 0, 2, b"{}"
)
_SYNCED_LEN = _SYNCED_FIXED[:4]  # frame_len
_SYNCED_MID = _SYNCED_FIXED[4:14]  # type, flags, topic_id: then seq and ts
_SYNCED_POST = _SYNCED_FIXED[30:]  # node_len, tag_len, data_len, data
_pack_gen_synced = struct.Struct("<QQ").pack


class DurableProof(NamedTuple):
    """A SYNCED frame at ``offset`` showing every byte before ``synced`` was durable."""

    offset: int
    synced: int


def durable_proof(
    buf: Any, end: int, gen: int, regions: Sequence[tuple[int, int]] | None = None
) -> DurableProof | None:
    """The first valid SYNCED frame of the file of ``gen`` at or after ``end`` that shows the
    byte at ``end`` was durable before it was written (WAL-16, FLT-1): then whatever stopped
    the log at ``end`` is damage, not a torn tail. ``buf`` supports ``find`` (bytes, bytearray,
    mmap): the search is for the frame's first 22 bytes, which name this file's gen, so it
    runs at memory speed and a recycled file's older frames never match. ``regions``: the
    ``[start, end)`` ranges that may hold data (``SEEK_DATA``); a frame is never in a hole, so
    the search skips a preallocated file's unwritten blocks instead of reading them."""
    pattern = _SYNCED_LEN + _SYNCED_MID + _pack_u64(gen)  # frame_len .. seq (the gen)
    mv = memoryview(buf)
    if mv.format != "B" or mv.ndim != 1:
        mv = mv.cast("B")
    try:
        for lo, hi in regions if regions is not None else [(end, len(mv))]:
            pos = max(lo, end)
            while (hit := buf.find(pattern, pos, hi)) >= 0:
                got = _decode_at(mv, hit, True, gen)
                if isinstance(got, Frame) and got.ts > end:
                    return DurableProof(hit, got.ts)
                pos = hit + 1
        return None
    finally:
        mv.release()


def reseed(chunk: bytes | bytearray, seed: int) -> bytes:
    """``chunk`` (whole frames back to back) with every frame's checksum recomputed with
    ``seed``: a writer encodes an op's frames for the file it expects, and re-seals them in the
    rare case the op starts the next file instead (WAL-15)."""
    out = bytearray(chunk)
    mv = memoryview(out)
    pos = 0
    while pos < len(out):
        (frame_len,) = _U32.unpack_from(out, pos)
        cs_at = pos + 4 + frame_len - 8
        _U64.pack_into(out, cs_at, xxhash.xxh3_64_intdigest(mv[pos + 4 : cs_at], seed))
        pos = cs_at + 8
    mv.release()
    return bytes(out)


# --- scanning -------------------------------------------------------------------------------------


class ScanResult(NamedTuple):
    """``status`` is "clean" (a zero frame_len, the end of the buffer, or a FILE_END frame) or
    "torn" (the frame at ``end`` is incomplete or damaged, or a frame of an older gen of a
    recycled file; ``detail`` says how). ``unknown`` lists the offsets of checksum-valid frames
    of unknown type (skipped by length, WAL-8). ``sealed``: the log ended with a FILE_END frame
    (WAL-15), which is not in ``frames``; ``end`` is then the offset after it."""

    frames: list[Frame]
    end: int
    status: str
    detail: str
    unknown: list[int]
    sealed: bool = False


class _Stop(NamedTuple):
    status: str
    detail: str


def _decode_at(mv: memoryview, pos: int, copy: bool = True, seed: int = 0) -> Frame | _Stop:
    """The frame at ``pos``, or why the log ends there (WAL-4, WAL-5)."""
    left = len(mv) - pos
    if left == 0:
        return _Stop("clean", "end of file")
    if left < 4:
        if not any(mv[pos:]):
            return _Stop("clean", "zero padding at end of file")
        return _Stop("torn", f"{left} bytes left, too few for a frame_len")
    (frame_len,) = _U32.unpack_from(mv, pos)
    if frame_len == 0:
        return _Stop("clean", "zero frame_len")
    if frame_len < _LEN_FIXED:
        return _Stop("torn", f"frame_len {frame_len} is below the minimum {_LEN_FIXED}")
    if frame_len > left - 4:
        return _Stop("torn", f"frame_len {frame_len} overruns the file ({left - 4} bytes left)")
    _, ftype, flags, topic_id, seq, ts, nl, tl, dl = _FRAME.unpack_from(mv, pos)
    if _LEN_FIXED + nl + tl + dl != frame_len:
        return _Stop(
            "torn",
            f"node_len {nl} + tag_len {tl} + data_len {dl} disagree with frame_len {frame_len}",
        )
    cs_at = pos + 4 + frame_len - 8
    (stored,) = _U64.unpack_from(mv, cs_at)
    if xxhash.xxh3_64_intdigest(mv[pos + 4 : cs_at], seed) != stored:
        return _Stop("torn", "XXH3-64 checksum mismatch (a torn frame, or one of an older gen)")
    at = pos + FRAME_HEADER_SIZE
    try:
        node = str(mv[at : at + nl], "utf-8") if flags & HAS_NODE else None
        tag = str(mv[at + nl : at + nl + tl], "utf-8") if flags & HAS_TAG else None
    except UnicodeDecodeError:
        return _Stop("torn", "tag or node is not valid UTF-8")
    if (node is None and nl) or (tag is None and tl):
        return _Stop("torn", "tag or node bytes present but HAS_TAG/HAS_NODE unset")
    data: Any = mv[at + nl + tl : cs_at]
    if copy or (ftype != _APPEND and ftype != _APPEND_BATCH):
        data = bytes(data)
    # tuple.__new__: a NamedTuple without its Python-level __new__ (replay decodes every frame)
    return _new(Frame, (ftype, flags, topic_id, seq, ts, node, tag, data, pos, frame_len + 4))


class WalScanner:
    """Iterate the valid frames of a WAL image from ``start``; afterwards ``end``, ``status``,
    ``detail`` and ``unknown`` describe where and why the log ended (as in ``ScanResult``).
    For large files: frames are produced one at a time, nothing is accumulated."""

    def __init__(
        self, buf: bytes | bytearray | memoryview, start: int = HEADER_SIZE, seed: int = 0
    ) -> None:
        self._mv = memoryview(buf)
        self._seed = seed
        self.end = start
        self.status = ""
        self.detail = ""
        self.unknown: list[int] = []
        self.sealed = False

    def __iter__(self) -> Iterator[Frame]:
        mv = self._mv
        if mv.format != "B" or mv.ndim != 1:
            mv = mv.cast("B")
        pos = self.end
        if pos > len(mv):
            self.status, self.detail = "torn", f"start {pos} is past the end of the file"
            return
        while True:
            got = _decode_at(mv, pos, True, self._seed)
            if isinstance(got, _Stop):
                self.end, self.status, self.detail = pos, got.status, got.detail
                return
            if got.type == _FILE_END:
                self.end, self.status, self.detail = pos + got.length, "clean", "FILE_END"
                self.sealed = True
                return
            if got.type not in _KNOWN_TYPES:
                self.unknown.append(pos)
            pos += got.length
            self.end = pos
            yield got


def scan(
    buf: bytes | bytearray | memoryview,
    start: int = HEADER_SIZE,
    *,
    copy: bool = True,
    seed: int = 0,
) -> ScanResult:
    """Every valid frame from ``start`` up to the first zero frame_len, end of buffer, FILE_END
    frame (WAL-15), or frame that cannot be trusted (WAL-4, WAL-5); frames are checked with
    ``seed`` (the file's, ``frame_seed``). Never raises on garbage. Runs of frames without
    tag or node (the common case) are decoded by an inlined loop (recovery replays every
    frame); anything else, including where the log ends, goes through ``_decode_at``.
    ``copy=False``: the ``data`` of APPEND and APPEND_BATCH frames is a memoryview into
    ``buf`` instead of a copy (the writer's recovery serves them from the map, WTAIL-1)."""
    mv = memoryview(buf)
    if mv.format != "B" or mv.ndim != 1:
        mv = mv.cast("B")
    if start > len(mv):
        return ScanResult([], start, "torn", f"start {start} is past the end of the file", [])
    frames: list[Frame] = []
    unknown: list[int] = []
    pos = start
    while True:
        pos = _plain_run(mv, pos, frames, unknown, copy, seed)
        if frames and frames[-1].type == _FILE_END:  # nothing after it is read (WAL-15)
            frames.pop()
            return ScanResult(frames, pos, "clean", "FILE_END", unknown, True)
        got = _decode_at(mv, pos, copy, seed)
        if isinstance(got, _Stop):
            return ScanResult(frames, pos, got.status, got.detail, unknown)
        if got.type == _FILE_END:
            return ScanResult(frames, pos + got.length, "clean", "FILE_END", unknown, True)
        if got.type not in _KNOWN_TYPES:
            unknown.append(pos)
        frames.append(got)
        pos += got.length


def scan_file(buf: bytes | bytearray | memoryview, start: int = HEADER_SIZE) -> ScanResult:
    """``scan`` of a whole WAL file image from ``start``, with the seed its header names (WAL-3,
    WAL-15); Corrupt if the header is not valid (WAL-1)."""
    return scan(buf, start, seed=frame_seed(decode_header(buf)))


def _plain_run(
    mv: memoryview,
    pos: int,
    frames: list[Frame],
    unknown: list[int],
    copy: bool = True,
    seed: int = 0,
) -> int:
    """Decode consecutive valid frames without tag or node from ``pos`` into ``frames``; return
    the offset of the first one it does not take (labelled, damaged, or the log's end), for
    ``_decode_at`` to judge, or the offset after a FILE_END frame, the last it takes. The checks
    are exactly ``_decode_at``'s for such frames."""
    size = len(mv)
    unpack, unpack_u64, digest = _FRAME.unpack_from, _U64.unpack_from, xxhash.xxh3_64_intdigest
    append, known, labels = frames.append, _KNOWN_TYPES, HAS_TAG | HAS_NODE
    while pos + FRAME_OVERHEAD <= size:
        frame_len, ftype, flags, topic_id, seq, ts, nl, tl, dl = unpack(mv, pos)
        if nl or tl or flags & labels or frame_len != _LEN_FIXED + dl or frame_len > size - pos - 4:
            return pos
        cs_at = pos + frame_len - 4
        if digest(mv[pos + 4 : cs_at], seed) != unpack_u64(mv, cs_at)[0]:
            return pos
        if ftype not in known:
            unknown.append(pos)
        data: Any = mv[pos + FRAME_HEADER_SIZE : cs_at]
        if copy or (ftype != _APPEND and ftype != _APPEND_BATCH):
            data = bytes(data)
        append(_new(Frame, (ftype, flags, topic_id, seq, ts, None, None, data, pos, frame_len + 4)))
        pos = cs_at + 8
        if ftype == _FILE_END:
            return pos
    return pos


def batches_end(frames: list[Frame], start: int) -> int:
    """Where the last complete op batch (WAL-7) among ``frames``, scanned from ``start``, ends:
    the end of the log replay applies."""
    for f in reversed(frames):
        if f.flags & BATCH_END:
            return f.offset + f.length
    return start


def split_batches(frames: list[Frame]) -> tuple[list[list[Frame]], list[Frame]]:
    """Group frames into ops (WAL-7): complete batches end with a BATCH_END frame; the trailing
    frames without one (a torn batch) are returned separately, for replay to discard."""
    batches: list[list[Frame]] = []
    current: list[Frame] = []
    for frame in frames:
        current.append(frame)
        if frame.flags & BATCH_END:
            batches.append(current)
            current = []
    return batches, current


def first_nonzero(buf: bytes | bytearray | memoryview, start: int) -> int | None:
    """Offset of the first non-zero byte at or after ``start`` (None if all zero). After a
    clean end the rest of a preallocated file should be zeros (WAL-4)."""
    mv = memoryview(buf)
    chunk = 1 << 20
    for lo in range(start, len(mv), chunk):
        piece = bytes(mv[lo : lo + chunk])
        rest = piece.lstrip(b"\0")
        if rest:
            return lo + len(piece) - len(rest)
    return None


# --- names ----------------------------------------------------------------------------------------


def file_name(gen: int) -> str:
    """``wal-<gen:016x>.log`` (WAL-10)."""
    return f"wal-{gen:016x}.log"


def parse_file_name(name: str) -> int | None:
    m = _FILE_NAME.fullmatch(name)
    return int(m.group(1), 16) if m else None


def spare_name(gen: int) -> str:
    """``spare-<gen:016x>.log``: a retired WAL file kept for recycling (WAL-15)."""
    return f"spare-{gen:016x}.log"


def parse_spare_name(name: str) -> int | None:
    m = _SPARE_NAME.fullmatch(name)
    return int(m.group(1), 16) if m else None
