"""How busy the service's event loop is (SVC-41's loop term): the loop ``tidelog serve`` runs
on is made with a selector that adds up the time the loop waits in it for I/O; the rest of the
time it was busy (running callbacks, or waiting for the GIL another thread holds).

``new_loop`` is the loop factory (``asyncio.Runner(loop_factory=new_loop)``); ``BusyMeter`` on
any other loop measures nothing (``share()`` is None, and the term is 0).
"""

from __future__ import annotations

import asyncio
import selectors
import time
import weakref

__all__ = ["new_loop", "BusyMeter"]


class _IdleSelector(selectors.DefaultSelector):
    """The platform's default selector, adding up the seconds ``select`` waited."""

    def __init__(self) -> None:
        super().__init__()
        self.idle_s = 0.0

    def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
        start = time.monotonic()
        try:
            return super().select(timeout)
        finally:
            self.idle_s += time.monotonic() - start


_IDLE: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _IdleSelector] = (
    weakref.WeakKeyDictionary()
)


def new_loop() -> asyncio.AbstractEventLoop:
    """A selector event loop whose idle time ``BusyMeter`` can read."""
    selector = _IdleSelector()
    loop = asyncio.SelectorEventLoop(selector)
    _IDLE[loop] = selector
    return loop


class BusyMeter:
    """The busy share of ``loop`` between calls of ``share``."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._selector = _IDLE.get(loop)
        self._at = time.monotonic()
        self._idle = self._selector.idle_s if self._selector is not None else 0.0

    def share(self) -> float | None:
        """The part of the time since the last call (or the start) the loop did not wait for
        I/O, in [0, 1]; None when the loop was not made by ``new_loop``."""
        if self._selector is None:
            return None
        now, idle = time.monotonic(), self._selector.idle_s
        span = now - self._at
        busy = 1.0 - (idle - self._idle) / span if span > 0 else 0.0
        self._at, self._idle = now, idle
        return min(1.0, max(0.0, busy))
