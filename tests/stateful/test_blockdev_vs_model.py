"""The stateful suite against the blockdev backend (spec: TOP/TMB/RET/SUB rules, DUR-1 through real
close + reopen of an image, and DUR-2/DUR-4/DUR-6/DUR-9 through simulated power loss between two
ops; CAP-2 exempts DEL-* and QUE-* (the machine reads Store.capabilities: no delete or queue
rules, one topic, the durability classes the ring offers).

Power loss (``power_loss``): the store is dropped without writing anything (what a killed
process or a power cut between two ops leaves: every write the ring issued was already synced),
then the image is reopened. The recovered topic must be a state the crash rules allow
(tidelog.conformance.ringcrash.allowed_as: exactly a model crash candidate, or one changed only
as BDEV-17 allows), with subscriber hwms within DUR-9's bounds, no unresolved record skipped
silently (SUB-7) and producer marks kept with their records (TOP-11); the model then continues
from that state and every later op is compared exactly again. Torn writes are the crash suite's
job (tests/crash).

The ring is tiny (6 pages of 512 bytes) so it wraps within a few steps and ring overwrite
reuses pages all the time. Ring overwrite is the one effect the model cannot predict: which
records share a page depends on record sizes and commit timing. The backend reports every
overwrite that evicted live records (BDEV-16: ``ring_evictions``) and this machine applies it to
the model as the involuntary eviction the spec says it is (TMB-1, SUB-7), after checking that it
was legitimate: the ring really was full, i.e. ``page_count`` newer pages, each holding at least
one newer record, existed (``head - through >= page_count``, plus the records above ``through``
that this machine's own power-loss steps saw discarded: their pages stay in the ring until it
comes round, BDEV-16, BDEV-17). Everything else is compared exactly, with no special case.
"""

from __future__ import annotations

import atexit
import contextlib
import copy
import functools
import os
import shutil
import tempfile
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import event, given, settings
from hypothesis import strategies as st
from hypothesis.stateful import precondition, rule

from tidelog.api import Store
from tidelog.backends.blockdev import BlockdevBackend
from tidelog.conformance.crashcheck import TopicView, check_progress, observe
from tidelog.conformance.machine import LogMachine
from tidelog.conformance.ringcrash import allowed_as
from tidelog.hooks import Abandon, EngineTopics, hooks
from tidelog.model import ModelStore, SubModel, TopicModel

PAGES = 6
PAGE_SIZE = 512
SIZE = 4096 + PAGES * PAGE_SIZE
# Images on tmpfs where there is one: the machine checks semantics (power loss is simulated by
# dropping the store), and the many fdatasyncs of fsync topics cost nothing there.
_SHM = "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else None
_ROOT = tempfile.mkdtemp(prefix="tidelog-stateful-blockdev-", dir=_SHM)
atexit.register(shutil.rmtree, _ROOT, True)


class BlockdevMachine(LogMachine):
    @staticmethod
    def sut_uri(name: str) -> str:
        path = os.path.join(_ROOT, f"{name}.img")
        return f"blockdev://{path}?size={SIZE}&page_size={PAGE_SIZE}&topic=t0"

    def cleanup_sut(self, name: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(os.path.join(_ROOT, f"{name}.img"))

    # -- the model learns ring overwrites (BDEV-16): LogMachine.learn_ring checks and applies
    # -- what these hooks report
    _seen = 0

    def ring_pages(self) -> int | None:
        return PAGES

    def ring_events(self, store: Store | None = None) -> list[Any]:
        """The evictions ``store`` (default: the open one) reported since the last call."""
        backend: Any = hooks(store or self.sut, BlockdevBackend)  # eviction records name pages
        fresh = backend.ring_evictions[self._seen :]
        self._seen = len(backend.ring_evictions)
        return list(fresh)

    @rule(data=st.data(), n=st.integers(1, 4), size=st.sampled_from((60, 150, 400)))
    def fill_pages(self, data: st.DataObject, n: int, size: int) -> None:
        """BDEV-16, TMB-1, SUB-7: a batch of records of up to most of a page each, so the ring
        of 6 pages wraps within a few steps and overwriting unread pages (involuntary eviction)
        is exercised in most examples, not only in the rare long run of small records."""
        payloads = [bytes([i + 1]) * size for i in range(n)]
        self.on_topic(self.pick(data), lambda t: t.append_many(payloads))

    @precondition(lambda self: self.supports_reopen)
    @rule()
    def reopen(self) -> None:
        """DUR-1, SUB-9: clean close + reopen of the image restores everything exactly."""
        super().reopen()  # learns what the final page written at close overwrote
        self._seen = 0
        facts: Any = self.sut.describe()
        if facts["looped"]:
            event("reopened a ring that has wrapped")


    @precondition(lambda self: self.supports_reopen)
    @rule()
    def power_loss(self) -> None:
        """DUR-2, DUR-4, DUR-6, DUR-9, SUB-7, TOP-11, BDEV-17: the power fails between two ops;
        the reopened ring holds an allowed state, and the model carries on from it."""
        old = self.sut
        hooks(old, Abandon).abandon()
        self.learn_ring(self.ring_events(old))
        self._seen = 0
        self.sut = self.open_sut()
        model = hooks(self.model, ModelStore)
        got = observe(self.sut)
        assert set(got) == set(model.topics), (
            f"DUR-2: topics {sorted(got)} after power loss, {sorted(model.topics)} before"
        )
        for name, view in got.items():
            cand, how = allowed_as(name, view, [model], self.clock)
            check_progress(name, view, model, None, "power loss")
            event(f"power loss: recovered {how}")
            self.lost_power(name, model.topics[name].head, view.head)
            model.adopt(name, self._recovered(model, name, cand, view))
        self.handles = {
            n: (self.model.topic(n, create=False), self.sut.topic(n, create=False))
            for n in self.model.topics()
        }
        self.stale = []
        self.leases = []

    def _recovered(
        self, model: ModelStore, name: str, cand: TopicModel, view: TopicView
    ) -> TopicModel:
        """``cand`` as the ring recovered it: the records and floor ``view`` shows (allowed_as
        has checked them), the subscribers' progress the ring restored (checked here: DUR-9
        outcomes are a subset of those before the crash; SUB-7 nothing unresolved is skipped
        silently), its producer marks (TOP-11: kept with their records, so equal to cand's)."""
        before = model.topics[name]
        state = copy.deepcopy(cand)
        state.history = []
        live = {r.seq: r for r in view.records}
        for q in sorted(state.records):
            if q not in live:  # evicted below the floor, or trimmed again (BDEV-17)
                del state.records[q]
                state.fate[q] = "evicted" if q < view.floor else "trimmed"
        for q, r in live.items():
            if q not in state.records:  # a trim the ring had not recorded (BDEV-17)
                state.records[q] = r
                state.fate.pop(q, None)
        for q in range(view.floor):
            if q >= 1 and q not in state.fate:
                state.fate[q] = "evicted"
        state.evict_floor = view.floor
        state.losses = [(lo, hi) for lo, hi in state.losses if hi >= view.floor]
        t: Any = hooks(self.sut, EngineTopics).topics[name]
        assert t.producers == state.producers, (
            f"TOP-11: producer marks {t.producers} recovered with the records of {state.producers}"
        )
        assert sorted(t.progress.subs) == sorted(before.subs), "SUB-1: registrations are durable"
        state.subs = {}
        for sub, s in t.progress.subs.items():
            pre = before.subs[sub]
            # a memory topic may lose the records a subscriber registered after (DUR-4): its
            # base, like its hwm (DUR-9), is clamped to the recovered head
            base = min(pre.base, view.head)
            assert s.base == base, f"{name}/{sub}: base {s.base} != {base}"
            kept = {q: o for q, o in s.outcomes.items()}
            assert all(pre.outcomes.get(q) == o or q <= pre.hwm for q, o in kept.items()), (
                f"DUR-9: {name}/{sub} outcomes {kept} not among {pre.outcomes} (hwm {pre.hwm})"
            )
            gap = {q for lo, hi in s.gaps for q in range(lo, hi + 1)}
            for q in range(s.hwm + 1, view.head + 1):
                unresolved = q <= before.head and not before.resolved(pre, q)
                assert q in live or q in kept or q in gap or not unresolved, (
                    f"SUB-7: {name}/{sub} would skip unresolved seq {q} silently"
                )
            state.subs[sub] = SubModel(
                base=s.base,
                hwm=s.hwm,
                cursor=s.cursor,
                outcomes=kept,
                gaps=list(s.gaps),
                flushed_hwm=s.hwm,
            )
        return state


BlockdevMachine.TestCase.settings = settings(
    BlockdevMachine.TestCase.settings,
    max_examples=int(os.environ.get("TIDELOG_STATEFUL_EXAMPLES", "1000")) // 4,
    stateful_step_count=50,
    deadline=None,
)
TestBlockdevVsModel = BlockdevMachine.TestCase


@given(data=st.data())
@settings(max_examples=50, deadline=None)
def test_CAP_2_the_machine_reads_the_ring_capabilities(data: st.DataObject) -> None:
    """CAP-1, CAP-2: the machine takes its rules from Store.capabilities: one topic (the ring's
    binding, t0), only the classes the ring offers, no queue configuration; its delete and queue
    rules are off (their preconditions read the same flags)."""
    from tidelog.backends.blockdev import CAPABILITIES
    from tidelog.conformance.machine import topic_configs

    m = BlockdevMachine()
    try:
        assert m.caps == CAPABILITIES and m.topic_names == ("t0",)
        assert not (m.caps.deletes or m.caps.queue or m.caps.multi_topic)
        cfg = data.draw(topic_configs(m.caps, "t0"))
        assert cfg["durability"] in ("memory", "fsync") and "max_deliveries" not in cfg
    finally:
        m.teardown()


# -- examples this machine found (seed 4032979157), kept as explicit regression tests -----------
def _in_hypothesis(steps: Callable[[], None]) -> Callable[[], None]:
    """A test running fixed machine steps once inside a Hypothesis test (rules record events)."""

    @functools.wraps(steps)
    def test() -> None:
        @settings(max_examples=1, deadline=None, database=None)
        @given(st.just(None))
        def run(_: None) -> None:
            steps()

        run()

    return test


def _machine_with_t0(**cfg: Any) -> BlockdevMachine:
    m = BlockdevMachine()
    m.both(lambda s: s.topic("t0", **cfg).name)
    m.handles["t0"] = (m.model.topic("t0"), m.sut.topic("t0"))
    m.states_agree()
    return m


def _fill(m: BlockdevMachine, n: int, size: int) -> None:
    """The ``fill_pages`` rule's op."""
    payloads = [bytes([i + 1]) * size for i in range(n)]
    m.on_topic("t0", lambda t: t.append_many(payloads))
    m.states_agree()


@_in_hypothesis
def test_BDEV_16_BDEV_17_eviction_after_a_power_loss_inside_an_op() -> None:
    """BDEV-16, BDEV-17, TOP-6: a power loss inside a multi-page op discards its written pages
    (no BATCH_END reached the device) but writing resumes after them, so seq 1 is overwritten
    when only 3 pages hold records the topic still counts; the machine's bound counts the
    records its power loss discarded and accepts this visible eviction."""
    m = _machine_with_t0(durability="memory", discard="old", retention="backpressure")
    try:
        m.power_loss()
        m.states_agree()
        _fill(m, 1, 60)  # seq 1, page 0
        _fill(m, 4, 400)  # seqs 2-5: pages 1-3 written, seq 5's page still open
        m.power_loss()  # the op never completed: head back to 1, writing resumes at page 4
        m.states_agree()
        assert m.discarded == {"t0": [(2, 5)]}
        _fill(m, 2, 400)
        _fill(m, 2, 400)  # seals page 5, then page 0: seq 1 goes (head 5)
        backend: Any = hooks(m.sut, BlockdevBackend)
        assert [(e.through, e.head, e.page) for e in backend.ring_evictions] == [(1, 5, 0)]
        assert m.sut.topic("t0").read(0, 1)[0] == m.model.topic("t0").read(0, 1)[0]
        assert type(m.sut.topic("t0").read(0, 1)[0]).__name__ == "Tombstone"  # not silent
    finally:
        m.teardown()


@_in_hypothesis
def test_BDEV_16_the_bound_refuses_an_early_eviction_without_a_power_loss() -> None:
    """BDEV-16: without a power loss the bound stays head - through >= pages: the check can
    fail (an eviction the backend reports too early is caught)."""
    from tidelog.conformance.sut import RingEvent

    m = _machine_with_t0(durability="memory")
    try:
        _fill(m, 4, 400)
        with pytest.raises(AssertionError, match="BDEV-16"):
            m.learn_ring([RingEvent("t0", 1, 4)])
        m.lost_power("t0", 4, 2)  # a power loss discarding seqs 3-4 allows two more pages
        with pytest.raises(AssertionError, match="BDEV-16"):
            m.learn_ring([RingEvent("t0", 1, 4)])  # 3 + 2 < 6
        m.learn_ring([RingEvent("t0", 1, 5)])  # 4 + 2 >= 6
    finally:
        m.teardown()


@_in_hypothesis
def test_BDEV_17_SUB_7_progress_of_lost_records_does_not_cover_their_new_seqs() -> None:
    """BDEV-17, SUB-7, DUR-9: s1 registers at the head (3) of a memory topic and the slot records
    hwm 3; a power loss loses seq 3 and recovery clamps s1 to 2. Seq 3 is then assigned again to
    a new record; a second power loss must not hand s1 the slot's old hwm 3 (it would skip the
    new, unresolved seq 3 silently): recovery rewrote the slot when it clamped."""
    m = _machine_with_t0(
        durability="memory", discard="old", retention="backpressure", trim="acked", lease_ms=5
    )
    try:
        _fill(m, 2, 400)
        _fill(m, 2, 400)
        for _ in range(4):
            m.power_loss()
            m.states_agree()
        m.on_topic("t0", lambda t: t.append(b""))
        m.on_topic("t0", lambda t: t.subscribe("s1", start="resume").hwm)
        m.states_agree()
        m.power_loss()
        m.states_agree()
        _fill(m, 2, 60)
        m.on_topic("t0", lambda t: t.append_many([b"^\x05\x95\xa3\xb7"]))
        m.states_agree()
        _fill(m, 2, 150)
        m.on_topic("t0", lambda t: t.append(b"\x00\x00"))
        m.states_agree()
        m.power_loss()  # failed with "t0/s1: hwm 3 passed unresolved live records above 2"
        m.states_agree()
        assert m.sut.topic("t0").subscriber("s1").hwm == 2
    finally:
        m.teardown()
