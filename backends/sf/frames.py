"""Reading a slot's frames by FSN: what a writing ``Slot`` and a read-only ``SlotView`` share
(spec/FORWARD.md SF-4, SF-21, SF-22).

Both hold one ``Segment`` per segment file (its read handle, header fields and the offsets of
its verified frames) and read frames from a sealed segment's map when it has one, else with one
``pread`` per run of frames.
"""

from __future__ import annotations

import bisect
import contextlib
import os
import threading
from array import array
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from tidelog.errors import BadArgument, StorageError, TidelogError
from tidelog.fsio import Handle, storage_error

from .format import FRAME_HEADER_SIZE, HEADER_SIZE

__all__ = ["Segment", "FrameReader", "typed_io"]


@contextlib.contextmanager
def typed_io(what: str, fail: Callable[[StorageError], None] | None = None) -> Iterator[None]:
    """SF-19: an ``OSError`` inside leaves as ``io_error`` naming ``what``; ``fail`` (the
    slot's poisoning) sees every I/O failure, typed here or deeper."""
    try:
        yield
    except StorageError as exc:
        if fail is not None:
            fail(exc)
        raise
    except TidelogError:
        raise
    except OSError as exc:
        err = storage_error(exc, f"{what} (SF-19)")
        if fail is not None:
            fail(err)
        raise err from None


@dataclass
class Segment:
    name: str
    handle: Handle
    base_seq: int
    created_micros: int
    size: int
    offsets: array[int]
    cursor: int  # end of the last frame: the append cursor (a view: where its frames end)
    generation: int | None  # None: the legacy sf-initial.sfa
    synced: bool = True  # every byte written is covered by an fdatasync
    view: memoryview | None = None  # read-only map of a sealed segment (None: read by pread)

    def map_sealed(self) -> None:
        """Map the (now immutable) segment for the readers."""
        if self.view is None:
            self.view = self.handle.map()

    def close(self) -> None:
        if self.view is not None:
            self.view.release()
            self.view = None
        self.handle.close()

    @property
    def count(self) -> int:
        return len(self.offsets)

    @property
    def last_seq(self) -> int:
        return self.base_seq + len(self.offsets) - 1


class FrameReader:
    """The read side of a slot over ``_segments`` (ascending, contiguous FSNs), under
    ``_cond``. Subclasses say when reading is allowed (``_check_readable``)."""

    dir: str
    published_fsn: int

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._segments: list[Segment] = []
        self._bases: list[int] = []  # segment base_seqs, for bisect

    def _check_readable(self) -> None:
        raise NotImplementedError

    def _path(self, seg: Segment) -> str:
        return os.path.join(self.dir, seg.name)

    def read(self, fsn: int, max_frames: int = 256, max_bytes: int = 1 << 20) -> list[bytes]:
        """Payloads of frames ``fsn, fsn+1, ...`` (at least one if ``fsn`` is published)."""
        out: list[bytes] = []
        size = 0
        with self._cond:
            self._check_readable()
            if fsn > self.published_fsn or not self._segments:
                return out
            i = bisect.bisect_right(self._bases, fsn) - 1
            if i < 0 or fsn < self._segments[0].base_seq:
                raise BadArgument(f"FSN {fsn} was trimmed (lowest on disk {self._bases[0]})")
            while i < len(self._segments) and len(out) < max_frames and size < max_bytes:
                seg = self._segments[i]
                k = fsn - seg.base_seq
                if k >= seg.count:
                    i += 1
                    continue
                # One pread covers the run of frames taken from this segment: every frame
                # that starts within the byte budget (at least one), up to max_frames.
                start = seg.offsets[k]
                hi = min(seg.count, k + max_frames - len(out))
                p = bisect.bisect_right(seg.offsets, start + max_bytes - size, k + 1, hi)
                end = seg.offsets[p] if p < seg.count else seg.cursor
                if seg.view is not None:
                    view, base = seg.view, 0  # sealed: straight from the mapping
                else:
                    with typed_io(f"reading SF segment {self._path(seg)}"):
                        data = seg.handle.pread(end - start, start)
                    view, base = memoryview(data), start
                for j in range(k, p):
                    off = seg.offsets[j] - base
                    n = int.from_bytes(view[off + 4 : off + 8], "little")
                    out.append(bytes(view[off + 8 : off + 8 + n]))
                    size += n
                fsn = seg.base_seq + p
                if p < seg.count:
                    break  # a limit stopped us inside this segment
                i += 1
        return out

    def frame_ts_ms(self, fsn: int) -> int:
        """Creation time of the segment holding ``fsn`` (frames carry no time of their own)."""
        with self._cond:
            i = bisect.bisect_right(self._bases, fsn) - 1
            return self._segments[max(i, 0)].created_micros // 1000 if self._segments else 0

    def lowest_fsn(self) -> int:
        """The lowest FSN still on disk (``published_fsn + 1`` when none)."""
        with self._cond:
            for seg in self._segments:
                if seg.count:
                    return seg.base_seq
            return self.published_fsn + 1

    def payload_bytes(self) -> int:
        with self._cond:
            frames = sum(s.count for s in self._segments)
            used = sum(s.cursor - HEADER_SIZE for s in self._segments)
            return used - FRAME_HEADER_SIZE * frames

    def segment_names(self) -> list[str]:
        with self._cond:
            return [s.name for s in self._segments]

    def _total_bytes(self) -> int:
        return sum(s.size for s in self._segments)
