"""Crash simulation for the ``FS`` seam (spec/CRASH.md, rules CRASH-1..CRASH-7).

``RecordingFS`` is an in-memory ``tidelog.fsio.FS``. Reads see the *volatile* image; every
mutation is also recorded, in program order, as a micro-op in ``history`` and, until a barrier
covers it, in a pending list next to the *durable* image. ``crash_states()`` enumerates the
disk images a power loss may leave at the current instant (or right after any earlier op ``at``),
each as a fresh ``RecordingFS`` whose volatile and durable images are that disk state, ready for
a backend's recovery to open.

What a crash may do (the persistence model) is normative in spec/CRASH.md; the modules cite its
rules. Single process only: handles of a crashed-from file system are not carried over.

The package, by concern:

* ``ops``: the micro-ops recorded in ``history`` (``Data`` per sector, ``Size``, entry ops,
  barriers).
* ``image``: disk images (file contents as shared immutable chunks, directories by inode).
* ``persist``: the persistence model: the durable image plus pending ops, barriers folding
  them in, torn sector versions (CRASH-1..CRASH-5).
* ``states``: the choice space of one crash point, counted, sampled and built (CRASH-6).
* ``fs``: ``RecordingFS`` and ``RecordingHandle``, the ``FS`` seam over all of it.
"""

from __future__ import annotations

from .fs import FSStats, RecordingFS, RecordingHandle
from .ops import SECTOR, Data, Drop, Link, Op, Rename, Size, Sync, SyncDir, Unlink
from .states import DEFAULT_LIMIT, DirOps, Mode, StateSpaceTooLarge, Torn

__all__ = [
    "RecordingFS", "RecordingHandle", "FSStats", "StateSpaceTooLarge", "SECTOR", "DEFAULT_LIMIT",
    "Data", "Size", "Link", "Unlink", "Rename", "Sync", "SyncDir", "Drop", "Op", "Torn", "DirOps",
    "Mode",
]  # fmt: skip
