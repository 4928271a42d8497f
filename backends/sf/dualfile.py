"""Slot format 2's ``.ack-watermark`` and ``sf-manifest.bin`` on disk (spec/FORWARD.md SF-24,
SF-25, SF-29): the next record of a dual-slot file, written where its generation says.

The caller serialises access (the slot's condition variable) and types I/O errors (SF-19).
"""

from __future__ import annotations

import os

from tidelog.fsio import FS, Handle

from . import records as rec

__all__ = ["DualFile"]


class DualFile:
    """An open 8192-byte dual-slot file whose value has generation ``generation`` (0: none)."""

    def __init__(self, fs: FS, path: str, magic: int, generation: int) -> None:
        self.fs, self.path, self.magic = fs, path, magic
        self.generation = generation
        self.value: rec.Record | None = None
        self._h: Handle | None = None

    def open(self) -> None:
        """Open (create) the file, resetting one of another size to 8192 zero bytes."""
        self._handle()

    def _handle(self) -> Handle:
        if self._h is None:
            h = self.fs.open(self.path)
            try:
                if h.size() != rec.DUAL_FILE_SIZE:
                    # Another size is no dual-slot file (SF-24); the client resets it the same.
                    h.truncate(0)
                    h.pwrite(bytes(rec.DUAL_FILE_SIZE), 0)
                    self.generation = 0
            except BaseException:
                h.close()
                raise
            self._h = h
        return self._h

    def create(self, first: int, second: int) -> None:
        """A new file holding generation 1, fsynced with its directory (SF-25, SF-29)."""
        self._handle()
        self.generation = 0
        self.write(first, second, sync=True)
        self.fs.fsync_dir(os.path.dirname(self.path))

    def write(self, first: int, second: int, *, sync: bool) -> None:
        """Write the record of the next generation (the half not holding the value, SF-24)."""
        gen = self.generation + 1
        if self.magic == rec.MANIFEST_MAGIC:
            data = rec.manifest_record(gen, first, second)
        else:
            data = rec.watermark_record(gen, first)
        h = self._handle()
        h.pwrite(data, rec.record_offset(gen))
        self.generation = gen
        self.value = rec.Record(gen, first, second)
        if sync and self.magic == rec.MANIFEST_MAGIC:
            h.fsync()  # the client fsyncs the manifest (SF-29)
        elif sync:
            h.fdatasync()

    def sync(self) -> None:
        if self._h is not None:
            self._h.fdatasync()

    def close(self) -> None:
        h, self._h = self._h, None
        if h is not None:
            h.close()
