"""Routers in the executable model (spec/SPEC.md section 16, RTR): the oracle later steps check
backends against. Topics are driven through the public API of a ``model://`` store; routers,
which the public API does not offer yet (RTR-13), through the model itself."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import tidelog
from tidelog import FakeClock, Record, Tombstone
from tidelog.backend import Capabilities
from tidelog.errors import (
    Backpressure,
    BadArgument,
    BadName,
    ConfigMismatch,
    NoSuchTopic,
    RouterFanIn,
)
from tidelog.hooks import hooks
from tidelog.model import ModelStore
from tidelog.model.log import INVOLUNTARY, VOLUNTARY
from tidelog.model.router import closes_cycle, passes
from tidelog.registry import DESCRIPTORS


def _store() -> tuple[tidelog.Store, ModelStore, FakeClock]:
    clock = FakeClock()
    store = tidelog.open("model://", clock=clock)
    return store, hooks(store, ModelStore), clock


def _payloads(t: tidelog.Topic) -> list[bytes | tuple[int, int]]:
    return [i.payload if isinstance(i, Record) else (i.gap_from, i.gap_to) for i in t.read(after=0)]


def test_RTR_1_router_create_open_and_list() -> None:
    """RTR-1: router() creates or opens and reports cursor and lag; routers() lists by name."""
    store, model, _ = _store()
    a, b = store.topic("a"), store.topic("b")
    a.append_many([b"x", b"y"])
    info = model.router("r2", "a", "b")
    assert (info.name, info.config.source, info.config.dest, info.cursor, info.lag) == (
        "r2",
        "a",
        "b",
        2,
        0,
    )
    model.router("r1", "a", "b", filter_tag="t*")
    assert [i.name for i in model.list_routers()] == ["r1", "r2"]
    assert model.router("r2", "a", "b") == model.list_routers()[1]
    a.append(b"z", tag="t1")
    assert _payloads(b) == [b"z", b"z"]  # each router forwards its own copy
    model.check_invariants()


def test_RTR_1_bad_name_and_missing_topics_change_nothing() -> None:
    """RTR-1: a bad router name is bad_name; a missing source or dest is no_such_topic, and
    neither topic is created."""
    store, model, _ = _store()
    store.topic("a")
    with pytest.raises(BadName):
        model.router("../r", "a", "a", allow_cycle=True)
    with pytest.raises(NoSuchTopic):
        model.router("r", "a", "nope")
    with pytest.raises(NoSuchTopic):
        model.router("r", "nope", "a")
    assert store.topics() == ["a"] and model.list_routers() == []


def test_RTR_2_config_fixed_at_creation() -> None:
    """RTR-2: reopening with any different argument is config_mismatch and changes nothing."""
    store, model, _ = _store()
    store.topic("a"), store.topic("b"), store.topic("c")
    stored = model.router("r", "a", "b", filter_tag="x*")
    for change in (
        {"filter_tag": "y*"},
        {"preserve_tag": False},
        {"exclude_node": "n"},
        {"filter_tag": None},
    ):
        with pytest.raises(ConfigMismatch, match="config is fixed"):
            model.router("r", "a", "b", **{"filter_tag": "x*", **change})
    with pytest.raises(ConfigMismatch, match="dest='b'; got dest='c'"):
        model.router("r", "a", "c", filter_tag="x*")
    assert model.list_routers() == [stored] and model.topics["c"].cursors == {}


def test_RTR_3_new_router_starts_at_source_head() -> None:
    """RTR-3: a new router forwards only what is appended after it; cursor <= source head."""
    store, model, _ = _store()
    a, b = store.topic("a"), store.topic("b")
    a.append_many([b"old1", b"old2"])
    model.router("r", "a", "b")
    assert b.read(after=0) == [] and model.list_routers()[0].cursor == 2
    a.append(b"new")
    assert _payloads(b) == [b"new"]
    assert model.list_routers()[0].cursor == a.state().head_seq == 3


def test_RTR_4_copy_keeps_order_tag_node_per_flags() -> None:
    """RTR-4: copies keep source order; tag and node are kept or cleared per preserve_*; ts and
    seq are dest's own."""
    store, model, clock = _store()
    a, b, c = store.topic("a"), store.topic("b"), store.topic("c")
    b.append(b"direct")
    model.router("keep", "a", "b")
    model.router("clear", "a", "c", preserve_tag=False, preserve_node=False)
    clock.advance(5)
    a.append_records([(b"1", "t1", "n1"), (b"2", None, "n2")])
    got = b.read(after=0)
    assert [(r.seq, r.payload, r.tag, r.node) for r in got if isinstance(r, Record)] == [
        (1, b"direct", None, None),
        (2, b"1", "t1", "n1"),
        (3, b"2", None, "n2"),
    ]
    assert [(r.tag, r.node) for r in c.read(after=0) if isinstance(r, Record)] == [
        (None, None),
        (None, None),
    ]


def test_RTR_4_filter_tag_glob_and_exclude_node() -> None:
    """RTR-4: filter_tag is an fnmatchcase glob (a None tag never matches); exclude_node skips
    records of that node; skipped records leave nothing in dest but advance the cursor."""
    store, model, _ = _store()
    a, b = store.topic("a"), store.topic("b")
    model.router("r", "a", "b", filter_tag="s-*", exclude_node="far")
    a.append_records(
        [(b"1", "s-1", None), (b"2", None, None), (b"3", "S-3", None), (b"4", "s-4", "far")]
    )
    a.append(b"5", tag="s-5", node="near")
    assert _payloads(b) == [b"1", b"5"]
    assert model.list_routers()[0].lag == 0
    assert passes("s-x", None, "s-*", None) and not passes(None, None, "*", None)
    assert not passes("t", "n", None, "n") and passes("t", None, None, "n")


def _stalled() -> tuple[tidelog.Store, ModelStore, tidelog.Topic, tidelog.Topic]:
    """Source ``a`` (drop_oldest, cap 3) -> dest ``b`` that holds one record and rejects more."""
    store, model, _ = _store()
    a = store.topic("a", cap_records=3, retention="drop_oldest")
    b = store.topic("b", cap_records=1, discard="reject")
    model.router("r", "a", "b")
    return store, model, a, b


def test_RTR_4_voluntary_delete_before_forwarding_is_silent() -> None:
    """RTR-4, DEL: a source record deleted before the router dealt with it is skipped silently."""
    _, model, a, b = _stalled()
    a.append_many([b"1", b"2", b"3"])  # 1 forwarded; 2, 3 wait for room in b
    assert model.list_routers()[0].cursor == 1
    a.delete(before_seq=3)  # deletes 2 (1 was forwarded already)
    b.delete(1 << 30)  # room in b: forwarding runs in this op (RTR-8)
    assert _payloads(b) == [b"3"]
    assert model.list_routers()[0].lag == 0
    model.check_invariants()


def test_RTR_5_unforwarded_eviction_becomes_a_dest_tombstone() -> None:
    """RTR-5, RTR-7: drop_oldest evicts records the router had not forwarded; dest readers and
    subscribers get one tombstone of one dest seq per lost source seq, in source order."""
    _, model, a, b = _stalled()
    sub = b.subscribe("s", start="earliest")
    a.append_many([b"1", b"2", b"3"])
    a.append_many([b"4", b"5"])  # evicts 1 (forwarded), 2 (not)
    assert a.state().evict_floor == 3
    got = sub.poll()
    assert [i.seq if isinstance(i, Record) else i for i in got] == [1, Tombstone(2, 2)]
    sub.ack(1)  # trim="acked" makes room in this op: 3 is copied; 4 and 5 wait again
    assert _payloads(b) == [(2, 2), b"3"]
    assert [i.payload for i in sub.poll() if isinstance(i, Record)] == [b"3"]
    model.check_invariants()


def test_RTR_6_refused_copy_waits_and_too_large_copy_becomes_a_tombstone() -> None:
    """RTR-6: topic_full stops the router before the seq (cursor unchanged) until room is made;
    a copy dest can never hold (too_large under its caps) is a one-seq loss range."""
    store, model, _ = _store()
    a = store.topic("a")
    b = store.topic("b", cap_bytes=4, discard="reject")
    model.router("r", "a", "b")
    a.append(b"12345")  # larger than b's cap_bytes: never fits
    a.append(b"abcd")
    a.append(b"ef")  # b full: waits
    assert _payloads(b) == [(1, 1), b"abcd"]
    assert model.list_routers()[0].cursor == 2
    b.delete(1 << 30)
    assert _payloads(b) == [(1, 1), b"ef"]
    assert model.list_routers()[0].lag == 0
    model.check_invariants()


def test_RTR_7_router_holds_a_backpressure_source() -> None:
    """RTR-7, SUB-6: under retention=backpressure an eviction of a seq above the router's cursor
    raises backpressure and changes nothing."""
    store, model, _ = _store()
    a = store.topic("a", cap_records=2, retention="backpressure")
    b = store.topic("b", cap_records=1, discard="reject")
    b.append(b"direct")  # b is full: the router waits at 1
    model.router("r", "a", "b")
    a.append_many([b"1", b"2"])
    with pytest.raises(Backpressure, match="router 'r' has not forwarded seq 1"):
        a.append(b"3")
    assert a.state().head_seq == 2 and model.list_routers()[0].cursor == 0
    b.delete(1 << 30)  # 1 forwarded: the router no longer holds it
    a.append(b"3")  # evicts 1; 2 and 3 wait for room in b
    assert a.state().head_seq == 3 and _payloads(b) == [b"1"]


def test_RTR_7_ack_trim_stops_at_router_cursor() -> None:
    """RTR-7, SUB-5: trim="acked" never trims a seq above a router's cursor."""
    store, model, _ = _store()
    a = store.topic("a", trim="acked")
    b = store.topic("b", cap_records=1, discard="reject")
    sub = a.subscribe("s", start="earliest")
    model.router("r", "a", "b")
    a.append_many([b"1", b"2", b"3"])
    sub.commit(3)
    # 1 trimmed; 2, 3 held by the router
    assert [r.seq for r in a.read(after=0) if isinstance(r, Record)] == [2, 3]
    b.delete(1 << 30)  # 2 forwarded, then trimmed
    assert [r.seq for r in a.read(after=0) if isinstance(r, Record)] == [3]
    b.delete(1 << 30)
    assert a.read(after=0) == []
    model.check_invariants()


def test_RTR_8_forwarding_needs_no_further_source_append() -> None:
    """RTR-8: a chain a -> b -> c is caught up when the source append returns; room made in a
    dest by an ack forwards in that op."""
    store, model, _ = _store()
    a, c = store.topic("a"), store.topic("c")
    store.topic("b")
    model.router("z", "b", "c")  # name order runs b -> c first: the passes still catch up
    model.router("y", "a", "b")
    a.append(b"1")
    assert _payloads(c) == [b"1"]
    d = store.topic("d", cap_records=1, retention="backpressure")
    sub = d.subscribe("s")
    model.router("x", "c", "d")
    a.append_many([b"2", b"3"])
    assert _payloads(d) == [b"2"]
    sub.ack(1)
    assert _payloads(d)[-1] == b"3" and model.list_routers()[0].lag == 0


def test_RTR_9_fan_in_and_cycles_are_refused() -> None:
    """RTR-9: a dest fed from another source is router_dest_fan_in (a config_mismatch); a second
    router from the same source is allowed; a cycle is bad_argument unless allow_cycle."""
    store, model, _ = _store()
    for name in "abc":
        store.topic(name)
    model.router("ab", "a", "b")
    with pytest.raises(RouterFanIn) as err:
        model.router("cb", "c", "b")
    assert err.value.code == "router_dest_fan_in" and isinstance(err.value, ConfigMismatch)
    model.router("ab2", "a", "b")
    model.router("bc", "b", "c")
    with pytest.raises(BadArgument, match="cycle"):
        model.router("ca", "c", "a")
    with pytest.raises(BadArgument, match="cycle"):
        model.router("aa", "a", "a")
    assert sorted(model.routers) == ["ab", "ab2", "bc"]
    assert closes_cycle([("a", "b"), ("b", "c")], "c", "a")
    assert not closes_cycle([("a", "b"), ("b", "c")], "a", "c")


def test_RTR_9_node_tagging_stops_ping_pong() -> None:
    """RTR-9: a cycle allowed with allow_cycle forwards each record once when each router
    excludes the other side's node."""
    store, model, _ = _store()
    a, b = store.topic("a"), store.topic("b")
    model.router("ab", "a", "b", exclude_node="b")
    model.router("ba", "b", "a", exclude_node="a", allow_cycle=True)
    a.append(b"from-a", node="a")
    b.append(b"from-b", node="b")
    assert _payloads(a) == [b"from-a", b"from-b"]
    assert _payloads(b) == [b"from-a", b"from-b"]
    assert all(i.lag == 0 for i in model.list_routers())


def _flushed_pair(source: str, dest: str) -> tuple[ModelStore, tidelog.Topic, tidelog.Topic]:
    """Router ``r``: ``a`` -> ``b`` of these durability classes; ``1`` forwarded and flushed."""
    store, model, _ = _store()
    a = store.topic("a", durability=source)
    b = store.topic("b", durability=dest)
    model.router("r", "a", "b")
    a.append(b"1")
    store.flush()
    return model, a, b


def test_RTR_10_crash_candidates_carry_the_cursor_with_the_copies() -> None:
    """RTR-10: every crash candidate of dest holds the cursor together with exactly the copies
    it covers; after recovery the router re-derives the rest once (exactly once into dest)."""
    model, a, b = _flushed_pair("fsync", "memory")
    a.append_many([b"2", b"3"])
    cands = model.crash_candidates("b")
    assert len(cands) > 1
    for cand in cands:
        copies = [cand.records[q].payload for q in sorted(cand.records)]
        assert copies == [b"1", b"2", b"3"][: cand.cursors["r"]]
    model.adopt("b", cands[0])
    model.resume_routers()
    assert _payloads(b) == [b"1", b"2", b"3"]
    model.check_invariants()


def test_RTR_11_cursor_lowered_to_a_regressed_source_head() -> None:
    """RTR-11: a memory source recovering below the cursor lowers it, so records appended
    under reused seqs are forwarded; dest keeps the copies it had."""
    model, a, b = _flushed_pair("memory", "fsync")
    a.append(b"2")
    model.adopt("a", model.crash_candidates("a")[0])
    assert a.state().head_seq == 1
    model.resume_routers()
    assert model.list_routers()[0].cursor == 1
    a.append(b"2bis")
    assert _payloads(b) == [b"1", b"2", b"2bis"]
    model.check_invariants()


def test_RTR_11_clean_restart_keeps_the_cursor() -> None:
    """RTR-11, DUR-1: a clean close and reopen keeps every cursor; forwarding resumes."""
    clock = FakeClock()
    store = tidelog.open("model://rtr11", clock=clock)
    model = hooks(store, ModelStore)
    a = store.topic("a")
    store.topic("b", cap_records=1, discard="reject")
    model.router("r", "a", "b")
    a.append_many([b"1", b"2"])
    store.close()
    store = tidelog.open("model://rtr11", clock=clock)
    model = hooks(store, ModelStore)
    try:
        assert model.list_routers()[0].cursor == 1
        store.topic("b").delete(1 << 30)
        assert _payloads(store.topic("b")) == [b"2"]
    finally:
        store.close()
        tidelog.model.forget("rtr11")


def test_RTR_12_drop_router_and_drop_topic() -> None:
    """RTR-12: drop_router keeps the copies and returns False for an unknown name; dropping a
    source or dest drops its routers."""
    store, model, _ = _store()
    a, b = store.topic("a"), store.topic("b")
    store.topic("c")
    model.router("r", "a", "b")
    a.append(b"1")
    assert model.drop_router("r") is True and model.drop_router("r") is False
    a.append(b"2")
    assert _payloads(b) == [b"1"] and model.topics["b"].cursors == {}
    model.router("r", "a", "b")
    model.router("s", "b", "c")
    store.drop_topic("b")
    assert model.list_routers() == []
    model.check_invariants()


def test_RTR_13_no_builtin_backend_claims_routers() -> None:
    """RTR-13, CAP-1: the routers flag defaults to False and no descriptor claims it yet."""
    assert Capabilities().routers is False
    assert all(d.capabilities is None or not d.capabilities.routers for d in DESCRIPTORS.values())
    assert DESCRIPTORS["blockdev"].capabilities is not None
    assert not DESCRIPTORS["blockdev"].capabilities.multi_topic


# -- property: every source seq after the router's start is accounted for exactly once ----------

OPS = st.lists(
    st.one_of(
        st.tuples(st.just("append"), st.integers(1, 3)),
        st.tuples(st.just("delete"), st.integers(0, 6)),
        st.tuples(st.just("consume"), st.integers(1, 3)),
        st.tuples(st.just("tick"), st.integers(0, 40)),
    ),
    max_size=25,
)


def _account(units: list[int | None], fate: dict[int, str], head: int, start: int) -> None:
    """Walk dest's units (a source seq for a copy, None for one tombstone seq) against the
    source: voluntary removals may be skipped, nothing else; each seq at most once, in order."""
    p = start + 1
    for u in units:
        while fate.get(p) in VOLUNTARY and u != p:
            p += 1
        if u is None:
            assert fate.get(p) in INVOLUNTARY, f"RTR-5: tombstone for seq {p} ({fate.get(p)})"
        else:
            assert u == p, f"RTR-4: copy of {u} where seq {p} was due"
        p += 1
    while p <= head and fate.get(p) in VOLUNTARY:
        p += 1
    assert p == head + 1, f"RTR-8: seqs {p}..{head} never reached dest"


@settings(max_examples=60, deadline=None)
@given(ops=OPS, preexisting=st.integers(0, 2))
def test_RTR_5_every_source_seq_reaches_dest_once_in_order(
    ops: list[tuple[str, int]], preexisting: int
) -> None:
    """RTR-4, RTR-5, RTR-6, RTR-8: random appends, drop_oldest and TTL evictions and deletes on
    the source, with a dest that stalls the router until its subscriber consumes: dest's copies
    and tombstones account for every source seq after the router's start exactly once, in
    order (voluntary deletes silently)."""
    store, model, clock = _store()
    a = store.topic("a", cap_records=3, retention="drop_oldest", ttl_ms=30)
    b = store.topic("b", cap_records=2, retention="backpressure")
    b.subscribe("s")  # holds b's records until they are read (RTR-6's stall)
    n = 0

    def append(k: int) -> None:
        nonlocal n
        a.append_many([str(n + i + 1).encode() for i in range(k)])
        n += k

    append(preexisting)
    start = model.router("r", "a", "b").cursor
    units: list[int | None] = []

    pos = 0

    def consume(k: int) -> None:
        nonlocal pos
        for item in b.read(after=pos, limit=k):
            if isinstance(item, Tombstone):
                units.extend([None] * (item.gap_to - item.gap_from + 1))
                pos = item.gap_to
            else:
                units.append(int(item.payload))
                pos = item.seq
                b.subscriber("s").ack(item.seq)

    for op, k in ops:
        if op == "append":
            append(k)
        elif op == "delete":
            a.delete(before_seq=k + start + 1)
        elif op == "consume":
            consume(k)
        else:
            clock.advance(k)
        model.check_invariants()
    for _ in range(100):
        if not model.list_routers()[0].lag and b.state().head_seq == pos:
            break
        consume(2)
    src = model.topics["a"]
    _account(units, src.fate, src.head, start)
