"""I/O faults on the blockdev ring (spec/FORMATS-blockdev.md BDEV-23; SPEC FLT-3, FLT-4, FLT-5).

Faults are injected at the ``tidelog.fsio`` seam (images go through the store's FS) and at the
raw-device handle (``DeviceHandle``, which a raw device or ``direct=on`` uses instead): the N-th
call of one kind fails with EIO or ENOSPC, for every N a small workload makes, from creating the
image to closing it. Each run checks: every failure reaches the caller as ``io_error`` with the
errno (never a bare ``OSError``); after a failed write or sync every later op, ``flush`` and
``close`` raise ``io_error`` (poisoned) while ``close`` still releases the device; the same
process reopens the ring, and everything acknowledged before the failure is there, byte for
byte, while the op that failed is there whole or not at all; a failed creation leaves no file.
"""

from __future__ import annotations

import errno
import os
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import tidelog
from tidelog.backends.blockdev import BlockdevBackend, open_store
from tidelog.backends.blockdev.device import DeviceHandle
from tidelog.clock import FakeClock
from tidelog.errors import StorageError
from tidelog.fsio import OsFS
from tidelog.hooks import hooks
from tidelog.records import Record

PAGE = 512
SIZE = 4096 + 8 * PAGE
KINDS = ("open", "lock", "size", "pread", "pwrite", "fdatasync", "fsync", "truncate", "rename",
         "fsync_dir", "close")  # fmt: skip


class Injected(OSError):
    """The injected failure (an OSError, as the os module raises)."""


class _Plan:
    """Fail the ``nth`` call of ``kind`` with ``err``; count every call."""

    def __init__(self, kind: str | None = None, nth: int = 0, err: int = errno.EIO) -> None:
        self.kind, self.nth, self.err = kind, nth, err
        self.calls: Counter[str] = Counter()
        self.fired = False

    def hit(self, kind: str) -> None:
        self.calls[kind] += 1
        if kind == self.kind and self.calls[kind] == self.nth:
            self.fired = True
            raise Injected(self.err, os.strerror(self.err))


class _FaultHandle:
    def __init__(self, inner: Any, plan: _Plan) -> None:
        self._inner, self._plan = inner, plan
        self.path = inner.path

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def _call(self, kind: str, *args: Any) -> Any:
        self._plan.hit(kind)
        return getattr(self._inner, kind)(*args)

    def pwrite(self, data: bytes | bytearray | memoryview, offset: int) -> None:
        self._call("pwrite", data, offset)

    def pread(self, size: int, offset: int) -> bytes:
        return self._call("pread", size, offset)  # type: ignore[no-any-return]

    def size(self) -> int:
        return self._call("size")  # type: ignore[no-any-return]

    def truncate(self, size: int) -> None:
        self._call("truncate", size)

    def fdatasync(self) -> None:
        self._call("fdatasync")

    def fsync(self) -> None:
        self._call("fsync")

    def lock(self) -> None:
        self._call("lock")

    def close(self) -> None:
        try:
            self._plan.hit("close")
        finally:
            self._inner.close()  # a failed close(2) still releases the descriptor


class FaultFS(OsFS):
    """OsFS whose calls (and whose handles' calls) fail as ``plan`` says."""

    def __init__(self, plan: _Plan) -> None:
        self.plan = plan

    def open(self, path: str, *, create: bool = True) -> Any:
        self.plan.hit("open")
        return _FaultHandle(super().open(path, create=create), self.plan)

    def rename(self, src: str, dst: str) -> None:
        self.plan.hit("rename")
        super().rename(src, dst)

    def fsync_dir(self, path: str) -> None:
        self.plan.hit("fsync_dir")
        super().fsync_dir(path)


def payload(seq: int) -> bytes:
    return b"f%04d" % seq + b"-" * (seq * 53 % 200)


class Run:
    """The workload, on ``fs``: what was acknowledged, what failed and how."""

    def __init__(self, path: Path, fs: OsFS, create: bool) -> None:
        self.path, self.fs, self.create = path, fs, create
        self.acked: dict[int, bytes] = {}
        self.pending: list[int] = []  # seqs of the op that raised: present whole, or absent
        self.errors: list[StorageError] = []
        self.store: tidelog.Store | None = None

    def _op(self, fn: Callable[[], object]) -> bool:
        """Run one op; False once the store has failed (the error is kept)."""
        try:
            fn()
        except StorageError as exc:
            self.errors.append(exc)
            return False
        return True

    def _append(self, t: tidelog.Topic, n: int) -> None:
        head = t.state().head_seq
        seqs = list(range(head + 1, head + 1 + n))
        self.pending = seqs
        got = t.append_many([payload(q) for q in seqs])
        assert got == seqs
        self.acked.update((q, payload(q)) for q in seqs)
        self.pending = []

    def run(self) -> None:
        opts: dict[str, object] = {"size": SIZE, "page_size": PAGE, "topic": "t"}
        try:
            store = open_store(
                self.fs, str(self.path), FakeClock(1000), **(opts if self.create else {})
            )
        except StorageError as exc:
            self.errors.append(exc)
            return
        self.store = store
        steps: list[Callable[[], object]] = []
        t: list[tidelog.Topic] = []
        steps.append(lambda: t.append(store.topic("t", durability="fsync", trim="none")))
        steps.append(lambda: t[0].subscribe("s", start="earliest"))
        for n in (1, 2, 1, 3):
            steps.append(lambda n=n: self._append(t[0], n))  # type: ignore[misc]
        steps.append(lambda: t[0].subscriber("s").commit(2))
        steps.append(lambda: t[0].subscriber("s").flush())
        steps.append(lambda: self._append(t[0], 1))
        steps.append(store.flush)
        steps.append(lambda: self._append(t[0], 2))
        for step in steps:
            if not self._op(step):
                break
        failed = bool(self.errors)
        if failed:  # poisoned (FLT-4): every later op and flush raises io_error
            if t:
                with pytest.raises(StorageError) as again:
                    t[0].append(b"after")
                self.errors.append(again.value)
            with pytest.raises(StorageError) as again:
                store.flush()
            self.errors.append(again.value)
        self._op(store.close)  # raises io_error when poisoned, after releasing the device


def _reopen_and_check(run: Run, plan: _Plan) -> int:
    """Reopen in this process with plain I/O: every acknowledged record byte for byte, the
    failed op whole or absent, nothing else. Returns the records checked."""
    if not run.path.exists():  # the failure was while creating: nothing may be left
        assert not Path(str(run.path) + ".tmp").exists(), "a failed creation left its file"
        assert run.create and run.store is None
        open_store(OsFS(), str(run.path), FakeClock(1), size=SIZE, page_size=PAGE).close()
        return 0
    store = open_store(OsFS(), str(run.path), FakeClock(10**6))
    try:
        topics = store.topics()
        if not topics:
            assert not run.acked
            return 0
        got = {r.seq: r.payload for r in store.topic("t").read(0, 10**6) if isinstance(r, Record)}
    finally:
        store.close()
    for q, data in run.acked.items():
        assert got.get(q) == data, (plan.kind, plan.nth, q)
    extra = sorted(set(got) - set(run.acked))
    assert extra in ([], run.pending), (plan.kind, plan.nth, extra, run.pending)  # FLT-5
    return len(run.acked)


@pytest.mark.parametrize("create", [True, False], ids=["creating", "reopening"])
def test_BDEV_23_every_io_call_fails_typed_poisons_and_reopens(
    tmp_path: Path, create: bool
) -> None:
    """BDEV-23, FLT-3, FLT-4, FLT-5: the N-th call of each kind (open, lock, size, pread,
    pwrite, fdatasync, fsync, truncate, rename, directory sync, close) fails with EIO or ENOSPC,
    for every N the workload makes (creating the image, or reopening it); the failure and every
    later op, flush and close are io_error with its errno, never a bare OSError; close releases
    the device, so this process reopens it; every acknowledged record is there, the failed op
    whole or absent; a failed creation leaves no file."""
    path = tmp_path / "r.img"

    def prepare() -> None:
        for p in (path, Path(str(path) + ".tmp")):
            p.unlink(missing_ok=True)
        if not create:
            open_store(
                OsFS(), str(path), FakeClock(1), size=SIZE, page_size=PAGE, topic="t"
            ).close()

    prepare()
    clean = _Plan()
    Run(path, FaultFS(clean), create).run()
    counts: Counter[str] = Counter()
    for kind in KINDS:
        for nth in range(1, clean.calls[kind] + 1):
            for err in (errno.EIO, errno.ENOSPC):
                prepare()
                plan = _Plan(kind, nth, err)
                run = Run(path, FaultFS(plan), create)
                run.run()
                assert plan.fired
                counts["faults injected"] += 1
                assert run.errors, (kind, nth)
                for e in run.errors:  # typed, errno kept (a bare OSError would have escaped)
                    assert type(e) is StorageError and e.errno == err, (kind, nth, e)
                counts["io_errors raised"] += len(run.errors)
                if "failed and must be reopened" in " ".join(map(str, run.errors)):
                    counts["runs poisoned"] += 1
                counts["acknowledged records checked"] += _reopen_and_check(run, plan)
                counts["reopened in process"] += 1
    what = ", ".join(f"{v} {k}" for k, v in sorted(counts.items()))
    mode = "creating" if create else "reopening"
    print(f"\nblockdev faults ({mode}): {what}; 0 acknowledged records lost")
    assert counts["faults injected"] >= (70 if create else 50)
    assert counts["runs poisoned"] >= 40


def test_BDEV_23_raw_device_handle_faults(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """BDEV-23, BDEV-20: the raw-device path (``DeviceHandle``: O_DIRECT where allowed, not
    through the FS seam) types and poisons the same way: a failed page write or sync is
    io_error with its errno, later ops and close raise it, close releases the device (flock
    included), and the ring reopens in this process with every acknowledged record."""
    from tidelog.backends.blockdev import device as device_mod

    dev = tmp_path / "dev"
    dev.write_bytes(bytes(1 << 18))
    monkeypatch.setattr(device_mod, "is_block_device", lambda fs, p: p == str(dev))
    uri = f"blockdev://{dev}"
    with tidelog.open(f"{uri}?format=true&topic=t&page_size=4096") as store:
        assert isinstance(hooks(store, BlockdevBackend).dev.handle, DeviceHandle)
    for call, err in (("pwrite", errno.EIO), ("fdatasync", errno.EIO), ("pwrite", errno.ENOSPC)):
        store = tidelog.open(uri, clock=FakeClock(1))
        t = store.topic("t", durability="fsync")
        t.append(b"before " + call.encode())
        real = getattr(DeviceHandle, call)

        def failing(self: DeviceHandle, *args: Any, err: int = err) -> Any:
            raise OSError(err, os.strerror(err))

        monkeypatch.setattr(DeviceHandle, call, failing)
        with pytest.raises(StorageError) as first:
            t.append(b"failed " + call.encode())
        monkeypatch.setattr(DeviceHandle, call, real)
        assert first.value.errno == err and str(dev) in str(first.value)
        with pytest.raises(StorageError) as later:
            t.append(b"after")
        assert later.value.errno == err and "must be reopened" in str(later.value)
        with pytest.raises(StorageError):
            store.close()
        with tidelog.open(uri) as again:  # not Locked: close released the device
            got = [r.payload for r in again.topic("t").read() if isinstance(r, Record)]
        assert got[-1] in (b"before " + call.encode(), b"failed " + call.encode())
        assert b"before " + call.encode() in got


def test_BDEV_23_describe_names_the_failure(tmp_path: Path) -> None:
    """BDEV-23, FLT-3: a poisoned store says so in describe()["failed"] (None while healthy)."""
    path = tmp_path / "r.img"
    plan = _Plan()
    store = open_store(FaultFS(plan), str(path), FakeClock(1), size=SIZE, page_size=PAGE, topic="t")
    t = store.topic("t", durability="fsync")
    assert store.describe()["failed"] is None
    plan.kind, plan.nth = "fdatasync", plan.calls["fdatasync"] + 1
    with pytest.raises(StorageError):
        t.append(b"x")
    assert "syncing page at offset" in str(store.describe()["failed"])
    with pytest.raises(StorageError, match="must be reopened"):
        store.close()
