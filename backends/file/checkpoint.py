"""Checkpoints: WAL -> sealed segments + an atomic metadata snapshot (SEG, SNAP-4).

1. Under the engine lock, capture at one instant: every topic's unsealed tail (references, no
   copy), the metadata body, and each WAL shard's current position (every effect so far has been
   submitted: ops end under the same lock). Detach sealed chunks with no live record left.
2. Outside the lock, write the tails as segment files (data + idx, fdatasync, directory fsync),
   then snapshot n+1 (tmp, fsync, rename, directory fsync).
3. Under the lock, swap each tail prefix for its new sealed chunk (slots that died meanwhile are
   killed in the chunk: the live state in memory stays authoritative).
4. Retire: WAL files before the snapshot's replay position, older snapshots (only the newest is
   kept: older ones may name segments this checkpoint deletes), segment files of detached chunks,
   directories of dropped topics.

A crash anywhere leaves either the old snapshot (whose WAL and segments are all still there) or
the new one (whose segments were durable before it was written).

A checkpoint that fails poisons the store (spec/SPEC.md FLT-6): after a failed rename or
directory sync the new snapshot may or may not survive a crash, and the next checkpoint would
rewrite in place the segment files it names; so none runs again in this process (the store's
``checkpoint`` sees to that).

The checkpoint sees its store through ``CheckpointPort``: the state it captures, the WAL it syncs
and retires, and where it reports what it sealed; files go through the port's FS.
"""

from __future__ import annotations

import os
from array import array
from bisect import bisect_left
from collections.abc import Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from itertools import accumulate
from typing import TYPE_CHECKING, Any, Protocol, cast

from tidelog.errors import BadArgument, Corrupt
from tidelog.fsio import FS, Pacer, make_dirs, write_paced, write_parts, write_whole
from tidelog.records import RouterConfig

from ..common.engine import EngineTopic
from .chunk import SegChunk
from .format import qseg_name
from .format import segment as segfmt
from .format import snapshot as snapfmt
from .format.seal import build_indexed, dead_slots
from .journal import ranges
from .progressfiles import topic_dir
from .replay import open_chunk
from .walchunk import WalChunk

if TYPE_CHECKING:
    from .qchunk import QsegChunk

__all__ = [
    "checkpoint",
    "write_snapshot",
    "write_located",
    "CheckpointPort",
    "SegmentPort",
    "SealAnswer",
    "SealRange",
    "StoreState",
]


@dataclass(frozen=True)
class StoreState:
    """What a checkpoint captures of its store, at one instant under the store lock (every
    effect so far has been submitted to the WAL: ops end under the same lock)."""

    snapshot: int  # the current snapshot's number (the checkpoint writes the next)
    store_id: bytes
    incarnations: int
    topics: Sequence[EngineTopic]  # live topics, by tid
    ceilings: Mapping[int, int]  # tid -> highest seq reserved durably (DUR-3)
    clean: bool  # the store is closing: every restart rule is applied (DUR-1)
    wal: Mapping[str, tuple[int, int]]  # stream key -> its position (the replay position)
    wal_submitted: int  # WAL bytes submitted so far
    dropped: Sequence[EngineTopic]  # topics dropped since the last checkpoint
    segment_max: tuple[int, int]  # segment_max_records, segment_max_bytes (SEG-7)
    routers: Mapping[str, RouterConfig] = field(default_factory=dict)  # RTR-1, by name
    cold: Mapping[int, Sequence[int]] = field(default_factory=dict)  # tid -> cold (TIER-5)
    # WTAIL-6: seal the tails in memory from their WAL frames (``CheckpointPort.seal_located``)
    locate: bool = False


class CheckpointPort(Protocol):
    """What a checkpoint needs of its store, and no more."""

    @property
    def fs(self) -> FS: ...
    @property
    def root(self) -> str: ...
    @property
    def write_out_bytes(self) -> int:
        """SEG-20's pace, for the segments it writes itself (``SegmentPort``)."""

    @property
    def lock(self) -> AbstractContextManager[Any]:
        """The store lock: the capture and the swap of sealed chunks happen under it."""

    @property
    def by_id(self) -> Mapping[int, EngineTopic]:
        """The live topics now (one may be dropped while segments are written)."""

    def checkpoint_state(self) -> StoreState:
        """Under the lock: the state to checkpoint; the dropped topics are handed over."""

    def sync_wal(self) -> None:
        """Make every WAL position of the state durable (WAL-10: the file the snapshot
        replays from exists before the snapshot does)."""

    def sealed(self, n: int) -> None:
        """Under the lock: snapshot ``n`` is durable and its segments swapped in."""

    def retire_wal(self, n: int, positions: Mapping[str, tuple[int, int]]) -> None:
        """Mark checkpoint ``n`` in the WAL (WAL-8) and remove the WAL files before
        ``positions``, and those of another shard layout."""

    def checkpointed(self, state: StoreState) -> None:
        """The checkpoint of ``state`` is complete: its WAL is retired."""

    def warn(self, message: str) -> None: ...

    def seal_located(self, state: StoreState, ranges: Sequence[SealRange]) -> SealAnswer:
        """WTAIL-7, WTAIL-8: have the records of ``ranges`` sealed from their WAL frames
        (positions from the last checkpoint's to ``state.wal``, which are durable by now); what
        fails raises as a failure of this checkpoint would."""


class SegmentPort(Protocol):
    """What writing segments needs: the checkpoint's port, or the seal worker's."""

    @property
    def fs(self) -> FS: ...
    @property
    def root(self) -> str: ...
    @property
    def write_out_bytes(self) -> int:
        """SEG-20's pace: segment bytes written out every this many (0: only at the sync)."""

    def warn(self, message: str) -> None: ...


@dataclass(frozen=True)
class SealRange:
    """Seqs ``first .. last`` of topic ``tid`` to seal from the WAL (WTAIL-7); ``dead``: the
    slots dead at the capture, as offsets from ``first``, ascending."""

    tid: int
    first: int
    last: int
    bundles: bool
    dead: tuple[int, ...] = ()


@dataclass(frozen=True)
class SealAnswer:
    """What sealing from the WAL wrote: per topic, its segments as (first seq, count) in seq
    order; and the warnings it raised (a bundle segment sealed plain, say)."""

    segments: Mapping[int, Sequence[tuple[int, int]]]
    warnings: Sequence[str] = ()


_Columns = tuple[Sequence[bytes | None], list[int], list[str | None], list[str | None]]


@dataclass
class _Tail:
    tid: int
    first: int
    payloads: list[bytes | None]
    tss: list[int]
    tags: list[str | None]
    nodes: list[str | None]
    bundles: bool = False  # payload="bundles": sealed as .qseg (spec/BUNDLES.md QSEG)
    dead: bool = True  # may payloads hold None (dead slots)? False: skip every dead-slot scan
    chunks: list[SegChunk | QsegChunk] = field(default_factory=list)
    splits: list[tuple[int, int]] = field(default_factory=list)  # (first seq, count): _split
    # a recovered WAL tail (WTAIL-4): records read from the map per segment, not held here;
    # ``dead_map`` is its dead slots at capture time
    source: WalChunk | None = None
    dead_map: bytes = b""
    lens: array[int] | None = None  # sizes() of a tail held in memory, once taken
    at: list[int] | None = None  # dead_at(), once taken
    # WTAIL-6: >= 0 for a tail captured without its records (seqs first..last, sealed from
    # the WAL); ``at`` then holds its dead slots, taken at the capture
    last: int = -1

    def dead_at(self) -> list[int]:
        """The dead slots of a tail held in memory, ascending (seal.dead_slots: a C-level scan,
        Python work per dead slot only)."""
        if self.at is None:
            self.at = dead_slots(self.payloads) if self.dead and self.source is None else []
        return self.at

    def sizes(self) -> Sequence[int]:
        """Payload size of every slot (0 for a dead one). A tail held in memory keeps them
        (``lens``): they are the lengths column its segments are built with."""
        if self.source is not None:  # dead slots keep their size: cuts stay conservative
            if self.lens is None:
                self.lens = array(segfmt._U32_CODE, self.source.sizes())
            return self.lens
        if self.lens is None:
            filled = self.payloads
            if self.dead_at():  # a dead slot's size is 0: its payload is b"" as it is sealed
                filled = filled.copy()
                for i in self.dead_at():
                    filled[i] = b""
            sizes = list(map(len, cast("list[bytes]", filled)))  # a list: preallocated
            try:
                self.lens = array(segfmt._U32_CODE, sizes)
            except OverflowError:  # build_indexed refuses such a record (BadArgument)
                return sizes
        return self.lens

    def columns(self, lo: int, hi: int) -> _Columns:
        """(payloads, tss, tags, nodes) of slots lo..hi-1, None payloads for dead slots."""
        if self.source is not None:  # a segment of bundles is made of every payload's bytes
            return self.source.columns(lo, hi, self.dead_map, pieces=not self.bundles)
        if lo == 0 and hi == len(self.payloads):  # one segment: the capture's own copies
            return self.payloads, self.tss, self.tags, self.nodes
        return self.payloads[lo:hi], self.tss[lo:hi], self.tags[lo:hi], self.nodes[lo:hi]


@dataclass
class _Capture:
    body: dict[str, Any]
    tails: list[_Tail]
    detached: list[SegChunk | QsegChunk]
    dropped: list[EngineTopic]
    positions: dict[str, tuple[int, int]]
    segments: dict[int, list[int]]  # tid -> its body's "segments" (the tails' cuts go last)


def checkpoint(b: CheckpointPort) -> int:
    """Run one checkpoint; returns the new snapshot number. The caller serialises checkpoints
    and poisons the store if one fails (FLT-6)."""
    with b.lock:
        state = b.checkpoint_state()
        cap = _capture(state)
    located = [tail for tail in cap.tails if tail.last >= 0]
    # cut into segments outside the store lock: a copy of the tail is all it reads, and
    # appenders would wait for its per-record passes (tens of ms per checkpoint)
    for tail in cap.tails:
        if tail.last < 0:
            tail.splits = _split(tail, *state.segment_max)
            cap.segments[tail.tid] += [lo for lo, _ in tail.splits]
    n = state.snapshot + 1
    try:
        for tail in cap.tails:
            if tail.last < 0:
                _write_segments(b, tail)
        # the WAL file the snapshot replays from exists durably before the snapshot does, so
        # recovery may take a missing one for damage (WAL-10: "wal_durable"); sealing from
        # the WAL (WTAIL-6) reads the frames written by this sync
        b.sync_wal()
        if located:
            _seal_located(b, state, located, cap)
        write_snapshot(b.fs, b.root, n, cap.body)
    except BaseException:
        for tail in cap.tails:  # never swapped in: their maps go now
            for chunk in tail.chunks:
                chunk.close()
        raise
    gone: list[list[bytes | None]] = []
    with b.lock:
        for tail in cap.tails:
            t = b.by_id.get(tail.tid)
            if tail.source is not None:
                _reseal(t, tail)
                continue
            if t is None:  # dropped meanwhile: its directory goes at the next checkpoint
                for chunk in tail.chunks:
                    chunk.close()
            elif tail.chunks and tail.last >= 0:
                # sealed from the WAL: a tail left unfolded by the lane is folded from its
                # payloads (a C-level len each: ~1.6 ms per 100k records), not from the
                # segment's lengths column, whose decoding holds the GIL 6x as long
                gone.append(t.log.seal(tail.chunks))
            elif tail.chunks:  # sizes: the records' bytes are added without a len() each
                gone.append(t.log.seal(tail.chunks, tail.lens, tail.first))
        b.sealed(n)
    del gone  # the sealed payloads are freed here, not under the store lock
    _retire(b, n, cap)
    b.checkpointed(state)
    return n


def _seal_located(b: CheckpointPort, state: StoreState, tails: list[_Tail], cap: _Capture) -> None:
    """WTAIL-6: the tails captured without their records, sealed from their WAL frames by
    the port (WTAIL-7, WTAIL-8), then opened as the segments they now are."""
    ranges = [SealRange(t.tid, t.first, t.last, t.bundles, tuple(t.dead_at())) for t in tails]
    answer = b.seal_located(state, ranges)
    for message in answer.warnings:
        b.warn(message)
    for tail in tails:
        got = list(answer.segments.get(tail.tid, ()))
        firsts = list(accumulate((count for _, count in got), initial=tail.first))
        if [lo for lo, _ in got] != firsts[:-1] or firsts[-1] != tail.last + 1:
            raise Corrupt(
                f"topic {tail.tid:016x}: sealing seqs {tail.first}..{tail.last} from the WAL "
                f"returned segments {got} (WTAIL-7)"
            )
        tail.splits = got
        cap.segments[tail.tid] += [lo for lo, _ in got]
        for first, _ in got:
            tail.chunks.append(open_chunk(b.fs, b.root, tail.tid, first))


def write_located(
    b: SegmentPort,
    chunk: WalChunk,
    tid: int,
    bundles: bool,
    dead_map: bytes,
    segment_max: tuple[int, int],
) -> list[tuple[int, int]]:
    """Seal the records ``chunk`` locates in WAL frames (WTAIL-7): segments cut as a tail
    in memory is (plus the chunk's own end), slots ``dead_map`` marks as dead placeholders.
    Returns the segments written as (first seq, count); their chunks are closed (the writer
    opens the files itself)."""
    tail = _Tail(tid, chunk.first_seq, [], [], [], [], bundles, dead_map.find(1) >= 0,
                 source=chunk, dead_map=dead_map)  # fmt: skip
    tail.splits = _split(tail, *segment_max)
    try:
        _write_segments(b, tail)
    finally:
        for c in tail.chunks:
            c.close()
    return tail.splits


def _reseal(t: EngineTopic | None, tail: _Tail) -> None:
    """Swap a recovered WAL tail's chunk for the segments just written from it (WTAIL-4).
    Slots that died since the capture are killed in them, so they hold its current state."""
    old = tail.source
    assert old is not None
    if t is None or old.closed:  # dropped meanwhile: its directory goes at the next checkpoint
        for chunk in tail.chunks:
            chunk.close()
        return
    if old.dead != tail.dead_map:
        for chunk in tail.chunks:
            lo = chunk.first_seq - old.first_seq
            i = old.dead.find(1, lo, lo + chunk.count)
            while i >= 0:
                if chunk.is_live(i - lo):
                    chunk.kill(i - lo)
                i = old.dead.find(1, i + 1, lo + chunk.count)
    t.log.replace_chunk(old, tail.chunks)
    old.close()


def _capture(state: StoreState) -> _Capture:
    topics: list[dict[str, Any]] = []
    tails: list[_Tail] = []
    detached: list[SegChunk | QsegChunk] = []
    segments: dict[int, list[int]] = {}
    for t in state.topics:
        log = t.log
        detached += log.drop_dead_chunks()  # type: ignore[arg-type]
        dead: list[list[int]] = []
        for c in log.chunks:
            dead += c.dead_ranges()  # type: ignore[attr-defined]
        firsts = [c.first_seq for c in log.chunks if not isinstance(c, WalChunk)]
        if t.config.durability != "ephemeral":
            for c in log.chunks:
                if isinstance(c, WalChunk):  # recovered WAL tail: sealed like the tail (WTAIL-4)
                    tail = _Tail(t.tid, c.first_seq, [], [], [], [], dead=c.live < c.count,
                                 source=c, dead_map=bytes(c.dead))  # fmt: skip
                    tails.append(tail)
        if t.config.durability != "ephemeral" and log.payloads and log.head >= log.base:
            any_dead = log.tail_dead() > 0
            # WTAIL-6: a loss in the tail (DUR-3, RTR-5) holds seqs no frame ever carried
            lost = bool(log.losses) and log.losses[-1][1] >= log.base
            if state.locate and not lost and not any(isinstance(c, WalChunk) for c in log.chunks):
                mem = _located(t, any_dead)
            else:
                mem = _in_memory(t, any_dead)
            if mem is not None:
                tails.append(mem)
                if any_dead:
                    dead += ranges([mem.first + i for i in mem.dead_at()])
        segments[t.tid] = firsts  # the tails' segments join them after the split (checkpoint)
        ceiling = state.ceilings.get(t.tid, log.head)
        jobs = t.jobs
        topics.append(
            {
                "id": t.tid,
                "name": t.name,
                "incarnation": t.tid,
                "config": t.config.to_dict(),
                "head": log.head,
                "evict_floor": log.evict_floor,
                "last_ts": log.last_ts,
                "ceiling": max(ceiling, log.head) if not state.clean else log.head,
                "losses": [[lo, hi] for lo, hi in log.losses],
                "segments": firsts,
                "dead": dead,
                "subscribers": [
                    {"name": n, "base": s.base} for n, s in sorted(t.progress.subs.items())
                ],
                "producers": dict(sorted(t.producers.items())),
                **_routers(state, t),
                **({"cold": list(state.cold[t.tid])} if state.cold.get(t.tid) else {}),
                "queue": {
                    "cursor": jobs.claim_cursor,
                    "next_lease_id": jobs.next_lease_id,
                    "deliveries": sorted([s, n] for s, n in jobs.deliveries.items()),
                    "delayed": sorted([s, r] for s, r in jobs.delayed.items()),
                    "returned": sorted(jobs.free),
                },
            }
        )
    positions = dict(state.wal)
    body = {
        # SNAP-3: older readers do not know routers (2), cold segments (3, TIER-5)
        "version": 3 if any(state.cold.values()) else 2 if state.routers else 1,
        "store_id": state.store_id.hex(),
        "next_topic_id": state.incarnations + 1,
        "incarnations": state.incarnations,
        "clean": state.clean,
        "wal": {
            "shards": len(positions),
            "replay_from": {k: [g, o] for k, (g, o) in positions.items()},
            "wal_durable": True,
        },
        "topics": topics,
    }
    return _Capture(body, tails, detached, list(state.dropped), positions, segments)


def _in_memory(t: EngineTopic, any_dead: bool) -> _Tail | None:
    """Under the lock: the tail of ``t`` as copies of its lists (references, no payload
    copied). A dead prefix is not sealed: no segment names those seqs, and sealing the chunk
    after it cuts them from the tail too (TopicLog.seal). An all-dead tail writes no file at
    all (after a subscriber trimmed everything, say): None."""
    first, payloads, tss, tags, nodes = t.log.tail_slice(t.log.head)
    k = min(t.log.dead_prefix, len(payloads)) if any_dead else 0
    if k >= len(payloads):
        return None
    if k:  # copies of the copies: only when a dead prefix is cut (under the lock)
        payloads, tss, tags, nodes = payloads[k:], tss[k:], tags[k:], nodes[k:]
    bundles = t.config.payload == "bundles"
    return _Tail(t.tid, first + k, payloads, tss, tags, nodes, bundles, any_dead)


def _located(t: EngineTopic, any_dead: bool) -> _Tail | None:
    """Under the lock: the tail of ``t`` without its records (WTAIL-6), to be sealed from
    the WAL: its first live seq, its head and its dead slots after the dead prefix (a C-level
    scan from the first live slot, only when it has any: a subscriber's trim leaves a prefix
    of up to half the tail, which is no work here). The dead prefix is left out as
    ``_in_memory`` leaves it."""
    log = t.log
    n = log.head - log.base + 1
    k = min(log.dead_prefix, n) if any_dead else 0
    if k >= n:
        return None
    at = [i - k for i in dead_slots(log.payloads, k) if i < n] if any_dead else []
    bundles = t.config.payload == "bundles"
    tail = _Tail(t.tid, log.base + k, [], [], [], [], bundles, bool(k or at), last=log.head)
    tail.at = at
    return tail


def _routers(state: StoreState, t: EngineTopic) -> dict[str, Any]:
    """SNAP-3: the routers into ``t`` (RTR-10: a router's config and cursor belong to its
    dest); no key at all for a topic no router feeds."""
    if not t.cursors:
        return {}
    return {
        "routers": {
            name: {"config": state.routers[name].to_dict(), "cursor": cursor}
            for name, cursor in sorted(t.cursors.items())
        }
    }


def _split(tail: _Tail, max_records: int, max_bytes: int) -> list[tuple[int, int]]:
    """The tail cut into segments of at most ``max_records`` records and ``max_bytes`` bytes
    of frames (segment_max_records, segment_max_bytes; a record larger than that gets a
    segment of its own). Work per segment, not per record: the cuts are binary searches over
    the running total of record sizes."""
    sizes = tail.sizes()
    n = len(sizes)
    overhead = segfmt.RECORD_OVERHEAD
    out: list[tuple[int, int]] = []
    start = 0
    while start < n:  # the longest run from start within both limits, at least one record
        end = min(n, start + max_records)
        if sum(sizes[start:end]) + overhead * (end - start) > max_bytes:
            # total[i]: payload bytes of the slots from start before start + i; the size grows
            # strictly with the end: binary search it
            total = list(accumulate(sizes[start:end], initial=0))
            lo, hi = 1, end - start
            while lo < hi:
                mid = (lo + hi + 1) // 2
                if total[mid] + overhead * mid <= max_bytes:
                    lo = mid
                else:
                    hi = mid - 1
            end = start + lo
        out.append((tail.first + start, end - start))
        start = end
    return out


def _write_segments(b: SegmentPort, tail: _Tail) -> None:
    directory = topic_dir(b.root, tail.tid)
    make_dirs(b.fs, directory)
    for first, count in tail.splits:
        lo = first - tail.first
        cols = tail.columns(lo, lo + count)
        chunk: SegChunk | QsegChunk | None = None
        if tail.bundles:
            chunk = _write_qseg(b, directory, tail.tid, cols, first)
        dead_in = tail.source is not None and tail.dead_map.find(1, lo, lo + count) >= 0
        if chunk is None:
            lens = tail.lens
            if tail.source is not None:  # its payloads may be RunPieces: lengths are needed
                lens = None if dead_in else cast("array[int]", tail.sizes())
            if lens is not None and (lo, count) != (0, len(lens)):
                lens = lens[lo : lo + count]
            dead = dead_in if tail.source is not None else tail.dead
            chunk = _write_plain(b, directory, tail.tid, cols, first, lens, dead)
        if dead_in:
            for i, p in enumerate(cols[0]):
                if p is None:
                    chunk.kill(i)
        at = tail.dead_at()
        for i in at[bisect_left(at, lo) : bisect_left(at, lo + count)]:
            chunk.kill(i - lo)
        tail.chunks.append(chunk)
    b.fs.fsync_dir(directory)


def _write_plain(
    b: SegmentPort,
    directory: str,
    tid: int,
    cols: _Columns,
    first: int,
    lens: array[int] | None,
    dead: bool,
) -> SegChunk:
    """A ``.data`` + ``.idx`` pair (SEG-1..SEG-7), encoded column-wise (format/seal.py). A slot
    removed before sealing (``dead``: there may be one) is an empty placeholder, dead in the
    snapshot. The .data is written piece by piece as it is built (``build_indexed``' sink),
    the .idx after it: a crash or a refusal part way leaves a file no snapshot names, as a
    crash in a whole write would."""
    _remove_stale(b, os.path.join(directory, qseg_name(first)))
    data_path = os.path.join(directory, segfmt.data_name(first))
    h = b.fs.open(data_path)
    try:
        h.truncate(0)
        at = 0
        pace = Pacer(h, b.write_out_bytes)  # SEG-20

        def sink(pieces: list[bytes]) -> None:
            nonlocal at
            write_parts(h, pieces, at)
            at += sum(map(len, pieces))
            pace.wrote(at)

        _, idx, index = build_indexed(tid, first, *cols, dead=dead, lens=lens, sink=sink)
        h.fdatasync()
    finally:
        h.close()
    h = b.fs.open(os.path.join(directory, segfmt.idx_name(first)))
    try:
        h.truncate(0)
        h.pwrite(idx, 0)
        h.fdatasync()
    finally:
        h.close()
    # the index decoded from the columns the .idx was made of, not by parsing it again
    return SegChunk(data_path, b.fs.open_read(data_path), index)


def _write_qseg(
    b: SegmentPort, directory: str, tid: int, cols: _Columns, first: int
) -> QsegChunk | None:
    """A Quiver segment (QSEG-1..QSEG-11): written to ``.tmp``, made read-only (0440,
    QSEG-10), fsynced, renamed into place (the directory is fsynced by the caller before the
    snapshot naming it). None when a payload cannot be sealed byte-exactly
    (QSEG-9): the caller seals that segment in the plain format instead."""
    from .format import qseg as qsegfmt  # pyarrow: only bundle topics need it
    from .qchunk import QsegChunk

    payloads, tss, tags, nodes = cols
    try:
        content = qsegfmt.build_qseg(payloads, first, tss=tss, tags=tags, nodes=nodes)
    except (BadArgument, Corrupt) as exc:
        b.warn(f"topic {tid:016x} seqs from {first}: sealed plain ({exc})")
        return None
    path = os.path.join(directory, qseg_name(first))
    tmp = path + ".tmp"
    _remove_stale(b, tmp)  # read-only leftover of an interrupted checkpoint
    h = b.fs.open(tmp)
    try:
        write_paced(h, content, b.write_out_bytes)  # SEG-20
        b.fs.chmod(tmp, 0o440)
        h.fsync()  # data and mode
    finally:
        h.close()
    for stale in (segfmt.data_name(first), segfmt.idx_name(first)):
        _remove_stale(b, os.path.join(directory, stale))
    b.fs.rename(tmp, path)
    return QsegChunk(path, b.fs.open_read(path), first)


def _remove_stale(b: SegmentPort, path: str) -> None:
    """A file for seqs the current snapshot does not name (they are above every sealed
    segment): the leftover of a checkpoint a crash interrupted. Safe to delete."""
    if b.fs.exists(path):
        b.fs.unlink(path)


def write_snapshot(fs: FS, root: str, n: int, body: dict[str, Any]) -> None:
    """Snapshot ``n`` and its mirror (SNAP-5), each written atomically (LAY-3), one directory
    fsync for both: one damaged copy leaves the other."""
    meta = os.path.join(root, "meta")
    data = snapfmt.encode_snapshot(n, body)
    for name in (snapfmt.file_name(n), snapfmt.mirror_name(n)):
        path = os.path.join(meta, name)
        write_whole(fs, path + ".tmp", data)
        fs.rename(path + ".tmp", path)
    fs.fsync_dir(meta)


def _retire(b: CheckpointPort, n: int, cap: _Capture) -> None:
    b.retire_wal(n, cap.positions)
    meta = os.path.join(b.root, "meta")
    older = [name for old, names in snapfmt.copies(b.fs.listdir(meta)).items() if old < n
             for name in names]  # fmt: skip
    for name in older + [name for name in b.fs.listdir(meta) if name.endswith(".tmp")]:
        b.fs.unlink(os.path.join(meta, name))
    for chunk in cap.detached:
        chunk.close()
        for path in chunk.files():
            if b.fs.exists(path):
                b.fs.unlink(path)
    for t in cap.dropped:
        for c in t.log.chunks:
            c.close()  # type: ignore[attr-defined]
        directory = topic_dir(b.root, t.tid)
        if b.fs.exists(directory):
            for name in b.fs.listdir(directory):
                b.fs.unlink(os.path.join(directory, name))
            b.fs.rmdir(directory)
    b.fs.fsync_dir(meta)
