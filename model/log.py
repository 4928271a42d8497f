"""The executable model of spec/SPEC.md sections 1-7 and 16: topics, tombstones, deletes,
retention, durable subscribers, queue mode, restart and crash, routers.

It is the test oracle: written for clarity, not speed (dicts and linear scans, no indexes), with no
I/O. Time comes only from the injected clock. It implements the same ``tidelog.backend.Backend``
interface as the real backends, so the stateful suite drives both with identical calls, and it is
reachable as ``model://NAME`` for conformance harnesses.

Invariant checks are methods named by spec id (``TOP_2``...); ``check_invariants`` runs them all.
"""

from __future__ import annotations

import copy
import threading
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from fnmatch import fnmatchcase

from tidelog.backend import Backend, Capabilities, StoreOptions, TopicRef
from tidelog.clock import Clock
from tidelog.config import TopicConfig
from tidelog.errors import (
    Backpressure,
    BadArgument,
    BadOption,
    Closed,
    LeaseLost,
    NoSuchSubscriber,
    NoSuchTopic,
    StoreFull,
    TooLarge,
    TopicFull,
)
from tidelog.names import check_topic_name
from tidelog.records import Item, Lease, Record, Tombstone, TopicState

from .router import RouterConfig, RouterInfo, check_new, passes
from .rules import (
    advance_hwm,
    clamp_ts,
    eviction_count,
    floors_ok,
    held_trim_bounds,
    insert_gap,
    read_tombstone,
    trim_bounds,
)

__all__ = ["ModelStore", "TopicModel", "SubModel", "QueueModel"]

VOLUNTARY = ("deleted", "trimmed")
INVOLUNTARY = ("evicted", "lost")


@dataclass
class SubModel:
    """One durable subscriber (spec SUB)."""

    base: int
    hwm: int
    cursor: int
    outcomes: dict[int, str] = field(default_factory=dict)
    gaps: list[tuple[int, int]] = field(default_factory=list)  # SUB-7: disjoint, ascending
    flushed_hwm: int = 0  # hwm at the last flush/clean close: the DUR-9 lower bound


@dataclass
class QueueModel:
    """Queue-mode state of a topic (spec QUE)."""

    claim_cursor: int = 0
    # seq -> (lease_id, node, deadline_ms)
    leases: dict[int, tuple[int, str, int]] = field(default_factory=dict)
    deliveries: dict[int, int] = field(default_factory=dict)
    freelist: set[int] = field(default_factory=set)
    delayed: dict[int, int] = field(default_factory=dict)  # seq -> ready_at_ms
    next_lease_id: int = 1


@dataclass
class TopicModel:
    name: str
    config: TopicConfig
    incarnation: int
    head: int = 0
    records: dict[int, Record] = field(default_factory=dict)  # live records only
    fate: dict[int, str] = field(default_factory=dict)  # non-live seqs -> fate
    evict_floor: int = 1
    losses: list[tuple[int, int]] = field(default_factory=list)  # crash-loss ranges above floor
    last_ts: int | None = None
    subs: dict[str, SubModel] = field(default_factory=dict)
    queue: QueueModel = field(default_factory=QueueModel)
    producers: dict[str, int] = field(default_factory=dict)  # TOP-11: id -> last sequence
    cursors: dict[str, int] = field(default_factory=dict)  # RTR-10: routers into this topic
    # crash model: states after each acknowledged op, and how many of them are surely durable
    history: list[TopicModel] = field(default_factory=list, repr=False)
    durable_len: int = 0

    # -- derived state ---------------------------------------------------------------------
    @property
    def earliest(self) -> int:
        return min(self.records) if self.records else self.head + 1

    @property
    def count(self) -> int:
        return len(self.records)

    @property
    def nbytes(self) -> int:
        return sum(len(r.payload) for r in self.records.values())

    def state(self) -> TopicState:
        return TopicState(self.head, self.earliest, self.evict_floor, self.count, self.nbytes)

    def live_sorted(self) -> list[int]:
        return sorted(self.records)

    def add_gap(self, s: SubModel, lo: int, hi: int) -> None:
        """SUB-7: the range ``lo..hi`` enters the subscriber's gaps."""
        s.gaps = insert_gap(s.gaps, lo, hi, lambda a, b: any(a < q < b for q in self.records))

    def resolved(self, s: SubModel, q: int) -> bool:
        """A seq is resolved for a subscriber iff at/below its hwm, has an outcome, or is not
        live (voluntary removal, or involuntary which always records an outcome first)."""
        return q <= s.hwm or q in s.outcomes or q not in self.records

    # -- invariants (spec ids) -------------------------------------------------------------
    def TOP_1(self) -> None:
        every = set(self.records) | set(self.fate)
        assert every == set(range(1, self.head + 1)), "TOP-1: seqs 1..head each have one fate"
        assert not set(self.records) & set(self.fate), "TOP-1: a seq is live or has a fate"

    def TOP_2(self) -> None:
        assert floors_ok(self.evict_floor, self.earliest, self.head), (
            f"TOP-2: floors {self.evict_floor}, {self.earliest}, head {self.head}"
        )

    def TMB_1(self) -> None:
        below = [q for q in self.records if q < self.evict_floor]
        assert not below, f"TMB-1: live records below evict_floor: {below}"

    def TOP_5(self) -> None:
        ts = [self.records[q].ts for q in self.live_sorted()]
        assert ts == sorted(ts), "TOP-5: ts non-decreasing along seq"

    def TMB_2(self) -> None:
        for lo, hi in self.losses:
            assert self.evict_floor <= lo <= hi <= self.head, f"TMB-2: loss range {lo}..{hi}"
            assert all(q not in self.records for q in range(lo, hi + 1)), "TMB-2: live in loss"

    def RET_1(self) -> None:
        c = self.config
        assert c.cap_records is None or self.count <= c.cap_records, "RET-1: cap_records"
        assert c.cap_bytes is None or self.nbytes <= c.cap_bytes, "RET-1: cap_bytes"

    def SUB_2(self) -> None:
        for name, s in self.subs.items():
            assert s.base <= s.hwm <= self.head, f"SUB-2: {name} hwm {s.hwm} head {self.head}"
            assert advance_hwm(s.hwm, self.head, self._resolved_set(s)) == s.hwm, (
                f"SUB-2: {name} hwm {s.hwm} could advance"
            )
            assert all(q > s.hwm for q in s.outcomes), f"SUB-2: {name} stale outcomes"

    def SUB_7(self) -> None:
        for name, s in self.subs.items():
            g = s.gaps
            assert all(1 <= lo <= hi <= self.head for lo, hi in g), f"SUB-7: {name} gaps {g}"
            assert all(g[i][1] < g[i + 1][0] for i in range(len(g) - 1)), (
                f"SUB-7: {name} gaps {g} not disjoint and ascending"
            )
            assert not [q for q in self.records if any(lo <= q <= hi for lo, hi in g)], (
                f"SUB-7: {name} gaps {g} cover a live record"
            )

    def SUB_5(self, holds: Sequence[int] = ()) -> None:
        """SUB-5, with RTR-7's holds: the cursors of the routers out of this topic."""
        if self.config.trim != "acked" or not self.subs:
            return
        bounds = held_trim_bounds(
            trim_bounds([s.base for s in self.subs.values()], [s.hwm for s in self.subs.values()]),
            holds,
        )
        if bounds is not None:
            lo, hi = bounds
            assert not [q for q in self.records if lo < q <= hi], "SUB-5: untrimmed acked records"

    def QUE_2(self) -> None:
        q = self.queue
        assert not set(q.leases) & q.freelist, "QUE-2: a leased job is also in the freelist"
        assert not set(q.leases) & set(q.delayed), "QUE-2: a leased job is also delayed"
        ids = [lease[0] for lease in q.leases.values()]
        assert len(ids) == len(set(ids)), "QUE-2: duplicate lease ids"
        assert all(i < q.next_lease_id for i in ids), "QUE-1: lease id from the future"

    def check_invariants(self, holds: Sequence[int] = ()) -> None:
        for check in (
            self.TOP_1,
            self.TOP_2,
            self.TMB_1,
            self.TOP_5,
            self.TMB_2,
            self.RET_1,
            self.SUB_2,
            self.SUB_7,
            self.QUE_2,
        ):
            check()
        self.SUB_5(holds)

    def _resolved_set(self, s: SubModel) -> set[int]:
        return {q for q in range(s.hwm + 1, self.head + 1) if self.resolved(s, q)}

    def durable_copy(self) -> TopicModel:
        """A deep copy without the crash-model bookkeeping."""
        history, self.history = self.history, []
        try:
            return copy.deepcopy(self)
        finally:
            self.history = history


class ModelStore(Backend):
    """The reference model as a Backend. Named stores survive close/reopen in the process."""

    capabilities = Capabilities(persistent=False, crash_safe=False, routers=True)

    def __init__(self, clock: Clock, options: StoreOptions, name: str | None = None) -> None:
        self.clock = clock
        self.options = options
        self.name = name
        self.topics: dict[str, TopicModel] = {}
        self.routers: dict[str, RouterConfig] = {}  # RTR-1; cursors live in dest (RTR-10)
        self.incarnations = 0
        self.closed = False
        self.lock = threading.RLock()  # the model is simple, not concurrent: one op at a time

    # ======================================================================================
    # helpers
    # ======================================================================================
    def _topic(self, ref: TopicRef) -> TopicModel:
        if self.closed:
            raise Closed("store is closed")
        t = self.topics.get(ref.name)
        if t is None or t.incarnation != ref.incarnation:
            raise NoSuchTopic(f"topic {ref.name!r} does not exist (dropped?)")
        return t

    def _sub(self, t: TopicModel, name: str) -> SubModel:
        s = t.subs.get(name)
        if s is None:
            raise NoSuchSubscriber(f"subscriber {name!r} of topic {t.name!r} does not exist")
        return s

    def _now(self) -> int:
        return self.clock.now_ms()

    def _enter(self, ref: TopicRef) -> tuple[TopicModel, int]:
        """Start a topic op: resolve the handle, read the clock once, apply time effects."""
        t = self._topic(ref)
        now = self._now()
        if self._tick(t, now):
            self._pump(now)  # RTR-8: what the time effects made forwardable
        return t, now

    def _record_history(self, t: TopicModel) -> None:
        """Crash model: remember the state after an acknowledged op (DUR-2..DUR-6)."""
        t.history.append(t.durable_copy())
        if t.config.durability == "fsync":
            t.durable_len = len(t.history)

    # -- lazy time effects (RET-4, QUE-5) --------------------------------------------------
    def _tick(self, t: TopicModel, now: int) -> bool:
        """Apply the lazy time effects due at ``now``; True if any was."""
        changed = False
        ttl = t.config.ttl_ms
        if ttl is not None:
            expired = [q for q in t.live_sorted() if t.records[q].ts + ttl <= now]
            if expired:
                self._remove_involuntary(t, expired, "evicted")
                changed = True
        q = t.queue
        for seq in sorted(s for s, (_, _, deadline) in q.leases.items() if deadline <= now):
            del q.leases[seq]
            self._return_job(t, seq, now)
            changed = True
        for seq in sorted(s for s, ready in q.delayed.items() if ready <= now):
            del q.delayed[seq]
            self._return_job(t, seq, now)
            changed = True
        if changed:
            self._record_history(t)
        return changed

    # -- removal ---------------------------------------------------------------------------
    def _remove_involuntary(self, t: TopicModel, seqs: list[int], fate: str) -> None:
        """Evict/lose the oldest live records ``seqs`` (TMB-1, SUB-7)."""
        ranges: list[tuple[SubModel, int, int]] = []
        for s in t.subs.values():
            pending = [q for q in seqs if not t.resolved(s, q)]
            for q in pending:
                s.outcomes[q] = "dropped"
            if pending:
                ranges.append((s, min(pending), max(pending)))
        for q in seqs:
            del t.records[q]
            t.fate[q] = fate
        for s, lo, hi in ranges:  # SUB-7: once the event is done
            t.add_gap(s, lo, hi)
        t.evict_floor = max(t.evict_floor, max(seqs) + 1)
        t.losses = [(max(lo, t.evict_floor), hi) for lo, hi in t.losses if hi >= t.evict_floor]
        self._settle(t)

    def _remove_voluntary(self, t: TopicModel, seqs: list[int], fate: str) -> None:
        for q in seqs:
            del t.records[q]
            t.fate[q] = fate
        self._settle(t)

    def _settle(self, t: TopicModel) -> None:
        """Advance every hwm (SUB-2), then ack-trim (SUB-5)."""
        for s in t.subs.values():
            s.hwm = advance_hwm(s.hwm, t.head, t._resolved_set(s))
            s.outcomes = {q: o for q, o in s.outcomes.items() if q > s.hwm}
        if t.config.trim == "acked" and t.subs:
            bounds = held_trim_bounds(
                trim_bounds([s.base for s in t.subs.values()], [s.hwm for s in t.subs.values()]),
                self._holds(t),
            )
            if bounds is not None:
                lo, hi = bounds
                doomed = [q for q in t.live_sorted() if lo < q <= hi]
                for q in doomed:
                    del t.records[q]
                    t.fate[q] = "trimmed"

    # ======================================================================================
    # store
    # ======================================================================================
    def open_topic(self, name: str, options: Mapping[str, object], create: bool) -> TopicRef:
        with self.lock:
            if self.closed:
                raise Closed("store is closed")
            t = self.topics.get(name)
            if t is not None:
                t.config.check_matches(name, options)
                return TopicRef(name, t.incarnation)
            if not create:
                raise NoSuchTopic(f"topic {name!r} does not exist")
            config = TopicConfig.from_options(name, options)
            t = self._create(name, config)
            return TopicRef(name, t.incarnation)

    def _create(self, name: str, config: TopicConfig) -> TopicModel:
        if config.durability not in self.capabilities.durability:
            raise BadOption(f"durability {config.durability!r} is not offered by this backend")
        self.incarnations += 1
        t = TopicModel(name=name, config=config, incarnation=self.incarnations)
        self.topics[name] = t
        self._record_history(t)
        return t

    def topic_config(self, ref: TopicRef) -> TopicConfig:
        with self.lock:
            return self._topic(ref).config

    def list_topics(self) -> list[str]:
        with self.lock:
            if self.closed:
                raise Closed("store is closed")
            return sorted(self.topics)

    def drop_topic(self, name: str) -> None:
        with self.lock:
            if self.closed:
                raise Closed("store is closed")
            if name not in self.topics:
                raise NoSuchTopic(f"topic {name!r} does not exist")
            for r_name, r in sorted(self.routers.items()):  # RTR-12
                if name in (r.source, r.dest):
                    self._drop_router(r_name)
            del self.topics[name]

    def flush(self) -> None:
        with self.lock:
            if self.closed:
                raise Closed("store is closed")
            for t in self.topics.values():
                t.durable_len = len(t.history)
                for s in t.subs.values():
                    s.flushed_hwm = s.hwm

    def close(self) -> None:
        with self.lock:
            if not self.closed:
                self.flush()
                self.closed = True

    def describe(self) -> dict[str, object]:
        with self.lock:
            return {
                "backend": "model",
                "name": self.name,
                "topics": {
                    name: {
                        "state": t.state().to_dict(),
                        "config": t.config.to_dict(),
                        "subscribers": {
                            n: {"hwm": s.hwm, "base": s.base} for n, s in sorted(t.subs.items())
                        },
                        "leases": len(t.queue.leases),
                    }
                    for name, t in sorted(self.topics.items())
                },
            }

    # -- restart (DUR-1, SUB-9, QUE-8) -----------------------------------------------------
    def restart(self, clock: Clock) -> None:
        """Apply the clean-restart rules to this (closed) store and reopen it."""
        with self.lock:
            self.clock = clock
            self.closed = False
            now = self._now()
            for name in sorted(self.topics):
                t = self.topics.get(name)
                if t is not None:
                    self._restart_topic(t, now)
            self._resume_routers(now)

    def _restart_topic(self, t: TopicModel, now: int) -> None:
        if t.config.durability == "ephemeral" and t.records:
            self._remove_involuntary(t, t.live_sorted(), "lost")
        for s in t.subs.values():
            s.cursor = s.hwm
        for seq in sorted(t.queue.leases):
            del t.queue.leases[seq]
            self._return_job(t, seq, now)

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
        return self.append_records(ref, [(p, tag, node) for p in payloads], producer)

    def append_records(
        self,
        ref: TopicRef,
        records: Sequence[tuple[bytes, str | None, str | None]],
        producer: tuple[str, int] | None = None,
    ) -> list[int]:
        with self.lock:
            t, now = self._enter(ref)
            if producer is not None and producer[1] <= t.producers.get(producer[0], 0):
                return []  # TOP-11: already applied
            seqs = self._append_records(t, records, now)
            if producer is not None:
                t.producers[producer[0]] = producer[1]
                t.history[-1] = t.durable_copy()  # the mark is part of the same op
            self._pump(now)  # RTR-8
            return seqs

    def _append(
        self, t: TopicModel, payloads: Sequence[bytes], tag: str | None, node: str | None, now: int
    ) -> list[int]:
        return self._append_records(t, [(p, tag, node) for p in payloads], now)

    def _append_records(
        self, t: TopicModel, records: Sequence[tuple[bytes, str | None, str | None]], now: int
    ) -> list[int]:
        c = t.config
        payloads = [r[0] for r in records]
        n, nbytes = len(payloads), sum(len(p) for p in payloads)
        # RET-7 order: too_large, too_large (caps), store_full, topic_full, backpressure
        for p in payloads:
            if len(p) > self.options.max_record_bytes:
                raise TooLarge(
                    f"record of {len(p)} bytes exceeds max_record_bytes="
                    f"{self.options.max_record_bytes}"
                )
        if c.cap_records is not None and n > c.cap_records:
            raise TooLarge(f"batch of {n} records exceeds cap_records={c.cap_records}")
        if c.cap_bytes is not None and nbytes > c.cap_bytes:
            raise TooLarge(f"{nbytes} bytes exceed cap_bytes={c.cap_bytes}")
        if self.options.max_bytes is not None:
            total = sum(x.nbytes for x in self.topics.values())
            if total + nbytes > self.options.max_bytes:
                raise StoreFull(
                    f"store holds {total} bytes; +{nbytes} exceeds max_bytes="
                    f"{self.options.max_bytes}"
                )
        live = t.live_sorted()
        sizes = [len(t.records[q].payload) for q in live]
        over = (c.cap_records is not None and len(live) + n > c.cap_records) or (
            c.cap_bytes is not None and sum(sizes) + nbytes > c.cap_bytes
        )
        victims: list[int] = []
        if over:
            if c.discard == "reject":
                raise TopicFull(
                    f"topic {t.name!r} is full (cap_records={c.cap_records}, "
                    f"cap_bytes={c.cap_bytes}, discard='reject')"
                )
            victims = live[: eviction_count(sizes, n, nbytes, c.cap_records, c.cap_bytes)]
            if c.retention == "backpressure":
                for s_name, s in sorted(t.subs.items()):
                    if any(not t.resolved(s, q) for q in victims):
                        raise Backpressure(
                            f"topic {t.name!r} is full and subscriber {s_name!r} has not "
                            f"resolved seq {min(q for q in victims if not t.resolved(s, q))}"
                        )
                for r_name, cursor in self._router_cursors(t):  # RTR-7
                    if victims[-1] > cursor:
                        raise Backpressure(
                            f"topic {t.name!r} is full and router {r_name!r} has not "
                            f"forwarded seq {max(cursor + 1, victims[0])}"
                        )
        ts = clamp_ts(now, t.last_ts)
        seqs = list(range(t.head + 1, t.head + n + 1))
        for q, (p, tag, node) in zip(seqs, records):
            t.records[q] = Record(q, ts, tag, node, bytes(p))
        t.head += n
        t.last_ts = ts
        if victims:
            self._remove_involuntary(t, victims, "evicted")
        self._record_history(t)
        return seqs

    def read(self, ref: TopicRef, after: int, limit: int, exclude_node: str | None) -> list[Item]:
        with self.lock:
            t, _ = self._enter(ref)
            items: list[Item] = []
            for item in self._items(t, after):
                if len(items) >= limit:
                    break
                if isinstance(item, Tombstone) or exclude_node is None or item.node != exclude_node:
                    items.append(item)
            return items

    @staticmethod
    def _items(t: TopicModel, after: int, upto: int | None = None) -> Iterator[Item]:
        """What a reader of ``t`` gets after seq ``after`` (through ``upto``, default the head),
        in seq order (TMB-1, TMB-2; DEL: voluntarily removed seqs are skipped silently).
        Routers forward exactly this (RTR-4)."""
        end = t.head if upto is None else upto
        q = after + 1
        tomb = read_tombstone(after, t.evict_floor)
        if tomb is not None:
            yield Tombstone(tomb[0], min(tomb[1], end))
            q = tomb[1] + 1
        while q <= end:
            loss = next(((lo, hi) for lo, hi in t.losses if lo <= q <= hi), None)
            if loss is not None:
                yield Tombstone(q, min(loss[1], end))
                q = loss[1] + 1
                continue
            rec = t.records.get(q)
            if rec is not None:
                yield rec
            q += 1

    def state(self, ref: TopicRef) -> TopicState:
        with self.lock:
            t, _ = self._enter(ref)
            return t.state()

    def delete(
        self, ref: TopicRef, before_seq: int | None, tag: str | None, tag_glob: str | None
    ) -> int:
        with self.lock:
            t, now = self._enter(ref)
            limit = t.head + 1 if before_seq is None else min(before_seq, t.head + 1)
            doomed = []
            for q in t.live_sorted():
                r = t.records[q]
                if q >= limit:
                    continue
                if tag is not None and r.tag != tag:
                    continue
                if tag_glob is not None and (r.tag is None or not fnmatchcase(r.tag, tag_glob)):
                    continue
                doomed.append(q)
            if doomed:
                self._remove_voluntary(t, doomed, "deleted")
                self._record_history(t)
                self._pump(now)  # RTR-8: room in a dest
            return len(doomed)

    # ======================================================================================
    # subscribers
    # ======================================================================================
    def subscribe(self, ref: TopicRef, name: str, start: str) -> None:
        with self.lock:
            t, _ = self._enter(ref)
            if name in t.subs:
                return
            hwm = t.earliest - 1 if start == "earliest" else t.head
            t.subs[name] = SubModel(base=hwm, hwm=hwm, cursor=hwm)
            self._settle(t)
            self._record_history(t)

    def subscribers(self, ref: TopicRef) -> list[str]:
        with self.lock:
            t = self._topic(ref)
            return sorted(t.subs)

    def poll(self, ref: TopicRef, name: str, limit: int) -> list[Item]:
        with self.lock:
            t, _ = self._enter(ref)
            s = self._sub(t, name)
            items: list[Item] = []
            s.cursor = max(s.cursor, s.hwm)
            q = s.cursor + 1
            while len(items) < limit:
                if s.gaps and q >= s.gaps[0][0]:  # SUB-4: the gaps in seq order
                    lo, hi = s.gaps.pop(0)
                    items.append(Tombstone(lo, hi))
                    s.cursor = max(s.cursor, hi)
                    q = s.cursor + 1
                    continue
                if q > t.head:
                    break
                if not t.resolved(s, q):
                    items.append(t.records[q])
                s.cursor = q
                q += 1
            return items

    def _resolve(self, ref: TopicRef, name: str, seq: int, outcome: str) -> bool:
        with self.lock:
            t, now = self._enter(ref)
            s = self._sub(t, name)
            if seq > t.head:
                raise BadArgument(f"seq {seq} is above head_seq {t.head}")
            if t.resolved(s, seq):
                return False
            s.outcomes[seq] = outcome
            self._settle(t)
            self._record_history(t)
            self._pump(now)  # RTR-8: room in a backpressured dest
            return True

    def ack(self, ref: TopicRef, name: str, seq: int) -> bool:
        return self._resolve(ref, name, seq, "acked")

    def reject(self, ref: TopicRef, name: str, seq: int) -> bool:
        return self._resolve(ref, name, seq, "rejected")

    def commit(self, ref: TopicRef, name: str, seq: int) -> int:
        with self.lock:
            t, now = self._enter(ref)
            s = self._sub(t, name)
            if seq > t.head:
                raise BadArgument(f"seq {seq} is above head_seq {t.head}")
            pending = [q for q in range(s.hwm + 1, seq + 1) if not t.resolved(s, q)]
            for q in pending:
                s.outcomes[q] = "acked"
            if pending:
                self._settle(t)
                self._record_history(t)
                self._pump(now)  # RTR-8
            return len(pending)

    def hwm(self, ref: TopicRef, name: str) -> int:
        with self.lock:
            t, _ = self._enter(ref)
            return self._sub(t, name).hwm

    def flush_subscriber(self, ref: TopicRef, name: str) -> None:
        with self.lock:
            t, _ = self._enter(ref)
            s = self._sub(t, name)
            s.flushed_hwm = s.hwm

    def unregister(self, ref: TopicRef, name: str) -> None:
        with self.lock:
            t, now = self._enter(ref)
            self._sub(t, name)
            del t.subs[name]
            self._settle(t)
            self._record_history(t)
            self._pump(now)  # RTR-8

    # ======================================================================================
    # queue mode
    # ======================================================================================
    def _return_job(self, t: TopicModel, seq: int, now: int) -> None:
        """A job comes back from a lease or a delay (QUE-4, QUE-5, QUE-7)."""
        q = t.queue
        if seq not in t.records:
            q.deliveries.pop(seq, None)
            return
        limit = t.config.max_deliveries
        at_limit = limit is not None and q.deliveries.get(seq, 0) >= limit
        if at_limit and self._dead_letter(t, seq, now):
            return
        q.freelist.add(seq)

    def _dead_letter(self, t: TopicModel, seq: int, now: int) -> bool:
        """QUE-7: move a job to the dead-letter topic; False if that append was refused."""
        target_name = t.config.dead_letter
        assert target_name is not None
        target = self.topics.get(target_name)
        if target is None:
            target = self._create(target_name, TopicConfig(durability=t.config.durability))
        rec = t.records[seq]
        try:
            self._tick(target, now)
            self._append(target, [rec.payload], rec.tag, rec.node, now)
        except (TopicFull, Backpressure, StoreFull, TooLarge):
            return False
        t.queue.freelist.discard(seq)
        t.queue.deliveries.pop(seq, None)
        self._remove_voluntary(t, [seq], "deleted")
        return True

    def claim(self, ref: TopicRef, node: str, limit: int, lease_ms: int | None) -> list[Lease]:
        with self.lock:
            t, now = self._enter(ref)
            q = t.queue
            duration = lease_ms if lease_ms is not None else t.config.lease_ms
            max_deliveries = t.config.max_deliveries
            out: list[Lease] = []

            def hand_out(seq: int) -> None:
                q.deliveries[seq] = q.deliveries.get(seq, 0) + 1
                lease = Lease(
                    seq, q.next_lease_id, now + duration, q.deliveries[seq], t.records[seq]
                )
                q.leases[seq] = (lease.lease_id, node, lease.deadline_ms)
                q.next_lease_id += 1
                out.append(lease)

            for seq in sorted(q.freelist):
                if len(out) == limit:
                    break
                if seq not in t.records:
                    q.freelist.discard(seq)
                    q.deliveries.pop(seq, None)
                elif max_deliveries is not None and q.deliveries.get(seq, 0) >= max_deliveries:
                    self._dead_letter(t, seq, now)  # parked on refusal: never handed out
                else:
                    q.freelist.discard(seq)
                    hand_out(seq)
            while len(out) < limit and q.claim_cursor < t.head:
                q.claim_cursor += 1
                if q.claim_cursor in t.records:
                    hand_out(q.claim_cursor)
            self._record_history(t)
            self._pump(now)  # RTR-8: dead letters, room
            return out

    def _lease(self, t: TopicModel, seq: int, lease_id: int) -> None:
        held = t.queue.leases.get(seq)
        if held is None or held[0] != lease_id:
            raise LeaseLost(
                f"no valid lease {lease_id} on seq {seq} of topic {t.name!r} "
                "(expired, already finished, or never granted)"
            )
        del t.queue.leases[seq]

    def complete(self, ref: TopicRef, seq: int, lease_id: int) -> None:
        with self.lock:
            t, now = self._enter(ref)
            self._lease(t, seq, lease_id)
            t.queue.deliveries.pop(seq, None)
            if seq in t.records:
                self._remove_voluntary(t, [seq], "deleted")
            self._record_history(t)
            self._pump(now)  # RTR-8

    def release(self, ref: TopicRef, seq: int, lease_id: int) -> None:
        with self.lock:
            t, now = self._enter(ref)
            self._lease(t, seq, lease_id)
            self._return_job(t, seq, now)
            self._record_history(t)
            self._pump(now)  # RTR-8: a dead letter

    def nack(self, ref: TopicRef, seq: int, lease_id: int, delay_ms: int) -> None:
        with self.lock:
            t, now = self._enter(ref)
            self._lease(t, seq, lease_id)
            if delay_ms == 0:
                self._return_job(t, seq, now)
            else:
                t.queue.delayed[seq] = now + delay_ms
            self._record_history(t)
            self._pump(now)  # RTR-8: a dead letter

    # ======================================================================================
    # routers (RTR)
    # ======================================================================================
    def _router_cursors(self, t: TopicModel) -> list[tuple[str, int]]:
        """(name, cursor) of every router out of ``t`` whose dest this store holds."""
        out = []
        for name, r in sorted(self.routers.items()):
            dest = self.topics.get(r.dest)
            if r.source == t.name and dest is not None and name in dest.cursors:
                out.append((name, dest.cursors[name]))
        return out

    def _holds(self, t: TopicModel) -> list[int]:
        """RTR-7: the cursors that hold ``t``'s records from ack-trimming."""
        return [cursor for _, cursor in self._router_cursors(t)]

    def _info(self, name: str) -> RouterInfo:
        r = self.routers[name]
        cursor = self.topics[r.dest].cursors[name]
        return RouterInfo(name, r, cursor, self.topics[r.source].head - cursor)

    def router(self, name: str, config: RouterConfig) -> RouterInfo:
        """RTR-1, RTR-2, RTR-3, RTR-9: create the router ``name`` or open the existing one."""
        with self.lock:
            if self.closed:
                raise Closed("store is closed")
            check_topic_name(name, "router name")
            if not check_new(
                name, config, self.routers.get(name), self.topics, self.routers.values()
            ):
                return self._info(name)
            source, dest = config.source, config.dest
            now = self._now()
            src, dst = self.topics[source], self.topics[dest]
            self._tick(src, now)
            self._tick(dst, now)
            self.routers[name] = config
            dst.cursors[name] = src.head
            self._record_history(dst)
            return self._info(name)

    def list_routers(self) -> list[RouterInfo]:
        """RTR-1: every router, in name order (``Store.routers()``)."""
        with self.lock:
            if self.closed:
                raise Closed("store is closed")
            return [self._info(name) for name in sorted(self.routers)]

    def drop_router(self, name: str) -> bool:
        """RTR-12: drop the router and its cursor; its copies stay in dest."""
        with self.lock:
            if self.closed:
                raise Closed("store is closed")
            if name not in self.routers:
                return False
            self._drop_router(name)
            return True

    def _drop_router(self, name: str) -> None:
        r = self.routers.pop(name)
        dest = self.topics.get(r.dest)
        if dest is not None and dest.cursors.pop(name, None) is not None:
            self._record_history(dest)
        src = self.topics.get(r.source)  # RTR-7, SUB-5: its hold is gone
        if src is not None and src.config.trim == "acked" and src.subs:
            live = len(src.records)
            self._settle(src)
            if len(src.records) != live:
                self._record_history(src)

    def _pump(self, now: int) -> None:
        """RTR-8: passes over the routers in name order until none advances, at most as many
        passes as there are routers (a cycle that feeds itself goes on at the next op)."""
        for _ in range(len(self.routers)):
            advanced = False
            for name in sorted(self.routers):
                advanced = self._forward(name, now) or advanced
            if not advanced:
                return

    def _forward(self, name: str, now: int) -> bool:
        """RTR-4..RTR-6: deal with the source seqs above the cursor (up to the source's head
        when the call starts); True if the cursor advanced."""
        r = self.routers[name]
        src, dst = self.topics[r.source], self.topics[r.dest]
        self._tick(src, now)
        self._tick(dst, now)
        start = cur = dst.cursors[name]
        end = src.head
        skipped = False  # cursor moved over skips not yet in dest's history
        for item in self._items(src, cur, end):
            if isinstance(item, Tombstone):
                hi = item.gap_to
                self._router_gap(dst, hi - item.gap_from + 1)  # RTR-5: the seqs it covers
                cur = dst.cursors[name] = hi
                dst.history[-1] = dst.durable_copy()
                skipped = False
                continue
            q = item.seq
            if q - 1 > cur:  # voluntarily removed seqs below q: silent (DEL)
                cur = dst.cursors[name] = q - 1
                skipped = True
            if not passes(item.tag, item.node, r.filter_tag, r.exclude_node):
                cur = dst.cursors[name] = q  # filtered: silent
                skipped = True
                continue
            copy_ = (
                item.payload,
                item.tag if r.preserve_tag else None,
                item.node if r.preserve_node else None,
            )
            try:
                self._append_records(dst, [copy_], now)
            except TooLarge:
                self._router_gap(dst, 1)  # RTR-6: dest can never hold it
            except (TopicFull, Backpressure, StoreFull):
                break  # RTR-6: retried when forwarding next runs
            cur = dst.cursors[name] = q
            dst.history[-1] = dst.durable_copy()  # RTR-10: copy and cursor, one op of dest
            skipped = False
        else:
            if cur < end:  # voluntarily removed seqs up to the head: silent (DEL)
                cur = dst.cursors[name] = end
                skipped = True
        if skipped:
            self._record_history(dst)
        if cur > start and src.config.trim == "acked" and src.subs:
            live = len(src.records)
            self._settle(src)  # RTR-7: the hold moved
            if len(src.records) != live:
                self._record_history(src)
        return cur > start

    def _router_gap(self, t: TopicModel, k: int) -> None:
        """RTR-5: ``k`` new seqs of ``t`` that are one loss range (TMB-2), with SUB-7 drops."""
        lo, hi = t.head + 1, t.head + k
        for q in range(lo, hi + 1):
            t.fate[q] = "lost"
        t.head = hi
        t.losses.append((lo, hi))
        for s in t.subs.values():
            t.add_gap(s, lo, hi)
        self._settle(t)
        self._record_history(t)

    def _resume_routers(self, now: int) -> None:
        """RTR-11: after a restart or a recovery, lower every cursor above its source's head,
        then forward (RTR-10)."""
        for name, r in sorted(self.routers.items()):
            src, dst = self.topics[r.source], self.topics[r.dest]
            if dst.cursors.get(name, 0) > src.head:
                dst.cursors[name] = src.head
                self._record_history(dst)
        self._pump(now)

    def resume_routers(self) -> None:
        """After ``adopt`` of every topic a crash left (``crash_candidates``), forward from the
        recovered cursors as a backend's recovery does (RTR-10, RTR-11)."""
        with self.lock:
            self._resume_routers(self._now())

    # -- router invariants ------------------------------------------------------------------
    def RTR_3(self) -> None:
        for name, r in self.routers.items():
            cursor = self.topics[r.dest].cursors[name]
            head = self.topics[r.source].head
            assert 0 <= cursor <= head, f"RTR-3: router {name} cursor {cursor} head {head}"
        for t in self.topics.values():
            stray = set(t.cursors) - {n for n, r in self.routers.items() if r.dest == t.name}
            assert not stray, f"RTR-12: cursors of dropped routers in {t.name}: {stray}"

    def RTR_9(self) -> None:
        sources: dict[str, set[str]] = {}
        for r in self.routers.values():
            sources.setdefault(r.dest, set()).add(r.source)
        fan_in = {d: s for d, s in sources.items() if len(s) > 1}
        assert not fan_in, f"RTR-9: dests fed by more than one source: {fan_in}"

    # ======================================================================================
    # crash model (DUR-2..DUR-6, DUR-9)
    # ======================================================================================
    def crash_candidates(self, name: str) -> list[TopicModel]:
        """Every state topic ``name`` may legally have after a crash and reopen.

        Records, floors, loss ranges and queue state come from a prefix of the topic's history
        that includes every durable op (fsync ops, ops before the last flush), adjusted by
        durability class; restart rules (DUR-1, QUE-8, SUB-9) are then applied. Subscriber
        progress is checked separately with ``hwm_bounds`` because backends may persist it
        independently of the records (DUR-9).
        """
        with self.lock:
            t = self.topics[name]
            pre_head = t.head
            cls = t.config.durability
            first = max(t.durable_len - 1, 0)
            if cls in ("fsync", "ephemeral"):
                first = len(t.history) - 1
            out = []
            for snap in t.history[first:]:
                cand = copy.deepcopy(snap)
                cand.history = []
                scratch = ModelStore(self.clock, self.options)
                scratch.topics = {name: cand}
                scratch.routers = {n: r for n, r in self.routers.items() if r.source == name}
                for r in scratch.routers.values():  # RTR-7's holds, read only
                    if r.dest != name and r.dest in self.topics:
                        scratch.topics[r.dest] = self.topics[r.dest].durable_copy()
                if cls == "disk" and cand.head < pre_head:
                    self._lose_suffix(scratch, cand, pre_head)
                elif cls == "ephemeral":
                    cand.head = max(cand.head, pre_head)
                scratch._restart_topic(cand, self._now())
                out.append(cand)
            return out

    @staticmethod
    def _lose_suffix(scratch: ModelStore, t: TopicModel, pre_head: int) -> None:
        """DUR-3: seqs above the recovered head become a loss range; head does not regress."""
        lost = list(range(t.head + 1, pre_head + 1))
        for s in t.subs.values():
            pending = [q for q in lost if q > s.hwm and q not in s.outcomes]
            if pending:
                t.add_gap(s, pending[0], pending[-1])
        for q in lost:
            t.fate[q] = "lost"
        t.head = pre_head
        t.losses.append((lost[0], lost[-1]))
        scratch._settle(t)

    def hwm_bounds(self, name: str, sub: str) -> tuple[int, int]:
        """DUR-9: a subscriber's hwm after a crash is within these bounds (before clamping to
        the recovered head)."""
        with self.lock:
            s = self.topics[name].subs[sub]
            return s.flushed_hwm, s.hwm

    def adopt(self, name: str, state: TopicModel) -> None:
        """After a recovery matched ``state`` (one of ``crash_candidates``), continue from it."""
        with self.lock:
            state = copy.deepcopy(state)
            state.history = []
            self.topics[name] = state
            self._record_history(state)
            state.durable_len = len(state.history)

    # ======================================================================================
    # whole-model checks
    # ======================================================================================
    def check_invariants(self) -> None:
        for t in self.topics.values():
            t.check_invariants([c for _, c in self._router_cursors(t)])
        self.RTR_3()
        self.RTR_9()
        if self.options.max_bytes is not None:
            total = sum(t.nbytes for t in self.topics.values())
            assert total <= self.options.max_bytes, "RET-6: store over max_bytes"
