"""The per-topic log index: seed 000 §1's base+offset vector, tag index and lazy front reclaim.

Slot ``i`` holds seq ``base + i``. Each slot is a payload (None once the record is gone), a ts,
a tag and a node, kept in parallel lists so reads are a tight loop with no per-record lookups.
Dead slots stay in place (so indexing stays O(1)) until the dead prefix is popped in bulk.

This class knows nothing about subscribers or queues; it reports which seqs it removed and the
engine tells the other parts.
"""

from __future__ import annotations

from bisect import bisect_left, insort
from collections.abc import Sequence
from fnmatch import fnmatchcase

from tidelog.config import TopicConfig
from tidelog.records import Item, Record, Tombstone

__all__ = ["TopicLog", "glob_prefix"]

_COMPACT_MIN = 4096  # pop the dead prefix only once it is this long and half the slots


def glob_prefix(pattern: str) -> str:
    """The literal text before a glob's first wildcard (DEL-5: the tag-index range to scan)."""
    for i, ch in enumerate(pattern):
        if ch in "*?[":
            return pattern[:i]
    return pattern


class TopicLog:
    """Records, floors and tags of one topic incarnation."""

    def __init__(self, name: str, config: TopicConfig) -> None:
        self.name = name
        self.config = config
        self.head = 0
        self.evict_floor = 1
        self.count = 0
        self.nbytes = 0
        self.last_ts: int | None = None
        self.losses: list[tuple[int, int]] = []  # crash-loss ranges above the floor (TMB-2)
        self.base = 1
        self._first = 0  # index of the first live slot (== len(payloads) when none)
        self.payloads: list[bytes | None] = []
        self.tss: list[int] = []
        self.tags: list[str | None] = []
        self.nodes: list[str | None] = []
        self.tag_seqs: dict[str, list[int]] = {}  # tag -> ascending seqs (may hold dead ones)
        self.tag_keys: list[str] = []  # sorted distinct tags, for glob prefix ranges
        self.examined = 0  # slots/tag entries examined by deletes (DEL-5 instrumentation)

    # -- queries ---------------------------------------------------------------------------
    @property
    def earliest(self) -> int:
        if self._first < len(self.payloads):
            return self.base + self._first
        return self.head + 1

    def is_live(self, seq: int) -> bool:
        i = seq - self.base
        return 0 <= i < len(self.payloads) and self.payloads[i] is not None

    def record(self, seq: int) -> Record:
        i = seq - self.base
        payload = self.payloads[i]
        assert payload is not None
        return Record(seq, self.tss[i], self.tags[i], self.nodes[i], payload)

    def live_between(self, lo: int, hi: int) -> list[int]:
        """Live seqs in [lo, hi], ascending."""
        p, base = self.payloads, self.base
        start = max(lo - base, self._first)
        stop = min(hi - base, len(p) - 1)
        return [base + i for i in range(start, stop + 1) if p[i] is not None]

    def next_live(self, seq: int) -> int | None:
        """The smallest live seq >= seq, or None."""
        p = self.payloads
        for i in range(max(seq - self.base, self._first), len(p)):
            if p[i] is not None:
                return self.base + i
        return None

    # -- append ----------------------------------------------------------------------------
    def append(
        self, payloads: Sequence[bytes], tag: str | None, node: str | None, ts: int
    ) -> list[int]:
        first = self.head + 1
        n = len(payloads)
        self.payloads.extend(payloads)
        self.tss.extend([ts] * n)
        self.tags.extend([tag] * n)
        self.nodes.extend([node] * n)
        self.head += n
        self.count += n
        self.nbytes += sum(len(p) for p in payloads)
        self.last_ts = ts
        seqs = list(range(first, first + n))
        if tag is not None:
            lst = self.tag_seqs.get(tag)
            if lst is None:
                self.tag_seqs[tag] = seqs[:]
                insort(self.tag_keys, tag)
            else:
                if lst and lst[0] < self.base:  # drop entries for popped slots
                    del lst[: bisect_left(lst, self.base)]
                lst.extend(seqs)
        return seqs

    # -- retention planning (RET-1, RET-2, RET-4) ---------------------------------------------
    def eviction_plan(self, n: int, nbytes: int) -> list[int]:
        """Oldest live seqs an append of n records / nbytes must evict to keep the caps."""
        cap_r, cap_b = self.config.cap_records, self.config.cap_bytes
        count, total = self.count, self.nbytes
        victims: list[int] = []
        p = self.payloads
        i = self._first
        while (cap_r is not None and count + n > cap_r) or (
            cap_b is not None and total + nbytes > cap_b
        ):
            payload = p[i]
            if payload is not None:
                victims.append(self.base + i)
                count -= 1
                total -= len(payload)
            i += 1
        return victims

    def expired(self, now: int) -> list[int]:
        """Live seqs whose TTL has passed: a prefix, since ts never decreases (RET-4, TOP-5)."""
        ttl = self.config.ttl_ms
        if ttl is None or self.count == 0:
            return []
        out: list[int] = []
        p, t = self.payloads, self.tss
        for i in range(self._first, len(p)):
            if p[i] is None:
                continue
            if t[i] + ttl > now:
                break
            out.append(self.base + i)
        return out

    # -- removal ---------------------------------------------------------------------------
    def remove(self, seqs: Sequence[int], involuntary: bool) -> None:
        """Kill live slots. Involuntary removals are the oldest live prefix (TMB-1)."""
        p, base = self.payloads, self.base
        for q in seqs:
            i = q - base
            payload = p[i]
            assert payload is not None, f"seq {q} is not live"
            self.count -= 1
            self.nbytes -= len(payload)
            p[i] = None
            self.nodes[i] = None
        if involuntary and seqs:
            self.evict_floor = max(self.evict_floor, max(seqs) + 1)
            floor = self.evict_floor
            self.losses = [(max(lo, floor), hi) for lo, hi in self.losses if hi >= floor]
        self._advance_first()

    def _advance_first(self) -> None:
        p = self.payloads
        i, n = self._first, len(p)
        while i < n and p[i] is None:
            i += 1
        self._first = i
        if i >= _COMPACT_MIN and 2 * i >= n:  # lazy front reclaim, amortised O(1)
            del p[:i], self.tss[:i], self.tags[:i], self.nodes[:i]
            self.base += i
            self._first = 0

    def add_loss(self, lo: int, hi: int) -> None:
        """DUR-3: seqs lo..hi were lost in a crash while older records survived."""
        if hi >= max(lo, self.evict_floor):
            self.losses.append((max(lo, self.evict_floor), hi))
            self.losses.sort()

    # -- reads (TOP-7, TOP-8, TMB-1..5) ------------------------------------------------------
    def read(self, after: int, limit: int, exclude_node: str | None) -> list[Item]:
        items: list[Item] = []
        pos = after
        if pos + 1 < self.evict_floor:
            items.append(Tombstone(pos + 1, self.evict_floor - 1))
            pos = self.evict_floor - 1
        head = self.head
        losses = [r for r in self.losses if r[1] > pos] if self.losses else []
        while pos < head and len(items) < limit:
            if losses and losses[0][0] <= pos + 1:
                hi = losses.pop(0)[1]
                items.append(Tombstone(pos + 1, hi))
                pos = hi
                continue
            seg_end = losses[0][0] - 1 if losses else head
            pos = self._scan(items, pos + 1, seg_end, limit, exclude_node)
        return items

    def _scan(
        self, items: list[Item], start: int, end: int, limit: int, exclude: str | None
    ) -> int:
        """Append live records with seq in [start, end] until ``limit`` items; return the last
        seq examined (so the caller resumes after it)."""
        base = self.base
        p, t, g, nd = self.payloads, self.tss, self.tags, self.nodes
        i = max(start - base, self._first)
        stop = min(end - base, len(p) - 1)
        room = limit - len(items)
        append = items.append
        while i <= stop and room:
            payload = p[i]
            if payload is not None and (exclude is None or nd[i] != exclude):
                append(Record(base + i, t[i], g[i], nd[i], payload))
                room -= 1
            i += 1
        return end if i > stop else base + i - 1

    # -- voluntary deletes (DEL-1..5) -------------------------------------------------------
    def delete_targets(
        self, before_seq: int | None, tag: str | None, tag_glob: str | None
    ) -> list[int]:
        limit = self.head + 1 if before_seq is None else min(before_seq, self.head + 1)
        if tag is None and tag_glob is None:
            targets = self.live_between(self.earliest, limit - 1)
            self.examined += len(targets)
            return targets
        if tag is not None:
            keys = [tag]
        else:
            assert tag_glob is not None
            prefix = glob_prefix(tag_glob)
            keys = []
            for k in self.tag_keys[bisect_left(self.tag_keys, prefix) :]:
                if not k.startswith(prefix):
                    break
                self.examined += 1
                if fnmatchcase(k, tag_glob):
                    keys.append(k)
        targets = []
        for k in keys:
            lst = self.tag_seqs.get(k)
            if not lst:
                continue
            cut = bisect_left(lst, limit)
            for q in lst[:cut]:
                self.examined += 1
                if self.is_live(q):
                    targets.append(q)
            kept = lst[cut:]
            if kept:
                self.tag_seqs[k] = kept
            else:
                del self.tag_seqs[k]
                del self.tag_keys[bisect_left(self.tag_keys, k)]
        targets.sort()
        return targets
