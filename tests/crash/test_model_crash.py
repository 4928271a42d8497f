"""The crash semantics of the model (spec §7, DUR-2..DUR-6, DUR-9, TMB-2): which states a topic
may legally recover to. These are the oracle the crash simulation of durable backends checks
against (``tidelog.conformance.crashcheck`` checks real recoveries against the same candidate
sets)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

import tidelog
from tidelog import FakeClock, Record, Tombstone
from tidelog.hooks import hooks
from tidelog.model import ModelStore, TopicModel


def _store() -> tuple[tidelog.Store, ModelStore, FakeClock]:
    clock = FakeClock()
    store = tidelog.open("model://", clock=clock)
    return store, hooks(store, ModelStore), clock


def _records(t: TopicModel) -> list[tuple[int, bytes]]:
    return [(q, t.records[q].payload) for q in sorted(t.records)]


def test_DUR_2_fsync_topic_has_exactly_one_recovery_state() -> None:
    """DUR-2: fsync topic has exactly one recovery state."""
    store, model, _ = _store()
    t = store.topic("t", durability="fsync")
    t.append_many([b"a", b"b"])
    t.delete(2)
    t.append(b"c")
    (only,) = model.crash_candidates("t")
    assert _records(only) == [(2, b"b"), (3, b"c")]
    assert only.state() == t.state()


def test_DUR_3_disk_topic_loses_a_suffix_as_a_tombstone_without_seq_reuse() -> None:
    """DUR-3: disk topic loses a suffix as a tombstone without seq reuse."""
    store, model, _ = _store()
    t = store.topic("t", durability="disk")
    t.append(b"a")
    store.flush()  # DUR-7: everything so far is durable
    t.append(b"b")
    t.append(b"c")
    cands = model.crash_candidates("t")
    assert [sorted(c.records) for c in cands] == [[1], [1, 2], [1, 2, 3]]
    for c in cands:
        assert c.head == 3  # never regresses
    lossy = cands[0]
    assert lossy.losses == [(2, 3)]
    # TMB-2: a reader crossing the loss range is told about it
    scratch = ModelStore(FakeClock(), model.options)
    scratch.topics = {"t": lossy}
    ref = tidelog.TopicRef("t", lossy.incarnation)
    assert scratch.read(ref, 0, 10, None) == [
        Record(1, lossy.records[1].ts, None, None, b"a"),
        Tombstone(2, 3),
    ]
    assert scratch.read(ref, 2, 10, None) == [Tombstone(3, 3)]
    lossy.check_invariants()


def test_DUR_4_memory_topic_head_may_regress() -> None:
    """DUR-4: memory topic head may regress."""
    store, model, _ = _store()
    t = store.topic("t", durability="memory")
    t.append_many([b"a", b"b"])
    heads = sorted({c.head for c in model.crash_candidates("t")})
    assert heads == [0, 2]  # the create state, then after the batch


def test_DUR_5_ephemeral_topic_keeps_only_its_head() -> None:
    """DUR-5: ephemeral topic keeps only its head."""
    store, model, _ = _store()
    t = store.topic("t", durability="ephemeral")
    s = t.subscribe("s")
    t.append_many([b"a", b"b", b"c"])
    (only,) = model.crash_candidates("t")
    assert only.records == {} and only.head == 3
    assert only.evict_floor == 4 and only.earliest == 4
    assert only.subs["s"].gaps == [(1, 3)]  # SUB-7: the subscriber is told
    del s


def test_DUR_6_every_candidate_is_a_prefix_with_unchanged_payloads() -> None:
    """DUR-6: every candidate is a prefix with unchanged payloads."""
    store, model, clock = _store()
    t = store.topic("t", durability="memory", cap_records=3)
    appended: dict[int, bytes] = {}
    for i in range(8):
        payload = bytes([i]) * (i + 1)
        appended[t.append(payload)] = payload
        clock.advance(1)
    for c in model.crash_candidates("t"):
        for q, rec in c.records.items():
            assert appended[q] == rec.payload  # never a corrupted or invented record
        live = sorted(c.records)
        assert live == list(range(live[0], live[-1] + 1)) if live else True  # no middle hole
        c.check_invariants()


def test_DUR_9_subscriber_hwm_bounds() -> None:
    """DUR-9: subscriber hwm bounds."""
    store, model, _ = _store()
    t = store.topic("t", durability="fsync", trim="none")
    s = t.subscribe("s")
    t.append_many([b"1", b"2", b"3", b"4"])
    s.ack(1)
    s.flush()
    s.commit(3)
    assert model.hwm_bounds("t", "s") == (1, 3)


def test_DUR_1_clean_restart_loses_only_ephemeral_records() -> None:
    """DUR-1: clean restart loses only ephemeral records."""
    clock = FakeClock()
    with tidelog.open("model://dur1", clock=clock) as store:
        for cls in tidelog.DURABILITY_CLASSES:
            store.topic(cls, durability=cls).append_many([b"x", b"y"])
    with tidelog.open("model://dur1", clock=clock) as store:
        for cls in tidelog.DURABILITY_CLASSES:
            st = store.topic(cls).state()
            assert st.head_seq == 2
            assert st.count == (0 if cls == "ephemeral" else 2)
            if cls == "ephemeral":
                assert store.topic(cls).read() == [Tombstone(1, 2)]
    from tidelog.model import forget

    forget("dur1")


@settings(max_examples=60, deadline=None)
@given(
    ops=st.lists(st.sampled_from(["append", "delete", "flush", "ack"]), max_size=12),
    cls=st.sampled_from(["fsync", "disk", "memory"]),
)
def test_DUR_3_DUR_4_candidates_include_every_flushed_state(ops: list[str], cls: str) -> None:
    """DUR-3, DUR-4: every candidate is at or after the last flush (DUR-7), and the pre-crash
    state itself is always a candidate."""
    store, model, _ = _store()
    t = store.topic("t", durability=cls, trim="none")
    s = t.subscribe("s")
    flushed_head = 0
    live_at_flush: set[int] = set()
    for op in ops:
        if op == "append":
            t.append(b"p")
        elif op == "delete":
            t.delete(t.state().head_seq // 2 + 1)
        elif op == "ack" and t.state().head_seq:
            s.ack(t.state().head_seq)
        else:
            store.flush()
            flushed_head = t.state().head_seq
            live_at_flush = set(model.topics["t"].records)
    cands = model.crash_candidates("t")
    final = model.topics["t"]
    assert any(_records(c) == _records(final) for c in cands)
    for c in cands:
        assert c.head >= flushed_head, f"candidate head {c.head} lost flushed seqs"
        kept = live_at_flush & set(final.records)  # live at the flush and never removed since
        assert kept <= set(c.records), f"flushed records {kept - set(c.records)} missing"
        c.check_invariants()
