"""A sealed segment as a ``SealedChunk`` of the engine's topic log: mmap'd ``.data`` plus the
decoded ``.idx`` columns and label runs, and an in-memory dead-slot map (``DeadSlots``, shared
with the ``.qseg`` chunks of bundle topics, qchunk.py).

Every read verifies the records it returns, on that read (spec/FORMATS-seg2.md SEG-12): by
block (one XXH3-64 per ~64 KiB of ``.data``, version-2 index) or by frame (SEG-2), whichever
costs less. A mismatch in a sealed file is corruption and raises ``Corrupt`` naming the file and
the frame's offset; a damaged record is never skipped and never returned as data. Tags and nodes
come from the index's label runs (SEG-11), so neither opening a store nor reading decodes them
record by record.
"""

from __future__ import annotations

import contextlib
import gc
import mmap
import re
import struct
from bisect import bisect_right
from collections.abc import Iterable, Iterator, Sequence
from itertools import chain, repeat
from operator import add, itemgetter, sub
from typing import Any

import xxhash

from tidelog.errors import Corrupt
from tidelog.fsio import Handle, whole_object
from tidelog.records import Item, Record

from .format import segment as segfmt
from .format.segment import LabelRuns, SegmentIndex

__all__ = ["DeadSlots", "SegChunk", "extend_records", "labelled", "live_pieces"]

_LABELED = segfmt.HAS_TAG | segfmt.HAS_NODE
_FRAME = segfmt._RECORD  # frame_len, flags, seq, ts, node_len, tag_len, data_len
_FIXED = segfmt._LEN_FIXED
_HEAD = segfmt.RECORD_HEADER_SIZE
_U64 = struct.Struct("<Q")
#: SEG-12's choice: checking one frame costs about as much as hashing this many bytes (a
#: Python-level header decode + checks + XXH3 call, ~0.5 µs, vs XXH3 at tens of GB/s), so a
#: block is hashed unless the read takes only a few of its records.
_PER_FRAME_BYTES = 8192
_tuple_new: Any = tuple.__new__  # Record (a NamedTuple) without its Python-level __new__
_first = itemgetter(0)
_iter_unpack = struct.iter_unpack
_WHOLE: dict[tuple[int, int], Any] = {}


def _uniform(column: Any, a: int, e: int) -> bool:
    """Whether ``column[a..e]`` (an index column) all equal ``column[a]``: one byte compare
    (``array.count`` makes an int object per item)."""
    part = column[a : e + 1]
    return bool(part.tobytes() == part[:1].tobytes() * len(part))


def _whole_frame(size: int, n: int) -> Any:
    """``unpack_from`` of a struct of ``n`` payloads of ``size`` bytes: a whole run frame of
    equal payloads in one C call (~10 ns per payload, vs ~30 with ``iter_unpack``). Frames of
    one topic mostly share (size, n), so the few shapes are compiled once and kept."""
    got = _WHOLE.get((size, n))
    if got is None:
        if len(_WHOLE) >= 64:
            _WHOLE.clear()
        got = _WHOLE[(size, n)] = struct.Struct(f"{size}s" * n).unpack_from
    return got


_NONZERO = re.compile(b"[^\x00]")


def labelled(index: SegmentIndex, mask: int = _LABELED) -> list[int]:
    """Slots whose flags have a bit of ``mask`` (found by a C-speed scan: most segments hold
    no labelled record at all, and opening a store must not loop over every record)."""
    flags = index.flags.tobytes()
    return [m.start() for m in _NONZERO.finditer(flags) if flags[m.start()] & mask]


def live_pieces(
    dead: bytearray,
    firsts: Sequence[int],
    nodes: Sequence[str | None],
    count: int,
    first_seq: int,
    i0: int,
    i1: int,
    room: int,
    exclude: str | None,
) -> tuple[list[tuple[int, int, int]], int | None]:
    """Live slot ranges ``(a, b, run)`` in i0..i1 of a chunk whose runs start at slots
    ``firsts``, each inside one run, at most ``room`` slots in all, skipping runs whose node is
    ``exclude``; and where it stopped (the last seq taken if ``room`` ran out before i1, else
    None). Dead slots are skipped with ``bytearray.find`` (C speed)."""
    out: list[tuple[int, int, int]] = []
    r = bisect_right(firsts, i0) - 1
    i = i0
    while i <= i1:
        end = min(firsts[r + 1] - 1 if r + 1 < len(firsts) else count - 1, i1)
        if exclude is None or nodes[r] != exclude:
            j = i
            while j <= end:
                if dead[j]:
                    j = dead.find(0, j, end + 1)
                    if j < 0:
                        break
                d = dead.find(1, j, end + 1)
                e = end if d < 0 else d - 1
                if e - j + 1 >= room:
                    e = j + room - 1
                    out.append((j, e, r))
                    return out, (None if e >= i1 else first_seq + e)
                out.append((j, e, r))
                room -= e - j + 1
                j = e + 1
        i = end + 1
        r += 1
    return out, None


def extend_records(
    items: list[Item],
    seqs: range,
    tss: Iterable[int],
    tag: str | None,
    node: str | None,
    payloads: Iterable[Any],
) -> None:
    """Records of one label run appended to ``items`` with C-level maps (no bytecode runs per
    record)."""
    items.extend(
        map(_tuple_new, repeat(Record), zip(seqs, tss, repeat(tag), repeat(node), payloads))
    )


class DeadSlots:
    """The in-memory dead map of a sealed chunk: which of its ``count`` slots were removed since
    it was written (the file itself never changes). Subclasses provide ``size(i)``."""

    first_seq: int
    count: int
    nbytes: int

    def _init_dead(self) -> None:
        self.dead = bytearray(self.count)
        self.live = self.count
        self._first = 0

    def size(self, i: int) -> int:
        raise NotImplementedError

    def tagged(self) -> Iterator[tuple[int, str]]:
        """(slot, tag) of every live record that has a tag."""
        raise NotImplementedError

    def tag_runs(self) -> Iterator[tuple[str, int, int]]:
        """(tag, lo, hi): the live tagged records as inclusive seq ranges of one tag each, in
        seq order (recovery's tag index)."""
        run: list[Any] = []  # [tag, lo, hi]
        for i, tag in self.tagged():
            seq = self.first_seq + i
            if run and (run[0], run[2] + 1) == (tag, seq):
                run[2] = seq
                continue
            if run:
                yield run[0], run[1], run[2]
            run = [tag, seq, seq]
        if run:
            yield run[0], run[1], run[2]

    def is_live(self, i: int) -> bool:
        return not self.dead[i]

    def first_live(self) -> int:
        i = self._first
        if self.dead[i : i + 1] == b"\x01":
            found = self.dead.find(0, i)
            i = self.count if found < 0 else found
            self._first = i
        return i

    def kill(self, i: int) -> int:
        if self.dead[i]:
            return 0
        self.dead[i] = 1
        self.live -= 1
        size = self.size(i)
        self.nbytes -= size
        return size

    def mark_dead(self, lo: int, hi: int) -> None:
        """Seqs lo..hi (clipped to this chunk) were removed before the last snapshot."""
        for seq in range(max(lo, self.first_seq), min(hi, self.first_seq + self.count - 1) + 1):
            self.kill(seq - self.first_seq)

    def dead_ranges(self) -> list[list[int]]:
        """Dead seqs as [[lo, hi], ...] runs, found with bytearray.find (C speed)."""
        out: list[list[int]] = []
        i, n, d = 0, self.count, self.dead
        while i < n:
            start = d.find(1, i)
            if start < 0:
                break
            end = d.find(0, start)
            end = n if end < 0 else end
            out.append([self.first_seq + start, self.first_seq + end - 1])
            i = end
        return out


class SegChunk(DeadSlots):
    def __init__(self, path: str, handle: Handle, index: SegmentIndex) -> None:
        self.path = path
        self.index = index
        self.data = handle.map()
        # the map outlives the handle (fsio Handle.map): one descriptor per segment for the
        # .data map and one for the .idx map until a read decodes it, as many as before
        handle.close()
        whole = whole_object(self.data)  # its slices are bytes in one step
        self._src: Any = self.data if whole is None else whole
        self._copy = whole is None  # memoryview slices must still become bytes
        self.first_seq = index.first_seq
        self.count = index.count
        # .idx version 3 describes a .data of run frames (FORMATS-seg3.md): entries point at
        # payloads, blocks are the frames, and a read verifies by run (SEG-19)
        self.by_run = index.version == segfmt.IDX_VERSION_RUNS
        try:
            self._check_data()
            self.runs = index.runs if index.runs is not None else self._runs_from_frames()
        except Corrupt:
            self.close()
            raise
        self._init_dead()
        self._measure()

    def _measure(self) -> None:
        """``nbytes``: the payload bytes of the segment, from its index and label runs alone
        (a cold chunk, coldchunk.py, measures itself before its ``.data`` is fetched)."""
        index, runs = self.index, self.runs
        if self.by_run:  # per frame: header, labels, checksum; per record: ts and length
            label_bytes = 0
            if any(runs.nls) or any(runs.tls):  # mostly none: no per-frame work at open
                frame_runs = map(runs.run_of, index.block_slots)
                label_bytes = sum(runs.nls[r] + runs.tls[r] for r in frame_runs)
            overhead = (segfmt.RUN_HEADER_SIZE + 8) * len(index.block_slots) + 12 * self.count
        else:
            bounds = [*runs.firsts, self.count]
            label_bytes = sum(
                (b - a) * (nl + tl) for a, b, nl, tl in zip(bounds, bounds[1:], runs.nls, runs.tls)
            )
            overhead = segfmt.RECORD_OVERHEAD * index.count
        self.nbytes = index.data_size - segfmt.HEADER_SIZE - overhead - label_bytes

    def _check_data(self) -> None:
        """SEG-1 and SEG-12 at open: the .data header names this segment, and the file has
        exactly the size its index describes (SEG-3: frames fill it)."""
        try:
            header = segfmt.decode_data_header(self.data)
        except Corrupt as exc:
            raise Corrupt(f"{self.path}: {exc.message}") from None
        if (header.topic_id, header.first_seq) != (self.index.topic_id, self.first_seq):
            raise Corrupt(
                f"{self.path}: header says topic {header.topic_id:#x} from seq "
                f"{header.first_seq}, its .idx says {self.index.topic_id:#x} from "
                f"{self.first_seq} (SEG-1)"
            )
        if (header.version == segfmt.DATA_VERSION_RUNS) != self.by_run:
            raise Corrupt(
                f"{self.path}: .data version {header.version} with .idx version "
                f"{self.index.version} (SEG-17: .data 2 pairs with .idx 3 only)"
            )
        if len(self.data) != self.index.data_size:
            raise Corrupt(
                f"{self.path}: {len(self.data)} bytes, the index describes "
                f"{self.index.data_size} (SEG-3)"
            )

    def _runs_from_frames(self) -> LabelRuns:
        """A version-1 index has no label runs: decode the labelled frames (flags say which)
        and cut the runs the version-2 writer would have stored."""
        firsts: list[int] = []
        tags: list[str | None] = []
        nodes: list[str | None] = []

        def push(i: int, tag: str | None, node: str | None) -> None:
            if not firsts or (tags[-1], nodes[-1]) != (tag, node):
                firsts.append(i)
                tags.append(tag)
                nodes.append(node)

        nxt = 0
        for i in labelled(self.index):
            if i > nxt:
                push(nxt, None, None)
            _, _, tag, node, _ = self._frame(i)
            push(i, tag, node)
            nxt = i + 1
        if nxt < self.count:
            push(nxt, None, None)
        return LabelRuns(firsts, tags, nodes)

    # -- SealedChunk -------------------------------------------------------------------------
    def ts(self, i: int) -> int:
        return int(self.index.tss[i])

    def size(self, i: int) -> int:
        if self.by_run:
            return int(self.index.lengths[i])
        runs = self.runs
        r = runs.run_of(i)
        return int(self.index.lengths[i]) - segfmt.RECORD_OVERHEAD - runs.nls[r] - runs.tls[r]

    def node(self, i: int) -> str | None:
        return self.runs.nodes[self.runs.run_of(i)]

    def tag(self, i: int) -> str | None:
        return self.runs.tags[self.runs.run_of(i)]

    def tag_runs(self) -> Iterator[tuple[str, int, int]]:
        """Straight from the label runs, split around dead slots at C speed: no frame is
        decoded and nothing is done per record (SEG-11)."""
        runs, first, dead = self.runs, self.first_seq, self.dead
        bounds = [*runs.firsts, self.count]
        for tag, a, b in zip(runs.tags, bounds, bounds[1:], strict=False):
            if tag is None:
                continue
            i = a
            while i < b:
                if dead[i]:
                    i = dead.find(0, i, b)
                    if i < 0:
                        break
                d = dead.find(1, i, b)
                end = b if d < 0 else d
                yield tag, first + i, first + end - 1
                i = end

    def files(self) -> list[str]:
        """The files of this segment (deleted together once nothing in it is live)."""
        return [self.path, self.path[: -len(".data")] + ".idx"]

    def _frame(self, i: int) -> tuple[int, int, str | None, str | None, memoryview]:
        """Slot ``i``'s frame decoded and checked by itself (SEG-2, SEG-3)."""
        try:
            return segfmt.read_record(
                self.data,
                int(self.index.offsets[i]),
                int(self.index.lengths[i]),
                self.first_seq + i,
            )
        except Corrupt as exc:
            raise Corrupt(f"{self.path}: {exc.message}") from None

    def record(self, i: int) -> Record:
        """Slot ``i``, checked by frame (SEG-12): the frame itself, and its labels and ts
        against the index."""
        r = self.runs.run_of(i)
        if self.by_run:  # SEG-19: its whole run frame, then the record through its entry
            self._verify([(i, i, r)])
            items: list[Item] = []
            self._emit(items, i, i, r)
            return items[0]  # type: ignore[return-value]
        seq, ts, tag, node, payload = self._frame(i)
        if (tag, node, ts) != (self.runs.tags[r], self.runs.nodes[r], self.index.tss[i]):
            raise Corrupt(
                f"{self.path}: segment record at offset {self.index.offsets[i]}: its labels or "
                "ts differ from its .idx entry and label run (SEG-5, SEG-11)"
            )
        return Record(seq, ts, tag, node, bytes(payload))

    # -- the sequential read (SEG-12) ---------------------------------------------------------
    def records_into(
        self, items: list[Item], i0: int, i1: int, limit: int, exclude: str | None
    ) -> int | None:
        """Append the live records of slots i0..i1 to ``items`` until it holds ``limit``; None
        when the range was done, else the last seq examined. The slots to return are found
        first (live pieces of label runs), verified (by block or by frame), then turned into
        records piece by piece with C-level maps: no Python bytecode runs per record."""
        room = limit - len(items)
        if room <= 0:
            return self.first_seq + i0 - 1
        pieces, stopped = self._pieces(i0, i1, room, exclude)
        if pieces:
            self._verify(pieces)
        # Each Record is a GC-tracked tuple subclass (never untracked, unlike plain tuples):
        # building thousands triggers a collection every 700 and promotes the half-built batch
        # through the generations, ~40% of the read's time. Pausing the collector while they
        # are built leaves one collection of the batch afterwards: the same objects, seen once.
        # (The pause is a few ms; a gc.disable() by another thread inside it would be undone.)
        paused = gc.isenabled()
        if paused:
            gc.disable()
        try:
            for a, b, r in pieces:
                self._emit(items, a, b, r)
        finally:
            if paused:
                gc.enable()
        return stopped

    def verify_slots(self, i0: int, i1: int) -> list[tuple[int, int, int]]:
        """Verify the live slots i0..i1 as a read returning them does (SEG-12); the pieces
        ``(first slot, last slot, run)`` they form (for the columnar reader, fastread)."""
        pieces, _ = self._pieces(i0, i1, i1 - i0 + 1, None)
        if pieces:
            self._verify(pieces)
        return pieces

    def _pieces(
        self, i0: int, i1: int, room: int, exclude: str | None
    ) -> tuple[list[tuple[int, int, int]], int | None]:
        """Live slot ranges ``(a, b, run)`` in i0..i1, each inside one label run, at most
        ``room`` slots in all, skipping runs whose node is ``exclude``; and where it stopped
        (the last seq taken if ``room`` ran out before i1, else None)."""
        runs = self.runs
        return live_pieces(
            self.dead, runs.firsts, runs.nodes, self.count, self.first_seq, i0, i1, room, exclude
        )

    def _verify(self, pieces: list[tuple[int, int, int]]) -> None:
        """SEG-12: every slot of ``pieces`` checked on this read, block by block (hash the
        block, or check its requested frames when that is cheaper or the hash mismatches)."""
        index = self.index
        slots = index.block_slots
        if not slots:  # version 1: frames only
            self._check_frames(pieces, 0, self.count - 1)
            return
        offs, lens, hashes, bstarts = (
            index.offsets,
            index.lengths,
            index.block_hashes,
            (index.block_offsets),
        )
        a0, b1 = pieces[0][0], pieces[-1][1]
        digest, data = xxhash.xxh3_64_intdigest, self.data
        k = bisect_right(slots, a0) - 1
        while k < len(slots) and slots[k] <= b1:
            nxt, end = index.block_end(k)
            lo, hi = max(slots[k], a0), min(nxt - 1, b1)
            start = bstarts[k]
            if self.by_run:  # a run frame has no smaller unit to check (SEG-19)
                if digest(data[start:end]) != hashes[k]:
                    self._bad_run(k)
                k += 1
                continue
            wanted = offs[hi] + lens[hi] - offs[lo] + _PER_FRAME_BYTES * (hi - lo + 1)
            if end - start > wanted or digest(data[start:end]) != hashes[k]:
                self._check_frames(pieces, lo, hi)
            k += 1

    def _bad_run(self, k: int) -> None:
        """Block ``k`` (run frame ``k``) failed its check: raise ``Corrupt`` naming the file, the
        frame's offset and what is wrong (SEG-15/16 from the frame itself, else SEG-17)."""
        index = self.index
        start = int(index.block_offsets[k])
        try:
            segfmt.read_run(self.data, start, self.first_seq + int(index.block_slots[k]))
        except Corrupt as exc:
            raise Corrupt(f"{self.path}: {exc.message}") from None
        raise Corrupt(
            f"{self.path}: run frame at offset {start}: its bytes differ from block {k} of the "
            ".idx (SEG-17)"
        )

    def _check_frames(self, pieces: list[tuple[int, int, int]], lo: int, hi: int) -> None:
        """Check by frame (SEG-2, SEG-3, and against the entry and run: SEG-5, SEG-11) every
        slot of ``pieces`` within lo..hi; the first bad one raises its precise ``Corrupt``."""
        index, runs, src = self.index, self.runs, self._src
        offs, lens, tss = index.offsets, index.lengths, index.tss
        unpack, trailer, digest = _FRAME.unpack_from, _U64.unpack_from, xxhash.xxh3_64_intdigest
        size, first, lowest = len(self.data), self.first_seq, segfmt.HEADER_SIZE
        for a, b, r in pieces:
            a, b = max(a, lo), min(b, hi)
            if a > b:
                continue
            nl, tl, fl_run, label = runs.nls[r], runs.tls[r], runs.flags[r], runs.labels[r]
            at = _HEAD + nl + tl
            for i in range(a, b + 1):
                off = offs[i]
                end = off + lens[i]
                if off >= lowest and end <= size and end - off >= _FIXED + 4:
                    frame_len, fl, seq, ts, n_l, t_l, dl = unpack(src, off)
                    if (
                        frame_len + 4 == end - off
                        and fl == fl_run
                        and n_l == nl
                        and t_l == tl
                        and _FIXED + nl + tl + dl == frame_len
                        and seq == first + i
                        and ts == tss[i]
                        and digest(src[off + 4 : end - 8]) == trailer(src, end - 8)[0]
                        and (not label or src[off + _HEAD : off + at] == label)
                    ):
                        continue
                self.record(i)  # raises the precise Corrupt
                raise Corrupt(
                    f"{self.path}: segment record at offset {off} differs from its .idx "
                    "entry (SEG-5)"
                )

    def _emit(self, items: list[Item], a: int, b: int, r: int) -> None:
        """Slots a..b (one label run, verified) as records, appended to ``items``."""
        index, runs = self.index, self.runs
        payloads: Iterable[Any]
        if self.by_run:  # entries point at the payloads themselves (SEG-17)
            payloads = self._run_payloads(a, b)
        else:
            # version 1 frames hold a header and labels before the payload and the checksum
            # after it
            skip = _HEAD + runs.nls[r] + runs.tls[r]
            offs, lens = index.offsets, index.lengths
            n, size, start = b - a + 1, lens[a], offs[a]
            if _uniform(lens, a, b) and offs[b] - start == size * (b - a):
                # frames back to back (SEG-3), equal sizes: one stride, one C call (struct)
                fmt = f"{skip}x{size - skip - 8}s8x"
                payloads = map(_first, _iter_unpack(fmt, self.data[start : start + size * n]))
            else:
                piece = offs[a : b + 1]
                ends = map(sub, map(add, piece, lens[a : b + 1]), repeat(8))
                payloads = self._sliced(map(slice, map(add, piece, repeat(skip)), ends))
        column = index.tss
        # one batch's records share one ts (and so one int object)
        tss: Iterable[int] = repeat(column[a]) if _uniform(column, a, b) else column[a : b + 1]
        first = self.first_seq
        seqs = range(first + a, first + b + 1)
        extend_records(items, seqs, tss, runs.tags[r], runs.nodes[r], payloads)

    def _sliced(self, slices: Iterator[slice]) -> Iterator[Any]:
        payloads: Iterator[Any] = map(self._src.__getitem__, slices)
        return map(bytes, payloads) if self._copy else payloads

    def _run_payloads(self, a: int, b: int) -> Iterator[Any]:
        """Payloads of slots a..b of a run-frame ``.data``. Inside one run frame they lie back
        to back (SEG-15): a frame's part of equal sizes is unpacked by one C call (struct),
        with no slice object per record; other parts are sliced."""
        index, data = self.index, self.data
        offs, lens, slots = index.offsets, index.lengths, index.block_slots
        k = bisect_right(slots, a) - 1
        parts: list[Iterable[Any]] = []
        while a <= b:
            b_end = (slots[k + 1] if k + 1 < len(slots) else self.count) - 1
            e = min(b, b_end)
            n, size, start = e - a + 1, lens[a], offs[a]
            if not _uniform(lens, a, e):
                piece = offs[a : e + 1]
                parts.append(self._sliced(map(slice, piece, map(add, piece, lens[a : e + 1]))))
            elif size and a == slots[k] and e == b_end:
                parts.append(_whole_frame(size, n)(data, start))
            elif size:
                parts.append(map(_first, _iter_unpack(f"{size}s", data[start : start + size * n])))
            else:
                parts.append(repeat(b"", n))
            a, k = e + 1, k + 1
        return chain.from_iterable(parts)

    def close(self) -> None:
        # a reader outside the store lock may still hold a view of the map (the service's
        # Arrow read pins the maps it reads, SERVICE.md SVC-64): the map then goes with it
        with contextlib.suppress(BufferError):
            self.data.release()
        if isinstance(self._src, mmap.mmap):  # its handle let go of it at open
            with contextlib.suppress(BufferError):  # a read still holds a view: freed with it
                self._src.close()
