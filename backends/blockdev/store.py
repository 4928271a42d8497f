"""The ``blockdev://`` backend: the engine over a flash page ring (FORMATS-blockdev.md, SPEC RING).

Lifecycle: attach the device or image (device.py), load its metadata slot or format it
(BDEV-11..13), find the head and rebuild the engine from the retained pages (recovery.py), then
serve ops through the engine with a ``RingJournal`` turning appends into pages. ``close`` writes
the partially filled page and the metadata slot, so a clean reopen restores everything exactly
(DUR-1). Every I/O failure is an ``io_error``; a failed write or sync poisons the store: every
later op raises it, and ``close`` releases the device before raising it (BDEV-23).

One topic per device (``multi_topic=False``): the ring is bound to one topic name at format time.

``readonly=true`` opens a view (BDEV-28): no lock, the device opened read-only, recovery run in
memory only; ``refresh`` reads the ring again once its metadata block or the page the writer
writes next has changed.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from tidelog import registry
from tidelog.backend import StoreOptions, TopicRef
from tidelog.clock import Clock
from tidelog.config import TopicConfig
from tidelog.errors import (
    BadOption,
    Closed,
    Corrupt,
    NoSuchTopic,
    NotAvailable,
    StorageError,
    TooLarge,
)
from tidelog.fsio import FS, storage_error

from ..common.engine import Engine, EngineTopic
from ..common.progress import SubState, add_gap, live_between
from . import meta as metamod
from .damage import read_slots, slot_warnings
from .device import Attached, DeviceHandle, Geometry, attach, attach_read_only, geometry_for
from .format import (
    META_BYTES,
    SLOT_BYTES,
    FormatCorrupt,
    RecordOut,
    Slot,
    decode_slot,
    encode_slot,
    mark_size,
    max_payload,
    page_capacity,
    record_size,
    slot_index,
)
from .journal import RingJournal
from .options import DEFAULT_PAGE_SIZE, DEFAULT_TOPIC, BlockdevOptions
from .recovery import RingPlan, plan_recovery, read_pages
from .ring import RingState
from .writer import IoQueue, IoStats, Item

__all__ = ["BlockdevBackend", "CAPABILITIES", "RingEviction"]

#: declared once, in the scheme's registry entry (REG-1)
CAPABILITIES = registry.builtin_capabilities("blockdev")


@dataclass(frozen=True)
class RingEviction:
    """One involuntary eviction by ring overwrite (BDEV-16): live seqs <= ``through`` went when
    page ``page`` was reused; ``head`` was the topic's head at that moment."""

    topic: str
    through: int
    head: int
    page: int


_VIEW_TRIES = 5  # reads of a ring a view makes before it believes the ring is damaged


def new_ring_id() -> int:
    return int.from_bytes(os.urandom(8), "little") or 1


class BlockdevBackend(Engine):
    def __init__(
        self, fs: FS, path: str, clock: Clock, options: StoreOptions, bopts: BlockdevOptions
    ) -> None:
        super().__init__(clock, options, CAPABILITIES)
        self.fs = fs
        self.path = path
        self.bopts = bopts
        self.warnings: list[str] = []
        self.ring_evictions: list[RingEviction] = []
        self.meta_gen = 0
        self.bound = bopts.topic or DEFAULT_TOPIC
        self.facts: dict[str, Any] = metamod.empty_facts()
        self._last_meta: tuple[Any, ...] | None = None
        self._slots = [bytes(SLOT_BYTES), bytes(SLOT_BYTES)]
        self.formatted = False
        self.io_base = IoStats()  # device writes from format until this open (from the slot)
        self.readonly = bopts.readonly
        self._seen: tuple[bytes, bytes] | None = None  # a view's last look (BDEV-28)
        self._scanned: dict[int, bytes] = {}  # a view: the pages its last scan read
        try:
            if self.readonly:
                self.dev: Attached = attach_read_only(fs, path)
            else:
                self.dev = attach(fs, path, size=bopts.size, direct=bopts.direct)
        except StorageError:
            raise
        except OSError as exc:
            raise storage_error(exc, f"opening blockdev {path}") from None
        self.io = IoQueue(self.dev.handle, path)
        try:
            with self.lock:
                if self.readonly:
                    self._open_view()
                else:
                    self._open()
        except BaseException as exc:
            with contextlib.suppress(OSError):
                self.dev.handle.close()
            if self.dev.commit is not None and self.dev.discard is not None:
                self.dev.discard()  # the image was being created: leave nothing (BDEV-23)
            if isinstance(exc, OSError) and not isinstance(exc, StorageError):
                raise storage_error(exc, f"opening blockdev {path}") from None
            raise

    # -- opening -----------------------------------------------------------------------------
    def _open(self) -> None:
        h = self.dev.handle
        try:
            device_bytes = h.size()
        except OSError as exc:
            raise storage_error(exc, f"reading the size of {self.path}") from None
        block = self._pread(META_BYTES, 0) if device_bytes >= META_BYTES else b""
        slot = None if self.bopts.format or self.dev.created else self._load_slot(block)
        past = False
        if slot is None:
            self._format(device_bytes, block)
        else:
            self._adopt(slot, device_bytes)
            past = self._apply_plan(self._plan(slot))  # journal off: replay writes nothing
        self.journal = RingJournal(self, self.bopts.meta_every)
        if past:
            # the crash lost records the slot's progress covers; their seqs will be assigned
            # again, so the recovered progress reaches the device first (BDEV-17, SUB-7)
            self.enqueue_meta(write_now=True)

    # -- read-only views (BDEV-28) -------------------------------------------------------------
    def _open_view(self) -> None:
        """Recovery in memory only: no format, no slot write, no journal. A writer may be
        writing while the view reads, so a ring that reads as damaged is read again a few
        times before the ``Corrupt`` stands (real damage does not go away)."""
        for attempt in range(_VIEW_TRIES):
            self.topics, self.by_id, self.incarnations = {}, {}, 0
            self.warnings, self._slots = [], [bytes(SLOT_BYTES), bytes(SLOT_BYTES)]
            try:
                self._view_once()
                return
            except Corrupt:
                if attempt + 1 == _VIEW_TRIES:
                    raise
                time.sleep(0.02 * (attempt + 1))

    def _view_once(self) -> None:
        try:
            device_bytes = self.dev.handle.size()
        except OSError as exc:
            raise storage_error(exc, f"reading the size of {self.path}") from None
        block = self._pread(META_BYTES, 0) if device_bytes >= META_BYTES else b""
        found, _ = read_slots(block.ljust(META_BYTES, b"\0"))
        if not found and (not block or self._all_zero()):
            raise StorageError(
                f"blockdev {self.dev.kind} {self.path} holds no ring yet (never formatted): "
                "nothing to read"
            )
        slot = self._load_slot(block)
        assert slot is not None
        self._adopt(slot, device_bytes)
        self._apply_plan(self._plan(slot))  # progress past the head: clamped in memory only
        # what this scan saw, not what is there now: a page the writer finished after the scan
        # read it torn must differ from it at the next refresh, or the view would stall there
        ring = self.ring
        page = self._scanned.get(ring.next_index)
        if page is None:
            page = self._pread(ring.geometry.page_size, ring.geometry.offset(ring.next_index))
        self._seen = (block, page)

    def _look(self) -> tuple[bytes, bytes]:
        """The metadata block and the page the writer writes next: every write a writer makes
        changes one of them first (BDEV-6, BDEV-14)."""
        ring = self.ring
        page = self._pread(ring.geometry.page_size, ring.geometry.offset(ring.next_index))
        return self._pread(META_BYTES, 0), page

    def refresh(self) -> None:
        """A view catches up with the writer: the ring is read again when it changed."""
        if not self.readonly:
            return
        with self.lock:
            self._check_open()
            if self._look() == self._seen:
                return
            self._open_view()
            for t in self.topics.values():
                self._bump(t)
            self.changed.notify_all()

    def _load_slot(self, block: bytes) -> Slot | None:
        """The newest valid slot (BDEV-4), ``None`` for an empty image that may be formatted, or
        a clear error: never format over something that is not ours without format=true."""
        where = f"blockdev {self.dev.kind} {self.path}"
        if len(block) == 0 and self.dev.kind == "image":
            if self.bopts.size is None:
                raise BadOption(f"{where} is empty; pass size=... to format it")
            return None
        found, bad = read_slots(block)
        errors = [f"slot {i} at byte offset {i * SLOT_BYTES}: {exc.message}" for i, exc in bad]
        if not found and self.dev.kind == "image" and self._all_zero():
            # a new image, or one whose format never reached the disk: nothing to overwrite
            if self.bopts.size is None and len(block) < META_BYTES:
                raise BadOption(f"{where} is too small; pass size=... to format it")
            return None
        if not found:
            raise Corrupt(
                f"{where} is not a tidelog ring ({'; '.join(errors)}); pass format=true to "
                "format it, destroying its contents (BDEV-11)"
            )
        slot = max(found, key=lambda s: s.generation)
        self.warnings += [str(p) for p in slot_warnings(self.path, found, bad)]
        for s in found:
            self._slots[slot_index(s.generation)] = encode_slot(s)
        return slot

    def _all_zero(self) -> bool:
        """Whether every byte of the image is zero (read in 1 MiB steps, stops at the first
        non-zero byte): only then may an image without a valid slot be formatted unasked."""
        try:
            size = self.dev.handle.size()
        except OSError as exc:
            raise storage_error(exc, f"reading the size of {self.path}") from None
        pos, step = 0, 1 << 20
        while pos < size:
            chunk = self._pread(min(step, size - pos), pos)
            if not chunk or chunk.count(0) != len(chunk):
                return not chunk
            pos += len(chunk)
        return True

    def _adopt(self, slot: Slot, device_bytes: int) -> None:
        """Check the stored ring against the options and the device (BDEV-12, BDEV-13)."""
        where = f"blockdev {self.dev.kind} {self.path}"
        o = self.bopts
        if o.page_size is not None and o.page_size != slot.page_size:
            raise BadOption(
                f"{where} is a ring of {slot.page_size}-byte pages; page_size={o.page_size} "
                "given (omit it, or pass format=true to reformat, destroying the ring)"
            )
        geom = Geometry(slot.page_size, slot.page_count)
        if device_bytes < geom.ring_bytes:
            raise Corrupt(
                f"{where} holds {device_bytes} bytes but its ring needs {geom.ring_bytes} "
                "(truncated image or wrong device) (BDEV-12)"
            )
        if o.size is not None and self.dev.kind == "image" and o.size != device_bytes:
            raise BadOption(
                f"{where} is {device_bytes} bytes; size={o.size} given (omit it, or pass "
                "format=true to reformat at the new size, destroying the ring)"
            )
        bound = slot.body.get("topic")
        if not isinstance(bound, str):
            raise FormatCorrupt("BDEV-4", "metadata body has no topic binding")
        if o.topic is not None and o.topic != bound:
            raise BadOption(
                f"{where} is bound to topic {bound!r}; topic={o.topic!r} given (one topic per "
                "device: use another device or partition, or format=true to rebind)"
            )
        self.bound = bound
        self.meta_gen = slot.generation
        self._setup(geom, slot.ring_id)
        self.ring.num_pages = slot.num_pages
        self.ring.looped = slot.looped
        self.facts = dict(slot.body.get("state") or metamod.empty_facts())
        # an unchanged state is not written again (closing an untouched store writes nothing)
        body = {k: v for k, v in slot.body.items() if k != "io"}
        self._last_meta = (body, slot.ring_id, slot.num_pages, slot.looped)
        self.io_base = IoStats.from_compact(slot.body.get("io"))

    def _setup(self, geom: Geometry, ring_id: int) -> None:
        handle = self.dev.handle
        if isinstance(handle, DeviceHandle) and handle.direct and geom.page_size % handle.align:
            if self.bopts.direct == "on":
                raise BadOption(
                    f"option direct=on: page_size {geom.page_size} is not a multiple of the "
                    f"{handle.align}-byte sectors O_DIRECT needs on {self.path} (BDEV-20); use "
                    "direct=auto, or a ring with a larger page_size"
                )
            handle.drop_direct()
            self.warnings.append(
                f"page_size {geom.page_size} is not a multiple of the device's {handle.align}-"
                "byte sectors: direct I/O disabled"
            )
            self.dev.direct = False
        self.ring = RingState(geom, ring_id)
        limit = min(self.options.max_record_bytes, max_payload(geom.page_size))
        self.options = dataclasses.replace(self.options, max_record_bytes=limit)

    def _pread(self, size: int, offset: int) -> bytes:
        try:
            return self.dev.handle.pread(size, offset)
        except OSError as exc:
            raise storage_error(exc, f"reading {self.path} at offset {offset}") from None

    def _format(self, device_bytes: int, block: bytes) -> None:
        """Format (BDEV-11): zero pages 0 and 1 unless the image is new (RING-5), then
        write the metadata slot one generation above any valid slot there, the other slot
        zeroed (so no slot of the old ring outranks the new one)."""
        o = self.bopts
        h = self.dev.handle
        stored_page_size = _stored_page_size(block)
        found, _ = read_slots(block)
        resize = self.dev.kind == "image" and o.size is not None and o.size != device_bytes
        if resize and o.size is not None:
            device_bytes = o.size
        page_size = o.page_size or stored_page_size or DEFAULT_PAGE_SIZE  # reformat keeps it
        geom = geometry_for(device_bytes, page_size, str(self.path))
        self._setup(geom, new_ring_id())  # every check before the first write
        if resize:
            try:
                h.truncate(device_bytes)
                h.fsync()
            except OSError as exc:
                raise storage_error(exc, f"resizing {self.path}") from None
        self.formatted = True
        if not self.dev.created and not self._zero_pages(geom):
            for i in (0, 1):  # one whole page per write, like every other write (BDEV-1)
                self.io.write_now(Item("zero", geom.offset(i), bytes(geom.page_size)))
        self.meta_gen = max((s.generation for s in found), default=0)
        self.io_base = IoStats()
        self._slots = [bytes(SLOT_BYTES), bytes(SLOT_BYTES)]
        other = (1 - slot_index(self.meta_gen + 1)) * SLOT_BYTES
        stale = any(block[other : other + SLOT_BYTES])
        body = metamod.build_body(self.bound, 0, None, self.facts, 0, 0)
        self._put_slot(body, write_now=True, whole=stale)
        if self.dev.commit is not None:
            try:
                self.dev.commit()
            except OSError as exc:
                raise storage_error(exc, f"creating {self.path}") from None
            self.dev.commit = None

    def _zero_pages(self, geom: Geometry) -> bool:
        data = self._pread(2 * geom.page_size, geom.offset(0))
        return data.count(0) == len(data)

    # -- recovery (recovery.py reads the ring into a plan; applying it is the store's) ------------
    def _plan(self, slot: Slot) -> RingPlan:
        geometry = self.ring.geometry
        pages = read_pages(self.dev.handle, self.path, geometry)
        if not self.readonly:
            return plan_recovery(self.path, geometry, slot, pages)
        seen = self._scanned = {}

        def remember(index: int) -> bytes:  # a view: what the scan saw (BDEV-28, refresh)
            data = seen[index] = pages(index)
            return data

        return plan_recovery(self.path, geometry, slot, remember)

    def _apply_plan(self, plan: RingPlan) -> bool:
        """Rebuild the engine from the plan through the ``apply_*`` path (journal off); True
        when the slot's progress went past the recovered head and must be rewritten before new
        seqs are assigned (BDEV-17)."""
        self.warnings += plan.warnings
        ring = self.ring
        ring.next_index, ring.lap = plan.next_index, plan.lap
        for i, rng in plan.ranges.items():
            ring.slots[i] = rng
        ring.marks = dict(plan.marks)
        body = plan.slot.body
        self.incarnations = int(body.get("incarnations", 0))
        config = body.get("config")
        if config is None:  # records with no topic are refused by examine (BDEV-4)
            return False
        t = self.apply_create(self.bound, TopicConfig(**config), int(body["tid"]))
        self._replay(t, plan)
        for pid, (n, _) in sorted(plan.marks.items()):
            self.apply_produced(t, pid, n)
        return self._apply_facts(t, plan)

    def _replay(self, t: EngineTopic, plan: RingPlan) -> None:
        """Records oldest first; the seqs of LOSS pages (BDEV-25) are skipped over and become
        loss ranges (TMB-2): readers get a tombstone, and no seq is assigned again."""
        log = t.log
        run: list[RecordOut] = []
        for r in plan.records:
            if run and (
                (r.ts, r.tag, r.node) != (run[0].ts, run[0].tag, run[0].node)
                or r.seq != run[-1].seq + 1
            ):
                self._append_run(t, run)
                run = []
            if not run and r.seq > log.head + 1:
                log.skip_to(r.seq - 1)  # below the first record, or a LOSS page's seqs
            run.append(r)
        if run:
            self._append_run(t, run)
        log.skip_to(plan.head_seq)  # a LOSS page, or records of an abandoned op, after the last
        for lo, hi in plan.losses:
            log.add_loss(lo, hi)

    def _append_run(self, t: EngineTopic, run: list[RecordOut]) -> None:
        r0 = run[0]
        self.apply_append(t, [r.payload for r in run], r0.tag, r0.node, r0.ts)

    def _apply_facts(self, t: EngineTopic, plan: RingPlan) -> bool:
        """The slot's and the head page's facts, in the order of recovery.py's docstring."""
        slot = plan.slot
        log = t.log
        head = log.head
        facts = slot.body.get("state") or {}
        log.last_ts = log.last_ts if log.last_ts is not None else facts.get("last_ts")
        newest = plan.newest
        same_gen = newest is not None and newest.meta_gen == slot.generation
        past = int(facts.get("floor", 1)) > head + 1  # progress past the head (BDEV-17)
        # 1. subscribers
        for name, sub in sorted((slot.body.get("subs") or {}).items()):
            base = min(int(sub["base"]), head)
            hwm = int(sub["hwm"])
            if same_gen and newest is not None:
                hwm = max(hwm, newest.min_hwm)
            gaps = metamod.gaps_of(sub.get("gap"))  # BDEV-29
            outcomes = [*sub.get("acked", []), *sub.get("rejected", [])]
            top = gaps[-1][1] if gaps else 0
            past = past or max(int(sub["base"]), hwm, top, *outcomes) > head
            hwm = max(base, min(hwm, head))
            s = t.progress.add(name, base)
            s.hwm = hwm
            s.outcomes = {q: "acked" for q in sub.get("acked", []) if hwm < q <= head}
            s.outcomes.update({q: "rejected" for q in sub.get("rejected", []) if hwm < q <= head})
            s.gaps = [g for lo, hi in gaps if (g := _clip(lo, hi, head))]
        # 2. trimmed ranges (voluntary, silent)
        trimmed = [r for lo, hi in facts.get("trimmed", []) if (r := _clip(int(lo), int(hi), head))]
        dead = [q for lo, hi in trimmed for q in log.live_between(lo, hi)]
        if dead:
            self.apply_remove(t, dead, "trimmed")
        # 3. the floor
        floor = max(int(facts.get("floor", 1)), newest.floor if newest is not None else 1)
        floor = min(floor, head + 1)
        first = plan.records[0].seq if plan.records else head + 1
        if first > floor and not _covered(floor, first - 1, trimmed):
            floor = first  # fates below the ring unknown: tombstone them rather than hide them
        if floor > 1:
            below = [s for s in t.progress.subs.values() if s.hwm < floor - 1]
            lows = [s.hwm + 1 for s in below]
            self.apply_evict(t, floor - 1, "recovery")
            log.evict_floor = max(log.evict_floor, floor)
            for s, lo in zip(below, lows, strict=True):  # SUB-7: once nothing below is live
                add_gap(s, lo, floor - 1, live_between(log))
        # 4. settle, caps, restart rules (SUB-9)
        self._settle(t)
        evict = log.eviction_plan(0, 0)
        if evict:
            self.apply_evict(t, evict[-1], "cap")
        for s in t.progress.subs.values():
            s.cursor = s.flushed_hwm = s.hwm
        log.visible = log.head
        return past

    # -- metadata ----------------------------------------------------------------------------
    def topic_or_none(self) -> EngineTopic | None:
        return self.topics.get(self.bound)

    def facts_reset(self) -> None:
        self.facts = metamod.empty_facts()

    def new_ring(self) -> None:
        """drop_topic: a fresh ring id; every page on the device becomes invalid (RING-5)."""
        self.ring.reset(new_ring_id())
        self.facts_reset()

    def enqueue_meta(self, *, write_now: bool = False) -> None:
        """Queue (or, at open, write) a metadata slot write if anything it records changed
        (under the engine lock)."""
        j: RingJournal = self.journal  # type: ignore[assignment]
        j.meta_dirty = False
        j.pages_since_meta = 0
        t = self.topic_or_none()
        if t is not None and j.sealed_through == t.log.head and j.ops_complete_on_pages:
            # every op, its end included, is in a page queued before this slot: the facts are
            # durable-safe (BDEV-14)
            self.facts = metamod.facts_of(t)
        elif t is not None:
            # Records are still in the open page: keep the older head and trims, but the floor
            # is always current, like the subscribers' progress next to it (which may cover
            # evicted seqs): what it puts below the floor was evicted for good, and recovery
            # clamps it to the head it finds (BDEV-14, BDEV-17).
            self.facts = {**self.facts, "floor": t.log.evict_floor}
        ring = self.ring
        body = metamod.build_body(
            self.bound, self.incarnations, t, self.facts, ring.lap, ring.next_index
        )
        self._put_slot(body, write_now=write_now)

    def _put_slot(self, body: dict[str, Any], *, write_now: bool, whole: bool = False) -> None:
        """Queue (or write) the slot unless nothing it records changed. It also carries the
        device's write counters since format (BDEV-19): as of this slot, itself included; they
        alone are never a reason to write it. ``whole``: write the whole metadata block (the
        other slot as this store knows it: zeros after a format, BDEV-11)."""
        ring = self.ring
        key = (body, ring.ring_id, ring.num_pages, ring.looped)
        if key == self._last_meta:
            return
        self._last_meta = key
        self.meta_gen += 1
        handle = self.dev.handle
        align = handle.align if isinstance(handle, DeviceHandle) else 1
        whole = whole or SLOT_BYTES % align != 0  # 4 KiB-sector device: the whole block
        own = IoStats(meta_writes=1, device_bytes=META_BYTES if whole else SLOT_BYTES, syncs=1)
        body = {**body, "io": self.io_base.plus(self.io.queued).plus(own).compact()}
        slot = Slot(
            self.meta_gen,
            ring.ring_id,
            ring.geometry.page_size,
            ring.geometry.page_count,
            ring.num_pages,
            ring.looped,
            body,
        )
        i = slot_index(self.meta_gen)
        self._slots[i] = encode_slot(slot)
        if whole:
            item = Item("meta", 0, self._slots[0] + self._slots[1])
        else:
            item = Item("meta", i * SLOT_BYTES, self._slots[i])
        if write_now:
            self.io.write_now(item)
        else:
            self.io.put(item)

    # -- engine hooks ------------------------------------------------------------------------
    def on_create(self, t: EngineTopic) -> None:
        # fsync topics: readable once on the device, so a crash never takes back a record anyone
        # has read (TOP-1, DUR-2)
        t.log.gate_visibility = t.config.durability == "fsync"

    def persist_progress(self, t: EngineTopic, name: str, s: SubState) -> None:
        """Subscriber.flush(): its progress reaches the metadata slot before the op returns."""
        j = self.journal
        if isinstance(j, RingJournal):
            j.meta_dirty = True

    def overwrite(self, index: int) -> None:
        """BDEV-16: page ``index`` is about to be reused; its records still live are evicted
        (involuntary: floor, tombstone, subscriber gaps), whatever the topic's retention."""
        held = self.ring.slots[index]
        t = self.topic_or_none()
        if held is None or t is None:
            return
        first, last = held
        if t.log.live_between(first, last):
            self.ring_evictions.append(RingEviction(t.name, last, t.log.head, index))
            self.apply_evict(t, last, "ring")

    def _check_open(self) -> None:
        if self.closed:
            raise Closed("store is closed")
        if self.io.failed is not None:
            raise self._poisoned()

    def _poisoned(self) -> StorageError:
        """BDEV-23: after a failed write or sync nothing more is written until a reopen."""
        first = self.io.failed
        assert first is not None
        err = StorageError(f"store {self.path} failed and must be reopened: {first} (BDEV-23)")
        err.errno = first.errno
        return err

    # -- store ops: one topic per device (CAP multi_topic=False) ---------------------------------
    def open_topic(self, name: str, options: Mapping[str, object], create: bool) -> TopicRef:
        if name != self.bound:
            with self.lock:
                self._check_open()
            if not create:
                raise NoSuchTopic(
                    f"topic {name!r} does not exist: this blockdev ring holds only topic "
                    f"{self.bound!r}"
                )
            raise NotAvailable(
                f"this blockdev ring holds one topic, {self.bound!r} (bound at format time); "
                f"use another device, partition or image for topic {name!r}"
            )
        for key in ("dead_letter", "max_deliveries"):
            if options.get(key) is not None:
                raise NotAvailable(f"{key}: queue mode is not available on blockdev")
        return super().open_topic(name, options, create)

    def subscribe(self, ref: TopicRef, name: str, start: str) -> None:
        with self.lock:
            t = self._get(ref)
            if name not in t.progress.subs and len(t.progress.subs) >= metamod.MAX_SUBSCRIBERS:
                raise NotAvailable(
                    f"a blockdev ring keeps at most {metamod.MAX_SUBSCRIBERS} subscribers (their "
                    "progress lives in a 2 KiB metadata slot); unregister one first"
                )
        super().subscribe(ref, name, start)

    def _append_runs(
        self,
        t: EngineTopic,
        runs: Sequence[tuple[Sequence[bytes], str | None, str | None]],
        now: int,
    ) -> list[int]:
        """Records never span pages (BDEV-8): one that cannot fit an empty page, or a batch that
        would wrap the ring onto itself, is ``too_large`` before any seq is assigned (RET-5)."""
        geom = self.ring.geometry
        cap = page_capacity(geom.page_size)
        pages, room = 0, cap - self._open_used()  # pages the batch occupies
        for payloads, tag, node in runs:
            tb = tag.encode() if tag is not None else None
            nb = node.encode() if node is not None else None
            for p in payloads:
                size = record_size(-(1 << 62), tb, nb, len(p))  # worst-case ts varint
                if size > cap:
                    raise TooLarge(
                        f"record of {len(p)} bytes ({size} encoded with its tag and node) does "
                        f"not fit a {geom.page_size}-byte page ({cap} bytes for records)"
                    )
                if size > room:
                    pages, room = pages + 1, cap
                elif not pages:
                    pages = 1  # it starts in the open page
                room -= size
        if pages > geom.page_count - 1:
            raise TooLarge(
                f"batch needs {pages} pages; the ring has {geom.page_count} (a batch may not "
                "overwrite itself)"
            )
        return super()._append_runs(t, runs, now)

    def _append_op(
        self,
        ref: TopicRef,
        runs: Sequence[tuple[Sequence[bytes], str | None, str | None]],
        producer: tuple[str, int] | None,
    ) -> list[int]:
        if producer is not None:
            with self.lock:
                t = self._get(ref)
                if producer[0] not in t.producers:
                    marks = {**t.producers, producer[0]: producer[1]}
                    need = sum(mark_size(p.encode(), n) for p, n in marks.items())
                    budget = page_capacity(self.ring.geometry.page_size) // 2
                    if need > budget:
                        raise NotAvailable(
                            f"too many producer ids for this ring: their marks need {need} "
                            f"bytes, a {self.ring.geometry.page_size}-byte page keeps {budget} "
                            "for them (BDEV-9)"
                        )
        return super()._append_op(ref, runs, producer)

    def _open_used(self) -> int:
        j = self.journal
        return j.open.used if isinstance(j, RingJournal) else 0

    # deletes and queue mode: refused by tidelog.api from CAPABILITIES (CAP-1, REG-4)

    # -- flush / close -----------------------------------------------------------------------
    def _seal_all(self) -> tuple[int, int]:
        """Under the lock: seal the open page and queue the slot; returns a drain target."""
        j = self.journal
        assert isinstance(j, RingJournal)
        j.seal(partial=True)
        self.enqueue_meta()
        return self.io.enqueued, j.records_added

    def flush(self) -> None:
        """DUR-7: the partially filled page (padded) and then the metadata slot, if changed."""
        with self.lock:
            self._check_open()
            Engine.flush(self)
            if self.readonly:
                return  # a view has nothing to write (BDEV-28)
            target, need = self._seal_all()
        self.io.drain(self.lock, target, need, lambda: None)

    def close(self) -> None:
        if self.readonly:
            with self.lock:
                if self.closed:
                    return
                self.closed = True
                self._notify(None)
            closing = self._release()
            if closing is not None:
                raise closing
            return
        with self.lock:
            if self.closed:
                return
            failed = self.io.failed is not None
            if not failed:
                Engine.flush(self)
                target, need = self._seal_all()
            self.closed = True
            self._notify(None)
        try:
            if not failed:
                self.io.drain(self.lock, target, need, lambda: None)
        finally:
            closing = self._release()
        if failed:
            raise self._poisoned()  # after releasing the device: the process may reopen it
        if closing is not None:
            raise closing

    def abandon(self) -> None:
        """Drop everything without writing: what a killed process leaves (crash tests)."""
        with self.lock:
            self.closed = True
        self._release()

    def _release(self) -> StorageError | None:
        """Close the device (its lock goes with the descriptor); a failed close(2) is returned
        for ``close`` to raise once everything is released (BDEV-23)."""
        with self.io.io_lock:
            try:
                self.dev.handle.close()
            except OSError as exc:
                return storage_error(exc, f"closing {self.path}")
        return None

    # -- introspection -----------------------------------------------------------------------
    @property
    def write_amplification(self) -> float | None:
        """Device bytes written per payload byte written, since this store was opened."""
        return self.io.stats.write_amplification

    def io_stats_snapshot(self, since: str = "open") -> IoStats:
        """Device writes since this store was opened, or since the ring was formatted."""
        with self.io.io_lock:
            stats = dataclasses.replace(self.io.stats)
        return self.io_base.plus(stats) if since == "format" else stats

    def io_stats(self) -> dict[str, object]:
        out = self.io.stats.to_dict()
        out["write_amplification"] = self.write_amplification
        return out

    def describe(self) -> dict[str, object]:
        out = super().describe()
        lifetime = self.io_stats_snapshot("format")
        with self.lock:
            ring = self.ring
            geom = ring.geometry
            head = None
            if ring.slots[(ring.next_index - 1) % geom.page_count] is not None:
                head = {"page": (ring.next_index - 1) % geom.page_count}
            out.update(
                {
                    "backend": "blockdev",
                    "path": self.path,
                    "device": self.dev.kind,
                    "direct_io": self.dev.direct,
                    "topic_binding": self.bound,
                    "formatted": self.formatted,
                    "readonly": self.readonly,
                    "page_size": geom.page_size,
                    "page_count": geom.page_count,
                    "ring_bytes": geom.ring_bytes,
                    "max_record_bytes": self.options.max_record_bytes,
                    "ring_id": f"{ring.ring_id:016x}",
                    "next_page": ring.next_index,
                    "lap": ring.lap,
                    "head_page": head,
                    "num_pages": ring.num_pages,
                    "looped": ring.looped,
                    "meta_generation": self.meta_gen,
                    "io": self.io.stats.to_dict(),
                    "write_amplification": self.write_amplification,
                    "io_since_format": lifetime.to_dict(),
                    "write_amplification_since_format": lifetime.write_amplification,
                    "ring_evictions": len(self.ring_evictions),
                    "warnings": list(self.warnings),
                    "failed": None if self.io.failed is None else str(self.io.failed),
                }
            )
        return out


def _stored_page_size(block: bytes) -> int | None:
    """The page size of a ring being reformatted, if its metadata is still readable."""
    for i in (0, 1):
        with contextlib.suppress(FormatCorrupt):
            return decode_slot(block[i * SLOT_BYTES : (i + 1) * SLOT_BYTES], i).page_size
    return None


def _clip(lo: int, hi: int, head: int) -> tuple[int, int] | None:
    hi = min(hi, head)
    return (lo, hi) if lo <= hi else None


def _covered(lo: int, hi: int, ranges: list[tuple[int, int]]) -> bool:
    q = lo
    for a, z in sorted(ranges):
        if a > q:
            break
        q = max(q, z + 1)
        if q > hi:
            return True
    return q > hi
