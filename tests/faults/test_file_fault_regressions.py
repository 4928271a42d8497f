"""Regression tests for I/O faults on the file backend (spec/SPEC.md FLT-3..FLT-9), each with
the fault injected at the ``tidelog.fsio`` seam (``tidelog.conformance.faultfs.FaultFS``) over the
crash simulator (``RecordingFS``)."""

from __future__ import annotations

import errno
import os
import threading
import time
from pathlib import Path

import pytest

import tidelog
from tidelog.backends.file import open_store
from tidelog.clock import FakeClock
from tidelog.conformance.crashfs import RecordingFS
from tidelog.conformance.faultfs import Fault, FaultFS
from tidelog.errors import StorageError
from tidelog.hooks import Abandon, Checkpoint, hooks

ROOT = "/data/store"
OPTIONS = dict(
    wal_file_bytes="64KiB",
    prealloc="none",
    background=False,
    commit_interval_ms=60_000,
    segment_max_records=10,
)


def _payloads(store: object, topic: str) -> list[bytes]:
    t = store.topic(topic, create=False)  # type: ignore[attr-defined]
    return [r.payload for r in t.read(0, 10**6)]


def test_FLT_6_failed_meta_fsync_after_the_snapshot_rename_poisons() -> None:
    """FLT-6, FLT-4, DUR-2, DUR-6: the directory fsync after a checkpoint renamed its snapshot
    into meta/ fails, so that snapshot may or may not survive a crash. The store is poisoned: no
    later checkpoint rewrites the segment files the snapshot names, no append is acknowledged.
    Every crash state from the fault on recovers all 50 acknowledged records, once each, in
    order (before the fix, the next checkpoint rewrote them in place: a crash there left the
    store `corrupt`, or with records duplicated)."""
    inner = RecordingFS()
    # fsync_dir of meta/: #0 at creation (snapshot 0), #1 after checkpoint 1's rename
    fs = FaultFS(inner, [Fault("eio", kind="fsync_dir", path="store/meta", nth=1)])
    store = open_store(fs, ROOT, FakeClock(1_000_000), **OPTIONS)
    t = store.topic("t", durability="fsync")
    expected = [b"r%02d" % i for i in range(50)]
    t.append_many(expected[:25])
    t.append_many(expected[25:])
    mark = len(inner.history)
    errors: list[OSError] = []
    late_acked = None  # the history length when the late append returned, if it did
    for attempt in ("checkpoint", "append", "checkpoint"):
        try:
            if attempt == "checkpoint":
                hooks(store, Checkpoint).checkpoint()
            else:
                t.append(b"late")
                late_acked = len(inner.history)
        except OSError as exc:  # StorageError is one (checked below)
            errors.append(exc)
    assert [str(i) for i in fs.injected] == [f"#{fs.injected[0].index} fsync_dir "
                                             f"{ROOT}/meta: eio"]  # fmt: skip
    for point in range(mark, len(inner.history) + 1):
        allowed = [expected, [*expected, b"late"]]
        if late_acked is not None and point >= late_acked:
            allowed = allowed[1:]
        for state in inner.crash_states(at=point, mode="sample", seed=point, limit=8):
            got = open_store(state, ROOT, FakeClock(2_000_000), **OPTIONS)
            try:
                assert _payloads(got, "t") in allowed, state.description
            finally:
                got.close()
    assert len(errors) == 3 and all(isinstance(e, StorageError) for e in errors), errors
    assert all(e.code == "io_error" and "Input/output error" in str(e) for e in errors)  # type: ignore[attr-defined]
    assert all(f"{ROOT}/meta" in str(e) for e in errors), errors
    with pytest.raises(StorageError):
        store.close()


def _wal_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("tidelog-wal-")]


@pytest.mark.parametrize("fault", ["eio", "drop"])
def test_FLT_4_FLT_7_close_of_a_poisoned_store_releases_everything(fault: str) -> None:
    """FLT-4, FLT-7: the WAL's fdatasync fails (pages kept, or dropped): that append and every
    later op raise io_error; close raises io_error too, but only after stopping the WAL thread
    and releasing the lock, so the same process reopens the store and finds every append that
    was acknowledged (before the fix close raised first: the reopen got `locked`)."""
    inner = RecordingFS()
    fs = FaultFS(inner, [Fault(fault, kind="fdatasync", path="/wal/", nth=2)])
    threads = len(_wal_threads())
    store = open_store(fs, ROOT, FakeClock(1_000_000), **OPTIONS)
    t = store.topic("t", durability="fsync")
    acked = []
    outcomes = []
    for i in range(4):
        try:
            t.append(b"x%d" % i)
            acked.append(b"x%d" % i)
            outcomes.append("ok")
        except StorageError as exc:
            outcomes.append(exc.code)
    assert outcomes[0] == "ok" and set(outcomes[1:]) == {"io_error"}, outcomes
    described = store.describe().get("failed")
    with pytest.raises(StorageError) as closing:
        store.close()
    assert "failed and must be reopened" in str(closing.value)
    assert len(_wal_threads()) == threads
    again = open_store(inner, ROOT, FakeClock(2_000_000), **OPTIONS)
    try:
        got = _payloads(again, "t")
        assert got[: len(acked)] == acked and len(got) <= len(acked) + 1  # FLT-5: x1 may be
    finally:
        again.close()
    assert str(described).startswith("WAL shard 0: Input/output error")


def test_FLT_7_a_failed_lock_pid_write_releases_the_lock() -> None:
    """FLT-7, LOCK-2: writing `.lock.pid` fails: open raises io_error naming the file and holds
    no lock (before the fix a raw OSError left the lock held: the next open got `locked`)."""
    inner = RecordingFS()
    fs = FaultFS(inner, [Fault("eio", kind="pwrite", path=".lock.pid")])
    with pytest.raises(StorageError) as failed:
        open_store(fs, ROOT, FakeClock(1_000_000), **OPTIONS)
    assert failed.value.code == "io_error" and f"{ROOT}/.lock.pid" in str(failed.value)
    open_store(inner, ROOT, FakeClock(1_000_000), **OPTIONS).close()


def _store_to_recover(inner: RecordingFS) -> None:
    """A store with a sealed segment, a snapshot, and WAL frames after it (a crash: no close)."""
    store = open_store(inner, ROOT, FakeClock(1_000_000), **OPTIONS)
    t = store.topic("t", durability="fsync")
    t.append_many([b"a", b"b", b"c"])
    hooks(store, Checkpoint).checkpoint()
    t.append(b"d")
    hooks(store, Abandon).abandon()


@pytest.mark.parametrize(
    ("kind", "path"),
    [
        ("pread", "/meta/snapshot-"),  # the snapshot
        ("map", ".idx"),  # a segment's index
        ("open", ".data"),  # a segment's data
        ("map", "/wal/wal-"),  # the WAL file replayed
    ],
)
def test_FLT_3_FLT_7_a_failed_read_while_recovering_is_io_error(kind: str, path: str) -> None:
    """FLT-3, FLT-7: an I/O error reading the snapshot, a segment or the WAL while opening is
    io_error naming the file (before the fix: the raw OSError), and the open holds nothing."""
    inner = RecordingFS()
    _store_to_recover(inner)
    fs = FaultFS(inner, [Fault("eio", kind=kind, path=path)])
    with pytest.raises(StorageError) as failed:
        open_store(fs, ROOT, FakeClock(2_000_000), **OPTIONS)
    assert [i.kind for i in fs.injected] == [kind]
    assert failed.value.code == "io_error" and fs.injected[0].path in str(failed.value)
    again = open_store(inner, ROOT, FakeClock(2_000_000), **OPTIONS)
    try:
        assert _payloads(again, "t") == [b"a", b"b", b"c", b"d"]
    finally:
        again.close()


BIG = {**OPTIONS, "wal_file_bytes": "4MiB", "prealloc": "fallocate"}


def _wal_files(fs: RecordingFS) -> list[str]:
    """The WAL files (none when a failed first open removed the whole store, URI-8)."""
    if not fs.is_dir(f"{ROOT}/wal"):
        return []
    return [n for n in fs.listdir(f"{ROOT}/wal") if n.endswith(".log")]


def test_FLT_8_a_full_disk_fails_the_open_cleanly() -> None:
    """FLT-8: no reservation fits (every allocate: ENOSPC): creating the store raises io_error
    "disk full" and leaves no WAL file behind (before the fix: a raw OSError 28 and an empty
    WAL file per attempt); once there is room, it opens."""
    inner = RecordingFS()
    fs = FaultFS(inner, [Fault("enospc", kind="allocate", repeat=True)])
    for _ in range(2):
        with pytest.raises(StorageError) as full:
            open_store(fs, ROOT, FakeClock(1_000_000), **BIG)
        assert "disk full" in str(full.value) and full.value.errno == errno.ENOSPC
        assert _wal_files(inner) == []
    # 4 MiB, 2 MiB, 1 MiB per attempt, then the minimum is reached
    assert fs.counts["allocate"] == 6
    open_store(inner, ROOT, FakeClock(1_000_000), **BIG).close()


def test_FLT_8_a_reservation_refused_for_room_halves() -> None:
    """FLT-8: 4 MiB and 2 MiB do not fit, 1 MiB does: the store opens with a 1 MiB WAL file,
    and appends that grow it past its reservation work and survive a reopen."""
    inner = RecordingFS()
    fs = FaultFS(inner, [Fault("enospc", kind="allocate", nth=n) for n in (0, 1)])
    store = open_store(fs, ROOT, FakeClock(1_000_000), **BIG)
    (name,) = _wal_files(inner)
    assert inner.file_size(f"{ROOT}/wal/{name}") == 1 << 20
    t = store.topic("t", durability="fsync")
    payloads = [bytes([i]) * 300_000 for i in range(5)]  # 1.5 MB: past the reservation
    for p in payloads:
        t.append(p)
    hooks(store, Abandon).abandon()
    again = open_store(inner, ROOT, FakeClock(2_000_000), **BIG)
    try:
        assert _payloads(again, "t") == payloads
    finally:
        again.close()


def test_FLT_8_a_spare_is_used_without_reserving_anything() -> None:
    """FLT-8, WAL-15: with a spare WAL file at hand, a reopen on a full disk starts its new WAL
    file in the spare and reserves nothing."""
    inner = RecordingFS()
    store = open_store(inner, ROOT, FakeClock(1_000_000), **{**OPTIONS, "prealloc": "fallocate"})
    t = store.topic("t", durability="fsync")
    for i in range(4):  # 64 KiB WAL files: a rotation
        t.append(bytes([65 + i]) * 20_000)
    hooks(store, Checkpoint).checkpoint()  # the old file: a spare
    hooks(store, Abandon).abandon()
    assert any(n.startswith("spare-") for n in inner.listdir(f"{ROOT}/wal"))
    fs = FaultFS(inner, [Fault("enospc", kind="allocate", repeat=True)])
    again = open_store(fs, ROOT, FakeClock(2_000_000), **{**OPTIONS, "prealloc": "fallocate"})
    try:
        assert fs.counts["allocate"] == 0 and not fs.injected
        assert again.describe()["wal"]["recycled_files"] == 1  # type: ignore[index]
        assert len(_payloads(again, "t")) == 4
    finally:
        again.close()


def test_FLT_6_describe_reports_the_failure_and_the_wal_since_the_checkpoint() -> None:
    """FLT-6: describe() says how much WAL a crash would replay since the last good checkpoint,
    and, once a checkpoint failed, why the store is failed."""
    # two renames per snapshot (its file and mirror, SNAP-5): #0, #1 snapshot 0; #2, #3 the
    # first checkpoint; #4 fails the second
    fs = FaultFS(RecordingFS(), [Fault("eio", kind="rename", path="/meta/", nth=4)])
    store = open_store(fs, ROOT, FakeClock(1_000_000), **OPTIONS)
    t = store.topic("t", durability="fsync")
    t.append(b"x" * 1000)
    before = store.describe()
    assert before["failed"] is None
    assert before["checkpoint"]["wal_bytes_since"] > 1000  # type: ignore[index]
    hooks(store, Checkpoint).checkpoint()
    assert store.describe()["checkpoint"]["wal_bytes_since"] < 200  # type: ignore[index]
    t.append(b"y" * 1000)
    with pytest.raises(StorageError):
        hooks(store, Checkpoint).checkpoint()
    after = store.describe()
    assert "checkpoint of /data/store: Input/output error" in after["failed"]  # type: ignore[operator]
    assert after["checkpoint"]["snapshot"] == 1  # type: ignore[index]
    with pytest.raises(StorageError):
        t.append(b"z")
    with pytest.raises(StorageError):
        store.close()


def test_FLT_6_a_background_checkpoint_that_fails_poisons() -> None:
    """FLT-6, FLT-3: the maintenance thread's checkpoint fails (the snapshot's fsync): the
    store is poisoned and the next append raises io_error (before the fix: a warning, appends
    went on, and the WAL was never retired)."""
    # snapshot 0's file and mirror are fsyncs #0 and #1 (SNAP-5); #2 is the first checkpoint's
    fs = FaultFS(RecordingFS(), [Fault("eio", kind="fsync", path="/meta/", nth=2)])
    opts = {**OPTIONS, "background": True, "checkpoint_bytes": "4KiB", "progress_flush_ms": 10}
    store = open_store(fs, ROOT, FakeClock(1_000_000), **opts)
    t = store.topic("t", durability="fsync")
    deadline = time.monotonic() + 10
    with pytest.raises(StorageError) as failed:
        while time.monotonic() < deadline:
            t.append(b"x" * 1000)
            time.sleep(0.005)
    assert "checkpoint" in str(failed.value) and fs.injected
    assert store.describe()["failed"] is not None
    with pytest.raises(StorageError):
        store.close()


def _mapped_under(root: Path) -> list[str]:
    """Files under ``root`` this process has mapped (/proc/self/maps)."""
    with open("/proc/self/maps", encoding="utf-8") as f:
        return [line.split()[-1] for line in f if str(root) in line]


def _real_store(root: Path, **options: object) -> tidelog.Store:
    return tidelog.open(f"file://{root}", background=False, commit_interval_ms=60_000,
                        wal_file_bytes="1MiB", segment_max_records=2, **options)  # fmt: skip


@pytest.mark.parametrize("mmap", [True, False])
def test_FLT_9_mmap_false_reads_by_pread_and_a_read_error_is_io_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, mmap: bool
) -> None:
    """FLT-9: with mmap=false no store file is ever mapped (the segments and the replayed WAL
    are read into memory), and an I/O error reading a segment at open is io_error naming it,
    not a SIGBUS later; with mmap=true the same files are mapped (the default)."""
    root = tmp_path / "s"
    store = _real_store(root, mmap=mmap)
    t = store.topic("t", durability="fsync")
    t.append_many([b"a", b"b", b"c"])
    store.close()  # a checkpoint: sealed segments
    store = _real_store(root, mmap=mmap)
    store.topic("t").append(b"d")
    hooks(store, Abandon).abandon()  # the WAL is replayed next
    store = _real_store(root, mmap=mmap)
    try:
        assert [r.payload for r in store.topic("t").read(0, 10)] == [b"a", b"b", b"c", b"d"]
        mapped = _mapped_under(root)
        if mmap:
            assert any(p.endswith(".data") for p in mapped), mapped
        else:
            assert mapped == []
    finally:
        store.close()

    real_pread = os.pread

    def failing_pread(fd: int, size: int, offset: int) -> bytes:
        if os.readlink(f"/proc/self/fd/{fd}").endswith(".data"):
            raise OSError(errno.EIO, os.strerror(errno.EIO))
        return real_pread(fd, size, offset)

    monkeypatch.setattr(os, "pread", failing_pread)
    if mmap:  # the data is mapped, not read: a media error here would be a SIGBUS later
        _real_store(root, mmap=mmap).close()
        return
    with pytest.raises(StorageError) as failed:
        _real_store(root, mmap=mmap)
    assert failed.value.errno == errno.EIO and ".data" in str(failed.value)
    monkeypatch.setattr(os, "pread", real_pread)
    _real_store(root, mmap=mmap).close()  # the failed open released the lock
