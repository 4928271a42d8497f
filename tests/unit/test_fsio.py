"""The real file-I/O seam, ``tidelog.fsio.OsFS``, in a temporary directory.

The file backend does all its I/O through an ``FS``; crash tests substitute
``tidelog.conformance.crashfs.RecordingFS``. The behavioural tests run against both, so the
simulated file system is held to what the real one does (tests that look at the real disk,
like block reservation, run on ``OsFS`` only).
"""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

from tidelog.conformance.crashfs import RecordingFS
from tidelog.errors import Locked, StorageError
from tidelog.fsio import FS, OsFS, io_errors, storage_error, write_parts


@pytest.fixture(params=["os", "recording"])
def fs(request: pytest.FixtureRequest, tmp_path: Path) -> FS:
    if request.param == "os":
        return OsFS()
    return RecordingFS(dirs=[str(tmp_path)])  # the same paths, in memory


def test_open_creates_and_open_without_create_refuses(fs: FS, tmp_path: Path) -> None:
    path = str(tmp_path / "f")
    with pytest.raises(FileNotFoundError):
        fs.open(path, create=False)
    assert not fs.exists(path)
    h = fs.open(path)
    assert fs.exists(path) and not fs.is_dir(path) and h.size() == 0 and h.path == path
    h.close()
    h.close()  # idempotent
    fs.open(path, create=False).close()
    with pytest.raises(FileNotFoundError):
        fs.open(str(tmp_path / "no" / "f"))
    with pytest.raises(FileNotFoundError):
        fs.open_read(str(tmp_path / "missing"))


def test_pwrite_pread_at_offsets(fs: FS, tmp_path: Path) -> None:
    h = fs.open(str(tmp_path / "f"))
    h.pwrite(b"hello", 0)
    h.pwrite(bytearray(b"world"), 10)  # past the end: the gap reads as zeros
    h.pwrite(memoryview(b"XY"), 1)
    assert h.size() == 15
    assert h.pread(15, 0) == b"hXYlo\0\0\0\0\0world"
    assert h.pread(100, 12) == b"rld"  # short read at end of file
    assert h.pread(4, 100) == b""
    big = os.urandom(1 << 20)  # a large write goes out whole
    h.pwrite(big, 3)
    assert h.pread(len(big), 3) == big
    h.close()


@pytest.mark.parametrize("data", [b"x" * 2500, bytearray(b"y" * 3001), memoryview(b"z" * 999)])
def test_pwrite_finishes_a_short_write(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, data: bytes | bytearray | memoryview
) -> None:
    """A real ``pwrite`` that writes less than asked (at most 1000 bytes a call here) is
    continued until every byte is out, whatever buffer type it was given."""
    real = os.pwrite
    calls: list[int] = []

    def short(fd: int, buf: bytes, offset: int) -> int:
        calls.append(offset)
        return real(fd, memoryview(buf)[:1000], offset)

    monkeypatch.setattr(os, "pwrite", short)
    h = OsFS().open(str(tmp_path / "f"))
    h.pwrite(data, 5)
    assert h.pread(len(data), 5) == bytes(data)
    assert calls == list(range(5, 5 + len(data), 1000))
    h.close()


def test_write_parts_writes_them_back_to_back(
    fs: FS, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``write_parts`` (a checkpoint's segment pieces): the bytes of the parts joined, at the
    offset, also when the vectored write of the real FS returns short and over more parts
    than one call takes."""
    real = os.pwritev

    def short(fd: int, buffers: list[bytes], offset: int) -> int:  # at most 1000 bytes a call
        out = b"".join(bytes(b) for b in buffers)[:1000]
        return real(fd, [out], offset)

    monkeypatch.setattr(os, "pwritev", short)
    parts = [os.urandom(n) for n in [7, 0, 3000, 1, 2500] * 300]  # more than 1024 buffers
    h = fs.open(str(tmp_path / "f"))
    h.pwrite(b"head", 0)
    write_parts(h, parts, 4)
    write_parts(h, [], h.size())
    assert h.pread(h.size(), 0) == b"head" + b"".join(parts)
    h.close()


def test_open_read_is_read_only(fs: FS, tmp_path: Path) -> None:
    path = str(tmp_path / "f")
    fs.open(path).close()
    r = fs.open_read(path)
    with pytest.raises(OSError) as info:
        r.pwrite(b"x", 0)
    assert info.value.errno == errno.EBADF
    r.close()


def test_size_truncate_allocate(fs: FS, tmp_path: Path) -> None:
    path = str(tmp_path / "f")
    h = fs.open(path)
    h.pwrite(b"0123456789", 0)
    h.truncate(4)
    assert h.size() == 4 and h.pread(10, 0) == b"0123"
    h.truncate(8)
    assert h.pread(10, 0) == b"0123\0\0\0\0"
    h.allocate(64 * 1024)
    assert h.size() == 64 * 1024 == fs.file_size(path)
    assert h.pread(8, 0) == b"0123\0\0\0\0" and h.pread(16, 1000) == bytes(16)
    h.allocate(10)  # never shrinks
    assert h.size() == 64 * 1024
    h.close()


def test_allocate_reserves_real_blocks(tmp_path: Path) -> None:
    """posix_fallocate where the file system has it, written zeros where it does not: either
    way the blocks are real, never a sparse hole."""
    path = str(tmp_path / "f")
    h = OsFS().open(path)
    h.allocate(1 << 20)
    assert os.stat(path).st_blocks * 512 >= 1 << 20  # real blocks, not a sparse hole
    h.close()


def test_syncs_are_callable(fs: FS, tmp_path: Path) -> None:
    h = fs.open(str(tmp_path / "f"))
    h.pwrite(b"x", 0)
    h.fdatasync()
    h.fsync()
    fs.fsync_dir(str(tmp_path))
    h.close()
    with pytest.raises(FileNotFoundError):
        fs.fsync_dir(str(tmp_path / "missing"))


def test_map_sees_the_bytes(fs: FS, tmp_path: Path) -> None:
    h = fs.open(str(tmp_path / "f"))
    assert bytes(h.map()) == b""  # an empty file maps to an empty view
    h.pwrite(b"sealed segment", 0)
    view = h.map()
    assert view.readonly and bytes(view[:6]) == b"sealed" and len(view) == 14
    with pytest.raises(TypeError):
        view[0] = 1
    h.close()  # a view still alive keeps its map: closing must not raise
    assert bytes(view[7:]) == b"segment"
    del view


def test_lock_conflicts_between_handles_and_is_released_on_close(fs: FS, tmp_path: Path) -> None:
    path = str(tmp_path / ".lock")
    a, b = fs.open(path), fs.open(path)
    a.lock()
    with pytest.raises(Locked) as info:
        b.lock()
    assert info.value.code == "locked" and path in str(info.value)
    a.close()
    b.lock()
    c = fs.open(path)
    with pytest.raises(Locked):
        c.lock()
    b.close()
    c.close()


def test_directory_operations(fs: FS, tmp_path: Path) -> None:
    root = str(tmp_path / "store")
    fs.mkdir(os.path.join(root, "sub", "deep"))  # parents too
    fs.mkdir(os.path.join(root, "sub"))  # exists: fine
    assert fs.is_dir(root) and fs.exists(root)
    for name in ("b", "a", "c"):
        fs.open(os.path.join(root, name)).close()
    assert fs.listdir(root) == ["a", "b", "c", "sub"]
    h = fs.open(os.path.join(root, "a"))
    h.pwrite(b"new", 0)
    h.close()
    fs.rename(os.path.join(root, "a"), os.path.join(root, "b"))  # replaces b
    assert fs.listdir(root) == ["b", "c", "sub"]
    assert fs.file_size(os.path.join(root, "b")) == 3
    fs.unlink(os.path.join(root, "c"))
    fs.rmdir(os.path.join(root, "sub", "deep"))
    fs.fsync_dir(root)
    assert fs.listdir(root) == ["b", "sub"]
    with pytest.raises(FileNotFoundError):
        fs.unlink(os.path.join(root, "c"))
    with pytest.raises(FileNotFoundError):
        fs.listdir(os.path.join(root, "missing"))
    with pytest.raises(FileNotFoundError):
        fs.file_size(os.path.join(root, "missing"))
    with pytest.raises(OSError):
        fs.rmdir(root)  # not empty


def test_storage_error_names_disk_full() -> None:
    err = storage_error(OSError(errno.ENOSPC, os.strerror(errno.ENOSPC)), "append to wal")
    assert isinstance(err, StorageError) and isinstance(err, OSError)
    assert err.code == "io_error" and err.errno == errno.ENOSPC
    assert str(err) == "append to wal: disk full"
    other = storage_error(OSError(errno.EIO, os.strerror(errno.EIO)), "read segment")
    assert str(other) == f"read segment: {os.strerror(errno.EIO)}" and other.errno == errno.EIO


def test_FLT_3_descriptor_call_errors_name_the_file(tmp_path: Path) -> None:
    """FLT-3: an OSError from a call on a descriptor (which carries no path) names the file, and
    storage_error keeps the name in its message."""
    path = str(tmp_path / "f")
    OsFS().open(path).close()
    h = OsFS().open_read(path)
    try:
        with pytest.raises(OSError) as failed:
            h.pwrite(b"x", 0)
    finally:
        h.close()
    assert failed.value.errno == errno.EBADF and failed.value.filename == path
    err = storage_error(failed.value, "writing")
    assert str(err) == f"writing: {os.strerror(errno.EBADF)} ({path})"
    assert storage_error(err, "again") is err  # already typed: unchanged


def test_FLT_3_io_errors_types_os_errors_and_passes_tidelog_errors() -> None:
    with pytest.raises(StorageError) as typed, io_errors("opening x"):
        raise FileNotFoundError(errno.ENOENT, "No such file or directory", "/x/y")
    assert typed.value.code == "io_error" and typed.value.errno == errno.ENOENT
    assert str(typed.value) == "opening x: No such file or directory (/x/y)"
    with pytest.raises(Locked), io_errors("opening x"):
        raise Locked("held")


def test_FLT_9_map_without_mmap_reads_a_copy(tmp_path: Path) -> None:
    """FLT-9: OsFS(mmap=False).map gives the file's bytes read by pread (holes read as zeros),
    read-only, and maps nothing of the file."""
    path = str(tmp_path / "sparse")
    h = OsFS().open(path)
    h.pwrite(b"head", 0)
    h.pwrite(b"tail", 3 << 20)
    h.close()
    fs = OsFS(mmap=False)
    r = fs.open_read(path)
    try:
        view = r.map()
        assert len(view) == (3 << 20) + 4 and view.readonly
        assert bytes(view[:4]) == b"head" and bytes(view[-4:]) == b"tail"
        assert bytes(view[4 : 3 << 20]).count(0) == (3 << 20) - 4
        with open("/proc/self/maps", encoding="utf-8") as f:
            assert path not in f.read()
        view.release()
    finally:
        r.close()
