"""A read-only view of an SF slot (spec/FORWARD.md SF-21, the SF form of FORMATS.md XPR-1).

A view reads a slot another process may be writing (a tidelog slot or store, the forwarder,
QuestDB's client) without taking its lock and without changing a byte of it: recovery's scan
(``recovery.examine``) runs in memory only, nothing is zeroed, deleted or recorded, and frames
are read with ``pread`` through descriptors opened for reading. The writer may be mid-write while
the view scans, so a scan that reads as damaged, or whose files vanish or change before the view
holds them, is read again a few times before the error stands. ``refresh`` catches up cheaply
when only the active segment grew, and scans again (reusing the unchanged sealed segments)
otherwise.
"""

from __future__ import annotations

import contextlib
import errno
import os
import time
from array import array
from typing import Final

from tidelog.errors import Closed, Corrupt, StorageError
from tidelog.fsio import FS, Handle
from tidelog.model.fsn import recovery_seed

from . import records as rec2
from .format import (
    FRAME_HEADER_SIZE,
    HEADER_SIZE,
    decode_header,
    frame_end,
    is_segment_name,
)
from .frames import FrameReader, Segment, typed_io
from .recovery import (
    Finding,
    RecoveredSegment,
    examine,
    located,
    read_manifest,
    read_watermark,
    refusal,
    segment_order,
)
from .slot import SlotStats

__all__ = ["SlotView", "walk_frames"]

_TRIES: Final = 5  # scans a view makes before it believes the slot is damaged (SF-21)
_WINDOW: Final = 64 << 10  # the first read of a refresh's walk; it grows with what it finds
_MAX_WINDOW: Final = 4 << 20


class _Changed(Exception):
    """A file the scan read was replaced or removed before the view opened it."""


def walk_frames(h: Handle, pos: int, size: int) -> tuple[array[int], int]:
    """The offsets of the verified frames from ``pos`` on and the end of the last one: exactly
    what ``format.scan_frames`` finds past ``pos`` in the whole file, read in growing windows
    (a frame longer than the window is read again whole)."""
    offsets: array[int] = array("q")
    window = _WINDOW
    while pos < size:
        data = h.pread(min(window, size - pos), pos)
        at = 0
        while (end := frame_end(data, at)) is not None:
            offsets.append(pos + at)
            at = end
        if at:
            pos += at
            window = min(window * 2, _MAX_WINDOW)
            continue
        # No whole frame at pos in this window: a longer one needs a longer read.
        n = int.from_bytes(data[4:8], "little", signed=True) if len(data) >= 8 else -1
        need = FRAME_HEADER_SIZE + n
        if n >= 0 and len(data) < need <= size - pos and window < need:
            window = need
            continue
        break
    return offsets, pos


class SlotView(FrameReader):
    """A read-only view of the slot directory ``slot_dir`` (which must exist: the backend
    checks). ``durability`` is only what the store reports as its class (SF-15); ``tries``:
    scans before damage or a changing slot stands (1 where nothing else writes)."""

    def __init__(
        self, fs: FS, slot_dir: str, *, durability: str = "append", tries: int = _TRIES
    ) -> None:
        super().__init__()
        self.fs = fs
        self.dir = slot_dir
        self.durability = durability
        self.tries = tries
        self.published_fsn = -1
        self.acked_fsn = -1
        self.watermark: int | None = None  # the one the last scan or walk trusted
        self.findings: list[Finding] = []  # the last scan's warnings (a view logs nothing)
        self.scans = 0  # full scans so far (a refresh that only walks does not count)
        self._scanned: list[RecoveredSegment] = []
        self._names: list[str] = []  # segment files (unborn ones too) at the last scan
        self._unborn: list[str] = []
        self._manifest: rec2.Record | None = None  # sf-manifest.bin as the last scan read it
        self._torn = 0
        self._closed = False
        with self._cond, typed_io(f"reading SF slot {slot_dir} (read-only view)"):
            self._scan()

    # -- scanning --------------------------------------------------------------------------
    def _scan(self) -> None:
        """Scan the slot, again while it reads as damaged or changes under the scan (SF-21);
        sealed segments known from the last scan are not read again."""
        known = {r.name: r for r in self._scanned[:-1]}
        for attempt in range(self.tries):
            try:
                self._scan_once(known)
                return
            except (Corrupt, _Changed, OSError) as exc:
                last = attempt + 1 >= self.tries
                if isinstance(exc, OSError) and exc.errno != errno.ENOENT:
                    raise  # a failed read is not a race: io_error at once (SF-19)
                if last and isinstance(exc, _Changed):
                    raise StorageError(
                        f"SF slot {self.dir} changed under each of {self.tries} reads of the "
                        f"read-only view ({exc}); try again (SF-21)"
                    ) from None
                if last:
                    raise
            known = {}
            time.sleep(0.02 * (attempt + 1))

    def _scan_once(self, known: dict[str, RecoveredSegment]) -> None:
        rec, findings = examine(self.fs, self.dir, known, beside_writer=True)
        if rec is None:
            raise refusal(self.dir, findings)
        if rec.vanished and (
            not rec.segments
            or max(map(segment_order, rec.vanished)) > segment_order(rec.segments[-1].name)
        ):
            # Only a trim removes segments, lowest first, never the active one (SF-12, SF-13):
            # the newest listed one gone means the listing is older than the scan.
            raise _Changed(f"{rec.vanished[-1]} went away while the slot was read")
        segments: list[Segment] = []
        held: list[RecoveredSegment] = []
        trimmed, walked = False, 0
        try:
            for r in rec.segments:
                try:
                    segments.append(self._hold(r))
                    held.append(r)
                except FileNotFoundError:
                    if r is rec.segments[-1]:
                        raise  # the active segment is never trimmed (SF-13): scan again
                    # Trimmed since the scan, and every segment below it too (SF-12: lowest
                    # first): the view starts above it, never with a gap.
                    _close(segments)
                    segments, held, trimmed = [], [], True
            if trimmed:
                # The trim acknowledged frames written after the scan read the active
                # segment; as scanned (empty, say) it would show a slot that never was.
                seg = segments[-1]
                offsets, seg.cursor = walk_frames(seg.handle, seg.cursor, seg.size)
                seg.offsets.extend(offsets)
                walked = len(offsets)
        except BaseException:
            _close(segments)
            raise
        self._release()
        self._segments = segments
        self._bases = [s.base_seq for s in segments]
        self._scanned = held
        # Format 2's spares and leftovers (SF-26) stay listed: they are no reason to scan again.
        self._names = sorted([r.name for r in held] + rec.unborn + rec.extras)
        self._unborn = rec.unborn
        self._manifest = rec.manifest
        spans = [(s.base_seq, s.count) for s in segments]
        self.published_fsn = rec.published_fsn + walked
        self.acked_fsn = recovery_seed(spans, rec.watermark)[0] if held else rec.acked_fsn
        self.watermark = rec.watermark
        self.findings = findings
        self._torn = rec.torn_tails
        self.scans += 1

    def _hold(self, r: RecoveredSegment) -> Segment:
        """Open the segment the scan read, checking it is still that file (same header and
        size: a trimmed one is gone, a recreated one has another createdMicros)."""
        path = os.path.join(self.dir, r.name)
        h = self.fs.open_read(path)
        try:
            if not self._same(h, r.base_seq, r.created_micros, r.size):
                raise _Changed(f"{path} was replaced while it was read")
        except BaseException:
            h.close()
            raise
        # The scan's offsets, not a copy: the active segment's grow on refresh, and the next
        # scan reads it again (only sealed segments are reused, ``_scan``).
        return Segment(
            r.name, h, r.base_seq, r.created_micros, r.size, r.offsets, r.append_cursor,
            r.generation,
        )  # fmt: skip

    @staticmethod
    def _same(h: Handle, base_seq: int, created_micros: int, size: int) -> bool:
        head = h.pread(HEADER_SIZE, 0)
        try:
            header = decode_header(head)
        except Corrupt:
            return False
        return h.size() == size and header == (base_seq, created_micros)

    # -- refresh -----------------------------------------------------------------------------
    def refresh(self) -> None:
        """Catch up with the writer (SF-21): walk the active segment on when nothing else
        changed, else scan again."""
        with self._cond:
            self._check_open()
            with typed_io(f"refreshing the read-only view of SF slot {self.dir}"):
                try:
                    walked = self._walk_on()
                except OSError as exc:
                    if exc.errno != errno.ENOENT:
                        raise
                    walked = False  # a file went away while the walk read: a trim, say
                if not walked:
                    self._scan()

    def _walk_on(self) -> bool:
        """New frames of the active segment when the manifest is the one the scan read, the
        directory lists the same segment files, no unborn one got a header and the active one
        is the same file; False: scan again."""
        # Format 2 (SF-25, SF-26): a rotation lists the new segment before the manifest makes
        # it active. A scan in between takes it for an empty spare and walks the old active
        # segment on; only the manifest says that frames now go to the new one.
        if read_manifest(self.fs, self.dir)[1] != self._manifest:
            return False
        names = sorted(n for n in self.fs.listdir(self.dir) if is_segment_name(n))
        if names != self._names:
            return False
        for name in self._unborn:
            h = self.fs.open_read(os.path.join(self.dir, name))
            try:
                if any(h.pread(HEADER_SIZE, 0)):
                    return False
            finally:
                h.close()
        if not self._segments:
            return True
        seg = self._segments[-1]
        h = self.fs.open_read(self._path(seg))
        try:
            if not self._same(h, seg.base_seq, seg.created_micros, seg.size):
                return False
            offsets, seg.cursor = walk_frames(h, seg.cursor, seg.size)
        finally:
            h.close()
        seg.offsets.extend(offsets)
        self.published_fsn += len(offsets)
        self.watermark = read_watermark(self.fs, self.dir)
        spans = [(s.base_seq, s.count) for s in self._segments]
        self.acked_fsn = recovery_seed(spans, self.watermark)[0]
        return True

    # -- the rest of the slot API a store needs ------------------------------------------------
    def _check_open(self) -> None:
        if self._closed:
            raise Closed(f"the read-only view of SF slot {self.dir} is closed")

    def _check_readable(self) -> None:
        self._check_open()

    @property
    def poisoned(self) -> None:
        return None  # a view writes nothing, so nothing can poison it (SF-19)

    @property
    def closed(self) -> bool:
        return self._closed

    def warnings(self) -> list[str]:
        return [f"{located(self.dir, f)}: {f.message} ({f.rule})" for f in self.findings]

    def stats(self) -> SlotStats:
        with self._cond:
            lowest = self._segments[0].base_seq - 1 if self._segments else -1
            return SlotStats(
                segments=len(self._segments),
                total_bytes=self._total_bytes(),
                published_fsn=self.published_fsn,
                acked_fsn=self.acked_fsn,
                persisted_watermark=-1 if self.watermark is None else self.watermark,
                torn_tails_at_open=self._torn,
                watermark_used_at_open=self.acked_fsn > lowest,
                trimmed_segments=0,  # a view trims and creates nothing
                created_segments=0,
            )

    def _release(self) -> None:
        _close(self._segments)
        self._segments, self._bases = [], []

    def close(self) -> None:
        with self._cond:
            if not self._closed:
                self._closed = True
                self._release()

    def __enter__(self) -> SlotView:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _close(segments: list[Segment]) -> None:
    for seg in segments:
        with contextlib.suppress(OSError):  # read-only descriptors: nothing to lose
            seg.close()
