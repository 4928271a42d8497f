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
import dataclasses
import itertools
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
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
    "append_after",
    "apply_op",
    "check_progress",
    "check_reopened",
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
        if kind == "delete_tag":  # dead slots anywhere in a tail, not only a prefix (DEL-5)
            return t.delete(tag=op[2])
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
            recovered = self._compare(got, model_i, model_next, clock, where)
            heads = {name: v.head for name, v in got.items() if name != ROUTERS}
        finally:
            store.close()
        again = self.open_store(state, FakeClock(clock.now_ms()))
        try:  # CRASH-7: recovery is idempotent, and new seqs never reuse a returned one
            check_reopened(got, observe(again), recovered, clock, where)
            for name, head in heads.items():
                seq, now = append_after(again, name, head)
                assert seq in (None, now + 1), f"{name}: new seq {seq} after head {now}: {where}"
        finally:
            again.close()

    def _compare(
        self,
        got: dict[str, Any],
        model_i: ModelStore,
        model_next: ModelStore | None,
        clock: Clock,
        where: str,
    ) -> ModelStore | None:
        return compare_recovered(got, model_i, model_next, clock, where)


def check_reopened(
    first: dict[str, Any],
    second: dict[str, Any],
    recovered: ModelStore | None,
    clock: Clock,
    where: str,
) -> None:
    """CRASH-7: recovery is idempotent. ``second`` was observed after closing the recovered
    store (``first``) and opening it again: every topic no router links must be exactly as it
    was. A clean reopen is a restart (DUR-1), so topics linked by routers must be what the
    model of the first recovery (``recovered``, from ``compare_recovered``; consumed here)
    becomes after a restart: an ephemeral topic drops the copies its routers forwarded at the
    first recovery, and forwarding resumes (RTR-10, RTR-11)."""
    first, second = dict(first), dict(second)
    cursors = second.pop(ROUTERS, {})
    before = first.pop(ROUTERS, {})
    assert set(second) == set(first), (
        f"recovering twice gave topics {sorted(first)} then {sorted(second)}: {where}"
    )
    routed = set(recovered.topics) if recovered is not None else set()
    for name in sorted(set(second) - routed):
        assert second[name] == first[name], (
            f"recovering twice gave {name} = {first[name]} then {second[name]}: {where}"
        )
    if recovered is None:
        assert cursors == before, f"recovering twice gave cursors {before} then {cursors}"
        return
    recovered.restart(clock)
    want = {n: recovered.topics[r.dest].cursors[n] for n, r in recovered.routers.items()}
    assert cursors == want, (
        f"recovering twice gave cursors {before} then {cursors}, not {want}: {where}"
    )
    for name in sorted(routed & set(second)):
        t = recovered.topics[name]
        view = _candidate_view(t, clock)
        assert _routed_match(second[name], view, t.config.durability), (
            f"recovering twice gave {name} = {first[name]} then {second[name]}, not the "
            f"restarted {view} (DUR-1): {where}"
        )


def append_after(store: Any, name: str, head: int) -> tuple[int | None, int]:
    """CRASH-7, DUR-3: append to topic ``name`` of a recovered store whose recovered head was
    ``head``; returns (the new seq, or None when refused, and the head just before it). The
    head may have moved since recovery, by copies an append to a router's source forwarded
    into it (RTR-8), but never below ``head``; the new seq must be that head + 1."""
    topic = store.topic(name, create=False)
    now = max(topic.state().head_seq, head)
    try:
        return topic.append(b"after-crash"), now
    except TidelogError:
        return None, now  # refused (full, backpressure): no seq assigned, nothing to check


def compare_recovered(
    got: dict[str, Any],
    model_i: ModelStore,
    model_next: ModelStore | None,
    clock: Clock,
    where: str,
) -> ModelStore | None:
    """CRASH-7, DUR-2..DUR-6, DUR-9: the topics ``got`` observed after recovery are states the
    model allows after the ops of ``model_i`` (and, when an op was in flight, ``model_next``:
    the model after it); raises AssertionError naming the topic otherwise. Returns the model
    of the topics linked by routers as recovered (None without routers): ``check_reopened``
    needs it."""
    got = dict(got)
    cursors = got.pop(ROUTERS, {})
    allowed = set(model_i.topics) | (set(model_next.topics) if model_next else set())
    assert set(got) <= allowed, f"topics {set(got) - allowed} never created: {where}"
    required = set(model_i.topics) & (set(model_next.topics) if model_next else set(model_i.topics))
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
    if not routed and not cursors:
        return None
    recovered = _compare_routed(got, cursors, models, routed, clock, where)
    for name in sorted(routed & set(got)):
        check_progress(name, got[name], model_i, model_next, where)
    return recovered


def _joined(view: TopicView) -> TopicView:
    """``view`` with touching tombstones joined: how a recovery splits the seqs it lost into
    loss ranges (its own range over reserved seqs, the ranges forwarding adds after it, RTR-5)
    is not what it lost; topics linked by routers are compared this way."""
    out: list[tuple[int, int]] = []
    for lo, hi in view.tombstones:
        if out and lo == out[-1][1] + 1:
            out[-1] = (out[-1][0], hi)
        else:
            out.append((lo, hi))
    return dataclasses.replace(view, tombstones=tuple(out))


def _routed_match(got: TopicView, want: TopicView, cls: str) -> bool:
    """``_matches`` for a topic linked by routers, whose recovery the model has replayed
    (``_recovered``): exact for an ephemeral topic too, tombstones joined."""
    return _matches(_joined(got), _joined(want), "exact" if cls == "ephemeral" else cls)


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
) -> ModelStore:
    """RTR-10, RTR-11: topics linked by routers are checked together. Each topic may recover
    as any of its crash candidates; recovery then forwards from the recovered cursors
    (``resume_routers``). Some combination of candidates, with the routers of one of the
    models, must give exactly what was observed: every topic, and every router's cursor.
    Returns the model of that recovery."""
    names = sorted(routed & set(got))
    per_topic: list[list[TopicModel]] = []
    for name in names:
        cands = [c for m in models if name in m.topics for c in m.crash_candidates(name)]
        per_topic.append(cands)
    combos = 1
    for cands in per_topic:
        combos *= max(len(cands), 1)
    assert combos <= _MAX_COMBINATIONS, f"{combos} candidate combinations: workload too big"
    # DUR-5: an ephemeral topic's lost seqs are all below its floor ("lifted"), or, with
    # nothing to lose, its floor may stay where it was: each is tried (the raise and the
    # forwarding after it are modelled, so the comparison is exact)
    ephemeral = [n for n, c in zip(names, per_topic) if c[0].config.durability == "ephemeral"]
    lifts = [
        set(chosen) for k in range(len(ephemeral) + 1)
        for chosen in itertools.combinations(ephemeral, k)
    ]  # fmt: skip
    tried: list[dict[str, TopicView]] = []
    for m in models:
        for combo in itertools.product(*per_topic):
            for lift in lifts:
                scratch = _recovered(combo, m, got, clock, lift)
                views = {n: _candidate_view(scratch.topics[n], clock) for n in names}
                want_cursors = {
                    n: scratch.topics[r.dest].cursors[n] for n, r in scratch.routers.items()
                }
                classes = {n: scratch.topics[n].config.durability for n in names}
                if cursors == want_cursors and all(
                    _routed_match(got[n], views[n], classes[n]) for n in names
                ):
                    return scratch
                tried.append(views)
    raise AssertionError(
        f"routed topics {names} recovered as {[got[n] for n in names]} with cursors "
        f"{cursors}, which no combination of allowed states forwards to (RTR-10); "
        f"{len(tried)} tried, e.g. {tried[:2]}: {where}"
    )


def _recovered(
    combo: Sequence[TopicModel],
    m: ModelStore,
    got: dict[str, TopicView],
    clock: Clock,
    lift: set[str],
) -> ModelStore:
    """The model of a recovery that found the topics of ``combo`` (crash candidates) and the
    routers of ``m``: heads raised over reserved seqs (DUR-3, DUR-5), the floors of the
    ephemeral topics in ``lift`` raised over their heads (DUR-5), then forwarding from the
    recovered cursors (RTR-10, RTR-11). A raised head is not observed directly: the observed
    head of a dest is its raised head plus what recovery then forwarded into it (copies and
    loss ranges, RTR-5), and that amount depends only on the topics upstream; so the raise of
    each topic is found by repeating the recovery, once per link of the longest chain.
    Subscriber hwms are taken as observed where they are lower (``_as_observed``)."""
    ephemeral = {c.name for c in combo if c.config.durability == "ephemeral"}
    raised: dict[str, int] = {}
    for _ in range(len(combo) + 1):
        scratch = ModelStore(clock, tidelog.backend.StoreOptions())
        scratch.topics = {c.name: _as_observed(copy.deepcopy(c), got.get(c.name)) for c in combo}
        scratch.routers = {  # a dest state from before a router's creation lacks it
            n: r
            for n, r in m.routers.items()
            if r.source in scratch.topics
            and r.dest in scratch.topics
            and n in scratch.topics[r.dest].cursors
        }
        for n, t in scratch.topics.items():
            if raised.get(n, t.head) > t.head and (n in lift or n not in ephemeral):
                ModelStore._lose_suffix(scratch, t, raised[n])
            if n in lift and t.evict_floor <= t.head:
                t.evict_floor, t.losses = t.head + 1, []
                scratch._settle(t)
        before = {n: t.head for n, t in scratch.topics.items()}
        scratch.resume_routers()
        again = {
            n: got[n].head - (t.head - before[n])
            for n, t in scratch.topics.items()
            if t.config.durability in ("disk", "ephemeral") and n in got
        }
        if again == raised or not again:
            return scratch
        raised = again
    return scratch


def _as_observed(cand: TopicModel, view: TopicView | None) -> TopicModel:
    """``cand`` with each subscriber's hwm lowered to the recovered one where that is lower.
    DUR-9 lets progress be persisted apart from records, so a crash may keep a trim yet lose
    the acks of seqs above it; the ack-trim that forwarding at recovery triggers (SUB-5, RTR-7)
    must then hold back at the recovered hwm, not the candidate's. ``check_progress`` still
    bounds every observed hwm (CNF-34)."""
    if view is None:
        return cand
    for name, hwm in view.subs:
        s = cand.subs.get(name)
        if s is not None and hwm < s.hwm:
            # no outcome at or below the old hwm is kept (SUB-2), so the live seqs between
            # are unresolved again: the at-least-once redelivery DUR-9 allows
            s.hwm = s.cursor = hwm
    return cand


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
