"""Opening the device or image that holds a ring: which handle, how big, how aligned (BDEV-11..13).

Every byte goes through a ``tidelog.fsio.Handle``, so crash tests can record it. Image files are
opened through the store's ``FS`` (ordinary I/O + fdatasync). Raw block devices (only ever on the
real file system) get a ``DeviceHandle``: its size comes from ``lseek(SEEK_END)`` (``fstat``
says 0 for a device) and, where the kernel allows, it uses ``O_DIRECT`` with page-aligned bounce
buffers from an anonymous ``mmap``, so page writes skip the page cache (BDEV-20: every write is
costly; the cache would only delay and merge them).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import mmap
import os
import posixpath
import stat
import struct
from collections.abc import Callable
from dataclasses import dataclass

from tidelog.errors import BadOption, Locked, StorageError
from tidelog.fsio import FS, Handle, OsFS
from tidelog.model.ring import MAX_PAGES, usable_page_count

from .format import META_BYTES, MIN_PAGE_SIZE

__all__ = [
    "Geometry",
    "DeviceHandle",
    "Attached",
    "attach",
    "attach_read_only",
    "geometry_for",
    "is_block_device",
]

_BLKSSZGET = 0x1268  # ioctl: logical sector size of a block device (linux/fs.h)


@dataclass(frozen=True)
class Geometry:
    """Where the ring's pages are: ``page_count`` pages of ``page_size`` after the metadata."""

    page_size: int
    page_count: int

    def offset(self, index: int) -> int:
        return META_BYTES + index * self.page_size

    @property
    def ring_bytes(self) -> int:
        return META_BYTES + self.page_count * self.page_size


def geometry_for(device_bytes: int, page_size: int, what: str) -> Geometry:
    """The ring a device of ``device_bytes`` holds: as many pages as fit after the metadata block,
    rounded down to even and capped at 65534 (RING-2, BDEV-12); fewer than 2 is ``BadOption``."""
    raw = (device_bytes - META_BYTES) // page_size if device_bytes > META_BYTES else 0
    if raw < 2:
        raise BadOption(
            f"{what} is too small: {device_bytes} bytes hold {max(raw, 0)} pages of {page_size} "
            f"bytes after the {META_BYTES}-byte metadata block; a ring needs at least 2"
        )
    return Geometry(page_size, usable_page_count(min(raw, MAX_PAGES)))


class DeviceHandle:
    """A ``Handle`` on a raw block device (or, with ``direct=on``, an image file) that may use
    O_DIRECT. With O_DIRECT every transfer must be aligned to ``align`` in offset, length and
    memory; writes that are not aligned raise EINVAL like the kernel would (callers only ever
    write whole aligned pages and metadata blocks)."""

    def __init__(self, path: str, *, direct: bool, read_only: bool = False) -> None:
        self.path = path
        self.direct = False
        self.fd = -1
        flags = (os.O_RDONLY if read_only else os.O_RDWR) | os.O_CLOEXEC
        if direct and hasattr(os, "O_DIRECT"):
            try:
                self.fd = os.open(path, flags | os.O_DIRECT)
                self.direct = True
            except OSError as exc:  # tmpfs and some file systems refuse O_DIRECT
                if exc.errno != errno.EINVAL:
                    raise
        if self.fd < 0:
            self.fd = os.open(path, flags)
        self.is_device = stat.S_ISBLK(os.fstat(self.fd).st_mode)
        self.align = self._alignment() if self.direct else 1
        self._buf: mmap.mmap | None = None

    def _alignment(self) -> int:
        if self.is_device:
            try:
                raw = fcntl.ioctl(self.fd, _BLKSSZGET, b"\0\0\0\0")
                return max(int(struct.unpack("<i", raw)[0]), MIN_PAGE_SIZE)
            except OSError:
                return 4096
        return max(os.fstat(self.fd).st_blksize, MIN_PAGE_SIZE)

    def drop_direct(self) -> None:
        """Reopen without O_DIRECT (the ring's pages are not aligned to the device's sectors)."""
        if not self.direct:
            return
        fd = os.open(self.path, os.O_RDWR | os.O_CLOEXEC)
        os.close(self.fd)
        self.fd, self.direct, self.align = fd, False, 1

    def _bounce(self, n: int) -> mmap.mmap:
        # anonymous mmaps are page-aligned, which satisfies every O_DIRECT alignment up to 4 KiB
        if self._buf is None or len(self._buf) < n:
            if self._buf is not None:
                self._buf.close()
            self._buf = mmap.mmap(-1, max(n, mmap.PAGESIZE))
        return self._buf

    def pwrite(self, data: bytes | bytearray | memoryview, offset: int) -> None:
        view = memoryview(data)
        if self.direct:
            if offset % self.align or len(view) % self.align:
                raise OSError(errno.EINVAL, "unaligned direct write", self.path)
            buf = self._bounce(len(view))
            buf[: len(view)] = view
            view = memoryview(buf)[: len(view)]
        try:
            while view:
                n = os.pwrite(self.fd, view, offset)
                view = view[n:]
                offset += n
        finally:
            view.release()

    def pread(self, size: int, offset: int) -> bytes:
        if not self.direct:
            return os.pread(self.fd, size, offset)
        start = offset - offset % self.align
        end = -(-(offset + size) // self.align) * self.align
        buf = self._bounce(end - start)
        with memoryview(buf) as view:
            got = os.preadv(self.fd, [view[: end - start]], start)
            avail = max(0, min(offset + size, start + got) - offset)  # short at end of device
            return bytes(view[offset - start : offset - start + avail])

    def size(self) -> int:
        return os.lseek(self.fd, 0, os.SEEK_END)

    def truncate(self, size: int) -> None:
        os.ftruncate(self.fd, size)

    def allocate(self, size: int) -> None:
        if size > self.size():
            os.ftruncate(self.fd, size)

    def fdatasync(self) -> None:
        os.fdatasync(self.fd)

    def fsync(self) -> None:
        os.fsync(self.fd)

    def map(self) -> memoryview:
        return memoryview(self.pread(self.size(), 0))

    def lock(self) -> None:
        try:
            fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise Locked(f"{self.path} is in use by another tidelog store") from None

    def close(self) -> None:
        if self._buf is not None:
            self._buf.close()
            self._buf = None
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


@dataclass
class Attached:
    handle: Handle
    kind: str  # "image" | "device"
    created: bool  # the image file did not exist: it holds nothing but zeros
    direct: bool
    commit: Callable[[], None] | None = None  # a new image: give it its name once formatted
    discard: Callable[[], None] | None = None  # a new image: remove it if the open fails


def is_block_device(fs: FS, path: str) -> bool:
    """Whether ``path`` is a raw block device (only ever on the real file system)."""
    if not isinstance(fs, OsFS):  # crash tests' RecordingFS: only ever image files
        return False
    try:
        return stat.S_ISBLK(os.stat(path).st_mode)
    except OSError:
        return False


def attach(fs: FS, path: str, *, size: int | None, direct: str) -> Attached:
    """Open (or create) the ring's device or image and lock it (BDEV-11).

    A missing image is created only when ``size`` is given (sparse, ``size`` bytes, under a
    temporary name until ``Attached.commit``). Raises ``BadOption`` for a missing image without
    ``size``, for ``size`` on a raw device (its size is the device's, BDEV-12) and for
    ``direct=on`` where O_DIRECT is refused (BDEV-20); ``Locked`` if another store holds it,
    ``OSError`` for I/O failures (the caller types them, BDEV-23).
    """
    if is_block_device(fs, path):
        if size is not None:
            raise BadOption(
                f"option size={size}: {path} is a block device; its size comes from the device "
                "(omit size)"
            )
        dev = DeviceHandle(path, direct=direct != "off")
        _check_direct(dev, direct)
        return _locked(Attached(dev, "device", False, dev.direct))
    if not fs.exists(path):
        if size is None:
            raise BadOption(
                f"blockdev image {path} does not exist; pass size=... (e.g. size=64MiB) to "
                "create it"
            )
        parent = posixpath.dirname(path) or "."
        if not fs.is_dir(parent):
            raise BadOption(f"blockdev image {path}: directory {parent} does not exist")
        # Created under a temporary name and renamed once formatted (``commit``): a crash
        # leaves no image, or a complete one, never a half-formatted one (BDEV-11).
        tmp = path + ".tmp"

        def commit() -> None:
            fs.rename(tmp, path)
            fs.fsync_dir(parent)  # the image's entry survives a crash (CRASH-4, CRASH-5)

        def discard() -> None:  # a failed open leaves nothing behind (BDEV-23)
            with contextlib.suppress(OSError):
                fs.unlink(tmp)

        # locked before it is truncated: another process creating it at the same moment keeps
        # its file (this one gets Locked); any other failure removes what this one created
        h = fs.open(tmp, create=True)
        try:
            h.lock()
        except Locked:
            h.close()
            raise
        except BaseException:
            h.close()
            discard()
            raise
        try:
            h.truncate(0)  # a leftover of an interrupted creation
            h.truncate(size)
        except BaseException:
            h.close()
            discard()
            raise
        return Attached(h, "image", True, False, commit, discard)
    if fs.is_dir(path):
        raise BadOption(f"blockdev path {path} is a directory, not an image or device")
    if direct == "on" and isinstance(fs, OsFS):
        dev = DeviceHandle(path, direct=True)
        _check_direct(dev, direct)
        return _locked(Attached(dev, "image", False, dev.direct))
    return _locked(Attached(fs.open(path, create=False), "image", False, False))


def attach_read_only(fs: FS, path: str) -> Attached:
    """Open the ring's device or image to read it only (BDEV-28): no lock, nothing created;
    a missing image is ``io_error`` (ENOENT), a directory ``BadOption``."""
    if is_block_device(fs, path):
        dev = DeviceHandle(path, direct=False, read_only=True)
        return Attached(dev, "device", False, False)
    if not fs.exists(path):
        err = StorageError(f"no ring image or device at {path}: it does not exist (readonly=true)")
        err.errno = errno.ENOENT
        raise err
    if fs.is_dir(path):
        raise BadOption(f"blockdev path {path} is a directory, not an image or device")
    return Attached(fs.open_read(path), "image", False, False)


def _check_direct(dev: DeviceHandle, direct: str) -> None:
    """``direct=on`` means O_DIRECT or an error; ``auto`` falls back to buffered I/O."""
    if direct == "on" and not dev.direct:
        dev.close()
        raise BadOption(
            f"option direct=on: {dev.path} cannot be opened with O_DIRECT here (the file system "
            "or kernel refuses it); use direct=auto or direct=off"
        )


def _locked(a: Attached) -> Attached:
    try:
        a.handle.lock()
    except BaseException:
        a.handle.close()
        raise
    return a
