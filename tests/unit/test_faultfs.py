"""The fault-injecting FS (``tidelog.conformance.faultfs.FaultFS``) over the crash simulator:
what each fault does to the call and to the disk images (spec/SPEC.md FLT-3..FLT-5 tests)."""

from __future__ import annotations

import errno
from typing import Any

import pytest

from tidelog.conformance.crashfs import RecordingFS
from tidelog.conformance.faultfs import APPLICABLE, KINDS, Fault, FaultFS
from tidelog.errors import BadArgument


def _file(fs: FaultFS, path: str = "/d/f") -> bytes:
    h = fs.inner.open_read(path)
    try:
        return h.pread(1 << 20, 0)
    finally:
        h.close()


def test_counts_every_call_by_kind_in_one_order() -> None:
    fs = FaultFS(RecordingFS(dirs=["/d"])).keep_log()
    h = fs.open("/d/f")
    h.pwrite(b"abc", 0)
    h.pread(3, 0)
    h.truncate(2)
    h.allocate(10)
    h.fdatasync()
    h.fsync()
    h.write_out(0, 2)  # type: ignore[attr-defined]  # counted; on this FS nothing more (CRASH-2)
    h.map().release()
    h.close()
    fs.fsync_dir("/d")
    fs.mkdir("/d/e")
    fs.rename("/d/f", "/d/g")
    fs.rmdir("/d/e")
    fs.unlink("/d/g")
    assert fs.exists("/d") and fs.listdir("/d") == []  # looking is not counted
    assert [k for k, _ in fs.log or []] == [
        "open", "pwrite", "pread", "truncate", "allocate", "fdatasync", "fsync", "write_out",
        "map", "fsync_dir", "mkdir", "rename", "rmdir", "unlink",
    ]  # fmt: skip
    assert fs.calls == 14 and set(fs.counts) <= set(KINDS) and not fs.injected


def test_a_fault_by_index_fails_that_call_and_changes_nothing() -> None:
    fs = FaultFS(RecordingFS(dirs=["/d"]), [Fault("enospc", at=1)])
    h = fs.open("/d/f")
    with pytest.raises(OSError) as failed:
        h.pwrite(b"abc", 0)
    assert failed.value.errno == errno.ENOSPC and failed.value.filename == "/d/f"
    assert _file(fs) == b""
    h.pwrite(b"abc", 0)  # one fault: the next call goes through
    assert _file(fs) == b"abc"
    assert [str(i) for i in fs.injected] == ["#1 pwrite /d/f: enospc"]


def test_a_fault_by_kind_from_the_nth_call_and_by_path() -> None:
    fs = FaultFS(
        RecordingFS(dirs=["/d"]),
        [Fault("eio", kind="fdatasync", nth=1, repeat=True, path="/d/b")],
    )
    a, b = fs.open("/d/a"), fs.open("/d/b")
    for _ in range(3):
        a.fdatasync()  # another path: never counted for the fault
    b.fdatasync()  # its 0th
    for _ in range(2):
        with pytest.raises(OSError):
            b.fdatasync()
    assert [i.index for i in fs.injected] == [6, 7]


def test_a_short_write_writes_a_prefix_then_raises_enospc() -> None:
    fs = FaultFS(RecordingFS(dirs=["/d"]), [Fault("short", kind="pwrite")], seed=3)
    h = fs.open("/d/f")
    with pytest.raises(OSError) as failed:
        h.pwrite(b"0123456789", 0)
    assert failed.value.errno == errno.ENOSPC
    got = _file(fs)
    assert len(got) < 10 and b"0123456789".startswith(got)
    again = FaultFS(RecordingFS(dirs=["/d"]), [Fault("short", kind="pwrite")], seed=3)
    with pytest.raises(OSError):
        again.open("/d/f").pwrite(b"0123456789", 0)
    assert _file(again) == got  # the prefix comes from the seed


def _durable_then_dropped(kind: str) -> tuple[RecordingFS, FaultFS, Any]:
    """/d/f holding b"durable", synced; the second ``kind`` call will fail with ``drop``."""
    inner = RecordingFS(dirs=["/d"])
    fs = FaultFS(inner, [Fault("drop", kind=kind, nth=1)])
    h = fs.open("/d/f")
    h.pwrite(b"durable", 0)
    h.fdatasync()
    return inner, fs, h


def test_a_dropping_sync_reverts_the_file_to_its_durable_bytes() -> None:
    """The fsyncgate case: the failed sync's writes never reach the disk, reads no longer see
    them, and a later sync that succeeds does not bring them back."""
    inner, fs, h = _durable_then_dropped("fdatasync")
    h.pwrite(b"LOST", 0)
    h.pwrite(b"+more", 7)
    with pytest.raises(OSError) as failed:
        h.fdatasync()
    assert failed.value.errno == errno.EIO
    assert _file(fs) == b"durable"
    h.fdatasync()
    fs.fsync_dir("/d")
    (state,) = inner.crash_states(mode="exhaustive")
    assert state.tree()["/d/f"] == b"durable"
    assert "drop unsynced /d/f" in [str(op) for op in inner.history]


def test_SEG_20_a_failed_write_out_can_drop_the_pages_as_a_failed_sync_does() -> None:
    """A write-out is no barrier (CRASH-2): one that succeeds leaves the bytes pending; one
    that fails with ``drop`` loses them as a failed fdatasync would (FLT-6)."""
    inner, fs, h = _durable_then_dropped("write_out")
    h.pwrite(b"+pending", 7)
    h.write_out(0, 15)  # type: ignore[attr-defined]
    fs.fsync_dir("/d")
    states = {s.tree()["/d/f"] for s in inner.crash_states(mode="exhaustive")}
    assert b"durable" in states  # a crash after the write-out may still lose the pending bytes
    h.pwrite(b"LOST", 0)
    with pytest.raises(OSError) as failed:
        h.write_out(0, 4)  # type: ignore[attr-defined]
    assert failed.value.errno == errno.EIO
    assert _file(fs) == b"durable"


def test_an_eio_sync_keeps_the_pages() -> None:
    fs = FaultFS(RecordingFS(dirs=["/d"]), [Fault("eio", kind="fsync")])
    h = fs.open("/d/f")
    h.pwrite(b"kept", 0)
    with pytest.raises(OSError):
        h.fsync()
    assert _file(fs) == b"kept"


def test_random_faults_are_reproducible_from_the_seed() -> None:
    def run(seed: int) -> list[str]:
        fs = FaultFS.random(RecordingFS(dirs=["/d"]), seed=seed, rate=0.3)
        for i in range(40):
            try:
                h = fs.open(f"/d/f{i % 3}")
                h.pwrite(b"x" * 100, 0)
                h.fdatasync()
            except OSError:
                pass
        return [str(i) for i in fs.injected]

    first = run(7)
    assert first and first == run(7) and first != run(8)
    for line in first:
        kind, fault = line.split()[1], line.split(": ")[-1]
        assert fault in APPLICABLE[kind]


def test_a_disarmed_fs_counts_and_never_fails() -> None:
    fs = FaultFS(RecordingFS(dirs=["/d"]), [Fault("eio", kind="open", repeat=True)])
    fs.armed = False
    fs.open("/d/f").close()
    assert fs.counts["open"] == 1 and not fs.injected


@pytest.mark.parametrize(
    "bad",
    [
        dict(fault="boom", at=0),
        dict(fault="eio"),
        dict(fault="eio", at=0, kind="open"),
        dict(fault="short", kind="fsync"),
        dict(fault="drop", kind="pwrite"),
    ],
)
def test_a_fault_that_cannot_apply_is_refused(bad: dict[str, object]) -> None:
    with pytest.raises(BadArgument):
        Fault(**bad)  # type: ignore[arg-type]
