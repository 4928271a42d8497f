"""Clocks. Every time-dependent rule (TTL, leases, nack delays) reads an injected clock, so tests
drive time explicitly and never sleep (spec RET-4, QUE-5)."""

from __future__ import annotations

import threading
import time
from typing import Protocol, runtime_checkable

__all__ = ["Clock", "SystemClock", "FakeClock"]


@runtime_checkable
class Clock(Protocol):
    def now_ms(self) -> int:
        """Current time in integer milliseconds."""
        ...


class SystemClock:
    """Wall-clock milliseconds since the epoch."""

    def now_ms(self) -> int:
        return time.time_ns() // 1_000_000

    def __repr__(self) -> str:
        return "SystemClock()"


class FakeClock:
    """A clock that moves only when told to. Thread-safe."""

    def __init__(self, start_ms: int = 1_000_000) -> None:
        self._now = int(start_ms)
        self._lock = threading.Lock()

    def now_ms(self) -> int:
        with self._lock:
            return self._now

    def advance(self, ms: int) -> int:
        with self._lock:
            self._now += int(ms)
            return self._now

    def set(self, ms: int) -> None:
        with self._lock:
            self._now = int(ms)

    def __repr__(self) -> str:
        return f"FakeClock({self._now})"
