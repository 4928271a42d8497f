"""The stateful conformance suite: a Hypothesis RuleBasedStateMachine that drives a backend and
the reference model (``tidelog.model``) with the same operations through the public API and
asserts equal results (values, or error codes), plus the observable invariants after every step.

Written once, generic over the backend: subclass ``LogMachine``, set ``sut_uri`` to a function
returning the URI of a fresh (named, reopenable) store, and expose ``MyMachine.TestCase`` to
pytest. Capabilities (spec CAP) switch rules off for backends that lack them.

    class TestMemory(LogMachine):
        @staticmethod
        def sut_uri(name: str) -> str:
            return f"memory://{name}"
    TestMemoryCase = TestMemory.TestCase
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Callable, Sequence
from functools import partial
from typing import Any, NoReturn

from hypothesis import event
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

import tidelog
from tidelog.api import Store, Subscriber, Topic
from tidelog.backend import Capabilities
from tidelog.clock import FakeClock
from tidelog.errors import TidelogError
from tidelog.hooks import hooks
from tidelog.model import ModelStore
from tidelog.records import Lease

from .invariants import check_topic
from .sut import RingEvent

__all__ = [
    "LogMachine", "Outcome", "FAILURE_HOOKS", "apply_ring_evictions", "fail",
    "ring_eviction_refused",
]  # fmt: skip

#: called with the message whenever the suite finds a difference, just before it raises (the
#: conformance runner times the first failure of a run with it)
FAILURE_HOOKS: list[Callable[[str], None]] = []


def fail(message: str) -> NoReturn:
    """Report a conformance failure: an AssertionError naming what differed."""
    for hook in FAILURE_HOOKS:
        hook(message)
    raise AssertionError(message)

TOPICS = ("t0", "t1", "dlq")
ROUTERS = ("r0", "r1")
SUBS = ("s0", "s1")
NODES = ("n0", "n1")
TAGS = (None, "a", "b", "ab", "ba")
GLOBS = ("a*", "*a", "?", "b?", "[ab]b", "*")
#: a router's (preserve_tag, preserve_node), mostly both kept
PRESERVE = ((True, True), (True, True), (False, True), (True, False))
# TTLs, leases, delays and clock steps share values so that deadlines are hit exactly
# (off-by-one bugs at `deadline == now` must be reachable).
DURATIONS = (5, 20, 60)
STEPS = (0, 1, 4, 5, 15, 20, 40, 60, 400)

payloads = st.binary(max_size=12)


@st.composite
def topic_configs(
    draw: Any,
    caps: Capabilities,
    name: str,
    trims: tuple[str, ...] = ("acked", "none"),
    favour: str | None = None,
    role: str | None = None,
) -> dict[str, Any]:
    """A topic's config. ``role`` tilts it for a router's ``"source"`` (records that expire or
    are evicted) or ``"dest"`` (refuses appends when full), so routers lag and meet gaps."""
    classes = sorted(caps.durability)
    if favour in caps.durability:
        classes += [favour] * len(classes)  # half the topics get this class
    cfg: dict[str, Any] = {"durability": draw(st.sampled_from(classes))}
    if draw(st.integers(0, 3)):
        cfg["cap_records"] = draw(st.integers(1, 6))
    if draw(st.integers(0, 3)) == 0:
        cfg["cap_bytes"] = draw(st.integers(4, 40))
    if draw(st.integers(0, 1 if role == "source" else 2)) == 0:
        cfg["ttl_ms"] = draw(st.sampled_from(DURATIONS))
    discard, retention = ["old", "reject"], ["backpressure", "drop_oldest"]
    if role is not None:
        discard += ["old" if role == "source" else "reject"] * 2
        retention += ["drop_oldest"] * 2
    cfg["discard"] = draw(st.sampled_from(discard))
    cfg["retention"] = draw(st.sampled_from(retention))
    cfg["trim"] = draw(st.sampled_from(trims))
    cfg["lease_ms"] = draw(st.sampled_from(DURATIONS))
    if caps.queue and caps.multi_topic and name != "dlq" and draw(st.integers(0, 2)) == 0:
        cfg["max_deliveries"] = draw(st.integers(1, 3))
        cfg["dead_letter"] = "dlq"
    return cfg


class Outcome:
    """A value or an error code: what one side of the comparison produced."""

    __slots__ = ("value", "code")

    def __init__(self, value: Any = None, code: str | None = None) -> None:
        self.value = value
        self.code = code

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Outcome) and (self.value, self.code) == (other.value, other.code)

    def __repr__(self) -> str:
        return f"error[{self.code}]" if self.code else repr(self.value)


def _run(fn: Callable[[], Any]) -> Outcome:
    try:
        return Outcome(fn())
    except TidelogError as exc:
        return Outcome(code=exc.code)


def _note(op: str, out: Outcome) -> None:
    """Label what a step exercised, for ``--hypothesis-show-statistics`` (coverage evidence)."""
    if out.code is not None:
        event(f"{op}: error {out.code}")
    elif isinstance(out.value, list) and any(type(v).__name__ == "Tombstone" for v in out.value):
        event(f"{op}: tombstone")


def _sub_handle(topic: Topic, name: str) -> Subscriber:
    """A subscriber handle that does not check existence (remote topics make their own)."""
    make = getattr(topic, "subscriber_handle", None)
    return make(name) if make is not None else Subscriber(topic, name)


def _append_one(topic: Topic, *, payload: bytes, tag: str | None, node: str | None) -> int:
    return topic.append(payload, tag=tag, node=node)


def _append_batch(
    topic: Topic, *, batch: list[bytes], tag: str | None, node: str | None
) -> list[int]:
    return topic.append_many(batch, tag=tag, node=node)


def _delete_before(topic: Topic, *, before: int) -> int:
    return topic.delete(before)


def _read_page(topic: Topic, *, after: int, limit: int, node: str | None) -> Any:
    return topic.read(after, limit, exclude_node=node)


def _resolve_one(sub: Subscriber, *, seq: int, kind: str) -> tuple[bool, int]:
    return getattr(sub, kind)(seq), sub.hwm


def _finish_one(topic: Topic, *, lease: Lease, kind: str) -> None:
    if kind == "complete":
        topic.complete(lease.seq, lease.lease_id)
    elif kind == "release":
        topic.release(lease.seq, lease.lease_id)
    else:
        topic.nack(lease.seq, lease.lease_id, delay_ms=20 if kind == "nack_later" else 0)


def ring_eviction_refused(
    ev: RingEvent, pages: int | None, discarded: Sequence[tuple[int, int]] = ()
) -> str | None:
    """BDEV-16: why the reported overwrite ``ev`` was not legitimate (None: it was). The ring
    really was full, i.e. ``pages`` newer pages each holding a record newer than the evicted
    ones existed. Such a record is one the topic still counts (``head - through`` of them at
    most) or one a power loss discarded (``discarded``: the seq ranges it discarded; the pages
    of an op that never completed keep their place in the ring, BDEV-17): at most
    ``pages - 1`` pages per power loss, each holding one of the seqs above ``through`` that the
    loss discarded."""
    lost = 0
    if pages is not None:
        for lo, hi in discarded:
            lost += min(max(0, hi - max(lo, ev.through + 1) + 1), pages - 1)
    if pages is None or (ev.head - ev.through) + lost < pages:
        return (
            f"BDEV-16: ring overwrite evicted {ev.topic} through seq {ev.through} at head "
            f"{ev.head}, but a ring of {pages} pages was not full ({lost} pages' worth of "
            "records discarded by power losses allowed for)"
        )
    return None


def apply_ring_evictions(model: Any, events: Sequence[RingEvent]) -> None:
    """BDEV-16, TMB-1, SUB-7: the model (a ``ModelStore``) evicts, involuntarily, the live
    records each reported overwrite took."""
    for ev in events:
        with model.lock:
            t = model.topics.get(ev.topic)
            seqs = [q for q in t.live_sorted() if q <= ev.through] if t is not None else []
            if seqs:
                model._remove_involuntary(t, seqs, "evicted")
                model._record_history(t)


class LogMachine(RuleBasedStateMachine):
    """Backend under test vs the model. Subclasses override ``sut_uri`` (and capabilities)."""

    #: capabilities of the backend under test; read from the opened store by default
    capabilities: Capabilities | None = None
    #: whether the backend supports close + reopen by URI (named stores / directories)
    supports_reopen: bool = True
    #: the trim policies topics are created with (SUB-5)
    trims: tuple[str, ...] = ("acked", "none")
    #: a durability class half the topics get (None: all classes alike)
    favour: str | None = None
    #: examples about routers (when the backend claims ``routers``): each starts with a router
    #: between the first two topics, so forwarding runs throughout, and ``router_round_trip``
    #: drives a router's source and dest together
    routed: bool = False
    #: with ``routed``: tilt the first two topics' configs to a router's source and dest
    #: (``topic_configs``' roles), so the router lags behind a full dest and meets gaps
    tilted: bool = False

    @staticmethod
    def sut_uri(name: str) -> str:
        raise NotImplementedError("subclasses return the URI of the backend under test")

    def cleanup_sut(self, name: str) -> None:
        """Forget any state the backend keeps for ``name`` (called at teardown)."""

    def open_sut(self) -> Store:
        """Open (or reopen) the store under test; drivers override this (conformance runner)."""
        return tidelog.open(self.uri, clock=self.clock)

    # -- set-up ----------------------------------------------------------------------------
    def __init__(self) -> None:
        super().__init__()
        self.clock = FakeClock(1_000_000)
        self.name = "m" + uuid.uuid4().hex[:12]
        self.model_uri = f"model://{self.name}"
        self.uri = self.sut_uri(self.name)
        self.model = tidelog.open(self.model_uri, clock=self.clock)
        self.sut = self.open_sut()
        caps = self.capabilities or self.sut.capabilities
        self.caps = caps
        # CAP-2: a single-topic backend is exercised on one topic name
        self.topic_names = TOPICS if caps.multi_topic else TOPICS[:1]
        self.handles: dict[str, tuple[Topic, Topic]] = {}
        self.stale: list[tuple[Topic, Topic]] = []
        self.leases: list[tuple[str, Lease]] = []
        # BDEV-16: per topic incarnation, the seq ranges power losses discarded (the model's
        # head before the loss down to the recovered head), learnt by the machine itself
        self.discarded: dict[str, list[tuple[int, int]]] = {}

    def teardown(self) -> None:
        for store in (self.model, self.sut):
            with contextlib.suppress(TidelogError):
                store.close()
        self.cleanup_sut(self.name)
        from tidelog.model import forget

        forget(self.name)

    # -- helpers ---------------------------------------------------------------------------
    def both(self, fn: Callable[[Store], Any]) -> Outcome:
        expected = _run(lambda: fn(self.model))
        actual = _run(lambda: fn(self.sut))
        if actual != expected:
            fail(f"backend returned {actual!r}, model {expected!r}")
        self.learn_ring()
        _note("store", expected)
        return expected

    def on_topic(self, name: str, fn: Callable[[Topic], Any]) -> Outcome:
        pair = self.handles.get(name)
        if pair is None:
            expected = _run(lambda: fn(self.model.topic(name, create=False)))
            actual = _run(lambda: fn(self.sut.topic(name, create=False)))
        else:
            expected = _run(lambda: fn(pair[0]))
            actual = _run(lambda: fn(pair[1]))
        if actual != expected:
            fail(f"on topic {name}: backend {actual!r}, model {expected!r}")
        self.learn_ring()
        _note("topic", expected)
        return expected

    def on_sub(self, topic: str, sub: str, fn: Callable[[Subscriber], Any]) -> Outcome:
        pair = self.handles.get(topic)
        if pair is None:
            return self.on_topic(topic, lambda t: fn(t.subscribe(sub)))
        m, s = (_sub_handle(pair[0], sub), _sub_handle(pair[1], sub))
        expected = _run(lambda: fn(m))
        actual = _run(lambda: fn(s))
        if actual != expected:
            fail(f"on {topic}/{sub}: backend {actual!r}, model {expected!r}")
        self.learn_ring()
        _note("subscriber", expected)
        return expected

    def head(self, name: str) -> int:
        pair = self.handles.get(name)
        if pair is None:
            return 0
        try:
            return pair[0].state().head_seq
        except TidelogError:
            return 0

    # -- involuntary evictions the model cannot predict (ring overwrite, BDEV-16) -------------
    def ring_events(self) -> list[RingEvent]:
        """Hook: ring overwrites the backend reported since the last call."""
        return []

    def ring_pages(self) -> int | None:
        """Hook: the page count of the backend's ring (None: not a ring)."""
        return None

    def lost_power(self, name: str, head_before: int, head_after: int) -> None:
        """A power loss took ``name`` from ``head_before`` (the model's) back to ``head_after``
        (the recovered head): those records' pages, if any were written, stay in the ring until
        it comes round (BDEV-17), which ``learn_ring`` allows for."""
        if head_after < head_before:
            self.discarded.setdefault(name, []).append((head_after + 1, head_before))

    def forget_discarded(self, name: str | None = None) -> None:
        """A new incarnation of ``name`` (default: of every topic) starts a new ring."""
        if name is None:
            self.discarded = {}
        else:
            self.discarded.pop(name, None)

    def learn_ring(self, events: list[RingEvent] | None = None, into: Any = None) -> None:
        """BDEV-16, TMB-1, SUB-7: apply the reported ring overwrites (default: the new ones)
        to the model (default: ``self.model``) as the involuntary evictions they are, after
        checking each was legitimate (``ring_eviction_refused``)."""
        events = self.ring_events() if events is None else events
        if not events:
            return
        self.check_ring(events)
        apply_ring_evictions(hooks(self.model, ModelStore) if into is None else into, events)

    def check_ring(self, events: list[RingEvent]) -> None:
        """BDEV-16: fail on a reported ring overwrite the ring's size does not allow yet."""
        pages = self.ring_pages()
        for ev in events:
            why = ring_eviction_refused(ev, pages, self.discarded.get(ev.topic, ()))
            if why is not None:
                fail(why)
            event("ring overwrite evicted live records")

    # -- rules: store ----------------------------------------------------------------------
    @initialize(data=st.data())
    def first_topics(self, data: st.DataObject) -> None:
        routed = self.routed and self.caps.routers
        for name, role in zip(self.topic_names[:2], ("source", "dest")):
            self.create_topic(name, data, role if routed and self.tilted else None)
        if routed and len(self.handles) == 2:
            self.first_router(data)

    def first_router(self, data: st.DataObject) -> None:
        """A router between the two first topics, mostly without a filter, so every example
        forwards from its first append (RTR-4..RTR-8); mostly from the first to the second, the
        source and dest ``tilted`` configs are made for."""
        source, dest = list(self.topic_names)[:2]
        if not data.draw(st.integers(0, 3)):
            source, dest = dest, source
        filter_tag = data.draw(st.sampled_from((None, None, None, *GLOBS)))
        exclude_node = data.draw(st.sampled_from((None, None, None, *NODES)))
        preserve = data.draw(st.sampled_from(PRESERVE))
        self.make_router(ROUTERS[0], source, dest, filter_tag, exclude_node, preserve)

    def pick(self, data: st.DataObject) -> str:
        """Mostly an existing topic; sometimes any name (missing topics must fail alike)."""
        names: list[str] = list(self.topic_names)
        if self.handles and data.draw(st.integers(0, 9)) > 0:
            names = sorted(self.handles)
        name: str = data.draw(st.sampled_from(names))
        return name

    @rule(data=st.data())
    def create_topic_rule(self, data: st.DataObject) -> None:
        """TOP-9: create, or verify config of an existing topic."""
        self.create_topic(data.draw(st.sampled_from(self.topic_names)), data)

    def create_topic(self, name: str, data: st.DataObject, role: str | None = None) -> None:
        cfg = data.draw(topic_configs(self.caps, name, self.trims, self.favour, role))
        if name in self.handles and data.draw(st.booleans()):
            cfg = {}  # plain lookup of an existing topic
        out = self.both(lambda s: s.topic(name, **cfg).name)
        if out.code is None:
            self.handles[name] = (self.model.topic(name), self.sut.topic(name))

    @rule(data=st.data())
    def drop_topic(self, data: st.DataObject) -> None:
        """TOP-10 (drawn rarely: most steps should work on live topics)."""
        name = data.draw(st.sampled_from(self.topic_names))
        if data.draw(st.integers(0, 3)):
            return
        self.both(lambda s: s.drop_topic(name))
        self.forget_discarded(name)
        pair = self.handles.pop(name, None)
        if pair is not None:
            self.stale.append(pair)
        self.leases = [(t, lease) for t, lease in self.leases if t != name]
        if pair is not None and data.draw(st.booleans()):
            self.create_topic(name, data)  # a new incarnation under the same name
            self.check_stale(pair)

    @precondition(lambda self: bool(self.stale))
    @rule(data=st.data())
    def use_stale_handle(self, data: st.DataObject) -> None:
        """TOP-10: handles from before a drop raise no_such_topic, even after re-creation."""
        pair = data.draw(st.sampled_from(self.stale))
        if pair[0].name not in self.handles and data.draw(st.booleans()):
            self.create_topic(pair[0].name, data)  # a new incarnation under the same name
        self.check_stale(pair)

    def check_stale(self, pair: tuple[Topic, Topic]) -> None:
        m, s = pair
        expected, actual = _run(lambda: m.append(b"x")), _run(lambda: s.append(b"x"))
        if not expected.code == actual.code == "no_such_topic":
            fail(f"TOP-10: a handle from before the drop gave {actual!r}, model {expected!r}")

    @rule(ms=st.sampled_from(STEPS))
    def advance_clock(self, ms: int) -> None:
        self.clock.advance(ms)

    @rule(early=st.sampled_from([0, 0, 1]))
    def advance_to_deadline(self, early: int) -> None:
        """RET-4, QUE-4, QUE-5 at their boundaries: move the clock exactly onto the next
        deadline the model knows of (a record's ts + ttl_ms, a lease's deadline, a nack's ready
        time), or one millisecond before it."""
        now = self.clock.now_ms()
        model = hooks(self.model, ModelStore)
        due = []
        for t in model.topics.values():
            if t.config.ttl_ms is not None:
                due += [r.ts + t.config.ttl_ms for r in t.records.values()]
            due += [deadline for _, _, deadline in t.queue.leases.values()]
            due += list(t.queue.delayed.values())
        later = [d - early for d in due if d - early > now]
        if later:
            self.clock.set(min(later))
            event("clock moved onto a deadline")

    @rule()
    def flush(self) -> None:
        """DUR-7."""
        self.both(lambda s: s.flush())

    @precondition(lambda self: self.supports_reopen)
    @rule()
    def reopen(self) -> None:
        """DUR-1, SUB-9, QUE-8: clean close + reopen, then the restart rules hold."""
        self.sut.close()
        self.learn_ring()  # the last page written at close may have overwritten some (BDEV-16)
        self.model.close()
        self.model = tidelog.open(self.model_uri, clock=self.clock)
        self.sut = self.open_sut()
        self.handles = {
            n: (self.model.topic(n, create=False), self.sut.topic(n, create=False))
            for n in self.model.topics()
        }
        self.leases = []
        self.stale = []  # handles of the closed store: they raise 'closed' (DUR-8)
        event("reopen")
        self.after_reopen()

    def after_reopen(self) -> None:
        """Hook: backends label what the reopen exercised (e.g. replayed WAL, sealed segments)."""

    # -- rules: log ------------------------------------------------------------------------
    @rule(
        data=st.data(),
        payload=payloads,
        tag=st.sampled_from(TAGS),
        node=st.sampled_from((None, *NODES)),
    )
    def append(
        self, data: st.DataObject, payload: bytes, tag: str | None, node: str | None
    ) -> None:
        """TOP-1, TOP-6, RET-2, RET-3, RET-5, RET-7, SUB-6."""
        self.on_topic(self.pick(data), lambda t: t.append(payload, tag=tag, node=node))

    @rule(
        data=st.data(),
        batch=st.lists(payloads, max_size=5),
        tag=st.sampled_from(TAGS),
        producer=st.sampled_from([None, None, ("p0", 1), ("p0", 2), ("p0", 3), ("p1", 1)]),
    )
    def append_many(
        self,
        data: st.DataObject,
        batch: list[bytes],
        tag: str | None,
        producer: tuple[str, int] | None,
    ) -> None:
        """TOP-6: all-or-nothing batches; TOP-11: idempotent producer batches (retries of an
        applied sequence return [] and append nothing)."""
        node = data.draw(st.sampled_from((None, *NODES)))
        out = self.on_topic(
            self.pick(data),
            lambda t: t.append_many(batch, tag=tag, node=node, producer=producer),
        )
        if producer is not None and batch and out.value == []:
            event("append_many: duplicate producer batch refused")

    @rule(
        data=st.data(),
        records=st.lists(
            st.tuples(payloads, st.sampled_from(TAGS), st.sampled_from((None, *NODES))), max_size=4
        ),
    )
    def append_records(
        self, data: st.DataObject, records: list[tuple[bytes, str | None, str | None]]
    ) -> None:
        """TOP-6: one atomic append where each record has its own tag and node."""
        self.on_topic(self.pick(data), lambda t: t.append_records(records))

    @rule(data=st.data(), n=st.integers(1, 4), tag=st.sampled_from(TAGS))
    def append_burst(self, data: st.DataObject, n: int, tag: str | None) -> None:
        """TOP-1: several single appends in a row (reaches caps, TTL and eviction faster)."""
        name = self.pick(data)
        nodes = data.draw(st.lists(st.sampled_from((None, *NODES)), min_size=n, max_size=n))
        for i, node in enumerate(nodes):
            payload = bytes([i]) * (i + 1)
            self.on_topic(name, partial(_append_one, payload=payload, tag=tag, node=node))

    @rule(data=st.data())
    def read(self, data: st.DataObject) -> None:
        """TOP-7, TOP-8, TMB-1..TMB-5."""
        name = self.pick(data)
        after = data.draw(st.integers(0, self.head(name) + 2))
        limit = data.draw(st.sampled_from([1, 2, 3, 1000]))
        exclude = data.draw(st.sampled_from((None, *NODES)))
        self.on_topic(name, lambda t: t.read(after=after, limit=limit, exclude_node=exclude))

    @rule(data=st.data(), limit=st.integers(1, 3), exclude=st.sampled_from(NODES))
    def page_through(self, data: st.DataObject, limit: int, exclude: str) -> None:
        """TOP-7, TOP-8: a reader paging with a small limit and a node filter; each page
        continues after the last item of the previous one and the pages together hold every
        live record not excluded, once."""
        name = self.pick(data)
        after = 0
        for _ in range(self.head(name) + 2):
            out = self.on_topic(name, partial(_read_page, after=after, limit=limit, node=exclude))
            if not out.value:
                return
            last = out.value[-1]
            after = last.gap_to if type(last).__name__ == "Tombstone" else last.seq

    @precondition(lambda self: self.caps.deletes)
    @rule(data=st.data())
    def delete(self, data: st.DataObject) -> None:
        """DEL-1..DEL-4, DEL-6."""
        name = self.pick(data)
        kind = data.draw(st.sampled_from(["before", "tag", "glob", "before+tag", "bad"]))
        before = data.draw(st.integers(1, self.head(name) + 3))
        tag = data.draw(st.sampled_from(TAGS[1:]))
        glob = data.draw(st.sampled_from(GLOBS))
        calls: dict[str, Callable[[Topic], Any]] = {
            "before": lambda t: t.delete(before),
            "tag": lambda t: t.delete(tag=tag),
            "glob": lambda t: t.delete(tag_glob=glob),
            "before+tag": lambda t: t.delete(before, tag=tag),
            "bad": lambda t: t.delete(tag=tag, tag_glob=glob),
        }
        self.on_topic(name, calls[kind])

    # -- rules: subscribers ----------------------------------------------------------------
    @precondition(lambda self: self.caps.subscribers)
    @rule(
        data=st.data(),
        sub=st.sampled_from(SUBS),
        start=st.sampled_from(["resume", "earliest", "latest"]),
    )
    def subscribe(self, data: st.DataObject, sub: str, start: str) -> None:
        """SUB-1."""
        name = self.pick(data)
        self.on_topic(name, lambda t: t.subscribe(sub, start=start).hwm)

    @precondition(lambda self: self.caps.subscribers)
    @rule(data=st.data(), sub=st.sampled_from(SUBS), limit=st.integers(1, 4))
    def poll(self, data: st.DataObject, sub: str, limit: int) -> None:
        """SUB-4, SUB-7."""
        name = self.pick(data)
        self.on_sub(name, sub, lambda s: s.poll(limit))

    @precondition(lambda self: self.caps.subscribers)
    @rule(
        sub=st.sampled_from(SUBS), kind=st.sampled_from(["ack", "reject", "commit"]), data=st.data()
    )
    def resolve(self, sub: str, kind: str, data: st.DataObject) -> None:
        """SUB-2, SUB-3, SUB-5."""
        name = self.pick(data)
        seq = data.draw(st.integers(1, self.head(name) + 1))
        self.on_sub(name, sub, lambda s: (getattr(s, kind)(seq), s.hwm))

    @precondition(lambda self: self.caps.subscribers)
    @rule(
        data=st.data(),
        sub=st.sampled_from(SUBS),
        start=st.sampled_from(["resume", "earliest"]),
        limit=st.integers(1, 5),
    )
    def consume(self, data: st.DataObject, sub: str, start: str, limit: int) -> None:
        """SUB-1..SUB-4: a producer and a consumer's round trip: (re)subscribe, append, poll,
        then ack or reject some of what it got, in any order (the hwm must stop at the first
        unresolved seq)."""
        name = self.pick(data)
        self.on_topic(name, lambda t: t.subscribe(sub, start=start).hwm)
        batch = data.draw(st.lists(payloads, max_size=4))
        if batch:
            self.on_topic(name, lambda t: t.append_many(batch))
        got = self.on_sub(name, sub, lambda s: s.poll(limit))
        seqs = [i.seq for i in got.value or () if type(i).__name__ == "Record"]
        for seq in data.draw(st.permutations(seqs)):
            kind = data.draw(st.sampled_from(["ack", "ack", "reject", "skip"]))
            if kind != "skip":
                self.on_sub(name, sub, partial(_resolve_one, seq=seq, kind=kind))

    @precondition(lambda self: self.caps.subscribers)
    @rule(data=st.data(), sub=st.sampled_from(SUBS))
    def unregister(self, data: st.DataObject, sub: str) -> None:
        """SUB-8."""
        name = self.pick(data)
        self.on_sub(name, sub, lambda s: s.unregister())

    @precondition(lambda self: self.caps.subscribers)
    @rule(data=st.data(), sub=st.sampled_from(SUBS))
    def flush_subscriber(self, data: st.DataObject, sub: str) -> None:
        """SUB-9."""
        name = self.pick(data)
        self.on_sub(name, sub, lambda s: s.flush())

    # -- rules: routers --------------------------------------------------------------------
    @precondition(lambda self: self.caps.routers)
    @rule(
        data=st.data(),
        name=st.sampled_from(ROUTERS),
        filter_tag=st.sampled_from((None, None, *GLOBS)),
        exclude_node=st.sampled_from((None, None, *NODES)),
        preserve=st.sampled_from(PRESERVE),
        allow_cycle=st.just(False),  # a cycle that never settles grows without bound
    )
    def router(
        self,
        data: st.DataObject,
        name: str,
        filter_tag: str | None,
        exclude_node: str | None,
        preserve: tuple[bool, bool],
        allow_cycle: bool,
    ) -> None:
        """RTR-1..RTR-3, RTR-9: create a router between two topics (or open it, or be refused
        alike: fan-in, cycles, missing topics, a different config). Cycles are refused here:
        one whose copies pass every filter forwards without end (RTR-9), and two routers from
        one source into a topic that feeds it back double it at every op; the unit tests
        drive allowed cycles."""
        source, dest = self.pick(data), self.pick(data)
        dests = sorted({d for _, d in self.routes()})
        routed_dest: bool = data.draw(st.booleans())
        if dests and routed_dest:  # into a routed dest: RTR-9's fan-in refusal
            dest = data.draw(st.sampled_from(dests))
        self.make_router(name, source, dest, filter_tag, exclude_node, preserve, allow_cycle)

    def make_router(
        self,
        name: str,
        source: str,
        dest: str,
        filter_tag: str | None,
        exclude_node: str | None,
        preserve: tuple[bool, bool],
        allow_cycle: bool = False,
    ) -> Outcome:
        """RTR-1: ``Store.router`` on both sides; the same info (cursor, lag) or error."""
        out = self.both(
            lambda s: s.router(
                name, source, dest, filter_tag=filter_tag, exclude_node=exclude_node,
                preserve_tag=preserve[0], preserve_node=preserve[1], allow_cycle=allow_cycle,
            )
        )  # fmt: skip
        if out.code is None:
            event("router created or opened")
        return out

    @precondition(lambda self: self.caps.routers)
    @rule(name=st.sampled_from(ROUTERS))
    def drop_router(self, name: str) -> None:
        """RTR-12."""
        self.both(lambda s: s.drop_router(name))

    def routes(self) -> list[tuple[str, str]]:
        """(source, dest) of the model's routers whose topics both have handles."""
        routers = hooks(self.model, ModelStore).routers.values()
        return [(r.source, r.dest) for r in routers if {r.source, r.dest} <= set(self.handles)]

    @precondition(lambda self: self.routed and self.caps.routers and bool(self.routes()))
    @rule(
        data=st.data(),
        fill=st.integers(0, 7),
        batches=st.lists(st.lists(payloads, min_size=1, max_size=3), min_size=1, max_size=4),
        wait=st.sampled_from((0, *DURATIONS)),
        room=st.booleans(),
    )
    def router_round_trip(
        self, data: st.DataObject, fill: int, batches: list[list[bytes]], wait: int, room: bool
    ) -> None:
        """RTR-4..RTR-8: a router's source and dest driven together. Direct appends fill dest
        (a full dest refuses copies and the router lags, RTR-6), appends to the source follow,
        time passes between them (the records the router has not forwarded expire, or newer
        ones evict them, RET-2, RET-4, RTR-7: dest must get a loss range, RTR-5), then room is
        made in dest (DEL-1) so that forwarding resumes (RTR-8)."""
        source, dest = data.draw(st.sampled_from(self.routes()))
        for i in range(fill):
            node = data.draw(st.sampled_from((None, *NODES)))
            self.on_topic(dest, partial(_append_one, payload=bytes([i]), tag=None, node=node))
        for k, batch in enumerate(batches):
            if k == len(batches) - 1 and wait:
                self.clock.advance(wait)
            tag = data.draw(st.sampled_from(TAGS))
            node = data.draw(st.sampled_from((None, *NODES)))
            self.on_topic(source, partial(_append_batch, batch=batch, tag=tag, node=node))
        if room and self.caps.deletes:
            self.on_topic(dest, partial(_delete_before, before=self.head(dest) + 1))

    # -- rules: queue ----------------------------------------------------------------------
    @precondition(lambda self: self.caps.queue)
    @rule(
        data=st.data(),
        node=st.sampled_from(NODES),
        limit=st.integers(1, 3),
        lease_ms=st.sampled_from((None, *DURATIONS)),
    )
    def claim(self, data: st.DataObject, node: str, limit: int, lease_ms: int | None) -> None:
        """QUE-1, QUE-2, QUE-6, QUE-7."""
        name = self.pick(data)
        out = self.on_topic(name, lambda t: t.claim(node, max=limit, lease_ms=lease_ms))
        if out.code is None:
            self.leases += [(name, lease) for lease in out.value]
            if any(lease.deliveries > 1 for lease in out.value):
                event("claim: redelivered a reclaimed job")

    @precondition(lambda self: self.caps.queue and bool(self.leases))
    @rule(data=st.data(), kind=st.sampled_from(["complete", "release", "nack", "nack_later"]))
    def finish(self, data: st.DataObject, kind: str) -> None:
        """QUE-3, QUE-4, QUE-5: finishing with a valid, stale or expired lease."""
        name, lease = data.draw(st.sampled_from(self.leases))
        lease_id = lease.lease_id + data.draw(st.sampled_from([0, 0, 0, 1]))
        calls: dict[str, Callable[[Topic], Any]] = {
            "complete": lambda t: t.complete(lease.seq, lease_id),
            "release": lambda t: t.release(lease.seq, lease_id),
            "nack": lambda t: t.nack(lease.seq, lease_id),
            "nack_later": lambda t: t.nack(lease.seq, lease_id, delay_ms=20),
        }
        if self.on_topic(name, calls[kind]).code is None:
            self.leases.remove((name, lease))  # the lease ended: later use is lease_lost

    @precondition(lambda self: self.caps.queue)
    @rule(
        data=st.data(),
        node=st.sampled_from(NODES),
        limit=st.integers(1, 3),
        kinds=st.lists(st.sampled_from(["complete", "release", "nack", "nack_later", "keep"]),
                       min_size=3, max_size=3),
    )
    def work(self, data: st.DataObject, node: str, limit: int, kinds: list[str]) -> None:
        """QUE-1..QUE-4: a producer and a worker's round trip: append jobs, claim, finish each
        some way, claim again (released and nacked jobs come back first; delayed ones only when
        due)."""
        name = self.pick(data)
        batch = data.draw(st.lists(payloads, max_size=3))
        if batch:
            self.on_topic(name, lambda t: t.append_many(batch))
        for _ in range(2):
            out = self.on_topic(name, lambda t: t.claim(node, max=limit))
            for lease, kind in zip(out.value or (), kinds):
                if kind == "keep":
                    self.leases.append((name, lease))
                else:
                    self.on_topic(name, partial(_finish_one, lease=lease, kind=kind))

    # -- invariants ------------------------------------------------------------------------
    @invariant()
    def states_agree(self) -> None:
        """Every topic's observable state equals the model's; model invariants hold."""
        if self.both(lambda s: s.topics()).code is not None:
            fail("topics() failed")
        for name in self.model.topics():
            pair = self.handles.get(name)
            if pair is None:  # created by the store itself (a dead-letter topic, QUE-7)
                pair = self.handles[name] = (
                    self.model.topic(name, create=False),
                    self.sut.topic(name, create=False),
                )
            m, s = pair
            expected, actual = _run(m.state), _run(s.state)
            if actual != expected:
                fail(f"state of {name}: backend {actual!r}, model {expected!r}")
            full_m, full_s = _run(partial(m.read, 0, 10**9)), _run(partial(s.read, 0, 10**9))
            if full_s != full_m:
                fail(f"full read of {name}: backend {full_s!r}, model {full_m!r}")
            try:
                check_topic(s, actual.value, full_s.value)
            except AssertionError as exc:
                fail(f"topic {name}: {exc}")
            subs = _run(m.subscribers)
            got = _run(s.subscribers)
            if got != subs:
                fail(f"subscribers of {name}: backend {got!r}, model {subs!r}")
            for sub in subs.value or ():
                hwm_s = _run(partial(lambda t, n: _sub_handle(t, n).hwm, s, sub))
                hwm_m = _run(partial(lambda t, n: _sub_handle(t, n).hwm, m, sub))
                if hwm_s != hwm_m:
                    fail(f"hwm of {name}/{sub}: backend {hwm_s}, model {hwm_m}")
        if self.caps.routers:
            routers = self.both(lambda s: s.routers())  # RTR-1: cursors and lag agree
            if any(info.lag for info in routers.value or ()):
                event("a router lags (RTR-6)")
        if "dlq" in self.model.topics() and self.model.topic("dlq").state().head_seq:
            event("dead-letter topic received records")
        hooks(self.model, ModelStore).check_invariants()
