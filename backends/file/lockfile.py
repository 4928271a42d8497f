"""The store lock (LOCK-1, seed 003 §5.1): an exclusive advisory lock on ``.lock`` held for the
store's lifetime, and the holder's PID in ``.lock.pid`` so a second opener can name it. Neither
file is removed on close; the kernel drops the lock when the holder exits, even on SIGKILL."""

from __future__ import annotations

import os

from tidelog.errors import Locked
from tidelog.fsio import FS, Handle

__all__ = ["acquire"]


def acquire(fs: FS, root: str) -> Handle:
    handle = fs.open(os.path.join(root, ".lock"))
    try:
        handle.lock()
    except Locked:
        handle.close()
        raise Locked(f"store {root} is locked by {_holder(fs, root)}") from None
    try:  # a failure here must not leave the lock held (FLT-7)
        pid = fs.open(os.path.join(root, ".lock.pid"))
        try:
            pid.truncate(0)
            pid.pwrite(f"{os.getpid()}\n".encode(), 0)
        finally:
            pid.close()
    except BaseException:
        handle.close()
        raise
    return handle


def _holder(fs: FS, root: str) -> str:
    try:
        h = fs.open_read(os.path.join(root, ".lock.pid"))
        try:
            text = h.pread(64, 0).decode("utf-8", "replace").strip()
        finally:
            h.close()
    except OSError:
        text = ""
    return f"pid {text}" if text.isdigit() else "another process (pid unknown)"
