"""Routers (spec/SPEC.md section 16, RTR) through the public API, on the model and on every
backend that claims ``routers`` (memory://, file://); the model's internals where a test
inspects them (its crash candidates, its per-seq fates)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import tidelog
from tidelog import FakeClock, Record, Tombstone
from tidelog.backend import Capabilities
from tidelog.backends import memory
from tidelog.backends.file.format import snapshot as snapfmt
from tidelog.backends.file.format import wal as walfmt
from tidelog.backends.file.format.wal import FrameType
from tidelog.backends.file.replay import SNAPSHOT_VERSIONS
from tidelog.errors import (
    Backpressure,
    BadArgument,
    BadName,
    ConfigMismatch,
    Corrupt,
    NoSuchTopic,
    NotAvailable,
    ReadOnly,
    RouterFanIn,
)
from tidelog.hooks import Abandon, hooks
from tidelog.model import ModelStore
from tidelog.model.log import INVOLUNTARY, VOLUNTARY
from tidelog.model.router import closes_cycle, passes
from tidelog.registry import DESCRIPTORS

ROUTING = ("model", "memory", "file")  # the schemes that claim ``routers``
Opened = tuple[tidelog.Store, "ModelStore | None", FakeClock]
Make = Callable[[], Opened]


@pytest.fixture(params=ROUTING)
def make(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Make]:
    """Opens fresh stores of one scheme that claims routers (file://: under tmp_path) on a
    fake clock, with the model behind them when it is one; closes them after the test."""
    scheme: str = request.param
    opened: list[tidelog.Store] = []

    def open_one() -> Opened:
        clock = FakeClock()
        uri = f"file://{tmp_path / f's{len(opened)}'}" if scheme == "file" else f"{scheme}://"
        store = tidelog.open(uri, clock=clock)
        opened.append(store)
        return store, hooks(store, ModelStore) if scheme == "model" else None, clock

    yield open_one
    for store in opened:
        store.close()


def _model() -> tuple[tidelog.Store, ModelStore, FakeClock]:
    """A model store, for the tests that look inside the model."""
    clock = FakeClock()
    store = tidelog.open("model://", clock=clock)
    return store, hooks(store, ModelStore), clock


def _invariants(store: tidelog.Store, model: ModelStore | None) -> None:
    """The model's own invariants where it is one; on every store, RTR-1 and RTR-3 as the API
    shows them: a cursor at or below its source's head, lag = head - cursor."""
    if model is not None:
        model.check_invariants()
    for info in store.routers():
        head = store.topic(info.config.source, create=False).state().head_seq
        assert 0 <= info.cursor <= head and info.lag == head - info.cursor, info


def _payloads(t: tidelog.Topic) -> list[bytes | tuple[int, int]]:
    return [i.payload if isinstance(i, Record) else (i.gap_from, i.gap_to) for i in t.read(after=0)]


def test_RTR_1_router_create_open_and_list(make: Make) -> None:
    """RTR-1: router() creates or opens and reports cursor and lag; routers() lists by name."""
    store, model, _ = make()
    a, b = store.topic("a"), store.topic("b")
    a.append_many([b"x", b"y"])
    info = store.router("r2", "a", "b")
    assert (info.name, info.config.source, info.config.dest, info.cursor, info.lag) == (
        "r2",
        "a",
        "b",
        2,
        0,
    )
    store.router("r1", "a", "b", filter_tag="t*")
    assert [i.name for i in store.routers()] == ["r1", "r2"]
    assert store.router("r2", "a", "b") == store.routers()[1]
    a.append(b"z", tag="t1")
    assert _payloads(b) == [b"z", b"z"]  # each router forwards its own copy
    _invariants(store, model)


def test_RTR_1_bad_name_and_missing_topics_change_nothing(make: Make) -> None:
    """RTR-1: a bad router name is bad_name; a missing source or dest is no_such_topic, and
    neither topic is created."""
    store, model, _ = make()
    store.topic("a")
    with pytest.raises(BadName):
        store.router("../r", "a", "a", allow_cycle=True)
    with pytest.raises(NoSuchTopic):
        store.router("r", "a", "nope")
    with pytest.raises(NoSuchTopic):
        store.router("r", "nope", "a")
    assert store.topics() == ["a"] and store.routers() == []
    _invariants(store, model)


def test_RTR_2_config_fixed_at_creation(make: Make) -> None:
    """RTR-2: reopening with any different argument is config_mismatch and changes nothing."""
    store, model, _ = make()
    store.topic("a"), store.topic("b"), store.topic("c")
    stored = store.router("r", "a", "b", filter_tag="x*")
    for change in (
        {"filter_tag": "y*"},
        {"preserve_tag": False},
        {"exclude_node": "n"},
        {"filter_tag": None},
    ):
        with pytest.raises(ConfigMismatch, match="config is fixed"):
            store.router("r", "a", "b", **{"filter_tag": "x*", **change})
    with pytest.raises(ConfigMismatch, match="dest='b'; got dest='c'"):
        store.router("r", "a", "c", filter_tag="x*")
    assert store.routers() == [stored] and store.topic("c").read(after=0) == []
    _invariants(store, model)


def test_RTR_3_new_router_starts_at_source_head(make: Make) -> None:
    """RTR-3: a new router forwards only what is appended after it; cursor <= source head."""
    store, model, _ = make()
    a, b = store.topic("a"), store.topic("b")
    a.append_many([b"old1", b"old2"])
    store.router("r", "a", "b")
    assert b.read(after=0) == [] and store.routers()[0].cursor == 2
    a.append(b"new")
    assert _payloads(b) == [b"new"]
    assert store.routers()[0].cursor == a.state().head_seq == 3
    _invariants(store, model)


def test_RTR_4_copy_keeps_order_tag_node_per_flags(make: Make) -> None:
    """RTR-4: copies keep source order; tag and node are kept or cleared per preserve_*; ts and
    seq are dest's own."""
    store, model, clock = make()
    a, b, c = store.topic("a"), store.topic("b"), store.topic("c")
    b.append(b"direct")
    store.router("keep", "a", "b")
    store.router("clear", "a", "c", preserve_tag=False, preserve_node=False)
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
    _invariants(store, model)


def test_RTR_4_filter_tag_glob_and_exclude_node(make: Make) -> None:
    """RTR-4: filter_tag is an fnmatchcase glob (a None tag never matches); exclude_node skips
    records of that node; skipped records leave nothing in dest but advance the cursor."""
    store, model, _ = make()
    a, b = store.topic("a"), store.topic("b")
    store.router("r", "a", "b", filter_tag="s-*", exclude_node="far")
    a.append_records(
        [(b"1", "s-1", None), (b"2", None, None), (b"3", "S-3", None), (b"4", "s-4", "far")]
    )
    a.append(b"5", tag="s-5", node="near")
    assert _payloads(b) == [b"1", b"5"]
    assert store.routers()[0].lag == 0
    assert passes("s-x", None, "s-*", None) and not passes(None, None, "*", None)
    assert not passes("t", "n", None, "n") and passes("t", None, None, "n")
    _invariants(store, model)


def _stalled(make: Make) -> tuple[tidelog.Store, ModelStore | None, tidelog.Topic, tidelog.Topic]:
    """Source ``a`` (drop_oldest, cap 3) -> dest ``b`` that holds one record and rejects more."""
    store, model, _ = make()
    a = store.topic("a", cap_records=3, retention="drop_oldest")
    b = store.topic("b", cap_records=1, discard="reject")
    store.router("r", "a", "b")
    return store, model, a, b


def test_RTR_4_voluntary_delete_before_forwarding_is_silent(make: Make) -> None:
    """RTR-4, DEL: a source record deleted before the router dealt with it is skipped silently."""
    store, model, a, b = _stalled(make)
    a.append_many([b"1", b"2", b"3"])  # 1 forwarded; 2, 3 wait for room in b
    assert store.routers()[0].cursor == 1
    a.delete(before_seq=3)  # deletes 2 (1 was forwarded already)
    b.delete(1 << 30)  # room in b: forwarding runs in this op (RTR-8)
    assert _payloads(b) == [b"3"]
    assert store.routers()[0].lag == 0
    _invariants(store, model)


def test_RTR_5_unforwarded_eviction_becomes_a_dest_tombstone(make: Make) -> None:
    """RTR-5, RTR-7: drop_oldest evicts records the router had not forwarded; dest readers and
    subscribers get one tombstone of one dest seq per lost source seq, in source order."""
    store, model, a, b = _stalled(make)
    sub = b.subscribe("s", start="earliest")
    a.append_many([b"1", b"2", b"3"])
    a.append_many([b"4", b"5"])  # evicts 1 (forwarded), 2 (not)
    assert a.state().evict_floor == 3
    got = sub.poll()
    assert [i.seq if isinstance(i, Record) else i for i in got] == [1, Tombstone(2, 2)]
    sub.ack(1)  # trim="acked" makes room in this op: 3 is copied; 4 and 5 wait again
    assert _payloads(b) == [(2, 2), b"3"]
    assert [i.payload for i in sub.poll() if isinstance(i, Record)] == [b"3"]
    _invariants(store, model)


def test_RTR_6_refused_copy_waits_and_too_large_copy_becomes_a_tombstone(make: Make) -> None:
    """RTR-6: topic_full stops the router before the seq (cursor unchanged) until room is made;
    a copy dest can never hold (too_large under its caps) is a one-seq loss range."""
    store, model, _ = make()
    a = store.topic("a")
    b = store.topic("b", cap_bytes=4, discard="reject")
    store.router("r", "a", "b")
    a.append(b"12345")  # larger than b's cap_bytes: never fits
    a.append(b"abcd")
    a.append(b"ef")  # b full: waits
    assert _payloads(b) == [(1, 1), b"abcd"]
    assert store.routers()[0].cursor == 2
    b.delete(1 << 30)
    assert _payloads(b) == [(1, 1), b"ef"]
    assert store.routers()[0].lag == 0
    _invariants(store, model)


def test_RTR_7_router_holds_a_backpressure_source(make: Make) -> None:
    """RTR-7, SUB-6: under retention=backpressure an eviction of a seq above the router's cursor
    raises backpressure and changes nothing."""
    store, model, _ = make()
    a = store.topic("a", cap_records=2, retention="backpressure")
    b = store.topic("b", cap_records=1, discard="reject")
    b.append(b"direct")  # b is full: the router waits at 1
    store.router("r", "a", "b")
    a.append_many([b"1", b"2"])
    with pytest.raises(Backpressure, match="router 'r' has not forwarded seq 1"):
        a.append(b"3")
    assert a.state().head_seq == 2 and store.routers()[0].cursor == 0
    b.delete(1 << 30)  # 1 forwarded: the router no longer holds it
    a.append(b"3")  # evicts 1; 2 and 3 wait for room in b
    assert a.state().head_seq == 3 and _payloads(b) == [b"1"]
    _invariants(store, model)


def test_RTR_7_ack_trim_stops_at_router_cursor(make: Make) -> None:
    """RTR-7, SUB-5: trim="acked" never trims a seq above a router's cursor."""
    store, model, _ = make()
    a = store.topic("a", trim="acked")
    b = store.topic("b", cap_records=1, discard="reject")
    sub = a.subscribe("s", start="earliest")
    store.router("r", "a", "b")
    a.append_many([b"1", b"2", b"3"])
    sub.commit(3)
    # 1 trimmed; 2, 3 held by the router
    assert [r.seq for r in a.read(after=0) if isinstance(r, Record)] == [2, 3]
    b.delete(1 << 30)  # 2 forwarded, then trimmed
    assert [r.seq for r in a.read(after=0) if isinstance(r, Record)] == [3]
    b.delete(1 << 30)
    assert a.read(after=0) == []
    _invariants(store, model)


def test_RTR_8_forwarding_needs_no_further_source_append(make: Make) -> None:
    """RTR-8: a chain a -> b -> c is caught up when the source append returns; room made in a
    dest by an ack forwards in that op."""
    store, model, _ = make()
    a, c = store.topic("a"), store.topic("c")
    store.topic("b")
    store.router("z", "b", "c")  # name order runs b -> c first: the passes still catch up
    store.router("y", "a", "b")
    a.append(b"1")
    assert _payloads(c) == [b"1"]
    d = store.topic("d", cap_records=1, retention="backpressure")
    sub = d.subscribe("s")
    store.router("x", "c", "d")
    a.append_many([b"2", b"3"])
    assert _payloads(d) == [b"2"]
    sub.ack(1)
    assert _payloads(d)[-1] == b"3" and store.routers()[0].lag == 0
    _invariants(store, model)


def test_RTR_9_fan_in_and_cycles_are_refused(make: Make) -> None:
    """RTR-9: a dest fed from another source is router_dest_fan_in (a config_mismatch); a second
    router from the same source is allowed; a cycle is bad_argument unless allow_cycle."""
    store, model, _ = make()
    for name in "abc":
        store.topic(name)
    store.router("ab", "a", "b")
    with pytest.raises(RouterFanIn) as err:
        store.router("cb", "c", "b")
    assert err.value.code == "router_dest_fan_in" and isinstance(err.value, ConfigMismatch)
    store.router("ab2", "a", "b")
    store.router("bc", "b", "c")
    with pytest.raises(BadArgument, match="cycle"):
        store.router("ca", "c", "a")
    with pytest.raises(BadArgument, match="cycle"):
        store.router("aa", "a", "a")
    assert [i.name for i in store.routers()] == ["ab", "ab2", "bc"]
    assert closes_cycle([("a", "b"), ("b", "c")], "c", "a")
    assert not closes_cycle([("a", "b"), ("b", "c")], "a", "c")
    _invariants(store, model)


def test_RTR_9_node_tagging_stops_ping_pong(make: Make) -> None:
    """RTR-9: a cycle allowed with allow_cycle forwards each record once when each router
    excludes the other side's node."""
    store, model, _ = make()
    a, b = store.topic("a"), store.topic("b")
    store.router("ab", "a", "b", exclude_node="b")
    store.router("ba", "b", "a", exclude_node="a", allow_cycle=True)
    a.append(b"from-a", node="a")
    b.append(b"from-b", node="b")
    assert _payloads(a) == [b"from-a", b"from-b"]
    assert _payloads(b) == [b"from-a", b"from-b"]
    assert all(i.lag == 0 for i in store.routers())
    _invariants(store, model)


def test_RTR_8_RTR_9_a_cycle_that_never_settles_moves_on_alike(make: Make) -> None:
    """RTR-8, RTR-9: an allowed cycle whose copies pass every filter forwards without end, by
    the same bounded amount per op everywhere: only ops that change state forward, at most one
    pass per router each time; a read changes nothing."""
    store, model, _ = make()
    a, b = store.topic("a"), store.topic("b")
    store.router("ab", "a", "b")
    store.router("ba", "b", "a", allow_cycle=True)
    a.append(b"x")
    # two passes (two routers), each in name order: ab copies a1 (b: 1), ba copies b1 (a: 2);
    # ab copies a2 (b: 2), ba copies b2 (a: 3)
    assert (a.state().head_seq, b.state().head_seq) == (3, 2)
    assert a.read(after=0) == a.read(after=0) and b.state().head_seq == 2  # reads forward none
    a.append(b"y")  # a: 4; ab a3, a4 (b: 4); ba b3, b4 (a: 6); ab a5, a6 (b: 6); ba (a: 8)
    assert (a.state().head_seq, b.state().head_seq) == (8, 6)
    _invariants(store, model)


def _flushed_pair(
    source: str, dest: str
) -> tuple[tidelog.Store, ModelStore, tidelog.Topic, tidelog.Topic]:
    """Router ``r``: ``a`` -> ``b`` of these durability classes; ``1`` forwarded and flushed."""
    store, model, _ = _model()
    a = store.topic("a", durability=source)
    b = store.topic("b", durability=dest)
    store.router("r", "a", "b")
    a.append(b"1")
    store.flush()
    return store, model, a, b


def test_RTR_10_crash_candidates_carry_the_cursor_with_the_copies() -> None:
    """RTR-10: every crash candidate of dest holds the cursor together with exactly the copies
    it covers; after recovery the router re-derives the rest once (exactly once into dest)."""
    _, model, a, b = _flushed_pair("fsync", "memory")
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
    store, model, a, b = _flushed_pair("memory", "fsync")
    a.append(b"2")
    model.adopt("a", model.crash_candidates("a")[0])
    assert a.state().head_seq == 1
    model.resume_routers()
    assert store.routers()[0].cursor == 1
    a.append(b"2bis")
    assert _payloads(b) == [b"1", b"2", b"2bis"]
    model.check_invariants()


@pytest.mark.parametrize("scheme", ROUTING)
def test_RTR_11_clean_restart_keeps_the_cursor(scheme: str, tmp_path: Path) -> None:
    """RTR-11, DUR-1: a clean close and reopen keeps every cursor (and the config); forwarding
    resumes from it."""
    clock = FakeClock()
    uri = f"file://{tmp_path / 's'}" if scheme == "file" else f"{scheme}://rtr11"
    store = tidelog.open(uri, clock=clock)
    a = store.topic("a")
    store.topic("b", cap_records=1, discard="reject")
    before = store.router("r", "a", "b", filter_tag="t*", preserve_node=False)
    a.append_many([b"1", b"2"], tag="t1")
    store.close()
    store = tidelog.open(uri, clock=clock)
    try:
        (after,) = store.routers()
        assert after.cursor == 1 and after.config == before.config
        store.topic("b").delete(1 << 30)
        assert _payloads(store.topic("b")) == [b"2"]
    finally:
        store.close()
        if scheme == "model":
            tidelog.model.forget("rtr11")
        elif scheme == "memory":
            memory.forget("rtr11")


def test_RTR_12_drop_router_and_drop_topic(make: Make) -> None:
    """RTR-12: drop_router keeps the copies and returns False for an unknown name; dropping a
    source or dest drops its routers."""
    store, model, _ = make()
    a, b = store.topic("a"), store.topic("b")
    store.topic("c")
    store.router("r", "a", "b")
    a.append(b"1")
    assert store.drop_router("r") is True and store.drop_router("r") is False
    a.append(b"2")
    assert _payloads(b) == [b"1"] and store.routers() == []
    store.router("r", "a", "b")
    store.router("s", "b", "c")
    store.drop_topic("b")
    assert store.routers() == []
    _invariants(store, model)


def test_RTR_13_which_stores_claim_routers() -> None:
    """RTR-13, CAP-1: the routers flag defaults to False; file://, memory:// and the model claim
    it, a blockdev ring (one topic) and an SF slot do not."""
    assert Capabilities().routers is False
    claims = {s for s, d in DESCRIPTORS.items() if d.capabilities and d.capabilities.routers}
    assert claims == set(ROUTING)


@pytest.mark.parametrize("scheme", ["blockdev", "sf"])
def test_RTR_13_stores_without_routers_refuse_them(scheme: str, tmp_path: Path) -> None:
    """RTR-13, CAP-1: where ``routers`` is False, router and drop_router are not_available with
    the descriptor's reason, and routers() is empty."""
    uri = (
        f"blockdev://{tmp_path / 'ring.img'}?size=68KiB&page_size=4KiB&topic=a"
        if scheme == "blockdev"
        else f"sf://{tmp_path / 'sf' / 'a'}?sf_max_bytes=4KiB&sf_max_total_bytes=4MiB"
    )
    with tidelog.open(uri) as store:
        assert store.capabilities.routers is False and store.routers() == []
        with pytest.raises(NotAvailable, match="RTR-13") as err:
            store.router("r", "a", "b")
        assert err.value.code == "not_available"
        with pytest.raises(NotAvailable, match="RTR-13"):
            store.drop_router("r")


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
    store, model, clock = _model()
    a = store.topic("a", cap_records=3, retention="drop_oldest", ttl_ms=30)
    b = store.topic("b", cap_records=2, retention="backpressure")
    b.subscribe("s")  # holds b's records until they are read (RTR-6's stall)
    n = 0

    def append(k: int) -> None:
        nonlocal n
        a.append_many([str(n + i + 1).encode() for i in range(k)])
        n += k

    append(preexisting)
    start = store.router("r", "a", "b").cursor
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
        if not store.routers()[0].lag and b.state().head_seq == pos:
            break
        consume(2)
    src = model.topics["a"]
    _account(units, src.fate, src.head, start)


# -- file:// specifics: read-only views, a process that dies, live delivery -----------------


def test_RTR_1_a_read_only_view_lists_routers_and_never_forwards(tmp_path: Path) -> None:
    """RTR-1, CLI-10: a read-only view of a file store lists the stored routers with their
    cursors, refuses router and drop_router (read_only), and sees the writer's copies and
    cursor after refresh; it forwards nothing itself."""
    uri = f"file://{tmp_path / 's'}"
    with tidelog.open(uri) as writer:
        a = writer.topic("a")
        writer.topic("b")
        writer.router("r", "a", "b")
        a.append(b"1")
        with tidelog.open(uri + "?readonly=true") as view:
            assert [(i.name, i.cursor) for i in view.routers()] == [("r", 1)]
            for call in (lambda: view.router("x", "a", "b"), lambda: view.drop_router("r")):
                with pytest.raises(ReadOnly):
                    call()
            a.append(b"2")
            view.refresh()
            assert _payloads(view.topic("b")) == [b"1", b"2"]
            assert [(i.name, i.cursor, i.lag) for i in view.routers()] == [("r", 2, 0)]


@pytest.mark.parametrize("source", ["fsync", "disk"])
def test_RTR_10_a_process_that_dies_leaves_each_copy_once(tmp_path: Path, source: str) -> None:
    """RTR-10, RTR-11: after the writing process dies (no close) and the store is reopened,
    dest holds each forwarded copy exactly once and the cursor covers them; records appended
    after the reopen are forwarded."""
    uri = f"file://{tmp_path / 's'}?head_reserve=100"
    store = tidelog.open(uri)
    a = store.topic("a", durability=source)
    store.topic("b", durability="fsync")
    store.router("r", "a", "b")
    a.append_many([b"1", b"2"])
    store.flush()
    hooks(store, Abandon).abandon()
    with tidelog.open(uri) as again:
        lost = [(i.gap_from, i.gap_to) for i in again.topic("a").read(after=2)]
        # DUR-3: a disk source raises its head over the seqs it had reserved (WAL-12: its first
        # op reserved through the head before it, 0, plus head_reserve); dest gets the same
        # tombstone (RTR-5), once
        assert lost == ([] if source == "fsync" else [(3, 100)])
        assert _payloads(again.topic("b")) == [b"1", b"2", *lost]
        head = again.topic("a").state().head_seq
        assert [(i.cursor, i.lag) for i in again.routers()] == [(head, 0)]
        again.topic("a").append(b"3")
        assert _payloads(again.topic("b"))[-1] == b"3"


def test_RTR_11_a_memory_source_that_lost_records_lowers_the_cursor(tmp_path: Path) -> None:
    """RTR-11, DUR-4: a memory-class source loses its unflushed record in a crash and reuses
    its seq; the fsync dest keeps the copy it made, the cursor is lowered to the source's head,
    and the record appended under the reused seq is forwarded too."""
    # two WAL shards: a (the first topic id) and b (the second) log on different shards, and
    # the committer does not write a's shard before the process dies
    uri = f"file://{tmp_path / 's'}?wal_shards=2&commit_interval_ms=60000"
    store = tidelog.open(uri)
    a = store.topic("a", durability="memory")
    store.topic("b", durability="fsync")
    store.router("r", "a", "b")
    a.append(b"1")
    store.flush()
    a.append(b"2")  # copied into b (fsync: durable) but never durable in a
    hooks(store, Abandon).abandon()
    with tidelog.open(uri) as again:
        assert again.topic("a").state().head_seq == 1
        assert [i.cursor for i in again.routers()] == [1]
        again.topic("a").append(b"2bis")
        assert _payloads(again.topic("b")) == [b"1", b"2", b"2bis"]


@pytest.mark.parametrize("scheme", ["memory", "file"])
def test_RTR_8_a_reader_waiting_on_dest_is_woken_by_the_source_append(
    scheme: str, tmp_path: Path
) -> None:
    """RTR-8, CON-3: a reader blocked on dest (``read`` with ``wait_ms``) gets the copy when
    the source append returns, woken by the change notification: long before its wait ends."""
    uri = f"file://{tmp_path / 's'}" if scheme == "file" else "memory://"
    with tidelog.open(uri) as store:
        a, b = store.topic("a"), store.topic("b")
        store.router("r", "a", "b")
        got: list[object] = []
        reader = threading.Thread(target=lambda: got.extend(b.read(after=0, wait_ms=30_000)))
        started = time.monotonic()
        reader.start()
        time.sleep(0.05)  # the reader is waiting
        a.append(b"live")
        reader.join(timeout=20)
        assert not reader.is_alive() and time.monotonic() - started < 20
        assert [i.payload for i in got if isinstance(i, Record)] == [b"live"]


def test_WAL_8_SNAP_3_routers_on_disk(tmp_path: Path) -> None:
    """WAL-8, WAL-9, SNAP-3, RTR-10: ROUTER frames go on the dest topic's id (create with the
    config and the starting cursor, then a cursor frame in the same batch as the copies it
    covers); the snapshot of a store with routers is version 2 and lists them under their
    dest, and a store without routers still writes version 1."""
    root = tmp_path / "s"
    with tidelog.open(f"file://{root}?wal_file_bytes=64KiB&prealloc=none") as store:
        a = store.topic("a")
        store.topic("b")
        store.router("r", "a", "b", filter_tag="k*")
        a.append(b"1", tag="k1")
        frames = []
        for wal in sorted((root / "wal").glob("wal-*.log")):
            frames += walfmt.scan_file(wal.read_bytes()).frames
        ids = {f.body["name"]: f.topic_id for f in frames if f.type == FrameType.TOPIC_CREATE}
        routed = [f for f in frames if f.type == FrameType.ROUTER]
        assert [(f.topic_id, f.body["op"], f.seq) for f in routed] == [
            (ids["b"], "create", 0),
            (ids["b"], "cursor", 1),
        ]
        assert routed[0].body["config"]["filter_tag"] == "k*"
        last = frames.index(routed[1])
        copy = frames[last - 1]  # the copy, then the cursor, one batch
        assert copy.topic_id == ids["b"] and copy.data == b"1" and copy.batch_end is False
        assert routed[1].batch_end is True
    (snapshot,) = sorted((root / "meta").glob("snapshot-*.bin"))[-1:]
    _, body = snapfmt.decode_snapshot(snapshot.read_bytes())
    assert body["version"] == 2
    (entry,) = [t for t in body["topics"] if t["name"] == "b"]
    assert entry["routers"]["r"]["cursor"] == 1 and "routers" not in body["topics"][0]
    with tidelog.open(f"file://{root}") as store:
        store.drop_router("r")
    (snapshot,) = sorted((root / "meta").glob("snapshot-*.bin"))[-1:]
    assert snapfmt.decode_snapshot(snapshot.read_bytes())[1]["version"] == 1


def test_SNAP_3_a_snapshot_version_this_reader_does_not_know_is_refused(tmp_path: Path) -> None:
    """SNAP-3: a snapshot of a schema version this tidelog does not know (a newer writer's) is
    refused with corrupt naming the version, not opened without what it does not understand."""
    root = tmp_path / "s"
    with tidelog.open(f"file://{root}") as store:
        store.topic("a").append(b"1")
    newer = max(SNAPSHOT_VERSIONS) + 1
    for path in (root / "meta").iterdir():
        n, body = snapfmt.decode_snapshot(path.read_bytes())
        path.write_bytes(snapfmt.encode_snapshot(n, {**body, "version": newer}))
    with pytest.raises(Corrupt, match=f"schema version {newer}"):
        tidelog.open(f"file://{root}")


@pytest.mark.parametrize("scheme", ROUTING)
def test_RTR_8_copies_made_on_entering_an_op_that_then_fails_are_kept(
    scheme: str, tmp_path: Path
) -> None:
    """RTR-8, ERR-2: an op whose time effects make room in a dest forwards on entering; when
    the op itself then fails (an ack of a seq above the head), the copy it made stays made,
    readable and durable like any other, not held back until some later op."""
    clock = FakeClock()
    uri = f"file://{tmp_path / 's'}" if scheme == "file" else f"{scheme}://"
    with tidelog.open(uri, clock=clock) as store:
        a = store.topic("a")
        b = store.topic("b", durability="fsync", cap_records=1, discard="reject", ttl_ms=10)
        sub = b.subscribe("s")
        store.router("r", "a", "b")
        a.append_many([b"1", b"2"])  # 2 waits: b is full
        clock.advance(10)  # b's copy of 1 expires at b's next op
        with pytest.raises(BadArgument):
            sub.ack(10**6)
        assert [i.cursor for i in store.routers()] == [2]
        assert [i.payload for i in b.read(after=0) if isinstance(i, Record)] == [b"2"]


def test_RTR_7_RTR_12_dropping_a_router_releases_its_hold(make: Make) -> None:
    """RTR-7, RTR-12, SUB-5: records a router held from ack-trimming are trimmed in the op that
    drops it, when every subscriber is done with them."""
    store, model, _ = make()
    a = store.topic("a", trim="acked")
    store.topic("b", cap_records=1, discard="reject")
    sub = a.subscribe("s", start="earliest")
    store.router("r", "a", "b")
    a.append_many([b"1", b"2", b"3"])  # 1 copied; 2, 3 held by the full dest
    sub.commit(3)
    assert [r.seq for r in a.read(after=0) if isinstance(r, Record)] == [2, 3]
    assert store.drop_router("r") is True
    assert a.read(after=0) == []
    _invariants(store, model)


def test_RTR_8_a_dead_letter_forwarded_back_is_seen_by_the_op_that_made_it(make: Make) -> None:
    """RTR-8, QUE-7, TOP-7: a lease expiring on entering an op dead-letters its job into a
    topic whose router copies it straight back into the op's own topic; the op already sees
    the copy, also when that topic's reads wait for durability (fsync on file://). Found by
    the stateful campaign: the backend's state lagged the model's by the copy."""
    store, model, clock = make()
    jobs = store.topic(
        "jobs", durability="fsync", cap_records=1, max_deliveries=1, dead_letter="dlq"
    )
    store.topic("dlq")
    store.router("back", "dlq", "jobs")
    jobs.append(b"job")
    jobs.claim("w", max=1, lease_ms=5)
    clock.advance(5)  # the lease expires at the next op: one delivery is the limit
    assert jobs.state().head_seq == 2  # the dead letter's copy, seen by this very op
    assert [i.payload for i in jobs.read(after=0) if isinstance(i, Record)] == [b"job"]
    _invariants(store, model)
