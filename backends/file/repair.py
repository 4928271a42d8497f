"""Repair of a damaged file:// store (spec/FORMATS.md REP-1..REP-5): the way out of the refusal
that recovery keeps as its default (FLT-2).

Recovery refuses damage; ``repair_store`` quarantines it. Every file it replaces, rewrites or
drops is first copied to ``<root>/quarantine/<when>/`` under its own relative path, so no damaged
byte is ever destroyed, and what the damage made unreadable becomes a loss range (a tombstone
for readers, TMB-2) instead of a silent gap or a seq handed out again:

* a segment keeps every record that reads back intact, re-sealed into fresh segments; its other
  seqs become a loss range (a damaged ``.idx`` alone loses nothing: it is rebuilt);
* a damaged progress file goes; its subscriber resumes from its base (redelivery, never loss);
* a WAL file damaged at offset X keeps its ops before X; its log from X on and the shard's newer
  files go to quarantine (ops after the damage may depend on control frames it destroyed), and
  LOSS frames written at X raise every topic's head over every seq the surviving bytes after X
  name, so none is handed out again.
"""

from __future__ import annotations

import os
import re
import sys
import time
from array import array
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import xxhash

from tidelog.errors import Corrupt
from tidelog.fsio import FS, make_dirs, read_whole, write_whole

from ..common.progress import SubState, add_gap, offline_live_between
from .checkpoint import write_snapshot
from .format import progress as prgfmt
from .format import qseg_name
from .format import segment as segfmt
from .format import snapshot as snapfmt
from .format import wal as walfmt
from .lockfile import acquire, exclude_writers
from .progressfiles import read_progress, topic_dir, write_progress
from .recovery import list_streams, newest_snapshot

__all__ = ["RepairReport", "repair_store"]

_Rec = tuple[int, int, str | None, str | None, bytes]  # seq, ts, tag, node, payload
_APPENDS = (int(walfmt.FrameType.APPEND), int(walfmt.FrameType.APPEND_BATCH))
_RESERVE = int(walfmt.FrameType.HEAD_RESERVE)


@dataclass
class RepairReport:
    root: str
    actions: list[str] = field(default_factory=list)  # what was (or, dry run, would be) done
    quarantine: str | None = None  # where the damaged files went

    @property
    def changed(self) -> bool:
        return bool(self.actions)


@dataclass
class _Ctx:
    fs: FS
    root: str
    dry_run: bool
    report: RepairReport
    stamp: str
    bounds: dict[int, int] = field(default_factory=dict)  # tid -> seqs a truncation may hide

    def quarantine(self, path: str) -> None:
        """Copy ``path`` under quarantine/<stamp>/ with its relative path (REP-1)."""
        if self.dry_run or not self.fs.exists(path):
            return
        rel = os.path.relpath(path, self.root)
        dest = os.path.join(self.root, "quarantine", self.stamp, rel)
        make_dirs(self.fs, os.path.dirname(dest))
        write_whole(self.fs, dest, read_whole(self.fs, path))
        self.fs.fsync_dir(os.path.dirname(dest))
        self.report.quarantine = os.path.join(self.root, "quarantine", self.stamp)


def repair_store(fs: FS, root: str, *, dry_run: bool = False) -> RepairReport:
    """Repair the store at ``root`` (REP-1): takes its lock, so no writer may hold it."""
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    ctx = _Ctx(fs, root, dry_run, RepairReport(root), stamp)
    # a dry run writes nothing, not even the lock's pid file (CLI-10)
    lock = exclude_writers(fs, root) if dry_run else acquire(fs, root)
    try:
        n, body = _snapshot(ctx)
        changed = _damaged_copies(ctx, n)
        for entry in body["topics"]:
            lost = _repair_segments(ctx, entry)
            changed |= bool(lost) or entry.pop("_resealed", False)
            _repair_progress(ctx, entry, lost)
        _repair_wal(ctx, body)
        if changed and not dry_run:
            write_snapshot(fs, root, n + 1, body)
            for old, names in snapfmt.copies(fs.listdir(os.path.join(root, "meta"))).items():
                for name in names if old <= n else ():
                    ctx.quarantine(os.path.join(root, "meta", name))
                    fs.unlink(os.path.join(root, "meta", name))
            fs.fsync_dir(os.path.join(root, "meta"))
        return ctx.report
    finally:
        if lock is not None:
            lock.close()


def _snapshot(ctx: _Ctx) -> tuple[int, dict[str, Any]]:
    """The newest valid snapshot (REP-5: without one, topic names and configs are gone and
    repair refuses)."""
    if not ctx.fs.is_dir(os.path.join(ctx.root, "meta")):
        raise Corrupt(f"{ctx.root}: not a tidelog store (no meta/ directory)")
    try:
        found = newest_snapshot(ctx.fs, ctx.root)
    except Corrupt as exc:
        found, why = None, exc.message
    else:
        why = "none in meta/"
    if found is None:
        raise Corrupt(
            f"{ctx.root}: no valid snapshot ({why}): repair cannot rebuild topic names and "
            "configs (REP-5)"
        )
    return found[0], found[1]


def _damaged_copies(ctx: _Ctx, n: int) -> bool:
    """SNAP-5: whether a copy of snapshot ``n`` (the one in use) is damaged or missing; repair
    then writes the snapshot anew, both copies."""
    meta = os.path.join(ctx.root, "meta")
    names = snapfmt.copies(ctx.fs.listdir(meta)).get(n, [])
    bad = [
        name
        for name in names
        if not _valid_snapshot(read_whole(ctx.fs, os.path.join(meta, name)), n)
    ]
    missing = {snapfmt.file_name(n), snapfmt.mirror_name(n)} - set(names)
    for name in sorted(bad) + sorted(missing):
        ctx.report.actions.append(f"{os.path.join(meta, name)}: damaged or missing copy of "
                                  f"snapshot {n}: written anew from the other")  # fmt: skip
    return bool(bad or missing)


def _valid_snapshot(data: bytes, n: int) -> bool:
    try:
        return snapfmt.decode_snapshot(data)[0] == n
    except Corrupt:
        return False


# -- segments (REP-2) --------------------------------------------------------------------------
def _repair_segments(ctx: _Ctx, entry: dict[str, Any]) -> list[tuple[int, int]]:
    """REP-2 over one topic's named segments; returns the seq ranges it made loss ranges (and
    marks the entry ``_resealed`` when it rewrote a segment without losing anything)."""
    tid = int(entry["id"])
    directory = topic_dir(ctx.root, tid)
    firsts = [int(f) for f in entry["segments"]]
    new_firsts: list[int] = []
    all_lost: list[tuple[int, int]] = []
    for i, first in enumerate(firsts):
        end = firsts[i + 1] - 1 if i + 1 < len(firsts) else None
        kept, lost, note = _salvage_segment(ctx, directory, tid, first, end, entry)
        if note is None:
            new_firsts.append(first)
            continue
        entry["_resealed"] = True
        all_lost += lost
        ctx.report.actions.append(f"topic {entry['name']!r}: {note}")
        for lo, hi in lost:
            entry["losses"].append([lo, hi])
            ctx.report.actions.append(
                f"topic {entry['name']!r}: seqs {lo}..{hi} unreadable: now a loss range "
                "(readers get a tombstone)"
            )
        for run in _runs(kept):
            new_firsts.append(run[0][0])
            if not ctx.dry_run:
                _write_segment(ctx, directory, tid, run)
    entry["segments"] = sorted(new_firsts)
    entry["losses"] = _merge(entry["losses"])
    return all_lost


def _salvage_segment(
    ctx: _Ctx, directory: str, tid: int, first: int, end: int | None, entry: dict[str, Any]
) -> tuple[list[_Rec], list[tuple[int, int]], str | None]:
    """(readable records, lost seq ranges, what was wrong) of one named segment; the note is
    None when the segment is sound as it is (nothing to do)."""
    if ctx.fs.exists(os.path.join(directory, qseg_name(first))):
        return [], [], None  # bundle segments are checked whole by recovery (QSEG); not here
    data_path = os.path.join(directory, segfmt.data_name(first))
    idx_path = os.path.join(directory, segfmt.idx_name(first))
    data = _read(ctx, data_path)
    idx = _read(ctx, idx_path)
    index = None
    if idx is not None:
        try:
            index = segfmt.read_index(idx, topic_id=tid, first_seq=first)
        except Corrupt:
            index = None
    last = end
    if last is None:
        last = index.last_seq if index is not None else int(entry["head"])
    records: list[_Rec] = []
    problem = "missing"
    if data is not None:
        try:
            scan = segfmt.scan_data(data)
        except Corrupt as exc:
            problem = f"damaged header ({exc.message})"
        else:
            header_ok = scan.header.topic_id == tid and scan.header.first_seq == first
            problem = "" if header_ok else "header names another topic or seq"
            if header_ok:
                records = list(_records(data, scan))
                if scan.problem is not None:
                    problem = f"{scan.problem.detail} at offset {scan.problem.offset}"
                    if index is not None:
                        records += _resync(data, scan, index)
    sound = (
        not problem
        and index is not None
        and index.count == len(records)
        and index.last_seq == (records[-1][0] if records else first - 1)
    )
    if sound:
        return [], [], None
    if records and index is not None and index.last_seq > records[-1][0]:
        last = max(last, index.last_seq)
    if records:
        last = max(last, records[-1][0])
    have = {r[0] for r in records}
    lost = _ranges([s for s in range(first, last + 1) if s not in have])
    for path in (data_path, idx_path):
        ctx.quarantine(path)
        if not ctx.dry_run and ctx.fs.exists(path):
            ctx.fs.unlink(path)
    what = f"segment {first}: " + (problem or "index damaged or missing")
    return records, lost, what + f"; {len(records)} records kept, re-sealed"


def _records(data: bytes, scan: segfmt.DataScan) -> Iterator[_Rec]:
    """(seq, ts, tag, node, payload) of every record the scan found intact."""
    runs = scan.runs is not None
    payload: bytes | memoryview
    for info in scan.frames:
        if runs:
            payload = data[info.offset : info.offset + info.length]
        else:
            payload = segfmt.read_record(data, info.offset, info.length, info.seq)[4]
        yield info.seq, info.ts, info.tag, info.node, bytes(payload)


def _resync(data: bytes, scan: segfmt.DataScan, index: segfmt.SegmentIndex) -> Iterator[_Rec]:
    """Records after a damaged frame, found where an intact ``.idx`` says the later frames
    start: run frames by its block table (SEG-15), record frames by its entries (SEG-5). Each
    is checked as a read checks it; a bad one is skipped."""
    assert scan.problem is not None
    after, first = scan.problem.offset, index.first_seq
    if scan.runs is not None:
        for slot, offset in zip(index.block_slots, index.block_offsets):
            if offset <= after:
                continue
            try:
                run = segfmt.read_run(data, offset, first + slot)
            except Corrupt:
                continue
            at = run.payload_at
            for i, (ts, n) in enumerate(zip(run.tss, run.lengths)):
                yield run.seq + i, ts, run.tag, run.node, bytes(data[at : at + n])
                at += n
        return
    for i in range(index.count):
        offset = index.entry_offset(i)
        if offset <= after:
            continue
        length = index.lengths[i]
        try:
            seq, ts, tag, node, payload = segfmt.read_record(data, offset, length, first + i)
        except Corrupt:
            continue
        yield seq, ts, tag, node, bytes(payload)


def _runs(
    records: list[_Rec],
) -> list[list[_Rec]]:
    """Maximal runs of consecutive seqs (a segment holds consecutive seqs, SEG-3)."""
    out: list[list[_Rec]] = []
    for r in records:
        if out and out[-1][-1][0] + 1 == r[0]:
            out[-1].append(r)
        else:
            out.append([r])
    return out


def _write_segment(ctx: _Ctx, directory: str, tid: int, run: list[_Rec]) -> None:
    data, idx = segfmt.build_segment(tid, run[0][0], run)
    for name, content in ((segfmt.data_name(run[0][0]), data), (segfmt.idx_name(run[0][0]), idx)):
        write_whole(ctx.fs, os.path.join(directory, name), content)
    ctx.fs.fsync_dir(directory)


# -- progress files (REP-3) --------------------------------------------------------------------
def _repair_progress(ctx: _Ctx, entry: dict[str, Any], lost: list[tuple[int, int]]) -> None:
    """REP-3: a damaged progress file goes (its subscriber resumes from its base); REP-2: every
    subscriber that had not resolved seqs repair made a loss range gets a gap for them (SUB-7),
    so its next poll returns a tombstone instead of passing them silently."""
    tid = int(entry["id"])
    # SUB-7 without a replay: a seq counts as live unless the snapshot has it below the floor,
    # removed, or in a loss range (repair's own included)
    dead = [(int(lo), int(hi)) for lo, hi in [*entry["dead"], *entry["losses"]]]
    between = offline_live_between(int(entry["evict_floor"]), [*dead, *lost])
    for sub in entry["subscribers"]:
        name, base = sub["name"], int(sub["base"])
        path = os.path.join(topic_dir(ctx.root, tid), prgfmt.file_name(name))
        try:
            saved = read_progress(ctx.fs, ctx.root, tid, name)
        except Corrupt:
            ctx.quarantine(path)
            if not ctx.dry_run:
                ctx.fs.unlink(path)
                ctx.fs.fsync_dir(os.path.dirname(path))
            ctx.report.actions.append(
                f"topic {entry['name']!r}: subscriber {name!r}: progress file damaged; "
                f"it resumes from its base {base} (records after it are redelivered)"
            )
            saved = None
        state = SubState(base=base, hwm=base, cursor=base)
        if saved is not None:
            state = SubState(saved.base, saved.hwm, saved.hwm, dict.fromkeys(saved.outcomes,
                             "acked"), list(saved.gaps))  # fmt: skip
        before = list(state.gaps)
        for lo, hi in lost:
            if hi > state.hwm:
                add_gap(state, max(lo, state.hwm + 1), hi, between)
        if state.gaps == before:
            continue
        told = ", ".join(f"{lo}..{hi}" for lo, hi in state.gaps if (lo, hi) not in before)
        ctx.report.actions.append(
            f"topic {entry['name']!r}: subscriber {name!r}: its next poll returns a tombstone "
            f"for seqs {told}"
        )
        ctx.quarantine(path)
        if not ctx.dry_run:
            write_progress(ctx.fs, ctx.root, tid, name, state)


# -- WAL (REP-4) -------------------------------------------------------------------------------
def _repair_wal(ctx: _Ctx, body: dict[str, Any]) -> None:
    replay_from = body["wal"]["replay_from"]
    store_id = bytes.fromhex(body["store_id"])
    for key, directory in list_streams(ctx.fs, ctx.root):
        start_gen, start_off = replay_from.get(key, [0, walfmt.HEADER_SIZE])
        gens = sorted(
            g
            for name in ctx.fs.listdir(directory)
            if (g := walfmt.parse_file_name(name)) is not None and g >= start_gen
        )
        shard = (0, 1) if key == "flat" else (int(key), max(2, int(body["wal"]["shards"])))
        if start_gen and not gens:
            raise Corrupt(
                f"{os.path.join(directory, walfmt.file_name(start_gen))}: missing, and no WAL "
                "file after it either: nothing records which seqs its ops handed out, so "
                "repair cannot keep them from being reused (REP-4)"
            )
        expect = start_gen or (gens[0] if gens else 0)
        head: bytes | None
        for i, gen in enumerate(gens):
            path = os.path.join(directory, walfmt.file_name(gen))
            newer = [os.path.join(directory, walfmt.file_name(g)) for g in gens[i + 1 :]]
            if gen != expect:  # a missing file (WAL-10): a new one in its place ends the log
                missing = os.path.join(directory, walfmt.file_name(expect))
                made = walfmt.encode_header(expect, *shard, _now_ms(), store_id)
                ctx.report.actions.append(f"{missing}: missing")
                _cut_wal(ctx, missing, b"", walfmt.HEADER_SIZE, expect, [path, *newer], made)
                break
            expect += 1
            data = _read(ctx, path) or b""
            header = _header(ctx, path, data, gen, shard, store_id)
            offset = start_off if gen == start_gen else walfmt.HEADER_SIZE
            result = walfmt.scan(data, offset, seed=walfmt.frame_seed(header))
            end = walfmt.batches_end(result.frames, offset)
            newest = gen == gens[-1]
            head = None
            if header.gen != gen:
                # a renamed or swapped file: none of its frames are this gen's; it keeps only
                # a header naming its own gen and the LOSS frames (quarantined first)
                end = walfmt.HEADER_SIZE
                head = walfmt.encode_header(gen, *shard, _now_ms(), store_id)
            elif len(data) < header.min_size:  # truncated (WAL-1): its header stops saying so
                head = walfmt.encode_header(gen, *shard, header.created_ms, store_id)
                _bound_truncated(ctx, body, key, data, offset, header, path)
            elif result.sealed or (newest and walfmt.durable_proof(data, end, gen) is None):
                continue
            _cut_wal(ctx, path, data, end, gen, newer, head)
            break


def _header(
    ctx: _Ctx, path: str, data: bytes, gen: int, shard: tuple[int, int], store_id: bytes
) -> walfmt.WalHeader:
    """The file's header; a damaged one over frames is written anew from what the file's name,
    directory and the snapshot say, when frames check under that gen (WAL-1, REP-4)."""
    try:
        return walfmt.decode_header(data)
    except Corrupt:
        pass
    head = walfmt.encode_header(gen, *shard, _now_ms(), store_id)
    fixed = head + data[walfmt.HEADER_SIZE :]
    if walfmt.scan(fixed, walfmt.HEADER_SIZE, seed=gen).frames:
        ctx.report.actions.append(f"{path}: damaged header rewritten (its frames check)")
        ctx.quarantine(path)
        if not ctx.dry_run:
            h = ctx.fs.open(path, create=False)
            try:
                h.pwrite(head, 0)
                h.fdatasync()
            finally:
                h.close()
    return walfmt.decode_header(fixed)


def _bound_truncated(
    ctx: _Ctx,
    body: dict[str, Any],
    key: str,
    data: bytes,
    start: int,
    header: walfmt.WalHeader,
    path: str,
) -> None:
    """REP-4: the bytes a truncation took left no trace; the most seqs they could have held
    (4 bytes each, an APPEND_BATCH's least) become a loss range for every topic of the shard,
    above the highest seq the snapshot or the file's surviving frames name."""
    most = (header.min_size - len(data)) // 4 + 1
    shards = int(body["wal"]["shards"]) or 1
    highest: dict[int, int] = {}
    for t in body["topics"]:
        tid = int(t["id"])
        if key == "flat" or xxhash.xxh3_64_intdigest(tid.to_bytes(8, "little")) % shards == int(
            key
        ):
            highest[tid] = max(int(t["head"]), int(t.get("ceiling", 0)))
    _named_seqs(data, start, header.gen, highest)
    ctx.bounds.update({tid: hi + most for tid, hi in highest.items()})
    ctx.report.actions.append(
        f"{path}: truncated to {len(data)} of {header.min_size} bytes: up to {most} seqs per "
        "topic may have been lost without a trace; each topic's head is raised by that many, "
        "behind a tombstone, so none is reused"
    )


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


def _cut_wal(
    ctx: _Ctx,
    path: str,
    data: bytes,
    end: int,
    gen: int,
    newer: list[str],
    head: bytes | None = None,
) -> None:
    """REP-4: keep the log of ``path`` (whose bytes are ``data``) before ``end``; LOSS frames
    at ``end`` cover every seq named after it, in this file and in ``newer`` (which go to
    quarantine); then FILE_END. ``head``: a header to write over the file's first."""
    highest: dict[int, int] = dict(ctx.bounds)
    _named_seqs(data, end, gen, highest)
    for other in newer:
        blob = _read(ctx, other)
        if blob is not None:
            other_gen = walfmt.parse_file_name(os.path.basename(other)) or 0
            _named_seqs(blob, walfmt.HEADER_SIZE, other_gen, highest)
    frames = [
        walfmt.encode_control(walfmt.FrameType.LOSS, tid, {"lo": 1}, seq=hi, seed=gen,
                              batch_end=tid == max(highest))
        for tid, hi in sorted(highest.items())
    ]  # fmt: skip
    frames.append(walfmt.encode_file_end(gen))
    lost = ", ".join(f"topic id {tid}: seqs up to {hi}" for tid, hi in sorted(highest.items()))
    ctx.report.actions.append(
        f"{path}: damaged at offset {end}: its log from there on"
        + (f" and {len(newer)} newer WAL file(s)" if newer else "")
        + f" quarantined; loss ranges (tombstones): {lost or 'none: no seq was named after it'}"
    )
    ctx.quarantine(path)
    for other in newer:
        ctx.quarantine(other)
    if ctx.dry_run:
        return
    h = ctx.fs.open(path)
    try:
        if head is not None:
            h.pwrite(head, 0)  # a file made anew, a renamed or a truncated one's
        h.pwrite(b"".join(frames), end)
        h.fdatasync()
    finally:
        h.close()
    for other in newer:
        ctx.fs.unlink(other)
    ctx.fs.fsync_dir(os.path.dirname(path))


_NONZERO = re.compile(rb"[^\x00]")


def _named_seqs(data: bytes, start: int, gen: int, highest: dict[int, int]) -> None:
    """Every seq a record or HEAD_RESERVE frame of this file names after ``start``, valid or
    only plausible (a damaged frame's header is the only trace of its records): the highest
    per topic, into ``highest``. Frames are looked for at every offset (the damage may have cut
    the chain); valid frames and a recycled file's stale ones (WAL-15) are stepped over whole,
    zeros skipped."""
    mv = memoryview(data)
    pos = start
    size = len(data)
    unpack = walfmt._FRAME.unpack_from
    while pos + walfmt.FRAME_OVERHEAD <= size:
        frame_len, ftype, _, tid, seq, _, nl, tl, dl = unpack(data, pos)
        if frame_len == 0:
            nxt = _NONZERO.search(data, pos + 4)
            if nxt is None:
                return
            pos = max(pos + 1, nxt.start() - 3)
            continue
        fits = frame_len == walfmt.FRAME_OVERHEAD - 4 + nl + tl + dl and pos + 4 + frame_len <= size
        if fits:
            got = walfmt._decode_at(mv, pos, True, gen)
            if isinstance(got, walfmt.Frame):
                _note(highest, got)
                pos += got.length
                continue
            if _older_gen(data, pos, frame_len, gen):
                pos += 4 + frame_len
                continue
            if (ftype in _APPENDS or ftype == _RESERVE) and 1 <= seq < 1 << 62 and tid:
                last = seq + _damaged_count(data, pos, ftype, nl + tl, dl) - 1
                highest[tid] = max(highest.get(tid, 0), last)  # a damaged frame's trace
        pos += 1


def _damaged_count(data: bytes, pos: int, ftype: int, labels: int, dl: int) -> int:
    """How many records a damaged record frame may hold (its checksum failed, so nothing in it
    is sure): an APPEND one; an APPEND_BATCH its count when its length table adds up to its
    data (WAL-14), else the most its data could hold, so no seq it held is handed out again."""
    if ftype != _APPENDS[1] or dl < 8:
        return 1
    at = pos + walfmt.FRAME_HEADER_SIZE + labels
    most = (dl - 4) // 4
    (n,) = walfmt._U32.unpack_from(data, at)
    if 1 <= n <= most:
        lengths = array("I", data[at + 4 : at + 4 + 4 * n])
        if sys.byteorder == "big":
            lengths.byteswap()
        if 4 + 4 * n + sum(lengths) == dl:
            return n
    return most


def _note(highest: dict[int, int], f: walfmt.Frame) -> None:
    if f.type in _APPENDS:
        count = 1
        if f.type == _APPENDS[1]:
            try:
                count = walfmt.append_batch_lengths(f.data, "WAL")[0]
            except Corrupt:
                count = 1
        highest[f.topic_id] = max(highest.get(f.topic_id, 0), f.seq + count - 1)
    elif f.type == _RESERVE:
        highest[f.topic_id] = max(highest.get(f.topic_id, 0), f.seq)


def _older_gen(data: bytes, pos: int, frame_len: int, gen: int) -> bool:
    """Whether the frame at ``pos`` checks under an older gen's seed (the last 64): a recycled
    file's stale frame (WAL-15), not a trace of this file's damaged records."""
    body = memoryview(data)[pos + 4 : pos + frame_len - 4]
    (stored,) = walfmt._U64.unpack_from(data, pos + frame_len - 4)
    return any(xxhash.xxh3_64_intdigest(body, g) == stored for g in range(max(0, gen - 64), gen))


# -- small helpers -----------------------------------------------------------------------------
def _read(ctx: _Ctx, path: str) -> bytes | None:
    return read_whole(ctx.fs, path) if ctx.fs.exists(path) else None


def _ranges(seqs: list[int]) -> list[tuple[int, int]]:
    out: list[tuple[int, int]] = []
    for s in seqs:
        if out and out[-1][1] + 1 == s:
            out[-1] = (out[-1][0], s)
        else:
            out.append((s, s))
    return out


def _merge(ranges: list[list[int]]) -> list[list[int]]:
    out: list[list[int]] = []
    for lo, hi in sorted((int(a), int(b)) for a, b in ranges):
        if out and lo <= out[-1][1] + 1:
            out[-1][1] = max(out[-1][1], hi)
        else:
            out.append([lo, hi])
    return out
