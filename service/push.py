"""The push loop (SVC-35..SVC-46): the store's changes of topics with streams make them ready;
rounds of the priority scheduler deliver them, waking their streams (in the loop turn the change
arrives in when no coalescing wait applies); the governor samples pressure every 100 ms (the
loop's busy share from ``BusyMeter`` among its terms), defers low-priority push under pressure
and admits appends, shedding low-priority ones.

Everything here runs on the service's event loop; service/schedule.py decides, this module
only drives it and keeps the streams' registrations.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from collections.abc import Iterator

from tidelog.clock import Clock
from tidelog.errors import Throttled

from .hub import ChangeHub, Interest, set_done
from .loopclock import BusyMeter
from .metrics import Metrics
from .schedule import Admission, Governor, Scheduler, coalesce_ms

__all__ = ["Push"]


class Push:
    def __init__(
        self,
        hub: ChangeHub,
        clock: Clock,
        metrics: Metrics,
        *,
        rules: list[tuple[str, int]],
        delivery_workers: int,
        max_inflight_appends: int,
    ) -> None:
        self.hub = hub
        self.metrics = metrics
        self.sched = Scheduler(clock, rules)
        self.gov = Governor(
            clock, delivery_workers=delivery_workers, max_inflight_appends=max_inflight_appends
        )
        self.gens: dict[str, int] = {}  # per topic: moves at each delivery (Interest.gen)
        self.closed = False
        self._interest: dict[str, set[Interest]] = {}
        self._watching: dict[str, contextlib.ExitStack] = {}
        self._sleeping: asyncio.Future[None] | None = None  # the push loop's wait, to poke
        self._waiters: deque[asyncio.Future[None]] = deque()
        self._task: asyncio.Task[None] | None = None
        self._meter: BusyMeter | None = None
        hub.listen(self._changed)

    # -- streams ---------------------------------------------------------------------------
    @contextlib.contextmanager
    def interest(self, name: str) -> Iterator[Interest]:
        """A stream of ``name`` for the block: its ``gen`` moves at each delivery of the
        topic, and once at each start or end of its deferral (SVC-35)."""
        interest = Interest(self, name)  # type: ignore[arg-type]  # duck-typed: gens, closed
        waiting = self._interest.setdefault(name, set())
        if not waiting:
            stack = contextlib.ExitStack()
            stack.enter_context(self.hub.interest(name))  # the hub now forwards its changes
            self._watching[name] = stack
        waiting.add(interest)
        try:
            yield interest
        finally:
            waiting.discard(interest)
            if not waiting:
                del self._interest[name]
                self._watching.pop(name).close()
                self.sched.forget(name)  # SVC-37: only topics with streams are scheduled

    def _changed(self, name: str) -> None:
        if name in self._interest and self.sched.mark_ready(name):  # SVC-37
            priority = self.sched.priority(name)
            if self._task is not None and coalesce_ms(self.sched.pressure, priority) == 0:
                # no coalescing wait (SVC-43): the round is due now, so it runs in this turn
                # of the loop rather than the push loop's next one
                self._rounds()
            else:
                self._poke()

    def _poke(self) -> None:
        """Wake the push loop: the ready set changed."""
        sleeping = self._sleeping
        if sleeping is not None and not sleeping.done():
            sleeping.set_result(None)

    async def _sleep(self, seconds: float) -> None:
        """The push loop's wait until ``seconds`` pass or ``_poke`` (a future and a timer:
        ``asyncio.wait_for`` would make a task per wake-up)."""
        loop = asyncio.get_running_loop()
        sleeping = self._sleeping = loop.create_future()
        timer = loop.call_later(seconds, set_done, sleeping)
        try:
            await sleeping
        finally:
            timer.cancel()
            self._sleeping = None

    def _rounds(self) -> None:
        """Every round due now, back to back (SVC-39)."""
        sched, gov = self.sched, self.gov
        while sched.next_wake_ms() == 0:
            for name, delay_ms in sched.round():
                self._deliver(name)
                gov.delivered(delay_ms)
                self.metrics.delivery_delay(delay_ms / 1000.0)

    def _deliver(self, name: str) -> None:
        self.gens[name] = self.gens.get(name, 0) + 1
        for interest in self._interest.get(name, ()):
            interest.wake()

    def is_deferred(self, name: str) -> bool:
        return self.sched.is_deferred(name)

    def set_priority(self, name: str, priority: int) -> None:
        before = self.sched.is_deferred(name)
        self.sched.set_priority(name, priority)
        if self.sched.is_deferred(name) != before:
            self._deliver(name)  # its streams look again and say so (SVC-35)

    def dropped(self, name: str) -> None:
        self.sched.clear_priority(name)
        self.sched.forget(name)

    # -- the loop ----------------------------------------------------------------------------
    def start(self) -> None:
        loop = asyncio.get_running_loop()
        self._meter = BusyMeter(loop)
        self._task = loop.create_task(self._run())

    async def _run(self) -> None:
        sched, gov = self.sched, self.gov
        while not self.closed:
            wake = sched.next_wake_ms()
            sample = gov.next_sample_ms()
            timeout = sample if wake is None else min(wake, sample)
            if timeout > 0:
                await self._sleep(timeout / 1000.0)
            if gov.next_sample_ms() == 0:
                deferred = set(sched.deferred_ready()) | self._deferred_streams()
                gov.tick(sched.pending_count(), self._meter.share() if self._meter else None)
                sched.update(gov.delivery_pressure, gov.deferring)  # SVC-43's
                for name in deferred ^ self._deferred_streams():
                    self._deliver(name)  # SVC-35: deferral of its push began or ended
                self.metrics.set_pressure(gov.pressure)
                self.metrics.set_ready(sched.ready_count())
                self.metrics.set_deferred(len(sched.deferred_ready()))
            self._rounds()

    def _deferred_streams(self) -> set[str]:
        return {name for name in self._interest if self.sched.is_deferred(name)}

    async def close(self) -> None:
        self.closed = True
        self._poke()
        for name in list(self._interest):
            self._deliver(name)
        if self._task is not None:
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    # -- admission (SVC-44, SVC-45) ---------------------------------------------------------
    def admitted(self, topic: str, bypass: bool) -> _Slot:
        """Hold one of the ``--max-inflight-appends`` slots for the ``async with`` block while
        appending to ``topic``: wait for one, or be refused with 429 ``throttled`` at
        saturation or when shed (SVC-44) unless ``bypass`` (SVC-45)."""
        return _Slot(self, bypass, self.sched.priority(topic) < 0)

    def _release(self) -> None:
        if self.gov.end_append():
            future = self._waiters.popleft()
            future.set_result(None)


class _Slot:
    """``Push.admitted``'s block (a class, not a generator: one per append)."""

    __slots__ = ("push", "bypass", "low")

    def __init__(self, push: Push, bypass: bool, low: bool) -> None:
        self.push = push
        self.bypass = bypass
        self.low = low

    async def __aenter__(self) -> None:
        push = self.push
        result = push.gov.begin_append(self.bypass, self.low)
        if result.admission is Admission.ADMITTED:
            return
        if result.admission is Admission.REFUSED:
            push.metrics.throttled()
            raise Throttled(
                "the service is saturated: the append was not taken, nothing was stored; "
                f"retry after {result.retry_after_ms} ms (SVC-44)",
                result.retry_after_ms,
            )
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        push._waiters.append(future)
        try:
            await future
        except asyncio.CancelledError:
            if future.done() and not future.cancelled():
                push._release()  # handed a slot as it was cancelled: give it on
            else:
                push._waiters.remove(future)
                push.gov.cancel_wait()
            raise

    async def __aexit__(self, *exc: object) -> None:
        self.push._release()
