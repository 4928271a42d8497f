"""The file-I/O seam: every byte a storage backend reads or writes goes through an ``FS``.

Production uses ``OsFS`` (plain ``os`` calls). Crash tests substitute a recording implementation
(``tidelog.conformance.crashfs.RecordingFS``) that keeps a durable and a volatile image and can
produce every disk state a power loss may leave (spec/CRASH.md). Keeping the seam small is what
makes that possible: positional reads/writes, explicit syncs, directory syncs, renames, and a
read-only map of a file's current bytes.

Paths are plain strings; the seam never changes the working directory. A failed call raises
``OSError`` with the path in ``filename`` (descriptor calls too); backends turn it into the typed
``io_error`` (``storage_error``, ``io_errors``: spec/SPEC.md FLT-3).

``OsFS(mmap=False)`` never maps a file (SPEC.md FLT-9): ``Handle.map`` copies the file into
anonymous memory by ``pread`` instead, so a media error is an ``OSError`` (EIO) at that read,
never a SIGBUS later, at the cost of holding the bytes in memory.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import fcntl
import mmap
import os
from collections.abc import Iterator, Sequence
from typing import Any, Protocol

from .errors import Locked, StorageError, TidelogError

__all__ = [
    "FS",
    "Handle",
    "OsFS",
    "storage_error",
    "io_errors",
    "make_dirs",
    "read_whole",
    "write_whole",
    "replace_file",
    "whole_object",
    "write_parts",
    "write_out",
    "Pacer",
    "write_paced",
    "WRITE_OUT_BYTES",
    "written_prefix",
    "zero_after",
]

_IOV_MAX = 1024  # buffers per vectored write (Linux UIO_MAXIOV)

#: the piece ``Pacer`` writes out (spec/FORMATS-seg3.md SEG-20): of 1, 2 and 4 MiB, fsync
#: ``append_many`` beside checkpoints ran as fast with each, and with 1 MiB its p99 batch was a
#: quarter shorter (a WAL sync waits behind less); below that, more syscalls and waits
WRITE_OUT_BYTES = 1 << 20


def _load_sync_file_range() -> Any:
    """libc's ``sync_file_range`` (Linux), or None: the os module has no binding. A ctypes
    call releases the GIL, as ``os.fdatasync`` does."""
    try:
        fn = ctypes.CDLL(None, use_errno=True).sync_file_range
    except (OSError, AttributeError):
        return None
    fn.argtypes = [ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint]
    fn.restype = ctypes.c_int
    return fn


_SYNC_FILE_RANGE = _load_sync_file_range()
#: what sync_file_range answers where it cannot pace (no such call, not a regular file, a file
#: system that refuses it; the arguments are always valid): never a failed write
_NO_WRITE_OUT = frozenset((errno.ENOSYS, errno.ESPIPE, errno.EINVAL, errno.EOPNOTSUPP))
_WRITE = 2  # SYNC_FILE_RANGE_WRITE
_WRITE_AND_WAIT = 1 | 2 | 4  # and SYNC_FILE_RANGE_WAIT_BEFORE, SYNC_FILE_RANGE_WAIT_AFTER


class Handle(Protocol):
    """An open file, always read-write unless opened with ``open_read``."""

    path: str

    def pwrite(self, data: bytes | bytearray | memoryview, offset: int) -> None:
        """Write all of ``data`` at ``offset`` (extending the file if needed)."""

    def pread(self, size: int, offset: int) -> bytes:
        """Up to ``size`` bytes at ``offset`` (fewer at end of file)."""

    def size(self) -> int: ...

    def truncate(self, size: int) -> None:
        """Set the file's size (shrink, or extend with zeros)."""

    def allocate(self, size: int) -> None:
        """Reserve real blocks so the file is at least ``size`` bytes, zero-filled, without
        a later write needing to grow it (posix_fallocate, or writing zeros)."""

    def fdatasync(self) -> None: ...

    def fsync(self) -> None: ...

    def map(self) -> memoryview:
        """A read-only view of the file's bytes at the time of the call (an mmap, or a copy):
        it need not reflect later writes, so use it only for immutable (sealed) files. Valid
        until the handle is closed, or, if views of it are still held then, until the last of
        them is released (a mapped ``.idx`` outlives its handle, recovery.open_chunk)."""

    def lock(self) -> None:
        """Take an exclusive advisory lock without blocking; raise ``Locked`` if held."""

    def close(self) -> None: ...


class FS(Protocol):
    def open(self, path: str, *, create: bool = True) -> Handle:
        """Open for reading and writing; create the file if missing and ``create``. A symbolic
        link at the last component is never followed: ``OSError`` ELOOP (FORMATS LOCK-4)."""

    def open_read(self, path: str) -> Handle: ...

    def exists(self, path: str) -> bool: ...

    def is_dir(self, path: str) -> bool: ...

    def listdir(self, path: str) -> list[str]:
        """Names in a directory, sorted."""

    def mkdir(self, path: str) -> bool:
        """Create a directory (and missing parents); no error if it exists. True when this
        call created ``path`` itself, False when it was a directory already (another process
        may have made it a moment before: storedir's undo must know which it made)."""

    def rename(self, src: str, dst: str) -> None:
        """Atomically replace ``dst`` with ``src`` (durable only after ``fsync_dir``; across
        directories, fsync both)."""

    def unlink(self, path: str) -> None: ...

    def rmdir(self, path: str) -> None: ...

    def fsync_dir(self, path: str) -> None:
        """Make creations, renames and unlinks in directory ``path`` durable."""

    def file_size(self, path: str) -> int: ...

    def chmod(self, path: str, mode: int) -> None:
        """Set a file's permission bits (sealed segments are made read-only, QSEG-10)."""


def make_dirs(fs: FS, path: str) -> None:
    """Create ``path`` and any missing parents *durably*: after each new directory its parent is
    fsynced, since a directory entry survives a crash only once its parent is synced
    (spec/CRASH.md CRASH-4)."""
    path = os.path.normpath(path)
    if fs.is_dir(path):
        return
    parent = os.path.dirname(path) or "."
    if parent != path:
        make_dirs(fs, parent)
    fs.mkdir(path)
    fs.fsync_dir(parent)


def read_whole(fs: FS, path: str) -> bytes:
    """Every byte of the file at ``path``."""
    h = fs.open_read(path)
    try:
        return h.pread(h.size(), 0)
    finally:
        h.close()


def write_whole(fs: FS, path: str, data: bytes, *, data_only: bool = False) -> None:
    """Replace the content of the file at ``path`` (created if missing) with ``data`` and
    fsync it (``fdatasync`` with ``data_only``); its directory entry is the caller's to sync."""
    h = fs.open(path)
    try:
        h.truncate(0)
        h.pwrite(data, 0)
        if data_only:
            h.fdatasync()
        else:
            h.fsync()
    finally:
        h.close()


def replace_file(fs: FS, path: str, data: bytes) -> None:
    """Replace ``path`` atomically and durably (spec/FORMATS.md LAY-3): write ``path.tmp``,
    sync it, rename it over ``path``, sync the directory."""
    write_whole(fs, path + ".tmp", data, data_only=True)
    fs.rename(path + ".tmp", path)
    fs.fsync_dir(os.path.dirname(path))


def whole_object(view: memoryview) -> Any:
    """The mmap or bytes under ``view`` when the view covers all of it, else None. Slicing
    that object yields ``bytes`` in one step, and a strided slice of it is one C loop (through
    the view, a strided copy takes the generic buffer path, ~10x slower)."""
    obj = view.obj
    return obj if isinstance(obj, (bytes, mmap.mmap)) and len(obj) == len(view) else None


def write_parts(h: Handle, parts: Sequence[bytes | bytearray], offset: int) -> None:
    """Write ``parts`` back to back at ``offset``: one vectored write where the handle has one
    (``pwritev``), else one ``pwrite`` of them joined (what any FS sees: the same bytes); a
    single part is one plain ``pwrite`` (no join, no vector)."""
    if len(parts) == 1:
        h.pwrite(parts[0], offset)
        return
    vectored = getattr(h, "pwritev", None)
    if vectored is not None:
        vectored(parts, offset)
    else:
        h.pwrite(b"".join(parts), offset)


def write_out(h: Handle, offset: int, size: int, *, wait: bool = True) -> None:
    """Write the range's dirty pages to the device, and with ``wait`` wait until they are there
    (and for any writeback of the range already under way), where the handle can
    (``Handle.write_out``: Linux ``sync_file_range``); elsewhere nothing. Pacing only, never a
    durability point (spec/CRASH.md CRASH-2): no device cache flush, no metadata. A failure
    raises ``OSError`` and counts as a failed sync (spec/SPEC.md FLT-6): the kernel may have
    marked the failed pages clean, so a later ``fdatasync`` need not report it."""
    fn = getattr(h, "write_out", None)
    if fn is not None:
        fn(offset, size, wait)


class Pacer:
    """Writes out a file written front to back in pieces of ``every`` bytes (0: never;
    spec/FORMATS-seg3.md SEG-20), so its writeback reaches the device while it is written, at
    most about two pieces in flight, not in one burst at its ``fdatasync`` that a concurrent
    WAL sync would queue behind. Each piece is started when written and waited for when the
    next one starts: the writer waits for the device only one piece behind."""

    __slots__ = ("_h", "_every", "_done", "_started")

    def __init__(self, h: Handle, every: int) -> None:
        self._h = h
        self._every = every
        self._done = 0  # bytes before this were waited for
        self._started = 0  # bytes before this were started

    def wrote(self, end: int) -> None:
        """The file's bytes up to ``end`` are written."""
        if self._every and end - self._started >= self._every:
            write_out(self._h, self._started, end - self._started, wait=False)
            if self._done < self._started:
                write_out(self._h, self._done, self._started - self._done)
            self._done, self._started = self._started, end


def write_paced(h: Handle, data: bytes | bytearray | memoryview, every: int) -> None:
    """Write ``data`` at offset 0 in pieces of ``every`` bytes, each written out (``Pacer``);
    ``every`` 0: one write."""
    if not every or len(data) <= every:
        h.pwrite(data, 0)
        return
    pace = Pacer(h, every)
    with memoryview(data) as view:
        for at in range(0, len(view), every):
            piece = view[at : at + every]
            h.pwrite(piece, at)
            pace.wrote(at + len(piece))


def written_prefix(h: Handle) -> int:
    """Bytes from the start of the file up to its first hole: blocks below it have been
    written (``SEEK_HOLE``: preallocated extents never written are holes); 0 when unknown."""
    regions = getattr(h, "data_regions", None)
    spans = regions(0) if regions is not None else []
    return spans[0][1] if spans and spans[0][0] == 0 else 0


def zero_after(h: Handle, offset: int) -> bool:
    """Whether every byte of the file from ``offset`` on reads as zero. A real file is read
    only where it holds data (``SEEK_DATA``/``SEEK_HOLE``: preallocated extents never written
    are holes), so a large preallocated tail costs nothing to check."""
    regions = getattr(h, "data_regions", None)
    spans = regions(offset) if regions is not None else [(offset, h.size())]
    for a, b in spans:
        while a < b:
            chunk = h.pread(min(1 << 20, b - a), a)
            if not chunk:
                break
            if chunk.count(0) != len(chunk):
                return False
            a += len(chunk)
    return True


def storage_error(exc: OSError, what: str) -> StorageError:
    """A typed error for an OS failure, naming what was being done and the file (ERR-1,
    FLT-3: io_error with the call's errno; ENOSPC reads "disk full")."""
    if isinstance(exc, StorageError):
        return exc
    detail = "disk full" if exc.errno == errno.ENOSPC else (exc.strerror or str(exc))
    path = exc.filename
    where = f" ({path})" if path is not None and str(path) not in what else ""
    err = StorageError(f"{what}: {detail}{where}")
    err.errno = exc.errno  # (no filename: OSError.__str__ would then replace the message)
    return err


@contextlib.contextmanager
def io_errors(what: str) -> Iterator[None]:
    """FLT-3 at an entry point: an ``OSError`` raised inside leaves as ``io_error`` naming
    ``what``; tidelog's own errors pass unchanged."""
    try:
        yield
    except TidelogError:
        raise
    except OSError as exc:
        raise storage_error(exc, what) from None


def _named(exc: OSError, path: str) -> OSError:
    """``exc`` with the file's path, for calls on a descriptor (os.pwrite etc. carry none)."""
    if exc.filename is None:
        exc.filename = path
    return exc


class _OsHandle:
    __slots__ = ("path", "fd", "_maps", "_mmap")

    def __init__(self, path: str, fd: int, use_mmap: bool = True) -> None:
        self.path = path
        self.fd = fd
        self._maps: list[mmap.mmap] = []
        self._mmap = use_mmap

    def pwrite(self, data: bytes | bytearray | memoryview, offset: int) -> None:
        try:
            n = os.pwrite(self.fd, data, offset)
            if n < len(data):  # short: the rest, from a view (no view for the usual whole write)
                view = memoryview(data)[n:]
                offset += n
                while view:
                    n = os.pwrite(self.fd, view, offset)
                    view = view[n:]
                    offset += n
        except OSError as exc:
            raise _named(exc, self.path) from None

    def pwritev(self, parts: Sequence[bytes | bytearray], offset: int) -> None:
        """``pwrite(b"".join(parts), offset)`` without the joined copy (``write_parts``)."""
        try:
            for k in range(0, len(parts), _IOV_MAX):
                group: list[bytes | bytearray | memoryview] = list(parts[k : k + _IOV_MAX])
                left = sum(map(len, group))
                while left:
                    n = os.pwritev(self.fd, group, offset)
                    offset += n
                    left -= n
                    while n and n >= len(group[0]):  # a short write: resume where it stopped
                        n -= len(group.pop(0))
                    if n:
                        group[0] = memoryview(group[0])[n:]
        except OSError as exc:
            raise _named(exc, self.path) from None

    def pread(self, size: int, offset: int) -> bytes:
        try:
            return os.pread(self.fd, size, offset)
        except OSError as exc:
            raise _named(exc, self.path) from None

    def size(self) -> int:
        try:
            return os.fstat(self.fd).st_size
        except OSError as exc:
            raise _named(exc, self.path) from None

    def truncate(self, size: int) -> None:
        try:
            os.ftruncate(self.fd, size)
        except OSError as exc:
            raise _named(exc, self.path) from None

    def allocate(self, size: int) -> None:
        current = self.size()
        if size <= current:
            return
        try:
            os.posix_fallocate(self.fd, current, size - current)
        except OSError as exc:
            if exc.errno not in (errno.EOPNOTSUPP, errno.EINVAL):
                raise _named(exc, self.path) from None
            # No fallocate on this file system: write the zeros, so the blocks are still real
            # (a sparse tail would fail a later write with ENOSPC, or SIGBUS an mmap store).
            zeros = bytes(1 << 20)
            while current < size:
                n = min(len(zeros), size - current)
                self.pwrite(zeros[:n] if n < len(zeros) else zeros, current)
                current += n

    def data_regions(self, offset: int) -> list[tuple[int, int]]:
        """``[start, end)`` ranges from ``offset`` on that may hold data (``zero_after``)."""
        size = self.size()
        out: list[tuple[int, int]] = []
        try:
            while offset < size:
                try:
                    start = os.lseek(self.fd, offset, os.SEEK_DATA)
                except OSError as exc:
                    if exc.errno == errno.ENXIO:  # no data from here to the end
                        break
                    raise
                offset = os.lseek(self.fd, start, os.SEEK_HOLE)
                out.append((start, offset))
        except OSError:  # no SEEK_DATA here: every byte may be data
            return [(offset, size)]
        return out

    def fdatasync(self) -> None:
        try:
            os.fdatasync(self.fd)
        except OSError as exc:
            raise _named(exc, self.path) from None

    def fsync(self) -> None:
        try:
            os.fsync(self.fd)
        except OSError as exc:
            raise _named(exc, self.path) from None

    def write_out(self, offset: int, size: int, wait: bool = True) -> None:
        """``fsio.write_out``: sync_file_range(WRITE), with ``wait`` also WAIT_BEFORE and
        WAIT_AFTER."""
        if _SYNC_FILE_RANGE is None or size <= 0:
            return
        flags = _WRITE_AND_WAIT if wait else _WRITE
        if _SYNC_FILE_RANGE(self.fd, offset, size, flags) != 0:
            code = ctypes.get_errno()
            if code in _NO_WRITE_OUT:  # not for this file or kernel: pacing is optional
                return
            raise OSError(code, os.strerror(code), self.path)

    def map(self) -> memoryview:
        size = self.size()
        if size == 0:
            return memoryview(b"")
        if not self._mmap:
            return self._copy(size)
        m = mmap.mmap(self.fd, 0, access=mmap.ACCESS_READ)
        self._maps.append(m)
        return memoryview(m)

    def _copy(self, size: int) -> memoryview:
        """``map`` without mapping the file (FLT-9): its data regions read by ``pread`` into a
        shared anonymous map, where pages never written (holes, preallocated extents) cost
        nothing, and which ``MADV_DONTNEED`` may drop from the resident set without losing
        them (walchunk.WalFile.drop_resident)."""
        m = mmap.mmap(-1, size)
        try:
            for a, b in self.data_regions(0):
                while a < b:
                    chunk = self.pread(min(1 << 20, b - a), a)
                    if not chunk:
                        break
                    m[a : a + len(chunk)] = chunk
                    a += len(chunk)
        except BaseException:
            m.close()
            raise
        self._maps.append(m)
        return memoryview(m).toreadonly()

    def lock(self) -> None:
        try:
            fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise Locked(f"{self.path} is locked by another process") from None
        except OSError as exc:
            raise _named(exc, self.path) from None

    def close(self) -> None:
        for m in self._maps:
            with contextlib.suppress(BufferError):  # a view is still exported: freed with it
                m.close()
        self._maps.clear()
        if self.fd >= 0:
            fd, self.fd = self.fd, -1
            try:
                os.close(fd)
            except OSError as exc:
                raise _named(exc, self.path) from None


class OsFS:
    """The real file system; ``mmap=False``: ``Handle.map`` copies instead (FLT-9)."""

    mmap = True  # (a class default too: subclasses need not call __init__)

    def __init__(self, *, mmap: bool = True) -> None:
        self.mmap = mmap

    def open(self, path: str, *, create: bool = True) -> Handle:
        # never write through a symbolic link planted at the last component (FORMATS LOCK-4)
        flags = os.O_RDWR | os.O_CLOEXEC | os.O_NOFOLLOW | (os.O_CREAT if create else 0)
        return _OsHandle(path, os.open(path, flags, 0o644), self.mmap)

    def open_read(self, path: str) -> Handle:
        return _OsHandle(path, os.open(path, os.O_RDONLY | os.O_CLOEXEC), self.mmap)

    def exists(self, path: str) -> bool:
        return os.path.exists(path)

    def is_dir(self, path: str) -> bool:
        return os.path.isdir(path)

    def listdir(self, path: str) -> list[str]:
        return sorted(os.listdir(path))

    def mkdir(self, path: str) -> bool:
        parent = os.path.dirname(os.path.normpath(path))
        if parent and not os.path.isdir(parent):
            os.makedirs(parent, exist_ok=True)
        try:
            os.mkdir(path)
        except FileExistsError:
            if not os.path.isdir(path):
                raise
            return False
        return True

    def rename(self, src: str, dst: str) -> None:
        os.replace(src, dst)

    def unlink(self, path: str) -> None:
        os.unlink(path)

    def rmdir(self, path: str) -> None:
        os.rmdir(path)

    def fsync_dir(self, path: str) -> None:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    def file_size(self, path: str) -> int:
        return os.stat(path).st_size

    def chmod(self, path: str, mode: int) -> None:
        os.chmod(path, mode)
