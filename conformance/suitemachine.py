"""The stateful suite against a ``RemoteSut``, one level at a time (spec/CONFORMANCE.md §2).

``machine_for(sut, level)`` builds a ``LogMachine`` whose backend under test is a store inside
the implementation (through the driver protocol, in-process or across a process boundary) and
whose oracle is the model in this process. On top of ``LogMachine`` it adds:

* the ``crash`` level's rules: power loss between operations and inside one, then recovery
  checked against every state the model allows (``crashcheck.compare_recovered``);
* the ``ring`` level's rule: a lap of appends then a clean reopen, so head detection runs in
  every lap parity, and ring overwrites (reported by the implementation) reach the model.
"""

from __future__ import annotations

import contextlib
import copy
import uuid
from collections.abc import Callable
from typing import Any

from hypothesis import event
from hypothesis import strategies as st
from hypothesis.stateful import precondition, rule

import tidelog
from tidelog.clock import Clock
from tidelog.errors import TidelogError
from tidelog.hooks import hooks
from tidelog.model import ModelStore, forget

from .crashcheck import (
    ROUTERS,
    TopicView,
    append_after,
    check_reopened,
    compare_recovered,
    observe,
)
from .levels import level_caps
from .machine import NODES, TAGS, LogMachine, apply_ring_evictions, fail, payloads
from .remote import RemoteSut
from .ringcrash import compare_recovered_ring
from .sut import RingEvent

__all__ = [
    "SuiteMachine", "crash_states", "machine_for", "recovered_allowed", "snapshot_model",
]  # fmt: skip


def snapshot_model(m: ModelStore) -> ModelStore:
    """A copy of the model's topics (with their crash history), for "before the op" states."""
    out = ModelStore(m.clock, m.options)
    with m.lock:
        out.topics = copy.deepcopy(m.topics)
        out.routers = dict(m.routers)  # RTR-10: recovery forwards with the routers it had
        out.incarnations = m.incarnations
    return out


def crash_states(
    before: ModelStore, after: ModelStore | None, events: list[RingEvent]
) -> list[tuple[ModelStore, ModelStore | None]]:
    """CNF-6, BDEV-16: the (before, after) model pairs a store that lost power inside an op may
    recover as (``compare_recovered``). ``events`` are the ring overwrites the op began: once a
    page write starts, the old page is gone, so the states without and with the op both take
    that eviction (applied here to ``before`` and ``after``); if the power went before the write
    reached the device, the old records are still there and the op is not (the state before
    the op, without the eviction)."""
    if not events:
        return [(before, after)]
    plain = snapshot_model(before)
    apply_ring_evictions(before, events)
    if after is not None:
        apply_ring_evictions(after, events)
    return [(before, after), (plain, None)]


def recovered_allowed(
    got: dict[str, TopicView],
    states: list[tuple[ModelStore, ModelStore | None]],
    clock: Clock,
    where: str,
    *,
    exact_progress: bool = True,
) -> ModelStore | None:
    """``compare_recovered`` against each of ``states``; AssertionError (the first state's
    reason) when ``got`` is none of them; else the model of the routed topics as recovered
    (None without routers). An at-least-once implementation (``exact_progress`` False) is
    judged with BDEV-17's relaxations (CNF-7, ``compare_recovered_ring``)."""
    errors: list[str] = []
    for before, after in states:
        try:
            if exact_progress:
                return compare_recovered(got, before, after, clock, where)
            compare_recovered_ring(got, before, after, clock, where)
            return None
        except AssertionError as exc:
            errors.append(str(exc))
    raise AssertionError(errors[0])


class SuiteMachine(LogMachine):
    """LogMachine on a RemoteSut for one level; ``machine_for`` sets the class attributes."""

    link: RemoteSut
    level: str = "queue"
    #: called with the machine at the start of every example (the runner counts examples)
    on_start: Callable[[SuiteMachine], None] | None = None

    @staticmethod
    def sut_uri(name: str) -> str:
        return f"driver:{name}"

    def __init__(self) -> None:
        if self.on_start is not None:
            self.on_start(self)
        # CNF-33, CNF-34: the levels that exercise routers are about them; the routers level
        # tilts its first topics so that routers lag and meet gaps (RTR-5, RTR-6), the crash
        # level leaves them as they are (copies to lose, RTR-10)
        self.routed = self.level in ("routers", "crash")
        self.tilted = self.level == "routers"
        super().__init__()
        self.supports_reopen = bool(self.link.hello.get("reopen", True))
        crash = self.link.hello.get("crash") or ()
        self.can_crash_during = "during" in crash
        self.since_fresh = 0

    def open_sut(self) -> Any:
        store = self.link.open(self.name, self.clock)
        caps = level_caps(self.level, store.capabilities)
        self.capabilities = caps
        if self.level == "crash":
            self.favour = "fsync"  # the class whose guarantee a power loss tests hardest
        if self.level == "crash" and not caps.exact_progress:
            # An at-least-once backend may undo a trim after a crash (trimmed records live
            # again, BDEV-17); the crash level then creates topics that never trim.
            self.trims = ("none",)
        return store

    def cleanup_sut(self, name: str) -> None:
        self.link.dispose(name)

    def ring_events(self) -> list[RingEvent]:
        return self.link.ring_evictions()

    def ring_pages(self) -> int | None:
        return self.link.ring_pages()

    def model_backend(self) -> ModelStore:
        return hooks(self.model, ModelStore)

    # -- crash level -------------------------------------------------------------------------
    def sut_gone(self) -> None:
        """The store under test is lost with the power: teardown must not close it."""
        self.sut.closed = True  # type: ignore[misc]  # a RemoteStore's plain attribute

    def on_topic(self, name: str, fn: Callable[[Any], Any]) -> Any:
        self.since_fresh += 1
        return super().on_topic(name, fn)

    @precondition(lambda self: self.level == "crash" and self.since_fresh >= 3)
    @rule(data=st.data(), seed=st.integers(0, 2**31 - 1))
    def power_loss(self, data: st.DataObject, seed: int) -> None:
        """DUR-2..DUR-6, DUR-9, CRASH-7: power loss between two operations."""
        self.learn_ring()
        self.sut_gone()
        self.link.crash(seed)
        where = f"power loss between ops (seed {seed})"
        self.check_recovery([(self.model_backend(), None)], where, data)

    def _can_crash_inside(self) -> bool:
        return (
            self.level == "crash"
            and self.can_crash_during
            and bool(self.handles)
            and self.since_fresh >= 2
        )

    @precondition(_can_crash_inside)
    @rule(data=st.data(), seed=st.integers(0, 2**31 - 1))
    def power_loss_appending(self, data: st.DataObject, seed: int) -> None:
        """DUR-2, DUR-6, CRASH-7, WAL-5: power loss inside an append (a torn or lost frame):
        the recovered store holds the record intact or not at all."""
        # one payload large enough that a sector torn half-way leaves the frame's header
        # intact and cuts its payload (the case a checksum must catch)
        batch = [data.draw(st.binary(min_size=30, max_size=200))]
        batch += data.draw(st.lists(payloads, max_size=2))
        if len(batch) == 1:
            self.crash_inside(data, seed, "append", lambda t: t.append(batch[0]))
        else:
            self.crash_inside(data, seed, "append_many", lambda t: t.append_many(batch))

    @precondition(_can_crash_inside)
    @rule(
        data=st.data(),
        seed=st.integers(0, 2**31 - 1),
        kind=st.sampled_from(["delete", "flush", "commit"]),
    )
    def power_loss_during(self, data: st.DataObject, seed: int, kind: str) -> None:
        """DUR-2, DUR-6, DUR-9, CRASH-7: power loss inside a delete, a flush or a subscriber
        commit: the recovered store is a state the model allows with or without it."""
        upto = data.draw(st.integers(1, 8))
        calls: dict[str, Callable[[Any], Any]] = {
            "delete": lambda t: t.delete(upto),
            "commit": lambda t: _sub_of(t, "s0").commit(upto),
            "flush": lambda t: t.store.flush(),
        }
        self.crash_inside(data, seed, kind, calls[kind])

    @precondition(lambda self: self._can_crash_inside() and bool(self.routes()))
    @rule(
        data=st.data(),
        seed=st.integers(0, 2**31 - 1),
        kind=st.sampled_from(["append", "append_many", "delete_dest"]),
    )
    def power_loss_forwarding(self, data: st.DataObject, seed: int, kind: str) -> None:
        """CNF-34, RTR-10, RTR-11, DUR-2, CRASH-7: power loss inside an op that forwards: an
        append to a router's source (its copies and cursor are written in the same call) or a
        delete in its dest (room for copies dest refused, RTR-6, RTR-8). The recovered source,
        dest and cursor must be states the model allows together: no copy skipped, none made
        twice."""
        source, dest = data.draw(st.sampled_from(self.routes()))
        batch = data.draw(st.lists(payloads, min_size=1, max_size=3))
        tag = data.draw(st.sampled_from(TAGS))
        node = data.draw(st.sampled_from((None, *NODES)))
        upto = data.draw(st.integers(1, self.head(dest) + 1))
        calls: dict[str, tuple[str, Callable[[Any], Any]]] = {
            "append": (source, lambda t: t.append(batch[0], tag=tag, node=node)),
            "append_many": (source, lambda t: t.append_many(batch, tag=tag, node=node)),
            "delete_dest": (dest, lambda t: t.delete(upto)),
        }
        name, call = calls[kind]
        self.crash_inside(data, seed, f"{kind} (forwarding {source} -> {dest})", call, name)

    def crash_inside(
        self,
        data: st.DataObject,
        seed: int,
        what: str,
        call: Callable[[Any], Any],
        name: str | None = None,
    ) -> None:
        if name is None:
            names = sorted(self.handles)
            synced = [n for n in names if self.handles[n][0].config.durability == "fsync"]
            if synced and data.draw(st.integers(0, 3)) != 0:
                names = synced  # mostly fsync topics: their writes happen inside the op
            name = data.draw(st.sampled_from(names))
        m, s = self.handles[name]
        before = snapshot_model(self.model_backend())
        with contextlib.suppress(TidelogError):
            call(m)
        self.learn_ring()
        self.sut_gone()
        self.link.crash_during(seed, lambda: call(s))
        events = self.ring_events()
        self.check_ring(events)
        where = f"power loss inside {what} on {name} (seed {seed})"
        self.check_recovery(crash_states(before, self.model_backend(), events), where, data)

    def check_recovery(
        self,
        states: list[tuple[ModelStore, ModelStore | None]],
        where: str,
        data: st.DataObject,
    ) -> None:
        """Recover, compare with the model's allowed states (one of ``states``: the model
        before the op in flight and, if one was, after it), recover again (idempotent), then
        append once per topic (no seq reused); then go on with a fresh store."""
        try:
            self.sut = self.open_sut()
            got = observe(self.sut)
        except TidelogError as exc:
            fail(f"CRASH-7: recovery raised {exc!r} after {where}")
        self.ring_events()  # a recovered ring reports nothing new the model must learn
        try:
            caps = self.capabilities
            exact = caps is None or caps.exact_progress
            recovered = recovered_allowed(got, states, self.clock, where, exact_progress=exact)
        except AssertionError as exc:
            fail(str(exc))
        try:
            self.sut.close()
            self.sut = self.open_sut()
            again = observe(self.sut)
        except TidelogError as exc:
            fail(f"CRASH-7: recovering a second time raised {exc!r} after {where}")
        try:
            check_reopened(got, again, recovered, self.clock, where)
        except AssertionError as exc:
            fail(f"CRASH-7: {exc}")
        for name, view in got.items():
            if name == ROUTERS:
                continue
            seq, head = append_after(self.sut, name, view.head)
            if seq is not None and seq != head + 1:
                fail(
                    f"TOP-1, DUR-3: {name}: new seq {seq} after head {head} (recovered head "
                    f"{view.head})"
                )
        event("power loss: the recovered state is one the model allows")
        self.restart_fresh(data)

    def restart_fresh(self, data: st.DataObject) -> None:
        """Continue the example on new stores (the crashed one has been checked), with two
        topics as at the start."""
        for store in (self.sut, self.model):
            with contextlib.suppress(TidelogError):
                store.close()
        self.cleanup_sut(self.name)
        forget(self.name)
        self.ring_events()
        self.name = "m" + uuid.uuid4().hex[:12]
        self.model_uri = f"model://{self.name}"
        self.model = tidelog.open(self.model_uri, clock=self.clock)
        self.sut = self.open_sut()
        self.handles, self.stale, self.leases = {}, [], []
        self.since_fresh = 0
        self.first_topics(data)

    # -- ring level ----------------------------------------------------------------------------
    @precondition(
        lambda self: self.level == "ring" and bool(self.handles) and self.ring_pages() is not None
    )
    @rule(data=st.data())
    def lap(self, data: st.DataObject) -> None:
        """RING-1..RING-6, BDEV-16: two pages' worth of appends per ring page, then a clean
        reopen, so recovery finds the head in every lap parity, across wraps."""
        name = data.draw(st.sampled_from(sorted(self.handles)))
        pages = self.ring_pages() or 0
        for i in range(2 * pages + 1):
            payload = bytes([i % 256]) * 3
            self.on_topic(name, lambda t, p=payload: t.append(p))  # type: ignore[misc]
        if self.supports_reopen:
            self.reopen()


def _sub_of(topic: Any, name: str) -> Any:
    make = getattr(topic, "subscriber_handle", None)
    return make(name) if make is not None else tidelog.Subscriber(topic, name)


def machine_for(
    link: RemoteSut, level: str, on_start: Callable[[SuiteMachine], None] | None = None
) -> type[SuiteMachine]:
    """A SuiteMachine class bound to ``link`` and ``level``."""
    return type(
        f"SuiteMachine_{level}",
        (SuiteMachine,),
        {"link": link, "level": level, "on_start": staticmethod(on_start) if on_start else None},
    )
