"""The store lock (spec/FORMATS.md LOCK-1..LOCK-4): ``tidelog.dirlock`` on the store root, with
the holder's PID named when the store is busy. Neither file is removed on close; the kernel drops
the lock when the holder exits, even on SIGKILL."""

from __future__ import annotations

from tidelog import dirlock
from tidelog.fsio import FS, Handle

__all__ = ["acquire"]


def acquire(fs: FS, root: str) -> Handle:
    def busy(pid: str | None) -> str:
        who = f"pid {pid}" if pid else "another process (pid unknown)"
        return f"store {root} is locked by {who}"

    return dirlock.acquire(fs, root, busy)
