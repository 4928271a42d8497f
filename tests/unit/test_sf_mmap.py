"""Mapped SF segments and `mmap=false` (spec/FORWARD.md SF-22, SPEC FLT-9): with it nothing of a
slot is ever mapped (checked in /proc/self/maps, also while recovery's scan holds a segment), and
an I/O error reading a segment (EIO injected into pread) is io_error, at open and at a later
read, never a SIGBUS; with the default the same files are mapped."""

from __future__ import annotations

import errno
import os
from collections.abc import Callable
from pathlib import Path

import pytest

import tidelog
from tidelog.backends.sf import recovery
from tidelog.errors import StorageError

SMALL = "sf_max_bytes=4KiB&sf_max_total_bytes=1MiB"


def payload(fsn: int) -> bytes:
    return b"frame-%d:" % fsn + b"x" * (fsn % 300)


def mapped_under(root: Path) -> list[str]:
    """Files under ``root`` this process has mapped (/proc/self/maps)."""
    with open("/proc/self/maps", encoding="utf-8") as f:
        return [line.split(maxsplit=5)[-1].strip() for line in f if str(root) in line]


def fill(slot: Path, frames: int = 200) -> None:
    """Several segments (a few hundred bytes a frame, 4 KiB segments), closed."""
    with tidelog.open(f"sf://{slot}?{SMALL}") as store:
        store.topic("frames").append_many([payload(f) for f in range(frames)])
        assert len(store.describe()["segment_files"]) > 3  # type: ignore[arg-type]


def payloads(store: tidelog.Store, after: int = 0) -> list[bytes]:
    return [r.payload for r in store.topic("frames").read(after, 100_000)]  # type: ignore[union-attr]


@pytest.fixture
def scans(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> list[bool]:
    """For every segment recovery's scan walks: whether the slot had a file mapped then."""
    seen: list[bool] = []
    real = recovery._scan_mapped

    def spy(path: str, name: str, data: memoryview) -> recovery.RecoveredSegment | None:
        seen.append(bool(mapped_under(tmp_path)))
        return real(path, name, data)

    monkeypatch.setattr(recovery, "_scan_mapped", spy)
    return seen


@pytest.mark.parametrize("mmap", ["true", "false"])
def test_SF_22_mmap_false_maps_nothing(tmp_path: Path, scans: list[bool], mmap: str) -> None:
    """SF-22, FLT-9: with mmap=false no segment is mapped, not while recovery scans it, not
    after open, not after a rotation seals one; with mmap=true recovery maps each one it scans
    and the slot keeps the sealed ones mapped. A read-only view (SF-21) scans as mmap says and
    keeps nothing mapped either way."""
    slot = tmp_path / "sf" / "a"
    fill(slot)
    with tidelog.open(f"sf://{slot}?{SMALL}&mmap={mmap}") as store:
        store.topic("frames").append_many([payload(f) for f in range(200, 260)])  # rotates
        assert payloads(store) == [payload(f) for f in range(260)]
        mapped = mapped_under(slot)
        if mmap == "true":
            assert len(mapped) > 3 and all(".sfa" in m for m in mapped), mapped
            assert scans and all(scans)
        else:
            assert mapped == [] and scans and not any(scans)
    scans.clear()
    with tidelog.open(f"sf://{slot}?readonly=true&mmap={mmap}") as view:
        assert payloads(view) == [payload(f) for f in range(260)]
        assert mapped_under(slot) == []
    assert scans and all(scans) is (mmap == "true") and any(scans) is (mmap == "true")


def failing_pread(real: Callable[[int, int, int], bytes]) -> Callable[[int, int, int], bytes]:
    """os.pread failing with EIO on segment files: a media error under them."""

    def pread(fd: int, size: int, offset: int) -> bytes:
        if os.readlink(f"/proc/self/fd/{fd}").endswith(".sfa"):
            raise OSError(errno.EIO, os.strerror(errno.EIO))
        return real(fd, size, offset)

    return pread


def test_SF_22_a_read_error_with_mmap_false_is_io_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """SF-22, SF-19, FLT-9: with mmap=false an EIO reading a segment is io_error naming it: at
    open (the writer's recovery and a view's scan refuse, the lock is released), and at a read
    after open, sealed segment or active; the read does not poison the slot (appends go on)."""
    slot = tmp_path / "sf" / "a"
    fill(slot)
    uri = f"sf://{slot}?{SMALL}&mmap=false"
    real = os.pread
    monkeypatch.setattr(os, "pread", failing_pread(real))
    for query in ("", "&readonly=true"):
        with pytest.raises(StorageError) as failed:
            tidelog.open(uri + query)
        assert failed.value.errno == errno.EIO and ".sfa" in str(failed.value)
        assert "SF-19" in str(failed.value)
    monkeypatch.setattr(os, "pread", real)
    store = tidelog.open(uri)  # the failed opens released the lock
    try:
        monkeypatch.setattr(os, "pread", failing_pread(real))
        for after in (0, 199):  # the first frame (a sealed segment), the last (the active one)
            with pytest.raises(StorageError) as failed:
                payloads(store, after)
            assert failed.value.errno == errno.EIO and ".sfa" in str(failed.value)
        assert store.describe()["poisoned"] is None
        assert store.topic("frames").append(b"after") == 201
        monkeypatch.setattr(os, "pread", real)
        assert payloads(store) == [payload(f) for f in range(200)] + [b"after"]
    finally:
        monkeypatch.setattr(os, "pread", real)
        store.close()


def test_SF_22_what_remains_with_mmap_true(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """SF-22: with the default mmap=true the same failing pread does not stop the open (the
    scan and the sealed segments' reads go through maps, where a real media error would be a
    SIGBUS); only the active segment, read with pread, raises io_error."""
    slot = tmp_path / "sf" / "a"
    fill(slot)
    monkeypatch.setattr(os, "pread", failing_pread(os.pread))
    with tidelog.open(f"sf://{slot}?{SMALL}") as store:
        active = store.describe()["segment_files"][-1]  # type: ignore[index]
        sealed = [p for p in payloads_until_error(store)]
        assert sealed == [payload(f) for f in range(len(sealed))] and 0 < len(sealed) < 200
        with pytest.raises(StorageError, match=active) as failed:
            payloads(store, len(sealed))
        assert failed.value.errno == errno.EIO


def payloads_until_error(store: tidelog.Store) -> list[bytes]:
    """Payloads read one at a time until a read fails."""
    out: list[bytes] = []
    frames = store.topic("frames")
    while True:
        try:
            items = frames.read(len(out), 1)
        except StorageError:
            return out
        out.append(items[0].payload)  # type: ignore[union-attr]
