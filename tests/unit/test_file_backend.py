"""File-backend specifics beyond the shared semantics: the store lock, group commit, segment
sealing and dropping, recovery of a torn WAL tail, and option validation."""

from __future__ import annotations

import gc
import os
import struct
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import xxhash

import tidelog
from tidelog import FakeClock
from tidelog.backends.file import FileBackend, open_store
from tidelog.backends.file.format import snapshot as snapfmt
from tidelog.backends.file.format import wal as walfmt
from tidelog.backends.file.wal import WalShard, wal_file_name
from tidelog.fsio import OsFS
from tidelog.hooks import hooks


def backend(store: tidelog.Store) -> FileBackend:
    """The file backend itself: these tests look at its own internals (by its class, REG-5)."""
    return hooks(store, FileBackend)


def test_LOCK_1_second_opener_fails_naming_the_holder(tmp_path: Path) -> None:
    """LOCK-1, LOCK-2: a second process opening the same directory gets `locked` with the PID."""
    uri = f"file://{tmp_path / 's'}"
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, tidelog; s = tidelog.open(sys.argv[1]); print('held', flush=True); "
            "sys.stdin.read()",
            uri,
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        with pytest.raises(tidelog.Locked, match=f"pid {holder.pid}"):
            tidelog.open(uri)
    finally:
        holder.kill()
        holder.wait()
    with tidelog.open(uri) as store:  # the kernel released the lock when the holder died
        store.topic("t").append(b"x")


def test_LOCK_3_lock_files_stay_after_close(tmp_path: Path) -> None:
    """LOCK-3: neither .lock nor .lock.pid is removed on close; the next opener reuses them."""
    root = tmp_path / "s"
    tidelog.open(f"file://{root}").close()
    assert (root / ".lock").exists() and (root / ".lock.pid").read_text() == f"{os.getpid()}\n"
    tidelog.open(f"file://{root}").close()


def test_group_commit_shares_fdatasyncs_between_writers(tmp_path: Path) -> None:
    """WAL-11, DUR-2 group commit: concurrent fsync appends share fdatasyncs; a lone writer pays
    exactly one per append and is never made to wait for company."""
    with tidelog.open(f"file://{tmp_path / 's'}?background=false") as store:
        t = store.topic("t", durability="fsync")
        shard = backend(store).shards[0]
        before = shard.stats["fdatasyncs"]
        for _ in range(20):
            t.append(b"lone")
        assert shard.stats["fdatasyncs"] - before == 20

        before = shard.stats["fdatasyncs"]
        n_threads, each = 8, 40

        def writer() -> None:
            for _ in range(each):
                t.append(b"x" * 100)

        threads = [threading.Thread(target=writer) for _ in range(n_threads)]
        for th in threads:
            th.start()
        for th in threads:
            th.join()
        syncs = shard.stats["fdatasyncs"] - before
        assert t.state().head_seq == 20 + n_threads * each
        assert syncs < n_threads * each, f"{syncs} fdatasyncs for {n_threads * each} appends"


class _GatedHandle:
    """A file handle whose fdatasync waits for a permit once the gate is armed."""

    def __init__(self, inner: Any, gate: _Gate) -> None:
        self._inner = inner
        self._gate = gate

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def fdatasync(self) -> None:
        self._gate.wait()
        self._inner.fdatasync()


class _Gate:
    def __init__(self) -> None:
        self.armed = False
        self.entered = threading.Semaphore(0)  # one release per fdatasync that started waiting
        self.permits = threading.Semaphore(0)

    def wait(self) -> None:
        if self.armed:
            self.entered.release()
            assert self.permits.acquire(timeout=30), "test gate never opened"


class _GatedFS(OsFS):
    def __init__(self, gate: _Gate) -> None:
        self.gate = gate

    def open(self, path: str, *, create: bool = True) -> Any:
        return _GatedHandle(super().open(path, create=create), self.gate)


def test_WAL_13_a_record_is_readable_once_its_own_op_is_durable(tmp_path: Path) -> None:
    """WAL-13, DUR-2, WAL-11: when an fsync op becomes durable it publishes its own records,
    never those of a later op another thread placed meanwhile that no fdatasync covers yet
    (regression: it published up to the head)."""
    gate = _Gate()
    store = open_store(_GatedFS(gate), str(tmp_path / "s"), background=False, prealloc="none")
    t = store.topic("t", durability="fsync")
    t.append(b"a")
    gate.armed = True
    first = threading.Thread(target=t.append, args=(b"b",))
    first.start()
    assert gate.entered.acquire(timeout=30)  # b's leader is inside its fdatasync
    second = threading.Thread(target=t.append, args=(b"c",))
    second.start()
    deadline = time.monotonic() + 30
    while backend(store).shards[0].ops < 3 and time.monotonic() < deadline:
        time.sleep(0.001)  # c is queued behind b's sync
    gate.permits.release()  # b's fdatasync completes; c's leader starts its own and waits
    first.join(timeout=30)
    assert gate.entered.acquire(timeout=30)
    assert t.state().head_seq == 2  # c is placed, maybe written, but not durable
    assert [r.payload for r in t.read()] == [b"a", b"b"]  # type: ignore[union-attr]
    gate.permits.release()
    second.join(timeout=30)
    assert [r.payload for r in t.read()] == [b"a", b"b", b"c"]  # type: ignore[union-attr]
    gate.armed = False
    store.close()


def test_WAL_11_ops_queued_during_a_sync_share_the_next_one(tmp_path: Path) -> None:
    """WAL-11 group commit: while a leader's fdatasync runs, later fsync ops queue; when it
    ends, one of them leads a single write + fdatasync for all of them (its waiters are woken
    one by one, not all at once to race for the lead)."""
    gate = _Gate()
    store = open_store(_GatedFS(gate), str(tmp_path / "s"), background=False, prealloc="none")
    t = store.topic("t", durability="fsync")
    t.append(b"warm")
    shard = backend(store).shards[0]
    gate.armed = True
    syncs = shard.stats["fdatasyncs"]
    first = threading.Thread(target=t.append, args=(b"lead",))
    first.start()
    assert gate.entered.acquire(timeout=30)  # the leader is inside its fdatasync
    queued = [threading.Thread(target=t.append, args=(bytes([i]),)) for i in range(5)]
    for th in queued:
        th.start()
    deadline = time.monotonic() + 30
    while len(shard._waiters) < 5 and time.monotonic() < deadline:
        time.sleep(0.001)
    assert len(shard._waiters) == 5  # queued behind the running sync
    gate.permits.release()  # the leader's sync ends; one queued op leads the next
    assert gate.entered.acquire(timeout=30)
    gate.permits.release()
    for th in [first, *queued]:
        th.join(timeout=30)
    assert shard.stats["fdatasyncs"] - syncs == 2
    assert t.state().head_seq == 7
    gate.armed = False
    store.close()


def test_disk_class_is_written_by_the_committer(tmp_path: Path) -> None:
    """DUR-3, WAL-11, WAL-12: a disk append returns before any fdatasync (only the first one
    waits, for its durable seq reservation); the committer writes and syncs it within
    commit_interval_ms."""
    with tidelog.open(f"file://{tmp_path / 's'}?commit_interval_ms=5") as store:
        t = store.topic("t", durability="disk", trim="none")
        shard = backend(store).shards[0]
        t.append(b"first")  # the first append makes a durable head reservation
        synced = shard.ops_synced
        t.append(b"second")
        assert shard.ops_synced == synced < shard.ops  # acknowledged without waiting
        deadline = time.monotonic() + 5
        # the committer may place a SYNCED frame (WAL-16) after its sync: wait for that too
        while (
            shard.ops_synced < shard.ops or shard.synced < shard.submitted
        ) and time.monotonic() < deadline:
            time.sleep(0.005)
        assert shard.ops_synced == shard.ops and shard.synced == shard.submitted


@pytest.mark.parametrize("durability", ["disk", "ephemeral"])
def test_WAL_12_next_reservation_is_placed_ahead_and_not_waited_for(
    tmp_path: Path, durability: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """WAL-12, DUR-3, DUR-5: half a reservation below the durable ceiling, the next
    HEAD_RESERVE is placed ahead (ceiling = head before the op + head_reserve) and the committer
    syncs it at once, though its interval is a minute: appends past the old ceiling then wait
    for nothing. After a crash the head is raised over at most head_reserve seqs."""
    root = tmp_path / "s"
    uri = f"file://{root}?head_reserve=16&commit_interval_ms=60000&background=false"
    store = tidelog.open(uri)
    t = store.topic("t", durability=durability)
    shard = backend(store).shards[0]
    waits: list[int] = []
    wait_synced = WalShard.wait_synced

    def counted(self: WalShard, op: int) -> None:
        if self is shard:
            waits.append(op)
        wait_synced(self, op)

    monkeypatch.setattr(WalShard, "wait_synced", counted)  # WalShard has slots, no __dict__
    t.append(b"0")  # seq 1: above the ceiling (0), reserves through 16 in its op and waits
    assert len(waits) == 1
    for i in range(2, 10):  # seq 9 passes 16 - 16 / 2: the reservation through 24 goes ahead
        assert t.append(b"%d" % i) == i
    deadline = time.monotonic() + 10
    while shard.synced < shard.submitted and time.monotonic() < deadline:
        time.sleep(0.001)
    assert shard.synced == shard.submitted  # nudged: synced long before its next tick
    for i in range(10, 25):  # past the first ceiling (16), up to the one placed ahead
        assert t.append(b"%d" % i) == i
    assert len(waits) == 1
    image = (root / "wal" / wal_file_name(shard.gen)).read_bytes()
    reserved = [
        f.seq for f in walfmt.scan_file(image).frames if f.type == walfmt.FrameType.HEAD_RESERVE
    ]
    assert reserved[:2] == [16, 24] and all(r <= 16 + 23 for r in reserved)
    backend(store).abandon()  # a crash: the head is raised over the reservations made durable
    with tidelog.open(uri) as store:
        head = store.topic("t").state().head_seq
        assert 24 <= head <= 24 + 16
        assert store.topic("t").append(b"next") == head + 1


def test_WAL_12_a_checkpoint_records_the_reservation_placed_ahead(tmp_path: Path) -> None:
    """WAL-12, DUR-3: a reservation placed ahead and synced, but not yet taken in by an
    append, is the ceiling the checkpoint's snapshot records: the checkpoint may retire the
    WAL file holding it, and the appends after it rely on it (found by the random crash
    workloads: a disk topic recovered below seqs it had acknowledged)."""
    root = tmp_path / "s"
    uri = f"file://{root}?head_reserve=8&commit_interval_ms=60000&background=false"
    store = tidelog.open(uri)
    t = store.topic("t", durability="disk")
    shard = backend(store).shards[0]
    for i in range(1, 6):  # seq 1 reserves through 8; seq 5 places 4 + 8 = 12 ahead
        t.append(b"%d" % i)
    deadline = time.monotonic() + 10
    while shard.synced < shard.submitted and time.monotonic() < deadline:
        time.sleep(0.001)
    assert shard.synced == shard.submitted
    n = backend(store).checkpoint()
    _, body = snapfmt.decode_snapshot((root / "meta" / snapfmt.file_name(n)).read_bytes())
    (topic,) = body["topics"]
    assert topic["head"] == 5 and topic["ceiling"] == 12
    store.close()


def test_segments_are_sealed_and_dropped_whole(tmp_path: Path) -> None:
    """SEG-1, RET-2, WAL-13: checkpoints seal the tail into segments (then read from the mmap);
    cap eviction advances the floor at once and drops a segment's files only when all its
    records are gone."""
    root = tmp_path / "s"
    uri = f"file://{root}?background=false&segment_max_records=4"
    clock = FakeClock()
    with tidelog.open(uri, clock=clock) as store:
        t = store.topic("t", cap_records=6)
        t.append_many([bytes([i]) for i in range(6)])
        backend(store).checkpoint()
        files = sorted(p.name for p in root.glob("topics/*/seg-*.data"))
        assert files == ["seg-00000000000000000001.data", "seg-00000000000000000005.data"]
        t.append_many([b"a", b"b", b"c"])  # evicts seqs 1-3: segment 1 still holds seq 4
        assert t.state().evict_floor == 4
        backend(store).checkpoint()
        assert list(root.glob("topics/*/seg-00000000000000000001.data")), "seq 4 still lives"
        t.append(b"d")  # evicts 4: segment 1 is empty now
        backend(store).checkpoint()
        names = sorted(p.name for p in root.glob("topics/*/seg-*.data"))
        assert "seg-00000000000000000001.data" not in names
        assert [r.payload for r in t.read() if isinstance(r, tidelog.Record)] == [  # type: ignore[union-attr]
            b"\x04",
            b"\x05",
            b"a",
            b"b",
            b"c",
            b"d",
        ]
    with tidelog.open(uri, clock=clock) as store:
        assert store.topic("t").state().evict_floor == 5


def test_WAL_5_torn_tail_is_truncated_and_reported(tmp_path: Path) -> None:
    """WAL-5: garbage after the last complete op is a torn tail: recovery discards it, keeps
    everything before it, and new appends continue after the last kept seq."""
    root = tmp_path / "s"
    uri = f"file://{root}?background=false&prealloc=none"
    store = tidelog.open(uri)
    store.topic("t").append_many([b"kept-1", b"kept-2"])
    b = backend(store)
    b.abandon()  # like SIGKILL: nothing more is written
    wal = next(root.glob("wal/wal-*.log"))
    with wal.open("ab") as f:
        f.write(b"\x40\x00\x00\x00" + os.urandom(30))  # a frame that claims 64 bytes, torn
    with tidelog.open(uri) as store:
        t = store.topic("t")
        assert [r.payload for r in t.read()] == [b"kept-1", b"kept-2"]  # type: ignore[union-attr]
        assert any("torn tail" in w for w in backend(store).warnings)
        assert t.append(b"next") == 3


def test_WAL_14_append_many_is_one_batch_frame_and_replays(tmp_path: Path) -> None:
    """WAL-14, TOP-6, DUR-2: append_many writes one APPEND_BATCH frame; after a crash replay
    gives back every record with its seq, ts and labels (append_records runs keep their own),
    and single appends between them too."""
    root = tmp_path / "s"
    uri = f"file://{root}?background=false&prealloc=none"
    store = tidelog.open(uri)
    t = store.topic("t", durability="fsync")
    t.append(b"single")
    t.append_many([b"a", b"", b"c" * 5000], tag="x")
    t.append_records([(b"r1", None, "n"), (b"r2", None, "n"), (b"r3", "y", None)])
    t.append(b"s2")
    t.append(b"s3")
    want = [(r.seq, r.ts, r.tag, r.node, r.payload) for r in t.read()]  # type: ignore[union-attr]
    image = next(root.glob("wal/wal-*.log")).read_bytes()
    types = [f.type for f in walfmt.scan_file(image).frames if f.type in (1, 16)]
    assert types == [1, 16, 16, 1, 1, 1]  # the r1/r2 run is one frame, r3 its own APPEND
    backend(store).abandon()
    with tidelog.open(uri) as store:
        t = store.topic("t")
        got = [(r.seq, r.ts, r.tag, r.node, r.payload) for r in t.read()]  # type: ignore[union-attr]
        assert got == want and len(got) == 9
        assert store.topic("t").append(b"next") == 10


def test_WAL_14_a_batch_frame_with_bad_lengths_stops_recovery(tmp_path: Path) -> None:
    """WAL-14: a checksum-valid APPEND_BATCH whose lengths disagree with its data is a writer
    bug, not a torn tail: opening the store refuses (Corrupt) instead of dropping records."""
    root = tmp_path / "s"
    uri = f"file://{root}?background=false&prealloc=none"
    store = tidelog.open(uri)
    store.topic("t").append(b"kept")
    tid = 1
    b = backend(store)
    b.abandon()
    data = struct.pack("<III", 2, 1, 9) + b"ab"
    body = struct.pack("<BBQQQHHI", 16, 0x08, tid, 2, 0, 0, 0, len(data)) + data
    wal = next(root.glob("wal/wal-*.log"))
    seed = walfmt.frame_seed(walfmt.decode_header(wal.read_bytes()))  # WAL-15
    digest = struct.pack("<Q", xxhash.xxh3_64_intdigest(body, seed))
    frame = struct.pack("<I", len(body) + 8) + body + digest
    with wal.open("ab") as f:
        f.write(frame)
    with pytest.raises(tidelog.Corrupt, match="WAL-14"):
        tidelog.open(uri)


@pytest.mark.parametrize(
    "bad",
    [
        "wal_shards=0",
        "prealloc=maybe",
        "segment_max_bytes=5GiB",
        "wal_file_bytes=1",
        "wal_recycle=-1",
        "colour=red",
        "create=perhaps",
    ],
)
def test_URI_2_file_options_are_validated(tmp_path: Path, bad: str) -> None:
    """URI-2: a bad file:// option is refused before the directory is created."""
    root = tmp_path / "never"
    with pytest.raises(tidelog.BadOption):
        tidelog.open(f"file://{root}?{bad}")
    assert not root.exists()


def test_missing_directory_with_create_false(tmp_path: Path) -> None:
    """ERR-1: a missing store directory with create=false is a clear typed error."""
    with pytest.raises(tidelog.StorageError, match="does not exist"):
        tidelog.open(f"file://{tmp_path / 'missing'}?create=false")


def test_wal_shards_and_changing_the_shard_count(tmp_path: Path) -> None:
    """WAL-10: topics spread over shards; reopening with another shard count replays every
    stream, and the next checkpoint retires the old layout."""
    root = tmp_path / "s"
    with tidelog.open(f"file://{root}?wal_shards=3&background=false") as store:
        for i in range(6):
            store.topic(f"t{i}").append(bytes([i]))
        assert len({p.parent.name for p in root.glob("wal/shard-*/wal-*.log")}) == 3
        backend(store).abandon()
    with tidelog.open(f"file://{root}?wal_shards=1&background=false") as store:
        assert [store.topic(f"t{i}").read()[0].payload for i in range(6)] == [  # type: ignore[union-attr]
            bytes([i]) for i in range(6)
        ]
        backend(store).checkpoint()
        assert not list(root.glob("wal/shard-*/wal-*.log"))


def test_an_open_store_holds_two_descriptors_per_sealed_segment(tmp_path: Path) -> None:
    """Resource budget: a sealed segment costs the process two file descriptors (the .data
    map, and the .idx map until a read decodes its entries), not more, so a default soft limit
    of 1024 descriptors still opens stores of ~500 segments; a read of every segment lets the
    .idx maps go."""
    root = tmp_path / "s"
    uri = f"file://{root}?background=false&segment_max_records=50"
    with tidelog.open(uri) as store:
        t = store.topic("t", durability="disk")
        for i in range(40):
            t.append_many([b"r%d" % i] * 50)
    fds = lambda: len(os.listdir("/proc/self/fd"))  # noqa: E731
    gc.collect()  # an earlier test's garbage closing its files would count against this store
    before = fds()
    store = tidelog.open(uri)
    try:
        segments = sum(store.describe()["segments"].values())  # type: ignore[union-attr]
        assert segments >= 40
        opened = fds() - before
        assert segments * 2 <= opened <= segments * 2 + 8  # + lock, WAL file, directories
        assert len(store.topic("t").read(0, 5000)) == 2000
        assert fds() - before <= segments + 8  # decoded: only the .data maps are left
    finally:
        store.close()
    assert fds() - before <= 2
