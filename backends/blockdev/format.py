"""Byte formats of the blockdev ring (spec/FORMATS-blockdev.md, rules BDEV-*): pure codecs.

The device is a 4 KiB metadata block (two 2 KiB slots, BDEV-2..BDEV-5) followed by
``page_count`` pages of ``page_size`` bytes. A page holds records packed from its start and a
64-byte trailer at its end (BDEV-6..BDEV-9). Everything here is bytes in, values out: the backend,
``verify`` and the golden-vector tests share one definition of each structure.

Decoders of structures that a crash may legitimately leave torn (pages, slots) report invalid
bytes as ``None`` or ``FormatCorrupt`` so callers can treat them as "not written"; damage that no
crash explains (a page whose checksum matches but whose records do not parse) is a
``FormatCorrupt`` naming the rule it breaks.
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass
from typing import Any

import crc32c

from tidelog.errors import Corrupt

__all__ = [
    "FormatCorrupt",
    "META_BYTES",
    "SLOT_BYTES",
    "SLOT_HEADER_BYTES",
    "SLOT_BODY_MAX",
    "TRAILER_BYTES",
    "MIN_PAGE_SIZE",
    "MAX_PAGE_SIZE",
    "RECORD_OVERHEAD_MAX",
    "SLOT_MAGIC",
    "PAGE_MAGIC",
    "VERSION",
    "HAS_TAG",
    "HAS_NODE",
    "BATCH_END",
    "MARK",
    "CARRIED",
    "PAGE_PARTIAL",
    "PAGE_LOSS",
    "PageHeader",
    "RecordOut",
    "MarkOut",
    "Entry",
    "Slot",
    "checksum",
    "page_capacity",
    "max_payload",
    "record_size",
    "encode_record",
    "encode_mark",
    "mark_size",
    "encode_page",
    "encode_loss_page",
    "decode_trailer",
    "unchecked_trailer",
    "decode_entries",
    "encode_slot",
    "decode_slot",
    "unchecked_slot_ring_id",
    "dumps_body",
    "slot_index",
]

META_BYTES = 4096  # BDEV-1: the metadata block before page 0
SLOT_BYTES = 2048  # BDEV-2: two slots, written alternately
SLOT_HEADER_BYTES = 52
SLOT_CRC_OFFSET = SLOT_BYTES - 4
SLOT_BODY_MAX = SLOT_CRC_OFFSET - SLOT_HEADER_BYTES  # 1992 bytes of JSON
TRAILER_BYTES = 64  # BDEV-7
MIN_PAGE_SIZE = 512  # one sector: the unit a device writes atomically-or-torn (CRASH-1)
MAX_PAGE_SIZE = 16 << 20
RECORD_OVERHEAD_MAX = 16  # flags (1) + ts delta (<= 10) + payload length (<= 5): BDEV-8
SLOT_MAGIC = b"TDLRING1"
PAGE_MAGIC = b"TDLP"
VERSION = 1

# entry flags (BDEV-8, BDEV-9)
HAS_TAG = 0x01
HAS_NODE = 0x02
BATCH_END = 0x04  # the last entry of an op: replay keeps an op only up to its BATCH_END
MARK = 0x08  # a producer mark (TOP-11), not a record: it has no seq
CARRIED = 0x10  # a mark copied forward from the page being overwritten (not part of an op)
_RECORD_FLAGS = HAS_TAG | HAS_NODE | BATCH_END
_MARK_FLAGS = MARK | BATCH_END | CARRIED
MAX_PRODUCER_ID = 200
# page flags (BDEV-7)
PAGE_PARTIAL = 0x0001  # sealed before it was full (fsync commit, flush, close)
PAGE_LOSS = 0x0002  # written by repair in place of a damaged page: no entries, seqs lost (BDEV-25)
_PAGE_FLAGS = PAGE_PARTIAL | PAGE_LOSS

_SLOT_HEAD = struct.Struct("<8sHHB3xQQIIQI")  # 52 bytes, see BDEV-3
_TRAILER = struct.Struct("<QQQQIIHHI8x4sI")  # 64 bytes, see BDEV-7
assert _SLOT_HEAD.size == SLOT_HEADER_BYTES and _TRAILER.size == TRAILER_BYTES


class FormatCorrupt(Corrupt):
    """A ``Corrupt`` raised by a codec: ``rule`` is the BDEV rule the bytes break (``verify``
    reports it), ``detail`` the message without the rule suffix, ``page`` the ring page it is
    about when known (its byte offset goes into the message recovery raises)."""

    def __init__(self, rule: str, detail: str, page: int | None = None) -> None:
        super().__init__(f"{detail} ({rule})")
        self.rule = rule
        self.detail = detail
        self.page = page


def checksum(*parts: bytes | bytearray | memoryview) -> int:
    """CRC32C (Castagnoli) over the concatenation of ``parts`` (BDEV-1)."""
    value = 0
    for part in parts:
        value = crc32c.crc32c(part, value)
    return value


# -- varints (BDEV-8) ------------------------------------------------------------------------------
def _uleb(n: int) -> bytes:
    out = bytearray()
    while True:
        byte = n & 0x7F
        n >>= 7
        if n:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def _read_uleb(buf: bytes | memoryview, pos: int, end: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        if pos >= end or shift > 63:
            raise FormatCorrupt("BDEV-8", "truncated or overlong varint in a record")
        byte = buf[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, pos
        shift += 7


def _zigzag(n: int) -> int:
    return (n << 1) if n >= 0 else ((-n) << 1) - 1


def _unzigzag(z: int) -> int:
    return (z >> 1) if not z & 1 else -((z + 1) >> 1)


# -- records ---------------------------------------------------------------------------------------
def page_capacity(page_size: int) -> int:
    """Bytes of a page that hold records (everything but the trailer)."""
    return page_size - TRAILER_BYTES


def max_payload(page_size: int) -> int:
    """The largest payload that always fits in one page (no tag, no node): BDEV-8."""
    return page_capacity(page_size) - RECORD_OVERHEAD_MAX


def record_size(ts_delta: int, tag: bytes | None, node: bytes | None, payload_len: int) -> int:
    """Encoded size of one record (what ``encode_record`` would return)."""
    n = 1 + len(_uleb(_zigzag(ts_delta))) + len(_uleb(payload_len)) + payload_len
    if tag is not None:
        n += len(_uleb(len(tag))) + len(tag)
    if node is not None:
        n += len(_uleb(len(node))) + len(node)
    return n


def encode_record(
    ts_delta: int, tag: bytes | None, node: bytes | None, payload: bytes, batch_end: bool
) -> bytes:
    """One record: flags, zigzag ts delta, payload length, [tag], [node], payload (BDEV-8)."""
    flags = (HAS_TAG if tag is not None else 0) | (HAS_NODE if node is not None else 0)
    parts = [
        bytes([flags | (BATCH_END if batch_end else 0)]),
        _uleb(_zigzag(ts_delta)),
        _uleb(len(payload)),
    ]
    if tag is not None:
        parts += [_uleb(len(tag)), tag]
    if node is not None:
        parts += [_uleb(len(node)), node]
    parts.append(payload)
    return b"".join(parts)


@dataclass(frozen=True, slots=True)
class RecordOut:
    """A decoded record: its seq is the page's ``first_seq`` plus the number of records before
    it in the page (BDEV-8)."""

    seq: int
    ts: int
    tag: str | None
    node: str | None
    payload: bytes
    batch_end: bool


@dataclass(frozen=True, slots=True)
class MarkOut:
    """A decoded producer mark (BDEV-9): producer ``pid`` applied sequence ``n``."""

    pid: str
    n: int
    batch_end: bool
    carried: bool


Entry = RecordOut | MarkOut


def encode_mark(pid: bytes, n: int, *, carried: bool) -> bytes:
    """A producer mark: flags, pid length, pid, sequence (BDEV-9)."""
    flags = MARK | (CARRIED if carried else 0)
    return bytes([flags]) + _uleb(len(pid)) + pid + _uleb(n)


def mark_size(pid: bytes, n: int) -> int:
    return 1 + len(_uleb(len(pid))) + len(pid) + len(_uleb(n))


# -- pages -----------------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class PageHeader:
    """The trailer fields of a page (BDEV-7)."""

    first_seq: int  # seq of its first record (with no record: the seq the next one gets)
    floor: int  # the topic's evict_floor when the page was sealed
    min_hwm: int  # the lowest subscriber hwm when sealed (0: no subscriber)
    meta_gen: int  # generation of the newest metadata slot written before this page
    count: int  # records (marks are not counted)
    used: int
    page_seq: int  # RING-1
    flags: int
    lap: int  # lap number mod 2**32 (informational; page_seq carries the parity)

    @property
    def last_seq(self) -> int:
        return self.first_seq + self.count - 1

    @property
    def loss(self) -> bool:
        """A LOSS page (BDEV-25): its ``count`` seqs from ``first_seq`` are lost."""
        return bool(self.flags & PAGE_LOSS)


def _trailer_bytes(h: PageHeader) -> bytes:
    return _TRAILER.pack(
        h.first_seq,
        h.floor,
        h.min_hwm,
        h.meta_gen,
        h.count,
        h.used,
        h.page_seq,
        h.flags,
        h.lap & 0xFFFFFFFF,
        PAGE_MAGIC,
        0,
    )[: TRAILER_BYTES - 4]


def encode_page(page_size: int, ring_id: int, body: bytes, header: PageHeader) -> bytes:
    """A whole page: records, zero padding, trailer with the CRC32C of ring id + records +
    trailer (BDEV-6, BDEV-7; RING-5: the ring id makes pages of another format invalid)."""
    cap = page_capacity(page_size)
    if len(body) != header.used or header.used > cap or header.used < 1:
        raise ValueError(f"bad page: {header.used} bytes used of {cap}, {header.count} records")
    head = _trailer_bytes(header)
    crc = checksum(ring_id.to_bytes(8, "little"), body, head)
    return body + bytes(cap - len(body)) + head + crc.to_bytes(4, "little")


def encode_loss_page(page_size: int, ring_id: int, header: PageHeader) -> bytes:
    """A LOSS page (BDEV-25): no entries (``used`` 0), flag ``LOSS``; the trailer's ``count``
    seqs from ``first_seq`` are lost. Checksummed like every page (BDEV-7)."""
    if header.used or not header.loss or header.first_seq < 1 or header.count >= 1 << 32:
        raise ValueError(f"bad LOSS page: {header}")
    head = _trailer_bytes(header)
    crc = checksum(ring_id.to_bytes(8, "little"), head)
    return bytes(page_capacity(page_size)) + head + crc.to_bytes(4, "little")


def decode_trailer(page: bytes | memoryview, ring_id: int) -> PageHeader | None:
    """The page's trailer if the page is valid for this ring (magic, bounds, CRC32C with the ring
    id: BDEV-7), else ``None``: never written, zeroed, torn, garbage or another format's page."""
    size = len(page)
    if size < MIN_PAGE_SIZE:
        return None
    t = size - TRAILER_BYTES
    (first, floor, min_hwm, gen, count, used, pseq, flags, lap, magic, crc) = _TRAILER.unpack_from(
        page, t
    )
    if magic != PAGE_MAGIC or used > t or first < 1 or flags & ~_PAGE_FLAGS:
        return None
    if flags & PAGE_LOSS:
        if used:  # a LOSS page holds no entries (BDEV-25)
            return None
    elif used < 1 or used < count:  # every record takes at least one byte
        return None
    view = memoryview(page)
    if checksum(ring_id.to_bytes(8, "little"), view[:used], view[t : size - 4]) != crc:
        return None
    return PageHeader(first, floor, min_hwm, gen, count, used, pseq, flags, lap)


def unchecked_trailer(page: bytes | memoryview) -> PageHeader | None:
    """The trailer's fields if its magic is in place, without any other check: what a page
    that does not validate says it was meant to be (BDEV-22 tells whether a write of it began)."""
    if len(page) < MIN_PAGE_SIZE:
        return None
    fields = _TRAILER.unpack_from(page, len(page) - TRAILER_BYTES)
    if fields[9] != PAGE_MAGIC:
        return None
    return PageHeader(*fields[:9])


def decode_entries(page: bytes | memoryview, header: PageHeader) -> list[Entry]:
    """The entries of a valid page, records and producer marks in order (BDEV-8, BDEV-9). A page
    whose checksum matched but whose entries do not parse was written wrong, not torn:
    ``FormatCorrupt``."""
    out: list[Entry] = []
    if header.loss:
        return out  # its seqs are lost: no entries (BDEV-25)
    pos, end, prev_ts, seq = 0, header.used, 0, header.first_seq
    while pos < end:
        flags = page[pos]
        if flags & MARK:
            if flags & ~_MARK_FLAGS or (flags & CARRIED and flags & BATCH_END):
                raise FormatCorrupt("BDEV-9", f"mark at byte {pos}: bad flags {flags:#04x}")
            pid, pos = _read_text(page, pos + 1, end, "producer id", MAX_PRODUCER_ID)
            n, pos = _read_uleb(page, pos, end)
            if n < 1:
                raise FormatCorrupt("BDEV-9", f"mark of producer {pid!r}: sequence 0")
            out.append(MarkOut(pid, n, bool(flags & BATCH_END), bool(flags & CARRIED)))
            continue
        if flags & ~_RECORD_FLAGS:
            raise FormatCorrupt("BDEV-8", f"record at byte {pos}: unknown flag bits {flags:#04x}")
        z, pos = _read_uleb(page, pos + 1, end)
        ts = prev_ts + _unzigzag(z)
        length, pos = _read_uleb(page, pos, end)
        tag = node = None
        if flags & HAS_TAG:
            tag, pos = _read_text(page, pos, end, "tag", 1024)
        if flags & HAS_NODE:
            node, pos = _read_text(page, pos, end, "node", 1024)
        if pos + length > end:
            raise FormatCorrupt("BDEV-8", f"record {seq}: payload runs past the page's used bytes")
        out.append(
            RecordOut(seq, ts, tag, node, bytes(page[pos : pos + length]), bool(flags & BATCH_END))
        )
        pos += length
        prev_ts = ts
        seq += 1
    if seq - header.first_seq != header.count:
        raise FormatCorrupt(
            "BDEV-8",
            f"page holds {seq - header.first_seq} records, its trailer says {header.count}",
        )
    return out


def _read_text(
    buf: bytes | memoryview, pos: int, end: int, what: str, limit: int
) -> tuple[str, int]:
    n, pos = _read_uleb(buf, pos, end)
    if n < 1 or n > limit or pos + n > end:
        raise FormatCorrupt("BDEV-8", f"bad {what} length {n}")
    try:
        return bytes(buf[pos : pos + n]).decode("utf-8"), pos + n
    except UnicodeDecodeError:
        raise FormatCorrupt("BDEV-8", f"{what} is not UTF-8") from None


# -- metadata slots (BDEV-2..BDEV-5) -------------------------------------------------------------
def dumps_body(obj: dict[str, Any]) -> bytes:
    """Compact canonical JSON (the same object always gives the same bytes)."""
    return json.dumps(obj, separators=(",", ":"), sort_keys=True, ensure_ascii=False).encode()


@dataclass(frozen=True)
class Slot:
    """One decoded metadata slot."""

    generation: int
    ring_id: int
    page_size: int
    page_count: int
    num_pages: int
    looped: bool
    body: dict[str, Any]


def slot_index(generation: int) -> int:
    """Which slot a generation lives in: odd generations in slot 0, even in slot 1 (BDEV-4)."""
    return (generation - 1) % 2


def encode_slot(slot: Slot) -> bytes:
    """A 2048-byte slot: header, JSON body, zeros, CRC32C of everything before it (BDEV-3)."""
    body = dumps_body(slot.body)
    if len(body) > SLOT_BODY_MAX:
        raise ValueError(f"metadata body of {len(body)} bytes exceeds {SLOT_BODY_MAX}")
    head = _SLOT_HEAD.pack(
        SLOT_MAGIC,
        VERSION,
        1 if slot.looped else 0,
        slot.num_pages,
        slot.generation,
        slot.ring_id,
        slot.page_size,
        slot.page_count,
        0,
        len(body),
    )
    raw = head + body + bytes(SLOT_CRC_OFFSET - len(head) - len(body))
    return raw + checksum(raw).to_bytes(4, "little")


def decode_slot(raw: bytes | memoryview, index: int) -> Slot:
    """Decode slot ``index`` (0 or 1) of a metadata block; ``FormatCorrupt`` if it is not a valid
    slot (BDEV-3, BDEV-4). The version is checked before the CRC so a newer format says so."""
    if len(raw) != SLOT_BYTES:
        raise FormatCorrupt("BDEV-3", f"slot of {len(raw)} bytes, expected {SLOT_BYTES}")
    (magic, version, flags, num_pages, gen, ring_id, page_size, page_count, _r, body_len) = (
        _SLOT_HEAD.unpack_from(raw, 0)
    )
    if magic != SLOT_MAGIC:
        if not any(raw):
            raise FormatCorrupt("BDEV-3", "slot is all zeros (never written)")
        raise FormatCorrupt("BDEV-3", f"bad magic {bytes(magic)!r}: not a tidelog ring slot")
    if version != VERSION:
        raise FormatCorrupt("BDEV-3", f"unsupported ring format version {version}")
    crc = int.from_bytes(raw[SLOT_CRC_OFFSET:], "little")
    if checksum(raw[:SLOT_CRC_OFFSET]) != crc:
        raise FormatCorrupt("BDEV-3", "checksum mismatch (torn or damaged slot)")
    if body_len > SLOT_BODY_MAX or flags & ~1 or num_pages > 3 or gen < 1:
        raise FormatCorrupt("BDEV-3", "header fields out of range")
    if slot_index(gen) != index:
        raise FormatCorrupt("BDEV-4", f"generation {gen} does not belong in slot {index}")
    if page_size % MIN_PAGE_SIZE or not MIN_PAGE_SIZE <= page_size <= MAX_PAGE_SIZE:
        raise FormatCorrupt("BDEV-5", f"bad page_size {page_size}")
    if page_count % 2 or not 2 <= page_count <= 65534:
        raise FormatCorrupt("BDEV-5", f"bad page_count {page_count} (RING-2: even, 2..65534)")
    start = SLOT_HEADER_BYTES
    try:
        body = json.loads(bytes(raw[start : start + body_len]))
    except ValueError:
        raise FormatCorrupt("BDEV-3", "body is not JSON") from None
    if not isinstance(body, dict):
        raise FormatCorrupt("BDEV-3", "body is not a JSON object")
    return Slot(gen, ring_id, page_size, page_count, num_pages, bool(flags & 1), body)


def unchecked_slot_ring_id(raw: bytes | memoryview) -> int | None:
    """The ring id a slot that does not validate says it has, if its magic is in place: what a
    damaged slot may still tell (unverified; repair only uses it to refuse, BDEV-27)."""
    if len(raw) < SLOT_HEADER_BYTES or bytes(raw[:8]) != SLOT_MAGIC:
        return None
    return int(_SLOT_HEAD.unpack_from(raw, 0)[5])
