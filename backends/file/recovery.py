"""Opening a file store, the reading half: what the files say, as a plan (SNAP-4, PRG-9).

Recovery reads the store's files through the FS seam and returns a ``RecoveryPlan``, an immutable
value: the snapshot to rebuild from, the complete op batches of every WAL file to replay, where
each stream's replay ended, and what opening must do to the files (truncate, seal, discard) and
the warnings it raises. It writes nothing: a refusal (``Corrupt``, FLT-1, FLT-2) is raised while
the plan is being made, before any file is changed. The backend applies the plan: the engine
state through the ``apply_*`` path (replay.py), then the file actions, then new WAL files.

1. The newest valid snapshot (an older one if the newest is damaged; none = a new store).
2. Every WAL directory from the snapshot's replay position, op batch by op batch (a batch
   without its BATCH_END frame is a torn op and is discarded whole). The first torn frame ends the
   log: the file is truncated (or sealed, WAL-15) there and nothing after it is used. Valid frames
   in a later file after a torn one mean real corruption (files are synced before the next is
   written): refuse.
"""

from __future__ import annotations

import mmap
import os
import struct
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

from tidelog.errors import Corrupt
from tidelog.fsio import FS, read_whole, whole_object, zero_after

from .format import snapshot as snapfmt
from .format import wal as walfmt
from .format.wal import FrameType
from .walchunk import WalFile

__all__ = [
    "RecoveryPlan",
    "WalPart",
    "WalPlan",
    "plan_recovery",
    "plan_wal",
    "newest_snapshot",
    "list_streams",
]

_MARKS = (int(FrameType.CHECKPOINT), int(FrameType.SYNCED))  # frames without an effect


@dataclass(frozen=True)
class WalPart:
    """One WAL file's complete op batches, in order (a torn tail is already left out)."""

    path: str
    batches: Sequence[Sequence[walfmt.Frame]]
    wal: WalFile | None  # the writer's map of the file (records stay there, WTAIL-1)

    @property
    def effects(self) -> int:
        """Batches that carry an effect (a batch of a CHECKPOINT or SYNCED frame alone does
        not: WAL-8, WAL-16)."""
        return sum(1 for b in self.batches if not (len(b) == 1 and b[0][0] in _MARKS))


@dataclass(frozen=True)
class WalPlan:
    """What replaying every WAL stream from a position takes, and leaves to do."""

    parts: tuple[WalPart, ...]
    positions: Mapping[str, tuple[int, int]]  # stream -> (gen, offset) its last batch ended at
    highest: Mapping[str, int]  # stream -> highest file gen on disk
    truncate: tuple[tuple[str, int], ...] = ()  # (path, end): WAL-4
    seal: tuple[tuple[str, int, int], ...] = ()  # (path, end, seed): FILE_END there, WAL-15
    discard: tuple[str, ...] = ()  # files a crash left without a header (never held a frame)
    warnings: tuple[str, ...] = ()

    @property
    def effects(self) -> int:
        return sum(p.effects for p in self.parts)

    def release(self) -> None:
        """Unmap every file no chunk took: once, by whoever made the plan, after applying it
        or instead of it. The frames go first: their data are views of the maps, and a map
        with a view still out stays mapped (its descriptor open) until the view is freed, so
        a chunk's map would outlive the chunk wherever the plan lingers (a refused open's
        traceback holds it: FLT-7, nothing held after a failed open). So ``effects`` (and a
        ``RecoveryPlan``'s ``clean``) must be read before."""
        for part in self.parts:
            if isinstance(part.batches, list):
                part.batches.clear()
            if part.wal is not None and part.wal.refs == 0:
                part.wal.release()


@dataclass(frozen=True)
class RecoveryPlan:
    """What opening a writer recovers (the snapshot, the WAL to replay) and must do to the
    files. ``snapshot`` is None for a new store (no snapshot, no WAL file)."""

    snapshot: tuple[int, Mapping[str, Any]] | None
    wal: WalPlan
    warnings: tuple[str, ...]  # the snapshot's (a damaged newer copy skipped), then the WAL's

    @property
    def clean(self) -> bool:
        """A clean close wrote the snapshot with every restart rule applied and nothing after
        it (DUR-1)."""
        return (
            self.snapshot is not None
            and bool(self.snapshot[1].get("clean"))
            and not (self.wal.effects)
        )


def plan_recovery(fs: FS, root: str, *, readonly: bool = False) -> RecoveryPlan:
    """Read the store at ``root``: its snapshot and the WAL after it (module docstring).
    ``Corrupt`` for damage (FLT-2) or WAL files without a snapshot; nothing is written."""
    found = newest_snapshot(fs, root)
    if found is None:
        if not readonly and any(
            walfmt.parse_file_name(name) is not None
            for _, d in list_streams(fs, root)
            for name in fs.listdir(d)
        ):
            raise Corrupt(
                f"{root}: WAL files but no snapshot: not a store this version "
                "wrote, or its metadata was removed (SNAP)"
            )
        empty = WalPlan((), {}, {}) if readonly else plan_wal(fs, root, b"", {})
        return RecoveryPlan(None, empty, ())
    n, body, skipped = found
    wal = body["wal"]
    plan = plan_wal(
        fs,
        root,
        bytes.fromhex(body["store_id"]),
        wal["replay_from"],
        readonly=readonly,
        wal_durable=bool(wal.get("wal_durable")),
    )
    return RecoveryPlan((n, body), plan, tuple(skipped))


# -- snapshot --------------------------------------------------------------------------------
def newest_snapshot(fs: FS, root: str) -> tuple[int, dict[str, Any], list[str]] | None:
    """The newest valid snapshot (n, body, what was wrong with newer ones), None if there is
    none at all; ``Corrupt`` if there are snapshots but none is valid (SNAP)."""
    meta = os.path.join(root, "meta")
    errors = []
    for n, names in sorted(snapfmt.copies(fs.listdir(meta)).items(), reverse=True):
        for name in names:  # the file, then its mirror (SNAP-5)
            path = os.path.join(meta, name)
            try:
                got, body = snapfmt.decode_snapshot(read_whole(fs, path))
            except Corrupt as exc:
                errors.append(f"{path}: {exc.message}")
                continue
            if got != n:
                errors.append(f"{path}: header says snapshot {got}")
                continue
            return n, body, errors
    if errors:
        raise Corrupt("no valid snapshot: " + "; ".join(errors) + " (SNAP)")
    return None


# -- WAL ---------------------------------------------------------------------------------------
def plan_wal(
    fs: FS,
    root: str,
    store_id: bytes,
    replay_from: Mapping[str, Sequence[int]],
    *,
    readonly: bool = False,
    wal_durable: bool = False,
) -> WalPlan:
    """Every WAL stream from ``replay_from`` (stream key -> [gen, offset]). ``positions`` holds,
    per stream, where the last complete op batch ended, so a read-only view can resume there
    (XPR-1). A read-only plan never truncates or removes anything: an incomplete tail is a
    writer still writing. On ``Corrupt`` every file mapped so far is released."""
    parts: list[WalPart] = []
    positions: dict[str, tuple[int, int]] = {}
    highest: dict[str, int] = {}
    truncate: list[tuple[str, int]] = []
    seal: list[tuple[str, int, int]] = []
    discard: list[str] = []
    warnings: list[str] = []
    try:
        for key, directory in list_streams(fs, root):
            start_gen, start_off = replay_from.get(key, [0, walfmt.HEADER_SIZE])
            gens = sorted(
                g
                for name in fs.listdir(directory)
                if (g := walfmt.parse_file_name(name)) is not None
            )
            highest[key] = max(gens, default=0)
            positions[key] = (start_gen, start_off)
            newest = gens[-1] if gens else 0
            if not readonly:
                later = [g for g in gens if g >= start_gen]
                # without "wal_durable" (older snapshots) the replay position's file may be
                # missing only when no later file exists either: a crash lost it before it held
                # anything
                strict = wal_durable or bool(later)
                _check_contiguous(directory, later, start_gen if strict else 0)
            for gen in gens:
                if gen < start_gen:
                    continue
                path = os.path.join(directory, walfmt.file_name(gen))
                offset = start_off if gen == start_gen else walfmt.HEADER_SIZE
                try:
                    scanned = _scan_file(fs, path, offset, gen, store_id, readonly)
                except _NoHeader as exc:
                    if gen != newest:
                        raise Corrupt(
                            f"{exc.message}, and newer WAL files follow it (WAL)"
                        ) from None
                    if not _zero_from(fs, path, walfmt.HEADER_SIZE):
                        # frames are written only after the header is durable (WAL-11, WAL-15)
                        raise Corrupt(
                            f"{exc.message}, yet bytes after it are not zero: a damaged header "
                            "over frames, not a file a crash left unfinished (WAL-1, FLT-1)"
                        ) from None
                    if not readonly:
                        discard.append(path)
                        warnings.append(f"{path}: never completed (no valid header): removed")
                    continue
                end, frames, torn, wal, sealing = scanned[:5]
                if sealing is not None and not sealing.sealed and gen != newest:
                    torn = True  # WAL-15: a version-3 file but the newest ends with FILE_END
                if torn and gen != newest and not readonly:
                    if wal is not None:
                        wal.release()
                    # the file was synced before the next one was created (WAL-11): whatever
                    # ends its log early was durable, so it is damage, never a torn tail (FLT-1)
                    raise Corrupt(
                        f"{path}: damaged at offset {end}: the log ends there "
                        f"({scanned.detail}) but newer WAL files follow it, so every byte of it "
                        "was durable (WAL-5, WAL-15, FLT-1)"
                    )
                if wal is not None:
                    wal.drop_resident()  # WTAIL-5: one file's scanned pages at a time
                parts.append(WalPart(path, frames, wal))
                positions[key] = (gen, end)
                if readonly:
                    if torn:
                        break  # the writer is mid-op here: the next refresh resumes here
                    continue
                if torn:
                    warnings.append(f"{path}: torn tail at offset {end} discarded (recovery)")
                if sealing is not None:
                    # version 3 (WAL-15): stale frames may follow the end, so the end is marked,
                    # not cut: FILE_END over whatever follows the last complete op
                    if torn or not sealing.sealed:
                        seal.append((path, end, sealing.seed))
                elif torn or (gen == newest and not _zero_from(fs, path, end)):
                    # nothing will be appended to this file again (new writes start a new
                    # file); cutting it at its end leaves no stale bytes after the last valid
                    # op (WAL-4). A file already all zeros after its end needs no cut (and no
                    # journal commit)
                    truncate.append((path, end))
    except BaseException:
        WalPlan(tuple(parts), {}, {}).release()
        raise
    return WalPlan(
        tuple(parts),
        positions,
        highest,
        tuple(truncate),
        tuple(seal),
        tuple(discard),
        tuple(warnings),
    )


def _check_contiguous(directory: str, gens: list[int], start_gen: int) -> None:
    """WAL-10, FLT-2: the files replay reads are consecutive gens (a checkpoint removes only
    files before its replay position): a missing one held frames. ``start_gen``: the snapshot
    made its replay position's file durable before it was written ("wal_durable"), so that file
    is there too; 0 when it may not be (an older snapshot: a crash may have kept the snapshot
    and lost the file, which held nothing acknowledged)."""
    expect = start_gen if start_gen else (gens[0] if gens else 0)
    for gen in gens:
        if gen != expect:
            raise Corrupt(
                f"{os.path.join(directory, walfmt.file_name(expect))}: missing, yet replay "
                f"needs every WAL file from gen {start_gen or gens[0]:#x} on (WAL-10, FLT-2)"
            )
        expect += 1
    if start_gen and not gens:
        raise Corrupt(
            f"{os.path.join(directory, walfmt.file_name(start_gen))}: missing, yet the "
            "snapshot replays from it (WAL-10, FLT-2)"
        )


def list_streams(fs: FS, root: str) -> list[tuple[str, str]]:
    """(key, directory) of every WAL stream on disk: "flat" for ``wal/``, "NN" per shard."""
    base = os.path.join(root, "wal")
    streams = [("flat", base)]
    for name in fs.listdir(base):
        if name.startswith("shard-") and fs.is_dir(os.path.join(base, name)):
            streams.append((name[6:], os.path.join(base, name)))
    return streams


def _zero_from(fs: FS, path: str, end: int) -> bool:
    """WAL-4: every byte of the file after ``end`` reads as zero."""
    h = fs.open_read(path)
    try:
        return zero_after(h, end)
    finally:
        h.close()


class _Sealing(NamedTuple):
    """How a version-3 file's log ended (WAL-15): with FILE_END or not, and its seed."""

    sealed: bool
    seed: int


class _Scanned(NamedTuple):
    end: int  # where the last complete op batch ends
    batches: list[list[walfmt.Frame]]
    torn: bool
    wal: WalFile | None
    sealing: _Sealing | None
    detail: str  # why the scan stopped


def _scan_file(
    fs: FS, path: str, offset: int, gen: int, store_id: bytes, readonly: bool
) -> _Scanned:
    """One WAL file's complete op batches from ``offset``, where they end, whether the log
    ends torn, the mapped file, and for a version-3 file whether its log ended with FILE_END.
    The writer's own recovery maps the file (nobody else writes it: we hold the lock), so only
    the pages up to the log's end are touched, not the whole preallocated file, and records
    stay where they are: their frames' data are views into the map (WTAIL-1). A read-only view
    must not map it (a writer reopening after a crash may truncate it under the mapping:
    SIGBUS), so it reads what it scans (_scan_copied), into frames of its own.

    A log that does not end cleanly is checked for damage (FLT-1, WAL-16): a SYNCED frame
    after its end proving the bytes there durable makes it ``Corrupt``, never a torn tail."""
    h = fs.open_read(path)
    wal = None
    if readonly:
        try:
            result, header = _scan_copied(h, path, offset, store_id, gen)
        finally:
            h.close()
    else:
        data = h.map()
        try:
            header = _check_header(data, path, store_id, gen, len(data))
            result = walfmt.scan(data, offset, copy=False, seed=walfmt.frame_seed(header))
            if not result.sealed:
                end = walfmt.batches_end(result.frames, offset)
                regions = getattr(h, "data_regions", None)
                _refuse_damage(data, path, header, end, regions(end) if regions else None)
        except BaseException:
            data.release()
            h.close()
            raise
        wal = WalFile(path, h, data, walfmt.frame_seed(header))
    batches, torn_batch = walfmt.split_batches(result.frames)
    end = walfmt.batches_end(result.frames, offset)
    torn = result.status == "torn" or bool(torn_batch)
    sealing = None
    if header.version >= 3:
        sealing = _Sealing(result.sealed and not torn_batch, walfmt.frame_seed(header))
    detail = "an unfinished op batch" if torn_batch else result.detail
    return _Scanned(end, batches, torn, wal, sealing, detail)


def _refuse_damage(
    buf: Any,
    path: str,
    header: walfmt.WalHeader,
    end: int,
    regions: list[tuple[int, int]] | None = None,
) -> None:
    """FLT-1, WAL-16: ``Corrupt`` if a SYNCED frame of this file after ``end`` shows that the
    bytes at ``end`` were durable (only files that may hold SYNCED frames are searched; only
    ``regions`` of them, when the file system says where data may be)."""
    if header.version < 3:
        return
    if isinstance(buf, memoryview):  # the map: search the object under it, else a copy
        buf = whole_object(buf) or bytes(buf)
    proof = walfmt.durable_proof(buf, end, header.gen, regions)
    if proof is not None:
        raise Corrupt(
            f"{path}: damaged at offset {end}: the log ends there, but the SYNCED frame at "
            f"offset {proof.offset} shows every byte before {proof.synced} was durable, so "
            "this is damage, not a torn tail (WAL-16, FLT-1)"
        )


def _check_header(data: Any, path: str, store_id: bytes, gen: int, size: int) -> walfmt.WalHeader:
    try:
        header = walfmt.decode_header(data)
    except Corrupt as exc:
        raise _NoHeader(f"{path}: {exc.message}") from None
    if header.store_id != store_id:
        raise Corrupt(
            f"{path}: belongs to another store (store_id {header.store_id.hex()}, "
            f"this store is {store_id.hex()}) (WAL)"
        )
    if header.gen != gen:
        raise Corrupt(
            f"{path}: header gen {header.gen:#x} but the file name says {gen:#x}: a renamed "
            "or swapped file (WAL-10)"
        )
    if size < header.min_size:
        raise Corrupt(
            f"{path}: damaged at offset {size}: the file is {size} bytes but its header says "
            f"{header.min_size} were reserved durably before any frame: truncated (WAL-1, FLT-1)"
        )
    return header


_COPY_CHUNK = 1 << 20
_U32 = struct.Struct("<I")


def _scan_copied(
    h: Any, path: str, offset: int, store_id: bytes, gen: int
) -> tuple[walfmt.ScanResult, walfmt.WalHeader]:
    """``walfmt.scan`` of a WAL file from ``offset``, reading only the header and the bytes the
    scan reaches (in growing chunks), not the whole preallocated file: a read-only view's
    refresh that finds nothing new costs two small reads instead of a copy of every WAL file.
    The bytes go to their own offsets in an anonymous zero-filled map, so frame offsets are the
    file's; pages never written to cost nothing.

    Damage (FLT-1): a SYNCED frame within the bytes read that proves the end durable. Such a
    frame may also mean this view read the end's bytes before the writer wrote them and the
    frame after: the end's bytes are read again once before ``Corrupt`` is raised."""
    size = h.size()
    buf = mmap.mmap(-1, size) if size else bytearray()
    mv = memoryview(buf)
    try:
        head = h.pread(min(walfmt.HEADER_SIZE, size), 0)
        mv[: len(head)] = head
        header = _check_header(head, path, store_id, gen, size)  # bytes: an error keeps no view
        seed = walfmt.frame_seed(header)
        frames: list[walfmt.Frame] = []
        unknown: list[int] = []
        pos = filled = max(offset, len(head))
        chunk = _COPY_CHUNK
        reread = False
        while True:
            if filled < size:
                got = h.pread(min(size, pos + chunk) - filled, filled)
                mv[filled : filled + len(got)] = got
                filled += len(got)
            result = walfmt.scan(mv[:filled], pos, seed=seed)
            frames += result.frames
            unknown += result.unknown
            pos = result.end
            if not result.sealed and filled < size and _cut_by_window(mv, pos, filled):
                chunk *= 2  # a frame longer than the window: read further
                continue
            if not result.sealed and header.version >= 3:
                end = walfmt.batches_end(frames, offset)
                read = [(0, filled)]  # only what was read: the rest of the map is zeros
                if walfmt.durable_proof(buf, end, header.gen, read) is not None:
                    if reread:
                        _refuse_damage(buf, path, header, end, read)
                    reread = True  # the writer may have written it since we read it
                    got = h.pread(filled - pos, pos)
                    mv[pos : pos + len(got)] = got
                    continue
            status, detail, sealed = result.status, result.detail, result.sealed
            return walfmt.ScanResult(frames, pos, status, detail, unknown, sealed), header
    finally:
        mv.release()
        if isinstance(buf, mmap.mmap):
            buf.close()


def _cut_by_window(mv: memoryview, pos: int, filled: int) -> bool:
    """Whether the scan stopped at ``pos`` only because the bytes read so far end there (the
    frame at ``pos`` reaches past ``filled``), not at the log's end or a damaged frame."""
    if pos + _U32.size > filled:
        return True
    frame_len = _U32.unpack_from(mv, pos)[0]
    return frame_len != 0 and pos + _U32.size + frame_len > filled


class _NoHeader(Corrupt):
    """A WAL file without a valid header. Frames are written only after the header is durable,
    so such a file never held a frame: harmless if it is the newest of its stream (a crash while
    it was being created), corruption anywhere else."""
