"""A sealed segment as a ``SealedChunk`` of the engine's topic log: mmap'd ``.data`` plus the
decoded ``.idx`` columns, and an in-memory dead-slot map (``DeadSlots``, shared with the
``.qseg`` chunks of bundle topics, qchunk.py).

Reads verify each record's checksum (SEG-2): a mismatch in a sealed file is corruption and raises
``Corrupt`` naming the file and offset; it is never skipped and never returned as data.
"""

from __future__ import annotations

import mmap
import re
import struct
from collections.abc import Iterator

import xxhash

from tidelog.errors import Corrupt
from tidelog.fsio import Handle
from tidelog.records import Item, Record

from .format import segment as segfmt
from .format.segment import SegmentIndex

__all__ = ["DeadSlots", "SegChunk", "labelled"]

_LABELS = struct.Struct("<HH")  # node_len, tag_len inside a record frame
_LABELS_AT = 4 + 1 + 8 + 8  # after frame_len, flags, seq, ts
_LABELED = segfmt.HAS_TAG | segfmt.HAS_NODE
_FRAME = segfmt._RECORD  # frame_len, flags, seq, ts, node_len, tag_len, data_len
_FIXED = segfmt._LEN_FIXED
_HEAD = segfmt.RECORD_HEADER_SIZE
_U64 = struct.Struct("<Q")


_NONZERO = re.compile(b"[^\x00]")


def labelled(index: SegmentIndex, mask: int = _LABELED) -> list[int]:
    """Slots whose flags have a bit of ``mask`` (found by a C-speed scan: most segments hold
    no labelled record at all, and opening a store must not loop over every record)."""
    flags = index.flags.tobytes()
    return [m.start() for m in _NONZERO.finditer(flags) if flags[m.start()] & mask]


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
        self.handle = handle
        self.index = index
        self.data = handle.map()
        self.first_seq = index.first_seq
        self.count = index.count
        self._init_dead()
        self.nbytes = (
            sum(index.lengths)
            - segfmt.RECORD_OVERHEAD * index.count
            - sum(self._label_bytes(i) for i in labelled(index))
        )

    # -- SealedChunk -------------------------------------------------------------------------
    def ts(self, i: int) -> int:
        return int(self.index.tss[i])

    def size(self, i: int) -> int:
        length = int(self.index.lengths[i]) - segfmt.RECORD_OVERHEAD
        if self.index.flags[i] & _LABELED:
            length -= self._label_bytes(i)
        return length

    def node(self, i: int) -> str | None:
        if not self.index.flags[i] & segfmt.HAS_NODE:
            return None
        return self.record(i).node

    def tag(self, i: int) -> str | None:
        if not self.index.flags[i] & segfmt.HAS_TAG:
            return None
        return self.record(i).tag

    def tagged(self) -> Iterator[tuple[int, str]]:
        """(slot, tag) of every live record that has a tag (recovery's tag index)."""
        for i in labelled(self.index, segfmt.HAS_TAG):
            if self.is_live(i):
                tag = self.tag(i)
                if tag is not None:
                    yield i, tag

    def files(self) -> list[str]:
        """The files of this segment (deleted together once nothing in it is live)."""
        return [self.path, self.path[: -len(".data")] + ".idx"]

    def record(self, i: int) -> Record:
        try:
            seq, ts, tag, node, payload = segfmt.read_record(
                self.data,
                int(self.index.offsets[i]),
                int(self.index.lengths[i]),
                self.first_seq + i,
            )
        except Corrupt as exc:
            raise Corrupt(f"{self.path}: {exc.message}") from None
        return Record(seq, ts, tag, node, bytes(payload))

    def records_into(
        self, items: list[Item], i0: int, i1: int, limit: int, exclude: str | None
    ) -> int | None:
        """Append the live records of slots i0..i1 to ``items`` until it holds ``limit``; None
        when the range was done, else the last seq examined. The sequential-read path: the
        checks of ``record`` (SEG-2 lengths and XXH3-64, SEG-3 seq) inline, one loop per chunk;
        a labelled record, or any record failing a check, goes through ``record`` itself (which
        raises the precise ``Corrupt``)."""
        mv, dead, first = self.data, self.dead, self.first_seq
        # slicing the mmap (or bytes) under a whole-file view yields bytes in one step
        src = mv.obj if isinstance(mv.obj, (bytes, mmap.mmap)) and len(mv.obj) == len(mv) else mv
        offs, lens, flags = self.index.offsets, self.index.lengths, self.index.flags
        unpack, trailer = _FRAME.unpack_from, _U64.unpack_from
        digest, size, new = xxhash.xxh3_64_intdigest, len(mv), tuple.__new__
        append, n = items.append, len(items)
        lowest = segfmt.HEADER_SIZE
        for i in range(i0, i1 + 1):
            if n >= limit:
                return first + i - 1
            if dead[i]:
                continue
            off = offs[i]
            end = off + lens[i]
            if flags[i] & _LABELED or exclude is not None or off < lowest or end > size:
                rec = self.record(i)
                if exclude is not None and rec.node == exclude:
                    continue
            else:
                frame_len, fl, seq, ts, _, _, dl = unpack(src, off)
                if (
                    fl & _LABELED
                    or frame_len + 4 != end - off
                    or _FIXED + dl != frame_len
                    or seq != first + i
                    or digest(src[off + 4 : end - 8]) != trailer(src, end - 8)[0]
                ):
                    rec = self.record(i)  # raises Corrupt (or decodes a labelled record)
                else:
                    rec = new(Record, (seq, ts, None, None, bytes(src[off + _HEAD : end - 8])))
            append(rec)
            n += 1
        return None

    # -- helpers ---------------------------------------------------------------------------
    def _label_bytes(self, i: int) -> int:
        off = int(self.index.offsets[i]) + _LABELS_AT
        if off + 4 > len(self.data):
            raise Corrupt(f"{self.path}: record {self.first_seq + i} lies outside the file")
        node_len, tag_len = _LABELS.unpack_from(self.data, off)
        return int(node_len) + int(tag_len)

    def close(self) -> None:
        self.data.release()
        self.handle.close()
