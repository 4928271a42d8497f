"""The slot lock (seed 003 §5.1, spec/FORWARD.md SF-2).

An exclusive advisory ``flock`` on ``<slot>/.lock`` held for the slot's whole lifetime, and the
holder's PID plus a newline in ``.lock.pid`` (a separate file because Windows' mandatory locks
would stop a second process reading the lock file itself). A failed acquire names the holder.
Neither file is removed on close: stale ones are harmless and the kernel releases the lock when
the holder exits, even on SIGKILL.
"""

from __future__ import annotations

import os

from tidelog.errors import Locked
from tidelog.fsio import FS, Handle

__all__ = ["LOCK_FILE", "PID_FILE", "acquire", "holder"]

LOCK_FILE = ".lock"
PID_FILE = ".lock.pid"


def acquire(fs: FS, slot_dir: str) -> Handle:
    """Lock the slot or raise ``Locked`` naming the holder PID (or ``holder=unknown``)."""
    handle = fs.open(os.path.join(slot_dir, LOCK_FILE))
    try:
        handle.lock()
    except Locked:
        handle.close()
        raise Locked(
            f"SF slot {slot_dir} is in use by another sender (holder={holder(fs, slot_dir)}); "
            "two senders must not share a sender_id"
        ) from None
    except BaseException:
        handle.close()
        raise
    try:
        pid = fs.open(os.path.join(slot_dir, PID_FILE))
        try:
            pid.truncate(0)
            pid.pwrite(f"{os.getpid()}\n".encode(), 0)
        finally:
            pid.close()
    except BaseException:
        handle.close()  # SF-19: a failed .lock.pid write must not leave the slot locked
        raise
    return handle


def holder(fs: FS, slot_dir: str) -> str:
    """The PID in ``.lock.pid``, or ``unknown`` when it is absent, empty or not a number."""
    try:
        h = fs.open_read(os.path.join(slot_dir, PID_FILE))
        try:
            text = h.pread(32, 0).decode("utf-8", "replace").strip()
        finally:
            h.close()
    except OSError:
        return "unknown"
    return text if text.isdigit() else "unknown"
