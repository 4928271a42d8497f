"""Per-subscriber progress files ``quiver.sub.<name>``: Quiver's v1 format, PRG-1..

Quiver tracks acked bundles per segment; tidelog has neither bundles nor Quiver segments, so it
maps seqs onto fixed blocks (PRG-4): block ``(seq - 1) // 4096``, bit ``(seq - 1) % 4096``.
A set bit means the seq is resolved for the subscriber (acked, rejected or dropped all map to
Quiver's "acked" bit: Quiver treats a dropped bundle like an acked one). The hwm is not stored
as a number: it is the last seq of the contiguous run of set bits that starts at the oldest
incomplete block (PRG-5), exactly how Quiver's ``oldest_incomplete_seg`` + bitmap say it.

tidelog's ``base`` and first ``gap`` ride in a header extension (PRG-6) that Quiver readers skip
through ``header_size``; more gaps make the file version 2 (PRG-10), which version-1 readers
refuse rather than drop the gaps they cannot see.
"""

from __future__ import annotations

import re
import struct
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import crc32c

from tidelog.errors import BadArgument

from . import FormatCorrupt

__all__ = [
    "MAGIC",
    "VERSION",
    "VERSION_GAPS",
    "MAX_GAPS",
    "QUIVER_HEADER_SIZE",
    "HEADER_SIZE",
    "BLOCK",
    "BITMAP_WORDS",
    "Progress",
    "encode_progress",
    "decode_progress",
    "block_of",
    "file_name",
    "parse_file_name",
]

MAGIC = b"QUIVSUB\0"
VERSION = 1
VERSION_GAPS = 2  # PRG-10: more than one pending gap
QUIVER_HEADER_SIZE = 32
HEADER_SIZE = 56  # what tidelog writes: Quiver's 32 bytes + base, gap_from, gap_to
_GAPS_AT = HEADER_SIZE + 8  # version 2: more_gaps u64 at 56, then the other gaps' pairs
MAX_GAPS = 1 + (0xFFFF - _GAPS_AT) // 16  # header_size is a u16 (PRG-10)
BLOCK = 4096  # seqs per Quiver "segment" (bundle_count of every entry)
BITMAP_WORDS = BLOCK // 64
_BITMAP_BYTES = BITMAP_WORDS * 8

# magic | version u16 | header_size u16 | flags u16 | oldest_incomplete_seg u64 | entry_count u32
# | 6 reserved bytes
_HEADER = struct.Struct("<8sHHHQI6x")
_EXTENSION = struct.Struct("<QQQ")  # base | gap_from | gap_to
_U64 = struct.Struct("<Q")
_PAIR = struct.Struct("<QQ")  # gap_from | gap_to
_ENTRY = struct.Struct("<QIH")  # seg_seq | bundle_count | bitmap_words
_CRC = struct.Struct("<I")
_NAME = re.compile(r"quiver\.sub\.([A-Za-z0-9_-]{1,64})")


@dataclass
class Progress:
    """A subscriber's durable progress: ``outcomes`` are the resolved seqs above ``hwm``."""

    hwm: int
    outcomes: set[int]
    base: int
    gaps: list[tuple[int, int]]  # SUB-7: disjoint, ascending
    warnings: list[str] = field(default_factory=list)


def block_of(seq: int) -> tuple[int, int]:
    """(block, bit) of a seq >= 1 (PRG-4)."""
    return (seq - 1) // BLOCK, (seq - 1) % BLOCK


def _trailing_ones(bits: int) -> int:
    return (~bits & (bits + 1)).bit_length() - 1


def _normalise(hwm: int, outcomes: set[int]) -> int:
    """Advance ``hwm`` across outcomes contiguous to it (SUB-2's rule; PRG-5 stores no more)."""
    while hwm + 1 in outcomes:
        hwm += 1
    return hwm


def _blocks(hwm: int, outcomes: Iterable[int]) -> tuple[int, dict[int, int]]:
    """(oldest incomplete block, block -> bitmap) for a normalised hwm."""
    oldest = hwm // BLOCK  # the block of seq hwm + 1
    done = hwm - oldest * BLOCK  # seqs of that block at or below hwm
    maps = {oldest: (1 << done) - 1}
    for seq in outcomes:
        if seq > hwm:
            block, bit = block_of(seq)
            maps[block] = maps.get(block, 0) | (1 << bit)
    return oldest, maps


def _gaps_problem(gaps: Sequence[tuple[int, int]]) -> str | None:
    """Why ``gaps`` are not SUB-7's disjoint ascending ranges with ``1 <= lo <= hi``, or None."""
    for i, (lo, hi) in enumerate(gaps):
        if not 1 <= lo <= hi:
            return f"gap {i + 1} [{lo}, {hi}] breaks 1 <= gap_from <= gap_to"
        if i and lo <= gaps[i - 1][1]:
            return f"gap {i + 1} [{lo}, {hi}] is not above gap {i} {list(gaps[i - 1])}"
    return None


def _check_args(hwm: int, base: int, gaps: Sequence[tuple[int, int]], outcomes: set[int]) -> None:
    if hwm < 0 or base < 0:
        raise BadArgument(f"progress: hwm {hwm} and base {base} must be >= 0")
    problem = _gaps_problem(gaps)
    if problem is not None:
        raise BadArgument(f"progress: {problem} (PRG-10)")
    if len(gaps) > MAX_GAPS:
        raise BadArgument(f"progress: {len(gaps)} gaps, at most {MAX_GAPS} fit (PRG-10)")
    if outcomes and min(outcomes) < 1:
        raise BadArgument("progress: outcome seqs must be >= 1")


def encode_progress(
    hwm: int, outcomes: Iterable[int], base: int, gaps: Sequence[tuple[int, int]]
) -> bytes:
    """A progress file with tidelog's header (PRG-1..PRG-6): version 1 with its 56-byte header
    for at most one gap, version 2 for more (PRG-10). Outcomes at or below ``hwm`` are implied
    and not stored; outcomes contiguous to ``hwm`` are folded into it, so ``decode_progress``
    returns the hwm SUB-2 would have computed."""
    seqs = set(outcomes)
    _check_args(hwm, base, gaps, seqs)
    hwm = _normalise(hwm, seqs)
    oldest, maps = _blocks(hwm, seqs)
    gap_from, gap_to = gaps[0] if gaps else (0, 0)
    more = gaps[1:]
    version, size = (
        (VERSION_GAPS, _GAPS_AT + _PAIR.size * len(more)) if more else (VERSION, HEADER_SIZE)
    )
    parts = [
        _HEADER.pack(MAGIC, version, size, 0, oldest, len(maps)),
        _EXTENSION.pack(base, gap_from, gap_to),
    ]
    if more:
        parts.append(_U64.pack(len(more)))
        parts += [_PAIR.pack(lo, hi) for lo, hi in more]
    for block in sorted(maps):
        parts.append(_ENTRY.pack(block, BLOCK, BITMAP_WORDS))
        parts.append(maps[block].to_bytes(_BITMAP_BYTES, "little"))
    body = b"".join(parts)
    return body + _CRC.pack(crc32c.crc32c(body))


def _read_header(buf: memoryview) -> tuple[int, int, int, int, int]:
    """(version, header_size, flags, oldest, entry_count), after magic, version and CRC checks
    (PRG-1)."""
    if len(buf) < QUIVER_HEADER_SIZE + _CRC.size:
        raise FormatCorrupt("PRG-1", f"progress file: {len(buf)} bytes, shorter than header + CRC")
    magic, version, header_size, flags, oldest, count = _HEADER.unpack_from(buf)
    if magic != MAGIC:
        raise FormatCorrupt(
            "PRG-1", f"progress file: bad magic {bytes(magic)!r}, expected {MAGIC!r}"
        )
    if version not in (VERSION, VERSION_GAPS):
        raise FormatCorrupt(
            "PRG-1",
            f"progress file: unsupported version {version} "
            f"(this reader knows {VERSION} and {VERSION_GAPS})",
        )
    (stored,) = _CRC.unpack_from(buf, len(buf) - _CRC.size)
    actual = crc32c.crc32c(buf[: len(buf) - _CRC.size])
    if stored != actual:
        raise FormatCorrupt(
            "PRG-1",
            f"progress file: CRC32C mismatch (stored {stored:#010x}, computed {actual:#010x})",
        )
    if not QUIVER_HEADER_SIZE <= header_size <= len(buf) - _CRC.size:
        raise FormatCorrupt("PRG-2", f"progress file: header_size {header_size} out of range")
    return version, header_size, flags, oldest, count


def _read_extension(
    buf: memoryview, version: int, header_size: int, hwm: int
) -> tuple[int, list[tuple[int, int]]]:
    """(base, gaps) from tidelog's header extension (PRG-6, PRG-10), or plain Quiver's
    (hwm, [])."""
    if version == VERSION_GAPS:
        return _read_more_gaps(buf, header_size)
    if header_size < HEADER_SIZE:
        return hwm, []
    base, gap_from, gap_to = _EXTENSION.unpack_from(buf, QUIVER_HEADER_SIZE)
    if (gap_from, gap_to) == (0, 0):
        return base, []
    if not 1 <= gap_from <= gap_to:
        raise FormatCorrupt("PRG-6", f"progress file: bad gap [{gap_from}, {gap_to}]")
    return base, [(gap_from, gap_to)]


def _read_more_gaps(buf: memoryview, header_size: int) -> tuple[int, list[tuple[int, int]]]:
    """PRG-10: (base, every gap) of a version 2 header."""
    if header_size < _GAPS_AT:
        raise FormatCorrupt(
            "PRG-10", f"progress file: version 2 header_size {header_size} is below {_GAPS_AT}"
        )
    base, gap_from, gap_to = _EXTENSION.unpack_from(buf, QUIVER_HEADER_SIZE)
    (more,) = _U64.unpack_from(buf, HEADER_SIZE)
    room = (header_size - _GAPS_AT) // _PAIR.size
    if not 1 <= more <= room:
        raise FormatCorrupt(
            "PRG-10",
            f"progress file: more_gaps {more} (header_size {header_size} holds 1..{room})",
        )
    pairs = (_PAIR.unpack_from(buf, _GAPS_AT + _PAIR.size * i) for i in range(more))
    gaps = [(gap_from, gap_to), *pairs]
    problem = _gaps_problem(gaps)
    if problem is not None:
        raise FormatCorrupt("PRG-10", f"progress file: {problem}")
    return base, gaps


def _read_entries(buf: memoryview, at: int, count: int, oldest: int) -> dict[int, int]:
    """block -> bitmap for ``count`` entries starting at ``at`` (PRG-3)."""
    end = len(buf) - _CRC.size
    maps: dict[int, int] = {}
    for i in range(count):
        if at + _ENTRY.size > end:
            raise FormatCorrupt("PRG-3", f"progress file: entry {i} of {count} runs past the end")
        block, bundles, words = _ENTRY.unpack_from(buf, at)
        at += _ENTRY.size
        if bundles != BLOCK or words != BITMAP_WORDS:
            raise FormatCorrupt(
                "PRG-3",
                f"progress file: entry {i} has bundle_count {bundles} / bitmap_words {words}; "
                f"tidelog blocks are {BLOCK} / {BITMAP_WORDS}",
            )
        if block < oldest or block in maps or (maps and block < max(maps)):
            raise FormatCorrupt("PRG-3", f"progress file: entry {i} block {block} is out of order")
        if at + _BITMAP_BYTES > end:
            raise FormatCorrupt("PRG-3", f"progress file: bitmap of entry {i} runs past the end")
        maps[block] = int.from_bytes(buf[at : at + _BITMAP_BYTES], "little")
        at += _BITMAP_BYTES
    return maps


def _hwm_and_outcomes(oldest: int, maps: dict[int, int]) -> tuple[int, set[int]]:
    """PRG-5: hwm = last seq of the run of set bits from the oldest incomplete block's start."""
    hwm = oldest * BLOCK
    block = oldest
    while block in maps:
        ones = _trailing_ones(maps[block])
        hwm = block * BLOCK + ones
        if ones < BLOCK:
            break
        block += 1
    outcomes: set[int] = set()
    for block, bitmap in maps.items():
        start = block * BLOCK + 1
        implied = max(0, min(BLOCK, hwm - block * BLOCK))  # bits at or below the hwm
        bits = bitmap >> implied << implied
        while bits:
            low = bits & -bits
            seq = start + low.bit_length() - 1
            if seq > hwm:
                outcomes.add(seq)
            bits ^= low
    return hwm, outcomes


def decode_progress(buf: bytes | bytearray | memoryview) -> Progress:
    """Decode and check a progress file (PRG-1..PRG-6, PRG-10); Corrupt naming the first
    problem. Accepts plain Quiver 32-byte headers (base = hwm, no gap) and skips unknown header
    bytes."""
    mv = memoryview(buf)
    version, header_size, flags, oldest, count = _read_header(mv)
    maps = _read_entries(mv, header_size, count, oldest)
    hwm, outcomes = _hwm_and_outcomes(oldest, maps)
    base, gaps = _read_extension(mv, version, header_size, hwm)
    warnings: list[str] = []
    if flags:
        warnings.append(f"unknown flags {flags:#06x} ignored (v1 writers set 0)")
    used = header_size + count * (_ENTRY.size + _BITMAP_BYTES)
    if used < len(mv) - _CRC.size:
        warnings.append(f"{len(mv) - _CRC.size - used} unknown trailing bytes ignored")
    return Progress(hwm, outcomes, base, gaps, warnings)


def file_name(subscriber: str) -> str:
    """``quiver.sub.<name>`` (PRG-7)."""
    return f"quiver.sub.{subscriber}"


def parse_file_name(name: str) -> str | None:
    m = _NAME.fullmatch(name)
    return m.group(1) if m else None
