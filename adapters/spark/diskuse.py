"""What a store directory holds on disk, by kind, and what a trim freed: the demo's report.

A trim frees disk space only when a whole file goes (spec/FORMATS.md LAY): a sealed segment the
next checkpoint drops, or a WAL file retired once it is full and checkpointed. A retired WAL file
is not always deleted either: up to ``wal_recycle`` of them per shard stay as ``spare-*.log`` for
the next files to reuse (WAL-15), so they still occupy their bytes. The report says which.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass

__all__ = ["Footprint", "footprint", "human", "trim_report"]


@dataclass(frozen=True)
class Footprint:
    """Bytes allocated on disk (what ``du`` counts) under a store directory, by kind."""

    wal: int = 0  # wal-*.log: the active WAL file(s) and retired ones not yet recycled
    wal_files: int = 0
    spare: int = 0  # spare-*.log: retired WAL files kept for reuse (WAL-15)
    spare_files: int = 0
    segments: int = 0  # sealed segment files under topics/
    segment_files: int = 0
    other: int = 0  # meta/, progress files, locks, ...

    @property
    def total(self) -> int:
        return self.wal + self.spare + self.segments + self.other


def footprint(root: str) -> Footprint:
    sizes = {"wal": 0, "spare": 0, "segments": 0, "other": 0}
    files = {"wal": 0, "spare": 0, "segments": 0}
    for base, _, names in os.walk(root):
        top = os.path.relpath(base, root).split(os.sep)[0]
        for name in names:
            with contextlib.suppress(FileNotFoundError):
                size = os.stat(os.path.join(base, name)).st_blocks * 512
                if top == "wal" and name.startswith("spare-"):
                    kind = "spare"
                elif top == "wal" and name.startswith("wal-"):
                    kind = "wal"
                elif top == "topics" and name.startswith("seg-"):
                    kind = "segments"
                else:
                    kind = "other"
                sizes[kind] += size
                if kind in files:
                    files[kind] += 1
    return Footprint(
        sizes["wal"],
        files["wal"],
        sizes["spare"],
        files["spare"],
        sizes["segments"],
        files["segments"],
        sizes["other"],
    )


def human(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:,.1f} {unit}" if unit != "B" else f"{int(n)} B"
        n /= 1024
    return f"{n} B"  # pragma: no cover


def _plural(n: int, what: str) -> str:
    return f"{n} {what}{'' if n == 1 else 's'}"


def trim_report(
    before: Footprint, after: Footprint, trimmed: int, wal_file_bytes: int
) -> list[tuple[str, str]]:
    """The demo's "bytes on disk" and "trim freed" rows: ``before``/``after`` the final
    acknowledgement and the close-time checkpoint, which trimmed ``trimmed`` records."""
    f = after
    disk = (
        f"{human(before.total)} before the final ack -> {human(f.total)} after: "
        f"{human(f.wal)} in {_plural(f.wal_files, 'WAL file')}, "
        f"{human(f.spare)} in {_plural(f.spare_files, 'spare WAL file')} (retired, kept for "
        f"reuse), {human(f.segments)} in {_plural(f.segment_files, 'segment')}, "
        f"{human(f.other)} other"
    )
    freed = before.total - after.total
    dropped = before.segment_files - after.segment_files
    if freed > 0:
        how = []
        if dropped > 0:
            how.append(f"{_plural(dropped, 'sealed segment')} dropped")
        if after.wal < before.wal:
            how.append(f"{human(before.wal - after.wal)} of WAL files deleted")
        text = f"{human(freed)} on disk ({', '.join(how) or 'files removed'})"
    else:
        text = (
            f"nothing on disk: the {trimmed:,} records the final ack trimmed are in WAL files, "
            f"whose space returns only when a file (wal_file_bytes {human(wal_file_bytes)}) is "
            "full, checkpointed and retired"
        )
        if f.spare_files:
            text += (
                f"; {_plural(f.spare_files, 'full WAL file')} retired during the run stay as "
                f"spares ({human(f.spare)}) that the next WAL files reuse instead of growing "
                "the disk (option wal_recycle=0 deletes them)"
            )
    return [("bytes on disk", disk), ("trim freed", text)]
