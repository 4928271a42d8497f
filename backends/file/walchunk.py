"""The recovered WAL tail served from the mapped WAL files (spec/FORMATS-wal-tail.md WTAIL).

After a crash, the records replay finds beyond the last checkpoint are not sealed yet. Instead
of one Python ``bytes`` per record, replay keeps, per *run* of records (an APPEND_BATCH frame, a
single APPEND frame, or the part of one above the snapshot's head), where its payloads lie in the
mapped WAL file: a few list entries per frame, nothing per record. A ``WalChunk`` is such a list
of runs of one topic in one WAL file, with consecutive seqs; it answers the engine's
``SealedChunk`` questions, so reads, removals and the tag index work on it as on a sealed
segment. A record's ``bytes`` is made only when a read returns it, and the next checkpoint seals
the chunk's records into segments (``columns``), after which the chunk is dropped.

Only the writer maps WAL files (it holds the lock; after recovery nothing writes to the files it
replayed: new frames go to a new file, WAL-10, and a file is truncated only past its last valid
op). Retiring such a file unlinks it, which leaves the map readable, and happens only after the
checkpoint that sealed its records. Read-only views never map a WAL file (XPR-1) and keep
replaying into memory.
"""

from __future__ import annotations

import gc
import mmap
import struct
from array import array
from bisect import bisect_right
from collections.abc import Iterator, Sequence
from itertools import accumulate, repeat
from typing import Any, NamedTuple, cast

import xxhash

from tidelog.errors import Corrupt
from tidelog.fsio import Handle, whole_object
from tidelog.records import Item, Record

from .chunk import DeadSlots, extend_records, live_pieces
from .format import wal as walfmt

__all__ = ["WalFile", "WalChunk", "RunPieces", "FrameRun", "frame_run"]

_U32 = struct.Struct("<I")
_U64 = struct.Struct("<Q")
_ENDS_CACHED = 64  # runs whose payload end offsets are kept (recomputed on demand otherwise)


class FrameRun(NamedTuple):
    """Records ``first .. first + n - 1`` of a record frame, where they lie in its WAL file:
    ``n`` payloads of ``nbytes`` in all from ``data_at``; ``lens_at``: the first one's u32
    length in an APPEND_BATCH frame, -1 for an APPEND frame (``WalChunk.add_run``)."""

    first: int
    n: int
    data_at: int
    lens_at: int
    nbytes: int


def frame_run(wal: WalFile, f: walfmt.Frame, nxt: int) -> FrameRun | None:
    """The records of APPEND or APPEND_BATCH frame ``f`` (checksum-verified by the scan) from
    seq ``nxt`` on: the frame's first ``nxt - f.seq`` records cut when it starts below, None
    when it ends below. The caller checks that the run starts at ``nxt`` (no gap)."""
    data = f.data
    data_at = f.offset + f.length - 8 - len(data)
    if f.type == walfmt.FrameType.APPEND:
        n, lens_at, nbytes = 1, -1, len(data)
        lens: Sequence[int] = (nbytes,)
    else:
        n, lens = walfmt.append_batch_lengths(data, f"{wal.path}: WAL frame at offset {f.offset}")
        lens_at, data_at, nbytes = data_at + 4, data_at + 4 + 4 * n, len(data) - 4 - 4 * n
    first = f.seq
    if first + n - 1 < nxt:
        return None
    if first < nxt:  # the run starts inside this frame
        k = nxt - first
        skipped = sum(lens[:k])
        data_at, lens_at, nbytes = data_at + skipped, lens_at + 4 * k, nbytes - skipped
        n, first = n - k, nxt
    return FrameRun(first, n, data_at, lens_at, nbytes)


class WalFile:
    """One mapped WAL file, shared by the chunks that serve records from it; the map and the
    handle go when the last of them is closed."""

    def __init__(self, path: str, handle: Handle, data: memoryview, seed: int = 0) -> None:
        self.path = path
        self.handle = handle
        self.data = data
        self.seed = seed  # its frames' checksum seed (WAL-15)
        whole = whole_object(data)  # its slices are bytes in one step
        self.src: Any = data if whole is None else whole
        self.copy = whole is None
        self.refs = 0

    def drop_resident(self) -> None:
        """WTAIL-5: replay touched (and verified) every page up to the log's end; they stay in
        the page cache, but this process's resident set need not hold them: a read faults
        back in the few it returns."""
        if isinstance(self.src, mmap.mmap) and hasattr(mmap, "MADV_DONTNEED"):
            self.src.madvise(mmap.MADV_DONTNEED, 0, len(self.src))

    def release(self) -> None:
        """One chunk fewer uses the map (``refs == 0`` already: none ever did)."""
        self.refs -= 1
        if self.refs <= 0:
            self.data.release()
            self.handle.close()


class WalChunk(DeadSlots):
    """Records ``first_seq ..`` of one topic, all in one WAL file, located run by run."""

    def __init__(self, wal: WalFile, first_seq: int) -> None:
        self.wal = wal
        wal.refs += 1
        self.first_seq = first_seq
        self.count = 0
        self.nbytes = 0
        self.dead = bytearray()
        self.live = 0
        self._first = 0
        # per run: first slot, record count, offset of the first payload, offset of its u32
        # length (-1: a single APPEND frame), the frame's offset and size, ts, tag, node
        self.starts: list[int] = []
        self.ns: list[int] = []
        self.data_at: list[int] = []
        self.lens_at: list[int] = []
        self.frame_at: list[int] = []
        self.frame_len: list[int] = []
        self.run_bytes: list[int] = []
        self.tss: list[int] = []
        self.tags: list[str | None] = []
        self.nodes: list[str | None] = []
        self._ends: dict[int, array[int]] = {}
        self.closed = False

    # -- building (replay) -------------------------------------------------------------------
    def add_run(self, frame: walfmt.Frame, run: FrameRun) -> None:
        """Records ``run`` of ``frame`` (``frame_run``) as the chunk's next slots."""
        n, nbytes = run.n, run.nbytes
        self.starts.append(self.count)
        self.ns.append(n)
        self.data_at.append(run.data_at)
        self.lens_at.append(run.lens_at)
        self.frame_at.append(frame.offset)
        self.frame_len.append(frame.length)
        self.run_bytes.append(nbytes)
        self.tss.append(frame.ts)
        self.tags.append(frame.tag)
        self.nodes.append(frame.node)
        self.count += n
        self.live += n
        self.nbytes += nbytes
        self.dead.extend(bytes(n))

    # -- locating ----------------------------------------------------------------------------
    def _run_of(self, i: int) -> int:
        return bisect_right(self.starts, i) - 1

    def _lens(self, r: int) -> array[int]:
        """Payload lengths of run ``r`` (one C-level copy of the frame's length table)."""
        at = self.lens_at[r]
        if at < 0:
            return array("I", (self.run_bytes[r],))
        lens = array("I")
        lens.frombytes(self.wal.data[at : at + 4 * self.ns[r]])
        if walfmt._BIG_ENDIAN:
            lens.byteswap()
        return lens

    def _run_ends(self, r: int, cache: bool = True) -> array[int]:
        """Offsets where each payload of run ``r`` ends, with the run's first payload start in
        front (``ends[k]:ends[k+1]`` is record k). Reads (under the engine lock) keep a few
        recently used runs cached; the checkpoint, which reads without that lock, does not
        touch the cache (``cache=False``)."""
        ends = self._ends.get(r)
        if ends is None:
            ends = array("q", accumulate(self._lens(r), initial=self.data_at[r]))
            if cache:
                if len(self._ends) >= _ENDS_CACHED:
                    del self._ends[next(iter(self._ends))]
                self._ends[r] = ends
        return ends

    def _slices(self, r: int, a: int, b: int, cache: bool = True) -> Iterator[slice]:
        """Slices of the file holding the payloads of run ``r``'s records ``a..b`` (indexes
        within the run)."""
        if self.lens_at[r] < 0:
            start = self.data_at[r]
            return iter((slice(start, start + self.run_bytes[r]),))
        lens = self._lens(r)
        n = b - a + 1
        size = lens[a]
        if lens[a : b + 1].count(size) == n:  # equal sizes: a stride, no per-record sums
            start = self.data_at[r] + sum(lens[:a])
            if not size:
                return repeat(slice(start, start), n)
            stop = start + size * n
            return map(slice, range(start, stop, size), range(start + size, stop + 1, size))
        ends = self._run_ends(r, cache)
        return map(slice, ends[a : b + 1], ends[a + 1 : b + 2])

    def _payloads(self, r: int, a: int, b: int, cache: bool = True) -> Iterator[Any]:
        got: Iterator[Any] = map(self.wal.src.__getitem__, self._slices(r, a, b, cache))
        return map(bytes, got) if self.wal.copy else got

    # -- SealedChunk -------------------------------------------------------------------------
    def ts(self, i: int) -> int:
        return self.tss[self._run_of(i)]

    def node(self, i: int) -> str | None:
        return self.nodes[self._run_of(i)]

    def tag(self, i: int) -> str | None:
        return self.tags[self._run_of(i)]

    def size(self, i: int) -> int:
        r = self._run_of(i)
        k = i - self.starts[r]
        if self.lens_at[r] < 0:
            return self.run_bytes[r]
        ends = self._run_ends(r)  # cached: eviction and removal ask record after record
        return ends[k + 1] - ends[k]

    def record(self, i: int) -> Record:
        r = self._run_of(i)
        k = i - self.starts[r]
        (payload,) = self._payloads(r, k, k)
        return Record(self.first_seq + i, self.tss[r], self.tags[r], self.nodes[r], payload)

    def tagged(self) -> Iterator[tuple[int, str]]:
        for r, tag in enumerate(self.tags):
            if tag is not None:
                for i in range(self.starts[r], self.starts[r] + self.ns[r]):
                    if not self.dead[i]:
                        yield i, tag

    def records_into(
        self, items: list[Item], i0: int, i1: int, limit: int, exclude: str | None
    ) -> int | None:
        """As ``SegChunk.records_into``: the live records of slots i0..i1 appended to
        ``items`` until it holds ``limit`` (None when the range was done, else the last seq
        examined), built piece by piece (live slots of one run) with C-level maps."""
        room = limit - len(items)
        if room <= 0:
            return self.first_seq + i0 - 1
        pieces, stopped = live_pieces(
            self.dead, self.starts, self.nodes, self.count, self.first_seq, i0, i1, room, exclude
        )
        first = self.first_seq
        paused = gc.isenabled()  # as in SegChunk.records_into: no collections mid-batch
        if paused:
            gc.disable()
        try:
            for a, b, r in pieces:
                start = self.starts[r]
                seqs = range(first + a, first + b + 1)
                payloads = self._payloads(r, a - start, b - start)
                tss = repeat(self.tss[r])
                extend_records(items, seqs, tss, self.tags[r], self.nodes[r], payloads)
        finally:
            if paused:
                gc.enable()
        return stopped

    # -- sealing (checkpoint) ----------------------------------------------------------------
    def sizes(self) -> list[int]:
        """Every slot's payload size, dead ones included."""
        out: list[int] = []
        for r in range(len(self.starts)):
            out += self._lens(r)
        return out

    def columns(
        self, lo: int, hi: int, dead: bytes | bytearray, *, pieces: bool = False
    ) -> tuple[Sequence[bytes | None], list[int], list[str | None], list[str | None]]:
        """(payloads, tss, tags, nodes) of slots lo..hi-1 for sealing, None for the slots
        ``dead`` marks. Each frame they come from is checked against its XXH3-64 again first
        (WTAIL-3): a segment never gets a fresh checksum over bytes that changed since replay.
        ``pieces``: when no slot of the range is dead, the payloads are ``RunPieces`` (for
        ``seal.build_indexed``, which is given their lengths): no ``bytes`` per record."""
        whole = pieces and dead.find(1, lo, hi) < 0
        payloads: list[bytes | None] = []
        tss: list[int] = []
        tags: list[str | None] = []
        nodes: list[str | None] = []
        r = self._run_of(lo)
        while r < len(self.starts) and self.starts[r] < hi:
            start = self.starts[r]
            a, b = max(lo, start), min(hi, start + self.ns[r]) - 1
            self._verify(r)
            if not whole:
                payloads += self._payloads(r, a - start, b - start, cache=False)
            n = b - a + 1
            tss += [self.tss[r]] * n
            tags += [self.tags[r]] * n
            nodes += [self.nodes[r]] * n
            r += 1
        if whole:  # what build_indexed reads of it: len() and forward slices it joins
            return cast("list[bytes | None]", RunPieces(self, lo, hi)), tss, tags, nodes
        if dead.find(1, lo, hi) >= 0:
            for i in range(lo, hi):
                if dead[i]:
                    k = i - lo
                    payloads[k] = tags[k] = nodes[k] = None
        return payloads, tss, tags, nodes

    def _verify(self, r: int) -> None:
        at, length, src = self.frame_at[r], self.frame_len[r], self.wal.src
        cs_at = at + length - 8
        stored = _U64.unpack_from(src, cs_at)[0]
        if xxhash.xxh3_64_intdigest(src[at + 4 : cs_at], self.wal.seed) != stored:
            raise Corrupt(
                f"{self.wal.path}: WAL frame at offset {at} no longer matches its XXH3-64 "
                "(it did at recovery): the file changed under the store (WTAIL-3)"
            )

    def files(self) -> list[str]:
        """No files of its own: WAL files are retired by checkpoint position."""
        return []

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self.wal.release()


class RunPieces:
    """The payloads of slots ``lo .. hi - 1`` of a ``WalChunk`` as ``seal.build_indexed``
    reads them: its length, and slices taken in order, each a list of one ``bytes`` per run
    the slice crosses, holding that run's payloads back to back (an APPEND_BATCH frame keeps
    them so, WAL-14, as a segment's run frame does, SEG-15). Joined, they are the slice's
    payloads: sealing makes no object per record. The frames were verified by ``columns``."""

    def __init__(self, chunk: WalChunk, lo: int, hi: int) -> None:
        self.chunk = chunk
        self.lo = lo
        self.n = hi - lo
        self._at = (-1, 0)  # (chunk slot, its payload's file offset) where the last slice ended
        self._lens: tuple[int, array[int]] = (-1, array("I"))  # (run, its lengths)

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, key: slice) -> list[bytes]:
        start, stop, step = key.indices(self.n)
        if step != 1 or start >= stop:
            raise IndexError("RunPieces: only forward slices, as build_indexed takes")
        c = self.chunk
        i, end = self.lo + start, self.lo + stop
        out: list[bytes] = []
        r = c._run_of(i)
        while i < end:
            first = c.starts[r]
            stop_r = first + c.ns[r]
            last = min(end, stop_r)  # slots i .. last-1, of run r
            if self._lens[0] != r:
                self._lens = (r, c._lens(r))  # one copy of a run's length table per run
            lens = self._lens[1]
            at = self._at[1] if self._at[0] == i else c.data_at[r] + sum(lens[: i - first])
            size = sum(lens[i - first : last - first])
            piece = c.wal.src[at : at + size]
            out.append(bytes(piece) if c.wal.copy else piece)
            i = last
            self._at = (i, at + size) if i < stop_r else (-1, 0)
            r += 1
        return out
