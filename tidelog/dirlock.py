"""The directory lock of a ``file://`` store (spec/FORMATS.md LOCK-1..LOCK-4) and of an SF slot
(spec/FORWARD.md SF-2): an exclusive advisory lock on ``<dir>/.lock`` held for the directory's
whole lifetime, and the holder's PID in ``<dir>/.lock.pid`` so a second opener can name it.

Neither file is ever written through a symbolic link (LOCK-4: ``OsFS.open`` does not follow one
at the last component), and an acquire that fails after taking the lock releases it.
"""

from __future__ import annotations

import errno
import os
from collections.abc import Callable

from .errors import Locked, StorageError
from .fsio import FS, Handle, OsFS

__all__ = ["LOCK_FILE", "PID_FILE", "acquire", "exclude_writers", "holder"]

LOCK_FILE = ".lock"
PID_FILE = ".lock.pid"


def acquire(fs: FS, directory: str, busy: Callable[[str | None], str]) -> Handle:
    """Lock ``directory`` and write our PID, or raise ``Locked(busy(holder_pid))`` (the PID as
    text, or None when unknown). A symbolic link in place of either file is ``io_error``
    (ELOOP), refused before either file is created (LOCK-4); any other failure is the
    ``OSError`` itself, for the caller to type with its own context (FLT-3, SF-19)."""
    for name in (LOCK_FILE, PID_FILE):
        # only a real file system has links; O_NOFOLLOW (OsFS.open) still guards the race
        path = os.path.join(directory, name)
        if isinstance(fs, OsFS) and os.path.islink(path):
            raise _link_error(path)
    handle = _locked(fs, _open(fs, os.path.join(directory, LOCK_FILE)), directory, busy)
    try:
        pid = _open(fs, os.path.join(directory, PID_FILE))
        try:
            pid.truncate(0)
            pid.pwrite(f"{os.getpid()}\n".encode(), 0)
        finally:
            pid.close()
    except BaseException:
        handle.close()  # LOCK-4, FLT-7, SF-19: an open that failed never keeps the lock
        raise
    return handle


def exclude_writers(fs: FS, directory: str, busy: Callable[[str | None], str]) -> Handle | None:
    """Hold the lock of ``directory`` without writing a byte (spec/CLI.md CLI-10): when
    ``.lock`` exists it is opened for reading and locked (``Locked(busy(holder_pid))`` if a
    writer holds it), else nothing is created and None is returned (no writer can be
    running: every writer creates the file before it writes). ``.lock.pid`` is left as it is."""
    path = os.path.join(directory, LOCK_FILE)
    try:
        handle = fs.open_read(path)
    except FileNotFoundError:
        return None
    return _locked(fs, handle, directory, busy)


def _locked(fs: FS, handle: Handle, directory: str, busy: Callable[[str | None], str]) -> Handle:
    """``handle`` locked, or closed and ``Locked(busy(holder_pid))`` raised."""
    try:
        handle.lock()
    except Locked:
        handle.close()
        raise Locked(busy(holder(fs, directory))) from None
    except BaseException:
        handle.close()
        raise
    return handle


def _link_error(path: str) -> StorageError:
    err = StorageError(f"{path} is a symbolic link; tidelog never writes through one (LOCK-4)")
    err.errno = errno.ELOOP
    return err


def _open(fs: FS, path: str) -> Handle:
    try:
        return fs.open(path)
    except OSError as exc:
        if exc.errno == errno.ELOOP:  # a link planted after the check above
            raise _link_error(path) from None
        raise


def holder(fs: FS, directory: str) -> str | None:
    """The PID in ``.lock.pid``, or None when it is absent, empty or not a number."""
    try:
        h = fs.open_read(os.path.join(directory, PID_FILE))
        try:
            text = h.pread(64, 0).decode("utf-8", "replace").strip()
        finally:
            h.close()
    except OSError:
        return None
    return text if text.isdigit() and text.isascii() else None
