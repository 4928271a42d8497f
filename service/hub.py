"""The bridge from the store's change notification to the service's event loop (SVC-29).

The store tells a watcher, on the thread that made the change, which topic's change counter
moved (``Backend.watch``). The hub passes that to the loop only for topics someone on the loop
waits for, once per burst (a pending set), so a busy topic with nobody waiting costs one set
lookup per change and nothing is ever polled. A backend that cannot watch (``watch`` returns
False) is polled every ``POLL_S`` instead: a wake is only a hint to look again (CON-3), so a
spurious one is harmless.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Iterator

from tidelog.api import Store

__all__ = ["ChangeHub", "Interest", "set_done"]

POLL_S = 0.005


class Interest:
    """One waiter's registration on a topic: ``gen`` moves each time the topic changes."""

    __slots__ = ("hub", "name", "waiter")

    def __init__(self, hub: ChangeHub, name: str) -> None:
        self.hub = hub
        self.name = name
        self.waiter: asyncio.Future[None] | None = None

    @property
    def gen(self) -> int:
        return self.hub.gens.get(self.name, 0)

    def wake(self) -> None:
        """The topic changed (or the hub closed): a waiter resumes in the loop's next turn."""
        waiter = self.waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    async def changed_since(self, gen: int, timeout: float) -> bool:
        """Wait until the topic changed after ``gen`` was read (or the hub closed), at most
        ``timeout`` seconds; True if it did. (A future and a timer: ``asyncio.wait_for`` would
        add a task and a turn of the loop to every wake-up.)"""
        if self.gen != gen or self.hub.closed:
            return True
        loop = asyncio.get_running_loop()
        waiter = self.waiter = loop.create_future()
        timer = loop.call_later(max(timeout, 0.0), set_done, waiter)
        try:
            await waiter
        finally:
            timer.cancel()
            self.waiter = None
        return self.gen != gen or self.hub.closed


def set_done(waiter: asyncio.Future[None]) -> None:
    """A timer's end of a wait: the future is done (unless it was already)."""
    if not waiter.done():
        waiter.set_result(None)


class ChangeHub:
    def __init__(self, store: Store, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.gens: dict[str, int] = {}
        self.closed = False
        self._interest: dict[str, set[Interest]] = {}
        self._pending: set[str | None] = set()
        self._listeners: list[Callable[[str], None]] = []
        backend = store._live()
        self._poller: asyncio.Task[None] | None = None
        if not backend.watch(self._on_change):
            self._poller = loop.create_task(self._poll())

    def listen(self, fn: Callable[[str], None]) -> None:
        """Also call ``fn(name)`` on the loop for every change of a topic someone watches."""
        self._listeners.append(fn)

    # -- any thread ------------------------------------------------------------------------
    def _on_change(self, name: str | None) -> None:
        # Runs under the store's lock on the writer's thread: a lookup and, at most once per
        # burst, a wake-up of the loop. Reading the dict without a lock is safe under the GIL.
        if name is not None and name not in self._interest:
            return
        if name in self._pending:
            return
        self._pending.add(name)
        with contextlib.suppress(RuntimeError):  # the loop closed: nobody waits any more
            self.loop.call_soon_threadsafe(self._deliver, name)

    # -- the loop ----------------------------------------------------------------------------
    def _deliver(self, name: str | None) -> None:
        self._pending.discard(name)
        if name is None:
            self.close()
            return
        self._bump(name)

    def _bump(self, name: str) -> None:
        self.gens[name] = self.gens.get(name, 0) + 1
        for interest in self._interest.get(name, ()):
            interest.wake()
        for fn in self._listeners:
            fn(name)

    async def _poll(self) -> None:
        while not self.closed:
            await asyncio.sleep(POLL_S)
            for name in list(self._interest):
                self._bump(name)

    @contextlib.contextmanager
    def interest(self, name: str) -> Iterator[Interest]:
        """Register a waiter on ``name`` for the block: changes made while it is registered
        move ``gen`` and wake it."""
        interest = Interest(self, name)
        self._interest.setdefault(name, set()).add(interest)
        try:
            yield interest
        finally:
            waiting = self._interest.get(name)
            if waiting is not None:
                waiting.discard(interest)
                if not waiting:
                    del self._interest[name]

    def watched(self) -> set[str]:
        return set(self._interest)

    def close(self) -> None:
        """Wake every waiter for good (the store closed or the service stops)."""
        self.closed = True
        for waiting in self._interest.values():
            for interest in waiting:
                interest.wake()
        if self._poller is not None:
            self._poller.cancel()
