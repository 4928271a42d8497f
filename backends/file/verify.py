"""Offline checker for a file-backend store directory (spec/FORMATS.md).

``verify_store`` reads every file of the layout through an ``FS`` and reports each problem with
its path, byte offset and the FORMATS.md rule it breaks. Errors mean recovery would refuse the
store or lose acknowledged data; warnings are states a crash or an older tidelog may leave that
recovery handles (a torn WAL tail, a leftover temp file, a damaged but superseded snapshot).
It never raises on garbage: a codec's ``Corrupt`` becomes a ``Problem``.
"""

from __future__ import annotations

import posixpath
import re
from array import array
from collections.abc import Iterator
from contextlib import contextmanager
from itertools import pairwise

from tidelog.fsio import FS
from tidelog.report import ERROR, WARNING, Problem, Report

from .format import (
    LOCK_FILE,
    LOCK_PID_FILE,
    META_DIR,
    TMP_SUFFIX,
    TOPICS_DIR,
    WAL_DIR,
    FormatCorrupt,
    parse_qseg_name,
    parse_shard_dir_name,
    parse_topic_dir_name,
    qseg_name,
    wal,
)
from .format import progress as prg
from .format import segment as seg
from .format import snapshot as snap

__all__ = ["Problem", "Report", "verify_store", "is_store"]

_MAX_PER_FILE = 20  # repeated findings in one file are summarised after this many
_PID = re.compile(r"[0-9]+\n")


class _Ctx:
    """The FS, the report being filled, and small helpers every check shares."""

    def __init__(self, fs: FS, root: str) -> None:
        self.fs = fs
        self.root = root
        self.report = Report(root)
        self.store_id: bytes | None = None
        self.replay_from: dict[str, object] = {}  # the newest valid snapshot's (stream -> pos)
        self.named: dict[int, set[int]] | None = None  # ... and its segments (tid -> firsts)
        self.cold: dict[int, set[int]] = {}  # segments flipped cold: snapshot and TIER frames

    def add(self, severity: str, path: str, offset: int | None, rule: str, message: str) -> None:
        self.report.problems.append(Problem(path, offset, rule, severity, message))

    def error(self, path: str, offset: int | None, rule: str, message: str) -> None:
        self.add(ERROR, path, offset, rule, message)

    def warn(self, path: str, offset: int | None, rule: str, message: str) -> None:
        self.add(WARNING, path, offset, rule, message)

    def listdir(self, path: str) -> list[str]:
        try:
            return self.fs.listdir(path)
        except OSError as exc:
            self.error(path, None, "LAY-2", f"cannot list directory: {exc}")
            return []

    def is_dir(self, path: str) -> bool:
        try:
            return self.fs.is_dir(path)
        except OSError:
            return False

    def read(self, path: str, rule: str) -> bytes | None:
        """The whole file, or None (with an error) if it cannot be read."""
        try:
            handle = self.fs.open_read(path)
            try:
                data = handle.pread(handle.size(), 0)
            finally:
                handle.close()
        except OSError as exc:
            self.error(path, None, rule, f"cannot read file: {exc}")
            return None
        self.report.files_checked += 1
        return data

    @contextmanager
    def guard(self, path: str, rule: str) -> Iterator[None]:
        """Turn a codec's Corrupt into an error; anything else unexpected too, so one bad file
        never stops the rest of the check (verify must not raise on garbage)."""
        try:
            yield
        except FormatCorrupt as exc:
            self.error(path, None, exc.rule, exc.detail)
        except Exception as exc:
            self.error(path, None, rule, f"cannot check file: {exc!r}")


def _join(*parts: str) -> str:
    return posixpath.join(*parts)


# --- root and lock files (LAY-1, LAY-2, LOCK-2) ---------------------------------------------------


def _check_root(ctx: _Ctx) -> bool:
    """LAY-1: the root is a directory with meta/; otherwise one error and nothing else."""
    if not ctx.fs.exists(ctx.root):
        ctx.error(ctx.root, None, "LAY-1", "no such file or directory")
        return False
    if not ctx.is_dir(ctx.root):
        ctx.error(ctx.root, None, "LAY-1", "not a directory, so not a file-backend store")
        return False
    if not ctx.is_dir(_join(ctx.root, META_DIR)):
        ctx.error(ctx.root, None, "LAY-1", "not a tidelog store: no meta/ directory")
        return False
    return True


def _check_root_entries(ctx: _Ctx) -> None:
    for name in ctx.listdir(ctx.root):
        path = _join(ctx.root, name)
        if name in (META_DIR, WAL_DIR, TOPICS_DIR, "requests", "quarantine") and ctx.is_dir(path):
            continue  # requests/: cross-process requests (XPR-2); quarantine/: REP-1, never read
        if name == LOCK_FILE:
            continue
        if name == LOCK_PID_FILE:
            _check_pid_file(ctx, path)
            continue
        ctx.warn(path, None, "LAY-2", "unknown entry in the store root")


def _check_pid_file(ctx: _Ctx, path: str) -> None:
    """LOCK-2: empty (holder unknown) or a decimal PID and a newline."""
    data = ctx.read(path, "LOCK-2")
    if data and not _PID.fullmatch(data.decode("utf-8", "replace")):
        ctx.warn(path, 0, "LOCK-2", f"expected '<pid>\\n', found {data[:40]!r}")


# --- snapshots (SNAP-*) ---------------------------------------------------------------------------


def _check_meta(ctx: _Ctx) -> bool:
    """SNAP-1..5 over every snapshot copy; the newest valid one supplies the store id. False
    when there is no snapshot file at all (LAY-1: not a store)."""
    meta = _join(ctx.root, META_DIR)
    names = ctx.listdir(meta)
    copies = snap.copies(names)
    for name in names:
        path = _join(meta, name)
        if snap.parse_file_name(name) is not None or snap.parse_mirror_name(name) is not None:
            continue
        base = name[: -len(TMP_SUFFIX)] if name.endswith(TMP_SUFFIX) else None
        if base is not None and snap.copies([base]):
            _warn_tmp(ctx, path)
        else:
            ctx.warn(path, None, "LAY-2", "unknown file in meta/")
    if not copies:
        ctx.error(meta, None, "LAY-1", "not a tidelog store: no snapshot in meta/")
        return False
    found: dict[int, str] = {}
    bad: dict[int, FormatCorrupt] = {}
    valid: dict[int, dict[str, object]] = {}
    for n, names_n in copies.items():
        results = [(name, _decode_snapshot(ctx, _join(meta, name), n)) for name in names_n]
        good = [(name, r) for name, r in results if isinstance(r, dict)]
        found[n] = _join(meta, (good or results)[0][0])
        if good:
            valid[n] = good[0][1]
            for name, r in results:
                if isinstance(r, FormatCorrupt):
                    ctx.warn(_join(meta, name), None, "SNAP-5", f"{r.detail}; its other copy "
                             f"{good[0][0]} is valid and recovery uses it")  # fmt: skip
        elif isinstance(results[0][1], FormatCorrupt):
            bad[n] = results[0][1]
    _report_bad_snapshots(ctx, found, bad, max(valid) if valid else None)
    if valid:
        newest = max(valid)
        _take_store_id(ctx, found[newest], valid[newest])
    return True


def _decode_snapshot(ctx: _Ctx, path: str, n: int) -> dict[str, object] | FormatCorrupt | None:
    data = ctx.read(path, "SNAP-1")
    if data is None:
        return None
    try:
        got, body = snap.decode_snapshot(data)
    except FormatCorrupt as exc:
        return exc
    if got != n:
        return FormatCorrupt("SNAP-1", f"header says snapshot {got}, the file name says {n}")
    return body


def _report_bad_snapshots(
    ctx: _Ctx, found: dict[int, str], bad: dict[int, FormatCorrupt], best: int | None
) -> None:
    """SNAP-4: a damaged snapshot is harmless while a valid one remains (recovery takes the
    highest valid n); with none valid the store cannot be opened."""
    for n, exc in sorted(bad.items()):
        if best is None:
            ctx.error(found[n], None, exc.rule, f"{exc.detail}; no valid snapshot remains (SNAP-4)")
        elif n > best:
            ctx.warn(
                found[n], None, exc.rule, f"{exc.detail}; recovery falls back to snapshot {best}"
            )
        else:
            ctx.warn(found[n], None, exc.rule, f"{exc.detail}; superseded by snapshot {best}")


def _take_store_id(ctx: _Ctx, path: str, body: dict[str, object]) -> None:
    raw = body.get("store_id")
    topics = body.get("topics")
    if isinstance(topics, list):
        ctx.named = {
            int(t["id"]): {int(f) for f in t.get("segments", [])}
            for t in topics
            if isinstance(t, dict) and "id" in t
        }
        for t in topics:  # TIER-5: the snapshot's cold segments live in the cold tier
            if isinstance(t, dict) and "id" in t and isinstance(t.get("cold"), list):
                ctx.cold.setdefault(int(t["id"]), set()).update(int(f) for f in t["cold"])
    wal_body = body.get("wal")
    if isinstance(wal_body, dict) and isinstance(wal_body.get("replay_from"), dict):
        ctx.replay_from = wal_body["replay_from"]
    if isinstance(raw, str) and re.fullmatch(r"[0-9a-f]{32}", raw):
        ctx.store_id = bytes.fromhex(raw)
    else:
        ctx.warn(path, None, "SNAP-3", "no 32-hex-digit store_id: WAL files not cross-checked")


# --- WAL (WAL-*) ----------------------------------------------------------------------------------


def _check_wal(ctx: _Ctx) -> None:
    """Every shard's files in gen order; only the newest file of a shard may end torn."""
    wal_dir = _join(ctx.root, WAL_DIR)
    if not ctx.is_dir(wal_dir):
        return
    flat: dict[int, str] = {}
    for name in ctx.listdir(wal_dir):
        path = _join(wal_dir, name)
        shard = parse_shard_dir_name(name)
        if shard is not None and ctx.is_dir(path):
            _check_wal_group(ctx, _wal_files(ctx, path), shard, sharded=True)
        elif (gen := wal.parse_file_name(name)) is not None:
            flat[gen] = path
        elif wal.parse_spare_name(name) is not None:
            continue  # a retired file kept for recycling (WAL-15): never read
        else:
            ctx.warn(path, None, "LAY-2", "unknown entry in wal/")
    _check_wal_group(ctx, flat, 0, sharded=False)


def _wal_files(ctx: _Ctx, shard_dir: str) -> dict[int, str]:
    files: dict[int, str] = {}
    for name in ctx.listdir(shard_dir):
        path = _join(shard_dir, name)
        gen = wal.parse_file_name(name)
        if gen is None and wal.parse_spare_name(name) is not None:
            continue  # a retired file kept for recycling (WAL-15): never read
        if gen is None:
            ctx.warn(path, None, "LAY-2", "unknown file in a WAL shard directory")
        else:
            files[gen] = path
    return files


def _check_wal_group(ctx: _Ctx, files: dict[int, str], shard: int, *, sharded: bool) -> None:
    last = max(files, default=None)
    key = f"{shard:02d}" if sharded else "flat"
    pos = ctx.replay_from.get(key)
    start = int(pos[0]) if isinstance(pos, list) and pos else min(files, default=0)
    expect = range(start, max(last or 0, start) + 1) if start else range(0)
    directory = _join(ctx.root, WAL_DIR, *([f"shard-{shard:02d}"] if sharded else []))
    for gen in sorted(set(expect) - set(files)):
        ctx.error(_join(directory, wal.file_name(gen)), None, "WAL-10",
                  "missing: replay needs every WAL file from the snapshot's replay position "
                  "on; recovery refuses the store (FLT-2)")  # fmt: skip
    for gen in sorted(files):
        path = files[gen]
        with ctx.guard(path, "WAL-1"):
            _check_wal_file(ctx, path, gen, shard, sharded=sharded, is_last=gen == last)


def _check_wal_file(
    ctx: _Ctx, path: str, gen: int, shard: int, *, sharded: bool, is_last: bool
) -> None:
    data = ctx.read(path, "WAL-1")
    if data is None:
        return
    try:
        header = wal.decode_header(data)
    except FormatCorrupt:
        if is_last and wal.first_nonzero(data, wal.HEADER_SIZE) is None:
            # Created (and maybe preallocated) but the header never reached the disk.
            ctx.warn(path, 0, "WAL-1", "newest WAL file has no valid header yet: it holds no "
                     "frames (recovery removes it)")  # fmt: skip
            return
        raise  # frames follow (or newer files do): a damaged header, reported by the guard
    _check_wal_identity(ctx, path, header, gen, shard, sharded=sharded)
    if len(data) < header.min_size:
        ctx.error(path, len(data), "WAL-1", f"truncated: {len(data)} bytes, but its header "
                  f"says {header.min_size} were reserved: recovery refuses (FLT-1)")  # fmt: skip
    result = wal.scan(data, seed=wal.frame_seed(header))
    _check_frames(ctx, path, result.frames, result.unknown)
    start = _replay_start(ctx, gen, f"{shard:02d}" if sharded else "flat")
    if start is not None:  # what replay applies after the snapshot (which has the rest)
        _note_tier(ctx, [f for f in result.frames if f.offset >= start])
    if _check_durable_end(ctx, path, data, header, result, start):
        return
    _check_batches(ctx, path, result, is_last=is_last)
    if header.version >= 3:
        _check_sealed(ctx, path, result, is_last=is_last)
    else:
        _check_wal_end(ctx, path, data, result, is_last=is_last)


def _replay_start(ctx: _Ctx, gen: int, key: str) -> int | None:
    """Where recovery starts reading the file of ``gen`` in stream ``key``: the newest valid
    snapshot's replay position (SNAP), the header's end in later files, None before it."""
    pos = ctx.replay_from.get(key)
    start_gen, start_off = pos if isinstance(pos, list) and len(pos) == 2 else (0, 0)
    if gen < start_gen:
        return None
    return max(int(start_off), wal.HEADER_SIZE) if gen == start_gen else wal.HEADER_SIZE


def _check_durable_end(
    ctx: _Ctx,
    path: str,
    data: bytes,
    header: wal.WalHeader,
    result: wal.ScanResult,
    start: int | None,
) -> bool:
    """WAL-16, FLT-1: where the log does not end cleanly, a SYNCED frame after its end that
    proves the bytes there durable makes it damage, which recovery refuses (an error). Damage
    in frames a snapshot absorbed is harmless: recovery never reads them (a warning). True if
    the file was reported here."""
    if result.sealed or header.version < 3:
        return False
    end = wal.batches_end(result.frames, wal.HEADER_SIZE)
    if start is None or end < start:
        proof = wal.durable_proof(data, end, header.gen)
        if proof is None:
            return False
        ctx.warn(path, end, "WAL-16", "damaged, but in frames the newest snapshot absorbed "
                 "into segments: recovery does not read them")  # fmt: skip
        if start is None:
            return True
        result = wal.scan(data, start, seed=wal.frame_seed(header))
        if result.sealed:
            return True
        end = wal.batches_end(result.frames, start)
    proof = wal.durable_proof(data, end, header.gen)
    if proof is None:
        return False
    ctx.error(path, end, "WAL-16", f"damaged: the log ends here ({result.detail}), but the "
              f"SYNCED frame at offset {proof.offset} shows every byte before {proof.synced} "
              "was durable: recovery refuses the store (FLT-1)")  # fmt: skip
    return True


def _check_wal_identity(
    ctx: _Ctx, path: str, header: wal.WalHeader, gen: int, shard: int, *, sharded: bool
) -> None:
    """WAL-10 name vs header; WAL-2 shard placement and store id (swapped or foreign files)."""
    if header.gen != gen:
        ctx.error(path, 16, "WAL-10", f"header gen {header.gen:#x} but the file name says {gen:#x}")
    if sharded and (header.shard != shard or header.shard_count < 2):
        ctx.error(
            path,
            24,
            "WAL-2",
            f"header shard {header.shard}/{header.shard_count} in shard-{shard:02d}/",
        )
    if not sharded and (header.shard, header.shard_count) != (0, 1):
        ctx.error(
            path, 24, "WAL-2", f"header shard {header.shard}/{header.shard_count} in flat wal/"
        )
    if ctx.store_id is not None and header.store_id != ctx.store_id:
        ctx.error(
            path,
            40,
            "WAL-2",
            f"store_id {header.store_id.hex()} is not this store's (foreign file)",
        )


def _check_frames(ctx: _Ctx, path: str, frames: list[wal.Frame], unknown: list[int]) -> None:
    """WAL-3 seqs, WAL-6 flags, WAL-8 unknown types, WAL-9 control bodies."""
    reported = 0
    unknown_at = set(unknown)
    for frame in frames:
        found = _frame_problem(frame, frame.offset in unknown_at)
        if found is None:
            continue
        reported += 1
        if reported > _MAX_PER_FILE:
            ctx.warn(path, frame.offset, found[1], "further frame findings in this file omitted")
            return
        ctx.add(found[0], path, frame.offset, found[1], found[2])


def _frame_problem(frame: wal.Frame, unknown: bool) -> tuple[str, str, str] | None:
    if unknown:
        return WARNING, "WAL-8", f"unknown frame type {frame.type}: replay skips it"
    if frame.flags & ~wal.KNOWN_FLAGS:
        return WARNING, "WAL-6", f"reserved flag bits set ({frame.flags:#04x})"
    if frame.type == wal.FrameType.APPEND or frame.type == wal.FrameType.APPEND_BATCH:
        if frame.seq < 1:
            name = wal.FrameType(frame.type).name
            return ERROR, "WAL-3", f"{name} frame with seq {frame.seq} (seqs start at 1)"
        if frame.type == wal.FrameType.APPEND_BATCH:
            try:
                wal.split_append_batch(frame.data, "APPEND_BATCH frame")
            except FormatCorrupt as exc:
                return ERROR, exc.rule, exc.detail
        return None
    if frame.flags & (wal.HAS_TAG | wal.HAS_NODE):
        return ERROR, "WAL-6", "control frame with a tag or node"
    try:
        frame.body  # noqa: B018  (parsing is the check)
    except FormatCorrupt as exc:
        return ERROR, exc.rule, exc.detail
    return None


def _note_tier(ctx: _Ctx, frames: list[wal.Frame]) -> None:
    """TIER-5: a TIER frame flips segments cold; their hot files may be gone (TIER-14)."""
    for frame in frames:
        if frame.type == wal.FrameType.TIER:
            try:
                firsts = frame.body.get("segments", [])
                ctx.cold.setdefault(frame.topic_id, set()).update(int(f) for f in firsts)
            except (FormatCorrupt, TypeError, ValueError):
                continue  # reported by _check_frames


def _check_batches(ctx: _Ctx, path: str, result: wal.ScanResult, *, is_last: bool) -> None:
    """WAL-7: within one batch each topic's records have consecutive seqs; only the newest
    file's log may end inside a batch (replay discards that torn batch)."""
    batches, tail = wal.split_batches(result.frames)
    for batch in batches + ([tail] if tail else []):
        bad = _batch_seq_break(batch)
        if bad is not None:
            ctx.error(path, bad.offset, "WAL-7", f"APPEND seq {bad.seq} breaks its batch's run")
    if not tail:
        return
    what = f"log ends inside a batch ({len(tail)} frames without BATCH_END)"
    if is_last:
        ctx.warn(path, tail[0].offset, "WAL-7", f"{what}: replay discards them (never acked)")
    else:
        ctx.error(path, tail[0].offset, "WAL-7", f"{what} in a WAL file that is not the newest")


def _batch_seq_break(batch: list[wal.Frame]) -> wal.Frame | None:
    """The first APPEND (or APPEND_BATCH, WAL-14) whose first seq does not follow its topic's
    previous record in the batch."""
    last: dict[int, int] = {}
    for frame in batch:
        if frame.type == wal.FrameType.APPEND:
            count = 1
        elif frame.type == wal.FrameType.APPEND_BATCH:
            try:
                count = len(wal.split_append_batch(frame.data, "APPEND_BATCH frame"))
            except FormatCorrupt:
                continue  # reported by _frame_problem
        else:
            continue
        prev = last.get(frame.topic_id)
        if prev is not None and frame.seq != prev + 1:
            return frame
        last[frame.topic_id] = frame.seq + count - 1
    return None


def _check_sealed(ctx: _Ctx, path: str, result: wal.ScanResult, *, is_last: bool) -> None:
    """WAL-15: a version-3 file's log ends with FILE_END unless it is its shard's newest. What
    follows the end is never read: in the newest file a torn frame and a recycled file's older
    frames look alike (both fail the checksum), and neither held an acknowledged op, so neither
    is reported."""
    if result.sealed or is_last:
        return
    ctx.error(path, result.end, "WAL-15", f"the log ends without FILE_END ({result.detail}) in "
              "a WAL file that is not the newest: frames after it would be lost")  # fmt: skip


def _check_wal_end(
    ctx: _Ctx, path: str, data: bytes, result: wal.ScanResult, *, is_last: bool
) -> None:
    """WAL-5: a torn frame is the expected crash tail only in a shard's newest file. WAL-4:
    after a clean end the preallocated rest must be zeros."""
    if result.status == "torn":
        if is_last:
            ctx.warn(
                path,
                result.end,
                "WAL-5",
                "torn tail: recovery truncates here, nothing acknowledged is lost "
                f"({result.detail})",
            )
        else:
            ctx.error(
                path,
                result.end,
                "WAL-5",
                f"damaged frame ({result.detail}) in a WAL file that is not the newest: "
                "the frames after it would be lost",
            )
        return
    stale = wal.first_nonzero(data, result.end)
    if stale is not None:
        ctx.warn(
            path,
            stale,
            "WAL-4",
            f"non-zero bytes after the end of the log at {result.end}: leftovers of an "
            "unacknowledged write, to be zeroed before appending",
        )


# --- topics: segments (SEG-*) and progress files (PRG-*) -----------------------------------------


def _check_topics(ctx: _Ctx) -> None:
    topics = _join(ctx.root, TOPICS_DIR)
    if not ctx.is_dir(topics):
        return
    for name in ctx.listdir(topics):
        path = _join(topics, name)
        topic_id = parse_topic_dir_name(name)
        if topic_id is None or not ctx.is_dir(path):
            ctx.warn(path, None, "LAY-2", "unknown entry in topics/")
            continue
        _check_topic_dir(ctx, path, topic_id)


def _check_topic_dir(ctx: _Ctx, path: str, topic_id: int) -> None:
    pairs: dict[int, set[str]] = {}
    for name in ctx.listdir(path):
        file_path = _join(path, name)
        parsed = seg.parse_name(name)
        if parsed is not None:
            pairs.setdefault(parsed[0], set()).add(parsed[1])
        elif (first := parse_qseg_name(name)) is not None:
            pairs.setdefault(first, set()).add("qseg")
        elif prg.parse_file_name(name) is not None:
            with ctx.guard(file_path, "PRG-1"):
                _check_progress(ctx, file_path)
        elif name.endswith(TMP_SUFFIX) and (
            prg.parse_file_name(name[: -len(TMP_SUFFIX)])
            or parse_qseg_name(name[: -len(TMP_SUFFIX)]) is not None
        ):
            _warn_tmp(ctx, file_path)
        else:
            ctx.warn(file_path, None, "LAY-2", "unknown file in a topic directory")
    _check_segments(ctx, path, topic_id, pairs)


def _check_segments(ctx: _Ctx, path: str, topic_id: int, pairs: dict[int, set[str]]) -> None:
    """SEG-7: every .data has its .idx and vice versa; segments (plain or .qseg) do not
    overlap. QSEG-10: one format per segment. What recovery reads is what the newest valid
    snapshot names: a segment it names must be there (an error: recovery refuses, FLT-2);
    a file it does not name is never read (a warning)."""
    if ctx.named is not None:
        named = ctx.named.get(topic_id, set())
        cold = ctx.cold.get(topic_id, set())  # TIER-14: checked in the cold tier instead
        for first_seq in sorted(named - set(pairs) - cold):
            ctx.error(_join(path, seg.data_name(first_seq)), None, "SEG-7", "missing: the "
                      "newest snapshot names this segment; recovery refuses (FLT-2)")  # fmt: skip
        for first_seq in sorted(set(pairs) - named):
            for kind in sorted(pairs.pop(first_seq)):
                name = {"qseg": qseg_name, "data": seg.data_name, "idx": seg.idx_name}[kind](
                    first_seq
                )
                ctx.warn(_join(path, name), None, "SEG-7", "not named by the newest snapshot: "
                         "recovery never reads it (an interrupted checkpoint's leftover, or a "
                         "stray copy)")  # fmt: skip
    prev_last: int | None = None
    for first_seq in sorted(pairs):
        kinds = pairs[first_seq]
        if "qseg" in kinds:
            qpath = _join(path, qseg_name(first_seq))
            if kinds != {"qseg"}:
                ctx.error(qpath, None, "QSEG-10", "a .data/.idx segment starts at the same seq")
            last = _check_qseg(ctx, qpath, first_seq)
            if last is not None and prev_last is not None and first_seq <= prev_last:
                ctx.error(qpath, None, "SEG-7", f"starts inside the previous segment ({prev_last})")
            prev_last = last if last is not None else prev_last
            continue
        if kinds != {"data", "idx"}:
            have = seg.data_name(first_seq) if "data" in kinds else seg.idx_name(first_seq)
            missing = seg.idx_name(first_seq) if "data" in kinds else seg.data_name(first_seq)
            ctx.error(_join(path, have), None, "SEG-7", f"{missing} is missing")
            continue
        if prev_last is not None and first_seq <= prev_last:
            ctx.error(
                _join(path, seg.data_name(first_seq)),
                None,
                "SEG-7",
                f"starts at seq {first_seq}, inside the previous segment (ends at {prev_last})",
            )
        with ctx.guard(_join(path, seg.data_name(first_seq)), "SEG-1"):
            last = _check_segment(ctx, path, topic_id, first_seq)
            prev_last = last if last is not None else prev_last


def _check_qseg(ctx: _Ctx, path: str, first_seq: int) -> int | None:
    """QSEG-1..QSEG-10: a bundle topic's Quiver segment, validated whole; its last seq."""
    data = ctx.read(path, "QSEG-7")
    if data is None:
        return None
    from .format import qseg  # pyarrow: only stores with bundle topics need it

    last: int | None = None
    with ctx.guard(path, "QSEG-7"):
        try:
            reader = qseg.open_qseg(data)
        except qseg.QsegError as exc:
            ctx.error(path, None, exc.rule, f"{exc.kind}: {exc.detail}")
            return None
        if reader.first_seq != first_seq:
            detail = f"holds seqs from {reader.first_seq}, its name says {first_seq}"
            ctx.error(path, None, "QSEG-10", detail)
            return None
        last = reader.last_seq
    return last


def _check_segment(ctx: _Ctx, path: str, topic_id: int, first_seq: int) -> int | None:
    """One .data/.idx pair; returns the segment's last seq when it is known."""
    data_path = _join(path, seg.data_name(first_seq))
    idx_path = _join(path, seg.idx_name(first_seq))
    data = ctx.read(data_path, "SEG-1")
    idx_bytes = ctx.read(idx_path, "SEG-4")
    if data is None or idx_bytes is None:
        return None
    return check_segment_bytes(ctx, data_path, idx_path, data, idx_bytes, topic_id, first_seq)


def check_segment_bytes(
    ctx: _Ctx,
    data_path: str,
    idx_path: str,
    data: bytes,
    idx_bytes: bytes,
    topic_id: int,
    first_seq: int,
) -> int | None:
    """SEG-1..SEG-17 over one segment's bytes, wherever they were read from (a hot file, a
    cold object: spec/TIERING.md TIER-14); its last seq when it is known."""
    header = _check_data_header(ctx, data_path, data, topic_id, first_seq)
    index = _read_index(ctx, idx_path, idx_bytes, topic_id, first_seq)
    if header is None:
        return index.last_seq if index else None
    if index is not None and (header.version == seg.DATA_VERSION_RUNS) != (
        index.version == seg.IDX_VERSION_RUNS
    ):
        ctx.error(idx_path, 8, "SEG-17", f".idx version {index.version} with .data version "
                  f"{header.version} (.data 2 pairs with .idx 3 only)")  # fmt: skip
        index = None
    scanned = seg.scan_data(data)
    if scanned.problem is not None:
        p = scanned.problem
        ctx.error(data_path, p.offset, p.rule, p.detail)
    if index is None:
        return first_seq + len(scanned.frames) - 1
    if _compare_index(ctx, idx_path, idx_bytes, index, scanned) and scanned.problem is None:
        # blocks and runs are judged only against a .data and entries that check out: a
        # damaged frame or entry is reported once, where it is, not again through its block
        _compare_tables(ctx, idx_path, data, index, scanned)
    return index.last_seq


def _check_data_header(
    ctx: _Ctx, path: str, data: bytes, topic_id: int, first_seq: int
) -> seg.SegmentHeader | None:
    """SEG-1: a valid header naming this topic and the file name's first seq."""
    try:
        header = seg.decode_data_header(data)
    except FormatCorrupt as exc:
        ctx.error(path, 0, exc.rule, exc.detail)
        return None
    if header.topic_id != topic_id:
        ctx.error(path, 16, "SEG-1", f"topic_id {header.topic_id:#x} in topic dir {topic_id:016x}")
    if header.first_seq != first_seq:
        ctx.error(path, 24, "SEG-1", f"first_seq {header.first_seq}, file name says {first_seq}")
    return header


def _read_index(
    ctx: _Ctx, path: str, data: bytes, topic_id: int, first_seq: int
) -> seg.SegmentIndex | None:
    """SEG-4, SEG-6: header, size and footer; the pair's topic and first seq."""
    try:
        return seg.read_index(data, topic_id=topic_id, first_seq=first_seq)
    except FormatCorrupt as exc:
        ctx.error(path, None, exc.rule, exc.detail)
        return None


_FIELDS = {"offsets": "offset", "lengths": "length", "tss": "ts", "flags": "flags"}


def _compare_index(
    ctx: _Ctx, path: str, raw: bytes, index: seg.SegmentIndex, scanned: seg.DataScan
) -> bool:
    """SEG-5: entry i describes the i-th frame of the .data exactly, and pads are zero; True
    when nothing was wrong."""
    found = len(ctx.report.problems)
    head = seg.HEADER_SIZE if index.version == 1 else seg.IDX_HEADER_SIZE
    frames = scanned.frames
    n = min(index.count, len(frames))
    actual = {
        "offsets": array(index.offsets.typecode, [f.offset for f in frames[:n]]),
        "lengths": array(index.lengths.typecode, [f.length for f in frames[:n]]),
        "tss": array(index.tss.typecode, [f.ts for f in frames[:n]]),
        "flags": array("B", [f.flags for f in frames[:n]]),
    }
    for name, label in _FIELDS.items():
        column = getattr(index, name)[:n]
        if column != actual[name]:  # one C-level comparison; look closer only on a mismatch
            i = next(i for i in range(n) if column[i] != actual[name][i])
            at = head + i * seg.ENTRY_SIZE
            ctx.error(
                path,
                at,
                "SEG-5",
                f"entry {i}: {label} {column[i]}, the frame's is {actual[name][i]}",
            )
    body = raw[head : head + index.count * seg.ENTRY_SIZE]
    if any(body[17::20]) or any(body[18::20]) or any(body[19::20]):
        ctx.error(path, None, "SEG-5", "non-zero pad bytes in index entries")
    if scanned.problem is None and index.count != len(frames):
        ctx.error(path, 12, "SEG-5", f"count {index.count}, but the .data holds {len(frames)}")
    return len(ctx.report.problems) == found


def _compare_tables(
    ctx: _Ctx, path: str, data: bytes, index: seg.SegmentIndex, scanned: seg.DataScan
) -> None:
    """SEG-13: a version-2 index's data_size, blocks (SEG-10) and label runs (SEG-11) describe
    the .data exactly. (read_index already checked the tables' own consistency.)"""
    if index.runs is None:
        return
    if len(data) != index.data_size:  # (entries matching the frames: 32 + Σ length holds)
        ctx.error(path, 32, "SEG-9", f"data_size {index.data_size}, the .data file has "
                  f"{len(data)} bytes")  # fmt: skip
    tables = seg.IDX_HEADER_SIZE + index.count * seg.ENTRY_SIZE
    if scanned.runs is not None:  # SEG-17: block k is exactly run frame k
        blocks = list(zip(index.block_slots, index.block_offsets))
        for k, (got, frame) in enumerate(zip(blocks, scanned.runs)):
            if got != frame:
                ctx.error(path, tables + 16 * k, "SEG-17", f"block {k}: slot {got[0]} at "
                          f"{got[1]}, run frame {k} is slot {frame[0]} at {frame[1]}")  # fmt: skip
                return
        if len(blocks) != len(scanned.runs):
            ctx.error(path, 40, "SEG-17", f"{len(blocks)} blocks for {len(scanned.runs)} run "
                      "frames")  # fmt: skip
            return
    for k, start in enumerate(index.block_offsets):
        _, end = index.block_end(k)
        if seg.block_hash(data, start, end) != index.block_hashes[k]:
            detail = f"block {k}: XXH3-64 of .data bytes [{start}, {end}) does not match"
            rule = "SEG-10" if scanned.runs is None else "SEG-17"
            ctx.error(path, tables + 16 * k + 8, rule, detail)
    runs = index.runs
    bounds = [*runs.firsts, index.count]
    frames = scanned.frames
    at = tables + 16 * len(index.block_offsets)
    for r, (a, b) in enumerate(pairwise(bounds)):
        want = (runs.tags[r], runs.nodes[r])
        bad = next((f for f in frames[a:b] if (f.tag, f.node) != want), None)
        if bad is not None:
            ctx.error(path, at + 12 * r, "SEG-11",
                      f"run {r}: tag/node {want}, the record at .data offset {bad.offset} has "
                      f"{(bad.tag, bad.node)}")  # fmt: skip


def _check_progress(ctx: _Ctx, path: str) -> None:
    """PRG-1..PRG-6: the file decodes; decoder warnings (unknown flags, trailing bytes) pass on."""
    data = ctx.read(path, "PRG-1")
    if data is None:
        return
    progress = prg.decode_progress(data)
    for message in progress.warnings:
        ctx.warn(path, None, "PRG-2", message)


def _warn_tmp(ctx: _Ctx, path: str) -> None:
    ctx.warn(
        path,
        None,
        "LAY-3",
        "leftover temporary file of an interrupted atomic write: harmless, never read",
    )


# --- entry point ----------------------------------------------------------------------------------


def is_store(fs: FS, path: str) -> bool:
    """``path`` is a file-backend store directory: it holds ``meta/`` (LAY-1). What ``tidelog
    verify`` asks the ``file`` descriptor (REG-5)."""
    try:
        return fs.is_dir(path) and fs.is_dir(posixpath.join(path, META_DIR))
    except OSError:
        return False


def verify_store(fs: FS, root: str, cold: str | None = None) -> Report:
    """Check the store directory ``root`` (spec/FORMATS.md), and its cold tier at ``cold``
    (spec/TIERING.md TIER-14); never raises on bad content."""
    ctx = _Ctx(fs, root)
    if not _check_root(ctx):
        return ctx.report
    if not _check_meta(ctx):
        return ctx.report  # no snapshot at all: not a store, one clear error is enough
    _check_wal(ctx)
    _check_topics(ctx)
    _check_root_entries(ctx)
    _check_cold(ctx, cold)
    return ctx.report


def _check_cold(ctx: _Ctx, cold: str | None) -> None:
    """TIER-14: the segments the state names cold, in the cold tier when it is given."""
    flipped = {tid: firsts for tid, firsts in ctx.cold.items() if firsts}
    if cold is None:
        for tid, firsts in sorted(flipped.items()):
            path = _join(ctx.root, TOPICS_DIR, f"{tid:016x}")
            ctx.warn(path, None, "TIER-14", f"{len(firsts)} segment(s) in the cold tier not "
                     "checked: give the store's cold tier (tidelog verify --cold URL)")  # fmt: skip
        return
    from .coldverify import check_cold_tier  # pyarrow.fs for a URL: only when asked

    store_id = ctx.store_id.hex() if ctx.store_id is not None else None
    check_cold_tier(ctx, cold, store_id, flipped, check_segment_bytes)


def verify_cold(target: str) -> Report:
    """``tidelog verify cold+URL``: the cold tier alone (TIER-14; option ``store_id`` in the URI
    picks one of several stores); never raises on bad content."""
    from tidelog.fsio import OsFS
    from tidelog.uri import parse_uri

    from .coldbackend import inner_url
    from .coldverify import check_cold_tier
    from .segstore import redact

    uri = parse_uri(target)
    url = inner_url(uri)
    ctx = _Ctx(OsFS(), redact(url))
    store_id = uri.options.get("store_id")
    check_cold_tier(ctx, url, store_id.lower() if store_id else None, {}, check_segment_bytes)
    return ctx.report
