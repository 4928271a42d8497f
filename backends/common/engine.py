"""The engine: spec/SPEC.md semantics over the efficient per-topic structures, written once
and shared by backends that differ only in where bytes live.

Every public op reads the clock once (``now``), applies the lazy time effects (RET-4, QUE-5) of
its topic, checks everything that can fail before changing anything (ERR-2, RET-7), then applies
effects. Each effect is reported to the backend's ``Journal`` (if any) so a persistent backend can
log it; recovery replays logged effects through the same ``apply_*`` methods. One re-entrant lock
per store serialises ops (CON-1); waiting for durability happens after the lock is released, so
concurrent writers share group commits.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping, Sequence
from itertools import groupby
from typing import Any, TypeVar

from tidelog.backend import Backend, Capabilities, StoreOptions, TopicRef
from tidelog.clock import Clock, SystemClock
from tidelog.config import TopicConfig
from tidelog.errors import (
    Backpressure,
    BadArgument,
    BadOption,
    Closed,
    LeaseLost,
    NoSuchSubscriber,
    NoSuchTopic,
    ReadOnly,
    StoreFull,
    TidelogError,
    TooLarge,
    TopicFull,
)
from tidelog.records import Item, Lease, RouterConfig, RouterInfo, Tombstone, TopicState

from .index import SealedChunk, TopicLog
from .jobs import JobQueue
from .journal import Journal
from .lane import Fallback, Lane, ManyFallback, make_lane, make_many_lane
from .progress import Progress, SubState
from .routing import Routing

__all__ = ["Engine", "EngineTopic", "Pending", "WouldBlock"]

R = TypeVar("R")
Run = tuple[Sequence[bytes], str | None, str | None]  # payloads sharing one tag and node
#: What an op still has to wait for after its lock is released: its journal ticket and the
#: gated topics it appended to (``Engine._finish``'s arguments; ``Engine.begin_inline``).
Pending = tuple[object | None, list[tuple["EngineTopic", int]]]


class _Inline(threading.local):
    """Per thread: the Pending list of ``begin_inline`` (None outside it). The class attribute
    is every thread's None until it sets its own: a ``getattr(local, "later", None)`` on a
    thread that never set it raises and catches an AttributeError on every durable op."""

    later: list[Pending] | None = None


class WouldBlock(Exception):
    """Raised by ``Engine.wait`` inside ``begin_inline``: a call that waits for a change
    (CON-3: a read or poll with ``wait_ms``, an append waiting out backpressure) must run on a
    thread that may block. It is raised before the first sleep, after attempts that found
    nothing to do, so running the whole call again elsewhere is the same call."""


class EngineTopic:
    """One topic incarnation: its log, its subscribers' progress and its job queue. ``tid`` (the
    store-wide incarnation number) identifies it in logs and on disk."""

    __slots__ = (
        "name", "config", "tid", "log", "progress", "jobs", "_version", "producers", "lean",
        "cursors", "outs", "dropped",
    )  # fmt: skip

    def __init__(self, name: str, config: TopicConfig, tid: int) -> None:
        self.name = name
        self.config = config
        self.tid = tid
        self.log = TopicLog(name, config)
        self.progress = Progress()
        self.jobs = JobQueue()
        # version (a property): moves on every change; readers waiting for data sleep on it
        # (CON-3). An append moves the head, so it is _version + head: appends change nothing
        # else, other changes bump _version
        self._version = 0
        self.producers: dict[str, int] = {}  # TOP-11: producer id -> last applied sequence
        # no cap and no TTL: a single append can neither evict, nor be refused for room, nor
        # expire anything, so a lane (lane.py) may take it (config is immutable, TOP-9)
        self.lean = (
            config.cap_records is None and config.cap_bytes is None and config.ttl_ms is None
        )
        self.cursors: dict[str, int] = {}  # RTR-10: the cursors of the routers into this topic
        self.outs = 0  # how many routers read this topic (their forwarding follows its ops)
        self.dropped = False  # dropped: a lane holding it refuses from then on

    @property
    def version(self) -> int:
        return self._version + self.log.head

    def bump(self) -> None:
        """A change that does not move the head (one read-modify-write of ``_version``)."""
        self._version += 1


class Engine(Backend):
    """A complete Backend over in-memory structures; storage backends extend it."""

    #: Whether ``begin_inline`` may run ops on a thread that must not block (an event loop):
    #: True for a backend whose ops, once they hold the store lock, do no I/O and wait for
    #: nothing but the journal's durability (which ``begin_inline`` hands to the caller), except
    #: reading payloads of sealed chunks (``resident``). A backend that writes or syncs under
    #: the lock in its ops (blockdev's slot writes) leaves it False.
    INLINE = False

    def __init__(
        self,
        clock: Clock,
        options: StoreOptions,
        capabilities: Capabilities,
        journal: Journal | None = None,
    ) -> None:
        self.clock = clock
        self._wall = type(clock) is SystemClock  # lanes read the time without a call
        self.options = options
        self.capabilities = capabilities
        self.journal = journal
        self.topics: dict[str, EngineTopic] = {}
        self.by_id: dict[int, EngineTopic] = {}
        self.lock = threading.RLock()
        self.changed = threading.Condition(self.lock)
        self.closed = False
        self.readonly = False  # a read-only view: every op that would change state refuses
        self.incarnations = 0
        self.routers: dict[str, RouterConfig] = {}  # RTR-1; cursors live in dest (RTR-10)
        self.routing = Routing(self)
        self._forwarded = False  # the current op forwarded: it waits as a durable op does
        # gated topics the current op appended to, each with the last seq the op appended
        self._unpublished: list[tuple[EngineTopic, int]] = []
        # threads in wait() and watchers: _bump notifies only when someone listens
        self._waiters = 0
        self._watchers: tuple[Callable[[str | None], None], ...] = ()
        self._publishing = threading.Lock()  # _finish: gated topics' visible
        # per thread: the Pending list of begin_inline, collecting what its ops would wait for
        self._inline = _Inline()

    # -- lookups ---------------------------------------------------------------------------
    def _check_open(self) -> None:
        if self.closed:
            raise Closed("store is closed")

    def _get(self, ref: TopicRef) -> EngineTopic:
        self._check_open()
        t = self.topics.get(ref.name)
        if t is None or t.tid != ref.incarnation:
            raise NoSuchTopic(f"topic {ref.name!r} does not exist (dropped?)")
        return t

    def _sub(self, t: EngineTopic, name: str) -> SubState:
        s = t.progress.subs.get(name)
        if s is None:
            raise _no_sub(t, name)
        return s

    def _enter(self, ref: TopicRef) -> tuple[EngineTopic, int]:
        """Start a topic op: resolve the handle, read the clock once, apply time effects."""
        t = self._get(ref)
        now = self.clock.now_ms()
        if self._tick(t, now):
            self._routed(now)  # RTR-8: what the time effects made forwardable
        return t, now

    def _routed(self, now: int) -> None:
        """RTR-8: forward what this op made forwardable, inside the op. Called at the same
        points of the same ops as the model forwards, so both forward alike even in a cycle
        that never settles (RTR-9)."""
        if self.routers:
            self.routing.pump(now)

    def _run(
        self, ref: TopicRef, op: Callable[[EngineTopic, int], R], *, durable: bool = True
    ) -> R:
        """Run ``op`` under the lock, then (outside it) wait until its effects are durable as
        the topic's durability class requires. Reads pass ``durable=False``: their only effects
        (lazy TTL/lease expiry) are re-derivable from time and need no wait."""
        if durable and self.readonly:
            raise ReadOnly("this store was opened read-only (readonly=true)")
        with self.lock:
            t, now = self._enter(ref)
            entered = None if not self._unpublished else self._end_op(True)
            if entered is None:
                done = self._body(t, now, op, durable)
        if entered is not None:
            # RTR-8: entering copied records into a topic whose reads wait for durability
            # (dead letters forwarded back, say): they become readable before the op runs,
            # so it sees what the model's op sees (so this wait is never deferred: inline too)
            self._finish(*entered, last=False)
            with self.lock:
                done = self._body(self._get(ref), now, op, durable)
        result, refused, ticket, touched = done
        self._finish(ticket, touched)
        if refused is not None:
            raise refused
        return result  # type: ignore[return-value]  # set: op returned

    def _body(
        self, t: EngineTopic, now: int, op: Callable[[EngineTopic, int], R], durable: bool
    ) -> tuple[R | None, TidelogError | None, object | None, list[tuple[EngineTopic, int]]]:
        """Under the lock: run ``op`` and end it. A refused op changed nothing (ERR-2), but
        what entering did (time effects, copies) is submitted all the same."""
        result: R | None = None
        refused: TidelogError | None = None
        try:
            result = op(t, now)
        except TidelogError as exc:
            refused = exc
        ticket, touched = self._end_op(durable)
        return result, refused, ticket, touched

    def _end_op(self, durable: bool) -> tuple[object | None, list[tuple[EngineTopic, int]]]:
        """Under the lock: submit the op's effects; returns what ``_finish`` needs."""
        touched, self._unpublished = self._unpublished, []
        wait = durable or self._forwarded  # copies into a gated dest are readable once durable
        self._forwarded = False
        ticket = self.journal.end_op(wait) if self.journal is not None else None
        return ticket, touched

    def _finish(
        self, ticket: object | None, touched: list[tuple[EngineTopic, int]], *, last: bool = True
    ) -> None:
        """Outside the lock: wait until the op is durable, then make its appends readable
        (fsync topics gate reads on durability; an op may append to several topics, e.g.
        dead-lettering). Readable up to this op's own last seq, never further: a later op of
        another thread may not be durable yet (ops of a topic become durable in seq order).
        Inside ``begin_inline`` the op's last wait (``last``) is handed to the caller instead."""
        if last and (ticket is not None or touched):
            later = self._inline.later
            if later is not None:
                later.append((ticket, touched))
                return
        if ticket is not None:
            assert self.journal is not None
            self.journal.wait(ticket)
        if touched:
            # A lock of its own, not the store lock that every op contends for: only publishers
            # write a gated topic's ``visible`` (it only grows; readers read it once per op).
            with self._publishing:
                for t, seq in touched:
                    if t.log.visible < seq:
                        t.log.visible = seq
                        t.bump()
            if self._waiters:
                with self.lock:
                    for t, _ in touched:
                        self._notify(t.name)

    # -- callers that must not block (the service's event loop) -----------------------------
    def begin_inline(self, name: str | None, after: int | None = None) -> list[Pending] | None:
        """Let this thread run ops without blocking, until ``end_inline`` (always call it when
        this returned a list). None when an op of topic ``name`` (a read after ``after``) might
        block here: the backend is not ``INLINE``, another thread holds the store lock now, or
        the op may read a sealed chunk (``resident``); run it on another thread then. Else the
        store lock is held until ``end_inline`` (ops take it again, re-entrantly, so none
        waits for it), and each op's last wait for durability is appended to the returned list
        instead of waited for: the caller passes it to ``finish``, on a thread that may block,
        and reports an op's result (or its refusal) only once that returned, as the op would
        have. A wait an op needs before its own effects (``_run``'s entering copies into an
        ``fsync`` topic, RTR-8; a WAL op spanning shards, FileBackend) still waits here."""
        if not self.INLINE or not self.lock.acquire(blocking=False):
            return None
        if not self.resident(name, after):
            self.lock.release()
            return None
        later: list[Pending] = []
        self._inline.later = later
        return later

    def end_inline(self) -> None:
        self._inline.later = None
        self.lock.release()

    def resident(self, name: str | None, after: int | None = None) -> bool:
        """Under the lock: whether an op of topic ``name`` reads only memory, never a payload
        of a sealed chunk (file-backed: a page fault may read the disk). ``after``: the op
        reads payloads after that seq (a read; 0 for a poll or a claim, which may read any);
        None: it reads none of its own (an append, a state, an ack), though entering may
        dead-letter one of its jobs (QUE-7). Routers read their sources inside any op (RTR-8),
        so with routers every topic's chunks count."""
        if self.routers and any(x.log.chunks for x in self.topics.values()):
            return False
        t = self.topics.get(name) if name is not None else None
        if t is None or not t.log.chunks:
            return True
        if after is None:
            return t.config.dead_letter is None
        return after + 1 >= t.log.base

    def finish(self, pending: Sequence[Pending]) -> None:
        """Wait for what ``begin_inline`` collected, in order (a thread that may block)."""
        for ticket, touched in pending:
            self._finish(ticket, touched, last=False)

    def _bump(self, t: EngineTopic) -> None:
        t.bump()
        if self._waiters:
            self._notify(t.name)

    def _notify(self, name: str | None) -> None:
        """Under the lock: wake the threads in ``wait`` and tell the watchers which topic's
        change counter moved (None: the store closed)."""
        self.changed.notify_all()
        for fn in self._watchers:
            fn(name)

    def watch(self, fn: Callable[[str | None], None]) -> bool:
        with self.lock:
            self._watchers = (*self._watchers, fn)
            self._waiters += 1  # for good: every change now notifies
        return True

    def changes(self, ref: TopicRef) -> int:
        with self.lock:
            return self._get(ref).version

    def wait(self, ref: TopicRef, since: int, timeout: float) -> None:
        if self._inline.later is not None:
            raise WouldBlock("a wait inside Engine.begin_inline")
        with self.changed:
            t = self.topics.get(ref.name)
            if t is None or t.tid != ref.incarnation or t.version != since or self.closed:
                return
            self._waiters += 1
            try:
                self.changed.wait(timeout)
            finally:
                self._waiters -= 1

    # -- lazy time effects (RET-4, QUE-5) --------------------------------------------------
    def _tick(self, t: EngineTopic, now: int) -> bool:
        """Apply the lazy time effects due at ``now``; True if any was."""
        expired = t.log.expired(now)
        if expired:
            self.apply_evict(t, expired[-1], "ttl")
        changed = bool(expired)
        if t.jobs.leases or t.jobs.delayed:
            for seq in t.jobs.expired(now):
                self._return_job(t, seq, now)
                changed = True
            for seq in t.jobs.ready(now):
                self._return_job(t, seq, now)
                changed = True
        return changed

    # ======================================================================================
    # effects: every state change goes through these (live ops and WAL replay alike)
    # ======================================================================================
    def apply_create(self, name: str, config: TopicConfig, tid: int) -> EngineTopic:
        t = EngineTopic(name, config, tid)
        t.lean = t.lean and self.options.max_bytes is None and not self.readonly
        self.topics[name] = t
        self.by_id[tid] = t
        self.incarnations = max(self.incarnations, tid)
        self.on_create(t)
        if self.journal is not None:
            self.journal.created(t)
        return t

    def on_create(self, t: EngineTopic) -> None:
        """Hook for backends (e.g. to gate visibility on fsync topics)."""

    def apply_drop(self, t: EngineTopic) -> None:
        if self.journal is not None:
            self.journal.dropped(t)
        t.dropped = True
        for name in t.cursors:  # RTR-12: routers into it (their drop effects came first live)
            self.routers.pop(name, None)
        if self.topics.get(t.name) is t:
            del self.topics[t.name]
        self.by_id.pop(t.tid, None)
        if t.cursors or t.outs:
            self.routing.count_outs()
        self._notify(t.name)

    def apply_append(
        self,
        t: EngineTopic,
        payloads: Sequence[bytes],
        tag: str | None,
        node: str | None,
        ts: int,
        nbytes: int | None = None,
        sizes: list[int] | None = None,
    ) -> list[int]:
        """``nbytes``: the payloads' total size, ``sizes`` their lengths, if the caller took
        them (the journal's frame then takes no ``len`` of each payload again, nor their sum)."""
        seqs = t.log.append(payloads, tag, node, ts, nbytes)
        if t.log.gate_visibility:
            self._unpublished.append((t, seqs[-1]))
        if self.journal is not None:
            self.journal.appended(t, seqs[0], ts, tag, node, payloads, sizes, nbytes)
        self._bump(t)
        return seqs

    def apply_located(
        self, t: EngineTopic, chunk: SealedChunk, n: int, nbytes: int, tag: str | None, ts: int
    ) -> None:
        """Replay only (no journal): records ``head + 1 ..`` that ``chunk`` already serves
        (the file backend's recovered WAL tail, FORMATS-wal-tail.md WTAIL-1)."""
        assert self.journal is None, "located records come from replay only"
        t.log.append_located(chunk, n, nbytes, tag, ts)
        if t.log.gate_visibility:
            self._unpublished.append((t, t.log.head))
        self._bump(t)

    def apply_produced(self, t: EngineTopic, pid: str, seq: int) -> None:
        """TOP-11: remember a producer's sequence, in the same op as its records."""
        t.producers[pid] = max(t.producers.get(pid, 0), seq)
        if self.journal is not None:
            self.journal.produced(t, pid, seq)

    def apply_evict(self, t: EngineTopic, through: int, reason: str) -> None:
        """Involuntary removal of every live seq <= through (TMB-1, SUB-7)."""
        seqs = t.log.live_between(1, through)
        if not seqs:
            return
        if self.journal is not None:
            self.journal.evicted(t, through, reason)
        t.progress.note_involuntary(t.log, seqs)
        t.log.remove(seqs, involuntary=True)
        self._settle(t)

    def apply_remove(self, t: EngineTopic, seqs: Sequence[int], fate: str) -> None:
        """Voluntary removal of live ``seqs`` (fate "deleted" or "trimmed")."""
        live = [q for q in seqs if t.log.is_live(q)]
        if not live:
            return
        if self.journal is not None:
            self.journal.removed(t, live, fate)
        t.log.remove(live, involuntary=False)
        if fate != "trimmed":
            self._settle(t)
        else:
            self._bump(t)

    def apply_loss(self, t: EngineTopic, lo: int, hi: int) -> tuple[int, int] | None:
        """Seqs lo..hi above the head were lost (a crash, DUR-3) or are a router's copies of
        lost source seqs (RTR-5): raise the head over them and record a loss range, so readers
        get a tombstone, subscribers a gap (SUB-7) and no seq is reused. Returns the range
        recorded (None: the head is past it already, e.g. a snapshot holds it)."""
        if hi <= t.log.head:
            return None
        lo = max(lo, t.log.head + 1)
        t.progress.note_loss(t.log, lo, hi)  # SUB-7: every lost seq above an hwm was unresolved
        t.log.skip_to(hi)
        t.log.add_loss(lo, hi)
        if self.journal is not None:
            self.journal.loss(t, lo, hi)
        return lo, hi

    def _settle(self, t: EngineTopic) -> None:
        """Advance hwms and ack-trim after any change; wakes waiters (producers blocked on
        backpressure wait for exactly this)."""
        if t.progress.subs:
            trimmed = t.progress.settle(t.log, self.routing.holds(t) if t.outs else ())
            if trimmed:
                self.apply_remove(t, trimmed, "trimmed")
        self._bump(t)

    def apply_register(self, t: EngineTopic, name: str, base: int) -> SubState:
        s = t.progress.add(name, base)
        if self.journal is not None:
            self.journal.registered(t, name, base)
        return s

    def apply_unregister(self, t: EngineTopic, name: str) -> None:
        if self.journal is not None:
            self.journal.unregistered(t, name)
        t.progress.subs.pop(name, None)
        self._settle(t)

    def apply_delivered(
        self, t: EngineTopic, seq: int, lease_id: int, count: int, fresh: bool
    ) -> None:
        jobs = t.jobs
        jobs.free.discard(seq)
        jobs.delayed.pop(seq, None)
        jobs.deliveries[seq] = count
        jobs.next_lease_id = max(jobs.next_lease_id, lease_id + 1)
        if fresh:
            jobs.claim_cursor = max(jobs.claim_cursor, seq)
        if self.journal is not None:
            self.journal.delivered(t, seq, lease_id, count, fresh)

    def apply_returned(self, t: EngineTopic, seq: int) -> None:
        t.jobs.free.add(seq)
        if self.journal is not None:
            self.journal.returned(t, seq)

    def apply_delayed(self, t: EngineTopic, seq: int, ready_at: int) -> None:
        t.jobs.delay(seq, ready_at)
        if self.journal is not None:
            self.journal.delayed(t, seq, ready_at)

    # ======================================================================================
    # store
    # ======================================================================================
    def open_topic(self, name: str, options: Mapping[str, object], create: bool) -> TopicRef:
        with self.lock:
            self._check_open()
            t = self.topics.get(name)
            if t is not None:
                t.config.check_matches(name, options)
                return TopicRef(name, t.tid)
            if not create:
                raise NoSuchTopic(f"topic {name!r} does not exist")
            if self.readonly:
                raise ReadOnly(f"cannot create topic {name!r}: the store is read-only")
            t = self._create(name, TopicConfig.from_options(name, options))
            ticket, touched = self._end_op(True)
        self._finish(ticket, touched)
        return TopicRef(name, t.tid)

    def _create(self, name: str, config: TopicConfig) -> EngineTopic:
        if config.durability not in self.capabilities.durability:
            raise BadOption(
                f"durability {config.durability!r} is not offered by this backend; "
                f"choose from {', '.join(sorted(self.capabilities.durability))}"
            )
        return self.apply_create(name, config, self.incarnations + 1)

    def topic_config(self, ref: TopicRef) -> TopicConfig:
        with self.lock:
            return self._get(ref).config

    def list_topics(self) -> list[str]:
        with self.lock:
            self._check_open()
            return sorted(self.topics)

    def drop_topic(self, name: str) -> None:
        with self.lock:
            self._check_open()
            t = self.topics.get(name)
            if t is None:
                raise NoSuchTopic(f"topic {name!r} does not exist")
            if self.readonly:
                raise ReadOnly(f"cannot drop topic {name!r}: the store is read-only")
            self.routing.drop_of(name)  # RTR-12
            self.apply_drop(t)
            ticket, touched = self._end_op(True)
        self._finish(ticket, touched)

    def flush(self) -> None:
        with self.lock:
            self._check_open()
            for t in self.topics.values():
                for s in t.progress.subs.values():
                    s.flushed_hwm = s.hwm

    def close(self) -> None:
        with self.lock:
            if not self.closed:
                self.flush()
                self.closed = True
                self._notify(None)

    def restart(self, clock: Clock) -> None:
        """Apply the restart rules (DUR-1, SUB-9, QUE-8) and reopen."""
        with self.lock:
            self.clock = clock
            self._wall = type(clock) is SystemClock
            self.closed = False
            now = clock.now_ms()
            for name in sorted(self.topics):
                t = self.topics.get(name)
                if t is not None:
                    self.restart_topic(t, now)
            self.routing.resume(now)  # RTR-11
            ticket, touched = self._end_op(True)
        self._finish(ticket, touched)

    def restart_topic(self, t: EngineTopic, now: int) -> None:
        if t.config.durability == "ephemeral" and t.log.count:
            self.apply_evict(t, t.log.head, "lost")
        for s in t.progress.subs.values():
            s.cursor = s.hwm
        for seq in t.jobs.end_all_leases():
            self._return_job(t, seq, now)

    def describe(self) -> dict[str, object]:
        with self.lock:
            return {
                "topics": {
                    name: {
                        "state": self._peek_state(t).to_dict(),
                        "config": t.config.to_dict(),
                        "subscribers": {
                            n: {"hwm": s.hwm, "base": s.base}
                            for n, s in sorted(t.progress.subs.items())
                        },
                        "leases": len(t.jobs.leases),
                    }
                    for name, t in sorted(self.topics.items())
                }
            }

    @staticmethod
    def _peek_state(t: EngineTopic) -> TopicState:
        log = t.log
        visible = log.visible  # read once: a publisher may raise it meanwhile (_finish)
        if visible == log.head:
            return TopicState(log.head, log.earliest, log.evict_floor, log.count, log.nbytes)
        # fsync topic with an append in flight: report what readers can see
        pending = log.live_between(visible + 1, log.head)
        count = log.count - len(pending)
        nbytes = log.nbytes - sum(len(log.record(q).payload) for q in pending)
        earliest = min(log.earliest, visible + 1)
        return TopicState(visible, earliest, log.evict_floor, count, nbytes)

    # -- routers (RTR, Routing) -------------------------------------------------------------
    def router(self, name: str, config: RouterConfig) -> RouterInfo:
        return self.routing.create(name, config)

    def list_routers(self) -> list[RouterInfo]:
        return self.routing.infos()

    def drop_router(self, name: str) -> bool:
        return self.routing.drop(name)

    # ======================================================================================
    # topic log
    # ======================================================================================
    def append(
        self,
        ref: TopicRef,
        payloads: Sequence[bytes],
        tag: str | None,
        node: str | None,
        producer: tuple[str, int] | None = None,
    ) -> list[int]:
        return self._append_op(ref, ((payloads, tag, node),), producer)

    def lane(self, ref: TopicRef) -> Lane | None:
        """The lean single append for this topic (lane.py), or None where it never applies: a
        topic with caps or TTL, a read-only view, a store with ``max_bytes``, or a journal
        without a per-topic hook for it (``lean(t)``; e.g. a backend that reserves nothing)."""
        return self.append_lane(ref)

    def append_lane(self, ref: TopicRef, fallback: Fallback | None = None) -> Lane | None:
        """``lane``, taking ``append(payload, *, tag=None, node=None)``: what it does not take
        goes to ``fallback(payload, tag, node)`` and its result is returned (without one: None,
        as ``lane``'s). The API makes a topic handle's ``append`` with this. None also for a
        topic of bundles (BND-9 checks every payload)."""
        with self.lock:
            found = self._lean_topic(ref, "lean")
            if found is None:
                return None
            t, one = found
            if fallback is None:
                return make_lane(self, t, one)
            return make_lane(self, t, one, fallback)

    def many_lane(self, ref: TopicRef, fallback: ManyFallback) -> Callable[..., list[int]] | None:
        """The batch lane of this topic (lane.py ``make_many_lane``): ``append_many(payloads,
        *, tag=None, node=None, producer=None)``, handing what it does not take to
        ``fallback(payloads, tag, node, producer)``. None where the single lane would be None,
        or the journal has no batch hook (``lean_many``)."""
        with self.lock:
            found = self._lean_topic(ref, "lean_many")
            if found is None:
                return None
            return make_many_lane(self, found[0], found[1], fallback)

    def _lean_topic(self, ref: TopicRef, hook_name: str) -> tuple[EngineTopic, Any] | None:
        """Under the lock: the topic a lane may serve and the journal's per-topic hook for it
        (``hook_name``; None without a journal), or None: no such topic, one that is not
        lean, of bundles (BND-9 checks every payload), a closed store, or a journal without
        that hook."""
        t = self.topics.get(ref.name)
        if t is None or t.tid != ref.incarnation or not t.lean or self.closed:
            return None
        if t.config.payload == "bundles":
            return None
        if self.journal is None:
            return t, None
        make = getattr(self.journal, hook_name, None)
        hook = make(t) if make is not None else None
        return None if hook is None else (t, hook)

    def append_records(
        self,
        ref: TopicRef,
        records: Sequence[tuple[bytes, str | None, str | None]],
        producer: tuple[str, int] | None = None,
    ) -> list[int]:
        return self._append_op(ref, _runs(records), producer)

    def _append_op(
        self, ref: TopicRef, runs: Sequence[Run], producer: tuple[str, int] | None
    ) -> list[int]:
        def op(t: EngineTopic, now: int) -> list[int]:
            if producer is not None and producer[1] <= t.producers.get(producer[0], 0):
                return []  # TOP-11: already applied
            seqs = self._append_runs(t, runs, now)
            if producer is not None:
                self.apply_produced(t, producer[0], producer[1])
            self._routed(now)  # RTR-8
            return seqs

        return self._run(ref, op)

    def _append(
        self, t: EngineTopic, payloads: Sequence[bytes], tag: str | None, node: str | None, now: int
    ) -> list[int]:
        return self._append_runs(t, ((payloads, tag, node),), now)

    def _append_records(
        self, t: EngineTopic, records: Sequence[tuple[bytes, str | None, str | None]], now: int
    ) -> list[int]:
        return self._append_runs(t, _runs(records), now)

    def _append_runs(self, t: EngineTopic, runs: Sequence[Run], now: int) -> list[int]:
        """One atomic append of runs of records (each run shares its tag and node)."""
        c, log = t.config, t.log
        n = 0
        nbytes = 0
        limit = self.options.max_record_bytes
        sizes: list[int] = []
        lens: list[list[int] | None] = []  # each run's lengths, for its WAL frame (WAL-14)
        for payloads, _, _ in runs:  # RET-7 order: too_large, caps, store_full, topic_full, ...
            n += len(payloads)
            if len(payloads) > 1:  # taken once, for the total and the frame alike
                run_lens = list(map(len, payloads))
                size = sum(run_lens)  # C-level: no Python loop per record
                lens.append(run_lens)
            else:
                size = sum(map(len, payloads))
                lens.append(None)
            if size > limit:  # only then can a single record be too large
                big = max(map(len, payloads))
                if big > limit:
                    raise TooLarge(f"record of {big} bytes exceeds max_record_bytes={limit}")
            sizes.append(size)
            nbytes += size
        if c.cap_records is not None and n > c.cap_records:
            raise TooLarge(f"batch of {n} records exceeds cap_records={c.cap_records}")
        if c.cap_bytes is not None and nbytes > c.cap_bytes:
            raise TooLarge(f"{nbytes} bytes exceed cap_bytes={c.cap_bytes}")
        if self.options.max_bytes is not None:
            total = sum(x.log.nbytes for x in self.topics.values())
            if total + nbytes > self.options.max_bytes:
                raise StoreFull(
                    f"store holds {total} bytes; +{nbytes} exceeds max_bytes="
                    f"{self.options.max_bytes}"
                )
        victims: list[int] = []
        if (c.cap_records is not None and log.count + n > c.cap_records) or (
            c.cap_bytes is not None and log.nbytes + nbytes > c.cap_bytes
        ):
            if c.discard == "reject":
                raise TopicFull(
                    f"topic {t.name!r} is full (cap_records={c.cap_records}, "
                    f"cap_bytes={c.cap_bytes}, discard='reject')"
                )
            victims = log.eviction_plan(n, nbytes)
            if c.retention == "backpressure" and t.progress.subs:
                blocked = t.progress.unresolved(log, victims)
                if blocked is not None:
                    raise Backpressure(
                        f"topic {t.name!r} is full and subscriber {blocked[0]!r} "
                        f"has not resolved seq {blocked[1]}"
                    )
            if c.retention == "backpressure" and t.outs and victims:
                self.routing.backpressure(t, victims)
        ts = now if log.last_ts is None or now > log.last_ts else log.last_ts
        seqs: list[int] = []
        for (payloads, tag, node), size, lengths in zip(runs, sizes, lens):
            got = self.apply_append(t, payloads, tag, node, ts, size, lengths)
            if seqs:
                seqs += got
            else:  # the first run's list is the result as it is (an append_many: no copy)
                seqs = got
        if victims:
            self.apply_evict(t, victims[-1], "cap")
        return seqs

    def read(self, ref: TopicRef, after: int, limit: int, exclude_node: str | None) -> list[Item]:
        return self._run(ref, lambda t, now: t.log.read(after, limit, exclude_node), durable=False)

    def state(self, ref: TopicRef) -> TopicState:
        return self._run(ref, lambda t, now: self._peek_state(t), durable=False)

    def delete(
        self, ref: TopicRef, before_seq: int | None, tag: str | None, tag_glob: str | None
    ) -> int:
        def op(t: EngineTopic, now: int) -> int:
            targets = t.log.delete_targets(before_seq, tag, tag_glob)
            if targets:
                self.apply_remove(t, targets, "deleted")
                self._routed(now)  # RTR-8: room in a dest
            return len(targets)

        return self._run(ref, op)

    # ======================================================================================
    # subscribers
    # ======================================================================================
    def subscribe(self, ref: TopicRef, name: str, start: str) -> None:
        def op(t: EngineTopic, now: int) -> None:
            if name not in t.progress.subs:
                log = t.log
                self.apply_register(
                    t, name, log.earliest - 1 if start == "earliest" else log.visible
                )
                self._settle(t)

        self._run(ref, op)

    def subscribers(self, ref: TopicRef) -> list[str]:
        with self.lock:
            return sorted(self._get(ref).progress.subs)

    def poll(self, ref: TopicRef, name: str, limit: int) -> list[Item]:
        def op(t: EngineTopic, now: int) -> list[Item]:
            s = self._sub(t, name)
            log = t.log
            items: list[Item] = []
            cursor = max(s.cursor, s.hwm)
            head, out = log.visible, s.outcomes
            q = cursor + 1
            if q < log.earliest:  # seqs below earliest are not live: examined and skipped
                q = log.earliest
                cursor = q - 1
            while len(items) < limit:
                if s.gaps and q >= s.gaps[0][0]:  # SUB-4: the gaps in seq order
                    lo, hi = s.gaps.pop(0)
                    items.append(Tombstone(lo, hi))
                    cursor = max(cursor, hi)
                    q = cursor + 1
                    continue
                if q > head:
                    break
                if q not in out and log.is_live(q):
                    items.append(log.record(q))
                cursor = q
                q += 1
            s.cursor = cursor
            return items

        return self._run(ref, op, durable=False)

    def _check_seq(self, t: EngineTopic, seq: int) -> None:
        if seq > t.log.visible:
            raise BadArgument(f"seq {seq} is above head_seq {t.log.visible}")

    def _resolve(self, ref: TopicRef, name: str, seq: int, outcome: str) -> bool:
        def op(t: EngineTopic, now: int) -> bool:
            s = self._sub(t, name)
            self._check_seq(t, seq)
            if t.progress.resolved(t.log, s, seq):
                return False
            s.outcomes[seq] = outcome
            self._settle(t)
            self._routed(now)  # RTR-8: room in a backpressured dest
            return True

        return self._run(ref, op)

    def ack(self, ref: TopicRef, name: str, seq: int) -> bool:
        return self._resolve(ref, name, seq, "acked")

    def reject(self, ref: TopicRef, name: str, seq: int) -> bool:
        return self._resolve(ref, name, seq, "rejected")

    def commit(self, ref: TopicRef, name: str, seq: int) -> int:
        def op(t: EngineTopic, now: int) -> int:
            s = self._sub(t, name)
            self._check_seq(t, seq)
            if seq <= s.hwm:
                return 0
            pending = [q for q in t.log.live_between(s.hwm + 1, seq) if q not in s.outcomes]
            for q in pending:
                s.outcomes[q] = "acked"
            self._settle(t)
            if pending:
                self._routed(now)  # RTR-8
            return len(pending)

        return self._run(ref, op)

    def hwm(self, ref: TopicRef, name: str) -> int:
        return self._run(ref, lambda t, now: self._sub(t, name).hwm, durable=False)

    def flush_subscriber(self, ref: TopicRef, name: str) -> None:
        if self.readonly:
            raise ReadOnly("subscriber progress cannot be written: the store is read-only")

        with self.lock:
            t, _ = self._enter(ref)  # lazy TTL/lease expiry first: it may move the hwm
            # the frames of what entering did (evictions, RTR-8 copies) are placed before the
            # progress is written, so the backend can make them durable first (PRG-8)
            entered = self._end_op(False)
            s = t.progress.subs.get(name)
            if s is not None:
                s.flushed_hwm = s.hwm
                self.persist_progress(t, name, s)
            persisted = self._end_op(False)  # what persisting queued (blockdev: a slot write)
        self._finish(*entered, last=False)
        self._finish(*persisted)
        if s is None:
            raise _no_sub(t, name)  # once what entering did is submitted

    def persist_progress(self, t: EngineTopic, name: str, s: SubState) -> None:
        """Hook: make one subscriber's progress durable (file backend: progress file, after the
        WAL frames placed so far, PRG-8). Called under the lock."""

    def unregister(self, ref: TopicRef, name: str) -> None:
        def op(t: EngineTopic, now: int) -> None:
            self._sub(t, name)
            self.apply_unregister(t, name)
            self._routed(now)  # RTR-8

        self._run(ref, op)

    # ======================================================================================
    # queue mode
    # ======================================================================================
    def _return_job(self, t: EngineTopic, seq: int, now: int) -> None:
        jobs = t.jobs
        if not t.log.is_live(seq):
            jobs.deliveries.pop(seq, None)
            return
        limit = t.config.max_deliveries
        at_limit = limit is not None and jobs.deliveries.get(seq, 0) >= limit
        if at_limit and self._dead_letter(t, seq, now):
            return
        self.apply_returned(t, seq)

    def _dead_letter(self, t: EngineTopic, seq: int, now: int) -> bool:
        """QUE-7: move a job to the dead-letter topic; False (job stays parked) if refused."""
        name = t.config.dead_letter
        assert name is not None
        target = self.topics.get(name)
        if target is None:
            target = self._create(name, TopicConfig(durability=t.config.durability))
        rec = t.log.record(seq)
        try:
            self._tick(target, now)
            self._append(target, (rec.payload,), rec.tag, rec.node, now)
        except (TopicFull, Backpressure, StoreFull, TooLarge):
            return False
        t.jobs.free.discard(seq)
        t.jobs.deliveries.pop(seq, None)
        self.apply_remove(t, [seq], "deleted")
        return True

    def claim(self, ref: TopicRef, node: str, limit: int, lease_ms: int | None) -> list[Lease]:
        def op(t: EngineTopic, now: int) -> list[Lease]:
            log, jobs = t.log, t.jobs
            deadline = now + (lease_ms if lease_ms is not None else t.config.lease_ms)
            max_deliveries = t.config.max_deliveries
            out: list[Lease] = []
            self._bump(t)

            def hand_out(seq: int, fresh: bool) -> None:
                lease_id, deliveries = jobs.grant(seq, node, deadline)
                self.apply_delivered(t, seq, lease_id, deliveries, fresh)
                out.append(Lease(seq, lease_id, deadline, deliveries, log.record(seq)))

            for seq in sorted(jobs.free):  # QUE-1: reclaimed jobs first, lowest seq first
                if len(out) == limit:
                    break
                if not log.is_live(seq):
                    jobs.free.discard(seq)
                    jobs.deliveries.pop(seq, None)
                elif max_deliveries is not None and jobs.deliveries.get(seq, 0) >= max_deliveries:
                    self._dead_letter(t, seq, now)  # stays parked if refused; never handed out
                else:
                    hand_out(seq, fresh=False)
            while len(out) < limit and jobs.claim_cursor < log.visible:
                nxt = max(jobs.claim_cursor + 1, log.earliest)
                if nxt > log.visible:
                    jobs.claim_cursor = log.visible
                    break
                jobs.claim_cursor = nxt
                if log.is_live(nxt):
                    hand_out(nxt, fresh=True)
            self._routed(now)  # RTR-8: dead letters, room
            return out

        return self._run(ref, op)

    def _end_lease(self, t: EngineTopic, seq: int, lease_id: int) -> None:
        if not t.jobs.end_lease(seq, lease_id):
            raise LeaseLost(
                f"no valid lease {lease_id} on seq {seq} of topic {t.name!r} "
                "(expired, already finished, or never granted)"
            )

    def complete(self, ref: TopicRef, seq: int, lease_id: int) -> None:
        def op(t: EngineTopic, now: int) -> None:
            self._end_lease(t, seq, lease_id)
            t.jobs.deliveries.pop(seq, None)
            if t.log.is_live(seq):
                self.apply_remove(t, [seq], "deleted")
            self._routed(now)  # RTR-8

        self._run(ref, op)

    def release(self, ref: TopicRef, seq: int, lease_id: int) -> None:
        def op(t: EngineTopic, now: int) -> None:
            self._end_lease(t, seq, lease_id)
            self._return_job(t, seq, now)
            self._bump(t)
            self._routed(now)  # RTR-8: a dead letter

        self._run(ref, op)

    def nack(self, ref: TopicRef, seq: int, lease_id: int, delay_ms: int) -> None:
        def op(t: EngineTopic, now: int) -> None:
            self._end_lease(t, seq, lease_id)
            if delay_ms == 0:
                self._return_job(t, seq, now)
            else:
                self.apply_delayed(t, seq, now + delay_ms)
            self._bump(t)
            self._routed(now)  # RTR-8: a dead letter

        self._run(ref, op)


def _no_sub(t: EngineTopic, name: str) -> NoSuchSubscriber:
    return NoSuchSubscriber(f"subscriber {name!r} of topic {t.name!r} does not exist")


def _runs(records: Sequence[tuple[bytes, str | None, str | None]]) -> list[Run]:
    """Consecutive records with the same labels form one run (one apply_append each)."""
    return [
        ([r[0] for r in group], tag, node)
        for (tag, node), group in groupby(records, key=lambda r: (r[1], r[2]))
    ]
