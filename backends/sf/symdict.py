"""Reading the `.symbol-dict` side file of a format-2 slot (spec/FORWARD.md FWD-32).

questdb 6.0.0 (Rust client 7.2.0) writes it: an 8-byte header (``SYD1``, version 1, 3 reserved
bytes), then chunks ``[varint entryCount][varint entryBytes][entries][u32 CRC-32C]``, the CRC
over both varints and the entries, each entry ``[varint len][utf8]``. Symbol id ``i`` is the
i-th entry across all chunks. The first torn, CRC-bad or inconsistent chunk ends the file, as
in the client's reader. tidelog only reads it: the client owns the file (SF-27).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Final

from tidelog.fsio import FS, io_errors, read_whole

from .format import crc32c

__all__ = ["FILE_NAME", "SymbolDict", "decode_varint", "parse", "read"]

FILE_NAME: Final = ".symbol-dict"
MAGIC: Final = b"SYD1"
VERSION: Final = 1
HEADER_SIZE: Final = 8
#: The client treats a longer file as corrupt (and starts an empty dictionary).
MAX_FILE_LEN: Final = HEADER_SIZE + 8 * 1024 * 1024 * 256


@dataclass(frozen=True)
class SymbolDict:
    """The intact prefix: ``entries`` is ``count`` wire entries (``[varint len][utf8]``...),
    the shape a QWP delta section carries; ``end`` is the byte offset where parsing stopped."""

    entries: bytes
    count: int
    end: int


def decode_varint(buf: bytes | memoryview, pos: int) -> tuple[int, int] | None:
    """Unsigned LEB128 at ``pos``: (value, next offset), or None when torn or longer than the
    10 bytes a u64 takes."""
    value = 0
    for i in range(10):
        if pos + i >= len(buf):
            return None
        b = buf[pos + i]
        value |= (b & 0x7F) << (7 * i)
        if not b & 0x80:
            return (value, pos + i + 1) if value < 1 << 64 else None
    return None


def _entries_end(buf: bytes, pos: int, count: int, limit: int) -> int | None:
    """Offset after ``count`` whole entries from ``pos`` that stay within ``limit``."""
    for _ in range(count):
        got = decode_varint(buf, pos)
        if got is None or got[1] + got[0] > limit:
            return None
        pos = got[1] + got[0]
    return pos


def parse(buf: bytes) -> SymbolDict:
    """The intact chunks of ``buf``. A short file, a bad magic or version, or one above the
    client's cap yields the empty dictionary (the client starts an empty one then)."""
    empty = SymbolDict(b"", 0, 0)
    if len(buf) < HEADER_SIZE or len(buf) > MAX_FILE_LEN:
        return empty
    if buf[:4] != MAGIC or buf[4] != VERSION:
        return empty
    pos, count, out = HEADER_SIZE, 0, bytearray()
    while pos < len(buf):
        got = decode_varint(buf, pos)
        if got is None:
            break
        n, p = got
        got = decode_varint(buf, p)
        if got is None:
            break
        size, start = got
        end = start + size
        if n == 0 or size == 0 or end + 4 > len(buf):
            break
        if crc32c(buf[pos:end]) != int.from_bytes(buf[end : end + 4], "little"):
            break
        if _entries_end(buf, start, n, end) != end:
            break  # the CRC matches but the entries do not fill the region exactly
        out += buf[start:end]
        count += n
        pos = end + 4
    return SymbolDict(bytes(out), count, pos)


def read(fs: FS, slot_dir: str) -> SymbolDict | None:
    """The slot's dictionary, or None when the slot has no `.symbol-dict` (never writes)."""
    path = os.path.join(slot_dir, FILE_NAME)
    if not fs.exists(path):
        return None
    with io_errors(f"reading {path}"):
        return parse(read_whole(fs, path))
