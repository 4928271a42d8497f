"""A subscriber's pending gaps are a list of disjoint ranges (spec/SPEC.md SUB-4, SUB-7): a loss
range with live records between it and a pending gap stays a gap of its own, so poll returns
``Tombstone(1, 2)``, record 3, ``Tombstone(4, 5)`` in seq order and the hwm passes 5 once 3 is
acked, without a restart. (One merged gap used to return ``Tombstone(1, 5)``, a tombstone over
the live record 3, move the cursor past it and freeze the hwm at 2 until the next restart.)"""

from __future__ import annotations

from pathlib import Path

import pytest

import tidelog
from tidelog import FakeClock, Record, Tombstone
from tidelog.backends.memory import MemoryBackend
from tidelog.hooks import Abandon, hooks
from tidelog.model import ModelStore
from tidelog.model.rules import insert_gap

Items = list[int | tuple[int, int]]


def _seqs(items: list[Record | Tombstone]) -> Items:
    return [i.seq if isinstance(i, Record) else (i.gap_from, i.gap_to) for i in items]


def _live(*seqs: int):  # type: ignore[no-untyped-def]
    return lambda a, b: any(a < q < b for q in seqs)


def test_SUB_7_a_new_range_merges_only_across_no_live_seq() -> None:
    """SUB-7: the new range absorbs every gap it overlaps, then merges with the gap just below
    and just above it when no live seq lies strictly between; otherwise it stays apart."""
    assert insert_gap([], 4, 5, _live()) == [(4, 5)]
    assert insert_gap([(1, 2)], 4, 5, _live(3)) == [(1, 2), (4, 5)]
    assert insert_gap([(1, 2)], 4, 5, _live()) == [(1, 5)]  # 3 not live: one tombstone
    assert insert_gap([(1, 2)], 3, 3, _live(9)) == [(1, 3)]  # adjacent
    assert insert_gap([(1, 2), (6, 7)], 4, 4, _live(3, 5)) == [(1, 2), (4, 4), (6, 7)]
    assert insert_gap([(1, 2), (6, 7)], 3, 5, _live(9)) == [(1, 7)]  # both neighbours
    assert insert_gap([(1, 2), (6, 7), (10, 12)], 2, 8, _live(9)) == [(1, 8), (10, 12)]
    # only the new range's neighbours merge: (1, 2) and (4, 5) stay apart though 3 is not live
    assert insert_gap([(1, 2), (4, 5)], 8, 9, _live(6)) == [(1, 2), (4, 5), (8, 9)]


def test_SUB_7_oldest_end_eviction_keeps_one_gap() -> None:
    """SUB-7: eviction from the oldest end gives the one gap it always gave (the rule changes
    nothing where no live seq lies between)."""
    clock = FakeClock(0)
    with tidelog.open("model://", clock=clock) as store:
        t = store.topic("t", cap_records=2, retention="drop_oldest")
        s = t.subscribe("s", start="earliest")
        t.append_many([b"1", b"2"])
        t.append(b"3")  # evicts 1
        t.append_many([b"4", b"5"])  # evicts 2, 3
        assert hooks(store, ModelStore).topics["t"].subs["s"].gaps == [(1, 3)]
        assert _seqs(s.poll()) == [(1, 3), 4, 5]


def _check_poll_order(sub: tidelog.Subscriber, last: int) -> None:
    """The scenario's end: T(1, 2), record 3, T(4, last) in seq order (across two polls), and
    the hwm passes ``last`` once 3 is acked, with no restart."""
    assert sub.hwm == 2
    assert _seqs(sub.poll(max=2)) == [(1, 2), 3]
    assert _seqs(sub.poll()) == [(4, last)]
    assert sub.poll() == []
    assert sub.hwm == 2  # 3 is unresolved
    sub.ack(3)
    assert sub.hwm == last


@pytest.mark.parametrize("scheme", ["model", "memory", "file"])
def test_SUB_4_SUB_7_router_loss_ranges_are_two_gaps(scheme: str, tmp_path: Path) -> None:
    """SUB-4, SUB-7, RTR-5, RTR-6: a router's loss ranges in dest with a live copy between
    them (a copy dest can never hold is a one-seq loss range) are two gaps for a dest
    subscriber: Tombstone(1, 2), record 3, Tombstone(4, 5); ack(3) moves the hwm to 5."""
    uri = f"file://{tmp_path / 's'}" if scheme == "file" else f"{scheme}://"
    store = tidelog.open(uri, clock=FakeClock(0))
    src, dest = store.topic("src"), store.topic("dest", cap_bytes=4)
    sub = dest.subscribe("s", start="earliest")
    store.router("r", "src", "dest")
    src.append_many([b"too big", b"too big", b"ok", b"too big", b"too big"])
    assert dest.state().head_seq == 5
    if scheme == "model":
        model = hooks(store, ModelStore)
        assert model.topics["dest"].subs["s"].gaps == [(1, 2), (4, 5)]
        model.check_invariants()
    _check_poll_order(sub, 5)
    store.close()


def test_SUB_7_DUR_3_model_crash_loss_is_a_gap_of_its_own() -> None:
    """SUB-7, DUR-3: a crash that loses seqs 4, 5 while 3 is live and unresolved leaves the
    TTL's pending gap (1, 2) and a new gap (4, 5), not one gap over the live record."""
    clock = FakeClock(0)
    store = tidelog.open("model://", clock=clock)
    t = store.topic("t", durability="disk", ttl_ms=100)
    t.subscribe("s", start="earliest")
    t.append_many([b"1", b"2"])
    clock.advance(60)
    t.append(b"3")
    clock.advance(40)  # 1, 2 expire at the next op
    store.flush()
    t.append_many([b"4", b"5"])
    model = hooks(store, ModelStore)
    lost = [c for c in model.crash_candidates("t") if c.head == 5 and len(c.records) == 1]
    assert lost and all(c.subs["s"].gaps == [(1, 2), (4, 5)] for c in lost)


def _lose(backend: MemoryBackend, topic: str, lo: int, hi: int) -> None:
    """Seqs lo..hi above the head become a loss range (as a crash or a router makes one,
    DUR-3, RTR-5), engine-level: memory:// has no public path to one."""
    with backend.lock:
        t = backend.topics[topic]
        t.progress.note_loss(t.log, lo, hi)
        t.log.skip_to(hi)
        t.log.add_loss(lo, hi)
        backend._settle(t)  # SUB-2: the hwm moves over the lost seqs it had resolved


def test_SUB_4_SUB_7_memory_two_gaps_with_a_live_record_between() -> None:
    """SUB-4, SUB-7: on memory://, loss ranges 1..2 and 4..5 with live record 3 between are
    two gaps: Tombstone(1, 2), record 3, Tombstone(4, 5); ack(3) moves the hwm to 5."""
    with tidelog.open("memory://") as store:
        t = store.topic("t")
        sub = t.subscribe("s", start="earliest")
        backend = hooks(store, MemoryBackend)
        _lose(backend, "t", 1, 2)
        assert t.append(b"3") == 3
        _lose(backend, "t", 4, 5)
        assert backend.topics["t"].progress.subs["s"].gaps == [(1, 2), (4, 5)]
        _check_poll_order(sub, 5)


def _crashed_file_store(root: Path, clock: FakeClock) -> None:
    """TTL evicts 1, 2 (a gap for s) while 3 stays live; that is flushed; 4, 5 are appended
    and the process dies before they are synced: recovery makes them a loss range (DUR-3)."""
    store = tidelog.open(f"file://{root}?background=false&commit_interval_ms=60000", clock=clock)
    t = store.topic("t", durability="disk", ttl_ms=100, trim="none")
    t.subscribe("s", start="earliest")
    t.append_many([b"1", b"2"])
    clock.advance(60)
    t.append(b"3")
    clock.advance(40)
    assert t.state().earliest_seq == 3  # 1, 2 expired: s has the gap (1, 2)
    store.flush()
    t.append_many([b"4", b"5"])
    hooks(store, Abandon).abandon()


def _open(root: Path, clock: FakeClock) -> tidelog.Store:
    return tidelog.open(f"file://{root}?background=false", clock=clock)


def test_SUB_4_SUB_7_file_crash_loss_after_a_live_record_is_a_gap_of_its_own(
    tmp_path: Path,
) -> None:
    """SUB-4, SUB-7, DUR-3: on file://, a crash loses 4, 5 above the live, unresolved record 3
    while the TTL's gap (1, 2) is pending: after recovery the subscriber gets Tombstone(1, 2),
    record 3, then a tombstone from 4, and ack(3) moves its hwm past the lost seqs."""
    clock = FakeClock(0)
    _crashed_file_store(tmp_path, clock)
    with _open(tmp_path, clock) as store:
        t = store.topic("t")
        head = t.state().head_seq
        assert head >= 5 and t.state().count == 1
        _check_poll_order(t.subscriber("s"), head)


@pytest.mark.parametrize("polled", [0, 1])
def test_SUB_7_PRG_10_file_gaps_survive_a_clean_reopen(tmp_path: Path, polled: int) -> None:
    """SUB-7, PRG-10, DUR-1: the two gaps are durable like the hwm: closed cleanly with both
    pending (a version 2 progress file) or with the first already returned by a poll, the
    reopened store returns what is still pending, in seq order, around record 3."""
    clock = FakeClock(0)
    _crashed_file_store(tmp_path, clock)
    with _open(tmp_path, clock) as store:
        head = store.topic("t").state().head_seq
        if polled:
            assert _seqs(store.topic("t").subscriber("s").poll(max=1)) == [(1, 2)]
    with _open(tmp_path, clock) as store:
        sub = store.topic("t").subscriber("s")
        assert _seqs(sub.poll()) == [(1, 2), 3, (4, head)][polled:]
        sub.ack(3)
        assert sub.hwm == head
