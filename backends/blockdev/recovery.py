"""Opening a ring: head detection, then the engine rebuilt from the retained records (BDEV-17).

Records are replayed oldest first through the engine's ``apply_*`` methods with the journal off
(like the file backend's WAL replay); then the facts the device holds are applied, in an order
that gives subscribers a gap for anything they may have missed (SUB-7):

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
head: ``recover`` then returns True and the store writes the slot with the recovered state before
serving any op, since the lost seqs are assigned again to new records that progress must not
cover (BDEV-17, SUB-7).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from tidelog.config import TopicConfig
from tidelog.fsio import storage_error

from .damage import corrupt_from, examine
from .format import RecordOut, Slot
from .ring import Assembled, page_reader

if TYPE_CHECKING:
    from .store import BlockdevBackend

__all__ = ["recover", "read_pages"]


def read_pages(b: BlockdevBackend) -> Callable[[int], bytes]:
    handle = b.dev.handle

    def pread(size: int, offset: int) -> bytes:
        try:
            return handle.pread(size, offset)
        except OSError as exc:
            raise storage_error(exc, f"reading {b.path} at offset {offset}") from None

    return page_reader(pread, b.ring.geometry)


def recover(b: BlockdevBackend, slot: Slot) -> bool:
    """Rebuild the engine from the device; True when the slot's progress went past the
    recovered head and must be rewritten before new seqs are assigned (BDEV-17)."""
    ex = examine(b.path, b.ring.geometry, slot, read_pages(b))
    if ex.errors:
        raise corrupt_from(ex.errors[0])
    b.warnings += [str(p) for p in ex.problems]
    scan, asm = ex.scan, ex.asm
    assert scan is not None and asm is not None
    ring = b.ring
    body = slot.body
    if scan.head is not None:
        h = scan.head
        lap = asm.newest.lap if asm.newest is not None else h.parity
        if lap % 2 != h.parity:  # the lap is informational; the page numbers decide (RING-1)
            lap += 1
        ring.next_index = (h.index + 1) % ring.geometry.page_count
        ring.lap = lap + (1 if ring.next_index == 0 else 0)
    else:
        ring.next_index, ring.lap = 0, 0
    for i, rng in asm.ranges.items():
        ring.slots[i] = rng
    ring.marks = dict(asm.marks)
    b.incarnations = int(body.get("incarnations", 0))
    config = body.get("config")
    if config is None:  # records with no topic are refused by examine (BDEV-4)
        return False
    t = b.apply_create(b.bound, TopicConfig(**config), int(body["tid"]))
    _replay(b, t, asm)
    for pid, (n, _) in sorted(asm.marks.items()):
        b.apply_produced(t, pid, n)
    return _apply_facts(b, t, slot, asm)


def _replay(b: BlockdevBackend, t: Any, asm: Assembled) -> None:
    """Records oldest first; the seqs of LOSS pages (BDEV-25) are skipped over and become loss
    ranges (TMB-2): readers get a tombstone, and no seq is assigned again."""
    log = t.log
    run: list[RecordOut] = []
    for r in asm.records:
        if run and (
            (r.ts, r.tag, r.node) != (run[0].ts, run[0].tag, run[0].node)
            or r.seq != run[-1].seq + 1
        ):
            _append(b, t, run)
            run = []
        if not run and r.seq > log.head + 1:
            log.skip_to(r.seq - 1)  # below the first record, or a LOSS page's seqs
        run.append(r)
    if run:
        _append(b, t, run)
    log.skip_to(asm.head_seq)  # a LOSS page, or records of an abandoned op, after the last
    for lo, hi in asm.losses:
        log.add_loss(lo, hi)


def _append(b: BlockdevBackend, t: Any, run: list[RecordOut]) -> None:
    r0 = run[0]
    b.apply_append(t, [r.payload for r in run], r0.tag, r0.node, r0.ts)


def _clip(lo: int, hi: int, head: int) -> tuple[int, int] | None:
    hi = min(hi, head)
    return (lo, hi) if lo <= hi else None


def _apply_facts(b: BlockdevBackend, t: Any, slot: Slot, asm: Assembled) -> bool:
    log = t.log
    head = log.head
    facts = slot.body.get("state") or {}
    log.last_ts = log.last_ts if log.last_ts is not None else facts.get("last_ts")
    newest = asm.newest
    same_gen = newest is not None and newest.meta_gen == slot.generation
    past = int(facts.get("floor", 1)) > head + 1  # progress past the head (BDEV-17)
    # 1. subscribers
    for name, sub in sorted((slot.body.get("subs") or {}).items()):
        base = min(int(sub["base"]), head)
        hwm = int(sub["hwm"])
        if same_gen and newest is not None:
            hwm = max(hwm, newest.min_hwm)
        gap = sub.get("gap")
        outcomes = [*sub.get("acked", []), *sub.get("rejected", [])]
        past = past or max(int(sub["base"]), hwm, int(gap[1]) if gap else 0, *outcomes) > head
        hwm = max(base, min(hwm, head))
        s = t.progress.add(name, base)
        s.hwm = hwm
        s.outcomes = {q: "acked" for q in sub.get("acked", []) if hwm < q <= head}
        s.outcomes.update({q: "rejected" for q in sub.get("rejected", []) if hwm < q <= head})
        s.gap = _clip(int(gap[0]), int(gap[1]), head) if gap else None
    # 2. trimmed ranges (voluntary, silent)
    trimmed = [r for lo, hi in facts.get("trimmed", []) if (r := _clip(int(lo), int(hi), head))]
    dead = [q for lo, hi in trimmed for q in log.live_between(lo, hi)]
    if dead:
        b.apply_remove(t, dead, "trimmed")
    # 3. the floor
    floor = max(int(facts.get("floor", 1)), newest.floor if newest is not None else 1)
    floor = min(floor, head + 1)
    first = asm.records[0].seq if asm.records else head + 1
    if first > floor and not _covered(floor, first - 1, trimmed):
        floor = first  # fates below the ring unknown: tombstone them rather than hide them
    if floor > 1:
        for s in t.progress.subs.values():
            if s.hwm < floor - 1:
                lo, hi = s.hwm + 1, floor - 1
                s.gap = (lo, hi) if s.gap is None else (min(s.gap[0], lo), max(s.gap[1], hi))
        b.apply_evict(t, floor - 1, "recovery")
        log.evict_floor = max(log.evict_floor, floor)
    # 4. settle, caps, restart rules (SUB-9)
    b._settle(t)
    plan = log.eviction_plan(0, 0)
    if plan:
        b.apply_evict(t, plan[-1], "cap")
    for s in t.progress.subs.values():
        s.cursor = s.flushed_hwm = s.hwm
    log.visible = log.head
    return past


def _covered(lo: int, hi: int, ranges: list[tuple[int, int]]) -> bool:
    q = lo
    for a, z in sorted(ranges):
        if a > q:
            break
        q = max(q, z + 1)
        if q > hi:
            return True
    return q > hi
