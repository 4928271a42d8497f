"""Opening a ring: head detection, then the engine rebuilt from the retained records (BDEV-17).

``plan_recovery`` reads and checks the ring and returns a ``RingPlan``, an immutable value: where
the ring resumes, the retained records, the producer marks and the slot's facts. It writes
nothing and changes nothing: damage is refused while the plan is made (FLT-2, BDEV-22).

The store applies the plan (``BlockdevBackend._apply_plan``): records are replayed oldest first
through the engine's ``apply_*`` methods with the journal off (like the file backend's WAL
replay); then the facts the device holds are applied, in an order that gives subscribers a gap
for anything they may have missed (SUB-7):

1. subscribers from the slot; a hwm is raised to the head page's ``min_hwm`` when that page was
   written under the same slot generation (same subscriber set), never above the head (DUR-9);
2. trimmed ranges from the slot's durable facts (voluntary: silent);
3. the floor: the highest of the slot's floor and the head page's floor; seqs below the first
   retained record whose fate the device does not record are put below the floor too (a
   tombstone, never a silent hole), and subscribers get a gap for everything below the floor
   above their hwm (at-least-once: such a gap may repeat one they were already given);
4. settle (hwm advance, ack-trim), then cap retention (RET-1): a crash can bring back records
   whose trim was not yet on the device; the cap then evicts the oldest, visibly.

Before any of it, ``damage.examine`` tells torn from damaged (BDEV-22): damage is ``Corrupt``
naming the device and byte offset, raised before anything is written.

After a clean close the slot holds the exact state, so all of this reproduces it (DUR-1).
After a crash the slot (or the head page's ``min_hwm``) may record progress past the recovered
head: applying the plan then returns True and the store writes the slot with the recovered state
before serving any op, since the lost seqs are assigned again to new records that progress must
not cover (BDEV-17, SUB-7).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from tidelog.fsio import Handle, storage_error

from .damage import corrupt_from, examine
from .device import Geometry
from .format import PageHeader, RecordOut, Slot
from .ring import page_reader

__all__ = ["RingPlan", "plan_recovery", "read_pages"]


@dataclass(frozen=True)
class RingPlan:
    """What a ring holds, read and checked before anything is applied or written."""

    slot: Slot  # the newest valid slot: subscribers and durable facts
    warnings: tuple[str, ...]
    next_index: int  # the page written next
    lap: int
    ranges: Mapping[int, tuple[int, int]]  # page -> (first, last) seq it still holds
    marks: Mapping[str, tuple[int, int]]  # producer -> (sequence, page of its newest copy)
    records: Sequence[RecordOut]  # the retained records, oldest first
    head_seq: int  # last seq of the retained run (0: nothing was ever kept)
    losses: Sequence[tuple[int, int]]  # LOSS pages' seqs (BDEV-25)
    newest: PageHeader | None  # trailer of the head page: the freshest facts (BDEV-7)


def read_pages(handle: Handle, path: str, geometry: Geometry) -> Callable[[int], bytes]:
    def pread(size: int, offset: int) -> bytes:
        try:
            return handle.pread(size, offset)
        except OSError as exc:
            raise storage_error(exc, f"reading {path} at offset {offset}") from None

    return page_reader(pread, geometry)


def plan_recovery(
    path: str, geometry: Geometry, slot: Slot, read_page: Callable[[int], bytes]
) -> RingPlan:
    """Read the ring ``slot`` describes; ``Corrupt`` for damage (BDEV-22), nothing written."""
    ex = examine(path, geometry, slot, read_page)
    if ex.errors:
        raise corrupt_from(ex.errors[0])
    scan, asm = ex.scan, ex.asm
    assert scan is not None and asm is not None
    if scan.head is not None:
        h = scan.head
        lap = asm.newest.lap if asm.newest is not None else h.parity
        if lap % 2 != h.parity:  # the lap is informational; the page numbers decide (RING-1)
            lap += 1
        next_index = (h.index + 1) % geometry.page_count
        lap = lap + (1 if next_index == 0 else 0)
    else:
        next_index, lap = 0, 0
    return RingPlan(
        slot,
        tuple(str(p) for p in ex.problems),
        next_index,
        lap,
        dict(asm.ranges),
        dict(asm.marks),
        tuple(asm.records),
        asm.head_seq,
        tuple(asm.losses),
        asm.newest,
    )
