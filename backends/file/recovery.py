"""Opening a file store: snapshot + sealed segments + progress files + WAL replay (SNAP-4, PRG-9).

1. Load the newest valid snapshot (an older one if the newest is damaged; none = a new store).
2. Rebuild every topic from it: config, floors, sealed segments (.idx columns, mmap'd .data),
   dead ranges, subscribers with their progress files, queue state.
3. Replay every WAL directory from the snapshot's replay position, op batch by op batch (a batch
   without its BATCH_END frame is a torn op and is discarded whole). The first torn frame ends the
   log: the file is truncated there and nothing after it is used. Valid frames in a later file
   after a torn one mean real corruption (files are synced before the next is written): refuse.
4. Crash rules: reserved seqs above the recovered head become a loss range (disk, DUR-3) or a lost
   prefix (ephemeral, DUR-5); leases held at the crash end (QUE-8); cursors reset (SUB-9).
"""

from __future__ import annotations

import mmap
import os
import struct
from array import array
from typing import TYPE_CHECKING, Any, NamedTuple

from tidelog.config import TopicConfig
from tidelog.errors import Corrupt
from tidelog.fsio import FS, read_whole, whole_object, zero_after

from ..common.engine import EngineTopic
from .chunk import SegChunk
from .format import qseg_name
from .format import segment as segfmt
from .format import snapshot as snapfmt
from .format import wal as walfmt
from .format.wal import FrameType
from .progressfiles import read_progress, topic_dir
from .walchunk import WalChunk, WalFile

if TYPE_CHECKING:
    from .qchunk import QsegChunk
    from .store import FileBackend

__all__ = ["load_snapshot", "rebuild", "replay_wal", "list_streams", "lose"]

_RECORDS = (int(FrameType.APPEND), int(FrameType.APPEND_BATCH))
_APPEND = int(FrameType.APPEND)
_MARKS = (int(FrameType.CHECKPOINT), int(FrameType.SYNCED))  # frames without an effect


# -- snapshot --------------------------------------------------------------------------------
def load_snapshot(b: FileBackend) -> tuple[int, dict[str, Any]] | None:
    found = newest_snapshot(b.fs, b.root)
    if found is None:
        return None
    n, body, skipped = found
    b.warnings += skipped
    return n, body


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


# -- topics from the snapshot ------------------------------------------------------------------
def rebuild(b: FileBackend, body: dict[str, Any]) -> None:
    b.store_id = bytes.fromhex(body["store_id"])
    b.incarnations = int(body.get("incarnations", 0))
    for entry in body["topics"]:
        t = b.apply_create(entry["name"], TopicConfig(**entry["config"]), int(entry["id"]))
        log = t.log
        for first in entry["segments"]:
            log.add_chunk(open_chunk(b, t.tid, int(first)))
        for lo, hi in entry["dead"]:
            for c in log.chunks:
                c.mark_dead(lo, hi)  # type: ignore[attr-defined]
        log.count = sum(c.live for c in log.chunks)
        log.nbytes = sum(c.nbytes for c in log.chunks)  # type: ignore[attr-defined]
        log.head = log.visible = int(entry["head"])
        log.base = log.head + 1
        log.evict_floor = int(entry["evict_floor"])
        log.last_ts = entry["last_ts"]
        log.losses = [(int(lo), int(hi)) for lo, hi in entry["losses"]]
        b.ceilings[t.tid] = int(entry.get("ceiling", log.head))
        _index_tags(t)
        for sub in entry["subscribers"]:
            register(b, t, sub["name"], int(sub["base"]))
        q = entry["queue"]
        jobs = t.jobs
        jobs.claim_cursor = int(q["cursor"])
        jobs.next_lease_id = int(q["next_lease_id"])
        jobs.deliveries = {int(s): int(n) for s, n in q["deliveries"]}
        for s, ready in q["delayed"]:
            jobs.delay(int(s), int(ready))
        jobs.free = {int(s) for s in q["returned"]}
        t.producers = {str(p): int(n) for p, n in entry.get("producers", {}).items()}


def open_chunk(b: FileBackend, tid: int, first: int) -> SegChunk | QsegChunk:
    """The sealed segment of ``tid`` starting at ``first``: a Quiver ``.qseg`` (bundle topics,
    spec/BUNDLES.md QSEG) when that file exists, else the ``.data``/``.idx`` pair (SEG)."""
    directory = topic_dir(b.root, tid)
    qseg_path = os.path.join(directory, qseg_name(first))
    if b.fs.exists(qseg_path):
        from .qchunk import QsegChunk  # pyarrow: imported only where a .qseg exists

        return QsegChunk(qseg_path, b.fs.open_read(qseg_path), first)
    data_path = os.path.join(directory, segfmt.data_name(first))
    idx_path = os.path.join(directory, segfmt.idx_name(first))
    try:
        h = b.fs.open_read(idx_path)
    except FileNotFoundError:
        raise Corrupt(
            f"{idx_path}: missing, yet the snapshot lists segment {first} (SEG)"
        ) from None
    try:
        # mapped: the index keeps a view of its entries (read_index); closing the handle
        # leaves the map to that view, which frees it
        index = segfmt.read_index(h.map(), topic_id=tid, first_seq=first)
    except Corrupt as exc:
        raise Corrupt(f"{idx_path}: {exc.message}") from None
    finally:
        h.close()
    try:
        data = b.fs.open_read(data_path)
    except FileNotFoundError:
        raise Corrupt(f"{data_path}: missing; the snapshot lists segment {first} (SEG)") from None
    return SegChunk(data_path, data, index)  # checks the .data header and size (SEG-12)


def _index_tags(t: EngineTopic) -> None:
    """Rebuild the tag index from the sealed records that carry a tag (SEG-11, DEL-5):
    one range of equally tagged live records at a time, from the index's label runs (SEG-11),
    so the work is per run, not per record."""
    for c in t.log.chunks:
        for tag, lo, hi in c.tag_runs():  # type: ignore[attr-defined]
            t.log.index_tag(tag, lo, hi)


def register(b: FileBackend, t: EngineTopic, name: str, base: int) -> None:
    """A subscriber known from the snapshot or the WAL. Its last written progress is applied
    once the replay is done (``load_progress``, PRG-9): applied here, an hwm from after the
    frames still to replay would settle (SUB-5: trim) records those frames evict."""
    s = t.progress.add(name, base)
    s.cursor = s.flushed_hwm = s.hwm
    b.unloaded.append((t, name, s))


def load_progress(b: FileBackend) -> None:
    """PRG-9: after a replay, each subscriber it registered takes its last written progress."""
    pending, b.unloaded = b.unloaded, []
    for t, name, s in pending:
        if b.by_id.get(t.tid) is not t or t.progress.subs.get(name) is not s:
            continue  # unregistered (or its topic dropped) later in the replay
        saved = read_progress(b.fs, b.root, t.tid, name)
        if saved is not None:
            base, replayed = s.base, s.gap
            s.hwm = max(saved.hwm, base)
            s.outcomes = {q: "acked" for q in saved.outcomes if q > s.hwm}
            s.gap = saved.gap
            s.base = saved.base if saved.base <= s.hwm else base
            if replayed is not None and replayed[1] > s.hwm:
                # SUB-7: LOSS frames the replay applied may be newer than the progress file
                # (a crash before it was written again, or repair's, REP-4): their gap stays
                lo = max(replayed[0], s.hwm + 1)
                s.gap = (
                    (lo, replayed[1])
                    if s.gap is None
                    else (min(s.gap[0], lo), max(s.gap[1], replayed[1]))
                )
        s.cursor = s.flushed_hwm = s.hwm
        b.progress_written[(t.tid, name)] = b.progress_key(s)


# -- WAL replay --------------------------------------------------------------------------------
def replay_wal(
    b: FileBackend,
    replay_from: dict[str, list[int]],
    *,
    readonly: bool = False,
    wal_durable: bool = False,
) -> dict[str, int]:
    """Replay every WAL stream from ``replay_from`` (stream key -> [gen, offset]); returns the
    highest file gen seen per stream. ``b.positions`` ends up holding, per stream, where the last
    complete op batch ended, so a read-only view can resume there (XPR-1). A read-only replay
    never truncates or removes anything: an incomplete tail is a writer still writing."""
    highest: dict[str, int] = {}
    for key, directory in list_streams(b):
        start_gen, start_off = replay_from.get(key, [0, walfmt.HEADER_SIZE])
        gens = sorted(
            g for name in b.fs.listdir(directory) if (g := walfmt.parse_file_name(name)) is not None
        )
        highest[key] = max(gens, default=0)
        b.positions[key] = [start_gen, start_off]
        newest = gens[-1] if gens else 0
        if not readonly:
            later = [g for g in gens if g >= start_gen]
            # without "wal_durable" (older snapshots) the replay position's file may be missing
            # only when no later file exists either: a crash lost it before it held anything
            strict = wal_durable or bool(later)
            _check_contiguous(directory, later, start_gen if strict else 0)
        for gen in gens:
            if gen < start_gen:
                continue
            path = os.path.join(directory, walfmt.file_name(gen))
            offset = start_off if gen == start_gen else walfmt.HEADER_SIZE
            try:
                scanned = _scan_file(b, path, offset, gen)
            except _NoHeader as exc:
                if gen != newest:
                    raise Corrupt(f"{exc.message}, and newer WAL files follow it (WAL)") from None
                if not _zero_from(b, path, walfmt.HEADER_SIZE):
                    # frames are written only after the header is durable (WAL-11, WAL-15)
                    raise Corrupt(
                        f"{exc.message}, yet bytes after it are not zero: a damaged header "
                        "over frames, not a file a crash left unfinished (WAL-1, FLT-1)"
                    ) from None
                if not readonly:
                    b.discards.append(path)
                    b.warnings.append(f"{path}: never completed (no valid header): removed")
                continue
            end, frames, torn, wal, sealing = scanned[:5]
            if sealing is not None and not sealing.sealed and gen != newest:
                torn = True  # WAL-15: a version-3 file but the newest ends with FILE_END
            if torn and gen != newest and not readonly:
                if wal is not None:
                    wal.release()
                # the file was synced before the next one was created (WAL-11): whatever ends
                # its log early was durable, so it is damage, never a torn tail (FLT-1)
                raise Corrupt(
                    f"{path}: damaged at offset {end}: the log ends there ({scanned.detail}) "
                    "but newer WAL files follow it, so every byte of it was durable "
                    "(WAL-5, WAL-15, FLT-1)"
                )
            # a batch of a CHECKPOINT or SYNCED frame alone has no effect: still "clean"
            try:
                b.replayed_batches += apply_batches(b, frames, wal)
            finally:
                if wal is not None:
                    if wal.refs == 0:
                        wal.release()  # no record of it is served from the map
                    else:
                        wal.drop_resident()  # WTAIL-5
            b.positions[key] = [gen, end]
            if readonly:
                if torn:
                    break  # the writer is mid-op here: the next refresh resumes at this point
                continue
            if torn:
                b.warnings.append(f"{path}: torn tail at offset {end} discarded (recovery)")
            if sealing is not None:
                # version 3 (WAL-15): stale frames may follow the end, so the end is marked,
                # not cut: FILE_END over whatever follows the last complete op
                if torn or not sealing.sealed:
                    b.seals.append((path, end, sealing.seed))
            elif torn or (gen == newest and not _zero_from(b, path, end)):
                # nothing will be appended to this file again (new writes start a new file);
                # cutting it at its end leaves no stale bytes after the last valid op (WAL-4).
                # A file already all zeros after its end needs no cut (and no journal commit)
                b.truncations.append((path, end))
    load_progress(b)
    return highest


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


def list_streams(b: FileBackend) -> list[tuple[str, str]]:
    """(key, directory) of every WAL stream on disk: "flat" for ``wal/``, "NN" per shard."""
    base = os.path.join(b.root, "wal")
    streams = [("flat", base)]
    for name in b.fs.listdir(base):
        if name.startswith("shard-") and b.fs.is_dir(os.path.join(base, name)):
            streams.append((name[6:], os.path.join(base, name)))
    return streams


def _zero_from(b: FileBackend, path: str, end: int) -> bool:
    """WAL-4: every byte of the file after ``end`` reads as zero."""
    h = b.fs.open_read(path)
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


def _scan_file(b: FileBackend, path: str, offset: int, gen: int) -> _Scanned:
    """One WAL file's complete op batches from ``offset``, where they end, whether the log
    ends torn, the mapped file, and for a version-3 file whether its log ended with FILE_END.
    The writer's own recovery maps the file (nobody else writes it: we hold the lock), so only
    the pages up to the log's end are touched, not the whole preallocated file, and records
    stay where they are: their frames' data are views into the map (WTAIL-1). A read-only view
    must not map it (a writer reopening after a crash may truncate it under the mapping:
    SIGBUS), so it reads what it scans (_scan_copied), into frames of its own.

    A log that does not end cleanly is checked for damage (FLT-1, WAL-16): a SYNCED frame
    after its end proving the bytes there durable makes it ``Corrupt``, never a torn tail."""
    h = b.fs.open_read(path)
    wal = None
    if b.readonly:
        try:
            result, header = _scan_copied(h, path, offset, b.store_id, gen)
        finally:
            h.close()
    else:
        data = h.map()
        try:
            header = _check_header(data, path, b.store_id, gen, len(data))
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


def apply_batches(
    b: FileBackend, batches: list[list[walfmt.Frame]], wal: WalFile | None = None
) -> int:
    """Apply complete op batches in order (journal off: replay does not log again).

    Records go to the engine run by run, not frame by frame: consecutive records of one topic
    with consecutive seqs, one ts and the same tag and node -- an APPEND_BATCH frame (WAL-14),
    or single APPEND frames in a row, even from different ops -- become one ``apply_append``.
    That is the state applying them op by op gives (an append only appends; each keeps its own
    labels, TOP-6), for a fraction of the per-record Python work. Returns how many batches
    carried an effect (a batch of a CHECKPOINT or SYNCED frame alone does not).

    With ``wal`` (the writer's recovery, frames scanned with ``copy=False``), records are not
    copied at all: each record frame becomes a run of a ``WalChunk`` served from the map
    (WTAIL-1), a few list entries per frame."""
    payloads: list[bytes] = []
    tid = first = nxt = ts = -1
    tag = node = None
    marks = 0
    for batch in batches:
        if len(batch) == 1 and batch[0][0] in _MARKS:
            marks += 1
            continue  # informational (WAL-8, WAL-16): replay skips it
        for f in batch:
            ftype, _, f_tid, seq, f_ts, f_node, f_tag, data, offset, _ = f
            if ftype in _RECORDS:
                if wal is not None:
                    _locate(b, wal, f)
                    continue
                if ftype == _APPEND:
                    records = None
                else:
                    records = walfmt.split_append_batch(data, f"WAL frame at offset {offset}")
                if seq == nxt and f_tid == tid and f_ts == ts and f_tag == tag and f_node == node:
                    if records is None:
                        payloads.append(data)
                        nxt += 1
                    else:
                        payloads += records
                        nxt += len(records)
                    continue
                if payloads:
                    _apply_run(b, tid, first, payloads, tag, node, ts)
                tid, first, ts, tag, node = f_tid, seq, f_ts, f_tag, f_node
                payloads = [data] if records is None else records
                nxt = seq + len(payloads)
                continue
            if payloads:
                _apply_run(b, tid, first, payloads, tag, node, ts)
                payloads = []
                tid = -1
            _apply_control(b, f)
    if payloads:
        _apply_run(b, tid, first, payloads, tag, node, ts)
    return len(batches) - marks


def _apply_run(
    b: FileBackend,
    tid: int,
    first: int,
    payloads: list[bytes],
    tag: str | None,
    node: str | None,
    ts: int,
) -> None:
    """Records ``first ..`` of topic ``tid`` sharing ts and labels: append the ones above the
    head (what a snapshot already holds is skipped)."""
    t = b.by_id.get(tid)
    if t is None:
        return  # the topic was dropped before the snapshot that absorbed this op
    head = t.log.head
    if first + len(payloads) - 1 <= head:
        return
    if first <= head:
        payloads = payloads[head + 1 - first :]
        first = head + 1
    if first != head + 1:
        raise Corrupt(f"WAL: topic {t.name!r} jumps from seq {head} to {first}")
    b.apply_append(t, payloads, tag, node, ts)


def _locate(b: FileBackend, wal: WalFile, f: walfmt.Frame) -> None:
    """A record frame of the writer's replay as the next run of its topic's last ``WalChunk``
    (or a new one): located, not copied (WTAIL-1). Records the snapshot already holds are
    skipped, as ``_apply_run`` does."""
    t = b.by_id.get(f.topic_id)
    if t is None:
        return  # the topic was dropped before the snapshot that absorbed this op
    data: Any = f.data  # a view into the map (scan with copy=False)
    data_at = f.offset + f.length - 8 - len(data)
    if f.type == _APPEND:
        n, lens_at, nbytes = 1, -1, len(data)
        lens = array("I", (nbytes,))
    else:
        n, lens = walfmt.append_batch_lengths(data, f"{wal.path}: WAL frame at offset {f.offset}")
        lens_at, data_at, nbytes = data_at + 4, data_at + 4 + 4 * n, len(data) - 4 - 4 * n
    log = t.log
    head, first = log.head, f.seq
    if first + n - 1 <= head:
        return
    if first <= head:  # the snapshot holds the run's first k records
        k = head + 1 - first
        skipped = sum(lens[:k])
        data_at, lens_at, nbytes = data_at + skipped, lens_at + 4 * k, nbytes - skipped
        n, first = n - k, head + 1
    if first != head + 1:
        raise Corrupt(f"WAL: topic {t.name!r} jumps from seq {head} to {first}")
    if log.payloads:  # records in memory above the chunks (not after a snapshot): copy
        payloads = walfmt.split_append_batch(bytes(data), "WAL") if lens_at >= 0 else [bytes(data)]
        b.apply_append(t, payloads[len(payloads) - n :], f.tag, f.node, f.ts)
        return
    chunk = log.chunks[-1] if log.chunks else None
    if isinstance(chunk, WalChunk) and chunk.wal is wal and chunk.first_seq + chunk.count == first:
        grow = chunk
    else:
        grow = WalChunk(wal, first)
    grow.add_run(f, data_at, lens_at, n, nbytes)
    b.apply_located(t, grow, n, nbytes, f.tag, f.ts)


def _apply_control(b: FileBackend, f: walfmt.Frame) -> None:
    tid = f.topic_id
    t = b.by_id.get(tid)
    kind = f.type
    if kind == FrameType.TOPIC_CREATE:
        if t is None:
            body = f.body
            old = b.topics.get(body["name"])
            if old is not None and old.tid < tid:
                b.apply_drop(old)  # its drop is in another shard's stream
            b.apply_create(body["name"], TopicConfig(**body["config"]), tid)
        return
    if t is None:
        return  # effects of a topic dropped before the snapshot
    if kind == FrameType.TOPIC_DROP:
        b.apply_drop(t)
    elif kind == FrameType.EVICT:
        b.apply_evict(t, f.seq, f.body["reason"])
    elif kind == FrameType.REMOVE:
        body = f.body
        seqs = [q for lo, hi in body["ranges"] for q in range(lo, hi + 1)]
        b.apply_remove(t, seqs, body["fate"])
    elif kind == FrameType.SUB_REGISTER:
        body = f.body
        if body["name"] not in t.progress.subs:
            register(b, t, body["name"], int(body["base"]))
    elif kind == FrameType.SUB_UNREGISTER:
        if f.body["name"] in t.progress.subs:
            b.apply_unregister(t, f.body["name"])
    elif kind == FrameType.QUEUE:
        _apply_queue(b, t, f.body)
    elif kind == FrameType.HEAD_RESERVE:
        b.ceilings[tid] = max(b.ceilings.get(tid, 0), f.seq)
    elif kind == FrameType.PRODUCER:
        b.apply_produced(t, f.body["pid"], int(f.body["seq"]))
    elif kind == FrameType.LOSS:
        lose(b, t, int(f.body["lo"]), f.seq, log=False)


def _apply_queue(b: FileBackend, t: EngineTopic, body: dict[str, Any]) -> None:
    op = body["op"]
    if op == "delivered":
        b.apply_delivered(t, body["seq"], body["lease_id"], body["count"], body["fresh"])
    elif op == "returned":
        b.apply_returned(t, body["seq"])
    elif op == "delayed":
        b.apply_delayed(t, body["seq"], body["ready_at"])


def lose(b: FileBackend, t: EngineTopic, lo: int, hi: int, *, log: bool) -> None:
    """Seqs lo..hi were lost in a crash: raise the head over them and record a loss range, so
    readers get a tombstone and no seq is reused (DUR-3)."""
    if hi <= t.log.head:
        return  # already part of the snapshot
    lo = max(lo, t.log.head + 1)
    for s in t.progress.subs.values():
        if s.hwm < hi:  # SUB-7: every lost seq above the hwm was unresolved
            g = (max(lo, s.hwm + 1), hi)
            s.gap = g if s.gap is None else (min(s.gap[0], g[0]), max(s.gap[1], g[1]))
    t.log.skip_to(hi)
    t.log.add_loss(lo, hi)
    if log and b.journal is not None:
        b.journal.loss(t, lo, hi)  # type: ignore[attr-defined]
