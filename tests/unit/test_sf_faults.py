"""I/O faults on the sf:// paths (spec/FORWARD.md SF-19; SPEC FLT-3, FLT-4, FLT-5).

``FaultFS`` wraps a ``RecordingFS`` at the ``tidelog.fsio`` seam and fails the N-th call of one
kind (open, pwrite, pread, truncate, allocate, fdatasync, fsync, rename, unlink, fsync_dir,
listdir, map) with EIO or ENOSPC; a pwrite can also be *short* (a prefix is written, then the
error), and a failed sync can *drop* the file's unsynced writes (what Linux does to the dirty
pages after a writeback error: reads then see the old bytes and a second fsync "succeeds").

Every I/O call of small workloads (open and recovery, appends, flushes, rotation, watermark and
trim, close; under ``append`` and ``flush``) is failed in turn, each way. For every run:

- the failure surfaces as ``io_error`` (``StorageError`` with the errno), never another type;
- a failed write or sync poisons the slot: every later append, sync, trim and read raises
  ``io_error`` (a failed read poisons nothing); ``close`` raises it too, but releases the lock:
  the same process reopens the slot;
- after reopening (and in sampled power-loss states after that), every append acknowledged as
  durable (``append``: returned; ``flush``: before a returned flush) is there with its payload,
  every frame present is the one appended under its FSN (the failed op's own frame may be there
  or not: FLT-5), and the next append gets an FSN above every durable one (no FSN reused).
"""

from __future__ import annotations

import errno
import itertools
import os
from dataclasses import dataclass, field
from typing import Any

import pytest

from tidelog.backends.sf.slot import Slot
from tidelog.conformance.crashfs import RecordingFS
from tidelog.errors import StorageError
from tidelog.fsio import Handle

SF_DIR = "/sf"
SENDER = "a"
MAX_BYTES = 72  # header 24 + a few frames: rotation every 2-4 frames
CRASH_SAMPLES = int(os.environ.get("TIDELOG_SF_FAULT_CRASH_SAMPLES", "3"))
KINDS = (
    "open", "pwrite", "pread", "truncate", "allocate", "fdatasync", "fsync", "rename", "unlink",
    "fsync_dir", "listdir", "map",
)  # fmt: skip


class Fault(Exception):
    """Marks the call the test armed (only for bookkeeping: the OSError is what is raised)."""


@dataclass
class Arm:
    kind: str
    nth: int  # 1-based count of calls of ``kind``
    code: int = errno.EIO
    mode: str = "error"  # error | short (pwrite) | drop (fdatasync/fsync)
    fired: bool = False


@dataclass
class FaultFS:
    """An ``FS`` over a ``RecordingFS`` that counts calls per kind and fails the armed one."""

    inner: RecordingFS
    arm: Arm | None = None
    calls: dict[str, int] = field(default_factory=dict)
    # path -> undo log of writes since its last successful sync (for "drop")
    unsynced: dict[str, list[tuple[str, int, bytes, int]]] = field(default_factory=dict)

    def hit(self, kind: str, path: str) -> Arm | None:
        self.calls[kind] = self.calls.get(kind, 0) + 1
        a = self.arm
        if a is not None and not a.fired and a.kind == kind and a.nth == self.calls[kind]:
            a.fired = True
            return a
        return None

    def fail(self, a: Arm, path: str) -> OSError:
        return OSError(a.code, os.strerror(a.code), path)

    def check(self, kind: str, path: str) -> None:
        a = self.hit(kind, path)
        if a is not None:
            raise self.fail(a, path)

    # -- FS -------------------------------------------------------------------------------------
    def open(self, path: str, *, create: bool = True) -> Handle:
        self.check("open", path)
        return FaultHandle(self, self.inner.open(path, create=create))

    def open_read(self, path: str) -> Handle:
        self.check("open", path)
        return FaultHandle(self, self.inner.open_read(path))

    def rename(self, src: str, dst: str) -> None:
        self.check("rename", src)
        self.inner.rename(src, dst)
        self.unsynced[dst] = self.unsynced.pop(src, [])

    def unlink(self, path: str) -> None:
        self.check("unlink", path)
        self.inner.unlink(path)
        self.unsynced.pop(path, None)

    def fsync_dir(self, path: str) -> None:
        self.check("fsync_dir", path)
        self.inner.fsync_dir(path)

    def listdir(self, path: str) -> list[str]:
        self.check("listdir", path)
        return self.inner.listdir(path)

    def __getattr__(self, name: str) -> Any:  # exists, is_dir, mkdir, file_size, chmod
        return getattr(self.inner, name)


class FaultHandle:
    def __init__(self, fs: FaultFS, inner: Any) -> None:
        self.fs, self.inner, self.path = fs, inner, inner.path

    def _log(self, kind: str, offset: int, n: int) -> None:
        old = self.inner.pread(n, offset)
        self.fs.unsynced.setdefault(self.path, []).append((kind, offset, old, self.inner.size()))

    def pwrite(self, data: bytes | bytearray | memoryview, offset: int) -> None:
        a = self.fs.hit("pwrite", self.path)
        data = bytes(data)
        if a is not None:
            if a.mode == "short" and len(data) > 1:
                self._log("pwrite", offset, len(data) // 2)
                self.inner.pwrite(data[: len(data) // 2], offset)
            raise self.fs.fail(a, self.path)
        self._log("pwrite", offset, len(data))
        self.inner.pwrite(data, offset)

    def pread(self, size: int, offset: int) -> bytes:
        self.fs.check("pread", self.path)
        return bytes(self.inner.pread(size, offset))

    def truncate(self, size: int) -> None:
        self.fs.check("truncate", self.path)
        self._log("truncate", size, max(0, self.inner.size() - size))
        self.inner.truncate(size)

    def allocate(self, size: int) -> None:
        self.fs.check("allocate", self.path)
        self._log("allocate", 0, 0)
        self.inner.allocate(size)

    def _sync(self, kind: str) -> None:
        a = self.fs.hit(kind, self.path)
        if a is not None:
            if a.mode == "drop":  # the kernel dropped the dirty pages: undo, newest first
                for _, offset, old, size in reversed(self.fs.unsynced.pop(self.path, [])):
                    self.inner.truncate(size)
                    self.inner.pwrite(old, offset)
            raise self.fs.fail(a, self.path)
        getattr(self.inner, kind)()
        self.fs.unsynced.pop(self.path, None)

    def fdatasync(self) -> None:
        self._sync("fdatasync")

    def fsync(self) -> None:
        self._sync("fsync")

    def map(self) -> memoryview:
        self.fs.check("map", self.path)
        return self.inner.map()

    def size(self) -> int:
        return int(self.inner.size())

    def lock(self) -> None:
        self.inner.lock()

    def close(self) -> None:
        self.inner.close()


# --- the workloads ------------------------------------------------------------------------------
def payload(fsn: int) -> bytes:
    return f"p{fsn}:".encode() + bytes([65 + fsn % 26]) * (fsn % 7)


@dataclass
class Ledger:
    """What the workload was told: appended FSN -> payload, and what is durable for sure."""

    appended: dict[int, bytes] = field(default_factory=dict)
    attempted: list[bytes] = field(default_factory=list)  # payloads of appends that raised
    durable: int = -1  # every FSN up to this was acknowledged as durable
    acked: int = -1
    failed: list[str] = field(default_factory=list)  # the ops that raised io_error


Op = tuple[str, int]
WORKLOADS: dict[str, list[Op]] = {  # rotation, trim, reads of sealed and active segments
    "append": [("append", 4), ("read", 0), ("ack", 3), ("append", 4), ("sync", 0), ("read", 0)],
    "flush": [
        ("append", 4), ("flush", 0), ("append", 3), ("read", 0), ("ack", 4), ("append", 3),
        ("flush", 0), ("read", 0),
    ],
}  # fmt: skip


def open_slot(fs: Any, durability: str, max_bytes: int = MAX_BYTES) -> Slot:
    return Slot.open(SF_DIR, SENDER, fs=fs, max_bytes=max_bytes, durability=durability)


def step(slot: Slot, ledger: Ledger, op: str, arg: int, durability: str) -> None:
    """One op of the workload; records what it acknowledged."""
    if op == "append":
        for _ in range(arg):
            p = payload(len(ledger.appended) + len(ledger.attempted))
            try:
                fsn = slot.append(p)
            except StorageError:
                ledger.attempted.append(p)
                raise
            ledger.appended[fsn] = p
            if durability == "append":
                ledger.durable = fsn
    elif op in ("flush", "sync"):
        published = slot.published_fsn
        slot.flush() if op == "flush" else slot.sync()
        if durability != "memory":
            ledger.durable = max(ledger.durable, published)
    elif op == "read":  # a failed read is io_error too, and poisons nothing
        lowest = slot.lowest_fsn()
        got = slot.read(lowest, 1000, 1 << 20)
        assert got == [ledger.appended[lowest + i] for i in range(len(got))]
    elif op == "ack":
        ledger.acked = max(ledger.acked, slot.acknowledge(arg))  # what the receiver confirmed
        slot.apply_acks()


def run(fs: FaultFS, durability: str) -> tuple[Ledger, str]:
    """The workload on ``fs``; after the first io_error, every later write op must raise it too.
    Returns the ledger and how the close went ("ok" or "raised")."""
    ledger = Ledger()
    try:
        slot = open_slot(fs, durability)
    except StorageError as exc:
        ledger.failed.append(f"open: {exc}")
        assert exc.errno in (errno.EIO, errno.ENOSPC), exc
        return ledger, "not opened"
    poisoned = False
    for op, arg in WORKLOADS[durability]:
        try:
            step(slot, ledger, op, arg, durability)
        except StorageError as exc:
            assert exc.errno in (errno.EIO, errno.ENOSPC), exc
            ledger.failed.append(f"{op}: {exc}")
            poisoned = poisoned or slot.poisoned is not None
            continue
        assert not poisoned, f"{op} succeeded on a poisoned slot (SF-19)"
    if slot.poisoned is not None:
        for later in (lambda: slot.append(b"x"), slot.sync, slot.apply_acks, lambda: slot.read(0)):
            with pytest.raises(StorageError, match="poisoned"):
                later()
    try:
        slot.close()
    except StorageError as exc:
        assert exc.errno in (errno.EIO, errno.ENOSPC), exc
        return ledger, "raised"
    assert slot.poisoned is None, "close of a poisoned slot must raise (SF-19)"
    return ledger, "ok"


def verify_recovered(slot: Slot, ledger: Ledger, where: str) -> None:
    """Nothing durable lost, nothing wrong, no FSN reused (module docstring)."""
    lowest = slot.lowest_fsn()
    got = slot.read(lowest, 10_000, 1 << 30) if slot.published_fsn >= lowest else []
    present = {lowest + i: p for i, p in enumerate(got)}
    for fsn in range(0, ledger.durable + 1):
        if fsn in present:
            assert present[fsn] == ledger.appended[fsn], f"{where}: FSN {fsn} changed"
        else:
            assert fsn < lowest and fsn <= slot.acked_fsn, f"{where}: durable FSN {fsn} lost"
    for fsn, p in present.items():  # an indeterminate append may be there (FLT-5), whole
        assert ledger.appended.get(fsn) == p or p in ledger.attempted, f"{where}: FSN {fsn}"
    assert slot.acked_fsn <= max(ledger.acked, lowest - 1), f"{where}: frames skipped"
    nxt = slot.append(b"next")
    assert nxt > ledger.durable, f"{where}: FSN {nxt} reused (durable through {ledger.durable})"
    assert slot.read(nxt) == [b"next"]


def arms(durability: str) -> list[Arm]:
    """Every call the workload makes, each failed with EIO and ENOSPC, writes also short, syncs
    also dropping the unsynced pages."""
    probe = FaultFS(RecordingFS(dirs=[SF_DIR]))
    run(probe, durability)
    out: list[Arm] = []
    for kind in KINDS:
        for nth in range(1, probe.calls.get(kind, 0) + 1):
            for code in (errno.EIO, errno.ENOSPC):
                out.append(Arm(kind, nth, code))
            if kind == "pwrite":
                out.append(Arm(kind, nth, errno.ENOSPC, "short"))
            if kind in ("fdatasync", "fsync"):
                out.append(Arm(kind, nth, errno.EIO, "drop"))
    return out


@pytest.mark.parametrize("durability", ["append", "flush"])
def test_SF_19_every_io_call_failed_in_turn(durability: str) -> None:
    """SF-19, FLT-3, FLT-4, FLT-5: every I/O call of the workload failed each way: typed,
    poisoned, released, nothing durable lost (also after a power loss), no FSN reused."""
    faults = states = 0
    kinds: dict[str, int] = {}
    for arm in arms(durability):
        fs = FaultFS(RecordingFS(dirs=[SF_DIR]), arm)
        ledger, closed = run(fs, durability)
        assert arm.fired, arm
        where = f"{arm} ({'; '.join(ledger.failed)})"
        assert ledger.failed or closed == "raised", f"{where}: the fault vanished"
        faults += 1
        kinds[arm.kind] = kinds.get(arm.kind, 0) + 1
        point = len(fs.inner.history)  # power-loss states are taken here, before the reopen
        again = open_slot(fs, durability)  # same process: the lock was released
        try:
            verify_recovered(again, ledger, where)
        finally:
            again.close()
        states += 1
        for state in fs.inner.crash_states(
            at=point, mode="sample", seed=faults, limit=CRASH_SAMPLES
        ):
            slot = open_slot(state, durability)
            try:
                verify_recovered(slot, ledger, f"{where}, then {state.description}")
            finally:
                slot.close()
            states += 1
    assert faults > 100
    print(f"SF faults ({durability}): {faults} faults injected {kinds}, {states} states checked, "
          "0 losses")  # fmt: skip


# --- the reported cases -------------------------------------------------------------------------
def test_SF_19_failed_fdatasync_then_flush_never_reports_success() -> None:
    """SF-19, FLT-4 (the reported case): under sf_durability=flush a failed fdatasync used to
    leave the slot usable, and the next flush() reported success without rewriting anything
    (the kernel had marked the pages clean): every frame it "made durable" was lost. Now the
    failure poisons the slot: flush raises io_error until it is reopened, and reopening shows
    what the disk really holds."""
    arm = Arm("fdatasync", 1, errno.EIO, "drop")
    fs = FaultFS(RecordingFS(dirs=[SF_DIR]))
    slot = open_slot(fs, "flush", max_bytes=4096)  # one segment: the sync is flush's own
    for i in range(3):
        slot.append(payload(i))
    slot.flush()
    fs.calls.clear()
    fs.arm = arm
    for i in range(3, 6):
        slot.append(payload(i))
    with pytest.raises(StorageError) as info:
        slot.flush()
    assert info.value.errno == errno.EIO and arm.fired
    with pytest.raises(StorageError, match="poisoned"):
        slot.flush()  # the retry must not "succeed"
    with pytest.raises(StorageError, match="poisoned"):
        slot.append(b"more")
    with pytest.raises(StorageError, match="poisoned"):
        slot.close()
    again = open_slot(fs, "flush", max_bytes=4096)
    try:
        assert again.read(0, 100) == [payload(i) for i in range(3)]  # 3..5 were never durable
        assert again.append(b"next") == 3
    finally:
        again.close()


def test_SF_19_append_that_opens_a_segment_raises_io_error() -> None:
    """SF-19, FLT-3 (the reported case): an append that creates a segment used to let a raw
    OSError out of the open and the header write; now every one is io_error with its errno,
    the partial segment is gone, and close releases the lock."""
    for kind, nth in itertools.product(("open", "pwrite", "allocate", "rename"), (1,)):
        fs = FaultFS(RecordingFS(dirs=[SF_DIR]))
        slot = open_slot(fs, "append")
        fs.calls.clear()
        fs.arm = Arm(kind, nth, errno.ENOSPC)
        with pytest.raises(StorageError) as info:
            slot.append(b"x")
        assert info.value.errno == errno.ENOSPC, kind
        assert not [n for n in fs.listdir(f"{SF_DIR}/{SENDER}") if ".sfa" in n], kind
        with pytest.raises(StorageError):
            slot.close()
        open_slot(fs, "append").close()


def test_SF_19_close_releases_the_lock_when_its_sync_fails() -> None:
    """SF-19, FLT-4: a sync failing inside close still releases every descriptor and the lock,
    then raises io_error; the same process reopens the slot."""
    fs = FaultFS(RecordingFS(dirs=[SF_DIR]))
    slot = open_slot(fs, "flush")
    slot.append(b"x")
    fs.calls.clear()
    fs.arm = Arm("fdatasync", 1, errno.EIO)
    with pytest.raises(StorageError) as info:
        slot.close()
    assert info.value.errno == errno.EIO and slot.closed
    open_slot(fs, "flush").close()


def test_SF_19_recovery_read_errors_are_io_errors_and_unlock() -> None:
    """SF-8, SF-19: a segment that cannot be read refuses recovery as io_error (not corrupt:
    its bytes may be fine), and the slot is not left locked."""
    fs = FaultFS(RecordingFS(dirs=[SF_DIR]))
    slot = open_slot(fs, "append")
    slot.append(b"x")
    slot.close()
    for kind in ("map", "listdir", "open", "pread"):
        fs.calls.clear()
        fs.arm = Arm(kind, 1 if kind != "open" else 3, errno.EIO)
        try:
            open_slot(fs, "append").close()
        except StorageError as exc:
            assert exc.errno == errno.EIO and "SF-19" in str(exc), (kind, exc)
        assert fs.arm.fired, kind
        open_slot(fs, "append").close()


def test_SF_19_the_sf_store_surfaces_the_poison() -> None:
    """SF-15, SF-19, FLT-3: through the sf:// store: a failed sync of an append is io_error,
    describe() names the poison, flush and close raise it, and the slot reopens."""
    from tidelog.backends.sf.backend import TOPIC, SfBackend

    fs = FaultFS(RecordingFS(dirs=[SF_DIR]))
    backend = SfBackend(open_slot(fs, "append", 4096), max_record_bytes=1024, deadline_ms=0)
    ref = backend.open_topic(TOPIC, {}, create=True)
    assert backend.append(ref, [b"a"], None, None) == [1]
    fs.calls.clear()
    fs.arm = Arm("fdatasync", 1, errno.EIO, "drop")
    with pytest.raises(StorageError) as info:
        backend.append(ref, [b"b"], None, None)
    assert info.value.errno == errno.EIO
    assert "SF-19" in str(backend.describe()["poisoned"])
    for call in (backend.flush, lambda: backend.read(ref, 0, 10, None), backend.close):
        with pytest.raises(StorageError):
            call()
    again = open_slot(fs, "append", 4096)
    try:
        assert again.read(0, 10) == [b"a"]
    finally:
        again.close()
