"""The recovery scan of a slot directory (spec/FORWARD.md SF-7..SF-10,
SF-17, SF-18).

Read-only: ``examine`` reports what is on disk as findings (errors: recovery refuses; warnings:
recovery repairs or ignores) and the ``(ackedFsn, publishedFsn)`` seed; ``recover`` raises on
the first error; ``tidelog verify`` prints the same findings (SF-18: verify says exactly what
recovery does). The slot then acts on a clean result (removes unborn files, zeroes a torn tail
before appending). The seed arithmetic and the contiguity check are the model's
(``tidelog.model.fsn.recovery_seed``, FSN-5), so the code and the oracle cannot drift apart.

Fail closed (SF-8): a segment whose header is invalid refuses recovery rather than
being skipped, because skipping it would silently drop whatever unacknowledged frames it holds.
A defect after the last good frame is a torn tail unless surviving bytes prove it was durable
(SF-18): a later segment's baseSeq, or the sync record in ``.tidelog-sync`` (SF-17). A file
that is entirely zero is an unborn segment (a crash between creating it and writing its
header), unless something proves it held frames.
"""

from __future__ import annotations

import bisect
import errno
import logging
import os
from array import array
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from itertools import pairwise

from tidelog.errors import Corrupt, StorageError
from tidelog.fsio import FS, storage_error
from tidelog.model.fsn import recovery_seed

from . import records as rec2
from .format import (
    HEADER_SIZE,
    LEGACY_SEGMENT,
    SYNC_COPY_OFFSETS,
    SYNC_RECORD_SIZE,
    WATERMARK_MAGIC,
    WMCHECK_OFFSET,
    WMCHECK_SIZE,
    SyncRecord,
    decode_header,
    decode_sync_record,
    decode_watermark,
    decode_watermark_check,
    frame_end,
    is_segment_name,
    scan_frames,
    segment_generation,
)

__all__ = [
    "WATERMARK_FILE",
    "MANIFEST_FILE",
    "FAILED_FILE",
    "CORRUPT_SUFFIX",
    "SYNC_FILE",
    "TMP_SUFFIX",
    "ERROR",
    "WARNING",
    "Finding",
    "SyncState",
    "RecoveredSegment",
    "Recovery",
    "examine",
    "recover",
    "refusal",
    "segment_order",
    "located",
    "read_sync",
    "read_watermark",
    "read_watermark_file",
    "read_manifest",
    "WatermarkFile",
]

log = logging.getLogger("tidelog.sf")

WATERMARK_FILE = ".ack-watermark"
MANIFEST_FILE = "sf-manifest.bin"  # slot format 2 (SF-25)
CORRUPT_SUFFIX = ".corrupt"  # questdb 6.0.0's quarantine (SF-27)
SYNC_FILE = ".tidelog-sync"  # SF-17: tidelog's evidence of what the slot made durable
TMP_SUFFIX = ".tmp"  # a segment under construction: sf-<gen>.sfa.tmp (SF-5)
FAILED_FILE = ".failed"
ERROR, WARNING = "error", "warning"
_SYNC_READ = WMCHECK_OFFSET + WMCHECK_SIZE
_Add = Callable[[str, "str | None", "int | None", str, str], None]


@dataclass(frozen=True)
class Finding:
    """One thing recovery found: an ``error`` refuses the slot, a ``warning`` is repaired or
    ignored without losing anything acknowledged (SF-18; CNF-31)."""

    severity: str
    name: str | None  # a file in the slot directory
    offset: int | None
    rule: str
    message: str


@dataclass
class RecoveredSegment:
    name: str
    generation: int | None  # None: the legacy sf-initial.sfa
    base_seq: int
    created_micros: int
    size: int  # file size: the segment's capacity
    offsets: array[int]  # start offset of each verified frame ("q")
    append_cursor: int  # end of the last verified frame
    torn_tail: int  # non-zero bytes right after append_cursor (SF-7)
    dirty_end: int  # end of the last non-zero byte at or after append_cursor (0 when clean)
    # A CRC-valid frame right after the bad one at append_cursor (SF-18 item 3), or None.
    valid_after_defect: int | None = None
    flags: int = 0  # header byte 5 (SF-25: MANIFEST_REQUIRED in slot format 2)

    @property
    def frame_count(self) -> int:
        return len(self.offsets)

    @property
    def last_seq(self) -> int:
        return self.base_seq + len(self.offsets) - 1

    @property
    def defect(self) -> bool:
        return self.dirty_end > self.append_cursor


@dataclass
class SyncState:
    """The two copies of the sync record in ``.tidelog-sync`` (SF-17) and the watermark check."""

    exists: bool = False
    copies: tuple[SyncRecord | None, SyncRecord | None] = (None, None)
    nonzero: tuple[bool, bool] = (False, False)
    watermark_check: int | None = None

    @property
    def newest_index(self) -> int | None:
        valid = [i for i, c in enumerate(self.copies) if c is not None]
        return max(valid, key=lambda i: self.copies[i].counter) if valid else None  # type: ignore[union-attr]

    @property
    def newest(self) -> SyncRecord | None:
        i = self.newest_index
        return None if i is None else self.copies[i]


@dataclass
class Recovery:
    segments: list[RecoveredSegment]  # sorted by (base_seq, frame_count): the last is active
    acked_fsn: int
    published_fsn: int
    watermark: int | None  # the watermark recovery trusts (SF-10, SF-17), before the bound check
    watermark_used: bool  # it raised the seed above lowestBaseSeq - 1
    next_generation: int  # max(existing generation) + 1 (SF-5)
    unborn: list[str] = field(default_factory=list)  # all-zero segment files (no frames)
    leftovers: list[str] = field(default_factory=list)  # *.sfa.tmp: creations cut short
    vanished: list[str] = field(default_factory=list)  # listed, gone when opened (a view's)
    sync: SyncState = field(default_factory=SyncState)
    findings: list[Finding] = field(default_factory=list)
    version: int = 1  # the slot format found (SF-23)
    manifest: rec2.Record | None = None  # sf-manifest.bin's value (SF-25)
    watermark_generation: int = 0  # of the dual-slot .ack-watermark's value (SF-24), 0: none
    # Format 2: empty non-active segments and trimmed leftovers below the manifest's head
    # (SF-26, SF-28): no FSN of the slot is in them; a writing open deletes them.
    extras: list[str] = field(default_factory=list)

    @property
    def torn_tails(self) -> int:
        return sum(1 for s in self.segments if s.torn_tail)


class _Invalid(Exception):
    """A segment recovery must refuse (SF-8), with the rule its header or size breaks."""

    def __init__(self, rule: str, message: str) -> None:
        super().__init__(message)
        self.rule, self.message = rule, message


def _read_all(fs: FS, path: str, limit: int | None = None) -> bytes:
    h = fs.open_read(path)
    try:
        return h.pread(h.size() if limit is None else limit, 0)
    finally:
        h.close()


def _scan_segment(fs: FS, slot_dir: str, name: str) -> RecoveredSegment | None:
    """Map the segment read-only and walk it (SF-7); None when unborn."""
    path = os.path.join(slot_dir, name)
    try:
        h = fs.open_read(path)
        try:
            data = h.map()
            try:
                return _scan_mapped(path, name, data)
            finally:
                data.release()  # the map itself goes with the handle
        finally:
            h.close()
    except StorageError:
        raise
    except OSError as exc:  # SF-8, SF-19: a failed read is io_error, not damage
        raise storage_error(exc, f"reading SF segment {path} (SF-19)") from None


def _scan_mapped(path: str, name: str, data: memoryview) -> RecoveredSegment | None:
    size = len(data)
    # Unborn (module docstring): all zeros. The header decides quickly for a live segment.
    if not any(data[:HEADER_SIZE]) and data == bytes(size):
        return None
    if size < HEADER_SIZE:
        raise _Invalid("SF-8", f"{size} bytes, shorter than a segment header (24 bytes)")
    try:
        header = decode_header(data, "segment header")
    except Corrupt as exc:
        raise _Invalid("SF-3", exc.message) from None
    scan = scan_frames(data)
    tail = bytes(data[scan.last_good :]).rstrip(b"\0")
    after = None
    if tail:  # SF-18 item 3: the frame after the bad one, when its length can be trusted
        end = frame_end(data, scan.last_good, check=False)
        if end is not None and frame_end(data, end) is not None:
            after = end
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
        valid_after_defect=after,
        flags=rec2.header_flags(data),
    )


@dataclass(frozen=True)
class WatermarkFile:
    """What ``.ack-watermark`` holds (SF-6, SF-24)."""

    exists: bool = False
    fsn: int | None = None  # None: no usable value (a format-2 -1, "nothing acked", too)
    dual: bool = False  # 8192 bytes: the dual-slot file of slot format 2 (SF-24)
    generation: int = 0  # of the dual-slot value (0: none)
    nonzero: bool = False  # any byte set (a client's fresh file is all zero)


def read_watermark(fs: FS, slot_dir: str) -> int | None:
    """The watermark recovery trusts (SF-10, SF-17, SF-28): the ``.ack-watermark`` FSN (None
    when absent or unusable), in format 1 lowered to its check in ``.tidelog-sync`` when that
    is smaller.

    raises: StorageError (SF-19)
    """
    wm = read_watermark_file(fs, slot_dir)
    if wm.dual or wm.fsn is None:
        return wm.fsn
    check = read_sync(fs, slot_dir).watermark_check
    return wm.fsn if check is None else min(wm.fsn, check)


def read_watermark_file(fs: FS, slot_dir: str) -> WatermarkFile:
    """``.ack-watermark`` read as slot format 2's dual-slot file when it is 8192 bytes (SF-24),
    else as format 1's 16-byte record (SF-6)."""
    path = os.path.join(slot_dir, WATERMARK_FILE)
    try:
        if not fs.exists(path):
            return WatermarkFile()
        data = _read_all(fs, path)
    except OSError as exc:
        raise storage_error(exc, f"reading {path} (SF-19)") from None
    if len(data) == rec2.DUAL_FILE_SIZE:
        value = rec2.read_dual(data, WATERMARK_MAGIC)
        fsn = None if value is None or value.first < 0 else value.first
        gen = 0 if value is None else value.generation
        return WatermarkFile(True, fsn, True, gen, any(data))
    return WatermarkFile(True, decode_watermark(data), False, 0, any(data))


def read_manifest(fs: FS, slot_dir: str) -> tuple[bool, rec2.Record | None]:
    """(whether ``sf-manifest.bin`` exists, its value or None: SF-24, SF-25)."""
    path = os.path.join(slot_dir, MANIFEST_FILE)
    try:
        if not fs.exists(path):
            return False, None
        return True, rec2.read_dual(_read_all(fs, path), rec2.MANIFEST_MAGIC)
    except OSError as exc:
        raise storage_error(exc, f"reading {path} (SF-19)") from None


def read_sync(fs: FS, slot_dir: str) -> SyncState:
    """Both copies of the sync record and the watermark check (SF-17)."""
    path = os.path.join(slot_dir, SYNC_FILE)
    try:
        if not fs.exists(path):
            return SyncState()
        data = _read_all(fs, path, _SYNC_READ)
    except OSError as exc:
        raise storage_error(exc, f"reading {path} (SF-19)") from None
    raw = [data[o : o + SYNC_RECORD_SIZE] for o in SYNC_COPY_OFFSETS]
    return SyncState(
        exists=True,
        copies=(decode_sync_record(raw[0]), decode_sync_record(raw[1])),
        nonzero=(any(raw[0]), any(raw[1])),
        watermark_check=decode_watermark_check(data[WMCHECK_OFFSET:_SYNC_READ]),
    )


def segment_order(name: str) -> int:
    """Where a segment file stands among the others: its generation (the legacy
    sf-initial.sfa, which predates generations, first)."""
    gen = segment_generation(name)
    return -1 if gen is None else gen


def _names_segment(rec: SyncRecord, name: str) -> bool:
    if rec.generation is None:
        return name == LEGACY_SEGMENT
    return name != LEGACY_SEGMENT and segment_generation(name) == rec.generation


def examine(
    fs: FS,
    slot_dir: str,
    known: Mapping[str, RecoveredSegment] | None = None,
    *,
    beside_writer: bool = False,
) -> tuple[Recovery | None, list[Finding]]:
    """Scan every file of ``slot_dir`` (read-only) and classify what is found (SF-7..SF-10,
    SF-17, SF-18). Returns the recovery (None when an error finding refuses it) and every
    finding, errors first in file order.

    ``known``: segments a read-only view scanned before and knows to be unchanged (sealed, same
    header: SF-21); they are not read again. ``beside_writer`` (a view, SF-21): a segment listed
    but gone when the scan opens it is skipped as if not listed (``Recovery.vanished``), and
    so is every segment below it (trims go lowest first).

    raises: StorageError (a read failed: SF-19)
    """
    findings: list[Finding] = []

    def add(severity: str, name: str | None, offset: int | None, rule: str, msg: str) -> None:
        findings.append(Finding(severity, name, offset, rule, msg))

    # SF-21: the claims (sync record, watermark) are read before the segments, so a writer
    # working beside a read-only view can only have written more than they claim, never less.
    sync = read_sync(fs, slot_dir)
    watermark_file = read_watermark_file(fs, slot_dir)
    manifest_exists, manifest = read_manifest(fs, slot_dir)
    try:
        names = fs.listdir(slot_dir)
    except OSError as exc:
        raise storage_error(exc, f"listing SF slot {slot_dir} (SF-19)") from None
    segments: list[RecoveredSegment] = []
    unborn: list[tuple[str, int | None]] = []
    generations: list[int] = []
    leftovers: list[str] = []
    vanished: list[str] = []
    for name in names:
        if name.endswith(CORRUPT_SUFFIX) and is_segment_name(name[: -len(CORRUPT_SUFFIX)]):
            gen = segment_generation(name[: -len(CORRUPT_SUFFIX)])
            if gen is not None:  # SF-27: a quarantined name is never reused
                generations.append(gen)
            continue
        if name.endswith(TMP_SUFFIX) and is_segment_name(name[: -len(TMP_SUFFIX)]):
            leftovers.append(name)  # never renamed into place: holds no frame
            add(WARNING, name, None, "SF-5", "an interrupted segment creation: recovery deletes it")
            continue
        if not is_segment_name(name):
            continue
        gen = segment_generation(name)
        if gen is not None:
            generations.append(gen)
        try:
            seg = known[name] if known and name in known else _scan_segment(fs, slot_dir, name)
        except _Invalid as exc:
            add(ERROR, name, 0, exc.rule, f"{exc.message}: recovery refuses the slot")
            continue
        except StorageError as exc:
            if beside_writer and exc.errno == errno.ENOENT:
                vanished.append(name)  # trimmed since the listing: the view decides
                continue
            raise
        if seg is None:
            unborn.append((name, gen))
        else:
            segments.append(seg)
    if vanished:  # SF-21, SF-12: trims go lowest first, so everything below went too
        top = max(map(segment_order, vanished))
        segments = [s for s in segments if segment_order(s.name) > top]
        unborn = [(n, g) for n, g in unborn if segment_order(n) > top]
    segments.sort(key=lambda s: (s.base_seq, s.frame_count))
    version = 2 if manifest_exists or watermark_file.dual or any(s.flags for s in segments) else 1
    extras: list[str] = []
    if version == 2:
        segments, extras = _format2_chain(segments, manifest, add, trimmed=bool(vanished))
    record = _check_sync_file(sync, add)
    _check_unborn(segments, unborn, record, add)
    _check_order(segments, add)
    if record is not None:
        _check_claim(segments, record, add, other_writer=version == 2)
    if (
        segments
        and segments[-1].defect
        and not any(f.severity == ERROR and f.name == segments[-1].name for f in findings)
    ):
        last = segments[-1]
        add(WARNING, last.name, last.append_cursor, "SF-7",
            f"torn tail: {last.dirty_end - last.append_cursor} bytes after the last good frame "
            f"are not zero ({last.torn_tail} non-zero bytes in the next 8): a frame write was "
            "interrupted; recovery zeroes them before appending (SF-9), nothing acknowledged "
            "as durable is in them")  # fmt: skip
    watermark = _check_watermark(watermark_file, sync, segments, add)
    errors = [f for f in findings if f.severity == ERROR]
    if errors:
        return None, errors + [f for f in findings if f.severity != ERROR]
    acked, published = recovery_seed([(s.base_seq, s.frame_count) for s in segments], watermark)
    lowest = segments[0].base_seq - 1 if segments else -1
    rec = Recovery(
        segments=segments,
        acked_fsn=acked,
        published_fsn=published,
        watermark=watermark,
        watermark_used=acked > lowest,
        next_generation=max(generations) + 1 if generations else 0,
        unborn=[n for n, _ in unborn],
        leftovers=leftovers,
        vanished=vanished,
        sync=sync,
        findings=findings,
        version=version,
        manifest=manifest,
        watermark_generation=watermark_file.generation,
        extras=extras,
    )
    return rec, findings


def _check_sync_file(sync: SyncState, add: _Add) -> SyncRecord | None:
    """SF-17: a torn copy is a warning (the other holds the previous sync point); two non-zero
    invalid copies cannot come from a power loss (only the copy being written can tear)."""
    if not sync.exists:
        return None
    bad = [i for i in (0, 1) if sync.nonzero[i] and sync.copies[i] is None]
    if len(bad) == 2:
        add(ERROR, SYNC_FILE, 0, "SF-18",
            "both copies of the sync record are damaged (a power loss tears at most the copy "
            "being written): what the slot made durable is unknown; removing the file accepts "
            "that (SF-18)")  # fmt: skip
    elif bad and sync.newest is not None:
        add(WARNING, SYNC_FILE, SYNC_COPY_OFFSETS[bad[0]], "SF-17",
            "one copy of the sync record is unreadable (a torn write, or damage to the older "
            "copy): recovery uses the other")  # fmt: skip
    return sync.newest


def _check_unborn(
    segments: list[RecoveredSegment],
    unborn: list[tuple[str, int | None]],
    record: SyncRecord | None,
    add: _Add,
) -> None:
    """SF-8: only the newest segment can be unborn; one the sync record names held frames."""
    live = [s.generation for s in segments if s.generation is not None]
    top = max(live) if live else -1
    for name, gen in unborn:
        if record is not None and _names_segment(record, name):
            add(ERROR, name, 0, "SF-18",
                f"all zero, but the sync record proves {record.synced_frames} frames from FSN "
                f"{record.base_seq} were durable in it: damage (truncated or zeroed)")  # fmt: skip
        elif gen is not None and gen < top:
            add(ERROR, name, 0, "SF-18",
                f"all zero, below a live segment of generation {top} (segments are created in "
                "generation order, so a crash leaves only the newest unborn): damage")  # fmt: skip
        else:
            add(
                WARNING,
                name,
                None,
                "SF-8",
                "unborn segment (all zeros, no frame): recovery deletes it",
            )


def _check_order(segments: list[RecoveredSegment], add: _Add) -> None:
    """SF-10, SF-18 item 1: a gap, named at the defect that explains it when there is one."""
    for prev, nxt in pairwise(segments):
        end = prev.base_seq + prev.frame_count
        if end != nxt.base_seq and prev.defect and nxt.base_seq > end:
            add(ERROR, prev.name, prev.append_cursor, "SF-18",
                f"segments not contiguous: the frame at offset {prev.append_cursor} is damaged: "
                f"{nxt.name} starts at baseSeq {nxt.base_seq}, so FSNs {end}..{nxt.base_seq - 1} "
                "were written here")  # fmt: skip
        elif end != nxt.base_seq:
            add(ERROR, nxt.name, 8, "SF-10",
                f"segments not contiguous: baseSeq {nxt.base_seq} does not follow {prev.name} "
                f"({prev.base_seq} + {prev.frame_count} frames): a gap")  # fmt: skip
        elif prev.defect:
            add(WARNING, prev.name, prev.append_cursor, "SF-7",
                f"{prev.dirty_end - prev.append_cursor} bytes after the last frame of a sealed "
                "segment are not zero; no frame is missing (the next segment's baseSeq "
                "follows): recovery leaves them")  # fmt: skip


def _check_claim(
    segments: list[RecoveredSegment], rec: SyncRecord, add: _Add, *, other_writer: bool = False
) -> None:
    """SF-18 items 2-3: what the sync record proves about the segment it names."""
    named = [s for s in segments if _names_segment(rec, s.name)]
    if not named:
        return  # trimmed, or another client's slot since: no claim
    seg = named[0]
    recreated = ""
    if seg.created_micros != rec.created_micros:
        add(WARNING, seg.name, 16, "SF-17",
            f"createdMicros {seg.created_micros} differs from the sync record's "
            f"{rec.created_micros}: damage to this informational field (the records' ts), or "
            "another client recreated the segment under this name")  # fmt: skip
        recreated = " (if another SF client rewrote this slot, remove .tidelog-sync)"
        if other_writer:
            # SF-28: questdb 6.0.0 restarts generations at 0 after its fully drained close, so
            # in format 2 a different createdMicros is another file under the same name.
            return
    if seg.base_seq != rec.base_seq:
        add(ERROR, seg.name, 8, "SF-18",
            f"header baseSeq {seg.base_seq}, but the sync record says {rec.base_seq} for this "
            "segment: damage (every frame would be renumbered)")  # fmt: skip
        return
    end, frames = rec.synced_end, rec.synced_frames
    below = bisect.bisect_left(seg.offsets, end)
    boundary = end == seg.append_cursor or (below < seg.frame_count and seg.offsets[below] == end)
    if seg.append_cursor < end or below != frames or not boundary:
        at = seg.append_cursor if seg.append_cursor < end else end
        add(ERROR, seg.name, at, "SF-18",
            f"the frame at offset {at} is damaged: the sync record proves {frames} frames "
            f"through offset {end} (FSN {rec.base_seq + frames - 1}) were durable, the walk "
            f"finds {below} valid frames below it{recreated}")  # fmt: skip
    elif rec.append and seg is segments[-1] and seg.valid_after_defect is not None:
        add(ERROR, seg.name, seg.append_cursor, "SF-18",
            f"the frame at offset {seg.append_cursor} is damaged: a valid frame follows at "
            f"offset {seg.valid_after_defect}, and under sf_durability=append (sync record) "
            f"every frame was synced before the next one was written{recreated}")  # fmt: skip


def _check_watermark(
    watermark_file: WatermarkFile,
    sync: SyncState,
    segments: list[RecoveredSegment],
    add: _Add,
) -> int | None:
    """SF-6, SF-10, SF-17, SF-28: the watermark recovery trusts (None: none)."""
    wm = raw = watermark_file.fsn
    if watermark_file.dual:
        if watermark_file.nonzero and watermark_file.generation == 0:
            add(WARNING, WATERMARK_FILE, 0, "SF-24",
                "neither half holds a valid record (magic 'AKW1', version 1, CRC-32C, "
                "generation > 0): recovery replays from the lowest segment")  # fmt: skip
    elif watermark_file.exists and wm is None:
        add(WARNING, WATERMARK_FILE, 0, "SF-6",
            "not a valid watermark record (magic 'AKW1', reserved 0, fsn >= 0): recovery "
            "ignores it and replays from the lowest segment")  # fmt: skip
    check = None if watermark_file.dual else sync.watermark_check
    if wm is not None and check is not None and check != wm:
        add(WARNING, SYNC_FILE, WMCHECK_OFFSET, "SF-17",
            f"the watermark says {wm}, its check {check} (a crash kept one write, another "
            "client advanced the watermark, or damage): recovery trusts the smaller")  # fmt: skip
        wm = min(wm, check)
    if segments and raw is not None:
        published = segments[-1].base_seq + segments[-1].frame_count - 1
        if raw > published:
            add(WARNING, WATERMARK_FILE, 8, "SF-10",
                f"watermark {raw} above publishedFsn {published}: recovery ignores it (frames "
                f"the receiver acknowledged were lost from an unsynced tail, or damage); FSNs "
                f"{published + 1}..{raw} may be handed out again (SF-20)")  # fmt: skip
    return wm


def _format2_chain(
    segments: list[RecoveredSegment],
    manifest: rec2.Record | None,
    add: _Add,
    *,
    trimmed: bool = False,
) -> tuple[list[RecoveredSegment], list[str]]:
    """SF-26, SF-28: the segments that hold the slot's FSNs (the chain, then an empty active)
    and the names of the others (spares, empty leftovers, trimmed leftovers below the head).
    ``segments`` is sorted by (baseSeq, frameCount). ``trimmed``: a view saw segments vanish
    (SF-21), so the manifest it read first may name a head a trim has since moved past."""
    data = [s for s in segments if s.frame_count]
    empty = [s for s in segments if not s.frame_count]
    # An empty active: the torn one first (the client's pick), then the oldest generation.
    empty.sort(key=lambda s: (not s.defect, segment_order(s.name)))
    if manifest is None:
        flagged = [s for s in segments if s.flags & rec2.MANIFEST_REQUIRED]
        if flagged:
            add(ERROR, flagged[0].name, rec2.FLAGS_OFFSET, "SF-28",
                f"MANIFEST_REQUIRED is set but {MANIFEST_FILE} is missing or holds no valid "
                "record: the slot's head and active segment are unknown (questdb 6.0.0 "
                "refuses it too)")  # fmt: skip
            return segments, []
        # A slot whose creation stopped before its manifest: read as the client's legacy mode.
        keep = data or empty[:1]
        return keep, [s.name for s in segments if s not in keep]
    head, active = manifest.first, manifest.second
    chain: list[RecoveredSegment] = []
    extras: list[str] = []
    for s in data:
        end = s.base_seq + s.frame_count
        if end <= head:
            add(WARNING, s.name, None, "SF-28",
                f"frames {s.base_seq}..{end - 1} lie below the manifest's head {head}: a trim "
                "stopped before this unlink; recovery deletes it")  # fmt: skip
            extras.append(s.name)
        elif s.base_seq < head:
            add(ERROR, s.name, 8, "SF-28",
                f"baseSeq {s.base_seq} with {s.frame_count} frames straddles the manifest's "
                f"head {head}")  # fmt: skip
        elif s.base_seq > active:
            add(ERROR, s.name, 8, "SF-28",
                f"holds frames from baseSeq {s.base_seq}, beyond the manifest's active "
                f"segment base {active}: frames only go to the active segment")  # fmt: skip
        else:
            chain.append(s)
    if chain and trimmed and chain[0].base_seq > head:
        head = chain[0].base_seq  # the trim that removed the vanished ones advanced it first
    if chain and chain[0].base_seq != head:
        add(ERROR, chain[0].name, 8, "SF-28",
            f"the oldest segment starts at baseSeq {chain[0].base_seq}, the manifest's head is "
            f"{head}: the head segment is missing")  # fmt: skip
    tail = chain[-1] if chain else None
    if tail is None or tail.base_seq != active:
        at = tail.base_seq + tail.frame_count if tail else active
        spare = next((s for s in empty if s.base_seq == active), None)
        if spare is not None and at == active and (tail is not None or head == active):
            chain.append(spare)
        elif tail is None and head != active:
            add(ERROR, MANIFEST_FILE, None, "SF-28",
                f"no segment holds frames from the manifest's head {head} on, but its active "
                f"base is {active}: FSNs {head}..{active - 1} are missing")  # fmt: skip
        elif tail is not None:
            add(ERROR, tail.name, None, "SF-28",
                f"no segment at the manifest's active base {active} (the chain ends at FSN "
                f"{at - 1})")  # fmt: skip
    extras += [s.name for s in empty if s not in chain]
    return chain, extras


def recover(fs: FS, slot_dir: str) -> Recovery:
    """Scan every ``*.sfa`` of ``slot_dir`` and seed the FSN counters (SF-7, FSN-5);
    warnings are logged.

    raises: Corrupt (the first error finding: file, offset, rule), StorageError (SF-19)
    """
    rec, findings = examine(fs, slot_dir)
    if rec is None:
        raise refusal(slot_dir, findings)
    for f in findings:
        log.warning("SF %s: %s (%s)", located(slot_dir, f), f.message, f.rule)
    return rec


def located(slot_dir: str, f: Finding) -> str:
    """The file (or slot) and byte offset a finding names."""
    where = os.path.join(slot_dir, f.name) if f.name else slot_dir
    return where + (f" at offset {f.offset}" if f.offset is not None else "")


def refusal(slot_dir: str, findings: list[Finding]) -> Corrupt:
    """The ``Corrupt`` for the first error finding (``examine`` puts errors first)."""
    first = findings[0]
    more = sum(1 for f in findings if f.severity == ERROR) - 1
    extra = f" (and {more} more error(s): tidelog verify lists them)" if more else ""
    return Corrupt(
        f"SF slot {slot_dir}: {located(slot_dir, first)}: {first.message} ({first.rule}){extra}"
    )
