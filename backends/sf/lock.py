"""The slot lock (spec/FORWARD.md SF-2; links refused as spec/FORMATS.md LOCK-4).

An exclusive advisory ``flock`` on ``<slot>/.lock`` held for the slot's whole lifetime, and the
holder's PID plus a newline in ``.lock.pid`` (a separate file because Windows' mandatory locks
would stop a second process reading the lock file itself): ``tidelog.dirlock``. A failed acquire
names the holder. Neither file is removed on close: stale ones are harmless and the kernel
releases the lock when the holder exits, even on SIGKILL.
"""

from __future__ import annotations

from tidelog import dirlock
from tidelog.fsio import FS, Handle

__all__ = ["LOCK_FILE", "PID_FILE", "acquire", "holder"]

LOCK_FILE = dirlock.LOCK_FILE
PID_FILE = dirlock.PID_FILE


def acquire(fs: FS, slot_dir: str) -> Handle:
    """Lock the slot or raise ``Locked`` naming the holder PID (or ``holder=unknown``)."""

    def busy(pid: str | None) -> str:
        return (
            f"SF slot {slot_dir} is in use by another sender (holder={pid or 'unknown'}); "
            "two senders must not share a sender_id"
        )

    return dirlock.acquire(fs, slot_dir, busy)


def holder(fs: FS, slot_dir: str) -> str:
    """The PID in ``.lock.pid``, or ``unknown`` when it is absent, empty or not a number."""
    return dirlock.holder(fs, slot_dir) or "unknown"
