"""The priority scheduler and the pressure governor of ``tidelog serve`` (spec/SERVICE.md
section 7, SVC-36..SVC-46).

Pure and synchronous: no I/O, no asyncio; time is the injected clock's ``now_ms()``. The HTTP
app drives both from its event loop and passes plain values between them::

    event = gov.tick(sched.pending_count(), busy) # when gov.next_sample_ms() is 0; busy:
                                                  # the loop's busy share since the last
    sched.update(gov.delivery_pressure, gov.deferring)  # after every tick
    while sched.next_wake_ms() == 0:              # else sleep that long (None: until woken)
        for name, delay_ms in sched.round():
            wake(name)
            gov.delivered(delay_ms)

    admit = gov.begin_append(bypass, low)         # per append: admitted, wait or refused
    ...                                           # when it is answered:
    if gov.end_append(): hand_slot_to_oldest_waiter()

A round is a unit of order, not of time: run rounds back to back while one is due (a round
delivers at most 16 topics, as few as 1 when they share a low band), else a backlog drains one
round per wake-up and the governor rightly reports it as delay (SVC-41).
"""

from __future__ import annotations

import enum
import math
from collections.abc import Iterable
from dataclasses import dataclass
from fnmatch import fnmatchcase
from typing import Literal, NamedTuple

from tidelog.clock import Clock
from tidelog.errors import BadArgument, BadOption

__all__ = [
    "PRIORITY_MIN",
    "PRIORITY_MAX",
    "WEIGHTS",
    "SAMPLE_MS",
    "COALESCE_MAX_MS",
    "Transition",
    "Delivery",
    "Scheduler",
    "Admission",
    "AdmitResult",
    "Governor",
    "band",
    "coalesce_ms",
    "effective_priority",
    "parse_priority_rule",
]

PRIORITY_MIN, PRIORITY_MAX = -1000, 1000  # SVC-36
AGING_STEP_MS, AGING_MAX = 10, 1000  # SVC-38: +1 per 10 ms waited, at most +1000
BAND_FLOORS = (750, 500, 250, 0)  # SVC-38: the lowest P_eff of B4, B3, B2, B1; B0 below
WEIGHTS = (1, 1, 2, 4, 8)  # SVC-38: indexed by band, B0..B4
ROUND_MAX = sum(WEIGHTS)  # 16 deliveries at most per round (SVC-40)
COALESCE_MAX_MS = 20  # SVC-43
SAMPLE_MS = 100  # SVC-41
READY_PER_WORKER = 64  # SVC-41
DELAY_TARGET_MS = 5.0  # SVC-41
DEFER_ABOVE, RESUME_BELOW, HYSTERESIS_SAMPLES = 0.8, 0.6, 10  # SVC-42
SATURATED = 0.95  # SVC-44
RETRY_STEP_MS, RETRY_MAX_MS = 100, 5000  # SVC-44
BUSY_FLOOR = 0.5  # SVC-41: the loop's busy share counts above this
# SVC-44's shedding: the low-priority append rate's floor (per second), its growth per calm
# sample (a share of the rate cut last), its bucket's depth (seconds of the rate)
SHED_MIN, SHED_STEP, SHED_BURST_S = 10.0, 1 / 16, 0.01
UNCOALESCED = 750  # SVC-43: topics of this priority or more are never coalesced (B4's floor)
CATCH_UP_MAX = 100  # SVC-41: a late tick takes at most the last 100 due samples

#: What a change of deferral means to a topic's streams: ``event: deferred`` / ``resumed``.
Transition = Literal["deferred", "resumed"]


def effective_priority(priority: int, waited_ms: int) -> int:
    """SVC-38: ``P + min(waited // 10, 1000)``."""
    return priority + min(waited_ms // AGING_STEP_MS, AGING_MAX)


def band(p_eff: int) -> int:
    """SVC-38: the band of an effective priority, 4 (B4) down to 0 (B0)."""
    for i, floor in enumerate(BAND_FLOORS):
        if p_eff >= floor:
            return 4 - i
    return 0


def coalesce_ms(pressure: float, priority: int = 0) -> int:
    """SVC-43: how long a ready topic of ``priority`` waits before it is eligible,
    ``⌈20 × (p - 0.2) / 0.8⌉`` ms (``20 / 0.8`` is 25), never more than 20; 0 for a priority
    of 750 or more."""
    if pressure <= 0.2 or priority >= UNCOALESCED:
        return 0
    return min(COALESCE_MAX_MS, math.ceil(25 * pressure - 5))


def busy_term(busy: float | None) -> float:
    """SVC-41's loop term: the share of the sample period the event loop was busy, counted
    above one half: ``(busy - 0.5) / 0.5`` within [0, 1] (0 when not measured)."""
    if busy is None:
        return 0.0
    return min(1.0, max(0.0, (busy - BUSY_FLOOR) / (1 - BUSY_FLOOR)))


def _check_priority(value: object, what: str, error: type[BadArgument | BadOption]) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise error(f"{what}: priority {value!r} is not an integer (SVC-36)")
    if not PRIORITY_MIN <= value <= PRIORITY_MAX:
        raise error(f"{what}: priority {value} is outside {PRIORITY_MIN}..{PRIORITY_MAX} (SVC-36)")
    return value


def parse_priority_rule(text: str) -> tuple[str, int]:
    """One ``--priority GLOB=P`` option as ``(glob, P)``; ``bad_option`` naming it when it is
    not of that form or P is out of range (SVC-36). Topic names hold no ``=`` (URI-4)."""
    glob, sep, value = text.rpartition("=")
    if not sep or not glob:
        raise BadOption(f"--priority {text!r}: expected GLOB=P (SVC-36)")
    try:
        priority = int(value.strip())
    except ValueError:
        raise BadOption(f"--priority {text!r}: {value!r} is not an integer (SVC-36)") from None
    return glob, _check_priority(priority, f"--priority {text!r}", BadOption)


class _Now:
    """The clock as section 7 reads it: never stepping back. A step back is taken as if the
    clock had stood still, so time goes on from the last reading (SERVICE.md section 7)."""

    __slots__ = ("_clock", "_offset", "_last")

    def __init__(self, clock: Clock) -> None:
        self._clock = clock
        self._offset = 0
        self._last = clock.now_ms()

    def __call__(self) -> int:
        now = self._clock.now_ms() + self._offset
        if now < self._last:
            self._offset += self._last - now
            now = self._last
        self._last = now
        return now


class Delivery(NamedTuple):
    """One delivery of a round: wake ``name``'s streams; report ``delay_ms`` to
    ``Governor.delivered`` (SVC-41's wait of this delivery)."""

    name: str
    delay_ms: int


class _Entry:
    """A ready topic (SVC-37). ``since`` is when its wait starts to count for SVC-41: its
    ``enqueued_at``, or the end of the deferral that held it."""

    __slots__ = ("enqueued_at", "priority", "since", "held")

    def __init__(self, enqueued_at: int, priority: int, held: bool) -> None:
        self.enqueued_at = enqueued_at
        self.priority = priority
        self.since = enqueued_at
        self.held = held


class Scheduler:
    """The ready set and its rounds (SVC-36..SVC-40, SVC-42's effect on rounds, SVC-43).

    ``rules`` are the ``--priority`` options in order, as ``(glob, P)``. The governor's last
    delivery pressure (SVC-43's) and deferral flag come in through ``update``.
    """

    def __init__(self, clock: Clock, rules: Iterable[tuple[str, int]] = ()) -> None:
        self._now = _Now(clock)
        self._rules = [
            (glob, _check_priority(p, f"--priority {glob}={p!r}", BadOption)) for glob, p in rules
        ]
        self._set: dict[str, int] = {}  # PUT priorities (SVC-36)
        self._by_rule: dict[str, int] = {}  # a cache of the rules' answer per name
        # The ready set in entry order: dicts keep insertion order, and a topic that leaves
        # and enters again goes to the end (SVC-39's "oldest first").
        self._ready: dict[str, _Entry] = {}
        self._pressure = 0.0
        self._deferring = False

    # -- priorities (SVC-36) ------------------------------------------------------------------

    def priority(self, name: str) -> int:
        """The topic's priority: set by ``set_priority``, else the first matching rule, else 0."""
        p = self._set.get(name)
        if p is not None:
            return p
        p = self._by_rule.get(name)
        if p is None:
            p = next((q for glob, q in self._rules if fnmatchcase(name, glob)), 0)
            if len(self._by_rule) >= 4096:  # names come and go; the cache stays bounded
                self._by_rule.clear()
            self._by_rule[name] = p
        return p

    def set_priority(self, name: str, priority: int) -> Transition | None:
        """``PUT /v0/topics/{t}/priority`` (``bad_argument`` outside -1000..1000). Returns the
        topic's deferral change when deferral is on and the priority crosses 0 (SVC-42), so its
        streams can say so; else None."""
        before = self.is_deferred(name)
        self._set[name] = _check_priority(priority, f"topic {name!r}", BadArgument)
        return self._repriced(name, before)

    def clear_priority(self, name: str) -> Transition | None:
        """Forget a ``set_priority`` (the topic was dropped, SVC-36): the rules decide again."""
        before = self.is_deferred(name)
        self._set.pop(name, None)
        return self._repriced(name, before)

    def _repriced(self, name: str, was_deferred: bool) -> Transition | None:
        entry = self._ready.get(name)
        if entry is not None:
            entry.priority = self.priority(name)
            self._hold(entry, self._now())
        now_deferred = self.is_deferred(name)
        if now_deferred == was_deferred:
            return None
        return "deferred" if now_deferred else "resumed"

    def is_deferred(self, name: str) -> bool:
        """SVC-42: deferral is on and the topic's priority is below 0."""
        return self._deferring and self.priority(name) < 0

    # -- the governor's values ----------------------------------------------------------------

    @property
    def pressure(self) -> float:
        return self._pressure

    @property
    def deferring(self) -> bool:
        return self._deferring

    def update(self, pressure: float, deferring: bool) -> None:
        """Take the governor's last delivery pressure and deferral flag (call after every
        ``tick``)."""
        self._pressure = pressure
        if deferring != self._deferring:
            self._deferring = deferring
            now = self._now()
            for entry in self._ready.values():
                self._hold(entry, now)

    def _hold(self, entry: _Entry, now: int) -> None:
        held = self._deferring and entry.priority < 0
        if entry.held and not held:
            entry.since = now  # SVC-41: the wait a deferral imposed is not load
        entry.held = held

    # -- the ready set (SVC-37) ---------------------------------------------------------------

    def mark_ready(self, name: str) -> bool:
        """A topic with streams has something new to read. True when it entered the ready set;
        False when it was in it already (it keeps its ``enqueued_at`` and place)."""
        if name in self._ready:
            return False
        p = self.priority(name)
        self._ready[name] = _Entry(self._now(), p, self._deferring and p < 0)
        return True

    def forget(self, name: str) -> None:
        """The topic lost its last stream or was dropped: it leaves the ready set."""
        self._ready.pop(name, None)

    def enqueued_at(self, name: str) -> int | None:
        entry = self._ready.get(name)
        return None if entry is None else entry.enqueued_at

    def ready_count(self) -> int:
        """Topics in the ready set, deferred ones included (``tidelog_ready_topics``)."""
        return len(self._ready)

    def pending_count(self) -> int:
        """Ready topics not deferred: SVC-41's first term, for ``Governor.tick``."""
        return sum(1 for e in self._ready.values() if not e.held)

    def deferred_ready(self) -> list[str]:
        """Ready topics held by deferral, in entry order."""
        return [name for name, e in self._ready.items() if e.held]

    # -- rounds (SVC-39, SVC-43) --------------------------------------------------------------

    def round(self) -> list[Delivery]:
        """One round (SVC-39): the eligible ready topics by band, B4 first, up to each band's
        weight, oldest first; the delivered ones leave the ready set."""
        now = self._now()
        c = coalesce_ms(self._pressure)
        quota = list(WEIGHTS)
        picked: list[list[str]] = [[] for _ in WEIGHTS]
        left = ROUND_MAX
        for name, entry in self._ready.items():
            waited = now - entry.enqueued_at
            if entry.held or (waited < c and entry.priority < UNCOALESCED):
                continue
            b = band(effective_priority(entry.priority, waited))
            if quota[b]:
                quota[b] -= 1
                picked[b].append(name)
                left -= 1
                if not left:
                    break
        out: list[Delivery] = []
        for names in reversed(picked):
            for name in names:
                entry = self._ready.pop(name)
                wait = c if entry.priority < UNCOALESCED else 0
                start = max(entry.since, entry.enqueued_at + wait)
                out.append(Delivery(name, max(0, now - start)))
        return out

    def next_wake_ms(self) -> int | None:
        """Milliseconds until a ready topic is eligible (0: run a round now); None when none
        can be until something changes (nothing ready, or only deferred topics)."""
        now = self._now()
        c = coalesce_ms(self._pressure)
        best: int | None = None
        for entry in self._ready.values():
            if entry.held:
                continue
            wait = entry.enqueued_at + (c if entry.priority < UNCOALESCED else 0) - now
            if wait <= 0:
                return 0
            if best is None or wait < best:
                best = wait
        return best


class Admission(enum.Enum):
    """What ``Governor.begin_append`` decided (SVC-44, SVC-45)."""

    ADMITTED = "admitted"  # it holds a slot: run the append, then end_append()
    WAIT = "wait"  # queued for a slot: end_append() hands one over (or cancel_wait())
    REFUSED = "refused"  # 429 throttled with retry_after_ms; it holds nothing


@dataclass(frozen=True, slots=True)
class AdmitResult:
    admission: Admission
    retry_after_ms: int = 0


_ADMITTED = AdmitResult(Admission.ADMITTED)  # the common answer, made once


class Governor:
    """Pressure, deferral and admission (SVC-41, SVC-42, SVC-44, SVC-45)."""

    def __init__(
        self, clock: Clock, *, delivery_workers: int = 4, max_inflight_appends: int = 1024
    ) -> None:
        for option, value in (
            ("--delivery-workers", delivery_workers),
            ("--max-inflight-appends", max_inflight_appends),
        ):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise BadOption(f"{option} {value!r}: must be a positive integer (SVC-41)")
        self._now = _Now(clock)
        self._ready_cap = READY_PER_WORKER * delivery_workers
        self._slots = max_inflight_appends
        self._next_sample = self._now() + SAMPLE_MS
        self.pressure = 0.0
        self.delivery_pressure = 0.0  # SVC-41's terms but the loop's: SVC-43 coalesces by it
        self.delay_ms = 0.0  # SVC-41's EWMA
        self.deferring = False
        self.inflight = 0
        self.waiting = 0
        self.saturated_samples = 0  # consecutive samples >= 0.95, up to the last (SVC-44)
        self._above = 0  # consecutive samples > 0.8
        self._below = 0  # consecutive samples < 0.6
        self._delay_sum = 0
        self._delay_n = 0
        # SVC-44's shedding: the low-priority appends admitted per second (None: no limit),
        # the tokens of its bucket and when they were counted, the ones admitted this sample
        self.low_rate: float | None = None
        self._ceiling = SHED_MIN  # SVC-44: the low-priority rate admitted at the last cut
        self._tokens = 0.0
        self._counted_at = 0
        self._low_admitted = 0

    # -- sampling (SVC-41, SVC-42) ------------------------------------------------------------

    def next_sample_ms(self) -> int:
        """Milliseconds until the next sample is due (0: call ``tick`` now)."""
        return max(0, self._next_sample - self._now())

    def delivered(self, delay_ms: int) -> None:
        """A delivery started, ``delay_ms`` being ``Delivery.delay_ms``."""
        if delay_ms < 0:
            raise BadArgument(f"delivery delay {delay_ms} ms is negative (SVC-41)")
        self._delay_sum += delay_ms
        self._delay_n += 1

    def tick(self, pending: int, busy: float | None = None) -> Transition | None:
        """Take every sample due by now (SVC-41), ``pending`` being
        ``Scheduler.pending_count()`` and ``busy`` the event loop's busy share since the last
        tick (None: not measured). Returns "deferred" or "resumed" when deferral switched
        (SVC-42) over the samples taken, else None."""
        now = self._now()
        if now < self._next_sample:
            return None
        due = (now - self._next_sample) // SAMPLE_MS + 1
        self._next_sample += due * SAMPLE_MS
        d = self._delay_sum / self._delay_n if self._delay_n else 0.0
        self._delay_sum = self._delay_n = 0
        was = self.deferring
        loop = busy_term(busy)
        used = self._low_admitted * 1000 / (due * SAMPLE_MS)  # per second, since the last
        self._low_admitted = 0
        for i in range(min(due, CATCH_UP_MAX)):
            self._sample(pending, d if i == 0 else 0.0, loop)
            self._shed(used)
        if self.deferring == was:
            return None
        return "deferred" if self.deferring else "resumed"

    def _sample(self, pending: int, d: float, loop: float) -> None:
        self.delay_ms = 0.8 * self.delay_ms + 0.2 * d
        self.delivery_pressure = max(
            min(1.0, pending / self._ready_cap),
            min(1.0, self.delay_ms / DELAY_TARGET_MS),
            min(1.0, self.inflight / self._slots),
        )
        p = max(self.delivery_pressure, loop)
        self.pressure = p
        self._above = self._above + 1 if p > DEFER_ABOVE else 0
        self._below = self._below + 1 if p < RESUME_BELOW else 0
        if not self.deferring and self._above >= HYSTERESIS_SAMPLES:
            self.deferring = True
        elif self.deferring and self._below >= HYSTERESIS_SAMPLES:
            self.deferring = False
        self.saturated_samples = self.saturated_samples + 1 if p >= SATURATED else 0

    def _shed(self, used: float) -> None:
        """SVC-44: the low-priority rate after a sample; ``used`` is the rate of low-priority
        appends admitted since the last tick (per second)."""
        p, rate = self.pressure, self.low_rate
        if p > DEFER_ABOVE:
            self._ceiling = max(SHED_MIN, used)
            self.low_rate = max(SHED_MIN, used / 2)
            if rate is None:
                self._tokens, self._counted_at = 0.0, self._now()
        elif p < RESUME_BELOW and rate is not None:
            if self._below >= HYSTERESIS_SAMPLES:  # as many calm samples as end a deferral
                self.low_rate = None
            else:  # back toward where it was too much, in steps
                self.low_rate = rate + self._ceiling * SHED_STEP

    # -- admission (SVC-44, SVC-45) -----------------------------------------------------------

    @property
    def retry_after_ms(self) -> int:
        """SVC-44: 100 ms per consecutive saturated sample, 100..5000."""
        return min(RETRY_MAX_MS, max(RETRY_STEP_MS, RETRY_STEP_MS * self.saturated_samples))

    def begin_append(self, bypass: bool = False, low: bool = False) -> AdmitResult:
        """An append arrived. ``bypass``: SVC-45's override (never refused); ``low``: its topic's
        priority is below 0 (SVC-44's shedding)."""
        if low and not bypass:
            rate = self.low_rate
            if rate is not None:
                now = self._now()
                burst = max(1.0, rate * SHED_BURST_S)
                self._tokens = min(burst, self._tokens + rate * (now - self._counted_at) / 1000)
                self._counted_at = now
                if self._tokens < 1.0:
                    return AdmitResult(Admission.REFUSED, self.retry_after_ms)
                self._tokens -= 1.0
            self._low_admitted += 1
        # Slots pass straight from an ending append to a waiting one (end_append), so while
        # any append waits every slot is held and a newcomer cannot pass it.
        if self.inflight < self._slots:
            self.inflight += 1
            return _ADMITTED
        if not bypass and self.pressure >= SATURATED:
            return AdmitResult(Admission.REFUSED, self.retry_after_ms)
        self.waiting += 1
        return AdmitResult(Admission.WAIT)

    def end_append(self) -> bool:
        """An admitted append was answered. True: its slot passes to the oldest waiting append
        (the caller wakes it; it is admitted and must end_append in turn)."""
        if self.inflight == 0:
            raise BadArgument("end_append without an append in flight (SVC-44)")
        if self.waiting:
            self.waiting -= 1
            return True
        self.inflight -= 1
        return False

    def cancel_wait(self) -> None:
        """A waiting append gave up (its request ended) before a slot was handed to it."""
        if self.waiting == 0:
            raise BadArgument("cancel_wait without a waiting append (SVC-44)")
        self.waiting -= 1
