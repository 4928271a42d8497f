"""Crash checks for the blockdev ring (spec/FORMATS-blockdev.md BDEV-16, BDEV-17), on top of
``crashcheck``: the states a power loss may leave on a flash ring, and the one place that
decides whether a recovered topic is one of them. The crash suite (tests/crash) and the
stateful suite's power-loss rule (tests/stateful) both use it.

A recovered topic is allowed if it equals a state the model allows (``crashcheck``'s exact
comparison), or, on a topic whose history trimmed records, one of those states changed only as
BDEV-17 says a ring may change it (subscriber progress and trims are at-least-once):

* records trimmed (SUB-5) after the last progress the ring recorded are live again;
* records the history trimmed are trimmed again where the recovered progress, newer than the
  records (DUR-9 clamps it to the recovered head), covers them;
* the floor, written with that progress, may be newer than the records too: records the history
  evicted after them are below it, with a tombstone;
* the cap (RET-1), re-applied to the revived records, evicts the oldest, with a tombstone;

and nothing is ever missing silently. With ``ring_full`` (a ring too small for what the topic
keeps, BDEV-16) a crash during the write that overwrites live records may also lose the oldest
records, below a floor that tombstones them. ``RingCrashRun`` also runs ``verify`` on every
crash state (BDEV-21: a state a power loss leaves holds no error, at most warnings).
"""

from __future__ import annotations

from collections.abc import Sequence

import tidelog
from tidelog.backends.blockdev import verify_image
from tidelog.clock import Clock
from tidelog.model import ModelStore, TopicModel
from tidelog.records import Record

from .crashcheck import (
    CrashRun,
    TopicView,
    _candidate_view,
    _matches,
    check_progress,
    compare_recovered,
)
from .crashfs import RecordingFS

__all__ = ["RingCrashRun", "allowed_as", "compare_recovered_ring", "no_silent_skip"]


def _states(models: Sequence[ModelStore], name: str) -> list[TopicModel]:
    """The topic's states in the current incarnation, over the history of every model."""
    out: list[TopicModel] = []
    for m in models:
        t = m.topics.get(name)
        if t is not None:
            out += [s for s in [*t.history, t] if s.incarnation == t.incarnation]
    return out


def _appended(models: Sequence[ModelStore], name: str) -> dict[int, Record]:
    out: dict[int, Record] = {}
    for s in _states(models, name):
        out.update(s.records)
    return out


def _fated(models: Sequence[ModelStore], name: str, fates: tuple[str, ...]) -> set[int]:
    """Seqs of the current incarnation that some state of the history gave one of ``fates``."""
    return {q for s in _states(models, name) for q, f in s.fate.items() if f in fates}


def _at_least_once(
    got: TopicView,
    cand: TopicModel,
    want: TopicView,
    appended: dict[int, Record],
    trimmed: set[int],
    evicted: set[int],
) -> str | None:
    """Why ``got`` is not ``cand`` changed as BDEV-17 allows (None: it is)."""
    if got.head != want.head:
        return f"head {got.head} != {want.head}"
    low_hwm = min((h for _, h in got.subs), default=0)
    live = {r.seq: r for r in got.records}
    for seq, rec in live.items():
        if appended.get(seq) != rec:
            return f"seq {seq}: {rec} was never appended"
        if seq not in cand.records and cand.fate.get(seq) != "trimmed":
            return f"seq {seq} is live but was {cand.fate.get(seq)} (only trims may be undone)"
    covered = {q for lo, hi in got.tombstones for q in range(lo, hi + 1)}
    c = cand.config
    at_cap = (c.cap_records is not None and got.count == c.cap_records) or c.cap_bytes is not None
    for q in range(1, got.head + 1):
        if q in live:
            continue
        if q in cand.records and q in trimmed and q <= low_hwm:
            continue  # trimmed before the crash, and the recovered progress says so (SUB-5)
        involuntary = cand.fate.get(q) in ("evicted", "lost")
        if (q in cand.records or involuntary) and q not in covered:
            return f"seq {q} missing without a tombstone"
        if q in cand.records and q not in evicted and not (trimmed and at_cap):
            # only an eviction the history made (the floor is as new as the progress), or the
            # cap re-applied to records whose trim was undone, may take a record of cand
            return f"seq {q} tombstoned though the history never evicted it"
    if (got.count, got.nbytes) != (len(live), sum(len(r.payload) for r in got.records)):
        return "count/bytes disagree with the records"
    if (c.cap_records is not None and got.count > c.cap_records) or (
        c.cap_bytes is not None and got.nbytes > c.cap_bytes
    ):
        return "over the cap (RET-1)"
    return None


def _lost_oldest_visibly(got: TopicView, want: TopicView) -> bool:
    """BDEV-16: ``want`` minus some of its oldest records, all below a floor that tombstones
    them."""
    k = len(want.records) - len(got.records)
    return (
        got.head == want.head
        and k >= 0
        and got.records == want.records[k:]
        and got.floor == (got.records[0].seq if got.records else got.head + 1)
        and got.tombstones == ((1, got.floor - 1),)
    )


def allowed_as(
    name: str,
    got: TopicView,
    models: Sequence[ModelStore],
    clock: Clock,
    *,
    ring_full: bool = False,
) -> tuple[TopicModel, str]:
    """The crash candidate (``ModelStore.crash_candidates`` of ``models``: the model after the
    ops acknowledged before the crash, and after the op in flight) that ``got`` is allowed as,
    and how: "exact", "at-least-once" (BDEV-17) or "ring" (BDEV-16). AssertionError otherwise.
    Subscriber hwms are checked separately (``crashcheck.check_progress``, DUR-9)."""
    cands = [c for m in models if name in m.topics for c in m.crash_candidates(name)]
    assert cands, f"topic {name} recovered but never existed"
    cls = cands[0].config.durability
    wants = [_candidate_view(c, clock) for c in cands]
    for c, want in zip(cands, wants, strict=True):
        if _matches(got, want, cls):
            return c, "exact"
    reasons: list[str] = []
    trimmed = _fated(models, name, ("trimmed",))
    evicted = _fated(models, name, ("evicted", "lost"))
    if trimmed or evicted:
        appended = _appended(models, name)
        for c, want in zip(cands, wants, strict=True):
            why = _at_least_once(got, c, want, appended, trimmed, evicted)
            if why is None:
                return c, "at-least-once"
            reasons.append(why)
    if ring_full:
        for c, want in zip(cands, wants, strict=True):
            if _lost_oldest_visibly(got, want):
                return c, "ring"
    raise AssertionError(
        f"BDEV-17: topic {name} ({cls}) recovered as {got}, not an allowed state "
        f"{'even with trims undone ' if trimmed else ''}{reasons or ''}; allowed: {wants}"
    )


def no_silent_skip(
    t: tidelog.Topic, sub: str, models: Sequence[ModelStore], name: str, where: str
) -> None:
    """SUB-7, DUR-9, BDEV-17: after recovery, polling delivers every live record above the hwm
    and a tombstone for every other seq the subscriber had not resolved in the model. (Polls:
    use it on a store that is discarded afterwards.)"""
    s = t.subscribe(sub)
    hwm, head = s.hwm, t.state().head_seq
    got: list[object] = []
    while batch := s.poll(100):
        got += batch
    seen = {r.seq for r in got if isinstance(r, tidelog.Record)}
    covered = {
        q for r in got if isinstance(r, tidelog.Tombstone) for q in range(r.gap_from, r.gap_to + 1)
    }
    live = {r.seq for r in t.read(0, 10**9) if isinstance(r, tidelog.Record)}
    for q in range(hwm + 1, head + 1):
        if q in seen or q in covered:
            continue
        unresolved = all(
            name in m.topics
            and sub in m.topics[name].subs
            and q <= m.topics[name].head
            and not m.topics[name].resolved(m.topics[name].subs[sub], q)
            for m in models
        )
        assert q not in live or not unresolved, (
            f"SUB-4: {name}/{sub} never got live record {q}: {where}"
        )
        assert q in live or not unresolved, (
            f"SUB-7: {name}/{sub} missed seq {q} silently (hwm {hwm}): {where}"
        )


class RingCrashRun(CrashRun):
    """``CrashRun`` for a blockdev ring: recovered topics are judged by ``allowed_as`` (with
    ``ring_full`` when the workload overfills the ring, BDEV-16), and no subscriber silently
    misses a record it had not resolved (``no_silent_skip``)."""

    ring_full = False
    relaxed = 0  # states that needed a BDEV-16/BDEV-17 relaxation (reported)

    def check_state(self, state: RecordingFS) -> None:
        # BDEV-21: verify (offline, read-only) finds no error in a state a power loss leaves;
        # before recovery, which writes to the state
        for path, data in sorted(state.tree().items()):
            if data is not None and not path.endswith(".tmp"):
                report = verify_image(state, path)
                assert report.ok, f"verify {path}: {report.errors}: {state.description}"
        super().check_state(state)
        at = state.crash_at if state.crash_at is not None else len(self.fs.history)
        i = self.acked_by(at)
        models = [self.model(i)[0]] + ([self.model(i + 1)[0]] if i < len(self.ops) else [])
        store = self.open_store(state, tidelog.FakeClock(self.model(i)[1].now_ms()))
        try:
            for name in store.topics():
                t = store.topic(name, create=False)
                for sub in t.subscribers():
                    no_silent_skip(t, sub, models, name, state.description)
        finally:
            store.close()

    def _compare(
        self,
        got: dict[str, TopicView],
        model_i: ModelStore,
        model_next: ModelStore | None,
        clock: Clock,
        where: str,
    ) -> None:
        hows = compare_recovered_ring(
            got, model_i, model_next, clock, where, ring_full=self.ring_full
        )
        self.relaxed += any(how != "exact" for how in hows)


def compare_recovered_ring(
    got: dict[str, TopicView],
    model_i: ModelStore,
    model_next: ModelStore | None,
    clock: Clock,
    where: str,
    *,
    ring_full: bool = False,
) -> list[str]:
    """``crashcheck.compare_recovered`` for an at-least-once ring (``exact_progress`` False):
    the exact comparison, else each topic judged by ``allowed_as`` (BDEV-16, BDEV-17) and its
    subscribers by ``check_progress`` (DUR-9). Returns how each topic was allowed ("exact" for
    all when the exact comparison held); AssertionError otherwise."""
    try:
        compare_recovered(got, model_i, model_next, clock, where)
        return ["exact"] * len(got)
    except AssertionError:
        pass
    models = [m for m in (model_i, model_next) if m is not None]
    required = set(model_i.topics) & set(models[-1].topics)
    assert required <= set(got), f"acknowledged topics {required - set(got)} lost: {where}"
    hows = []
    for name, view in got.items():
        try:
            _, how = allowed_as(name, view, models, clock, ring_full=ring_full)
        except AssertionError as exc:
            raise AssertionError(f"{exc}: {where}") from None
        hows.append(how)
        check_progress(name, view, model_i, model_next, where)
    return hows
