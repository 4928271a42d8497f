"""The engine: spec/SPEC.md semantics over the efficient per-topic structures, written once
(seed 000 §11: "the serving and indexing logic is written once") and shared by backends that
differ only in where bytes live.

Every public op reads the clock once (``now``), applies the lazy time effects (RET-4, QUE-5) of
its topic, checks everything that can fail before changing anything (ERR-2, RET-7), then mutates.
One re-entrant lock per store serialises ops (CON-1); dead-lettering appends to another topic
under the same lock.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence

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
from tidelog.records import Item, Lease, Tombstone, TopicState

from .index import TopicLog
from .jobs import JobQueue
from .progress import Progress, SubState

__all__ = ["Engine", "EngineTopic"]


class EngineTopic:
    """One topic incarnation: its log, its subscribers' progress and its job queue."""

    __slots__ = ("name", "config", "incarnation", "log", "progress", "jobs", "version")

    def __init__(self, name: str, config: TopicConfig, incarnation: int) -> None:
        self.name = name
        self.config = config
        self.incarnation = incarnation
        self.log = TopicLog(name, config)
        self.progress = Progress()
        self.jobs = JobQueue()
        self.version = 0  # moves on every change; readers waiting for data sleep on it (CON-3)


class Engine(Backend):
    """A complete Backend over in-memory structures; storage backends extend it."""

    def __init__(self, clock: Clock, options: StoreOptions, capabilities: Capabilities) -> None:
        self.clock = clock
        self.options = options
        self.capabilities = capabilities
        self.topics: dict[str, EngineTopic] = {}
        self.lock = threading.RLock()
        self.changed = threading.Condition(self.lock)
        self.closed = False
        self._incarnations = 0

    # -- lookups ---------------------------------------------------------------------------
    def _check_open(self) -> None:
        if self.closed:
            raise Closed("store is closed")

    def _get(self, ref: TopicRef) -> EngineTopic:
        self._check_open()
        t = self.topics.get(ref.name)
        if t is None or t.incarnation != ref.incarnation:
            raise NoSuchTopic(f"topic {ref.name!r} does not exist (dropped?)")
        return t

    def _sub(self, t: EngineTopic, name: str) -> SubState:
        s = t.progress.subs.get(name)
        if s is None:
            raise NoSuchSubscriber(f"subscriber {name!r} of topic {t.name!r} does not exist")
        return s

    def _enter(self, ref: TopicRef) -> tuple[EngineTopic, int]:
        """Start a topic op: resolve the handle, read the clock once, apply time effects."""
        t = self._get(ref)
        now = self.clock.now_ms()
        self._tick(t, now)
        return t, now

    # -- lazy time effects (RET-4, QUE-5) --------------------------------------------------
    def _tick(self, t: EngineTopic, now: int) -> None:
        expired = t.log.expired(now)
        if expired:
            self._remove_involuntary(t, expired)
        if t.jobs.leases or t.jobs.delayed:
            for seq in t.jobs.expired(now):
                self._return_job(t, seq, now)
            for seq in t.jobs.ready(now):
                self._return_job(t, seq, now)

    def _bump(self, t: EngineTopic) -> None:
        t.version += 1
        self.changed.notify_all()

    def changes(self, ref: TopicRef) -> int:
        with self.lock:
            return self._get(ref).version

    def wait(self, ref: TopicRef, since: int, timeout: float) -> None:
        with self.changed:
            t = self.topics.get(ref.name)
            if t is None or t.incarnation != ref.incarnation or t.version != since or self.closed:
                return
            self.changed.wait(timeout)

    # -- removal and settling --------------------------------------------------------------
    def _remove_involuntary(self, t: EngineTopic, seqs: Sequence[int]) -> None:
        t.progress.note_involuntary(t.log, seqs)
        t.log.remove(seqs, involuntary=True)
        self._settle(t)

    def _remove_voluntary(self, t: EngineTopic, seqs: Sequence[int]) -> None:
        t.log.remove(seqs, involuntary=False)
        self._settle(t)

    def _settle(self, t: EngineTopic) -> None:
        """Advance hwms and ack-trim after any change; wakes waiters (producers blocked on
        backpressure wait for exactly this)."""
        if t.progress.subs:
            trimmed = t.progress.settle(t.log)
            if trimmed:
                t.log.remove(trimmed, involuntary=False)
        self._bump(t)

    # ======================================================================================
    # store
    # ======================================================================================
    def open_topic(self, name: str, options: Mapping[str, object], create: bool) -> TopicRef:
        with self.lock:
            self._check_open()
            t = self.topics.get(name)
            if t is not None:
                t.config.check_matches(name, options)
            elif not create:
                raise NoSuchTopic(f"topic {name!r} does not exist")
            else:
                t = self._create(name, TopicConfig.from_options(name, options))
            return TopicRef(name, t.incarnation)

    def _create(self, name: str, config: TopicConfig) -> EngineTopic:
        if config.durability not in self.capabilities.durability:
            raise BadOption(
                f"durability {config.durability!r} is not offered by this backend; "
                f"choose from {', '.join(sorted(self.capabilities.durability))}"
            )
        self._incarnations += 1
        t = EngineTopic(name, config, self._incarnations)
        self.topics[name] = t
        return t

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
            if self.topics.pop(name, None) is None:
                raise NoSuchTopic(f"topic {name!r} does not exist")
            self.changed.notify_all()

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
                self.changed.notify_all()

    def restart(self, clock: Clock) -> None:
        """Apply the restart rules (DUR-1, SUB-9, QUE-8) and reopen."""
        with self.lock:
            self.clock = clock
            self.closed = False
            now = clock.now_ms()
            for name in sorted(self.topics):
                t = self.topics.get(name)
                if t is None:
                    continue
                if t.config.durability == "ephemeral" and t.log.count:
                    self._remove_involuntary(t, t.log.live_between(t.log.earliest, t.log.head))
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
        return TopicState(log.head, log.earliest, log.evict_floor, log.count, log.nbytes)

    # ======================================================================================
    # topic log
    # ======================================================================================
    def append(
        self, ref: TopicRef, payloads: Sequence[bytes], tag: str | None, node: str | None
    ) -> list[int]:
        with self.lock:
            t, now = self._enter(ref)
            return self._append(t, payloads, tag, node, now)

    def _append(
        self, t: EngineTopic, payloads: Sequence[bytes], tag: str | None, node: str | None, now: int
    ) -> list[int]:
        c, log = t.config, t.log
        n = len(payloads)
        nbytes = 0
        limit = self.options.max_record_bytes
        for p in payloads:  # RET-7 order: too_large, caps, store_full, topic_full, backpressure
            size = len(p)
            if size > limit:
                raise TooLarge(f"record of {size} bytes exceeds max_record_bytes={limit}")
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
        ts = now if log.last_ts is None or now > log.last_ts else log.last_ts
        seqs = log.append(payloads, tag, node, ts)
        if victims:
            self._remove_involuntary(t, victims)
        self._bump(t)
        return seqs

    def read(self, ref: TopicRef, after: int, limit: int, exclude_node: str | None) -> list[Item]:
        with self.lock:
            t, _ = self._enter(ref)
            return t.log.read(after, limit, exclude_node)

    def state(self, ref: TopicRef) -> TopicState:
        with self.lock:
            t, _ = self._enter(ref)
            return self._peek_state(t)

    def delete(
        self, ref: TopicRef, before_seq: int | None, tag: str | None, tag_glob: str | None
    ) -> int:
        with self.lock:
            t, _ = self._enter(ref)
            targets = t.log.delete_targets(before_seq, tag, tag_glob)
            if targets:
                self._remove_voluntary(t, targets)
            return len(targets)

    # ======================================================================================
    # subscribers
    # ======================================================================================
    def subscribe(self, ref: TopicRef, name: str, start: str) -> None:
        with self.lock:
            t, _ = self._enter(ref)
            if t.progress.register(t.log, name, start):
                self._settle(t)

    def subscribers(self, ref: TopicRef) -> list[str]:
        with self.lock:
            return sorted(self._get(ref).progress.subs)

    def poll(self, ref: TopicRef, name: str, limit: int) -> list[Item]:
        with self.lock:
            t, _ = self._enter(ref)
            s = self._sub(t, name)
            log = t.log
            items: list[Item] = []
            if s.gap is not None:
                items.append(Tombstone(*s.gap))
                s.cursor = max(s.cursor, s.gap[1])
                s.gap = None
            cursor = max(s.cursor, s.hwm)
            head, out = log.head, s.outcomes
            q = cursor + 1
            if q < log.earliest:  # seqs below earliest are not live: examined and skipped
                q = log.earliest
                cursor = q - 1
            while q <= head and len(items) < limit:
                if q not in out and log.is_live(q):
                    items.append(log.record(q))
                cursor = q
                q += 1
            s.cursor = cursor
            return items

    def _resolve(self, ref: TopicRef, name: str, seq: int, outcome: str) -> bool:
        with self.lock:
            t, _ = self._enter(ref)
            s = self._sub(t, name)
            if seq > t.log.head:
                raise BadArgument(f"seq {seq} is above head_seq {t.log.head}")
            if t.progress.resolved(t.log, s, seq):
                return False
            s.outcomes[seq] = outcome
            self._settle(t)
            return True

    def ack(self, ref: TopicRef, name: str, seq: int) -> bool:
        return self._resolve(ref, name, seq, "acked")

    def reject(self, ref: TopicRef, name: str, seq: int) -> bool:
        return self._resolve(ref, name, seq, "rejected")

    def commit(self, ref: TopicRef, name: str, seq: int) -> int:
        with self.lock:
            t, _ = self._enter(ref)
            s = self._sub(t, name)
            log = t.log
            if seq > log.head:
                raise BadArgument(f"seq {seq} is above head_seq {log.head}")
            if seq <= s.hwm:
                return 0
            pending = [q for q in log.live_between(s.hwm + 1, seq) if q not in s.outcomes]
            for q in pending:
                s.outcomes[q] = "acked"
            self._settle(t)
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
            t, _ = self._enter(ref)
            self._sub(t, name)
            del t.progress.subs[name]
            self._settle(t)

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
        jobs.free.add(seq)

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
        self._remove_voluntary(t, [seq])
        return True

    def claim(self, ref: TopicRef, node: str, limit: int, lease_ms: int | None) -> list[Lease]:
        with self.lock:
            t, now = self._enter(ref)
            log, jobs = t.log, t.jobs
            deadline = now + (lease_ms if lease_ms is not None else t.config.lease_ms)
            max_deliveries = t.config.max_deliveries
            out: list[Lease] = []

            def hand_out(seq: int) -> None:
                lease_id, deliveries = jobs.grant(seq, node, deadline)
                out.append(Lease(seq, lease_id, deadline, deliveries, log.record(seq)))

            self._bump(t)
            for seq in sorted(jobs.free):  # QUE-1: reclaimed jobs first, lowest seq first
                if len(out) == limit:
                    break
                if not log.is_live(seq):
                    jobs.free.discard(seq)
                    jobs.deliveries.pop(seq, None)
                elif max_deliveries is not None and jobs.deliveries.get(seq, 0) >= max_deliveries:
                    self._dead_letter(t, seq, now)  # stays parked if refused; never handed out
                else:
                    jobs.free.discard(seq)
                    hand_out(seq)
            while len(out) < limit and jobs.claim_cursor < log.head:
                nxt = max(jobs.claim_cursor + 1, log.earliest)
                if nxt > log.head:
                    jobs.claim_cursor = log.head
                    break
                jobs.claim_cursor = nxt
                if log.is_live(nxt):
                    hand_out(nxt)
            return out

    def _end_lease(self, t: EngineTopic, seq: int, lease_id: int) -> None:
        if not t.jobs.end_lease(seq, lease_id):
            raise LeaseLost(
                f"no valid lease {lease_id} on seq {seq} of topic {t.name!r} "
                "(expired, already finished, or never granted)"
            )

    def complete(self, ref: TopicRef, seq: int, lease_id: int) -> None:
        with self.lock:
            t, _ = self._enter(ref)
            self._end_lease(t, seq, lease_id)
            t.jobs.deliveries.pop(seq, None)
            if t.log.is_live(seq):
                self._remove_voluntary(t, [seq])

    def release(self, ref: TopicRef, seq: int, lease_id: int) -> None:
        with self.lock:
            t, now = self._enter(ref)
            self._end_lease(t, seq, lease_id)
            self._return_job(t, seq, now)
            self._bump(t)

    def nack(self, ref: TopicRef, seq: int, lease_id: int, delay_ms: int) -> None:
        with self.lock:
            t, now = self._enter(ref)
            self._end_lease(t, seq, lease_id)
            if delay_ms == 0:
                self._return_job(t, seq, now)
            else:
                t.jobs.delay(seq, now + delay_ms)
            self._bump(t)
