"""The ``file://`` backend: the engine + WAL shards + segments + snapshots + progress files.

Lifecycle: lock the directory (LOCK-1), recover (recovery.py), start the WAL shards and a
maintenance thread (progress files, checkpoints). ``close`` applies the ephemeral restart rule,
writes a final checkpoint (so reopening is fast and exact) and releases everything. A failed
write or sync of durable state (WAL, progress files, checkpoints) poisons the store (spec/SPEC.md
FLT-4, FLT-6): every later op that would write raises the StorageError until it is reopened, and
``close`` still releases everything before it raises. Every ``OSError`` leaves an entry point as
``io_error`` (FLT-3).
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from tidelog import dirlock, registry, storedir
from tidelog.api import Store
from tidelog.backend import StoreOptions
from tidelog.clock import Clock
from tidelog.errors import BadArgument, Closed, Corrupt, NoSuchTopic, StorageError, TidelogError
from tidelog.fsio import FS, Handle, OsFS, io_errors, make_dirs, storage_error

from ..common.engine import Engine, EngineTopic
from ..common.progress import SubState
from . import lockfile, requests
from .checkpoint import SealAnswer, SealRange, StoreState, checkpoint, write_snapshot
from .chunk import SegChunk
from .format import snapshot as snapfmt
from .format import wal as walfmt
from .format.wal import FrameType
from .journal import WalJournal
from .layout import LAYOUT
from .options import FileOptions
from .progressfiles import remove_progress, write_progress
from .recovery import RecoveryPlan, WalPlan, list_streams, plan_recovery, plan_wal
from .replay import Replay
from .sealer import SealJob, SealWorker, seal_wal
from .segstore import open_segment_store
from .tierpass import tier_pass
from .tiers import Tiers
from .wal import WalOptions, WalShard, wal_file_name

__all__ = ["FileBackend", "CAPABILITIES"]

#: declared once, in the scheme's registry entry (REG-1)
CAPABILITIES = registry.builtin_capabilities("file")


class FileBackend(Engine):
    # Ops do no I/O under the store lock (Engine.begin_inline) but these: reading sealed
    # segments (mmap'd: ``resident``), progress files (flush_subscriber, unregister), topic
    # and router creation and drops (they wait for their sync), refresh; and a WAL op spanning
    # shards waits for its earlier parts under the lock (WalJournal.end_op).
    INLINE = True

    def __init__(
        self, fs: FS, root: str, clock: Clock, options: StoreOptions, fopts: FileOptions
    ) -> None:
        super().__init__(clock, options, CAPABILITIES)
        self.fs = fs
        self.root = root
        self.fopts = fopts
        self.write_out_bytes = fopts.write_out_bytes  # SEG-20 (checkpoint.SegmentPort)
        self.store_id = b""
        self.snapshot_n = 0
        self.shards: list[WalShard] = []
        self.ceilings: dict[int, int] = {}
        self.progress_written: dict[tuple[int, str], tuple[Any, ...]] = {}
        self.dropped_tids: list[EngineTopic] = []  # dropped since the last checkpoint
        self.warnings: list[str] = []
        # a read-only view: stream -> (gen, offset) it replayed up to (XPR-1)
        self.view_at: dict[str, tuple[int, int]] = {}
        self.checkpoint_lock = threading.Lock()
        # XPR-2: one thread applies requests at a time (the maintenance tick, an instances
        # store's direct call): two that listed the same request would both apply it
        self._requests_lock = threading.Lock()
        self.closing = False
        self.clean_open = False
        self.replayed_batches = 0
        self._wal_at_checkpoint = 0  # WAL volume when the last checkpoint started (trigger)
        self.wal_checkpointed = 0  # ... that the last good checkpoint absorbed (describe)
        self.failed: StorageError | None = None  # FLT-4: the first failure, sticks until reopen
        # WTAIL-6: each stream's position at this process's last checkpoint, or its first
        # position when it opened with no record in memory (None: neither yet), where sealing
        # from the WAL starts; the worker is started at its first job
        self._sealed_at: dict[str, tuple[int, int]] | None = None
        self._sealer: SealWorker | None = None
        self._stop = threading.Event()
        self._maintenance: threading.Thread | None = None
        self._lock_handle: Handle | None = None
        self.tiers: Tiers | None = None  # the cold tier (spec/TIERING.md), if configured
        if fopts.cold is not None:
            store = open_segment_store(fopts.cold, fs)
            self.tiers = Tiers(fs, root, store, fopts)
        self._open()

    # -- opening -----------------------------------------------------------------------------
    def _open(self) -> None:
        fs, root = self.fs, self.root
        if self.fopts.readonly:
            if not fs.is_dir(os.path.join(root, "meta")):
                raise StorageError(f"{root} is not a tidelog store (no meta/ directory)")
            with self.lock, io_errors(f"opening store {root} read-only"):
                self._recover_readonly()
            return
        # FLT-3, FLT-7: any I/O failure while opening is io_error, and leaves nothing held
        with io_errors(f"opening store {root}"):
            creation = storedir.prepare(fs, root, LAYOUT, self.fopts.create)  # URI-8
            try:
                self._lock_handle = lockfile.acquire(fs, root)
            except BaseException:
                creation.undo(clear=False)  # another opener may own the directory now
                raise
            try:
                # only a creation that finds nothing but its own lock files may remove them
                lock_files = {dirlock.LOCK_FILE, dirlock.PID_FILE}
                creation.owned = not creation.was_store and set(fs.listdir(root)) <= lock_files
                with self.lock:  # recovery applies effects like ops do: under the engine lock
                    self._recover()
            except BaseException:
                self._release()
                creation.undo()  # URI-8: a failed creation leaves nothing behind
                raise
        if self.fopts.background:
            self._maintenance = threading.Thread(
                target=self._maintain, daemon=True, name="tidelog-maintenance"
            )
            self._maintenance.start()

    def _recover(self) -> None:
        """Read the files into a plan (nothing written: a refusal leaves them as they were,
        FLT-2), apply it to the engine, then to the files, then start new WAL files."""
        fs, root = self.fs, self.root
        for d in ("meta", "wal", "topics"):
            make_dirs(fs, os.path.join(root, d))
        plan = plan_recovery(fs, root)
        clean = plan.clean  # before the release below, which frees the WAL batches it counts
        try:
            if plan.snapshot is None:
                self.store_id = os.urandom(16)
                if self.tiers is not None:
                    self.tiers.store_id = self.store_id.hex()
                body: dict[str, Any] = {
                    "version": 1,
                    "store_id": self.store_id.hex(),
                    "next_topic_id": 1,
                    "incarnations": 0,
                    "wal": {"shards": 0, "replay_from": {}},
                    "topics": [],
                }
                write_snapshot(fs, root, 0, body)
            self._apply_plan(plan)
        finally:
            plan.wal.release()
        self.clean_open = clean
        self._apply_to_files(plan.wal)
        self._start_shards(dict(plan.wal.highest))
        if not any(t.log.payloads for t in self.by_id.values()):
            # WTAIL-6: every record held in memory from now on is this process's, in the WAL
            # files it starts with (recovered ones are located: WTAIL-1)
            self._sealed_at = {
                self.stream_key(s.shard): (s.first_gen, walfmt.HEADER_SIZE) for s in self.shards
            }
        self._after_crash()
        self.apply_requests()

    def _apply_plan(self, plan: RecoveryPlan) -> None:
        """The recovered state into the engine, through its ``apply_*`` path (replay.py)."""
        self.warnings += plan.warnings
        replay = Replay(self, self.fs, self.root, self.ceilings)
        if plan.snapshot is not None:
            self.snapshot_n, body = plan.snapshot
            self.store_id = bytes.fromhex(body["store_id"])
            if self.tiers is not None:
                self.tiers.store_id = body["store_id"]
            replay.rebuild(body)
        self._replay_wal(replay, plan.wal)

    def _replay_wal(self, replay: Replay, plan: WalPlan) -> None:
        self.warnings += plan.warnings
        replay.wal(plan)
        self.replayed_batches += plan.effects
        for tid, name, s in replay.loaded:
            self.progress_written[(tid, name)] = self.progress_key(s)
        self.view_at = dict(plan.positions)

    def _apply_to_files(self, plan: WalPlan) -> None:
        """What the plan says opening does to the WAL files: cut torn tails (WAL-4), seal
        version-3 files (WAL-15, before the next file gets a byte), remove files a crash left
        without a header."""
        fs = self.fs
        for path, end in plan.truncate:
            h = fs.open(path)
            try:
                h.truncate(end)
                h.fsync()
            finally:
                h.close()
        for path, end, seed in plan.seal:
            h = fs.open(path, create=False)
            try:
                h.pwrite(walfmt.encode_file_end(seed), end)
                h.fdatasync()
            finally:
                h.close()
        for path in plan.discard:
            fs.unlink(path)
            fs.fsync_dir(os.path.dirname(path))

    # -- read-only views (XPR-1) ---------------------------------------------------------------
    def _recover_readonly(self) -> None:
        """Snapshot + WAL replay in memory only: no lock, no truncation, no file written."""
        self.readonly = True
        plan = plan_recovery(self.fs, self.root, readonly=True)
        if plan.snapshot is None:
            raise StorageError(f"{self.root} has no snapshot yet: nothing to read")
        self._apply_plan(plan)
        self._publish_all()

    def _publish_all(self) -> None:
        for t in self.topics.values():
            t.log.visible = t.log.head
            self._bump(t)

    def refresh(self) -> None:
        """Catch up with the writer: new WAL batches since the last look, or a full reload when
        a checkpoint replaced the snapshot (its WAL and segments may be gone)."""
        if not self.readonly:
            return
        with self.lock, io_errors(f"refreshing the view of {self.root}"):
            self._check_open()
            meta = os.path.join(self.root, "meta")
            newest = max(
                (
                    n
                    for name in self.fs.listdir(meta)
                    if (n := snapfmt.parse_file_name(name)) is not None
                ),
                default=-1,
            )
            if newest == self.snapshot_n:
                try:
                    plan = plan_wal(self.fs, self.root, self.store_id, self.view_at, readonly=True)
                    self._replay_wal(Replay(self, self.fs, self.root, self.ceilings), plan)
                    self._publish_all()
                    return
                except (FileNotFoundError, Corrupt):
                    pass  # raced with a checkpoint: reload from the new snapshot
            self._reload()

    def _reload(self) -> None:
        for t in self.by_id.values():
            for c in t.log.chunks:
                c.close()  # type: ignore[attr-defined]
        self.topics, self.by_id, self.incarnations = {}, {}, 0
        self.ceilings, self.view_at, self.progress_written = {}, {}, {}
        self._recover_readonly()

    def _start_shards(self, highest: dict[str, int]) -> None:
        n = self.fopts.wal_shards
        fo = self.fopts
        wopts = WalOptions(fo.wal_file_bytes, fo.prealloc, fo.commit_interval_ms, fo.wal_recycle)
        top = max(highest.values(), default=0)
        for shard in range(n):
            self.shards.append(
                WalShard(
                    self.fs,
                    self.root,
                    shard,
                    n,
                    self.store_id,
                    wopts,
                    first_gen=top + 1,
                    outer=self.lock,
                )
            )
        journal = WalJournal(self.shards, self.fopts.head_reserve)
        journal.ceilings = self.ceilings
        self.journal = journal

    def _after_crash(self) -> None:
        """Crash rules after replay (DUR-3, DUR-5, QUE-8, SUB-9), logged like any op."""
        now = self.clock.now_ms()
        with self.lock:
            for name in sorted(self.topics):
                t = self.topics[name]
                log = t.log
                log.visible = log.head
                if not self.clean_open:
                    self._crash_rules(t)
                for s in t.progress.subs.values():
                    s.hwm = min(s.hwm, log.head)
                    s.cursor = s.hwm
                jobs = t.jobs
                held = sorted(
                    q
                    for q, n in jobs.deliveries.items()
                    if n and log.is_live(q) and q not in jobs.free and q not in jobs.delayed
                )
                for seq in held:  # leases held when the process stopped end now
                    self._return_job(t, seq, now)
                self._settle(t)
            self.routing.resume(now)  # RTR-10, RTR-11
            ticket, touched = self._end_op(True)
        self._finish(ticket, touched)

    def _crash_rules(self, t: EngineTopic) -> None:
        """Seqs reserved beyond the recovered head were maybe used: they become a loss range
        (disk, DUR-3) and nothing of an ephemeral topic's records survives (DUR-5)."""
        log = t.log
        ceiling = self.ceilings.get(t.tid, log.head)
        cls = t.config.durability
        if cls in ("disk", "ephemeral") and ceiling > log.head:
            self.apply_loss(t, log.head + 1, ceiling)
        if cls == "ephemeral" and log.evict_floor <= log.head:
            log.evict_floor = log.head + 1
            log.losses = []

    def on_create(self, t: EngineTopic) -> None:
        # fsync topics: a record is readable only once durable, so a seq lost before its
        # append returned was never seen by anyone (TOP-1, DUR-2)
        t.log.gate_visibility = t.config.durability == "fsync"

    def apply_drop(self, t: EngineTopic) -> None:
        super().apply_drop(t)
        self.dropped_tids.append(t)
        for name in list(t.progress.subs):
            self.progress_written.pop((t.tid, name), None)

    def apply_unregister(self, t: EngineTopic, name: str) -> None:
        super().apply_unregister(t, name)
        if self.journal is not None:  # live op, not replay: the file goes too
            with self.writing(f"removing the progress file of {t.name}/{name}"):
                remove_progress(self.fs, self.root, t.tid, name)
        self.progress_written.pop((t.tid, name), None)

    @staticmethod
    def stream_key(shard: int) -> str:
        return "flat" if shard == 0 else f"{shard:02d}"

    def resident(self, name: str | None, after: int | None = None) -> bool:
        """Engine.resident, and no op that may span WAL shards (dead letters, router copies):
        it waits under the lock for its earlier parts to be synced (WalJournal.end_op)."""
        if len(self.shards) > 1 and self.routers:
            return False
        if len(self.shards) > 1 and name is not None:
            t = self.topics.get(name)
            if t is not None and t.config.dead_letter is not None:
                return False
        return super().resident(name, after)

    # -- the checkpoint's port (checkpoint.CheckpointPort) -------------------------------------
    def checkpoint_state(self) -> StoreState:
        dropped, self.dropped_tids = self.dropped_tids, []
        fo = self.fopts
        return StoreState(
            snapshot=self.snapshot_n,
            store_id=self.store_id,
            incarnations=self.incarnations,
            topics=sorted(self.by_id.values(), key=lambda t: t.tid),
            # WAL-12: with the reservations placed ahead (WalJournal.reserved)
            ceilings=(
                self.journal.reserved()
                if isinstance(self.journal, WalJournal)
                else dict(self.ceilings)
            ),
            clean=self.closing,
            wal={self.stream_key(s.shard): s.position() for s in self.shards},
            wal_submitted=sum(s.submitted for s in self.shards),
            dropped=dropped,
            segment_max=(fo.segment_max_records, fo.segment_max_bytes),
            routers=dict(self.routers),
            cold=self._cold_state(),
            locate=(
                fo.seal_worker
                and self._sealed_at is not None
                and sum(s.submitted for s in self.shards) - self.wal_checkpointed
                >= fo.seal_worker_bytes
            ),
        )

    def _cold_state(self) -> dict[int, list[int]]:
        """Under the lock: each topic's cold segments (the snapshot's ``"cold"``, TIER-5)."""
        tiers = self.tiers
        if tiers is None:
            return {}
        tiers.prune(self.by_id)
        return {tid: cold for tid, t in self.by_id.items() if (cold := tiers.cold_of(t))}

    def sync_wal(self) -> None:
        # as an op waits for its sync: a sync that appenders lead covers it, where a flush
        # would wait to lead one of its own while they keep leading (hundreds of ms)
        for shard in self.shards:
            shard.wait_synced(shard.ops)

    def sealed(self, n: int) -> None:
        self.snapshot_n = n

    def retire_wal(self, n: int, positions: Mapping[str, tuple[int, int]]) -> None:
        for shard in self.shards:
            # WAL-8: an informational mark of where this checkpoint happened (replay skips
            # it); submitted like every op, under the store lock (WalShard)
            with self.lock:
                seed = shard.gen
                mark = walfmt.encode_control(FrameType.CHECKPOINT, 0, {"snapshot": n}, seed=seed)
                op = shard.submit(mark, seed)
            shard.wait_synced(op)  # as ``sync_wal``
            gen, _ = positions[self.stream_key(shard.shard)]
            shard.retire_before(gen)
        self._retire_foreign_streams()

    def checkpointed(self, state: StoreState) -> None:
        self.wal_checkpointed = state.wal_submitted
        self._sealed_at = dict(state.wal)

    def seal_located(self, state: StoreState, ranges: Sequence[SealRange]) -> SealAnswer:
        """WTAIL-7..9: in the seal worker on the OS's files, else (or when it gives no
        answer) here."""
        assert self._sealed_at is not None  # StoreState.locate needs a start
        files: list[tuple[str, int, int | None]] = []
        for shard in self.shards:
            key = self.stream_key(shard.shard)
            (gen, start), (last, end) = self._sealed_at[key], state.wal[key]
            for g in range(gen, last + 1):
                path = os.path.join(shard.dir, wal_file_name(g))
                files.append((path, start if g == gen else walfmt.HEADER_SIZE,
                              end if g == last else None))  # fmt: skip
        mmap = getattr(self.fs, "mmap", True)
        job = SealJob(
            self.root, tuple(files), tuple(ranges), state.segment_max, mmap,
            self.write_out_bytes,
        )  # fmt: skip
        if type(self.fs) is OsFS:
            if self._sealer is None:
                self._sealer = SealWorker(getattr(self._lock_handle, "fd", None))
            warned = self._sealer.unstartable  # said once, at the job that found it out
            answer = self._sealer.run(job)
            if answer is not None:
                return answer
            if not warned:
                self.warn(f"seal worker: no answer ({self._sealer.why}); sealed here (WTAIL-9)")
        return seal_wal(self.fs, job)

    def warn(self, message: str) -> None:
        self.warnings.append(message)

    def _retire_foreign_streams(self) -> None:
        """WAL directories of another shard layout: absorbed by the checkpoint just written."""
        n = len(self.shards)
        mine = {"flat"} if n == 1 else {f"{s:02d}" for s in range(n)}
        for key, directory in list_streams(self.fs, self.root):
            if key in mine:
                continue
            for name in self.fs.listdir(directory):
                gen = walfmt.parse_file_name(name)
                if gen is not None or walfmt.parse_spare_name(name) is not None:
                    self.fs.unlink(os.path.join(directory, name))
            self.fs.fsync_dir(directory)

    # -- checks and poisoning (FLT-4) ---------------------------------------------------------
    def _check_open(self) -> None:
        if self.closed:
            raise Closed("store is closed")
        failed = self.failure()
        if failed is not None:
            err = StorageError(f"store {self.root} failed and must be reopened: {failed.message}")
            err.errno = failed.errno
            raise err

    def failure(self) -> StorageError | None:
        """The first failure that poisoned the store (its own or a WAL shard's), if any."""
        if self.failed is not None:
            return self.failed
        for shard in self.shards:  # (a loop, not a generator: every op checks this)
            if shard.failed is not None:
                return shard.failed
        return None

    def poison(self, error: StorageError) -> StorageError:
        """FLT-4: the first failure sticks and no shard writes again; returns it (to raise)."""
        if self.failed is None:
            self.failed = error
        for shard in self.shards:
            shard.poison(self.failed)
        return error

    @contextlib.contextmanager
    def writing(self, what: str) -> Iterator[None]:
        """A write of durable state (FLT-4, FLT-6): if it fails, the store is poisoned and the
        failure leaves as io_error naming ``what``."""
        try:
            yield
        except StorageError as exc:
            raise self.poison(exc) from None
        except OSError as exc:
            raise self.poison(storage_error(exc, what)) from None

    # -- progress files (DUR-9) ----------------------------------------------------------------
    @staticmethod
    def progress_key(s: SubState) -> tuple[Any, ...]:
        return (s.hwm, frozenset(q for q in s.outcomes if q > s.hwm), s.base, tuple(s.gaps))

    def persist_progress(self, t: EngineTopic, name: str, s: SubState) -> None:
        key = self.progress_key(s)
        if self.progress_written.get((t.tid, name)) != key:
            # PRG-8: the ops this progress reflects (an eviction or ack that moved the hwm) are
            # durable before it is; a no-op when the WAL is synced already
            for shard in self.shards:
                shard.flush(sync=True)
            with self.writing(f"progress file of {t.name}/{name}"):
                write_progress(self.fs, self.root, t.tid, name, s)
            self.progress_written[(t.tid, name)] = key

    def _write_all_progress(self) -> None:
        with self.lock:
            for t in list(self.by_id.values()):
                for name, s in list(t.progress.subs.items()):
                    self.persist_progress(t, name, s)

    def flush(self) -> None:
        """DUR-7: every acknowledged op durable: WAL synced, progress files written."""
        super().flush()
        if self.readonly:
            return
        for shard in self.shards:
            shard.flush(sync=True)
        self._write_all_progress()

    # -- requests from other processes (XPR-2..XPR-4) ---------------------------------------
    def apply_requests(self) -> int:
        """Apply every pending request, oldest first; each outcome is durable before its
        ``.done`` file is written. Returns how many were applied."""
        done = 0
        with self._requests_lock, self.writing(f"applying requests to {self.root}"):
            for rid, body in requests.pending(self.fs, self.root):
                result = self._apply_request(body)
                self._check_open()  # a request that failed the store: no .done is written
                requests.finish(self.fs, self.root, rid, result)
                done += 1
        return done

    def _apply_request(self, body: dict[str, Any] | None) -> dict[str, Any]:
        store = Store(self, f"file://{self.root}")  # a facade over this backend; never closed
        try:
            if body is None:
                raise BadArgument("unreadable request file")
            op = body.get("op")
            if op == "ingest":  # XPR-4: staged rows become visible in one atomic append
                topic = store.topic(body["topic"], **body.get("config", {}))
                records = [r for path in body["files"] for r in requests.read_staged(self.fs, path)]
                producer = tuple(body["producer"]) if body.get("producer") else None
                seqs = topic.append_records(records, producer=producer)
                self.flush()  # durable before the requester is told
                return {"ok": True, "seqs": [seqs[0], seqs[-1]] if seqs else []}
            topic = store.topic(body["topic"], create=False)
            if "incarnation" in body and topic.incarnation != int(body["incarnation"]):
                # INST-6: a request for a copy that was dropped (and maybe made again) since
                raise NoSuchTopic(f"topic {body['topic']!r} was dropped (TOP-10)")
            if op == "drop":  # INST-6: a topic of an instances store dropped in every instance
                store.drop_topic(body["topic"])
                self.flush()
                return {"ok": True}
            if op == "delete":  # INST-19: a delete across instances
                deleted = topic.delete(
                    body.get("before_seq"), tag=body.get("tag"), tag_glob=body.get("tag_glob")
                )
                self.flush()
                return {"ok": True, "deleted": deleted}
            if op in ("ack", "reject"):  # INST-18: per-seq progress of a merged subscriber
                sub = topic.subscriber(body["subscriber"])
                done = sub.ack(int(body["seq"])) if op == "ack" else sub.reject(int(body["seq"]))
                sub.flush()
                return {"ok": True, "done": done, "hwm": sub.hwm}
            if op == "unregister":  # INST-22: a merged subscriber leaves every instance
                topic.subscriber(body["subscriber"]).unregister()
                self.flush()  # durable (its progress file removed) before the requester goes on
                return {"ok": True}
            if op == "subscribe":
                sub = topic.subscribe(body["subscriber"], start=body.get("start", "resume"))
                sub.flush()
                return {"ok": True, "hwm": sub.hwm}
            if op == "commit":  # XPR-3: a reader elsewhere acknowledges through a subscriber
                if body.get("start"):
                    topic.subscribe(body["subscriber"], start=body["start"])
                sub = topic.subscriber(body["subscriber"])
                acked = sub.commit(min(int(body["seq"]), topic.state().head_seq))
                sub.flush()
                return {"ok": True, "acked": acked, "hwm": sub.hwm}
            raise BadArgument(f"unknown request op {op!r}")
        except TidelogError as exc:
            return {"ok": False, "code": exc.code, "message": exc.message}
        except (KeyError, TypeError, ValueError) as exc:
            return {"ok": False, "code": "bad_argument", "message": f"bad request: {exc!r}"}

    # -- maintenance -------------------------------------------------------------------------
    def _maintain(self) -> None:
        interval = max(self.fopts.progress_flush_ms, 10) / 1000.0
        while not self._stop.wait(interval):
            if self.failure() is not None:
                return  # FLT-4: nothing more is written; the next op, flush or close says why
            try:
                self.apply_requests()
                self._write_all_progress()
                submitted = sum(s.submitted for s in self.shards)
                if submitted - self._wal_at_checkpoint >= self.fopts.checkpoint_bytes:
                    self._wal_at_checkpoint = submitted
                    self._checkpoint()
                if self.tiers is not None:
                    self._tier()
            except OSError as exc:  # StorageError too: poisoned (FLT-3: surfaced at next op)
                self.poison(storage_error(exc, f"maintenance of {self.root}"))
            except TidelogError as exc:
                self.warnings.append(f"maintenance: {exc}")

    def checkpoint(self) -> int:
        """Run a checkpoint now (the maintenance thread does this by WAL volume, counted from
        here on)."""
        self._check_open()
        self._wal_at_checkpoint = sum(s.submitted for s in self.shards)
        n = self._checkpoint()
        if self.tiers is not None:
            self._tier()
        return n

    def _tier(self) -> None:
        """A tiering pass (spec/TIERING.md): relocation (TIER-5), then the manifest (TIER-9)
        and the collection (TIER-10). Serialised with checkpoints; a failure poisons the store
        like a checkpoint's (FLT-6): a flip may or may not be durable."""
        tiers = self.tiers
        assert tiers is not None
        with self.checkpoint_lock:
            self._check_open()
            try:
                tier_pass(self, tiers)
            except OSError as exc:  # StorageError too: the cold tier failed (TIER-2)
                raise self.poison(storage_error(exc, f"tiering of {self.root}")) from None

    def _checkpoint(self) -> int:
        """One checkpoint (checkpoint.py); returns the new snapshot number. A poisoned store
        refuses; a failure poisons it (FLT-6) and leaves as io_error."""
        with self.checkpoint_lock:
            self._check_open()
            try:
                return checkpoint(self)
            except OSError as exc:  # StorageError too (a WAL shard failed)
                raise self.poison(storage_error(exc, f"checkpoint of {self.root}")) from None
            except Exception as exc:
                self.poison(StorageError(f"checkpoint of {self.root} failed: {exc!r}"))
                raise

    def abandon(self) -> None:
        """Stop every thread and drop every handle without writing anything: what a killed
        process leaves behind (crash tests). A maintenance step under way (a checkpoint
        sealing a segment) is let finish first, so nothing is written after this returns: a
        killed process writes nothing after its death either."""
        self._stop.set()
        if self._maintenance is not None and self._maintenance is not threading.current_thread():
            self._maintenance.join(timeout=60)
        for shard in self.shards:
            shard.abandon()
        self.shards = []
        with self.lock:
            self.closed = True
        self._release()

    # -- cold reads (TIER-8) ------------------------------------------------------------------
    def read(self, ref: Any, after: int, limit: int, exclude_node: str | None) -> Any:
        tiers = self.tiers
        if tiers is None:
            return super().read(ref, after, limit, exclude_node)
        return tiers.around(
            self.lock,
            lambda: tiers.cold_ahead(self._get(ref).log, after, limit, exclude_node),
            lambda: super(FileBackend, self).read(ref, after, limit, exclude_node),
        )

    def poll(self, ref: Any, name: str, limit: int) -> Any:
        tiers = self.tiers
        if tiers is None:
            return super().poll(ref, name, limit)

        def ahead() -> list[Any]:
            t = self._get(ref)
            s = t.progress.subs.get(name)
            after = max(s.cursor, s.hwm) if s is not None else t.log.head
            return tiers.cold_ahead(t.log, after, limit, None)

        return tiers.around(
            self.lock, ahead, lambda: super(FileBackend, self).poll(ref, name, limit)
        )

    # -- closing -----------------------------------------------------------------------------
    def close(self) -> None:
        if self.readonly:
            with self.lock:
                if not self.closed:
                    super().close()
                    self._release()
            return
        with self.lock:
            if self.closed:
                return
            self.closing = True
            for name in sorted(self.topics):  # DUR-1: ephemeral records end with the process
                t = self.topics[name]
                if t.config.durability == "ephemeral" and t.log.count:
                    self.apply_evict(t, t.log.head, "lost")
        self._stop.set()
        if self._maintenance is not None:
            self._maintenance.join()
        error: TidelogError | None = None
        try:
            self._check_open()  # poisoned: nothing more is written (FLT-4)
            self._checkpoint()
            self._write_all_progress()
            with self.lock:
                super().close()
        except TidelogError as exc:
            error = exc
        except OSError as exc:
            error = self.poison(storage_error(exc, f"closing store {self.root}"))
        finally:
            # FLT-4: threads, descriptors and the lock are released whatever failed, so the
            # same process can reopen the store
            with self.lock:
                self.closed = True
                self._notify(None)
            released = self._release()
        if error is not None or released is not None:
            raise error or released  # type: ignore[misc]

    def _release(self) -> StorageError | None:
        """Close every shard (stopping its committer), chunk and the lock, even when some of
        them fail; returns the first failure."""
        first: StorageError | None = None
        if self._sealer is not None:  # WTAIL-8: before the lock it holds too
            self._sealer.close()
        for shard in self.shards:
            try:
                shard.close()
            except StorageError as exc:
                first = first or exc
        self.shards = []
        for t in self.by_id.values():
            for c in t.log.chunks:
                c.close()  # type: ignore[attr-defined]
                if isinstance(c, SegChunk):  # no read runs now: an undecoded index's map too
                    c.index.release()
        if self._lock_handle is not None:
            handle, self._lock_handle = self._lock_handle, None
            try:
                handle.close()
            except OSError as exc:
                first = first or storage_error(exc, f"releasing the lock of {self.root}")
        return first

    def describe(self) -> dict[str, object]:
        out = super().describe()
        with self.lock:
            failure = self.failure()
            submitted = sum(s.submitted for s in self.shards)
            out.update(
                {
                    "backend": "file",
                    "root": self.root,
                    "snapshot": self.snapshot_n,
                    "wal": {
                        "shards": len(self.shards),
                        "submitted_bytes": submitted,
                        "writes": sum(s.stats["writes"] for s in self.shards),
                        "fdatasyncs": sum(s.stats["fdatasyncs"] for s in self.shards),
                        "zeroed_bytes": sum(s.stats["zeroed"] for s in self.shards),
                        "recycled_files": sum(s.stats["recycled"] for s in self.shards),
                    },
                    "segments": {t.name: len(t.log.chunks) for t in self.by_id.values()},
                    # FLT-6: a failed store says why; the WAL a crash would replay is visible
                    "failed": None if failure is None else failure.message,
                    "checkpoint": {
                        "snapshot": self.snapshot_n,
                        "wal_bytes_since": submitted - self.wal_checkpointed,
                        "every_bytes": self.fopts.checkpoint_bytes,
                        # WTAIL-8: the worker process sealing from the WAL, while one runs
                        "seal_worker_pid": None if self._sealer is None else self._sealer.pid,
                    },
                    "warnings": list(self.warnings),
                }
            )
        return out
