"""An SF slot on disk: ``<sf_dir>/<sender_id>/`` (spec/FORWARD.md SF-1..SF-14).

One writer process (the slot lock), many threads: producers append, the forwarder's I/O loop
reads, the manager (whoever calls ``apply_acks``) persists the watermark and trims. One condition
variable guards the metadata; reads and writes happen under it too (they are single positional
calls), so a trim can never close a file a read is using.

Segments are mmap'd for reading (SF-22): the recovery scan walks each file through
a read-only map (SF-7), and every sealed segment stays mapped until it is trimmed,
so the I/O loop reads its frames straight from the mapping; with ``mmap=False`` nothing is mapped
and every frame is read with ``pread`` (SF-22: a media error is then ``io_error``, not SIGBUS).
The reads are ``frames.FrameReader``'s, shared with read-only views (``view.SlotView``). Writes
-- the frames of the active segment, headers, the watermark -- are positional writes through
the ``FS`` seam instead of stores into a writable map (spec/FORWARD.md SF-4): the bytes on disk
are identical, the crash simulation can record every write, and a store can never SIGBUS
(SF-5, SF-8). The active segment is read with ``pread`` too (the seam's maps are only
defined for files nobody writes any more). Block reservation at create time
(``Handle.allocate`` = posix_fallocate) is done as SF-5 demands, so a full disk fails the
segment's creation, cleanly, never a later append.

Every sync point is recorded in ``.tidelog-sync`` (SF-17), so recovery can tell a torn tail from
damage (SF-18). A failed I/O call raises ``io_error``; a failed write or sync poisons the slot
(SF-19): after a failed fdatasync the kernel may have dropped the dirty pages and marked them
clean, so no later write or sync of this slot object is trusted until it is reopened.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from array import array
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

from tidelog.clock import Clock
from tidelog.errors import (
    Backpressure,
    BadArgument,
    Closed,
    Corrupt,
    StorageError,
    TooLarge,
)
from tidelog.fsio import FS, Handle, OsFS, make_dirs, storage_error

from . import lock
from . import records as rec2
from .dualfile import DualFile
from .format import (
    FRAME_HEADER_SIZE,
    HEADER_SIZE,
    WATERMARK_MAGIC,
    SyncRecord,
    encode_frame,
    encode_header,
    encode_watermark,
    segment_name,
)
from .frames import FrameReader, Segment, typed_io
from .recovery import (
    FAILED_FILE,
    MANIFEST_FILE,
    SYNC_FILE,
    TMP_SUFFIX,
    WATERMARK_FILE,
    Recovery,
    recover,
)
from .syncfile import SyncFile

__all__ = ["DURABILITIES", "Slot", "SlotStats", "check_sender_id", "write_failed"]

log = logging.getLogger("tidelog.sf")

#: sf_durability (SF-11): memory = never fsync; flush = fsync on the producer's flush();
#: append = fsync before every append returns (flush and append are SF-11's Deviation).
DURABILITIES: Final = ("memory", "flush", "append")
#: Slot formats (SF-23); a new slot is created in format 2 (SF-29).
SLOT_FORMATS: Final = (1, 2)
_ZERO_CHUNK: Final = bytes(1 << 16)


@dataclass
class SlotStats:
    segments: int
    total_bytes: int
    published_fsn: int
    acked_fsn: int
    persisted_watermark: int
    torn_tails_at_open: int
    watermark_used_at_open: bool
    trimmed_segments: int
    created_segments: int


class Slot(FrameReader):
    """Open (recover or create) the slot at ``<sf_dir>/<sender_id>``; see ``open``."""

    def __init__(
        self,
        fs: FS,
        slot_dir: str,
        lock_handle: Handle,
        recovery: Recovery,
        *,
        max_bytes: int,
        max_total_bytes: int,
        durability: str,
        clock: Clock | None,
        mmap: bool = True,
        slot_format: int = 2,
    ) -> None:
        self.fs = fs
        self.dir = slot_dir
        self.max_bytes = max_bytes
        self.max_total_bytes = max_total_bytes
        self.durability = durability
        self._clock = clock
        self._lock_handle: Handle | None = lock_handle
        super().__init__()
        self.mmap = mmap  # SF-22: map sealed segments for reading (else pread)
        self._next_gen = recovery.next_generation
        self.published_fsn = recovery.published_fsn
        self.acked_fsn = recovery.acked_fsn
        self._persisted = recovery.acked_fsn if recovery.watermark_used else -1
        self._watermark: Handle | None = None
        self._sync = SyncFile(fs, slot_dir, recovery.sync)
        self._recorded: SyncRecord | None = None  # the last sync record this slot wrote
        self._poisoned: StorageError | None = None  # SF-19: the first failed write or sync
        self._closing = False  # close is writing its sync record (no append claim any more)
        self._closed = False
        # SF-23: a slot stays in the format it was found in; a new one gets ``slot_format``.
        self.version = recovery.version if recovery.segments else slot_format
        self._wm2: DualFile | None = None  # format 2's .ack-watermark and manifest (SF-29)
        self._manifest: DualFile | None = None
        if self.version == 2:
            wm_gen = recovery.watermark_generation
            man_gen = recovery.manifest.generation if recovery.manifest else 0
            self._wm2 = DualFile(fs, self._join(WATERMARK_FILE), WATERMARK_MAGIC, wm_gen)
            self._manifest = DualFile(fs, self._join(MANIFEST_FILE), rec2.MANIFEST_MAGIC, man_gen)
            self._manifest.value = recovery.manifest
        self._torn_at_open = recovery.torn_tails
        self._watermark_used = recovery.watermark_used
        self._trimmed = 0
        self._created = 0
        self._listeners: list[Callable[[], None]] = []
        #: called when an append times out waiting for space; returns the message (FWD-14)
        self.backpressure_reason: Callable[[], str] = lambda: "backpressure: SF slot is full"
        self.backpressure_stalls = 0
        try:
            with typed_io(f"recovering SF slot {slot_dir}"):
                self._adopt(recovery)
        except BaseException:
            for seg in self._segments:
                with contextlib.suppress(OSError):
                    seg.close()
            with contextlib.suppress(OSError):
                self._sync.close()
            raise

    # -- opening ---------------------------------------------------------------------------
    @classmethod
    def open(
        cls,
        sf_dir: str,
        sender_id: str,
        *,
        fs: FS | None = None,
        max_bytes: int = 4 << 20,
        max_total_bytes: int = 10 << 30,
        durability: str = "memory",
        clock: Clock | None = None,
        create: bool = True,
        fail_marker: bool = False,
        mmap: bool = True,
        slot_format: int = 2,
    ) -> Slot:
        """Lock and recover ``<sf_dir>/<sender_id>`` (created if missing, SF-10).

        ``fail_marker``: when recovery refuses the slot, write the ``.failed`` sentinel while
        the lock is still held (an orphan drainer's duty, SF-16, FWD-17).

        ``mmap=False`` (SF-22): nothing of the slot is mapped; recovery copies each segment by
        ``pread`` (the default ``fs`` is then ``OsFS(mmap=False)``) and frames are read by
        ``pread``, so a media error is ``io_error``, never a SIGBUS.

        ``slot_format`` (SF-23, SF-29): the format a new slot is created in (2, the one
        questdb 6.0.0 resumes without replays; 1 the original); a found slot keeps its own.

        raises: Locked (another sender holds it), Corrupt (recovery refused), BadArgument
        """
        check_sender_id(sender_id)
        if durability not in DURABILITIES:
            raise BadArgument(f"sf_durability must be one of {DURABILITIES}, got {durability!r}")
        if slot_format not in SLOT_FORMATS:
            raise BadArgument(f"slot_format must be one of {SLOT_FORMATS}, got {slot_format!r}")
        if max_bytes < HEADER_SIZE + FRAME_HEADER_SIZE + 1:
            raise BadArgument(f"sf_max_bytes={max_bytes}: too small for a header and a frame")
        if max_total_bytes < 2 * max_bytes:
            raise BadArgument(
                f"sf_max_total_bytes={max_total_bytes} must hold at least two segments of "
                f"sf_max_bytes={max_bytes} (rotation needs the next one before trimming)"
            )
        fs = fs or OsFS(mmap=mmap)
        slot_dir = os.path.join(sf_dir, sender_id)
        if not create and not fs.is_dir(slot_dir):
            raise BadArgument(f"SF slot {slot_dir} does not exist")
        try:
            make_dirs(fs, slot_dir)
        except OSError as exc:
            raise storage_error(exc, f"creating SF slot {slot_dir} (SF-19)") from None
        try:
            handle = lock.acquire(fs, slot_dir)
        except OSError as exc:
            raise storage_error(exc, f"locking SF slot {slot_dir} (SF-19)") from None
        try:
            try:
                recovery = recover(fs, slot_dir)
            except Corrupt as exc:
                if fail_marker:
                    try:
                        write_failed(fs, slot_dir, f"recovery refused: {exc.message}")
                    except StorageError as err:  # the refusal is the news; say why no marker
                        log.warning("SF slot %s: cannot write %s: %s", slot_dir, FAILED_FILE, err)
                raise
            return cls(
                fs,
                slot_dir,
                handle,
                recovery,
                max_bytes=max_bytes,
                max_total_bytes=max_total_bytes,
                durability=durability,
                clock=clock,
                mmap=mmap,
                slot_format=slot_format,
            )
        except BaseException as exc:
            with contextlib.suppress(OSError):
                handle.close()  # never keep a slot locked that we failed to open
            if isinstance(exc, OSError) and not isinstance(exc, StorageError):
                raise storage_error(exc, f"opening SF slot {slot_dir} (SF-19)") from None
            raise

    def _adopt(self, rec: Recovery) -> None:
        """Take over the recovered segments: drop unborn files, clean the active tail."""
        # SF-26, SF-28: format 2's spares and trimmed leftovers go as in the client's recovery.
        gone = rec.unborn + rec.leftovers + rec.extras
        for name in gone:
            self.fs.unlink(os.path.join(self.dir, name))
        if gone:
            self.fs.fsync_dir(self.dir)
        for i, r in enumerate(rec.segments):
            active = i == len(rec.segments) - 1
            path = os.path.join(self.dir, r.name)
            h = self.fs.open(path, create=False) if active else self.fs.open_read(path)
            seg = Segment(
                r.name, h, r.base_seq, r.created_micros, r.size, r.offsets, r.append_cursor,
                r.generation,
                # Recovered bytes may still be only in the page cache (a previous session
                # under the memory durability): the first sync covers them too.
                synced=False,
            )  # fmt: skip
            self._segments.append(seg)
            self._bases.append(seg.base_seq)
            if not active and self.mmap:
                seg.map_sealed()
            elif r.dirty_end > r.append_cursor:
                # SF-9: bytes a torn append left after the last good frame are zeroed, durably,
                # before anything is appended: a new shorter frame followed by an intact stale
                # frame from the previous session would otherwise read back as a valid frame.
                pos = r.append_cursor
                while pos < r.dirty_end:
                    n = min(len(_ZERO_CHUNK), r.dirty_end - pos)
                    h.pwrite(_ZERO_CHUNK[:n], pos)
                    pos += n
                h.fdatasync()
        if not self._segments:
            # A fully drained slot starts fresh: a stale watermark would only confuse (§18.1),
            # and a stale sync record could name a segment another client recreates (SF-17).
            names = (WATERMARK_FILE, SYNC_FILE, MANIFEST_FILE)
            stale = [n for n in names if self.fs.exists(self._join(n))]
            for name in stale:
                self.fs.unlink(self._join(name))
            if stale:
                self.fs.fsync_dir(self.dir)  # before a new segment could reuse a generation
            if self._wm2 is not None and self._manifest is not None:
                self._wm2.generation = self._manifest.generation = 0
                self._manifest.value = None
            return
        if self._manifest is not None and self._manifest.value is None:
            self._adopt_manifest()
        if self.durability != "memory":
            # SF-17: record at open what is durable, after making it so; an append session
            # sets its flag from here on (every later frame is synced before the next).
            head = self._segments[-1]
            head.handle.fdatasync()
            head.synced = True
            self._write_record(head)
        elif self._sync.flagged() and self._sync.newest is not None:
            # A memory session must not leave an append session's claim behind it (SF-17).
            self._sync.write_unflagged(self._sync.newest)

    def _adopt_manifest(self) -> None:
        """A format-2 slot whose creation stopped before its manifest (SF-28 item 2): write
        the manifest, then set MANIFEST_REQUIRED on every segment, as the client's recovery
        does."""
        assert self._manifest is not None
        self._manifest.create(self._segments[0].base_seq, self._segments[-1].base_seq)
        for seg in self._segments:
            h = self.fs.open(self._path(seg), create=False)
            try:
                flags = h.pread(rec2.FLAGS_OFFSET + 1, 0)[rec2.FLAGS_OFFSET :]
                if not flags or not flags[0] & rec2.MANIFEST_REQUIRED:
                    h.pwrite(bytes([rec2.MANIFEST_REQUIRED]), rec2.FLAGS_OFFSET)
                    h.fsync()
            finally:
                h.close()

    # -- producer ----------------------------------------------------------------------------
    def add_listener(self, callback: Callable[[], None]) -> None:
        """``callback()`` runs (in the appending thread) after every append."""
        self._listeners.append(callback)

    def remove_listener(self, callback: Callable[[], None]) -> None:
        if callback in self._listeners:
            self._listeners.remove(callback)

    def max_payload(self) -> int:
        return self.max_bytes - HEADER_SIZE - FRAME_HEADER_SIZE

    def append(self, payload: bytes, *, deadline_ms: int = 0) -> int:
        """Append one frame and return its FSN (SF-5). Waits up to ``deadline_ms`` for
        trimming to free space when the slot is at ``max_total_bytes`` (FWD-14)."""
        frame = encode_frame(payload)
        if len(frame) > self.max_bytes - HEADER_SIZE:
            raise TooLarge(
                f"frame of {len(payload)} bytes does not fit a segment of sf_max_bytes="
                f"{self.max_bytes} (at most {self.max_payload()} payload bytes)"
            )
        with self._cond:
            self._check_writable()
            seg = self._segments[-1] if self._segments else None
            if seg is None or seg.cursor + len(frame) > seg.size:
                seg = self._rotate(deadline_ms)
            with self._io(f"appending to SF segment {self._path(seg)}"):
                seg.synced = False
                seg.handle.pwrite(frame, seg.cursor)
                if self.durability == "append":
                    seg.handle.fdatasync()
                    seg.synced = True
            seg.offsets.append(seg.cursor)
            seg.cursor += len(frame)
            self.published_fsn += 1
            fsn = self.published_fsn
        for callback in list(self._listeners):
            callback()
        return fsn

    def _rotate(self, deadline_ms: int) -> Segment:
        """Seal the active segment and create the next one (SF-12); waits for space."""
        size = self.max_bytes
        if self._total_bytes() + size > self.max_total_bytes:
            self.backpressure_stalls += 1
            end = time.monotonic() + deadline_ms / 1000.0
            while self._total_bytes() + size > self.max_total_bytes:
                left = end - time.monotonic()
                if left <= 0:
                    raise Backpressure(self.backpressure_reason())
                self._cond.wait(left)
                self._check_writable()
        if self._segments:
            with self._io(f"sealing SF segment {self._path(self._segments[-1])}"):
                self._seal(self._segments[-1])
        first = self._manifest is not None and self._manifest.value is None
        if first:
            with self._io(f"creating {self._join(WATERMARK_FILE)}"):
                self._start_format2()
        gen = self._next_gen
        self._next_gen += 1
        name = segment_name(gen)
        path = os.path.join(self.dir, name)
        created = self._now_micros()
        # SF-5: built under a temporary name and renamed into place, so a crash during
        # creation leaves either a complete header under the segment name or a *.sfa.tmp
        # that recovery deletes -- never a half-written header that would refuse recovery.
        tmp = path + TMP_SUFFIX
        with self._io(f"creating SF segment {path}"):
            h = self.fs.open(tmp)
            try:
                h.allocate(size)  # real blocks: ENOSPC here, never on a later append (SF-5)
                # The first segment gets its flag only once the manifest exists (SF-29).
                flags = rec2.MANIFEST_REQUIRED if self.version == 2 and not first else 0
                h.pwrite(encode_header(self.published_fsn + 1, created, flags), 0)
                # SF-29: in format 2 the segment is durable before the manifest names it.
                durable = self.durability != "memory" or self.version == 2
                if durable:
                    h.fdatasync()
                self.fs.rename(tmp, path)
                if durable:
                    self.fs.fsync_dir(self.dir)
            except OSError:
                with contextlib.suppress(OSError):
                    h.close()
                for leftover in (tmp, path):  # SF-19: no partial segment left behind
                    with contextlib.suppress(OSError):
                        self.fs.unlink(leftover)
                raise
        seg = Segment(name, h, self.published_fsn + 1, created, size, array("q"), HEADER_SIZE, gen)
        self._segments.append(seg)
        self._bases.append(seg.base_seq)
        self._created += 1
        if self._manifest is not None:
            with self._io(f"advancing {self._join(MANIFEST_FILE)}"):
                self._advance_manifest(self._segments[0].base_seq)
                if first:
                    h.pwrite(bytes([rec2.MANIFEST_REQUIRED]), rec2.FLAGS_OFFSET)
                    h.fsync()
        if self.durability != "memory":
            with self._io(f"recording SF segment {path} in {SYNC_FILE}"):
                self._write_record(seg)  # SF-17: before the segment takes a frame
        return seg

    def _seal(self, seg: Segment) -> None:
        # SF-11: under flush/append a sealed segment is synced before the next one takes
        # frames, so a crash can never leave later frames on disk after a hole (a gap refuses
        # recovery). The memory durability never syncs (SF-11).
        if self.durability != "memory" and not seg.synced:
            seg.handle.fdatasync()
            seg.synced = True
        if self.mmap:
            seg.map_sealed()

    def _start_format2(self) -> None:
        """SF-29: a new format-2 slot first gets its zeroed 8192-byte watermark, durably, so
        a crash before the manifest exists still leaves a slot recognisably format 2 (SF-23)."""
        assert self._wm2 is not None
        self._wm2.open()
        self._wm2.sync()
        self.fs.fsync_dir(self.dir)

    def _advance_manifest(self, head: int) -> None:
        """SF-25, SF-29: (head, active) only grow; fsynced; created with the first segment."""
        assert self._manifest is not None
        active = self._segments[-1].base_seq
        old = self._manifest.value
        if old is None:
            self._manifest.create(head, active)
            return
        head, active = max(head, old.first), max(active, old.second)
        if (head, active) != (old.first, old.second):
            self._manifest.write(head, active, sync=True)

    def _join(self, name: str) -> str:
        return os.path.join(self.dir, name)

    def _write_record(self, seg: Segment) -> None:
        """Record in ``.tidelog-sync`` that ``seg`` is durable through its cursor (SF-17); the
        caller has synced it. Without the append flag, no copy keeps one."""
        rec = SyncRecord(
            0, seg.generation, seg.base_seq, seg.created_micros, seg.cursor, seg.count,
            self.durability == "append" and not self._closing,
        )  # fmt: skip
        if rec == self._recorded:
            return
        if rec.append:
            self._sync.write(rec)
        else:
            self._sync.write_unflagged(rec)
        self._recorded = rec

    def _now_micros(self) -> int:
        if self._clock is not None:
            return self._clock.now_ms() * 1000
        return time.time_ns() // 1000

    # -- durability ------------------------------------------------------------------------
    def sync(self) -> None:
        """fdatasync every segment holding unsynced frames (whatever the durability), then
        record the sync point (SF-17)."""
        with self._cond:
            self._check_writable()
            with self._io(f"syncing SF slot {self.dir}"):
                for seg in self._segments:
                    if not seg.synced:
                        seg.handle.fdatasync()
                        seg.synced = True
                if self._segments:
                    self._write_record(self._segments[-1])

    def flush(self) -> None:
        """The producer's flush: the ``flush`` durability syncs what was published (SF-11)."""
        if self.durability == "flush":
            self.sync()

    # -- consumer (reads: FrameReader) ----------------------------------------------------------
    def _check_readable(self) -> None:
        # SF-19: after a failed sync the page cache may no longer hold what was published.
        self._check_writable()

    # -- acknowledgement and trim (the manager's job) ------------------------------------------
    def acknowledge(self, fsn: int) -> int:
        """Raise ``acked_fsn`` (never lowered, never above ``published_fsn``); returns it.
        Cheap: the watermark and the trim happen in ``apply_acks``."""
        with self._cond:
            if fsn > self.acked_fsn:
                self.acked_fsn = min(fsn, self.published_fsn)
            return self.acked_fsn

    def apply_acks(self) -> int:
        """Persist the watermark, then unlink every sealed segment wholly at or below
        ``acked_fsn`` (SF-12: persist, then trim). The active segment is kept even
        when fully acknowledged (SF-13: it carries the FSN counter across restarts). Returns
        how many segments were trimmed."""
        with self._cond:
            if self._closed:
                return 0
            self._check_writable()
            acked = self.acked_fsn
            with self._io(f"persisting the watermark of SF slot {self.dir}"):
                self._persist_watermark(acked)
                if (
                    self._manifest is not None
                    and len(self._segments) > 1
                    and self._segments[0].last_seq <= acked
                ):
                    self._trim_barrier(acked)
            trimmed = 0
            while len(self._segments) > 1 and self._segments[0].last_seq <= acked:
                seg = self._segments.pop(0)
                self._bases.pop(0)
                with self._io(f"trimming SF segment {self._path(seg)}"):
                    seg.close()
                    self.fs.unlink(self._path(seg))
                    if self.durability != "memory" and self._manifest is None:
                        # One unlink per directory sync: segments vanish lowest first even on
                        # a file system that reorders directory operations (no gap after a
                        # crash).
                        self.fs.fsync_dir(self.dir)
                trimmed += 1
            if trimmed and self._manifest is not None:
                with self._io(f"trimming SF slot {self.dir}"):
                    self.fs.fsync_dir(self.dir)  # SF-29: one directory sync after the unlinks
            self._trimmed += trimmed
            if trimmed:
                self._cond.notify_all()  # producers waiting for space (FWD-14)
            return trimmed

    def _trim_barrier(self, acked: int) -> None:
        """SF-29, the client's trim order: the watermark durable (record, fdatasync, directory
        fsync), then the manifest's head past the segments about to go (fsynced)."""
        assert self._wm2 is not None
        self._wm2.sync()
        self.fs.fsync_dir(self.dir)
        keep = next(s for s in self._segments if s.last_seq > acked or s is self._segments[-1])
        self._advance_manifest(keep.base_seq)

    def _persist_watermark(self, acked: int) -> None:
        if acked <= self._persisted or acked < 0:
            return
        if self._wm2 is not None:
            # SF-29: the next dual-slot record (SF-24), never the 16-byte one; synced at trim
            # and close only, as the client does.
            self._wm2.write(acked, 0, sync=False)
            self._persisted = acked
            return
        if self._watermark is None:
            self._watermark = self.fs.open(os.path.join(self.dir, WATERMARK_FILE))
        # SF-6: the whole 16-byte record in one write (a bare 8-byte FSN could tear undetected):
        # a torn or garbage sector then also spoils the magic or the reserved word, so recovery
        # rejects it instead of trusting a random FSN. Not fsynced (SF-6).
        self._watermark.pwrite(encode_watermark(acked), 0)
        self._sync.write_check(acked)  # SF-17: lets recovery catch a raised watermark
        self._persisted = acked

    # -- lifecycle ---------------------------------------------------------------------------
    def _check_open(self) -> None:
        if self._closed:
            raise Closed(f"SF slot {self.dir} is closed")

    def _check_writable(self) -> None:
        """SF-19: a poisoned slot refuses every op that writes or reads frames."""
        self._check_open()
        first = self._poisoned
        if first is not None:
            err = StorageError(
                f"SF slot {self.dir} is poisoned by an earlier I/O failure ({first}); close "
                "and reopen it (SF-19)"
            )
            err.errno = first.errno
            raise err

    def _poison(self, err: StorageError) -> None:
        if self._poisoned is None:
            self._poisoned = err
            log.error("SF slot %s poisoned: %s", self.dir, err)

    def _io(self, what: str) -> contextlib.AbstractContextManager[None]:
        """A write path: an I/O failure is typed and poisons the slot (SF-19)."""
        return typed_io(what, self._poison)

    @property
    def poisoned(self) -> StorageError | None:
        """The I/O failure that poisoned this slot (SF-19), or None."""
        return self._poisoned

    @property
    def closed(self) -> bool:
        return self._closed

    def close(self) -> None:
        """Flush per durability, record the sync point, persist the watermark, close files,
        release the lock last. Idempotent. Nothing is unlinked (SF-2, SF-13). A poisoned
        slot writes nothing, still releases everything, then raises (SF-19)."""
        with self._cond:
            if self._closed:
                return
            error: StorageError | None = None
            if self._poisoned is None:
                try:
                    with self._io(f"closing SF slot {self.dir}"):
                        if self.durability != "memory" and self._segments:
                            for seg in self._segments:
                                if not seg.synced:
                                    seg.handle.fdatasync()
                                    seg.synced = True
                            self._closing = True  # the record claims no append session now
                            self._write_record(self._segments[-1])
                        self._persist_watermark(self.acked_fsn)
                        if self._wm2 is not None:
                            self._wm2.sync()
                except StorageError as exc:
                    error = exc
            self._closed = True
            handles: list[Callable[[], None]] = [seg.close for seg in self._segments]
            if self._watermark is not None:
                handles.append(self._watermark.close)
            for dual in (self._wm2, self._manifest):
                if dual is not None:
                    handles.append(dual.close)
            handles.append(self._sync.close)
            if self._lock_handle is not None:
                handles.append(self._lock_handle.close)  # the lock goes last
                self._lock_handle = None
            for release in handles:
                try:
                    with typed_io(f"closing SF slot {self.dir}"):
                        release()
                except StorageError as exc:
                    error = error or exc
            self._cond.notify_all()
            if error is None and self._poisoned is not None:
                error = StorageError(
                    f"SF slot {self.dir} was poisoned by an I/O failure ({self._poisoned}); "
                    "closed, reopen it to recover what is on disk (SF-19)"
                )
                error.errno = self._poisoned.errno
            if error is not None:
                raise error

    def stats(self) -> SlotStats:
        with self._cond:
            return SlotStats(
                segments=len(self._segments),
                total_bytes=self._total_bytes(),
                published_fsn=self.published_fsn,
                acked_fsn=self.acked_fsn,
                persisted_watermark=self._persisted,
                torn_tails_at_open=self._torn_at_open,
                watermark_used_at_open=self._watermark_used,
                trimmed_segments=self._trimmed,
                created_segments=self._created,
            )

    def __enter__(self) -> Slot:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def check_sender_id(sender_id: object) -> str:
    """A sender_id is a single directory name: non-empty, no path separators (FWD-1), and
    tidelog adds: not ``.``/``..``, no NUL or control characters."""
    if not isinstance(sender_id, str) or not sender_id:
        raise BadArgument(f"sender_id must be a non-empty string, got {sender_id!r}")
    if "/" in sender_id or "\\" in sender_id or sender_id in (".", ".."):
        raise BadArgument(f"sender_id {sender_id!r} must not contain path separators")
    if any(ord(c) < 32 or ord(c) == 127 for c in sender_id):
        raise BadArgument(f"sender_id {sender_id!r} must not contain control characters")
    return sender_id


def write_failed(fs: FS, slot_dir: str, reason: str) -> None:
    """Drop the ``.failed`` sentinel (UTF-8 reason, its presence is the signal, SF-16). The
    caller still holds the slot lock: a drainer writes it before releasing the slot.

    raises: StorageError (SF-19)
    """
    path = os.path.join(slot_dir, FAILED_FILE)
    with typed_io(f"writing {path}"):
        h = fs.open(path)
        try:
            h.truncate(0)
            h.pwrite((reason.rstrip() + "\n").encode("utf-8"), 0)
            h.fsync()
        finally:
            h.close()
        fs.fsync_dir(slot_dir)
