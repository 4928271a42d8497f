"""Segment writeback paced while a checkpoint writes (spec/FORMATS-seg3.md SEG-20): the seam's
``write_out`` (Linux sync_file_range), the ``Pacer``, what a store writes out, and that a failed
write-out is a failed sync (spec/SPEC.md FLT-6), never a durability point (spec/CRASH.md CRASH-2).
"""

from __future__ import annotations

import errno
import os
import sys
from pathlib import Path
from typing import Any

import pytest

from tidelog import fsio
from tidelog.backends.file import open_store
from tidelog.clock import FakeClock
from tidelog.conformance.crashfs import RecordingFS
from tidelog.conformance.faultfs import Fault, FaultFS
from tidelog.errors import BadOption, StorageError
from tidelog.fsio import OsFS, Pacer, write_out, write_paced


class _Spy:
    """A handle that records its writes and write-outs."""

    path = "/spy"

    def __init__(self) -> None:
        self.data = bytearray()
        self.calls: list[tuple[Any, ...]] = []

    def pwrite(self, data: bytes | bytearray | memoryview, offset: int) -> None:
        assert offset == len(self.data)  # front to back
        self.data += data
        self.calls.append(("pwrite", offset, len(data)))

    def write_out(self, offset: int, size: int, wait: bool = True) -> None:
        assert offset + size <= len(self.data)  # only bytes already written
        self.calls.append(("write_out", offset, size, wait))


def _outs(spy: _Spy) -> list[tuple[int, int, bool]]:
    return [c[1:] for c in spy.calls if c[0] == "write_out"]


def test_SEG_20_pacer_starts_each_piece_and_waits_for_the_one_before() -> None:
    """Every piece of at least ``every`` bytes is started when written; the one before it is
    waited for then: every byte is started once, in order, and waited for one piece behind."""
    spy = _Spy()
    pace = Pacer(spy, 100)  # type: ignore[arg-type]
    end = 0
    for n in (30, 30, 30, 30, 250, 10, 95):
        spy.pwrite(b"x" * n, end)
        end += n
        pace.wrote(end)
    assert _outs(spy) == [
        (0, 120, False),
        (120, 250, False), (0, 120, True),
        (370, 105, False), (120, 250, True),
    ]  # fmt: skip
    off = Pacer(spy, 0)  # type: ignore[arg-type]
    off.wrote(10_000)
    assert len(_outs(spy)) == 5  # 0: never


def test_SEG_20_write_paced_writes_every_byte_in_order_and_writes_each_piece_out() -> None:
    data = bytes(range(256)) * 41  # 10,496 bytes
    spy = _Spy()
    write_paced(spy, data, 4096)  # type: ignore[arg-type]
    assert bytes(spy.data) == data
    assert [c for c in spy.calls if c[0] == "pwrite"] == [
        ("pwrite", 0, 4096), ("pwrite", 4096, 4096), ("pwrite", 8192, 2304),
    ]  # fmt: skip
    assert _outs(spy) == [(0, 4096, False), (4096, 4096, False), (0, 4096, True)]
    # the rest (a piece under 4096 bytes, and waiting for the last one) is the caller's sync's
    whole = _Spy()
    write_paced(whole, data, 0)  # type: ignore[arg-type]
    assert whole.calls == [("pwrite", 0, len(data))]


def test_SEG_20_a_handle_without_write_out_is_only_written() -> None:
    class Plain:
        path = "/plain"

    write_out(Plain(), 0, 1 << 20)  # type: ignore[arg-type]  # nothing to call: no error


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="sync_file_range is Linux's")
def test_SEG_20_os_write_out_calls_sync_file_range_and_names_the_file_on_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = str(tmp_path / "f")
    h = OsFS().open(path)
    try:
        h.pwrite(b"a" * 20_000, 0)
        h.write_out(0, 20_000)  # type: ignore[attr-defined]  # the real call
        seen: list[tuple[int, ...]] = []
        monkeypatch.setattr(fsio, "_SYNC_FILE_RANGE", lambda *a: seen.append(a) or 0)
        h.write_out(4096, 8192)  # type: ignore[attr-defined]
        h.write_out(12288, 4096, False)  # type: ignore[attr-defined]
        h.write_out(0, 0)  # type: ignore[attr-defined]  # nothing to write out: no call
        fd = h.fd  # type: ignore[attr-defined]
        # WAIT_BEFORE | WRITE | WAIT_AFTER: the range is on the device when it returns;
        # WRITE alone: started
        assert seen == [(fd, 4096, 8192, 7), (fd, 12288, 4096, 2)]
    finally:
        h.close()
    monkeypatch.undo()
    for code in (errno.ENOSYS, errno.EINVAL, errno.EOPNOTSUPP, errno.EIO):
        monkeypatch.setattr(fsio, "_SYNC_FILE_RANGE", lambda *a: -1)
        monkeypatch.setattr(fsio.ctypes, "get_errno", lambda code=code: code)
        refused = type(h)(path, -1)  # type: ignore[call-arg]
        if code == errno.EIO:  # a failed writeback: raised, named (FLT-6)
            with pytest.raises(OSError) as io:
                refused.write_out(0, 10)  # type: ignore[attr-defined]
            assert io.value.errno == errno.EIO and io.value.filename == path
        else:  # this kernel or file system cannot pace: nothing happens, nothing fails
            refused.write_out(0, 10)  # type: ignore[attr-defined]
    monkeypatch.undo()
    closed = type(h)(path, h.fd)  # type: ignore[call-arg, attr-defined]  # closed above
    with pytest.raises(OSError) as failed:
        closed.write_out(0, 10)  # type: ignore[attr-defined]
    assert failed.value.errno == errno.EBADF and failed.value.filename == path


def _root_fs() -> RecordingFS:
    return RecordingFS(dirs=["/s"])


def _fill(store: object, n: int = 400) -> None:
    """``n`` records of 120 B, checkpointed (build_indexed hands the .data over ~1 MiB at a
    time, so a write-out follows each such piece once ``write_out_bytes`` is smaller)."""
    t = store.topic("t", durability="fsync")  # type: ignore[attr-defined]
    t.append_many([b"r%05d" % i * 20 for i in range(n)])  # 120 B each
    store._backend.checkpoint()  # type: ignore[attr-defined]


@pytest.mark.parametrize("seal_worker_bytes", [0, 1 << 30])
def test_SEG_20_a_checkpoint_writes_its_segments_out_in_pieces(seal_worker_bytes: int) -> None:
    """Sealing from the WAL (seal_worker_bytes 0; on this FS, in the writer) and from memory
    both pace the .data they write."""
    fs = FaultFS(_root_fs()).keep_log()
    opts = {"background": "false", "seal_worker_bytes": seal_worker_bytes}
    store = open_store(fs, "/s/store", FakeClock(0), write_out_bytes=4096, **opts)
    try:
        store.topic("t", durability="fsync").append(b"first")
        store._backend.checkpoint()  # type: ignore[attr-defined]  # then: located (WTAIL-6)
        fs.log = []
        _fill(store, 30_000)  # 3.6 MB
        log = list(fs.log or [])
        outs = [path for kind, path in log if kind == "write_out"]
        assert len(outs) >= 3
        assert {os.path.basename(p).split("-")[0] for p in outs} == {"seg"}
        assert all(p.endswith(".data") for p in outs)
        kinds = [kind for kind, path in log if path == outs[0]]
        assert kinds.index("fdatasync") > max(i for i, k in enumerate(kinds) if k == "write_out")
        assert len(store.topic("t").read(0, 40_000)) == 30_001
    finally:
        store.close()
    fs = FaultFS(_root_fs()).keep_log()
    store = open_store(fs, "/s/store", FakeClock(0), write_out_bytes=0, **opts)
    try:
        _fill(store, 30_000)
        assert not [k for k, _ in fs.log or [] if k == "write_out"]  # 0: off
    finally:
        store.close()


@pytest.mark.parametrize("fault", ["eio", "drop"])
def test_SEG_20_FLT_6_a_failed_write_out_fails_the_checkpoint_and_loses_nothing_acked(
    fault: str,
) -> None:
    fs = FaultFS(_root_fs(), [Fault(fault, kind="write_out", nth=0)])
    store = open_store(fs, "/s/store", FakeClock(0), background="false", write_out_bytes=4096)
    t = store.topic("t", durability="fsync")
    seqs = t.append_many([b"r%05d" % i * 20 for i in range(20_000)])
    with pytest.raises(StorageError) as failed:
        store._backend.checkpoint()  # type: ignore[attr-defined]
    assert failed.value.code == "io_error" and fs.injected
    with pytest.raises(StorageError):
        t.append(b"after")  # poisoned (FLT-4)
    with pytest.raises(StorageError):
        store.close()
    fs.armed = False
    again = open_store(fs.inner, "/s/store", FakeClock(0), background="false")
    try:
        got = [r.seq for r in again.topic("t").read(0, 40_000)]
        assert got == seqs  # every acknowledged fsync record, from the WAL
    finally:
        again.close()


def test_SEG_20_the_option_takes_sizes_and_refuses_the_rest() -> None:
    fs = _root_fs()
    store = open_store(fs, "/s/a", FakeClock(0), background="false", write_out_bytes="1MiB")
    store.close()
    for bad in ("-1", "2GiB", "lots"):
        with pytest.raises(BadOption, match="write_out_bytes"):
            open_store(fs, "/s/b", FakeClock(0), write_out_bytes=bad)
