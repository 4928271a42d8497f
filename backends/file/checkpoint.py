"""Checkpoints: WAL -> sealed segments + an atomic metadata snapshot (SEG, SNAP-4).

1. Under the engine lock, capture at one instant: every topic's unsealed tail (references, no
   copy), the metadata body, and each WAL shard's current position (every effect so far has been
   submitted: ops end under the same lock). Detach sealed chunks with no live record left.
2. Outside the lock, write the tails as segment files (data + idx, fdatasync, directory fsync),
   then snapshot n+1 (tmp, fsync, rename, directory fsync).
3. Under the lock, swap each tail prefix for its new sealed chunk (slots that died meanwhile are
   killed in the chunk: the live state in memory stays authoritative).
4. Retire: WAL files before the snapshot's replay position, older snapshots (only the newest is
   kept: older ones may name segments this checkpoint deletes), segment files of detached chunks,
   directories of dropped topics.

A crash anywhere leaves either the old snapshot (whose WAL and segments are all still there) or
the new one (whose segments were durable before it was written).

A checkpoint that fails poisons the store (spec/SPEC.md FLT-6): after a failed rename or
directory sync the new snapshot may or may not survive a crash, and the next checkpoint would
rewrite in place the segment files it names; so none runs again in this process.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from itertools import accumulate
from typing import TYPE_CHECKING, Any

from tidelog.errors import BadArgument, Corrupt, StorageError
from tidelog.fsio import FS, make_dirs, storage_error, write_whole

from ..common.engine import EngineTopic
from .chunk import SegChunk
from .format import qseg_name
from .format import segment as segfmt
from .format import snapshot as snapfmt
from .format import wal as walfmt
from .format.seal import build_columns
from .journal import ranges
from .progressfiles import topic_dir
from .walchunk import WalChunk

if TYPE_CHECKING:
    from .qchunk import QsegChunk
    from .store import FileBackend

__all__ = ["checkpoint"]


_Columns = tuple[list[bytes | None], list[int], list[str | None], list[str | None]]


@dataclass
class _Tail:
    tid: int
    first: int
    payloads: list[bytes | None]
    tss: list[int]
    tags: list[str | None]
    nodes: list[str | None]
    bundles: bool = False  # payload="bundles": sealed as .qseg (spec/BUNDLES.md QSEG)
    dead: bool = True  # may payloads hold None (dead slots)? False: skip every dead-slot scan
    chunks: list[SegChunk | QsegChunk] = field(default_factory=list)
    splits: list[tuple[int, int]] = field(default_factory=list)  # (first seq, count): _split
    # a recovered WAL tail (WTAIL-4): records read from the map per segment, not held here;
    # ``dead_map`` is its dead slots at capture time
    source: WalChunk | None = None
    dead_map: bytes = b""

    def sizes(self) -> list[int]:
        """Payload size of every slot (0 for a dead one)."""
        if self.source is not None:
            return self.source.sizes()  # dead slots keep their size: cuts stay conservative
        if self.dead:
            return [0 if p is None else len(p) for p in self.payloads]
        return list(map(len, self.payloads))  # type: ignore[arg-type]  # no None: dead is False

    def columns(self, lo: int, hi: int) -> _Columns:
        """(payloads, tss, tags, nodes) of slots lo..hi-1, None payloads for dead slots."""
        if self.source is not None:
            return self.source.columns(lo, hi, self.dead_map)
        return self.payloads[lo:hi], self.tss[lo:hi], self.tags[lo:hi], self.nodes[lo:hi]


@dataclass
class _Capture:
    body: dict[str, Any]
    tails: list[_Tail]
    detached: list[SegChunk | QsegChunk]
    dropped: list[EngineTopic]
    positions: dict[str, tuple[int, int]]
    segments: dict[int, list[int]]  # tid -> its body's "segments" (the tails' cuts go last)


def checkpoint(b: FileBackend) -> int:
    """Run one checkpoint; returns the new snapshot number. A poisoned store refuses; a
    failure poisons it (FLT-6) and leaves as io_error."""
    with b.checkpoint_lock:
        b._check_open()
        try:
            return _checkpoint(b)
        except OSError as exc:  # StorageError too (a WAL shard failed)
            raise b.poison(storage_error(exc, f"checkpoint of {b.root}")) from None
        except Exception as exc:
            b.poison(StorageError(f"checkpoint of {b.root} failed: {exc!r}"))
            raise


def _checkpoint(b: FileBackend) -> int:
    with b.lock:
        cap = _capture(b)
        submitted = sum(s.submitted for s in b.shards)
    # cut into segments outside the store lock: a copy of the tail is all it reads, and
    # appenders would wait for its per-record passes (tens of ms per checkpoint)
    for tail in cap.tails:
        tail.splits = _split(b, tail)
        cap.segments[tail.tid] += [lo for lo, _ in tail.splits]
    n = b.snapshot_n + 1
    try:
        for tail in cap.tails:
            _write_segments(b, tail)
        # the WAL file the snapshot replays from exists durably before the snapshot does, so
        # recovery may take a missing one for damage (WAL-10: "wal_durable")
        for shard in b.shards:
            shard.flush(sync=True, prove=False)
        write_snapshot(b.fs, b.root, n, cap.body)
    except BaseException:
        for tail in cap.tails:  # never swapped in: their maps go now
            for chunk in tail.chunks:
                chunk.close()
        raise
    gone: list[list[bytes | None]] = []
    with b.lock:
        for tail in cap.tails:
            t = b.by_id.get(tail.tid)
            if tail.source is not None:
                _reseal(t, tail)
                continue
            for chunk in tail.chunks:
                if t is not None:
                    gone.append(t.log.seal(chunk))
                else:  # dropped meanwhile: its directory goes at the next checkpoint
                    chunk.close()
        b.snapshot_n = n
    del gone  # the sealed payloads are freed here, not under the store lock
    _retire(b, n, cap)
    b.wal_checkpointed = submitted
    return n


def _reseal(t: EngineTopic | None, tail: _Tail) -> None:
    """Swap a recovered WAL tail's chunk for the segments just written from it (WTAIL-4).
    Slots that died since the capture are killed in them, so they hold its current state."""
    old = tail.source
    assert old is not None
    if t is None or old.closed:  # dropped meanwhile: its directory goes at the next checkpoint
        for chunk in tail.chunks:
            chunk.close()
        return
    if old.dead != tail.dead_map:
        for chunk in tail.chunks:
            lo = chunk.first_seq - old.first_seq
            i = old.dead.find(1, lo, lo + chunk.count)
            while i >= 0:
                if chunk.is_live(i - lo):
                    chunk.kill(i - lo)
                i = old.dead.find(1, i + 1, lo + chunk.count)
    t.log.replace_chunk(old, tail.chunks)
    old.close()


def _capture(b: FileBackend) -> _Capture:
    topics: list[dict[str, Any]] = []
    tails: list[_Tail] = []
    detached: list[SegChunk | QsegChunk] = []
    segments: dict[int, list[int]] = {}
    for t in sorted(b.by_id.values(), key=lambda x: x.tid):
        log = t.log
        detached += log.drop_dead_chunks()  # type: ignore[arg-type]
        dead: list[list[int]] = []
        for c in log.chunks:
            dead += c.dead_ranges()  # type: ignore[attr-defined]
        firsts = [c.first_seq for c in log.chunks if not isinstance(c, WalChunk)]
        if t.config.durability != "ephemeral":
            for c in log.chunks:
                if isinstance(c, WalChunk):  # recovered WAL tail: sealed like the tail (WTAIL-4)
                    tail = _Tail(t.tid, c.first_seq, [], [], [], [], dead=c.live < c.count,
                                 source=c, dead_map=bytes(c.dead))  # fmt: skip
                    tails.append(tail)
        if t.config.durability != "ephemeral" and log.payloads and log.head >= log.base:
            any_dead = log.tail_dead() > 0
            first, payloads, tss, tags, nodes = log.tail_slice(log.head)
            # A dead prefix is not sealed: no segment names those seqs, and sealing the chunk
            # after it cuts them from the tail too (TopicLog.seal). An all-dead tail writes
            # no file at all (after a subscriber trimmed everything, say).
            k = 0
            if any_dead:
                k = next((i for i, p in enumerate(payloads) if p is not None), len(payloads))
            if k < len(payloads):
                bundles = t.config.payload == "bundles"
                tail = _Tail(
                    t.tid, first + k, payloads[k:], tss[k:], tags[k:], nodes[k:], bundles, any_dead
                )
                tails.append(tail)
                if any_dead:
                    dead += ranges(
                        [tail.first + i for i, p in enumerate(tail.payloads) if p is None]
                    )
        segments[t.tid] = firsts  # the tails' segments join them after the split (checkpoint)
        ceiling = b.ceilings.get(t.tid, log.head)
        jobs = t.jobs
        topics.append(
            {
                "id": t.tid,
                "name": t.name,
                "incarnation": t.tid,
                "config": t.config.to_dict(),
                "head": log.head,
                "evict_floor": log.evict_floor,
                "last_ts": log.last_ts,
                "ceiling": max(ceiling, log.head) if not b.closing else log.head,
                "losses": [[lo, hi] for lo, hi in log.losses],
                "segments": firsts,
                "dead": dead,
                "subscribers": [
                    {"name": n, "base": s.base} for n, s in sorted(t.progress.subs.items())
                ],
                "producers": dict(sorted(t.producers.items())),
                "queue": {
                    "cursor": jobs.claim_cursor,
                    "next_lease_id": jobs.next_lease_id,
                    "deliveries": sorted([s, n] for s, n in jobs.deliveries.items()),
                    "delayed": sorted([s, r] for s, r in jobs.delayed.items()),
                    "returned": sorted(jobs.free),
                },
            }
        )
    positions = {b.stream_key(s.shard): s.position() for s in b.shards}
    body = {
        "version": 1,
        "store_id": b.store_id.hex(),
        "next_topic_id": b.incarnations + 1,
        "incarnations": b.incarnations,
        "clean": b.closing,
        "wal": {
            "shards": len(b.shards),
            "replay_from": {k: [g, o] for k, (g, o) in positions.items()},
            "wal_durable": True,
        },
        "topics": topics,
    }
    dropped, b.dropped_tids = b.dropped_tids, []
    return _Capture(body, tails, detached, dropped, positions, segments)


def _split(b: FileBackend, tail: _Tail) -> list[tuple[int, int]]:
    """The tail cut into segments of at most segment_max_records / segment_max_bytes (a record
    larger than that gets a segment of its own). Work per segment, not per record: the cuts
    are binary searches over the running total of record sizes."""
    max_records, max_bytes = b.fopts.segment_max_records, b.fopts.segment_max_bytes
    sizes = tail.sizes()
    n = len(sizes)
    total = list(accumulate(sizes, initial=0))  # total[i]: payload bytes before i
    overhead = segfmt.RECORD_OVERHEAD
    out: list[tuple[int, int]] = []
    start = 0
    while start < n:  # the longest run from start within both limits, at least one record
        end = min(n, start + max_records)
        budget = total[start] + max_bytes
        if total[end] + overhead * (end - start) > budget:
            lo, hi = start + 1, end  # size grows strictly with the end: binary search it
            while lo < hi:
                mid = (lo + hi + 1) // 2
                if total[mid] + overhead * (mid - start) <= budget:
                    lo = mid
                else:
                    hi = mid - 1
            end = lo
        out.append((tail.first + start, end - start))
        start = end
    return out


def _write_segments(b: FileBackend, tail: _Tail) -> None:
    directory = topic_dir(b.root, tail.tid)
    make_dirs(b.fs, directory)
    for first, count in tail.splits:
        lo = first - tail.first
        cols = tail.columns(lo, lo + count)
        chunk: SegChunk | QsegChunk | None = None
        if tail.bundles:
            chunk = _write_qseg(b, directory, tail.tid, cols, first)
        if chunk is None:
            chunk = _write_plain(b, directory, tail, cols, first)
        if tail.dead:
            for i, p in enumerate(cols[0]):
                if p is None:
                    chunk.kill(i)
        tail.chunks.append(chunk)
    b.fs.fsync_dir(directory)


def _write_plain(
    b: FileBackend, directory: str, tail: _Tail, cols: _Columns, first: int
) -> SegChunk:
    """A ``.data`` + ``.idx`` pair (SEG-1..SEG-7), encoded column-wise (format/seal.py). A slot
    removed before sealing is an empty placeholder, dead in the snapshot."""
    data, idx = build_columns(tail.tid, first, *cols, dead=tail.dead)
    _remove_stale(b, os.path.join(directory, qseg_name(first)))
    data_path = os.path.join(directory, segfmt.data_name(first))
    for path, content in (
        (data_path, data),
        (os.path.join(directory, segfmt.idx_name(first)), idx),
    ):
        h = b.fs.open(path)
        try:
            h.truncate(0)
            h.pwrite(content, 0)
            h.fdatasync()
        finally:
            h.close()
    index = segfmt.read_index(idx, topic_id=tail.tid, first_seq=first)
    return SegChunk(data_path, b.fs.open_read(data_path), index)


def _write_qseg(
    b: FileBackend, directory: str, tid: int, cols: _Columns, first: int
) -> QsegChunk | None:
    """A Quiver segment (QSEG-1..QSEG-11): written to ``.tmp``, made read-only (0440,
    QSEG-10), fsynced, renamed into place (the directory is fsynced by the caller before the
    snapshot naming it). None when a payload cannot be sealed byte-exactly
    (QSEG-9): the caller seals that segment in the plain format instead."""
    from .format import qseg as qsegfmt  # pyarrow: only bundle topics need it
    from .qchunk import QsegChunk

    payloads, tss, tags, nodes = cols
    try:
        content = qsegfmt.build_qseg(payloads, first, tss=tss, tags=tags, nodes=nodes)
    except (BadArgument, Corrupt) as exc:
        b.warnings.append(f"topic {tid:016x} seqs from {first}: sealed plain ({exc})")
        return None
    path = os.path.join(directory, qseg_name(first))
    tmp = path + ".tmp"
    _remove_stale(b, tmp)  # read-only leftover of an interrupted checkpoint
    h = b.fs.open(tmp)
    try:
        h.pwrite(content, 0)
        b.fs.chmod(tmp, 0o440)
        h.fsync()  # data and mode
    finally:
        h.close()
    for stale in (segfmt.data_name(first), segfmt.idx_name(first)):
        _remove_stale(b, os.path.join(directory, stale))
    b.fs.rename(tmp, path)
    return QsegChunk(path, b.fs.open_read(path), first)


def _remove_stale(b: FileBackend, path: str) -> None:
    """A file for seqs the current snapshot does not name (they are above every sealed
    segment): the leftover of a checkpoint a crash interrupted. Safe to delete."""
    if b.fs.exists(path):
        b.fs.unlink(path)


def write_snapshot(fs: FS, root: str, n: int, body: dict[str, Any]) -> None:
    """Snapshot ``n`` and its mirror (SNAP-5), each written atomically (LAY-3), one directory
    fsync for both: one damaged copy leaves the other."""
    meta = os.path.join(root, "meta")
    data = snapfmt.encode_snapshot(n, body)
    for name in (snapfmt.file_name(n), snapfmt.mirror_name(n)):
        path = os.path.join(meta, name)
        write_whole(fs, path + ".tmp", data)
        fs.rename(path + ".tmp", path)
    fs.fsync_dir(meta)


def _retire(b: FileBackend, n: int, cap: _Capture) -> None:
    for shard in b.shards:
        # WAL-8: an informational mark of where this checkpoint happened (replay skips it);
        # submitted like every op, under the store lock (WalShard)
        with b.lock:
            seed = shard.gen
            mark = walfmt.encode_control(walfmt.FrameType.CHECKPOINT, 0, {"snapshot": n}, seed=seed)
            shard.submit(mark, seed)
        shard.flush(sync=True)
        gen, _ = cap.positions[b.stream_key(shard.shard)]
        shard.retire_before(gen)
    b.retire_foreign_streams()
    meta = os.path.join(b.root, "meta")
    older = [name for old, names in snapfmt.copies(b.fs.listdir(meta)).items() if old < n
             for name in names]  # fmt: skip
    for name in older + [name for name in b.fs.listdir(meta) if name.endswith(".tmp")]:
        b.fs.unlink(os.path.join(meta, name))
    for chunk in cap.detached:
        chunk.close()
        for path in chunk.files():
            if b.fs.exists(path):
                b.fs.unlink(path)
    for t in cap.dropped:
        for c in t.log.chunks:
            c.close()  # type: ignore[attr-defined]
        directory = topic_dir(b.root, t.tid)
        if b.fs.exists(directory):
            for name in b.fs.listdir(directory):
                b.fs.unlink(os.path.join(directory, name))
            b.fs.rmdir(directory)
    b.fs.fsync_dir(meta)
