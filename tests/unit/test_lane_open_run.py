"""The lane extends a WAL shard's open run itself (backends/common/lane.py, "Open runs"): a
``disk`` or ``memory`` record that the journal's hook would only add to the open run is added
by the lane, without calling the hook. These tests check that every case the hook must see
still reaches it (a ts change, a seq not the run's next, another topic's record, a
reservation step, an op under way, a failed shard, the committer placing the run; for
``ephemeral``, a reservation step or an op), and that the WAL holds the same frames, byte for
byte, as when every record goes through the hook."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import tidelog
from tidelog import FakeClock
from tidelog.backends.common.lane import RunHook, make_lane
from tidelog.backends.file import FileBackend
from tidelog.backends.file import journal as journal_mod
from tidelog.backends.file.format import wal as walfmt
from tidelog.backends.file.wal import HEADER_SIZE, WalShard, wal_file_name
from tidelog.errors import StorageError
from tidelog.hooks import hooks

OPTS = "commit_interval_ms=60000&wal_file_bytes=1MiB&prealloc=none"


def _open(d: Path, clock: FakeClock, extra: str = "") -> tidelog.Store:
    return tidelog.open(f"file://{d}?{OPTS}{extra}", clock=clock)


def _shard(store: tidelog.Store) -> WalShard:
    return hooks(store, FileBackend).shards[0]


class Calls(list[int]):
    """The seqs the buffered hooks were called for, in order, and the last hook called."""

    hook: RunHook | None = None


@pytest.fixture
def calls(monkeypatch: pytest.MonkeyPatch) -> Calls:
    seen = Calls()
    real = journal_mod._BufferedHook.__call__

    def counted(self: Any, seq: int, ts: int, payload: bytes) -> object:
        seen.append(seq)
        seen.hook = self
        return real(self, seq, ts, payload)

    monkeypatch.setattr(journal_mod._BufferedHook, "__call__", counted)
    return seen


def _records(d: Path) -> list[tuple[int, int, int, list[bytes]]]:
    """The WAL's record frames: (tid, first seq, ts, payloads) each, in order."""
    buf = (d / "wal" / wal_file_name(1)).read_bytes()
    out = []
    for f in walfmt.scan_file(buf).frames:
        if f.type == walfmt.FrameType.APPEND:
            out.append((f.topic_id, f.seq, f.ts, [bytes(f.data)]))
        elif f.type == walfmt.FrameType.APPEND_BATCH:
            out.append((f.topic_id, f.seq, f.ts, walfmt.split_append_batch(bytes(f.data), "test")))
    return out


def test_WAL_14_a_run_continued_by_the_lane_calls_the_hook_once(
    tmp_path: Path, calls: Calls
) -> None:
    """WAL-14, TOP-1: records of one topic sharing a ts go to the hook only for the first one
    (it opens the run); the lane adds the rest, and they are one APPEND_BATCH frame."""
    clock = FakeClock()
    s = _open(tmp_path / "s", clock)
    ap = s.topic("t", durability="memory").append
    assert [ap(b"%d" % i) for i in range(50)] == list(range(1, 51))
    assert calls == [1]
    shard = _shard(s)
    assert shard.ops == 51 and shard._run_next == 51  # TOPIC_CREATE + 50 records
    s.close()
    ((_, first, ts, payloads),) = _records(tmp_path / "s")
    assert (first, ts, payloads) == (1, 1_000_000, [b"%d" % i for i in range(50)])


def test_WAL_14_ts_change_and_other_topic_go_to_the_hook(tmp_path: Path, calls: Calls) -> None:
    """WAL-14, TOP-5: a new ts and another topic's record on the shard each go to the hook;
    a record another handle of the topic added to the open run does not stop this handle's
    lane from continuing it (the run's next seq is the shard's); the frames follow the runs
    exactly."""
    clock = FakeClock()
    s = _open(tmp_path / "s", clock)
    t = s.topic("t", durability="memory")
    ap, other = t.append, s.topic("t").append  # two handles: two lanes of one topic
    up = s.topic("u", durability="memory").append
    ap(b"a1")
    ap(b"a2")
    clock.advance(1)
    ap(b"b3")  # a new ts: the hook opens a new run
    ap(b"b4")
    up(b"u1")  # another topic's record closes t's run
    ap(b"c5")
    ap(b"c6")
    other(b"c7")  # the other lane's first record: through its hook, extending the same run
    ap(b"c8")  # the run's next seq: this lane continues it
    ap(b"c9")
    assert calls == [1, 3, 1, 5, 7]
    s.close()
    assert _records(tmp_path / "s") == [
        (1, 1, 1_000_000, [b"a1", b"a2"]),
        (1, 3, 1_000_001, [b"b3", b"b4"]),
        (2, 1, 1_000_001, [b"u1"]),
        (1, 5, 1_000_001, [b"c5", b"c6", b"c7", b"c8", b"c9"]),
    ]


@pytest.mark.parametrize("between", ["seq_not_next", "committer_placed"])
def test_WAL_14_a_seq_not_the_runs_next_or_a_placed_run_goes_to_the_hook(
    tmp_path: Path, calls: Calls, between: str
) -> None:
    """WAL-14, TOP-1: between two appends, either the open run's next seq (``_run_next``)
    stops being the record's (moved here by hand: no path of the engine assigns a topic's seq
    outside an op, which closes the run), or the committer places the deferred records (what
    its tick does, ``_place_deferred``), so the lane's run is no longer the shard's open run.
    Either way the next record goes to the hook and starts a new frame; the first is intact
    and the shard's op count stays right."""
    clock = FakeClock()
    s = _open(tmp_path / "s", clock)
    ap = s.topic("t", durability="memory").append
    shard = _shard(s)
    ap(b"1")
    ap(b"2")
    if between == "seq_not_next":
        with hooks(s, FileBackend).lock:
            shard._run_next = 7
    else:
        shard._place_deferred()
        assert not shard._run and shard.ops_placed == shard.ops == 3
    ap(b"3")
    ap(b"4")
    assert calls == [1, 3] and shard.ops == 5
    s.close()
    assert _records(tmp_path / "s") == [
        (1, 1, 1_000_000, [b"1", b"2"]),
        (1, 3, 1_000_000, [b"3", b"4"]),
    ]


def test_WAL_12_every_reservation_step_goes_to_the_hook(tmp_path: Path, calls: Calls) -> None:
    """WAL-12, DUR-3: on a ``disk`` topic the lane adds a record to the open run only below
    the hook's next reservation step; every seq at or above it goes to the hook, which places
    the next reservation ahead (one ts throughout: the run is never cut by time)."""
    clock = FakeClock()
    s = _open(tmp_path / "s", clock, "&head_reserve=32")
    ap = s.topic("t", durability="disk").append
    for i in range(400):
        before = len(calls)
        seq = ap(b"x")
        assert seq == i + 1
        if len(calls) == before:  # the lane took it: no step was due (low moves in the hook)
            assert calls.hook is not None and seq < calls.hook.low
    assert len(calls) >= 400 // 16  # a step at least every head_reserve // 2 seqs
    s.close()
    runs = _records(tmp_path / "s")
    seqs = [q for _, first, _, ps in runs for q in range(first, first + len(ps))]
    assert seqs == list(range(1, 401))


def test_WAL_7_an_op_under_way_sends_the_record_to_the_fallback(tmp_path: Path) -> None:
    """WAL-7, TOP-1: while a journal op is under way (its effects not yet submitted), the lane
    neither adds to the open run nor skips the hook: the hook answers FALLBACK and the lane's
    fallback takes the record, the run unchanged. Its first record too: the records after it
    are logged (a ``memory`` hook's reservation step is never due, yet the lane still calls it
    until it opened a run)."""
    clock = FakeClock()
    s = _open(tmp_path / "s", clock)
    s.topic("t", durability="memory")
    e = hooks(s, FileBackend)
    t = e.topics["t"]
    taken: list[bytes] = []

    def fallback(payload: object, tag: str | None, node: str | None) -> None:
        taken.append(payload)  # type: ignore[arg-type]

    def under_op(payload: bytes) -> int | None:
        with e.lock:
            e.journal._ops[0] = []  # an op under way on this thread
            try:
                return ap(payload)
            finally:
                del e.journal._ops[0]

    ap = make_lane(e, t, e.journal.lean(t), fallback)
    shard = _shard(s)
    assert under_op(b"0") is None and taken == [b"0"]
    assert ap(b"1") == 1 and ap(b"2") == 2
    assert under_op(b"3") is None
    assert taken == [b"0", b"3"] and shard._run == [b"1", b"2"] and t.log.head == 2
    assert ap(b"3") == 3
    s.close()
    assert _records(tmp_path / "s") == [(1, 1, 1_000_000, [b"1", b"2", b"3"])]


def test_DUR_5_ephemeral_reservation_steps_go_to_the_hook(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """DUR-5, WAL-12: an ``ephemeral`` topic's records are never logged; the lane calls its
    hook only for a seq at or above the hook's next reservation step, or with an op under way,
    and the reservations follow the head as the hook places them."""
    seen: list[tuple[int, int]] = []
    hooks_seen: list[Any] = []
    real = journal_mod._ReservingHook.__call__

    def counted(self: Any, seq: int, ts: int, payload: bytes) -> object:
        seen.append((seq, self.low))
        hooks_seen.append(self)
        return real(self, seq, ts, payload)

    monkeypatch.setattr(journal_mod._ReservingHook, "__call__", counted)
    clock = FakeClock()
    s = _open(tmp_path / "s", clock, "&head_reserve=32")
    ap = s.topic("t", durability="ephemeral").append
    for i in range(300):
        before = len(seen)
        assert ap(b"x") == i + 1
        if len(seen) == before:
            assert i + 1 < hooks_seen[-1].low
        else:
            assert seen[-1][0] == i + 1
    assert seen[0] == (1, 0) and len(seen) >= 300 // 16 and len(set(map(id, hooks_seen))) == 1
    assert all(seq >= low for seq, low in seen)  # called only when a step was due
    e = hooks(s, FileBackend)
    t = e.topics["t"]
    taken: list[object] = []
    lane = make_lane(e, t, e.journal.lean(t), lambda p, tag, node: taken.append(p))
    assert lane(b"y") == 301  # a new lane: its hook is called first
    with e.lock:
        e.journal._ops[0] = []
        try:
            assert lane(b"z") is None and taken == [b"z"]
        finally:
            del e.journal._ops[0]
    assert max(e.journal.reserved().values()) >= 300
    s.close()
    assert _records(tmp_path / "s") == []


def test_FLT_4_a_failed_shard_refuses_the_next_record(tmp_path: Path) -> None:
    """FLT-4: once the shard failed, the next record is not added to the open run: it goes to
    the hook, whose deferral raises the shard's StorageError; nothing is appended."""
    clock = FakeClock()
    s = _open(tmp_path / "s", clock)
    t = s.topic("t", durability="memory")
    ap = t.append
    shard = _shard(s)
    assert ap(b"1") == 1 and ap(b"2") == 2
    error = StorageError("WAL shard 0: injected")
    shard.poison(error)
    with pytest.raises(StorageError, match="injected"):
        ap(b"3")
    assert shard._run == [b"1", b"2"] and hooks(s, FileBackend).topics["t"].log.head == 2
    shard.abandon()


SCRIPT: list[tuple[str, Any]] = [
    ("t", 20),
    ("tick", 1),
    ("t", 5),
    ("u", 3),
    ("t", 7),
    ("tag", 1),
    ("t", 4),
    ("other", 2),
    ("t", 3),
    ("place", None),
    ("t", 6),
    ("tick", 3),
    ("u", 2),
    ("t", 9),
]


def _play(d: Path, through_hook: bool, monkeypatch: pytest.MonkeyPatch) -> bytes:
    """Run SCRIPT on a new store; ``through_hook``: every lane calls the hook for every record
    (its hook wrapped in a plain function, which the lane does not extend runs for). Returns
    the WAL's frames (after the header, which names the store and the time)."""
    if through_hook:
        real = journal_mod.WalJournal.lean

        def wrapped(self: Any, t: Any) -> Callable[[int, int, bytes], object]:
            one = real(self, t)
            return lambda seq, ts, payload: one(seq, ts, payload)

        monkeypatch.setattr(journal_mod.WalJournal, "lean", wrapped)
    clock = FakeClock()
    s = _open(d, clock)
    t, u = s.topic("t", durability="memory"), s.topic("u", durability="memory")
    ap, up, other = t.append, u.append, s.topic("t").append
    for n, (what, k) in enumerate(SCRIPT):
        if what == "tick":
            clock.advance(k)
        elif what == "place":
            _shard(s)._place_deferred()
        elif what == "tag":
            t.append(b"tagged", tag="x")
        else:
            fn = {"t": ap, "u": up, "other": other}[what]
            for i in range(k):
                fn(b"%s-%d-%d" % (what.encode(), n, i))
    s.close()
    monkeypatch.undo()
    buf = (d / "wal" / wal_file_name(1)).read_bytes()
    end: int = walfmt.scan_file(buf).end
    return buf[HEADER_SIZE:end]


def test_WAL_14_wal_bytes_are_the_same_with_and_without_the_lanes_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """WAL-14, TOP-5: the same appends (ts changes, two topics, a labelled record, two
    handles of a topic, the committer placing between two appends) give the same WAL frames,
    byte for byte, whether the lane extends open runs or every record goes to the hook."""
    fast = _play(tmp_path / "a", False, monkeypatch)
    slow = _play(tmp_path / "b", True, monkeypatch)
    assert len(fast) > 1000 and fast == slow


def test_DUR_4_a_memory_topics_step_reserves_nothing(tmp_path: Path) -> None:
    """DUR-4, WAL-12: a ``memory`` topic reserves no seqs: when a record reaches its hook's
    step (``low``), the hook only moves ``low`` ahead; no HEAD_RESERVE is placed, the record
    joins the open run like the others."""
    clock = FakeClock()
    s = _open(tmp_path / "s", clock)
    s.topic("t", durability="memory")
    e = hooks(s, FileBackend)
    t = e.topics["t"]
    hook = e.journal.lean(t)
    ap = make_lane(e, t, hook, lambda p, tag, node: None)
    assert ap(b"1") == 1 and hook.low == 1 + (1 << 20)
    hook.low = 3  # the lane reads it at its next call of the hook: a new run
    clock.advance(1)
    assert ap(b"2") == 2 and ap(b"3") == 3 and ap(b"4") == 4
    assert hook.low == 3 + (1 << 20) and e.journal.reserved() == {}
    s.close()
    assert _records(tmp_path / "s") == [
        (1, 1, 1_000_000, [b"1"]),
        (1, 2, 1_000_001, [b"2", b"3", b"4"]),
    ]
    buf = (tmp_path / "s" / "wal" / wal_file_name(1)).read_bytes()
    types = {f.type for f in walfmt.scan_file(buf).frames}
    assert walfmt.FrameType.HEAD_RESERVE not in types
