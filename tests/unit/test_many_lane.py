"""The batch lane (backends/common/lane.py ``make_many_lane``) on the file backend: the WAL
frames, the seq reservations, an op under way, a failed shard and a crash are what the general
path would give. The handle-level tests (what the lane takes, its refusals) are in
test_append_lane.py."""

from __future__ import annotations

import sys
import threading
from pathlib import Path
from typing import Any

import pytest
from lane_helpers import General, count_general, is_many_lane

import tidelog
from tidelog import FakeClock
from tidelog.backends.common.lane import make_many_lane
from tidelog.backends.file import FileBackend
from tidelog.backends.file import journal as journal_mod
from tidelog.backends.file.format import wal as walfmt
from tidelog.backends.file.wal import HEADER_SIZE, wal_file_name
from tidelog.errors import StorageError
from tidelog.hooks import Abandon, hooks

OPTS = "commit_interval_ms=60000&wal_file_bytes=1MiB&prealloc=none"


@pytest.fixture
def general(monkeypatch: pytest.MonkeyPatch) -> General:
    return count_general(monkeypatch)


# -- the file backend's WAL --------------------------------------------------------------------


def _open(d: Path, clock: FakeClock, extra: str = "") -> tidelog.Store:
    return tidelog.open(f"file://{d}?{OPTS}{extra}", clock=clock)


def _frames(d: Path) -> bytes:
    buf = (d / "wal" / wal_file_name(1)).read_bytes()
    return buf[HEADER_SIZE : walfmt.scan_file(buf).end]


def _records(d: Path) -> list[tuple[int, int, int, list[bytes]]]:
    """The WAL's record frames: (tid, first seq, ts, payloads) each, in order."""
    out = []
    for f in walfmt.scan_file((d / "wal" / wal_file_name(1)).read_bytes()).frames:
        if f.type == walfmt.FrameType.APPEND:
            out.append((f.topic_id, f.seq, f.ts, [bytes(f.data)]))
        elif f.type == walfmt.FrameType.APPEND_BATCH:
            out.append((f.topic_id, f.seq, f.ts, walfmt.split_append_batch(bytes(f.data), "t")))
    return out


def _play(d: Path, durability: str, lane: bool, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Batches and single appends on two topics of ``durability``, with ts changes, a tagged
    batch, a one-record batch and a second handle; ``lane`` False: every batch takes the
    general path (no batch lane is made). Returns the store's directory, closed."""
    if not lane:
        monkeypatch.setattr(FileBackend, "many_lane", lambda self, ref, fallback: None)
    clock = FakeClock()
    s = _open(d, clock, "&head_reserve=64")
    t, u = s.topic("t", durability=durability), s.topic("u", durability=durability)
    assert is_many_lane(t.append_many) is lane
    other = s.topic("t").append_many
    seq = 0
    for n in range(30):
        if n % 7 == 3:
            clock.advance(1)
        k = 1 + (n * 5) % 9
        batch = [b"%d-%d" % (n, i) for i in range(k)]
        if n % 10 == 4:
            got = t.append_many(batch, tag="x")
        elif n % 10 == 6:
            got = u.append_many(batch)
        elif n % 10 == 8:
            got = other(batch)
        else:
            got = t.append_many(batch)
        if n % 10 != 6:
            assert got == list(range(seq + 1, seq + k + 1))
            seq += k
        if n % 3 == 0:
            seq += 1
            assert t.append(b"single-%d" % n) == seq
    s.close()
    monkeypatch.undo()
    return d


@pytest.mark.parametrize("durability", ["fsync", "memory"])
def test_WAL_14_lane_batches_write_the_general_paths_frames(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, durability: str
) -> None:
    """WAL-14, TOP-5, WAL-7: the same batches give the same WAL frames, byte for byte, whether
    the batch lane frames them or the general path does (one APPEND_BATCH frame a batch, an
    APPEND frame for one record, deferred single records placed first)."""
    fast = _frames(_play(tmp_path / "a", durability, True, monkeypatch))
    slow = _frames(_play(tmp_path / "b", durability, False, monkeypatch))
    assert len(fast) > 1000 and fast == slow


def test_WAL_12_disk_batches_hold_the_same_records_and_reserve_ahead(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """WAL-12, WAL-14: on ``disk`` topics the lane places seq reservations ahead of need (as the
    single lane does) where the general path reserves inside the op, so the HEAD_RESERVE frames
    differ; the record frames are the same, and both reopen to the same records."""
    a = _play(tmp_path / "a", "disk", True, monkeypatch)
    b = _play(tmp_path / "b", "disk", False, monkeypatch)
    assert _records(a) == _records(b) and len(_records(a)) > 30
    seen = []
    for d in (a, b):
        with _open(d, FakeClock()) as s:
            seen.append([(r.seq, r.payload, r.tag) for n in ("t", "u") for r in s.topic(n).read(0)])
    assert seen[0] == seen[1] and len(seen[0]) > 100


@pytest.mark.parametrize("durability", ["disk", "ephemeral"])
def test_DUR_3_every_seq_the_lane_hands_out_is_reserved_durably(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, durability: str, general: General
) -> None:
    """DUR-3, DUR-5, WAL-12: a batch the lane takes never has a seq above the topic's durable
    ceiling (a batch that would is the general path's, which reserves in its op and waits), so
    a crash never hands a seq out twice; the lane takes all but the first batch and those that
    outrun the ceiling. After a crash (no close) the head is at or above every seq handed
    out."""
    s = _open(tmp_path / "s", FakeClock(), "&head_reserve=32")
    t = s.topic("t", durability=durability)
    e = hooks(s, FileBackend)
    tid = e.topics["t"].tid
    handed = 0
    for n in range(200):
        before = len(general)
        seqs = t.append_many([b"x"] * (1 + n % 7))
        assert seqs[0] == handed + 1
        handed = seqs[-1]
        if len(general) == before:  # the lane's
            with e.lock:
                assert e.journal._ceiling(tid) >= handed
    assert 1 <= len(general) < 50
    hooks(s, Abandon).abandon()
    with _open(tmp_path / "s", FakeClock()) as again:
        assert again.topic("t").append_many([b"after"])[0] > handed


def test_WAL_7_an_op_under_way_sends_the_batch_to_the_fallback(tmp_path: Path) -> None:
    """WAL-7, TOP-1: while a journal op is under way, the hook answers FALLBACK and the lane's
    fallback takes the batch; the tail and the WAL are unchanged by it."""
    s = _open(tmp_path / "s", FakeClock())
    s.topic("t", durability="fsync")
    e = hooks(s, FileBackend)
    t = e.topics["t"]
    taken: list[object] = []

    def fallback(payloads: object, tag: Any, node: Any, producer: Any) -> list[int]:
        taken.append(payloads)
        return []

    am = make_many_lane(e, t, e.journal.lean_many(t), fallback)
    with e.lock:
        e.journal._ops[0] = []  # an op under way on this thread
        try:
            assert am([b"0", b"1"]) == [] and taken == [[b"0", b"1"]]
        finally:
            del e.journal._ops[0]
    assert t.log.head == 0 and am([b"a", b"b"]) == [1, 2]
    s.close()
    assert _records(tmp_path / "s") == [(t.tid, 1, 1_000_000, [b"a", b"b"])]


def test_FLT_4_a_failed_shard_refuses_the_batch(tmp_path: Path) -> None:
    """FLT-4: once the shard failed, the lane's batch raises the shard's StorageError and
    nothing is appended to the tail."""
    s = _open(tmp_path / "s", FakeClock())
    t = s.topic("t", durability="fsync")
    assert t.append_many([b"1", b"2"]) == [1, 2]
    e = hooks(s, FileBackend)
    shard = e.shards[0]
    shard.poison(StorageError("WAL shard 0: injected"))
    with pytest.raises(StorageError, match="injected"):
        t.append_many([b"3", b"4"])
    assert e.topics["t"].log.head == 2
    shard.abandon()


def test_DUR_2_lane_batches_survive_a_crash_once_acknowledged(tmp_path: Path) -> None:
    """DUR-2: ``fsync`` batches the lane acknowledged are all there after a crash (the store
    abandoned, never closed), in order, with the single appends between them."""
    s = _open(tmp_path / "s", FakeClock())
    t = s.topic("t", durability="fsync")
    want = []
    for n in range(50):
        batch = [b"%d.%d" % (n, i) for i in range(1 + n % 5)]
        t.append_many(batch)
        want += batch
        t.append(b"one-%d" % n)
        want.append(b"one-%d" % n)
    hooks(s, Abandon).abandon()
    with _open(tmp_path / "s", FakeClock()) as again:
        assert [r.payload for r in again.topic("t").read(0, limit=10_000)] == want


def test_journal_hook_of_the_batch_lane_is_made_per_topic(tmp_path: Path) -> None:
    """The batch hook's fields follow the topic's class: ``fsync`` waits (a ticket), ``disk``
    and ``ephemeral`` reserve (DUR-3, DUR-5), ``ephemeral`` is never logged, ``memory``
    reserves nothing (DUR-4)."""
    s = _open(tmp_path / "s", FakeClock())
    e = hooks(s, FileBackend)
    got = {}
    for cls in ("fsync", "disk", "memory", "ephemeral"):
        s.topic(cls, durability=cls)
        h = e.journal.lean_many(e.topics[cls])
        assert isinstance(h, journal_mod._ManyHook)
        got[cls] = (h.durable, h.reserves, h.logged)
    assert got == {
        "fsync": (True, False, True),
        "disk": (False, True, True),
        "memory": (False, False, True),
        "ephemeral": (False, True, False),
    }
    s.close()


@pytest.mark.parametrize("durability", ["fsync", "disk", "memory"])
def test_TOP_6_concurrent_lane_batches_and_single_appends_stay_atomic(
    tmp_path: Path, durability: str
) -> None:
    """TOP-6, TOP-1, DUR-1, WAL-14: four threads append batches through their handles' lanes
    while two append single records: every batch gets consecutive seqs, no seq is handed out
    twice or skipped, and the records read back, and replayed from the WAL after a crash, are
    exactly what each call was given, at the seqs it was told."""
    s = tidelog.open(f"file://{tmp_path}/s?head_reserve=64&commit_interval_ms=5")
    s.topic("t", durability=durability, trim="none")
    got: dict[int, bytes] = {}
    errors: list[BaseException] = []
    lock = threading.Lock()

    def batches(k: int) -> None:
        am = s.topic("t").append_many
        try:
            for n in range(60):
                batch = [b"b%d.%d.%d" % (k, n, i) for i in range(1 + (k + n) % 9)]
                seqs = am(batch)
                assert seqs == list(range(seqs[0], seqs[0] + len(batch)))
                with lock:
                    got.update(zip(seqs, batch, strict=True))
        except BaseException as exc:  # reported below, never lost
            errors.append(exc)

    def singles(k: int) -> None:
        ap = s.topic("t").append
        try:
            for n in range(150):
                payload = b"s%d.%d" % (k, n)
                seq = ap(payload)
                with lock:
                    got[seq] = payload
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=batches, args=(k,)) for k in range(4)]
    threads += [threading.Thread(target=singles, args=(k,)) for k in range(2)]
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-5)  # threads switch inside appends, not after whole runs of them
    try:
        for th in threads:
            th.start()
        for th in threads:
            th.join(120)
    finally:
        sys.setswitchinterval(interval)
    assert not errors and not any(th.is_alive() for th in threads)
    want = [got[q] for q in sorted(got)]
    assert sorted(got) == list(range(1, len(got) + 1))
    assert [r.payload for r in s.topic("t").read(0, limit=10_000)] == want
    s.flush()  # every class durable now: the crash below keeps all of it (DUR-1)
    hooks(s, Abandon).abandon()  # no clean close: the reopen replays the WAL's frames
    with tidelog.open(f"file://{tmp_path}/s") as again:
        items = again.topic("t").read(0, limit=10_000)
        # DUR-3: a disk topic's reserved, unused seqs after its last record read as a gap
        records = [r for r in items if hasattr(r, "payload")]
        assert [r.payload for r in records] == want and records[-1].seq == len(want)
