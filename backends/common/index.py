"""The per-topic log index: a base+offset vector, tag index and lazy front reclaim.

The newest records live in the *tail*: slot ``i`` holds seq ``base + i`` as a payload (None once
the record is gone) and a ts, in parallel lists so reads are a tight loop with no per-record
lookups. Tags and nodes are stored as runs (most records have neither: an append without labels
stores nothing for them) and materialised as lists only where read in bulk (``tail_slice``).
The live count and byte total are derived, not counted per append: ``count`` from the tail's
length, ``nbytes`` folded in from the payloads appended since it was last read.
Older records may live in *sealed chunks* (read-only, e.g. mmap'd segment
files of the file backend) that cover contiguous seq ranges below ``base``; a chunk answers the
same per-slot questions through the small ``SealedChunk`` interface. The memory backend never
seals, so its reads never leave the tail's fast path.

Dead tail slots stay in place (so indexing stays O(1)) until the dead prefix is popped in bulk.
This class knows nothing about subscribers or queues; it reports which seqs it removed and the
engine tells the other parts.
"""

from __future__ import annotations

from array import array
from bisect import bisect_left, bisect_right, insort
from collections.abc import Container, Iterator, Sequence
from fnmatch import fnmatchcase
from typing import Protocol

from tidelog.config import TopicConfig
from tidelog.records import Item, Record, Tombstone

__all__ = ["TopicLog", "SealedChunk", "glob_prefix"]

_COMPACT_MIN = 4096  # pop the dead prefix only once it is this long and half the slots


def glob_prefix(pattern: str) -> str:
    """The literal text before a glob's first wildcard (DEL-5: the tag-index range to scan)."""
    for i, ch in enumerate(pattern):
        if ch in "*?[":
            return pattern[:i]
    return pattern


class SealedChunk(Protocol):
    """A read-only run of slots ``first_seq .. first_seq + count - 1`` below the tail."""

    first_seq: int
    count: int
    live: int  # live slots left

    def is_live(self, i: int) -> bool: ...

    def first_live(self) -> int:
        """Index of the first live slot (``count`` if none); implementations cache it."""

    def kill(self, i: int) -> int:
        """Mark slot ``i`` dead; return its payload size."""

    def ts(self, i: int) -> int: ...

    def node(self, i: int) -> str | None: ...

    def record(self, i: int) -> Record: ...

    def size(self, i: int) -> int: ...


class TopicLog:
    """Records, floors and tags of one topic incarnation."""

    def __init__(self, name: str, config: TopicConfig) -> None:
        self.name = name
        self.config = config
        self.head = 0
        self.visible = 0  # readers see seqs <= visible (fsync topics: what is durable)
        self.gate_visibility = False  # True: the engine publishes seqs once durable
        self.evict_floor = 1
        # count == _count + len(payloads): each tail slot appended is one more live record, so
        # an append changes no counter; what kills or moves slots adjusts _count
        self._count = 0
        # nbytes == _nbytes + the sizes of payloads[_folded:] (appended since the last fold,
        # all live: whatever kills a slot folds first)
        self._nbytes = 0
        self._folded = 0
        self.last_ts: int | None = None
        self.losses: list[tuple[int, int]] = []  # crash-loss ranges above the floor (TMB-2)
        self.chunks: list[SealedChunk] = []
        self._chunk_firsts: list[int] = []
        self.base = 1
        self._first = 0  # index of the first live tail slot (== len(payloads) when none)
        # the tail's columns are changed in place, never rebound: a lane (lane.py) holds them
        self.payloads: list[bytes | None] = []
        self.tss: list[int] = []
        # the tail's labels as runs: seq _label_firsts[k] onwards carries _label_tags[k] and
        # _label_nodes[k], up to the next run; no run: none. The last run is always (None,
        # None) (an unlabelled append adds nothing); runs start at or below ``base`` only for
        # the first one kept
        self._label_firsts: list[int] = []
        self._label_tags: list[str | None] = []
        self._label_nodes: list[str | None] = []
        # tag -> its seqs as ascending, disjoint inclusive ranges, flat: lo0, hi0, lo1, hi1, ...
        # (may cover dead seqs); a run of equally tagged appends is one range, so neither
        # appending nor rebuilding the index at open costs anything per record
        self.tag_ranges: dict[str, array[int]] = {}
        self.tag_keys: list[str] = []  # sorted distinct tags, for glob prefix ranges
        self.examined = 0  # slots/tag entries examined by deletes (DEL-5 instrumentation)

    # -- derived totals ----------------------------------------------------------------------
    @property
    def count(self) -> int:
        """Live records, tail and sealed chunks."""
        return self._count + len(self.payloads)

    @count.setter
    def count(self, value: int) -> None:
        self._count = value - len(self.payloads)

    @property
    def nbytes(self) -> int:
        """Payload bytes of the live records."""
        self._fold()
        return self._nbytes

    @nbytes.setter
    def nbytes(self, value: int) -> None:
        self._fold()
        self._nbytes = value

    def _fold(self) -> None:
        """Add the sizes of the payloads appended since the last fold to ``_nbytes``."""
        p, k = self.payloads, self._folded
        if k < len(p):
            self._nbytes += sum(map(len, p[k:]))  # type: ignore[arg-type]  # none is None
            self._folded = len(p)

    def _fold_prefix(self, cut: int, sizes: Sequence[int] | None, sizes_first: int) -> None:
        """Fold the tail's first ``cut`` slots, before they are cut (``_cut_tail``); slots after
        them may stay unfolded. From ``sizes`` (``sizes[i]``: the payload size of seq
        ``sizes_first + i``) when it covers the unfolded part: a C-level sum over the caller's
        array, not a ``len`` of each payload under the store lock. The unfolded part holds no
        dead slot (a removal folds first), so its sizes are its payloads' own."""
        k = self._folded
        if k >= cut:
            return
        lo, hi = self.base + k - sizes_first, self.base + cut - sizes_first
        if sizes is not None and lo >= 0 and hi <= len(sizes):
            self._nbytes += sum(sizes[lo:hi])
            self._folded = cut
        else:
            self._fold()

    # -- labels ------------------------------------------------------------------------------
    def _label_at(self, seq: int) -> tuple[str | None, str | None]:
        k = bisect_right(self._label_firsts, seq) - 1
        if k < 0:
            return None, None
        return self._label_tags[k], self._label_nodes[k]

    def _label_pieces(self, i0: int, i1: int) -> list[tuple[int, int, str | None, str | None]]:
        """Tail slots i0..i1 (inclusive) as (j0, j1, tag, node) pieces of equal labels."""
        firsts = self._label_firsts
        if not firsts:
            return [(i0, i1, None, None)]
        base = self.base
        k = max(bisect_right(firsts, base + i0) - 1, 0)
        out: list[tuple[int, int, str | None, str | None]] = []
        tags, nodes, n = self._label_tags, self._label_nodes, len(firsts)
        j = i0
        if firsts[k] > base + j:  # slots before the first run carry none
            end = min(firsts[k] - base - 1, i1)
            out.append((j, end, None, None))
            j = end + 1
        while j <= i1:
            end = i1 if k + 1 >= n else min(firsts[k + 1] - base - 1, i1)
            out.append((j, end, tags[k], nodes[k]))
            j = end + 1
            k += 1
        return out

    def _labels(self, i0: int, n: int) -> tuple[list[str | None], list[str | None]]:
        """The tags and nodes of tail slots i0 .. i0 + n - 1, as lists."""
        if not self._label_firsts:
            none: list[str | None] = [None] * n
            return none, none.copy()
        tags: list[str | None] = []
        nodes: list[str | None] = []
        if n > 0:
            for j0, j1, tag, node in self._label_pieces(i0, i0 + n - 1):
                tags += [tag] * (j1 - j0 + 1)
                nodes += [node] * (j1 - j0 + 1)
        return tags, nodes

    def tail_columns(
        self, a: int, b: int
    ) -> tuple[list[bytes | None], list[int], list[str | None], list[str | None]]:
        """Tail slots ``a .. b - 1`` (clipped to the tail) as lists: payloads (None: dead),
        tss, tags and nodes. A dead slot carries no node, as when nodes were stored per slot
        and a removal cleared its node: the label runs a checkpoint seals stay the same."""
        payloads = self.payloads[a:b]
        tags, nodes = self._labels(a, len(payloads))
        if self._label_firsts and None in payloads and any(nodes):
            nodes = [None if p is None else nd for p, nd in zip(payloads, nodes)]
        return payloads, self.tss[a:b], tags, nodes

    def _label_run(self, first: int, last: int, tag: str | None, node: str | None) -> None:
        """Seqs first..last (the newest, just appended) carry ``tag`` and ``node``."""
        if tag is None and node is None:
            return  # the last run is (None, None) already
        firsts, tags, nodes = self._label_firsts, self._label_tags, self._label_nodes
        if firsts and firsts[-1] == first:  # the open unlabelled run holds nothing yet
            del firsts[-1], tags[-1], nodes[-1]
        if not (firsts and tags[-1] == tag and nodes[-1] == node):
            firsts.append(first)
            tags.append(tag)
            nodes.append(node)
        firsts.append(last + 1)
        tags.append(None)
        nodes.append(None)

    def _cut_tail(self, cut: int) -> None:
        """Drop the tail's first ``cut`` slots (folded, and counted by the caller's ``_count``
        adjustment) and the label runs that end before the new base."""
        p = self.payloads
        del p[:cut], self.tss[:cut]
        self.base += cut
        self._folded = max(self._folded - cut, 0)
        firsts = self._label_firsts
        if firsts:
            k = bisect_right(firsts, self.base) - 1
            if k > 0:
                del firsts[:k], self._label_tags[:k], self._label_nodes[:k]

    # -- locating slots ----------------------------------------------------------------------
    def _chunk(self, seq: int) -> tuple[SealedChunk, int] | None:
        j = bisect_right(self._chunk_firsts, seq) - 1
        if j < 0:
            return None
        c = self.chunks[j]
        i = seq - c.first_seq
        return (c, i) if i < c.count else None

    def _pieces(self, lo: int, hi: int) -> Iterator[tuple[SealedChunk | None, int, int]]:
        """Slot ranges covering seqs [lo, hi]: (chunk, i0, i1) for sealed chunks and
        (None, i0, i1) for the tail, indexes inclusive, in seq order."""
        if self.chunks and lo < self.base:
            j = max(bisect_right(self._chunk_firsts, lo) - 1, 0)
            chunks = self.chunks
            for k in range(j, len(chunks)):  # no copy of the list: a read stops early
                c = chunks[k]
                if c.first_seq > hi:
                    return
                i0 = max(lo - c.first_seq, 0)
                i1 = min(hi - c.first_seq, c.count - 1)
                if i0 <= i1:
                    yield c, i0, i1
        i0 = max(lo - self.base, self._first)
        i1 = min(hi - self.base, len(self.payloads) - 1)
        if i0 <= i1:
            yield None, i0, i1

    # -- queries ---------------------------------------------------------------------------
    @property
    def dead_prefix(self) -> int:
        """How many tail slots before the first live one (all dead): no scan of the tail."""
        return self._first

    @property
    def earliest(self) -> int:
        for c in self.chunks:
            if c.live:
                return c.first_seq + c.first_live()
        if self._first < len(self.payloads):
            return self.base + self._first
        return self.head + 1

    def is_live(self, seq: int) -> bool:
        i = seq - self.base
        if i >= 0:
            return i < len(self.payloads) and self.payloads[i] is not None
        found = self._chunk(seq)
        return found is not None and found[0].is_live(found[1])

    def record(self, seq: int) -> Record:
        i = seq - self.base
        if i >= 0:
            payload = self.payloads[i]
            assert payload is not None
            return Record(seq, self.tss[i], *self._label_at(seq), payload)
        found = self._chunk(seq)
        assert found is not None
        return found[0].record(found[1])

    def live_between(self, lo: int, hi: int) -> list[int]:
        """Live seqs in [lo, hi], ascending."""
        out: list[int] = []
        for c, i0, i1 in self._pieces(lo, hi):
            if c is None:
                p, base = self.payloads, self.base
                out += [base + i for i in range(i0, i1 + 1) if p[i] is not None]
            elif c.live:
                out += [c.first_seq + i for i in range(i0, i1 + 1) if c.is_live(i)]
        return out

    def any_live(self, lo: int, hi: int, skip: Container[int] = ()) -> bool:
        """Whether some live seq in [lo, hi] is not in ``skip``; stops at the first (SUB-7)."""
        for c, i0, i1 in self._pieces(lo, hi):
            if c is None:
                p, base = self.payloads, self.base
                if any(p[i] is not None and base + i not in skip for i in range(i0, i1 + 1)):
                    return True
            elif c.live and any(
                c.is_live(i) and c.first_seq + i not in skip for i in range(i0, i1 + 1)
            ):
                return True
        return False

    def _live_from_start(self) -> Iterator[tuple[int, int, int]]:
        """(seq, ts, payload size) of live records, oldest first."""
        for c, i0, i1 in self._pieces(1, self.head):
            if c is None:
                p, t = self.payloads, self.tss
                for i in range(i0, i1 + 1):
                    payload = p[i]
                    if payload is not None:
                        yield self.base + i, t[i], len(payload)
            elif c.live:
                for i in range(i0, i1 + 1):
                    if c.is_live(i):
                        yield c.first_seq + i, c.ts(i), c.size(i)

    # -- append ----------------------------------------------------------------------------
    def append(
        self,
        payloads: Sequence[bytes],
        tag: str | None,
        node: str | None,
        ts: int,
        nbytes: int | None = None,
    ) -> list[int]:
        """Append a run sharing ts and labels; ``nbytes`` is their total size if the caller
        knows it (else it is folded in when read). Bulk list operations only: no Python loop
        per record. With ``nbytes``, records the lane appended since the last fold (lane.py:
        it never folds) are folded first, so the tail stays folded under a mix of single and
        batched appends, and a checkpoint's swap has nothing left to fold (``seal``)."""
        first = self.head + 1
        n = len(payloads)
        if nbytes is not None:  # no len() of each later
            if self._folded < len(self.payloads):
                self._fold()  # each record since the last fold, once: C-level
            self._nbytes += nbytes
            self._folded += n
        if n == 1:  # the common single append: no temporary lists
            self.payloads.append(payloads[0])
            self.tss.append(ts)
        else:
            self.payloads.extend(payloads)
            self.tss.extend([ts] * n)
        self._label_run(first, first + n - 1, tag, node)
        self.head += n  # count and nbytes follow from the tail (``count``, ``_fold``)
        if not self.gate_visibility:
            self.visible = self.head
        self.last_ts = ts
        if tag is not None:
            self.index_tag(tag, first, first + n - 1)
        return list(range(first, first + n))

    def append_located(
        self, chunk: SealedChunk, n: int, nbytes: int, tag: str | None, ts: int
    ) -> None:
        """Records ``head + 1 .. head + n`` with one ts and tag, already the last ``n`` slots of
        ``chunk``: a chunk above every other one that is still growing (the file backend's
        recovered WAL tail, served from the WAL files). The tail must be empty."""
        assert not self.payloads and chunk.first_seq + chunk.count == self.head + n + 1
        first = self.head + 1
        if not self.chunks or self.chunks[-1] is not chunk:
            self.add_chunk(chunk)
        self.base = first + n
        self.head += n
        if not self.gate_visibility:
            self.visible = self.head
        self._count += n  # not in the tail: counted here
        self._fold()
        self._nbytes += nbytes
        self.last_ts = ts
        if tag is not None:
            self.index_tag(tag, first, first + n - 1)

    def replace_chunk(self, old: SealedChunk, new: Sequence[SealedChunk]) -> None:
        """Swap ``old`` for ``new``, chunks holding exactly its slots in the same state (the
        file backend seals a recovered WAL tail this way): totals do not change."""
        j = self.chunks.index(old)
        self.chunks[j : j + 1] = new
        self._chunk_firsts[j : j + 1] = [c.first_seq for c in new]

    def index_tag(self, tag: str, lo: int, hi: int) -> None:
        """Add seqs lo..hi (all above any already indexed) to ``tag``'s ranges."""
        ranges = self.tag_ranges.get(tag)
        if ranges is None:
            self.tag_ranges[tag] = array("Q", (lo, hi))
            insort(self.tag_keys, tag)
            return
        low = self.chunks[0].first_seq if self.chunks else self.base
        if ranges[0] < low:  # drop what covers reclaimed slots only
            keep = 0
            while keep < len(ranges) and ranges[keep + 1] < low:
                keep += 2
            del ranges[:keep]
            if ranges and ranges[0] < low:
                ranges[0] = low
        if ranges and ranges[-1] + 1 == lo:
            ranges[-1] = hi
        else:
            ranges.extend((lo, hi))

    # -- retention planning (RET-1, RET-2, RET-4) ---------------------------------------------
    def eviction_plan(self, n: int, nbytes: int) -> list[int]:
        """Oldest live seqs an append of n records / nbytes must evict to keep the caps."""
        cap_r, cap_b = self.config.cap_records, self.config.cap_bytes
        count, total = self.count, self.nbytes
        victims: list[int] = []
        if not (
            (cap_r is not None and count + n > cap_r)
            or (cap_b is not None and total + nbytes > cap_b)
        ):
            return victims
        for seq, _, size in self._live_from_start():
            victims.append(seq)
            count -= 1
            total -= size
            if not (
                (cap_r is not None and count + n > cap_r)
                or (cap_b is not None and total + nbytes > cap_b)
            ):
                break
        return victims

    def expired(self, now: int) -> list[int]:
        """Live seqs whose TTL has passed: a prefix, since ts never decreases (RET-4, TOP-5)."""
        ttl = self.config.ttl_ms
        if ttl is None or self.count == 0:
            return []
        out: list[int] = []
        for seq, ts, _ in self._live_from_start():
            if ts + ttl > now:
                break
            out.append(seq)
        return out

    # -- removal ---------------------------------------------------------------------------
    def remove(self, seqs: Sequence[int], involuntary: bool) -> None:
        """Kill live slots. Involuntary removals are the oldest live prefix (TMB-1)."""
        self._fold()
        p, base = self.payloads, self.base
        for q in seqs:
            i = q - base
            if i >= 0:
                payload = p[i]
                assert payload is not None, f"seq {q} is not live"
                self._nbytes -= len(payload)
                p[i] = None
            else:
                found = self._chunk(q)
                assert found is not None and found[0].is_live(found[1]), f"seq {q} is not live"
                self._nbytes -= found[0].kill(found[1])
            self._count -= 1
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
            self._fold()
            self._count += i  # the slots are dead: count unchanged
            self._cut_tail(i)
            self._first = 0

    def skip_to(self, hi: int) -> None:
        """Advance the head to ``hi`` over seqs that never became live (lost in a crash): they
        occupy dead tail slots so seq -> slot indexing stays exact."""
        n = hi - self.head
        if n <= 0:
            return
        if self.payloads:
            self._fold()
            self.payloads.extend([None] * n)
            self.tss.extend([self.last_ts or 0] * n)
            self._folded = len(self.payloads)
            self._count -= n  # dead slots: count unchanged (their labels: the open run's none)
        else:
            self.base = hi + 1
        self.head = hi
        self.visible = hi
        self._advance_first()

    def add_loss(self, lo: int, hi: int) -> None:
        """DUR-3: seqs lo..hi were lost in a crash while older records survived."""
        if hi >= max(lo, self.evict_floor):
            self.losses.append((max(lo, self.evict_floor), hi))
            self.losses.sort()

    # -- sealing (file backend) ---------------------------------------------------------------
    def tail_dead(self) -> int:
        """How many tail slots are dead (None), from the counters alone: no scan of the tail."""
        sealed = 0
        for c in self.chunks:
            sealed += c.live
        return len(self.payloads) - (self.count - sealed)

    def tail_slice(
        self, through: int
    ) -> tuple[int, list[bytes | None], list[int], list[str | None], list[str | None]]:
        """The tail's slots from ``base`` through ``through``: (first_seq, payloads, tss, tags,
        nodes), with None payloads for dead slots. Copies the lists (cheap: references)."""
        return (self.base, *self.tail_columns(0, max(through - self.base + 1, 0)))

    def seal(
        self,
        chunks: Sequence[SealedChunk],
        sizes: Sequence[int] | None = None,
        sizes_first: int = 0,
    ) -> list[bytes | None]:
        """Replace the tail slots of the seqs ``chunks`` hold (ascending: a checkpoint's
        segments of this topic) by them. Slots that died since a chunk was built (or were
        popped from the tail's dead prefix meanwhile) are killed in it, so the chunks reflect
        the current state. Totals do not change: the records only move. The tail is cut once
        for all of them: each cut drops a reference per slot cut and moves the rest of the
        tail, under the store lock (5-25 ms for a tail of 1-2M records), so a cut per segment
        would cost the appenders that many times over. Returns the payloads it took out of
        the tail: the caller drops them after releasing its lock (freeing 100k payload objects
        is milliseconds that appenders would otherwise wait). ``sizes``: the caller's payload
        sizes of seqs ``sizes_first ..`` (the checkpoint's lengths column), for
        ``_fold_prefix``."""
        dead = self.tail_dead()
        end = self.base
        for chunk in chunks:
            first, n = chunk.first_seq, chunk.count
            if first < self.base or dead:  # else nothing died since: no loop
                for i in range(n):
                    j = first + i - self.base
                    if (j < 0 or self.payloads[j] is None) and chunk.is_live(i):
                        chunk.kill(i)
            end = max(end, first + n)
        cut = end - self.base
        gone: list[bytes | None] = []
        if cut > 0:
            gone = self.payloads[:cut]
            self._fold_prefix(cut, sizes, sizes_first)
            self._count += cut  # the records only move to the chunks
            self._cut_tail(cut)
            self._first = max(self._first - cut, 0)
        for chunk in chunks:
            self.add_chunk(chunk)
        self._advance_first()
        return gone

    def add_chunk(self, chunk: SealedChunk) -> None:
        """Attach a sealed chunk (recovery builds the log from chunks, then the tail)."""
        j = bisect_left(self._chunk_firsts, chunk.first_seq)
        self.chunks.insert(j, chunk)
        self._chunk_firsts.insert(j, chunk.first_seq)
        if not self.payloads:
            self.base = max(self.base, chunk.first_seq + chunk.count)

    def drop_dead_chunks(self) -> list[SealedChunk]:
        """Detach and return sealed chunks with no live slot left (their files can go)."""
        dead = [c for c in self.chunks if not c.live]
        if dead:
            self.chunks = [c for c in self.chunks if c.live]
            self._chunk_firsts = [c.first_seq for c in self.chunks]
        return dead

    # -- reads (TOP-7, TOP-8, TMB-1..5) ------------------------------------------------------
    def read(
        self, after: int, limit: int, exclude_node: str | None, upto: int | None = None
    ) -> list[Item]:
        """What a reader gets after ``after`` (TMB, DEL), through what readers may see, or
        through ``upto`` (a router reads records in flight too: RTR-8)."""
        items: list[Item] = []
        pos = after
        if pos + 1 < self.evict_floor:
            items.append(Tombstone(pos + 1, self.evict_floor - 1))
            pos = self.evict_floor - 1
        head = self.visible if upto is None else upto
        losses = [r for r in self.losses if r[1] > pos] if self.losses else []
        while pos < head and len(items) < limit:
            if losses and losses[0][0] <= pos + 1:
                hi = min(losses.pop(0)[1], head)
                items.append(Tombstone(pos + 1, hi))
                pos = hi
                continue
            seg_end = min(losses[0][0] - 1, head) if losses else head
            pos = self._scan(items, pos + 1, seg_end, limit, exclude_node)
        return items

    def _scan(
        self, items: list[Item], start: int, end: int, limit: int, exclude: str | None
    ) -> int:
        """Append live records with seq in [start, end] until ``limit`` items; return the last
        seq examined (so the caller resumes after it)."""
        if self.chunks and start < self.base:
            for c, i0, i1 in self._pieces(start, min(end, self.base - 1)):
                assert c is not None
                bulk = getattr(c, "records_into", None)  # a chunk's own sequential read
                if bulk is not None:
                    stopped = bulk(items, i0, i1, limit, exclude)
                    if stopped is not None:
                        return int(stopped)
                    continue
                for i in range(i0, i1 + 1):
                    if len(items) >= limit:
                        return c.first_seq + i - 1
                    if c.is_live(i) and (exclude is None or c.node(i) != exclude):
                        items.append(c.record(i))
            start = max(start, self.base)
            if start > end:
                return end
        base = self.base
        p, t = self.payloads, self.tss
        i = max(start - base, self._first)
        stop = min(end - base, len(p) - 1)
        room = limit - len(items)
        if not room:
            return start - 1
        if i > stop:
            return end
        append, new = items.append, tuple.__new__  # tuple.__new__: a NamedTuple without its
        for j0, j1, tag, node in self._label_pieces(i, stop):  # Python-level __new__
            if exclude is not None and node == exclude:  # (measurable per record)
                continue
            i = j0
            while i <= j1 and room:
                payload = p[i]
                if payload is not None:
                    append(new(Record, (base + i, t[i], tag, node, payload)))
                    room -= 1
                i += 1
            if not room:
                return end if i > stop else base + i - 1
        return end

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
            ranges = self.tag_ranges.get(k)
            if ranges is None:
                continue
            j = 0
            while j < len(ranges) and ranges[j] < limit:
                lo, hi = ranges[j], min(ranges[j + 1], limit - 1)
                self.examined += hi - lo + 1
                targets += self.live_between(lo, hi)
                if ranges[j + 1] >= limit:
                    ranges[j] = limit  # the rest of this range stays indexed
                    break
                j += 2
            del ranges[:j]
            if not ranges:
                del self.tag_ranges[k]
                del self.tag_keys[bisect_left(self.tag_keys, k)]
        targets.sort()
        return targets
