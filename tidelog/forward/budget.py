"""The receiver's memory bounds (spec/FORWARD.md FWD-25).

``ServeLimits`` validates the ``serve`` options; ``ByteBudget`` accounts the bytes the receiver
holds -- messages taken off a connection and not yet appended -- per connection and in total.
A reader that finds no room waits (first come, first served for the total) instead of reading
on, so the WebSocket layer stops reading the socket and TCP pushes back on the sender.
"""

from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
import sys
from collections import deque
from dataclasses import dataclass, field
from typing import Final

from tidelog.errors import BadOption
from tidelog.options import parse_int, parse_size

__all__ = [
    "MESSAGE_OVERHEAD",
    "ServeLimits",
    "Account",
    "ByteBudget",
    "CAN_RETURN_MEMORY",
    "return_free_memory",
]

#: Charged per message on top of its length, so a flood of empty messages is bounded too.
MESSAGE_OVERHEAD: Final = 64

_KIB: Final = 1 << 10
_GIB: Final = 1 << 30


def _size(key: str, value: object, low: int, high: int) -> int:
    n = parse_size(key, value, minimum=low)
    if n > high:
        raise BadOption(f"option {key}={value!r}: must be at most {high} bytes (FWD-25)")
    return n


@dataclass(frozen=True)
class ServeLimits:
    """``serve``'s bounds; sizes accept ``64MiB`` style strings (FWD-25)."""

    max_frame_bytes: int = 16 << 20
    max_connection_bytes: int = 64 << 20
    max_total_bytes: int = 256 << 20
    max_connections: int = 64

    @classmethod
    def parse(
        cls,
        *,
        max_frame_bytes: object = 16 << 20,
        max_connection_bytes: object = 64 << 20,
        max_total_bytes: object = 256 << 20,
        max_connections: object = 64,
    ) -> ServeLimits:
        frame = _size("max_frame_bytes", max_frame_bytes, _KIB, _GIB)
        conn = _size("max_connection_bytes", max_connection_bytes, _KIB, 16 * _GIB)
        total = _size("max_total_bytes", max_total_bytes, _KIB, 64 * _GIB)
        if total < conn:
            raise BadOption(
                f"option max_total_bytes={max_total_bytes!r}: must be at least "
                f"max_connection_bytes ({conn} bytes) (FWD-25)"
            )
        count = parse_int("max_connections", max_connections, minimum=1, maximum=10000)
        return cls(frame, conn, total, count)


@dataclass(eq=False)
class Account:
    """One connection's held bytes."""

    held: int = 0
    room: asyncio.Future[None] | None = None  # set while its reader waits for its own room


@dataclass(eq=False)
class ByteBudget:
    """Held bytes per connection (``per_connection``) and in total (``total``). Event-loop
    only: ``take`` and ``release`` run on the receiver's loop, never on a worker thread."""

    per_connection: int
    total: int
    held: int = 0
    _queue: deque[tuple[asyncio.Future[None], int]] = field(default_factory=deque)

    async def take(self, acct: Account, n: int) -> None:
        """Wait until ``n`` bytes fit, then count them as held by ``acct``. A connection that
        holds nothing always fits its own bound (a message is never larger: FWD-25 refuses it
        first), and the total admits the oldest waiter once it fits or nothing is held."""
        loop = asyncio.get_running_loop()
        while acct.held and acct.held + n > self.per_connection:
            acct.room = loop.create_future()
            try:
                await acct.room
            finally:
                acct.room = None
        if not self._queue and self._fits(n):
            self.held += n
        else:
            fut: asyncio.Future[None] = loop.create_future()
            entry = (fut, n)
            self._queue.append(entry)
            try:
                await fut  # granted by _admit, which already counted n
            except asyncio.CancelledError:
                if fut.done() and not fut.cancelled():
                    self.held -= n  # granted just as the reader was cancelled: give it back
                elif entry in self._queue:
                    self._queue.remove(entry)
                self._admit()
                raise
        acct.held += n

    def release(self, acct: Account, n: int) -> None:
        if n <= 0:
            return
        acct.held -= n
        self.held -= n
        if acct.room is not None and not acct.room.done():
            acct.room.set_result(None)
        self._admit()

    def _fits(self, n: int) -> bool:
        return self.held == 0 or self.held + n <= self.total

    def _admit(self) -> None:
        while self._queue and (self._queue[0][0].done() or self._fits(self._queue[0][1])):
            fut, n = self._queue.popleft()
            if not fut.done():  # a cancelled waiter is skipped, not granted
                self.held += n
                fut.set_result(None)


def _malloc_trim() -> ctypes._CFuncPtr | None:  # type: ignore[name-defined]
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        trim: ctypes._CFuncPtr = libc.malloc_trim  # type: ignore[name-defined]
        return trim
    except (OSError, AttributeError):  # not glibc
        return None


_TRIM = _malloc_trim()
#: ``return_free_memory`` does something here (glibc).
CAN_RETURN_MEMORY: Final = _TRIM is not None


def return_free_memory() -> bool:
    """Hand the C heap's free pages back to the operating system (glibc ``malloc_trim``; a
    no-op elsewhere). Why: glibc raises its mmap threshold after large frees, so the buffers
    of a flood land in heaps that keep their pages after being freed (FWD-25). True if done."""
    if _TRIM is None:
        return False
    _TRIM(0)
    return True
