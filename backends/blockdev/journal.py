"""The blockdev Journal: engine effects -> page contents and metadata writes.

* ``appended``: records are packed into the open page; a record that does not fit seals the page
  (BDEV-14) and starts the next one. Sealing decides where the page goes, evicts what the ring is
  about to overwrite (BDEV-16), stamps the trailer with the topic's facts and queues the page.
* ``produced``: a producer mark (TOP-11) goes after the op's records. The op's last entry gets
  BATCH_END at ``end_op``, so replay keeps the records and the mark together or not at all.
  A page starts with a carried copy of each current mark whose newest copy is in the page it
  replaces or in the next one to be replaced (BDEV-9).
* ``fsync`` topics: the op's ``end_op`` ticket asks for its records on the device; the drain seals
  the partially filled page (padded, flag PARTIAL) and writes it (BDEV-15). ``memory`` topics only
  wait for pages that filled up during the op.
* evictions and trims write nothing: they are re-derived or carried by later pages and slots.
* topic create/drop, subscriber register/unregister and subscriber flushes write the metadata
  slot before the op returns.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Protocol

from tidelog.model.ring import page_seq
from tidelog.records import RouterConfig

from ..common.engine import EngineTopic
from .format import (
    BATCH_END,
    PAGE_PARTIAL,
    PageHeader,
    encode_mark,
    encode_page,
    encode_record,
    page_capacity,
)
from .ring import RingState
from .writer import IoQueue, Item

__all__ = ["OpenPage", "RingJournal", "RingPort"]


class RingPort(Protocol):
    """What the journal needs of its store, and no more: the ring and the write queue it
    fills, the engine lock drains wait under, and the store's part of sealing a page."""

    @property
    def ring(self) -> RingState: ...
    @property
    def io(self) -> IoQueue: ...
    @property
    def lock(self) -> threading.RLock: ...
    @property
    def meta_gen(self) -> int:
        """The metadata slot generation a sealed page is stamped with (BDEV-7)."""

    def topic_or_none(self) -> EngineTopic | None:
        """The ring's one topic, if it exists."""

    def facts_reset(self) -> None:
        """A topic was created: the slot's durable facts start over."""

    def new_ring(self) -> None:
        """The topic was dropped: a fresh ring id invalidates every page (RING-5)."""

    def overwrite(self, index: int) -> None:
        """Page ``index`` is about to be reused: evict its live records (BDEV-16)."""

    def enqueue_meta(self) -> None:
        """Queue a metadata slot write if anything it records changed."""


class OpenPage:
    """The page being filled, in memory (BDEV-8: ts deltas restart at 0 on every page)."""

    __slots__ = ("capacity", "parts", "used", "first_seq", "count", "prev_ts", "payload", "marks")

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.parts: list[bytes] = []  # encoded entries
        self.used = 0
        self.first_seq = 0  # seq of the first record (set when the page starts)
        self.count = 0  # records
        self.prev_ts = 0
        self.payload = 0
        self.marks = 0  # producer marks of ops (not carried copies): entries an op may end on

    def add_record(
        self,
        seq: int,
        ts: int,
        tag: bytes | None,
        node: bytes | None,
        payload: bytes,
    ) -> bool:
        """Append one record if it fits; False (nothing changed) if it does not."""
        enc = encode_record(ts - self.prev_ts, tag, node, payload, False)
        if self.used + len(enc) > self.capacity:
            return False
        assert seq == self.first_seq + self.count, "records of a page have consecutive seqs"
        self.parts.append(enc)
        self.used += len(enc)
        self.count += 1
        self.prev_ts = ts
        self.payload += len(payload)
        return True

    def add_mark(self, pid: bytes, n: int, *, carried: bool) -> bool:
        enc = encode_mark(pid, n, carried=carried)
        if self.used + len(enc) > self.capacity:
            return False
        self.parts.append(enc)
        self.used += len(enc)
        if not carried:
            self.marks += 1
        return True

    def end_op(self) -> None:
        """Flag the last entry as the end of an op (its first byte holds the flags)."""
        last = self.parts[-1]
        self.parts[-1] = bytes([last[0] | BATCH_END]) + last[1:]

    @property
    def last_seq(self) -> int:
        return self.first_seq + self.count - 1


class RingJournal:
    """Engine effects into pages and slot writes, through the store's ``RingPort``; a slot
    write is queued at least every ``meta_every`` pages (0: only when needed)."""

    def __init__(self, b: RingPort, meta_every: int) -> None:
        self.b = b
        self.meta_every = meta_every
        self.open = OpenPage(page_capacity(b.ring.geometry.page_size))
        self.open_index = -1  # ring page the open page will be written to (-1: not started)
        self.op_entries = 0  # entries the current op placed
        self.records_added = 0
        self.records_sealed = 0
        t = b.topic_or_none()
        self.sealed_through = t.log.head if t is not None else 0  # last seq in a sealed page
        self.sync_needed = False
        self.meta_dirty = False
        self.pages_since_meta = 0

    @property
    def ops_complete_on_pages(self) -> bool:
        """Whether every op so far has all its entries, its BATCH_END included, in sealed
        (queued) pages: no op is in progress and the open page holds none of an op's entries
        (a record, or a producer mark an op ended on). Only then may a metadata slot record
        the current head (BDEV-14: recovery discards an op whose end never reached the device,
        so a slot must never name seqs such an op holds)."""
        return self.op_entries == 0 and self.open.count == 0 and self.open.marks == 0

    # -- effects ---------------------------------------------------------------------------
    def created(self, t: EngineTopic) -> None:
        self.sealed_through = 0
        self.b.facts_reset()
        self.meta_dirty = True

    def dropped(self, t: EngineTopic) -> None:
        # The records of the old incarnation are gone with it: a new ring id makes every page
        # on the device invalid (RING-5), so the next incarnation starts on a fresh ring.
        self.open = OpenPage(self.open.capacity)
        self.open_index = -1
        self.op_entries = 0
        self.records_sealed = self.records_added
        self.sealed_through = 0
        self.b.new_ring()
        self.meta_dirty = True

    def appended(
        self,
        t: EngineTopic,
        first_seq: int,
        ts: int,
        tag: str | None,
        node: str | None,
        payloads: Sequence[bytes],
        sizes: list[int] | None = None,  # the ring frames each record apart: not needed
        nbytes: int | None = None,
    ) -> None:
        tb = tag.encode() if tag is not None else None
        nb = node.encode() if node is not None else None
        for i, p in enumerate(payloads):
            seq = first_seq + i
            self._start(seq)
            if not self.open.add_record(seq, ts, tb, nb, p):
                self.seal(partial=False)
                self._start(seq)
                if not self.open.add_record(seq, ts, tb, nb, p):
                    # only carried marks are in the way: they get a page of their own
                    self.seal(partial=False)
                    self._start(seq)
                    added = self.open.add_record(seq, ts, tb, nb, p)
                    assert added, "the backend checks that every record fits an empty page"
            self.records_added += 1
            self.op_entries += 1
        if t.config.durability == "fsync":
            self.sync_needed = True

    def produced(self, t: EngineTopic, pid: str, seq: int) -> None:
        raw = pid.encode()
        nxt = t.log.head + 1
        self._start(nxt)
        if not self.open.add_mark(raw, seq, carried=False):
            self.seal(partial=False)
            self._start(nxt)
            added = self.open.add_mark(raw, seq, carried=False)
            assert added, "carried marks and one mark always fit a page (BDEV-9)"
        self.b.ring.marks[pid] = (seq, self.open_index)
        self.op_entries += 1
        if t.config.durability == "fsync":
            self.sync_needed = True

    def _start(self, seq: int) -> None:
        """Begin the open page if it is empty: fix its ring page and carry forward the marks
        whose newest copy is in the page it replaces or in the next one (BDEV-9)."""
        if self.open_index >= 0:
            return
        ring = self.b.ring
        self.open_index = ring.next_index
        self.open.first_seq = seq
        for pid, n in sorted(ring.marks_to_carry(self.open_index).items()):
            added = self.open.add_mark(pid.encode(), n, carried=True)
            assert added, "the backend bounds producer marks to half a page (BDEV-9)"
            ring.marks[pid] = (n, self.open_index)  # its newest copy from now on

    def evicted(self, t: EngineTopic, through: int, reason: str) -> None:
        """Nothing on the device: the floor travels in later page trailers and slots."""

    def removed(self, t: EngineTopic, seqs: Sequence[int], fate: str) -> None:
        """Trims: carried by the subscribers' progress (BDEV-14), never a write of their own."""

    def registered(self, t: EngineTopic, name: str, base: int) -> None:
        self.meta_dirty = True

    def unregistered(self, t: EngineTopic, name: str) -> None:
        self.meta_dirty = True

    def delivered(self, t: EngineTopic, seq: int, lease_id: int, count: int, fresh: bool) -> None:
        raise AssertionError("queue mode is not available on blockdev")

    def returned(self, t: EngineTopic, seq: int) -> None:
        raise AssertionError("queue mode is not available on blockdev")

    def delayed(self, t: EngineTopic, seq: int, ready_at: int) -> None:
        raise AssertionError("queue mode is not available on blockdev")

    def loss(self, t: EngineTopic, lo: int, hi: int) -> None:
        raise AssertionError("a ring holds no routers and logs no loss ranges (RTR-13)")

    def router_created(self, t: EngineTopic, name: str, config: RouterConfig, cursor: int) -> None:
        raise AssertionError("a ring holds no routers (RTR-13)")

    def router_moved(self, t: EngineTopic, name: str, cursor: int) -> None:
        raise AssertionError("a ring holds no routers (RTR-13)")

    def router_dropped(self, t: EngineTopic, name: str) -> None:
        raise AssertionError("a ring holds no routers (RTR-13)")

    # -- pages -----------------------------------------------------------------------------
    def seal(self, partial: bool) -> None:
        """Close the open page and queue it (under the engine lock)."""
        page = self.open
        if not page.used:
            return
        b, ring = self.b, self.b.ring
        index = ring.next_index
        assert index == self.open_index
        b.overwrite(index)  # BDEV-16: evict live records of the page about to be replaced
        t = b.topic_or_none()
        floor = t.log.evict_floor if t is not None else 1
        subs = t.progress.subs.values() if t is not None else ()
        header = PageHeader(
            first_seq=page.first_seq,
            floor=floor,
            min_hwm=min((s.hwm for s in subs), default=0),
            meta_gen=b.meta_gen,
            count=page.count,
            used=page.used,
            page_seq=page_seq(ring.lap, index, ring.geometry.page_count),
            flags=PAGE_PARTIAL if partial else 0,
            lap=ring.lap,
        )
        data = encode_page(ring.geometry.page_size, ring.ring_id, b"".join(page.parts), header)
        ring.slots[index] = (page.first_seq, page.last_seq) if page.count else None
        self.records_sealed += page.count
        if page.count:
            self.sealed_through = page.last_seq
        b.io.put(
            Item(
                "page",
                ring.geometry.offset(index),
                data,
                records_upto=self.records_sealed,
                records=page.count,
                payload=page.payload,
            )
        )
        self.open = OpenPage(page.capacity)
        self.open_index = -1
        wrapped = ring.advance()
        self.pages_since_meta += 1
        meta = False
        if ring.num_pages < 3:  # BDEV-14: num_pages is recorded for the first three pages
            ring.num_pages += 1
            meta = True
        if wrapped and not ring.looped:  # BDEV-14: first wrap
            ring.looped = True
            meta = True
        every = self.meta_every
        if meta or (every and self.pages_since_meta >= every):
            b.enqueue_meta()

    # -- ending an op ----------------------------------------------------------------------
    def end_op(self, wait: bool) -> tuple[int, int] | None:
        if self.op_entries:
            self.open.end_op()  # the op's last entry is always still in the open page
            self.op_entries = 0
        if self.meta_dirty:
            self.b.enqueue_meta()
        need = self.records_added if self.sync_needed else 0
        self.sync_needed = False
        io = self.b.io
        if io.done >= io.enqueued and need <= io.records_durable:
            return None
        return (io.enqueued, need)

    def wait(self, ticket: object) -> None:
        assert isinstance(ticket, tuple)
        target, need = ticket
        self.b.io.drain(self.b.lock, target, need, self.prepare)

    def prepare(self) -> None:
        """Under the engine lock, for a drain that needs records still in the open page."""
        self.seal(partial=True)
