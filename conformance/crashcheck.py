"""Crash checks for backends that do their file I/O through ``tidelog.fsio`` (spec/CRASH.md,
CRASH-7): run a workload on a ``RecordingFS``, then for chosen crash points and every (or a
seeded sample of) disk state a power loss may leave there, recover and compare with the model.

A recovered topic must equal one of the states the model allows (``ModelStore.crash_candidates``
of the ops acknowledged before the crash point, or the state right after the op in flight),
except that a head raised over reserved seqs (``disk``/``ephemeral``, DUR-3/DUR-5) is accepted
when readers get a tombstone for the extra seqs. Subscriber hwms must lie within the model's
at-least-once bounds (DUR-9). Recovery must not raise, must be idempotent, and must never hand out
a seq it already returned.
"""

from __future__ import annotations

import copy
import itertools
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, replace
from typing import Any

import tidelog
from tidelog.api import Store
from tidelog.backend import TopicRef
from tidelog.clock import Clock, FakeClock
from tidelog.errors import TidelogError
from tidelog.hooks import Abandon, Checkpoint, hooks, offers
from tidelog.model import ModelStore, TopicModel

from .crashfs import RecordingFS

__all__ = [
    "ROUTERS",
    "CrashRun",
    "Op",
    "TopicView",
    "apply_op",
    "check_progress",
    "compare_recovered",
    "observe",
]

#: ("create", topic, {config}) | ("append", topic, payload, tag) | ("append_many", topic,
#: [payloads]) | ("append_records", topic, [(payload, tag, node), ...]) |
#: ("delete", topic, before) | ("subscribe", topic, sub, start) | ("ack", topic, sub, seq) |
#: ("commit", topic, sub, seq) | ("flush_sub", topic, sub) | ("claim", topic, node, n) |
#: ("complete_first", topic) | ("drop", topic) | ("flush",) | ("checkpoint",) | ("advance", ms) |
#: ("router", name, source, dest, {options}) | ("drop_router", name)
Op = tuple[Any, ...]
ROUTERS = "(routers)"  # observe()'s key for the router cursors: not a valid topic name
StoreFactory = Callable[[RecordingFS, Clock], Store]


def apply_op(store: Store, op: Op, clock: FakeClock, leases: dict[str, list[Any]]) -> Any:
    """Run one op; returns its result or the error code (errors are part of the behaviour)."""
    kind = op[0]
    try:
        if kind == "advance":
            return clock.advance(op[1])
        if kind == "flush":
            return store.flush()
        if kind == "checkpoint":
            # backend-specific (REG-5); else a no-op
            return hooks(store, Checkpoint).checkpoint() if offers(store, Checkpoint) else None
        if kind == "create":
            return store.topic(op[1], **op[2]).name
        if kind == "drop":
            return store.drop_topic(op[1])
        if kind == "router":
            return store.router(op[1], op[2], op[3], **op[4]).cursor
        if kind == "drop_router":
            return store.drop_router(op[1])
        t = store.topic(op[1], create=False)
        if kind == "append":
            return t.append(op[2], tag=op[3])
        if kind == "append_many":
            return t.append_many(op[2])
        if kind == "append_records":
            return t.append_records(op[2])
        if kind == "delete":
            return t.delete(op[2])
        if kind == "subscribe":
            return t.subscribe(op[2], start=op[3]).hwm
        if kind in ("ack", "commit"):
            return getattr(t.subscriber(op[2]), kind)(op[3])
        if kind == "flush_sub":
            return t.subscriber(op[2]).flush()
        if kind == "claim":
            got = t.claim(op[2], max=op[3])
            leases.setdefault(op[1], []).extend(got)
            return [lease.seq for lease in got]
        if kind == "complete_first":
            held = leases.get(op[1]) or []
            if not held:
                return None
            lease = held.pop(0)
            return t.complete(lease.seq, lease.lease_id)
        raise ValueError(f"unknown op {op!r}")
    except TidelogError as exc:
        return f"error:{exc.code}"


@dataclass(frozen=True)
class TopicView:
    """What a reader can observe of one topic."""

    head: int
    earliest: int
    floor: int
    count: int
    nbytes: int
    records: tuple[Any, ...]
    tombstones: tuple[tuple[int, int], ...]
    subs: tuple[tuple[str, int], ...]


def _view(items: Sequence[Any], st: Any, subs: dict[str, int]) -> TopicView:
    recs = tuple(i for i in items if isinstance(i, tidelog.Record))
    tombs = tuple((i.gap_from, i.gap_to) for i in items if isinstance(i, tidelog.Tombstone))
    return TopicView(
        st.head_seq,
        st.earliest_seq,
        st.evict_floor,
        st.count,
        st.bytes,
        recs,
        tombs,
        tuple(sorted(subs.items())),
    )


def observe(store: Any) -> dict[str, Any]:
    """What a reader observes of every topic of ``store`` (a Store or a RemoteStore); with
    routers, their cursors too, under the key ``ROUTERS``."""
    out: dict[str, Any] = {}
    if store.capabilities.routers and store.routers():
        out[ROUTERS] = {info.name: info.cursor for info in store.routers()}
    for name in store.topics():
        t = store.topic(name, create=False)
        st = t.state()
        subs = {s: t.subscriber(s).hwm for s in t.subscribers()}
        out[name] = _view(t.read(0, 10**9), st, subs)
    return out


def _candidate_view(cand: TopicModel, clock: Clock) -> TopicView:
    scratch = ModelStore(clock, tidelog.backend.StoreOptions())
    scratch.topics = {cand.name: cand}
    ref = TopicRef(cand.name, cand.incarnation)
    st = scratch.state(ref)
    subs = {n: s.hwm for n, s in cand.subs.items()}
    return _view(scratch.read(ref, 0, 10**9, None), st, subs)


def _covered(tombs: Sequence[tuple[int, int]], lo: int, hi: int) -> bool:
    return all(any(a <= q <= b for a, b in tombs) for q in range(lo, hi + 1))


def _matches(got: TopicView, want: TopicView, cls: str) -> bool:
    if cls == "ephemeral":  # DUR-5: no records, head never regresses, every lost seq below
        # the floor; with nothing live to lose (all trimmed before) the floor stays where it was
        lost_below_floor = got.floor == got.head + 1 and got.head >= want.head
        return not got.records and (lost_below_floor or got == want)
    if got.records != want.records:
        return False
    if got.head == want.head:
        return (got.floor, got.earliest, got.count, got.nbytes, got.tombstones) == (
            want.floor,
            want.earliest,
            want.count,
            want.nbytes,
            want.tombstones,
        )
    if got.head > want.head and cls == "disk":  # DUR-3: the extra seqs read as a tombstone
        return (
            got.floor == want.floor
            and (got.count, got.nbytes) == (want.count, want.nbytes)
            and _covered(got.tombstones, want.head + 1, got.head)
        )
    return False


def _same_after_restart(first: dict[str, Any], second: dict[str, Any], model: ModelStore) -> bool:
    """CRASH-7: a second recovery finds what the first left, except that the records a router
    copied into an ``ephemeral`` dest during the first are gone again, as every restart takes
    an ephemeral topic's records (DUR-1, DUR-5; RTR-11), its head staying where it was."""
    if first.keys() != second.keys():
        return False
    for name, view in first.items():
        t = model.topics.get(name)
        if t is not None and t.config.durability == "ephemeral" and view.records:
            again = second[name]
            if again.records or (again.head, again.floor) != (view.head, view.head + 1):
                return False
        elif second[name] != view:
            return False
    return True


class CrashRun:
    """One workload, recorded once, checked at many crash points."""

    def __init__(
        self, open_store: StoreFactory, ops: Sequence[Op], *, start_ms: int = 1_000_000
    ) -> None:
        self.open_store = open_store
        self.ops = list(ops)
        self.start_ms = start_ms
        self.fs = RecordingFS()
        clock = FakeClock(start_ms)
        store = open_store(self.fs, clock)
        self.acks: list[int] = []
        self.results: list[Any] = []
        leases: dict[str, list[Any]] = {}
        for op in self.ops:
            self.results.append(apply_op(store, op, clock, leases))
            self.acks.append(len(self.fs.history))
        if offers(store, Abandon):
            hooks(store, Abandon).abandon()
        self._models: dict[int, tuple[ModelStore, FakeClock]] = {}
        self.checked = 0

    # -- the model after the first i ops -----------------------------------------------------
    def model(self, i: int) -> tuple[ModelStore, FakeClock]:
        if i not in self._models:
            clock = FakeClock(self.start_ms)
            store = tidelog.open("model://", clock=clock)
            leases: dict[str, list[Any]] = {}
            for op, expected in zip(self.ops[:i], self.results[:i]):
                got = apply_op(store, op, clock, leases)
                assert got == expected or op[0] == "checkpoint", (
                    f"model disagrees with the backend on {op}: model {got!r}, backend "
                    f"{expected!r} (run the stateful suite on this backend first)"
                )
            self._models[i] = (hooks(store, ModelStore), clock)
        return self._models[i]

    def acked_by(self, at: int) -> int:
        """How many ops had returned when the I/O history reached ``at``."""
        return sum(1 for mark in self.acks if mark <= at)

    # -- checking ------------------------------------------------------------------------------
    def states(self, points: Sequence[int] | None, **kwargs: Any) -> Iterator[RecordingFS]:
        for at in points if points is not None else self.fs.checkpoints():
            yield from self.fs.crash_states(at=at, **kwargs)

    def check(self, points: Sequence[int] | None = None, **kwargs: Any) -> int:
        """Check every state at ``points`` (default: every sync barrier); returns how many."""
        n = 0
        for state in self.states(points, **kwargs):
            self.check_state(state)
            n += 1
        self.checked += n
        return n

    def check_state(self, state: RecordingFS) -> None:
        at = state.crash_at if state.crash_at is not None else len(self.fs.history)
        i = self.acked_by(at)
        model_i, clock_i = self.model(i)
        model_next = self.model(i + 1)[0] if i < len(self.ops) else None
        where = f"crash at op {at} after {i} acknowledged ops ({state.description})"
        clock = FakeClock(clock_i.now_ms())
        try:
            store = self.open_store(state, clock)
        except Exception as exc:  # CRASH-7: recovery must not crash
            raise AssertionError(f"recovery raised {exc!r}: {where}") from exc
        try:
            got = observe(store)
            self._compare(got, model_i, model_next, clock, where)
            heads = {name: v.head for name, v in got.items() if name != ROUTERS}
        finally:
            store.close()
        again = self.open_store(state, FakeClock(clock.now_ms()))
        try:  # CRASH-7: recovery is idempotent, and new seqs never reuse a returned one
            second = observe(again)
            assert _same_after_restart(got, second, model_i), (
                f"recovering twice gave different states: {where}"
            )
            for name, head in heads.items():
                try:
                    seq = again.topic(name, create=False).append(b"after-crash")
                except TidelogError:
                    continue  # refused (full, backpressure): no seq assigned, nothing to check
                assert seq == head + 1, f"{name}: new seq {seq} after head {head}: {where}"
        finally:
            again.close()

    def _compare(
        self,
        got: dict[str, Any],
        model_i: ModelStore,
        model_next: ModelStore | None,
        clock: Clock,
        where: str,
    ) -> None:
        compare_recovered(got, model_i, model_next, clock, where)


def compare_recovered(
    got: dict[str, Any],
    model_i: ModelStore,
    model_next: ModelStore | None,
    clock: Clock,
    where: str,
) -> None:
    """CRASH-7, DUR-2..DUR-6, DUR-9: the topics ``got`` observed after recovery are states the
    model allows after the ops of ``model_i`` (and, when an op was in flight, ``model_next``:
    the model after it); raises AssertionError naming the topic otherwise."""
    got = dict(got)
    cursors = got.pop(ROUTERS, {})
    allowed = set(model_i.topics) | (set(model_next.topics) if model_next else set())
    assert set(got) <= allowed, f"topics {set(got) - allowed} never created: {where}"
    required = set(model_i.topics) & (
        set(model_next.topics) if model_next else set(model_i.topics)
    )
    assert required <= set(got), f"acknowledged topics {required - set(got)} lost: {where}"
    models = [m for m in (model_i, model_next) if m is not None]
    routed = _routed_topics(models)
    for name, view in got.items():
        if name in routed:
            continue
        cands: list[TopicModel] = []
        for m in models:
            if name in m.topics:
                cands += m.crash_candidates(name)
        cls = cands[0].config.durability
        views = [_candidate_view(c, clock) for c in cands]
        assert any(_matches(view, v, cls) for v in views), (
            f"topic {name} ({cls}) recovered as {view} which no allowed state matches; "
            f"allowed: {views}: {where}"
        )
        check_progress(name, view, model_i, model_next, where)
    if routed or cursors:
        _compare_routed(got, cursors, models, routed, clock, where)
        for name in sorted(routed & set(got)):
            check_progress(name, got[name], model_i, model_next, where)


def _merged(ranges: Sequence[tuple[int, int]]) -> list[tuple[int, int]]:
    """Loss ranges with touching neighbours joined."""
    out: list[tuple[int, int]] = []
    for lo, hi in sorted(ranges):
        if out and lo <= out[-1][1] + 1:
            out[-1] = (out[-1][0], max(out[-1][1], hi))
        else:
            out.append((lo, hi))
    return out


def _forwarded(
    m: ModelStore, combo: Sequence[TopicModel], heads: Sequence[int], clock: Clock
) -> tuple[dict[str, TopicView], dict[str, int]]:
    """What recovery makes of topic states ``combo`` with the routers of ``m``: each head
    raised to ``heads`` (a loss range, as recovery logs it), then forwarding from the cursors
    (RTR-10, RTR-11). Returns the topics' views and the routers' cursors."""
    scratch = ModelStore(clock, tidelog.backend.StoreOptions())
    scratch.topics = {c.name: copy.deepcopy(c) for c in combo}
    scratch.routers = {  # a dest state from before a router's creation lacks it
        n: r
        for n, r in m.routers.items()
        if r.source in scratch.topics
        and r.dest in scratch.topics
        and n in scratch.topics[r.dest].cursors
    }
    for c, head in zip(combo, heads):
        t = scratch.topics[c.name]
        if head > t.head and t.config.durability == "ephemeral":
            ModelStore._lose_suffix(scratch, t, head)
            t.evict_floor, t.losses = head + 1, []  # DUR-5: everything is below the floor
        elif head > t.head:
            ModelStore._lose_suffix(scratch, t, head)
            t.losses = _merged(t.losses)  # recovery logs one range up to the ceiling
    scratch.resume_routers()
    views = {c.name: _candidate_view(scratch.topics[c.name], clock) for c in combo}
    cursors = {n: scratch.topics[r.dest].cursors[n] for n, r in scratch.routers.items()}
    return views, cursors


def _routed_topics(models: Sequence[ModelStore]) -> set[str]:
    return {t for m in models for r in m.routers.values() for t in (r.source, r.dest)}


#: RTR-10 joint check: at most this many combinations of per-topic crash candidates
_MAX_COMBINATIONS = 4096


def _compare_routed(
    got: dict[str, TopicView],
    cursors: dict[str, int],
    models: Sequence[ModelStore],
    routed: set[str],
    clock: Clock,
    where: str,
) -> None:
    """RTR-10, RTR-11: topics linked by routers are checked together. Each topic may recover
    as any of its crash candidates; recovery then forwards from the recovered cursors
    (``resume_routers``). Some combination of candidates, with the routers of one of the
    models, must give exactly what was observed: every topic, and every router's cursor."""
    names = sorted(routed & set(got))
    per_topic: list[list[TopicModel]] = []
    for name in names:
        cands = [c for m in models if name in m.topics for c in m.crash_candidates(name)]
        per_topic.append(cands)
    combos = 1
    for cands in per_topic:
        combos *= max(len(cands), 1)
    assert combos <= _MAX_COMBINATIONS, f"{combos} candidate combinations: workload too big"
    tried: list[dict[str, TopicView]] = []
    for m in models:
        for combo in itertools.product(*per_topic):
            # DUR-3, DUR-5: recovery may raise a disk or ephemeral head over the seqs it had
            # reserved, before it forwards: every height up to what was observed is tried
            raises = [
                range(c.head, got[c.name].head + 1)
                if c.config.durability in ("disk", "ephemeral")
                else range(c.head, c.head + 1)
                for c in combo
            ]
            for heads in itertools.product(*raises):
                views, want_cursors = _forwarded(m, combo, heads, clock)
                # exact: the raised heads are part of the state tried (hwms: check_progress)
                if cursors == want_cursors and all(
                    replace(got[n], subs=()) == replace(views[n], subs=()) for n in names
                ):
                    return
                tried.append(views)
    raise AssertionError(
        f"routed topics {names} recovered as {[got[n] for n in names]} with cursors "
        f"{cursors}, which no combination of allowed states forwards to (RTR-10); "
        f"{len(tried)} tried, e.g. {tried[:2]}: {where}"
    )


def check_progress(
    name: str,
    view: TopicView,
    model_i: ModelStore,
    model_next: ModelStore | None,
    where: str,
) -> None:
    """DUR-9: every recovered subscriber hwm within the model's at-least-once bounds."""
    for sub, hwm in view.subs:
        known = [
            m.topics[name].subs[sub]
            for m in (model_i, model_next)
            if m is not None and name in m.topics and sub in m.topics[name].subs
        ]
        lo = min((s.flushed_hwm for s in known), default=0)
        hi = max((s.hwm for s in known), default=view.head)
        live = {r.seq for r in view.records}
        # DUR-9: at least what was flushed, at most what was resolved; above the model's
        # hwm only across seqs that are not live (lost or removed seqs resolve silently)
        assert min(lo, view.head) <= hwm, f"{name}/{sub}: hwm {hwm} < flushed {lo}: {where}"
        assert hwm <= hi or not any(hi < q <= hwm for q in live), (
            f"{name}/{sub}: hwm {hwm} passed unresolved live records above {hi}: {where}"
        )
