"""Device writes: an ordered queue of whole pages and metadata slots, drained by group commit.

Ops place items under the engine lock (cheap, no I/O); whoever needs them on the device drains
the queue outside the engine lock. The drain holds ``io_lock``: one leader writes every queued
item, each followed by ``fdatasync``, while other threads keep appending; a thread that arrives
while a leader is busy finds its items written when it gets the lock, or leads the next round
with everything queued meanwhile (BDEV-15, the blockdev form of the file backend's WAL-11).

One sync per item keeps the device in a state a crash can only tear at one place: the item being
written. Pages therefore reach the device in ring order, each durable before the next starts,
which is exactly what head detection assumes (RING-4: only the last page written can be torn).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass

from tidelog.errors import StorageError
from tidelog.fsio import Handle, storage_error

__all__ = ["Item", "IoQueue", "IoStats"]


@dataclass(frozen=True)
class Item:
    kind: str  # "page" | "meta" | "zero"
    offset: int
    data: bytes
    records_upto: int = 0  # pages: records sealed up to and including this one
    records: int = 0
    payload: int = 0  # pages: payload bytes of its records


@dataclass
class IoStats:
    """What this store wrote to the device since it was opened (write amplification)."""

    page_writes: int = 0
    meta_writes: int = 0
    zero_writes: int = 0
    device_bytes: int = 0
    records: int = 0
    payload_bytes: int = 0
    syncs: int = 0

    @property
    def write_amplification(self) -> float | None:
        """Device bytes written per payload byte written (None before any payload)."""
        return self.device_bytes / self.payload_bytes if self.payload_bytes else None

    def count(self, item: Item) -> None:
        """Add one written item."""
        self.device_bytes += len(item.data)
        self.syncs += 1
        if item.kind == "page":
            self.page_writes += 1
            self.records += item.records
            self.payload_bytes += item.payload
        elif item.kind == "meta":
            self.meta_writes += 1
        else:
            self.zero_writes += 1

    def plus(self, other: IoStats) -> IoStats:
        return IoStats(*(a + b for a, b in zip(self.compact(), other.compact(), strict=True)))

    def compact(self) -> list[int]:
        """The counters in field order: the metadata slot keeps them as one short list."""
        return [
            self.page_writes,
            self.meta_writes,
            self.zero_writes,
            self.device_bytes,
            self.records,
            self.payload_bytes,
            self.syncs,
        ]

    @classmethod
    def from_compact(cls, raw: object) -> IoStats:
        """Counters stored by ``compact``; anything else (an older body) counts as zeros."""
        if isinstance(raw, list) and len(raw) == 7 and all(isinstance(v, int) for v in raw):
            return cls(*raw)
        return cls()

    def to_dict(self) -> dict[str, object]:
        return {
            "page_writes": self.page_writes,
            "meta_writes": self.meta_writes,
            "zero_writes": self.zero_writes,
            "device_bytes_written": self.device_bytes,
            "records_written": self.records,
            "payload_bytes_written": self.payload_bytes,
            "syncs": self.syncs,
        }


class IoQueue:
    def __init__(self, handle: Handle, path: str) -> None:
        self.handle = handle
        self.path = path  # the device or image (a new image's handle still has its temporary name)
        self.io_lock = threading.Lock()
        self.items: list[Item] = []
        self.enqueued = 0  # items ever queued
        self.done = 0  # items written and synced
        self.records_durable = 0  # records in pages written and synced
        self.failed: StorageError | None = None
        self.stats = IoStats()  # written and synced
        self.queued = IoStats()  # queued, written or not: what a slot queued now may count

    def put(self, item: Item) -> None:
        """Queue an item (caller holds the engine lock, so items keep op order)."""
        self.items.append(item)
        self.enqueued += 1
        self.queued.count(item)

    def drain(
        self,
        engine_lock: AbstractContextManager[object],
        target: int,
        need_records: int,
        prepare: Callable[[], None],
    ) -> None:
        """Return once the first ``target`` items are written and synced and at least
        ``need_records`` records are in pages on the device. ``prepare`` runs under the engine
        lock when records are still missing (it seals the partially filled page)."""
        with self.io_lock:
            while True:
                if self.failed is not None:
                    raise self.failed
                if self.done >= target and self.records_durable >= need_records:
                    return
                with engine_lock:
                    if need_records > self.records_durable:
                        prepare()
                    batch, self.items = self.items, []
                if not batch:
                    return  # what was needed is gone (its topic was dropped meanwhile)
                for item in batch:
                    self._write(item)

    def write_now(self, item: Item) -> None:
        """Write one item synchronously (format and reformat, before any op runs)."""
        with self.io_lock:
            self.enqueued += 1
            self.queued.count(item)
            self._write(item)

    def _write(self, item: Item) -> None:
        """Write and sync one item. A failure poisons the queue (BDEV-23): nothing is written
        after it, since after a failed sync the kernel may have dropped the pages already."""
        what = f"writing {item.kind} at offset {item.offset} of {self.path}"
        try:
            self.handle.pwrite(item.data, item.offset)
            what = f"syncing {item.kind} at offset {item.offset} of {self.path}"
            self.handle.fdatasync()
        except OSError as exc:
            self.failed = storage_error(exc, what)
            raise self.failed from None
        self.stats.count(item)
        if item.kind == "page":
            self.records_durable = max(self.records_durable, item.records_upto)
        self.done += 1
