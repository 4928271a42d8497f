"""Writing ``.tidelog-sync``, tidelog's evidence of what a slot made durable (spec/FORWARD.md
SF-17; read by ``recovery.read_sync``).

Two copies of the sync record alternate: each write goes into the copy that does not hold the
newest valid record and is fdatasynced before the next write, so a power loss tears at most the
copy being written and the other still proves the previous sync point. A record is written only
after the sync that made its claim true (the caller's duty). The watermark check sits in a block
of its own and, like the watermark, is never synced.
"""

from __future__ import annotations

import os

from tidelog.fsio import FS, Handle

from .format import (
    SYNC_COPY_OFFSETS,
    WMCHECK_OFFSET,
    SyncRecord,
    encode_sync_record,
    encode_watermark_check,
)
from .recovery import SYNC_FILE, SyncState

__all__ = ["SyncFile"]


class SyncFile:
    """The slot's ``.tidelog-sync``; every method may raise ``OSError`` (the slot types it)."""

    def __init__(self, fs: FS, slot_dir: str, state: SyncState) -> None:
        self.fs = fs
        self.dir = slot_dir
        self.path = os.path.join(slot_dir, SYNC_FILE)
        self._copies = list(state.copies)
        self._nonzero = list(state.nonzero)
        self._exists = state.exists
        self._handle: Handle | None = None

    @property
    def newest(self) -> SyncRecord | None:
        valid = [c for c in self._copies if c is not None]
        return max(valid, key=lambda c: c.counter) if valid else None

    def flagged(self) -> bool:
        """Whether either copy carries the ``append`` flag (a claim of some append session)."""
        return any(c is not None and c.append for c in self._copies)

    def _open(self) -> Handle:
        if self._handle is None:
            self._handle = self.fs.open(self.path)
            if not self._exists:
                self.fs.fsync_dir(self.dir)  # the claims must outlive a crash to be of use
                self._exists = True
        return self._handle

    def write(self, rec: SyncRecord) -> None:
        """Write ``rec`` (its counter is replaced) into the right copy and fdatasync it."""
        newest = self.newest
        if newest is None:
            # Neither copy is valid: overwrite the one a torn first write left non-zero, so at
            # most one copy is ever non-zero and invalid (two would read as damage, SF-18).
            target = 1 if self._nonzero[1] and not self._nonzero[0] else 0
        else:
            target = 1 - self._copies.index(newest)
        rec = rec._replace(counter=(newest.counter + 1) if newest is not None else 1)
        h = self._open()
        h.pwrite(encode_sync_record(rec), SYNC_COPY_OFFSETS[target])
        h.fdatasync()
        self._copies[target] = rec
        self._nonzero[target] = True

    def write_unflagged(self, rec: SyncRecord) -> None:
        """Write ``rec`` without the append flag, into both copies if needed, so that no copy
        claims an append session any more (SF-17: a claim never outlives its session)."""
        self.write(rec._replace(append=False))
        if self.flagged():
            self.write(rec._replace(append=False))

    def write_check(self, fsn: int) -> None:
        """The watermark check (never synced, like the watermark itself)."""
        self._open().pwrite(encode_watermark_check(fsn), WMCHECK_OFFSET)

    def close(self) -> None:
        if self._handle is not None:
            h, self._handle = self._handle, None
            h.close()
