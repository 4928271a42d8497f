"""Opening a file store, the applying half: a recovery plan (recovery.py) into the engine.

Everything goes through the engine's ``apply_*`` path, the one live ops take, with the journal
off (replay logs nothing again):

1. Rebuild every topic from the snapshot: config, floors, sealed segments (.idx columns, mmap'd
   .data), dead ranges, subscribers, queue state.
2. Replay the plan's WAL batches in order; the writer's records stay in the mapped WAL files
   (WTAIL-1).
3. Each subscriber takes its last written progress file (PRG-9).

The crash rules that follow (DUR-3, DUR-5, QUE-8, SUB-9) are the store's: they are logged like
any op, so they run once its WAL is open.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from tidelog.config import TopicConfig
from tidelog.errors import Corrupt
from tidelog.fsio import FS
from tidelog.records import RouterConfig

from ..common.engine import Engine, EngineTopic
from ..common.progress import SubState, add_gap, live_between
from .chunk import SegChunk
from .format import qseg_name
from .format import segment as segfmt
from .format import wal as walfmt
from .format.wal import FrameType
from .progressfiles import read_progress, topic_dir
from .recovery import WalPlan
from .walchunk import WalChunk, WalFile, frame_run

if TYPE_CHECKING:
    from .qchunk import QsegChunk

__all__ = ["Replay", "open_chunk", "split_payloads"]

_RECORDS = (int(FrameType.APPEND), int(FrameType.APPEND_BATCH))
SNAPSHOT_VERSIONS = (1, 2, 3)  # SNAP-3: 2 adds the routers of each topic, 3 "cold" (TIER-5)
_APPEND = int(FrameType.APPEND)
_MARKS = (int(FrameType.CHECKPOINT), int(FrameType.SYNCED))  # frames without an effect


class Replay:
    """Applies what a plan recovered to ``engine`` (whose journal is off). ``ceilings`` takes
    each topic's highest durably reserved seq (HEAD_RESERVE, DUR-3); ``loaded`` ends up with
    every subscriber whose progress was applied, as the store last wrote it."""

    def __init__(self, engine: Engine, fs: FS, root: str, ceilings: dict[int, int]) -> None:
        assert engine.journal is None, "replay applies effects without logging them again"
        self.engine = engine
        self.fs = fs
        self.root = root
        self.ceilings = ceilings
        # subscribers registered by the replay, whose progress files apply at its end (PRG-9)
        self.unloaded: list[tuple[EngineTopic, str, SubState]] = []
        self.loaded: list[tuple[int, str, SubState]] = []

    # -- topics from the snapshot --------------------------------------------------------------
    def rebuild(self, body: Mapping[str, Any]) -> None:
        version = body["version"]
        if version not in SNAPSHOT_VERSIONS:  # SNAP-3: a newer writer's schema
            raise Corrupt(
                f"snapshot schema version {version}: this tidelog reads versions "
                f"{', '.join(map(str, SNAPSHOT_VERSIONS))} (SNAP-3); open it with a newer tidelog"
            )
        b = self.engine
        b.incarnations = int(body.get("incarnations", 0))
        tiers = getattr(b, "tiers", None)  # TIER-6: each segment from the tier holding it
        for entry in body["topics"]:
            t = b.apply_create(entry["name"], TopicConfig(**entry["config"]), int(entry["id"]))
            log = t.log
            if tiers is not None:
                tiers.mark_cold(t.tid, entry.get("cold", ()))
            for first in entry["segments"]:
                if tiers is not None:
                    log.add_chunk(tiers.open_chunk(t.tid, int(first)))
                else:
                    log.add_chunk(open_chunk(self.fs, self.root, t.tid, int(first)))
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
            self.ceilings[t.tid] = int(entry.get("ceiling", log.head))
            _index_tags(t)
            for sub in entry["subscribers"]:
                self._register(t, sub["name"], int(sub["base"]))
            q = entry["queue"]
            jobs = t.jobs
            jobs.claim_cursor = int(q["cursor"])
            jobs.next_lease_id = int(q["next_lease_id"])
            jobs.deliveries = {int(s): int(n) for s, n in q["deliveries"]}
            for s, ready in q["delayed"]:
                jobs.delay(int(s), int(ready))
            jobs.free = {int(s) for s in q["returned"]}
            t.producers = {str(p): int(n) for p, n in entry.get("producers", {}).items()}
        for entry in body["topics"]:  # RTR-10: once every source exists
            dst = b.topics[entry["name"]]
            for name, router in sorted(entry.get("routers", {}).items()):
                config = RouterConfig(**router["config"])
                b.routing.apply_create(dst, name, config, int(router["cursor"]))

    def _register(self, t: EngineTopic, name: str, base: int) -> None:
        """A subscriber known from the snapshot or the WAL. Its last written progress is applied
        once the replay is done (``_load_progress``, PRG-9): applied here, an hwm from after the
        frames still to replay would settle (SUB-5: trim) records those frames evict."""
        s = t.progress.add(name, base)
        s.cursor = s.flushed_hwm = s.hwm
        self.unloaded.append((t, name, s))

    def _load_progress(self) -> None:
        """PRG-9: after a replay, each subscriber it registered takes its last written
        progress."""
        pending, self.unloaded = self.unloaded, []
        for t, name, s in pending:
            if self.engine.by_id.get(t.tid) is not t or t.progress.subs.get(name) is not s:
                continue  # unregistered (or its topic dropped) later in the replay
            saved = read_progress(self.fs, self.root, t.tid, name)
            if saved is not None:
                base, replayed = s.base, s.gaps
                s.hwm = max(saved.hwm, base)
                s.outcomes = {q: "acked" for q in saved.outcomes if q > s.hwm}
                s.gaps = list(saved.gaps)
                s.base = saved.base if saved.base <= s.hwm else base
                for lo, hi in replayed:
                    if hi > s.hwm:
                        # SUB-7: LOSS frames the replay applied may be newer than the progress
                        # file (a crash before it was written again, or repair's, REP-4): their
                        # gaps stay
                        add_gap(s, max(lo, s.hwm + 1), hi, live_between(t.log))
            s.cursor = s.flushed_hwm = s.hwm
            self.loaded.append((t.tid, name, s))

    # -- WAL -----------------------------------------------------------------------------------
    def wal(self, plan: WalPlan) -> None:
        """Apply the plan's batches file by file, then the subscribers' progress files. The
        pages of a file whose records are served from its map leave the resident set again
        once applied (WTAIL-5); the maps no record uses go with ``plan.release``, the plan
        owner's to call."""
        for part in plan.parts:
            self.apply_batches(part.batches, part.wal)
            if part.wal is not None and part.wal.refs:
                part.wal.drop_resident()
        self._load_progress()

    def apply_batches(
        self, batches: Sequence[Sequence[walfmt.Frame]], wal: WalFile | None = None
    ) -> None:
        """Apply complete op batches in order.

        Records go to the engine run by run, not frame by frame: consecutive records of one
        topic with consecutive seqs, one ts and the same tag and node -- an APPEND_BATCH frame
        (WAL-14), or single APPEND frames in a row, even from different ops -- become one
        ``apply_append``. That is the state applying them op by op gives (an append only
        appends; each keeps its own labels, TOP-6), for a fraction of the per-record Python
        work.

        With ``wal`` (the writer's recovery, frames scanned with ``copy=False``), records are
        not copied at all: each record frame becomes a run of a ``WalChunk`` served from the
        map (WTAIL-1), a few list entries per frame."""
        payloads: list[bytes] = []
        tid = first = nxt = ts = -1
        tag = node = None
        nbytes = 0  # of the run's payloads: the log need not sum their lengths again
        for batch in batches:
            if len(batch) == 1 and batch[0][0] in _MARKS:
                continue  # informational (WAL-8, WAL-16): replay skips it
            for f in batch:
                ftype, _, f_tid, seq, f_ts, f_node, f_tag, data, offset, _ = f
                if ftype in _RECORDS:
                    if wal is not None:
                        self._locate(wal, f)
                        continue
                    if ftype == _APPEND:
                        records = None
                        size = len(data)
                    else:
                        records, size = split_payloads(data, f"WAL frame at offset {offset}")
                    if (
                        seq == nxt
                        and f_tid == tid
                        and f_ts == ts
                        and f_tag == tag
                        and f_node == node
                    ):
                        if records is None:
                            payloads.append(data)
                            nxt += 1
                        else:
                            payloads += records
                            nxt += len(records)
                        nbytes += size
                        continue
                    if payloads:
                        self._apply_run(tid, first, payloads, tag, node, ts, nbytes)
                    tid, first, ts, tag, node = f_tid, seq, f_ts, f_tag, f_node
                    payloads = [data] if records is None else records
                    nxt = seq + len(payloads)
                    nbytes = size
                    continue
                if payloads:
                    self._apply_run(tid, first, payloads, tag, node, ts, nbytes)
                    payloads = []
                    tid = -1
                self._apply_control(f)
        if payloads:
            self._apply_run(tid, first, payloads, tag, node, ts, nbytes)

    def _apply_run(
        self,
        tid: int,
        first: int,
        payloads: list[bytes],
        tag: str | None,
        node: str | None,
        ts: int,
        nbytes: int | None = None,
    ) -> None:
        """Records ``first ..`` of topic ``tid`` sharing ts and labels (``nbytes`` of payload
        in all): append the ones above the head (what a snapshot already holds is skipped)."""
        t = self.engine.by_id.get(tid)
        if t is None:
            return  # the topic was dropped before the snapshot that absorbed this op
        head = t.log.head
        if first + len(payloads) - 1 <= head:
            return
        if first <= head:
            payloads = payloads[head + 1 - first :]
            first = head + 1
            nbytes = None  # a part of the run: its size is summed
        if first != head + 1:
            raise Corrupt(f"WAL: topic {t.name!r} jumps from seq {head} to {first}")
        self.engine.apply_append(t, payloads, tag, node, ts, nbytes)

    def _locate(self, wal: WalFile, f: walfmt.Frame) -> None:
        """A record frame of the writer's replay as the next run of its topic's last
        ``WalChunk`` (or a new one): located, not copied (WTAIL-1). Records the snapshot
        already holds are skipped, as ``_apply_run`` does."""
        t = self.engine.by_id.get(f.topic_id)
        if t is None:
            return  # the topic was dropped before the snapshot that absorbed this op
        log = t.log
        head = log.head
        run = frame_run(wal, f, head + 1)
        if run is None:
            return
        first, n = run.first, run.n
        if first != head + 1:
            raise Corrupt(f"WAL: topic {t.name!r} jumps from seq {head} to {first}")
        if log.payloads:  # records in memory above the chunks (not after a snapshot): copy
            data: Any = f.data  # a view into the map (scan with copy=False)
            payloads = (
                walfmt.split_append_batch(bytes(data), "WAL") if run.lens_at >= 0 else [bytes(data)]
            )
            self.engine.apply_append(t, payloads[len(payloads) - n :], f.tag, f.node, f.ts)
            return
        chunk = log.chunks[-1] if log.chunks else None
        if (
            isinstance(chunk, WalChunk)
            and chunk.wal is wal
            and chunk.first_seq + chunk.count == first
        ):
            grow = chunk
        else:
            grow = WalChunk(wal, first)
        grow.add_run(f, run)
        self.engine.apply_located(t, grow, n, run.nbytes, f.tag, f.ts)

    def _apply_control(self, f: walfmt.Frame) -> None:
        b = self.engine
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
                self._register(t, body["name"], int(body["base"]))
        elif kind == FrameType.SUB_UNREGISTER:
            if f.body["name"] in t.progress.subs:
                b.apply_unregister(t, f.body["name"])
        elif kind == FrameType.QUEUE:
            body = f.body
            op = body["op"]
            if op == "delivered":
                b.apply_delivered(t, body["seq"], body["lease_id"], body["count"], body["fresh"])
            elif op == "returned":
                b.apply_returned(t, body["seq"])
            elif op == "delayed":
                b.apply_delayed(t, body["seq"], body["ready_at"])
        elif kind == FrameType.HEAD_RESERVE:
            self.ceilings[tid] = max(self.ceilings.get(tid, 0), f.seq)
        elif kind == FrameType.PRODUCER:
            b.apply_produced(t, f.body["pid"], int(f.body["seq"]))
        elif kind == FrameType.ROUTER:
            self._apply_router(t, f)
        elif kind == FrameType.LOSS:
            b.apply_loss(t, int(f.body["lo"]), f.seq)
        elif kind == FrameType.TIER:  # TIER-5: the flip (the chunk is wherever it survives)
            tiers = getattr(b, "tiers", None)
            if tiers is not None:
                tiers.mark_cold(tid, f.body["segments"])

    def _apply_router(self, t: EngineTopic, f: walfmt.Frame) -> None:
        """A ROUTER frame of dest ``t`` (WAL-8, RTR-10)."""
        b, body = self.engine, f.body
        op, name = body["op"], body["name"]
        if op == "create":
            b.routing.apply_create(t, name, RouterConfig(**body["config"]), f.seq)
        elif op == "cursor" and name in t.cursors:
            b.routing.apply_cursor(t, name, f.seq)
        elif op == "drop" and name in t.cursors:
            b.routing.apply_drop(t, name)


def split_payloads(data: bytes, where: str) -> tuple[list[bytes], int]:
    """(payloads, their total size) of an APPEND_BATCH frame's ``data`` (WAL-14) for a replay
    that copies records (a read-only view, XPR-1). Payloads of one length (an ``append_many``
    of fixed-size records) are cut at a fixed stride, which costs about a third of slicing at
    each record's own end offset (``walfmt.split_append_batch``, taken otherwise)."""
    n, lens = walfmt.append_batch_lengths(data, where)  # checked: they add up to the data
    start = 4 + 4 * n
    size = lens[0]
    if n > 1 and size and lens.tobytes() == lens[:1].tobytes() * n:
        return [data[i : i + size] for i in range(start, len(data), size)], len(data) - start
    return walfmt.split_append_batch(data, where), len(data) - start


def open_chunk(fs: FS, root: str, tid: int, first: int) -> SegChunk | QsegChunk:
    """The sealed segment of ``tid`` starting at ``first``: a Quiver ``.qseg`` (bundle topics,
    spec/BUNDLES.md QSEG) when that file exists, else the ``.data``/``.idx`` pair (SEG)."""
    directory = topic_dir(root, tid)
    qseg_path = os.path.join(directory, qseg_name(first))
    if fs.exists(qseg_path):
        from .qchunk import QsegChunk  # pyarrow: imported only where a .qseg exists

        return QsegChunk(qseg_path, fs.open_read(qseg_path), first)
    data_path = os.path.join(directory, segfmt.data_name(first))
    idx_path = os.path.join(directory, segfmt.idx_name(first))
    try:
        h = fs.open_read(idx_path)
    except FileNotFoundError:
        raise Corrupt(
            f"{idx_path}: missing, yet the snapshot lists segment {first} (SEG; a store with "
            "a cold tier opens with cold=<URL>, TIER-6)"
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
        data = fs.open_read(data_path)
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
