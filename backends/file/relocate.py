"""Relocation of sealed segments to the cold tier (spec/TIERING.md TIER-4, TIER-5, TIER-6).

One pass: under the store lock, choose the segments (TIER-4); without it, copy each to the cold
tier (put: durable); under the lock, log one TIER frame per topic and wait outside it until the
frame is durable (the flip); under the lock, swap each hot chunk for a cold one; then unlink the
hot files and sync the directory. A crash between any two steps leaves one complete copy
reachable from the durable state (TIER-6).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import TYPE_CHECKING

from tidelog.fsio import read_whole

from .chunk import SegChunk
from .coldchunk import ColdChunk, data_key, idx_key
from .format import segment as segfmt
from .journal import WalJournal
from .tiers import Tiers, hot_pair
from .walchunk import WalChunk

if TYPE_CHECKING:
    from ..common.engine import EngineTopic
    from .store import FileBackend

__all__ = ["relocate", "eligible"]


@dataclass
class _Move:
    t: EngineTopic
    chunk: SegChunk
    flipped: bool  # already cold in the durable state (a crash between flip and delete)
    index: segfmt.SegmentIndex | None = None


def _bound(b: FileBackend, t: EngineTopic) -> int | None:
    """The highest seq the store no longer has to hand out of its own accord (TIER-4):
    subscribers' hwms, routers' cursors from ``t``, a queue's claim cursor. None: no bound."""
    marks = [s.hwm for s in t.progress.subs.values()]
    for name, r in b.routers.items():
        if r.source == t.name and r.dest in b.topics:
            marks.append(b.topics[r.dest].cursors.get(name, 0))
    jobs = t.jobs
    if jobs.claim_cursor or jobs.deliveries:
        marks.append(jobs.claim_cursor)
    return min(marks) if marks else None


def eligible(b: FileBackend, t: EngineTopic, tiers: Tiers) -> list[SegChunk]:
    """Under the lock: ``t``'s hot plain segments to relocate, oldest first (TIER-4). They
    are a prefix of its sealed segments: one that must stay hot keeps every newer one hot, so
    the cold tier always holds a topic's oldest history."""
    if t.config.durability == "ephemeral":
        return []
    opts = tiers.options
    sealed = [c for c in t.log.chunks if not isinstance(c, WalChunk)]
    # the newest segments stay hot while they fit both bounds (TIER-1); the first that does
    # not fit, and every older one, relocate
    n = max(len(sealed) - opts.hot_retain_segments, 0)
    if opts.hot_retain_bytes:
        hot = 0
        for i in range(len(sealed) - 1, -1, -1):
            c = sealed[i]
            if not isinstance(c, ColdChunk):
                hot += _size(c)
            if hot > opts.hot_retain_bytes:
                n = max(n, i + 1)
                break
    candidates = sealed[:n]
    bound = _bound(b, t)
    jobs = t.jobs
    held = set(jobs.deliveries) | jobs.free | set(jobs.delayed) | set(jobs.leases)
    out: list[SegChunk] = []
    for c in candidates:
        if isinstance(c, ColdChunk):
            continue
        if type(c) is not SegChunk:
            break  # a .qseg stays hot (TIER-4), and so does everything newer
        if not c.live:
            continue  # nothing to keep: reclaim drops it (TIER-7)
        last = c.first_seq + c.count - 1
        if bound is not None and last > bound:
            break
        if any(c.first_seq <= q <= last for q in held):
            break
        out.append(c)
    return out


def _size(c: object) -> int:
    index = getattr(c, "index", None)
    return int(index.data_size) if index is not None else 0


def relocate(b: FileBackend, tiers: Tiers) -> int:
    """One relocation pass (TIER-5); returns how many segments became cold. The caller holds
    the checkpoint lock (no checkpoint detaches or seals meanwhile)."""
    fs, store, sid = b.fs, tiers.store, tiers.store_id
    with b.lock:
        moves = [
            _Move(t, c, c.first_seq in tiers.cold.get(t.tid, ()))
            for t in sorted(b.by_id.values(), key=lambda t: t.tid)
            for c in eligible(b, t, tiers)
        ]
    if not moves:
        return 0
    # 1. copy (no lock): .idx, then .data, each durable (TIER-2); a flipped segment whose cold
    # copy checks out is not copied again (TIER-6)
    for m in moves:
        tid, first = m.t.tid, m.chunk.first_seq
        data_path, idx_path = hot_pair(fs, b.root, tid, first)
        idx = read_whole(fs, idx_path)
        m.index = segfmt.read_index(idx, topic_id=tid, first_seq=first)
        dkey, ikey = data_key(sid, tid, first), idx_key(sid, tid, first)
        if m.flipped and _same(tiers, ikey, len(idx), dkey, m.index.data_size):
            continue
        store.put(ikey, idx)
        store.put(dkey, read_whole(fs, data_path))
    # 2. flip: one TIER frame per topic, durable before any hot file goes (TIER-5)
    journal = b.journal
    assert journal is None or isinstance(journal, WalJournal)  # a file store's
    with b.lock:
        for t in {id(m.t): m.t for m in moves if not m.flipped}.values():
            if b.by_id.get(t.tid) is not t:
                continue  # dropped meanwhile: its copies are orphans (TIER-10)
            firsts = [m.chunk.first_seq for m in moves if m.t is t and not m.flipped]
            assert journal is not None
            journal.tiered(t, firsts)
            tiers.mark_cold(t.tid, firsts)
        ticket = journal.end_op(True) if journal is not None else None
    if ticket is not None and journal is not None:
        journal.wait(ticket)
    # 3. swap, under the lock: the same slots in the same state
    swapped: list[_Move] = []
    with b.lock:
        for m in moves:
            t, old = m.t, m.chunk
            if b.by_id.get(t.tid) is not t or old not in t.log.chunks:
                continue
            if m.flipped is False and m.chunk.first_seq not in tiers.cold.get(t.tid, ()):
                continue
            assert m.index is not None
            new = ColdChunk(store, tiers.cache, data_key(sid, t.tid, old.first_seq), m.index)
            new.dead[:] = old.dead
            new.live, new.nbytes, new._first = old.live, old.nbytes, old._first
            t.log.replace_chunk(old, [new])
            swapped.append(m)
    # 4. delete the hot copies
    dirs: set[str] = set()
    for m in swapped:
        m.chunk.close()
        for path in hot_pair(fs, b.root, m.t.tid, m.chunk.first_seq):
            if fs.exists(path):
                fs.unlink(path)
                dirs.add(os.path.dirname(path))
    for d in sorted(dirs):
        fs.fsync_dir(d)
    return len(swapped)


def _same(tiers: Tiers, ikey: str, isize: int, dkey: str, dsize: int) -> bool:
    store = tiers.store
    return (
        store.exists(ikey)
        and store.exists(dkey)
        and store.size(ikey) == isize
        and store.size(dkey) == dsize
    )
