"""Spec by example: one or more small deterministic scenarios per rule of spec/SPEC.md §1-§6,
run against the memory backend and the reference model alike. (The stateful suite in
tests/stateful explores combinations; these pin each rule down readably.)"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

import tidelog
from tidelog import Backpressure, FakeClock, Record, Tombstone, TopicState
from tidelog.hooks import Abandon, EngineTopics, hooks

BACKENDS = ["memory", "model"]


@pytest.fixture(params=BACKENDS)
def scheme(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock(1_000)


@pytest.fixture
def store(scheme: str, clock: FakeClock) -> Iterator[tidelog.Store]:
    with tidelog.open(f"{scheme}://", clock=clock) as s:
        yield s


def seqs(items: list[object]) -> list[object]:
    return [
        i.seq if isinstance(i, Record) else ("T", i.gap_from, i.gap_to)  # type: ignore[union-attr]
        for i in items
    ]


# -- TOP ------------------------------------------------------------------------------------


def test_TOP_1_seqs_start_at_1_and_are_gapless(store: tidelog.Store) -> None:
    """TOP-1: seqs start at 1 and are gapless."""
    t = store.topic("t")
    assert t.append(b"a") == 1
    assert t.append_many([b"b", b"c"]) == [2, 3]
    assert t.append(b"d") == 4
    assert t.state().head_seq == 4


def test_TOP_2_floor_order_holds_through_eviction_and_deletes(store: tidelog.Store) -> None:
    """TOP-2: floor order holds through eviction and deletes."""
    t = store.topic("t", cap_records=3)
    for i in range(10):
        t.append(bytes([i]), tag="x" if i % 2 else None)
        st = t.state()
        assert 1 <= st.evict_floor <= st.earliest_seq <= st.head_seq + 1
    t.delete(tag="x")
    st = t.state()
    assert 1 <= st.evict_floor <= st.earliest_seq <= st.head_seq + 1


def test_TOP_3_state_counts_live_records_exactly(store: tidelog.Store) -> None:
    """TOP-3: state counts live records exactly."""
    t = store.topic("t")
    t.append_many([b"aa", b"bbb", b"c"])
    t.delete(2)
    assert t.state() == TopicState(head_seq=3, earliest_seq=2, evict_floor=1, count=2, bytes=4)
    t.delete(4)
    assert t.state() == TopicState(head_seq=3, earliest_seq=4, evict_floor=1, count=0, bytes=0)


def test_TOP_4_floors_never_decrease(store: tidelog.Store, clock: FakeClock) -> None:
    """TOP-4: floors never decrease."""
    t = store.topic("t", cap_records=2, ttl_ms=50)
    prev = t.state()
    for i in range(12):
        t.append(bytes([i]))
        if i % 3 == 0:
            clock.advance(30)
        cur = t.state()
        assert cur.head_seq >= prev.head_seq
        assert cur.earliest_seq >= prev.earliest_seq
        assert cur.evict_floor >= prev.evict_floor
        prev = cur


def test_TOP_5_records_are_byte_identical_and_ts_clamped(
    store: tidelog.Store, clock: FakeClock
) -> None:
    """TOP-5: records are byte identical and ts clamped."""
    t = store.topic("t")
    t.append(b"\x00\xffpayload", tag="sensor-7", node="n1")
    clock.set(500)  # the injected clock steps backwards
    t.append(b"later")
    a, b = t.read()
    assert a == Record(1, 1_000, "sensor-7", "n1", b"\x00\xffpayload")
    assert b.ts == 1_000  # clamped: ts never decreases along seq


def test_TOP_6_append_many_is_atomic(store: tidelog.Store) -> None:
    """TOP-6: append many is atomic."""
    t = store.topic("t", cap_records=3, discard="reject")
    t.append_many([b"a", b"b"])
    with pytest.raises(tidelog.TopicFull):
        t.append_many([b"c", b"d"])  # would need 4 slots: nothing is appended
    assert t.state().head_seq == 2
    assert t.append_many([]) == []
    assert t.append(bytearray(b"x")) == 3 and t.read(2)[0].payload == b"x"
    with pytest.raises(tidelog.BadName):
        t.append(b"x", tag="")


def test_TOP_7_read_bounds_order_and_node_filter(store: tidelog.Store) -> None:
    """TOP-7: read bounds order and node filter."""
    t = store.topic("t")
    for i in range(6):
        t.append(bytes([i]), node="a" if i % 2 else "b")
    assert seqs(t.read(after=2, limit=2)) == [3, 4]
    assert seqs(t.read(after=0, exclude_node="a")) == [1, 3, 5]
    assert seqs(t.read(after=0, limit=2, exclude_node="b")) == [2, 4]  # skipped ones don't count
    assert t.read(after=99) == []
    with pytest.raises(tidelog.BadArgument):
        t.read(after=-1)
    with pytest.raises(tidelog.BadArgument):
        t.read(limit=0)


def test_TOP_8_cursor_reading_sees_every_record_once(store: tidelog.Store) -> None:
    """TOP-8: cursor reading sees every record once."""
    t = store.topic("t")
    t.append_many([bytes([i]) for i in range(20)])
    t.delete(tag="none-match")
    t.delete(5)
    seen: list[int] = []
    cursor = 0
    while True:
        items = t.read(after=cursor, limit=3)
        if not items:
            break
        seen += [i.seq for i in items if isinstance(i, Record)]
        last = items[-1]
        cursor = last.gap_to if isinstance(last, Tombstone) else last.seq
    assert seen == list(range(5, 21))


def test_TOP_9_config_is_fixed_at_creation(store: tidelog.Store) -> None:
    """TOP-9: config is fixed at creation."""
    store.topic("t", cap_records=5, durability="disk")
    assert store.topic("t").config.cap_records == 5  # keys not passed keep stored values
    assert store.topic("t", cap_records=5).config.durability == "disk"
    with pytest.raises(tidelog.ConfigMismatch):
        store.topic("t", cap_records=6)
    with pytest.raises(tidelog.NoSuchTopic):
        store.topic("missing", create=False)
    with pytest.raises(tidelog.BadOption):
        store.topic("u", cap_recrods=5)
    assert store.topics() == ["t"]


def test_TOP_10_drop_and_recreate_is_a_new_incarnation(store: tidelog.Store) -> None:
    """TOP-10: drop and recreate is a new incarnation."""
    old = store.topic("t")
    old.append(b"a")
    sub = old.subscribe("s")
    store.drop_topic("t")
    new = store.topic("t")
    assert new.append(b"b") == 1
    with pytest.raises(tidelog.NoSuchTopic):
        old.append(b"x")
    with pytest.raises(tidelog.NoSuchTopic):
        sub.poll()
    assert new.subscribers() == []
    with pytest.raises(tidelog.NoSuchTopic):
        store.drop_topic("nope")


# -- TMB ------------------------------------------------------------------------------------


def test_TMB_1_prefix_eviction_yields_a_tombstone_first(store: tidelog.Store) -> None:
    """TMB-1: prefix eviction yields a tombstone first."""
    t = store.topic("t", cap_records=3)
    t.append_many([bytes([i]) for i in range(3)])
    t.append_many([b"x", b"y"])  # evicts 1, 2
    assert t.state().evict_floor == 3
    assert seqs(t.read(after=0)) == [("T", 1, 2), 3, 4, 5]
    assert seqs(t.read(after=1)) == [("T", 2, 2), 3, 4, 5]
    assert seqs(t.read(after=2)) == [3, 4, 5]


def test_TMB_2_loss_ranges_are_model_level(scheme: str) -> None:
    """TMB-2 loss ranges only arise from crash recovery (DUR-3); the crash suite exercises them
    on the model (tests/crash/test_model_crash.py). Here: a backend without crashes never
    reports one."""
    with tidelog.open(f"{scheme}://", clock=FakeClock()) as s:
        t = s.topic("t")
        t.append_many([b"a", b"b"])
        assert all(isinstance(i, Record) for i in t.read())


def test_TMB_3_no_silent_loss_for_any_cursor(store: tidelog.Store) -> None:
    """TMB-3: no silent loss for any cursor."""
    t = store.topic("t", cap_records=4)
    t.append_many([bytes([i]) for i in range(4)])
    t.delete(tag="zzz")
    for i in range(5):
        t.append(bytes([i]))
    st = t.state()
    evicted = set(range(1, st.evict_floor))
    for after in range(0, st.head_seq + 1):
        items = t.read(after=after, limit=2)
        covered: set[int] = set()
        for item in items:
            if isinstance(item, Tombstone):
                covered |= set(range(item.gap_from, item.gap_to + 1))
        end = max((i.gap_to if isinstance(i, Tombstone) else i.seq for i in items), default=after)
        assert {q for q in evicted if after < q <= end} <= covered


def test_TMB_4_voluntary_deletes_read_silently(store: tidelog.Store) -> None:
    """TMB-4: voluntary deletes read silently."""
    t = store.topic("t")
    t.append_many([b"a", b"b", b"c", b"d"])
    t.delete(3)
    assert t.state().evict_floor == 1
    assert seqs(t.read(after=0)) == [3, 4]


def test_TMB_5_tombstone_counts_against_limit(store: tidelog.Store) -> None:
    """TMB-5: tombstone counts against limit."""
    t = store.topic("t", cap_records=2)
    t.append_many([b"a", b"b"])
    t.append_many([b"c", b"d"])
    assert seqs(t.read(after=0, limit=1)) == [("T", 1, 2)]
    assert seqs(t.read(after=0, limit=2)) == [("T", 1, 2), 3]


# -- DEL ------------------------------------------------------------------------------------


def test_DEL_1_before_seq_is_clamped_to_existing_records(store: tidelog.Store) -> None:
    """DEL-1: before seq is clamped to existing records."""
    t = store.topic("t")
    t.append_many([b"a", b"b", b"c"])
    assert t.delete(100) == 3
    assert t.append(b"d") == 4 and seqs(t.read()) == [4]  # later appends unaffected


def test_DEL_2_exact_tag(store: tidelog.Store) -> None:
    """DEL-2: exact tag."""
    t = store.topic("t")
    t.append(b"1", tag="a")
    t.append(b"2", tag="ab")
    t.append(b"3")
    t.append(b"4", tag="a")
    assert t.delete(tag="a") == 2
    assert seqs(t.read()) == [2, 3]
    assert t.delete(3, tag="ab") == 1


def test_DEL_3_tag_glob(store: tidelog.Store) -> None:
    """DEL-3: tag glob."""
    t = store.topic("t")
    for tag in ["sensor-1", "sensor-22", "pump-1", "Sensor-3", None]:
        t.append(b"x", tag=tag)
    assert t.delete(tag_glob="sensor-?") == 1
    assert t.delete(tag_glob="*-[12]*") == 2  # sensor-22, pump-1
    assert [r.tag for r in t.read()] == ["Sensor-3", None]


def test_DEL_4_deletes_never_move_the_evict_floor(store: tidelog.Store) -> None:
    """DEL-4: deletes never move the evict floor."""
    t = store.topic("t")
    t.append_many([b"a", b"b", b"c"])
    assert t.delete(tag="nothing") == 0
    assert t.delete(3) == 2
    st = t.state()
    assert st.evict_floor == 1 and st.earliest_seq == 3


def test_DEL_5_tag_deletes_use_the_index_not_a_scan() -> None:
    """DEL-5: Engine-specific: the work done is proportional to matches, not to the topic size."""
    with tidelog.open("memory://", clock=FakeClock()) as s:
        t = s.topic("t")
        t.append_many([b"x"] * 50_000)
        t.append(b"y", tag="needle")
        t.append(b"z", tag="nettle")
        log = hooks(s, EngineTopics).topics["t"].log
        before = log.examined
        assert t.delete(tag_glob="nee*") == 1
        assert t.delete(tag="nettle") == 1
        assert log.examined - before <= 4


def test_DEL_6_bad_delete_arguments_delete_nothing(store: tidelog.Store) -> None:
    """DEL-6: bad delete arguments delete nothing."""
    t = store.topic("t")
    t.append(b"a", tag="x")
    for kwargs in ({}, {"tag": "x", "tag_glob": "x*"}, {"before_seq": 0}):
        with pytest.raises(tidelog.BadArgument):
            t.delete(**kwargs)  # type: ignore[arg-type]
    assert t.state().count == 1


# -- RET ------------------------------------------------------------------------------------


def test_RET_1_caps_always_hold(store: tidelog.Store) -> None:
    """RET-1: caps always hold."""
    t = store.topic("t", cap_records=3, cap_bytes=10)
    for i in range(8):
        t.append(bytes(i % 5))
        st = t.state()
        assert st.count <= 3 and st.bytes <= 10


def test_RET_2_discard_old_evicts_as_few_as_needed(store: tidelog.Store) -> None:
    """RET-2: discard old evicts as few as needed."""
    t = store.topic("t", cap_bytes=6)
    t.append_many([b"aa", b"bb", b"cc"])
    t.append(b"ddd")  # must drop 2 records (4 bytes) to fit 3 more
    assert seqs(t.read()) == [("T", 1, 2), 3, 4]


def test_RET_3_discard_reject_refuses_before_assigning_a_seq(store: tidelog.Store) -> None:
    """RET-3: discard reject refuses before assigning a seq."""
    t = store.topic("t", cap_records=2, discard="reject")
    t.append_many([b"a", b"b"])
    with pytest.raises(tidelog.TopicFull):
        t.append(b"c")
    assert t.state().head_seq == 2 and seqs(t.read()) == [1, 2]
    t.delete(2)
    assert t.append(b"c") == 3  # room again; seq 3, never reused


def test_RET_4_ttl_is_applied_lazily_at_every_op(store: tidelog.Store, clock: FakeClock) -> None:
    """RET-4: ttl is applied lazily at every op."""
    t = store.topic("t", ttl_ms=100)
    t.append(b"a")
    clock.advance(50)
    t.append(b"b")
    clock.advance(49)
    assert t.state().count == 2
    clock.advance(1)  # ts(a) + ttl == now: expired
    assert t.state().count == 1
    assert seqs(t.read()) == [("T", 1, 1), 2]


def test_RET_5_oversized_records_and_batches(store: tidelog.Store) -> None:
    """RET-5: oversized records and batches."""
    t = store.topic("t", cap_records=2, cap_bytes=8)
    with pytest.raises(tidelog.TooLarge):
        t.append(b"123456789")
    with pytest.raises(tidelog.TooLarge):
        t.append_many([b"a", b"b", b"c"])
    assert t.state().head_seq == 0


def test_RET_6_store_max_bytes(scheme: str) -> None:
    """RET-6: store max bytes."""
    with tidelog.open(f"{scheme}://?max_bytes=10", clock=FakeClock()) as s:
        s.topic("a").append(b"123456")
        with pytest.raises(tidelog.StoreFull):
            s.topic("b").append(b"12345")
        s.topic("b").append(b"1234")


def test_RET_7_error_precedence(scheme: str) -> None:
    """RET-7: error precedence."""
    with tidelog.open(f"{scheme}://?max_bytes=4&max_record_bytes=8", clock=FakeClock()) as s:
        t = s.topic("t", cap_records=1, cap_bytes=6, discard="reject")
        with pytest.raises(tidelog.TooLarge):
            t.append(b"123456789")  # over max_record_bytes, also over everything else
        with pytest.raises(tidelog.TooLarge):
            t.append(b"1234567")  # over cap_bytes and store: caps checked first
        with pytest.raises(tidelog.StoreFull):
            t.append(b"12345")  # fits the topic caps, not the store
        t.append(b"12")
        with pytest.raises(tidelog.TopicFull):
            t.append(b"1")


# -- SUB ------------------------------------------------------------------------------------


def test_SUB_1_registration_start_positions(store: tidelog.Store) -> None:
    """SUB-1: registration start positions."""
    t = store.topic("t", trim="none")
    t.append_many([b"a", b"b", b"c"])
    t.delete(2)
    assert t.subscribe("new-latest", start="latest").hwm == 3
    assert t.subscribe("new-resume").hwm == 3
    assert t.subscribe("from-start", start="earliest").hwm == 1
    t.subscribe("from-start").ack(2)
    assert t.subscribe("from-start", start="latest").hwm == 2  # existing: resumes
    for bad in ("", "a/b", "con", "x" * 65):
        with pytest.raises(tidelog.BadName):
            t.subscribe(bad)


def test_SUB_2_hwm_advances_over_contiguous_resolved_seqs(store: tidelog.Store) -> None:
    """SUB-2: hwm advances over contiguous resolved seqs."""
    t = store.topic("t", trim="none")
    s = t.subscribe("s")
    t.append_many([b"1", b"2", b"3", b"4", b"5"])
    assert s.ack(3) and s.hwm == 0
    assert s.reject(1) and s.hwm == 1
    t.delete(tag="nope")
    assert s.ack(2) and s.hwm == 3
    t.delete(5)  # 4 deleted: resolved silently
    assert s.hwm == 4
    assert s.ack(5) and s.hwm == 5


def test_SUB_3_ack_reject_commit(store: tidelog.Store) -> None:
    """SUB-3: ack reject commit."""
    t = store.topic("t", trim="none")
    s = t.subscribe("s")
    t.append_many([b"1", b"2", b"3"])
    assert s.ack(2) is True and s.ack(2) is False
    assert s.reject(2) is False
    with pytest.raises(tidelog.BadArgument):
        s.ack(4)
    assert s.commit(3) == 2 and s.hwm == 3
    assert s.commit(1) == 0


def test_SUB_4_poll_order_cursor_and_redelivery_by_cursor(store: tidelog.Store) -> None:
    """SUB-4: poll order cursor and redelivery by cursor."""
    t = store.topic("t", trim="none")
    s = t.subscribe("s")
    t.append_many([b"1", b"2", b"3", b"4"])
    assert seqs(s.poll(2)) == [1, 2]
    s.ack(4)
    assert seqs(s.poll(5)) == [3]  # 4 resolved: skipped
    assert s.poll() == []
    with pytest.raises(tidelog.BadArgument):
        s.poll(0)


def test_SUB_5_trim_removes_what_every_subscriber_consumed(store: tidelog.Store) -> None:
    """SUB-5: trim removes what every subscriber consumed."""
    t = store.topic("t")
    t.append_many([b"old1", b"old2"])
    a = t.subscribe("a", start="latest")  # registering never deletes existing data
    assert t.state().count == 2
    t.append_many([b"3", b"4", b"5"])
    b = t.subscribe("b", start="earliest")
    a.commit(4)
    assert t.state().count == 5  # b has not consumed anything yet
    b.commit(3)
    assert seqs(t.read()) == [4, 5]  # (min base=0, min hwm=3] trimmed: silent (TMB-4)
    b.unregister()
    assert seqs(t.read()) == [5]  # now only a: (2, 4] trimmed


def test_SUB_6_backpressure_refuses_eviction_of_unresolved(store: tidelog.Store) -> None:
    """SUB-6: backpressure refuses eviction of unresolved."""
    t = store.topic("t", cap_records=2, retention="backpressure")
    s = t.subscribe("s")
    t.append_many([b"1", b"2"])
    with pytest.raises(Backpressure):
        t.append(b"3")
    assert t.state().head_seq == 2
    s.ack(1)  # trim="acked": seq 1 is trimmed, making room
    assert t.append(b"3") == 3


def test_SUB_7_drop_oldest_gives_subscriber_a_tombstone(store: tidelog.Store) -> None:
    """SUB-7: drop oldest gives subscriber a tombstone."""
    t = store.topic("t", cap_records=2, retention="drop_oldest")
    s = t.subscribe("s")
    t.append_many([b"1", b"2"])
    assert seqs(s.poll(1)) == [1]
    t.append_many([b"3", b"4"])  # evicts 1 (delivered, unacked) and 2
    assert s.hwm == 2  # never frozen on dropped records
    assert seqs(s.poll()) == [("T", 1, 2), 3, 4]
    assert seqs(s.poll()) == []


def test_SUB_8_unregister(store: tidelog.Store) -> None:
    """SUB-8: unregister."""
    t = store.topic("t")
    s = t.subscribe("s")
    s.unregister()
    with pytest.raises(tidelog.NoSuchSubscriber):
        s.poll()
    assert t.subscribers() == []


def test_SUB_9_restart_resets_the_cursor_to_the_hwm(scheme: str) -> None:
    """SUB-9: restart resets the cursor to the hwm."""
    uri = f"{scheme}://sub9-{uuid.uuid4().hex[:8]}"
    clock = FakeClock()
    with tidelog.open(uri, clock=clock) as store:
        t = store.topic("t", trim="none")
        s = t.subscribe("s")
        t.append_many([b"1", b"2", b"3"])
        assert seqs(s.poll()) == [1, 2, 3]
        s.ack(1)
        s.flush()
    with tidelog.open(uri, clock=clock) as store:
        assert seqs(store.topic("t").subscribe("s").poll()) == [2, 3]


# -- QUE ------------------------------------------------------------------------------------


def test_QUE_1_reclaimed_jobs_come_before_fresh_ones(store: tidelog.Store) -> None:
    """QUE-1: reclaimed jobs come before fresh ones."""
    t = store.topic("jobs")
    t.append_many([b"1", b"2", b"3", b"4"])
    a, b = t.claim("w", max=2)
    t.release(b.seq, b.lease_id)
    t.release(a.seq, a.lease_id)
    got = t.claim("w", max=3)
    assert [x.seq for x in got] == [1, 2, 3]
    assert [x.lease_id for x in got] == [3, 4, 5]  # unique, increasing


def test_QUE_2_one_lease_per_job(store: tidelog.Store, clock: FakeClock) -> None:
    """QUE-2: one lease per job."""
    t = store.topic("jobs", lease_ms=100)
    t.append(b"j")
    (lease,) = t.claim("w1")
    assert t.claim("w2") == []
    clock.advance(99)
    assert t.claim("w2") == []
    clock.advance(1)  # deadline reached: lease invalid, job reclaimable
    (again,) = t.claim("w2")
    assert again.seq == lease.seq and again.lease_id != lease.lease_id


def test_QUE_3_complete_deletes_and_stale_leases_fail(store: tidelog.Store) -> None:
    """QUE-3: complete deletes and stale leases fail."""
    t = store.topic("jobs")
    t.append_many([b"1", b"2"])
    (lease,) = t.claim("w")
    t.complete(lease.seq, lease.lease_id)
    assert seqs(t.read()) == [2] and t.state().evict_floor == 1
    for call in (t.complete, t.release, t.nack):
        with pytest.raises(tidelog.LeaseLost):
            call(lease.seq, lease.lease_id)


def test_QUE_4_release_and_delayed_nack(store: tidelog.Store, clock: FakeClock) -> None:
    """QUE-4: release and delayed nack."""
    t = store.topic("jobs")
    t.append_many([b"1", b"2"])
    a, b = t.claim("w", max=2)
    t.nack(a.seq, a.lease_id, delay_ms=50)
    t.release(b.seq, b.lease_id)
    assert [x.seq for x in t.claim("w", max=2)] == [2]
    clock.advance(50)
    assert [x.seq for x in t.claim("w", max=2)] == [1]


def test_QUE_5_expiry_is_driven_by_the_injected_clock(
    store: tidelog.Store, clock: FakeClock
) -> None:
    """QUE-5: expiry is driven by the injected clock."""
    t = store.topic("jobs", lease_ms=10)
    t.append(b"j")
    t.claim("w")
    clock.advance(10)
    (lease,) = t.claim("w", lease_ms=5)
    assert lease.deadline_ms == clock.now_ms() + 5


def test_QUE_6_delivery_counts(store: tidelog.Store, clock: FakeClock) -> None:
    """QUE-6: delivery counts."""
    t = store.topic("jobs", lease_ms=10)
    t.append(b"j")
    counts = []
    for _ in range(3):
        (lease,) = t.claim("w")
        counts.append(lease.deliveries)
        clock.advance(10)
    assert counts == [1, 2, 3]


def test_QUE_7_dead_letter_after_max_deliveries(store: tidelog.Store) -> None:
    """QUE-7: dead letter after max deliveries."""
    t = store.topic("jobs", max_deliveries=2, dead_letter="jobs.dead")
    t.append(b"poison", tag="p")
    for _ in range(2):
        (lease,) = t.claim("w")
        t.nack(lease.seq, lease.lease_id)
    assert t.claim("w") == []
    dead = store.topic("jobs.dead", create=False)
    assert [(r.payload, r.tag) for r in dead.read()] == [(b"poison", "p")]
    assert t.state().count == 0
    with pytest.raises(tidelog.BadOption):
        store.topic("bad", max_deliveries=1)  # dead_letter required


def test_QUE_7_refused_dead_letter_parks_the_job(store: tidelog.Store) -> None:
    """QUE-7: refused dead letter parks the job."""
    store.topic("dead", cap_records=1, discard="reject").append(b"full")
    t = store.topic("jobs", max_deliveries=1, dead_letter="dead")
    t.append(b"poison")
    (lease,) = t.claim("w")
    t.release(lease.seq, lease.lease_id)
    assert t.claim("w") == []  # parked: never handed out again
    store.topic("dead").delete(2)
    assert t.claim("w") == []  # moved on this claim
    assert [r.payload for r in store.topic("dead").read()] == [b"poison"]


def test_QUE_8_restart_ends_every_lease(scheme: str) -> None:
    """QUE-8: restart ends every lease."""
    uri = f"{scheme}://que8-{uuid.uuid4().hex[:8]}"
    clock = FakeClock()
    with tidelog.open(uri, clock=clock) as store:
        t = store.topic("jobs", lease_ms=1_000_000)
        t.append_many([b"1", b"2"])
        t.claim("w", max=2)
    with tidelog.open(uri, clock=clock) as store:
        got = store.topic("jobs").claim("w", max=2)
        assert [(x.seq, x.deliveries) for x in got] == [(1, 2), (2, 2)]


def test_TOP_11_idempotent_producer_batches(store: tidelog.Store) -> None:
    """TOP-11: a producer's batch is applied at most once per sequence; retries return []."""
    t = store.topic("t")
    assert t.append_many([b"a", b"b"], producer=("p", 1)) == [1, 2]
    assert t.append_many([b"a", b"b"], producer=("p", 1)) == []  # retry: nothing appended
    assert t.append_many([b"c"], producer=("q", 1)) == [3]  # producers are independent
    assert t.append_many([b"d"], producer=("p", 5)) == [4]  # gaps are allowed
    assert t.append_many([b"x"], producer=("p", 3)) == []  # older than the mark
    assert t.state().head_seq == 4
    for bad in (("", 1), ("p", 0), ("p",), ("p", "1"), "p"):
        with pytest.raises(tidelog.BadArgument):
            t.append_many([b"y"], producer=bad)  # type: ignore[arg-type]


def test_TOP_11_producer_marks_survive_restart(tmp_path: Path) -> None:
    """TOP-11: a file store remembers producer marks across a restart and across a crash."""
    uri = f"file://{tmp_path / 's'}"
    with tidelog.open(uri) as s:
        assert s.topic("t").append_many([b"a"], producer=("sender-1", 7)) == [1]
    with tidelog.open(uri) as s:
        assert s.topic("t").append_many([b"a"], producer=("sender-1", 7)) == []
        s.topic("t").append_many([b"b"], producer=("sender-1", 8))
        hooks(s, Abandon).abandon()  # as if killed: WAL replay only
    with tidelog.open(uri) as s:
        assert s.topic("t").append_many([b"b"], producer=("sender-1", 8)) == []
        assert [r.payload for r in s.topic("t").read()] == [b"a", b"b"]  # type: ignore[union-attr]


def test_TOP_6_append_records_with_per_record_labels(store: tidelog.Store) -> None:
    """TOP-6: append_records is one atomic append where each record keeps its own tag/node."""
    t = store.topic("t", cap_records=3, discard="reject")
    seqs = t.append_records([(b"a", "x", None), (b"b", "x", "n1"), (b"c", None, None)])
    assert seqs == [1, 2, 3]
    assert [(r.tag, r.node) for r in t.read()] == [("x", None), ("x", "n1"), (None, None)]  # type: ignore[union-attr]
    with pytest.raises(tidelog.TopicFull):
        t.append_records([(b"d", "y", None)])
    assert t.delete(tag="x") == 2
    assert t.append_records([(b"e", "y", None), (b"f", "z", None)], producer=("p", 1)) == [4, 5]
    assert t.append_records([(b"e", "y", None)], producer=("p", 1)) == []
    with pytest.raises(tidelog.BadArgument):
        t.append_records([(b"g", "y")])  # type: ignore[list-item]
