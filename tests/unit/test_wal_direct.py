"""The lone writer's direct path (``WalShard._direct``, backends/file/wal.py): a durable single
append whose op is the one deferred places its frame and leads the write + fdatasync in one turn
of the locks. It writes the same bytes as the general loop of ``wait_synced`` (APPEND frames,
WAL-3; SYNCED frames, WAL-16; rotation and FILE_END, WAL-15), a failed write or sync on it
poisons the shard as before (FLT-4), and concurrent writers still share syncs with every
acknowledged record durable."""

from __future__ import annotations

import os
import threading
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tidelog.backends.file import FileBackend, open_store
from tidelog.backends.file.format import wal as walfmt
from tidelog.backends.file.wal import WalShard
from tidelog.clock import FakeClock
from tidelog.conformance.crashfs import RecordingFS
from tidelog.conformance.faultfs import Fault, FaultFS
from tidelog.errors import BadArgument, StorageError
from tidelog.hooks import hooks

ROOT = "/data/store"
OPTIONS: dict[str, Any] = dict(
    wal_file_bytes="64KiB", prealloc="none", background=False, commit_interval_ms=60_000
)


def _loop_only(self: WalShard, op: int) -> bool:
    """``_direct`` declining every time (its arrival counted, as it does): the general loop."""
    with self.lock:
        self._arrived += 1
    return False


def _payload(i: int) -> bytes:
    # mostly small records, now and then one past the encoder's streaming size (4096)
    return bytes([i % 251]) * (5000 if i % 97 == 0 else 40 + i % 180)


def _wal_images(count: int) -> dict[str, bytes]:
    """``count`` fsync appends on a fresh store with 64 KiB WAL files (several rotations): each
    WAL file's bytes, before the close (whose checkpoint retires them)."""
    clock = FakeClock(1_700_000_000_000)
    fs = RecordingFS()
    store = open_store(fs, ROOT, clock, **OPTIONS)
    t = store.topic("t", durability="fsync")
    for i in range(count):
        t.append(_payload(i))
        if i % 3 == 0:
            clock.advance(1)
    wal = f"{ROOT}/wal"
    names = sorted(n for n in fs.listdir(wal) if walfmt.parse_file_name(n) is not None)
    out = {}
    for name in names:
        h = fs.open(os.path.join(wal, name), create=False)
        try:
            out[name] = h.pread(h.size(), 0)
        finally:
            h.close()
    store.close()
    return out


def test_WAL_3_WAL_15_WAL_16_the_direct_path_writes_the_loops_bytes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    taken: list[bool] = []
    direct = WalShard._direct

    def counted(self: WalShard, op: int) -> bool:
        done = direct(self, op)
        taken.append(done)
        return done

    monkeypatch.setattr(WalShard, "_direct", counted)
    new = _wal_images(1200)
    assert len(taken) >= 1200 and all(taken)  # every append took the direct path
    monkeypatch.setattr(WalShard, "_direct", _loop_only)
    old = _wal_images(1200)
    assert len(new) >= 3  # rotations: FILE_END frames, reseeded first chunks
    assert list(new) == list(old)
    for name in new:  # the header holds the store id and creation time: all else is equal
        assert new[name][walfmt.HEADER_SIZE :] == old[name][walfmt.HEADER_SIZE :], name
    frames = [f for img in new.values() for f in walfmt.scan_file(img).frames]
    assert sum(f.type == walfmt.FrameType.SYNCED for f in frames) > 1100  # one per append


@given(
    tid=st.integers(0, 2**64 - 1),
    seq=st.integers(0, 2**64 - 1),
    ts=st.integers(0, 2**64 - 1),
    size=st.sampled_from([0, 1, 100, 4095, 4096, 9000]),
    durable=st.booleans(),
    batch_end=st.booleans(),
    seed=st.integers(0, 2**64 - 1),
    synced=st.integers(0, 2**64 - 1),
)
def test_WAL_3_WAL_16_encode_plain_is_encode_append_without_labels(
    tid: int, seq: int, ts: int, size: int, durable: bool, batch_end: bool, seed: int, synced: int
) -> None:
    """WAL-3: the frame of ``encode_append`` with no tag or node; WAL-16: with ``synced``, the
    SYNCED frame of ``encode_synced`` before it."""
    payload = bytes(range(256)) * (size // 256) + bytes(size % 256)
    flags = (walfmt.DURABLE if durable else 0) | (walfmt.BATCH_END if batch_end else 0)
    want = walfmt.encode_append(
        tid, seq, ts, None, None, payload, batch_end=batch_end, durable=durable, seed=seed
    )
    assert walfmt.encode_plain(tid, seq, ts, payload, flags, seed) == want
    mark = walfmt.encode_synced(seed, synced) if synced else b""
    assert walfmt.encode_plain(tid, seq, ts, payload, flags, seed, synced) == mark + want


@pytest.mark.parametrize("size", [10, 5000])
def test_WAL_3_encode_plain_refuses_a_field_out_of_range(size: int) -> None:
    with pytest.raises(BadArgument, match="out of range"):
        walfmt.encode_plain(1, 2**64, 0, bytes(size), walfmt.BATCH_END, 0)


@pytest.mark.parametrize("kind", ["pwrite", "fdatasync"])
def test_FLT_4_a_failed_write_or_sync_on_the_direct_path_poisons(
    kind: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """FLT-4, FLT-5: the third durable single append's WAL write (or sync) fails on the direct
    path: it raises io_error, so does every later append, and a reopen finds the two
    acknowledged records (the failed one may be there too)."""
    taken: list[bool] = []
    direct = WalShard._direct

    def counted(self: WalShard, op: int) -> bool:
        try:
            done = direct(self, op)
        except StorageError:
            taken.append(True)
            raise
        taken.append(done)
        return done

    monkeypatch.setattr(WalShard, "_direct", counted)
    inner = RecordingFS()
    fs = FaultFS(inner)
    fs.armed = False
    store = open_store(fs, ROOT, FakeClock(1_000_000), **OPTIONS)
    t = store.topic("t", durability="fsync")
    shard = hooks(store, FileBackend).shards[0]
    outcomes = []
    synced = 0
    for i in range(5):
        if i == 2:  # the WAL's next call of this kind fails
            synced = shard.ops_synced
            fs.faults = [Fault("eio", kind=kind, path="/wal/")]
            fs.armed = True
        try:
            t.append(b"r%d" % i)
            outcomes.append("ok")
        except StorageError as exc:
            outcomes.append(exc.code)
    assert [(f.kind, f.fault) for f in fs.injected] == [(kind, "eio")]
    assert outcomes == ["ok", "ok", "io_error", "io_error", "io_error"]
    assert taken[:3] == [True, True, True]  # the failure was the direct path's
    assert shard.failed is not None and shard.ops_synced == synced
    with pytest.raises(StorageError):
        store.close()
    again = open_store(inner, ROOT, FakeClock(2_000_000), **OPTIONS)
    try:
        got = [r.payload for r in again.topic("t", create=False).read(0, 100)]
        assert got in ([b"r0", b"r1"], [b"r0", b"r1", b"r2"])
    finally:
        again.close()


def test_WAL_7_concurrent_writers_share_syncs_and_every_ack_is_durable() -> None:
    """DUR-1, WAL-7: 8 threads of durable single appends (the direct path and the group
    commit's leaders and followers take turns): at most one fdatasync per append, and in every
    crash state taken after the last acknowledgement each thread's acknowledged records are
    all there, in the order it appended them."""
    inner = RecordingFS()
    store = open_store(inner, ROOT, FakeClock(1_000_000), **OPTIONS)
    t = store.topic("t", durability="fsync")
    shard = hooks(store, FileBackend).shards[0]
    syncs = shard.stats["fdatasyncs"]
    acked: dict[int, list[bytes]] = {k: [] for k in range(8)}
    start = threading.Barrier(8)

    def writer(k: int) -> None:
        start.wait(timeout=30)
        for i in range(60):
            payload = b"%d-%03d" % (k, i)
            t.append(payload)
            acked[k].append(payload)

    threads = [threading.Thread(target=writer, args=(k,)) for k in range(8)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(timeout=60)
    assert not any(th.is_alive() for th in threads)
    assert all(len(v) == 60 for v in acked.values())
    assert shard.stats["fdatasyncs"] - syncs <= 8 * 60
    end = len(inner.history)
    hooks(store, FileBackend).abandon()
    for state in inner.crash_states(at=end, mode="sample", seed=7, limit=6):
        got = open_store(state, ROOT, FakeClock(2_000_000), **OPTIONS)
        try:
            read = [r.payload for r in got.topic("t", create=False).read(0, 10_000)]
        finally:
            got.close()
        for k, mine in acked.items():
            assert [p for p in read if p.startswith(b"%d-" % k)] == mine, state.description
