"""The symbol-dictionary catch-up a forwarder sends before a client slot's frames (FWD-32).

A slot with a `.symbol-dict` holds frames delta-encoded against a connection-scoped dictionary,
so every connection first re-registers ids ``[0, N)`` the way questdb 6.0.0 (Rust client 7.2.0)
does: ``DictMirror`` is seeded from the file, extended by the stored frames' own delta sections,
and split into table-less QWP messages of contiguous id ranges.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable

from tidelog.backends.sf.symdict import SymbolDict, decode_varint

__all__ = ["CatchUpTooLarge", "DictMirror", "MAX_BATCH_HEADER", "batch_cap"]

MAX_BATCH_HEADER = "X-QWP-Max-Batch-Size"
_HEADER = 12  # "QWP1" | version | flags | u16 table_count | u32 payload_len
_VARINT_HEADROOM = 16  # room for the two varints of the delta section
_DELTA_FLAG = 0x08
_U32_MAX = (1 << 32) - 1


class CatchUpTooLarge(Exception):
    """One dictionary entry does not fit a catch-up message under the server's batch cap."""


def batch_cap(value: str | None) -> int:
    """The server's ``X-QWP-Max-Batch-Size``: 0 (no cap) when absent or not a number."""
    try:
        cap = int((value or "").strip())
    except ValueError:
        return 0
    return max(cap, 0)


def _delta(frame: bytes) -> tuple[int, int, bytes] | None:
    """(delta_start, count, entry bytes) of a QWP message with a delta section, else None."""
    if len(frame) < _HEADER or frame[:4] != b"QWP1" or not frame[5] & _DELTA_FLAG:
        return None
    got = decode_varint(frame, _HEADER)
    if got is None:
        return None
    start, p = got
    got = decode_varint(frame, p)
    if got is None or got[0] >= 1 << 32:
        return None
    count, p = got
    q = _skip(frame, p, count)
    return None if q is None else (start, count, frame[p:q])


def _skip(buf: bytes, pos: int, n: int) -> int | None:
    for _ in range(n):
        got = decode_varint(buf, pos)
        if got is None or got[1] + got[0] > len(buf):
            return None
        pos = got[1] + got[0]
    return pos


class DictMirror:
    """Every symbol registered so far, as wire entries in id order (FWD-32)."""

    def __init__(self, seed: SymbolDict) -> None:
        self.entries = bytearray(seed.entries)
        self.count = seed.count

    def conflicts_with(self, frame: bytes) -> bool:
        """True when ``frame`` redefines an id the mirror holds with different bytes."""
        d = _delta(frame)
        if d is None or d[1] == 0 or d[0] >= self.count:
            return False
        start, n, entries = d
        overlap = min(start + n, self.count) - start
        mine = bytes(self.entries)
        lo = _skip(mine, 0, start) or 0
        hi = _skip(mine, lo, overlap) or lo
        return mine[lo:hi] != entries[: _skip(entries, 0, overlap) or 0]

    def accumulate(self, frame: bytes) -> None:
        """Append the ids ``frame`` defines past the tip (only a frame that covers the tip)."""
        d = _delta(frame)
        if d is None:
            return
        start, n, entries = d
        if n == 0 or start > self.count or start + n <= self.count:
            return
        self.entries += entries[_skip(entries, 0, self.count - start) or 0 :]
        self.count = start + n

    def fold(self, frames: Iterable[bytes]) -> bool:
        """Extend by the stored frames in FSN order; False at the first that disagrees (it
        and everything after it are left out, as the client's recovery does)."""
        for frame in frames:
            if self.conflicts_with(frame):
                return False
            self.accumulate(frame)
        return True

    def messages(self, max_batch: int, version: int = 1) -> list[bytes]:
        """The catch-up messages: ids ``[0, count)`` in contiguous ranges, none larger than
        ``max_batch - 28`` bytes of entries (0: one per u32 payload)."""
        if self.count == 0:
            return []
        cap = max_batch if max_batch > 0 else _U32_MAX
        budget = max(cap - _HEADER - _VARINT_HEADROOM, 1)
        out: list[bytes] = []
        first_id, first_off, n, size, p = 0, 0, 0, 0, 0
        buf = bytes(self.entries)
        while p < len(buf):
            q = _skip(buf, p, 1)
            if q is None:
                break
            if q - p > budget:
                raise CatchUpTooLarge(
                    f"FWD-32: symbol id {first_id + n} takes {q - p} bytes, more than the "
                    f"{budget} a catch-up message may carry under {MAX_BATCH_HEADER} {max_batch}"
                )
            if n and size + (q - p) > budget:
                out.append(_frame(first_id, n, buf[first_off:p], version))
                first_id, first_off, n, size = first_id + n, p, 0, 0
            n, size, p = n + 1, size + (q - p), q
        if n:
            out.append(_frame(first_id, n, buf[first_off:p], version))
        return out


def _varint(v: int) -> bytes:
    out = bytearray()
    while v > 0x7F:
        out.append((v & 0x7F) | 0x80)
        v >>= 7
    out.append(v)
    return bytes(out)


def _frame(start: int, count: int, entries: bytes, version: int) -> bytes:
    payload = _varint(start) + _varint(count) + entries
    return b"QWP1" + struct.pack("<BBHI", version, _DELTA_FLAG, 0, len(payload)) + payload
