"""The recovery scan of a slot directory (seed 003 §6.5, §18.1; spec/FORWARD.md SF-7..SF-10).

Read-only: it reports what is on disk and the ``(ackedFsn, publishedFsn)`` seed; the slot then
acts on it (removes unborn files, zeroes a torn tail before appending). The seed arithmetic and
the contiguity check are the model's (``tidelog.model.fsn.recovery_seed``, FSN-5), so the code
and the oracle cannot drift apart.

Fail closed (anchors B, JQ #73): a segment file that cannot be read or whose header is invalid
refuses recovery rather than being skipped, because skipping it would silently drop whatever
unacknowledged frames it holds. The one exception is a file that is entirely zero: a crash
between creating a segment and writing its header leaves exactly that, and such a file holds no
frame (frames are written only after the header), so it is reported as unborn.
"""

from __future__ import annotations

import logging
import os
from array import array
from dataclasses import dataclass, field

from tidelog.errors import Corrupt
from tidelog.fsio import FS
from tidelog.model.fsn import recovery_seed

from .format import (
    HEADER_SIZE,
    decode_header,
    decode_watermark,
    is_segment_name,
    scan_frames,
    segment_generation,
)

__all__ = ["WATERMARK_FILE", "FAILED_FILE", "TMP_SUFFIX", "RecoveredSegment", "Recovery", "recover"]

log = logging.getLogger("tidelog.sf")

WATERMARK_FILE = ".ack-watermark"
TMP_SUFFIX = ".tmp"  # a segment under construction: sf-<gen>.sfa.tmp (SF-5)
FAILED_FILE = ".failed"


@dataclass
class RecoveredSegment:
    name: str
    generation: int | None  # None: the legacy sf-initial.sfa
    base_seq: int
    created_micros: int
    size: int  # file size: the segment's capacity
    offsets: array[int]  # start offset of each verified frame ("q")
    append_cursor: int  # end of the last verified frame
    torn_tail: int  # non-zero bytes right after append_cursor (seed §6.5 step 5)
    dirty_end: int  # end of the last non-zero byte at or after append_cursor (0 when clean)

    @property
    def frame_count(self) -> int:
        return len(self.offsets)

    @property
    def last_seq(self) -> int:
        return self.base_seq + len(self.offsets) - 1


@dataclass
class Recovery:
    segments: list[RecoveredSegment]  # sorted by (base_seq, frame_count): the last is active
    acked_fsn: int
    published_fsn: int
    watermark: int | None  # the decoded .ack-watermark, before the bound check
    watermark_used: bool  # it raised the seed above lowestBaseSeq - 1
    next_generation: int  # max(existing generation) + 1 (seed §5.3)
    unborn: list[str] = field(default_factory=list)  # all-zero segment files (no frames)
    leftovers: list[str] = field(default_factory=list)  # *.sfa.tmp: creations cut short

    @property
    def torn_tails(self) -> int:
        return sum(1 for s in self.segments if s.torn_tail)


def _read_all(fs: FS, path: str) -> bytes:
    h = fs.open_read(path)
    try:
        return h.pread(h.size(), 0)
    finally:
        h.close()


def _scan_segment(fs: FS, slot_dir: str, name: str) -> RecoveredSegment | None:
    """Map the segment read-only and walk it (seed §6.5 steps 1-5)."""
    path = os.path.join(slot_dir, name)
    try:
        h = fs.open_read(path)
    except OSError as exc:
        raise Corrupt(f"{path}: unreadable ({exc}); refusing recovery") from None
    try:
        try:
            data = h.map()
        except OSError as exc:
            raise Corrupt(f"{path}: cannot be mapped ({exc}); refusing recovery") from None
        try:
            return _scan_mapped(path, name, data)
        finally:
            data.release()  # the map itself goes with the handle
    finally:
        h.close()


def _scan_mapped(path: str, name: str, data: memoryview) -> RecoveredSegment | None:
    size = len(data)
    # Unborn (module docstring): all zeros. The header decides quickly for a live segment.
    if not any(data[:HEADER_SIZE]) and data == bytes(size):
        return None
    if size < HEADER_SIZE:
        raise Corrupt(f"{path}: {size} bytes, shorter than a segment header; refusing")
    header = decode_header(data, path)
    scan = scan_frames(data)
    tail = bytes(data[scan.last_good :]).rstrip(b"\0")
    return RecoveredSegment(
        name=name,
        generation=segment_generation(name),
        base_seq=header.base_seq,
        created_micros=header.created_micros,
        size=size,
        offsets=scan.offsets,
        append_cursor=scan.last_good,
        torn_tail=scan.torn_tail,
        dirty_end=scan.last_good + len(tail) if tail else 0,
    )


def read_watermark(fs: FS, slot_dir: str) -> int | None:
    path = os.path.join(slot_dir, WATERMARK_FILE)
    if not fs.exists(path):
        return None
    try:
        return decode_watermark(_read_all(fs, path))
    except OSError:
        return None  # unreadable: "no usable watermark" (seed §18.1 step 3)


def recover(fs: FS, slot_dir: str) -> Recovery:
    """Scan every ``*.sfa`` of ``slot_dir`` and seed the FSN counters (seed §6.5, FSN-5).

    raises: Corrupt (an invalid segment, or a gap between segments)
    """
    segments: list[RecoveredSegment] = []
    unborn: list[str] = []
    generations: list[int] = []
    leftovers: list[str] = []
    for name in fs.listdir(slot_dir):
        if name.endswith(TMP_SUFFIX) and is_segment_name(name[: -len(TMP_SUFFIX)]):
            leftovers.append(name)  # never renamed into place: holds no frame
            continue
        if not is_segment_name(name):
            continue
        gen = segment_generation(name)
        if gen is not None:
            generations.append(gen)
        seg = _scan_segment(fs, slot_dir, name)
        if seg is None:
            unborn.append(name)
            continue
        if seg.torn_tail:
            log.warning(
                "SF segment %s: torn tail (%d non-zero bytes after the last good frame at "
                "offset %d): a frame write was interrupted",
                os.path.join(slot_dir, name),
                seg.torn_tail,
                seg.append_cursor,
            )
        segments.append(seg)
    segments.sort(key=lambda s: (s.base_seq, s.frame_count))
    watermark = read_watermark(fs, slot_dir)
    try:
        acked, published = recovery_seed([(s.base_seq, s.frame_count) for s in segments], watermark)
    except Corrupt as exc:
        raise Corrupt(f"SF slot {slot_dir}: {exc.message}") from None
    lowest = segments[0].base_seq - 1 if segments else -1
    return Recovery(
        segments=segments,
        acked_fsn=acked,
        published_fsn=published,
        watermark=watermark,
        watermark_used=acked > lowest,
        next_generation=max(generations) + 1 if generations else 0,
        unborn=unborn,
        leftovers=leftovers,
    )
