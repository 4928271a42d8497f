"""The store lock (spec/FORMATS.md LOCK-1..LOCK-4): ``tidelog.dirlock`` on the store root, with
the holder's PID named when the store is busy. Neither file is removed on close; the kernel drops
the lock when the holder exits, even on SIGKILL."""

from __future__ import annotations

from collections.abc import Callable

from tidelog import dirlock
from tidelog.fsio import FS, Handle

__all__ = ["acquire", "exclude_writers"]


def _busy(root: str) -> Callable[[str | None], str]:
    def busy(pid: str | None) -> str:
        who = f"pid {pid}" if pid else "another process (pid unknown)"
        return f"store {root} is locked by {who}"

    return busy


def acquire(fs: FS, root: str) -> Handle:
    return dirlock.acquire(fs, root, _busy(root))


def exclude_writers(fs: FS, root: str) -> Handle | None:
    """The lock without a byte written, for a dry run (spec/CLI.md CLI-10)."""
    return dirlock.exclude_writers(fs, root, _busy(root))
