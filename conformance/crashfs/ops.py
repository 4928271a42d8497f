"""The micro-ops a ``RecordingFS`` records, in program order (spec/CRASH.md CRASH-1..CRASH-5).

Every mutation becomes one or more of these: ``Data`` within one sector (CRASH-1), ``Size``
(CRASH-3), the directory-entry ops ``Link``, ``Unlink``, ``Rename`` (CRASH-4, CRASH-5), and the
barriers ``Sync`` and ``SyncDir`` (CRASH-2, CRASH-4); ``Drop`` is a failed sync's lost writes.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TypeAlias

SECTOR = 512  # CRASH-1: the unit a device writes atomically-or-torn


# ----------------------------------------------------------------------------------- micro-ops
# ``path`` fields are for people reading a failure; the semantics use inode numbers only.
@dataclass(frozen=True, slots=True)
class Data:
    """Bytes written inside one sector: ``offset // SECTOR`` is the same for every byte."""

    ino: int
    offset: int
    data: bytes
    path: str = field(default="", compare=False)

    def __str__(self) -> str:
        return f"write {self.path}[{self.offset}:{self.offset + len(self.data)}]"


@dataclass(frozen=True, slots=True)
class Size:
    ino: int
    size: int
    path: str = field(default="", compare=False)

    def __str__(self) -> str:
        return f"size {self.path}={self.size}"


@dataclass(frozen=True, slots=True)
class Link:
    dir: int
    name: str
    ino: int
    is_dir: bool
    path: str = field(default="", compare=False)

    def __str__(self) -> str:
        return f"{'mkdir' if self.is_dir else 'create'} {self.path}"


@dataclass(frozen=True, slots=True)
class Unlink:
    dir: int
    name: str
    path: str = field(default="", compare=False)

    def __str__(self) -> str:
        return f"unlink {self.path}"


@dataclass(frozen=True, slots=True)
class Rename:
    src_dir: int
    src_name: str
    dst_dir: int
    dst_name: str
    ino: int
    path: str = field(default="", compare=False)

    def __str__(self) -> str:
        return f"rename {self.path}"


@dataclass(frozen=True, slots=True)
class Sync:
    """fdatasync or fsync of a file (the same barrier here: CRASH-2)."""

    ino: int
    kind: str
    path: str = field(default="", compare=False)

    def __str__(self) -> str:
        return f"{self.kind} {self.path}"


@dataclass(frozen=True, slots=True)
class SyncDir:
    dir: int
    path: str = field(default="", compare=False)

    def __str__(self) -> str:
        return f"fsync_dir {self.path}"


@dataclass(frozen=True, slots=True)
class Drop:
    """A failed sync after which the kernel dropped the file's unsynced pages (Linux marks them
    clean after a writeback error): its pending writes never reach the disk, and reads see its
    durable bytes again (``RecordingHandle.drop_unsynced``; the fault-injecting FS uses it)."""

    ino: int
    path: str = field(default="", compare=False)

    def __str__(self) -> str:
        return f"drop unsynced {self.path}"


FileOp: TypeAlias = Data | Size
EntryOp: TypeAlias = Link | Unlink | Rename
Op: TypeAlias = Data | Size | Link | Unlink | Rename | Sync | SyncDir | Drop
