"""One WAL shard: an ordered stream of frames over preallocated files, with group commit.

Placement is decided in op order under the shard lock: each op's frames (one contiguous chunk)
get a (file gen, offset), so a checkpoint can name an exact replay position. Single-record
appends (``defer``, the lean path) are queued as (topic, ts, seq, payload) and placed, in op
order, before the next chunk, by a writer taking the pending data, or when a checkpoint asks
for the position: consecutive ones of a topic sharing a ts become one APPEND_BATCH frame
(WAL-14), encoded a whole run at a time instead of frame by frame on the appender's path.
Tickets are op numbers: ``wait_synced(op)`` returns once op ``op`` and every op before it on
this shard are on stable storage.

Waking: each waiting thread sleeps on a gate of its own. A sync opens the gates of the ops it
covered and of one more waiter, which leads the next sync with everything queued meanwhile (no
wake-everyone storm racing for the lead). Gathering: the threads a sync released usually append
again at once; a new leader waits for them (until as many have come back, at most half the last
sync and 1 ms), so one fdatasync covers all the producers instead of half of them alternately.
A lone writer never waits: the sync released only itself.

Locks: ``outer`` is the engine's store lock. Every op submits (``submit``, ``defer``) holding
it, so it alone guards the deferred records, and placing them takes it too (then the shard
lock): a deferral costs no lock of its own. The shard lock guards placement state against the
writer threads; nothing takes ``outer`` while holding it. The committer does not queue for
``outer`` behind a busy appender (every release would wake it, only for the appender to take
the lock again first): it tries, and when the lock is taken it asks the appender, which places
the deferred records at its next new run (a ms at most on the wall clock) and wakes it; only
if that has not happened within ``_ASK_WAIT_S`` does it wait for the lock. Writing is
leader/follower group commit: the first caller that needs durability becomes the leader, writes
every pending chunk with one (vectored) write per file and calls fdatasync once, then wakes the
followers whose chunks that covered. A lone writer is never delayed (no thread hand-off);
concurrent writers share fdatasyncs. A background committer writes and syncs chunks that nobody
waits for (``disk``/``memory`` classes) within ``commit_interval_ms``.

A file is made durable before the next one receives a byte, so recovery never sees a frame in
file N+1 while file N has a torn tail. Any I/O failure poisons the shard: every later submit or
wait raises the stored ``StorageError`` (the page cache state is unknown after a failed fsync;
only recovery can tell what is on disk).

Zero-ahead: a ``fallocate``d file is all *unwritten* extents, so on ext4/xfs the first write
into each block converts an extent and its ``fdatasync`` must also commit the filesystem
journal, about twice the device work of overwriting an initialised block. When a leader writes
less than ``_ZERO_BELOW`` (a durable single append, or an ``append_many`` of a thousand small
records), it also writes zeros over the next ``ZERO_AHEAD`` bytes past the data, once per that
many bytes, inside the same ``fdatasync``; later writes then overwrite initialised blocks, as
the raw overwrite-a-preallocated-file loops do. Measured on the bench VM, a 100 KB write +
fdatasync into unwritten extents took 1.35x the overwrite, and append_many(1000) ran 1.4-1.5x
faster with zero-ahead, at the price of writing the WAL's bytes twice (zeros, then frames).
Writes of ``_ZERO_BELOW`` and more skip it: their journal commit is amortised over many bytes,
and doubling the bytes would cost them more than it saves. The range past the log's end
already reads as zeros (WAL-4), so this never changes a file's content: the crash-simulation
FS, where it could only multiply sector states, skips it.

Recycling (WAL-15): zero-ahead still writes every byte of a new file twice. A checkpoint that
retires files keeps up to ``recycle`` of them as ``spare-<gen>.log``; the next file is a spare
given a new header (and name) when there is one, so its blocks are already written and appends
overwrite them, like the raw loop. Its old frames stay behind the new ones, harmless: every
frame's checksum is seeded with its file's gen (``walfmt.frame_seed``), so an op is encoded for
the file it is expected to land in (``gen``) and re-sealed (``walfmt.reseed``) in the rare case
it starts the next one; each file but the newest ends with a FILE_END frame, placed when the
writer moves on and at a clean close.
"""

from __future__ import annotations

import contextlib
import errno
import os
import threading
import time
from dataclasses import dataclass

from tidelog.errors import StorageError
from tidelog.fsio import (
    FS,
    Handle,
    OsFS,
    make_dirs,
    storage_error,
    write_parts,
    written_prefix,
)

from .format import wal as walfmt

__all__ = ["WalShard", "WalOptions", "wal_dir", "wal_file_name"]

_GATHER_MAX_S = 0.001  # a leader waits at most this long for released threads to come back
_ASK_WAIT_S = 0.002  # the committer waits this long for an appender it asked to place records


class _Gate:
    """One waiting thread's wake-up: ``wait`` blocks until ``open`` (a lock taken twice)."""

    __slots__ = ("_lock",)

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._lock.acquire()

    def wait(self) -> None:
        self._lock.acquire()

    def open(self) -> None:
        self._lock.release()


HEADER_SIZE = 64
ZERO_AHEAD = 1 << 20  # bytes zeroed past a small write's end (module docstring)
_ZERO_BELOW = 256 << 10  # writes at least this big never trigger zero-ahead
_HALF_AHEAD = ZERO_AHEAD // 2  # zeroing resumes once the data comes this close to its end
_ZEROS = bytes(ZERO_AHEAD)
# kept free at the end of every file: the SYNCED and FILE_END frames that close it (WAL-15, WAL-16)
_END_ROOM = walfmt.SYNCED_SIZE + walfmt.FILE_END_SIZE
_DURABLE_END = walfmt.DURABLE | walfmt.BATCH_END  # a durable single record's frame flags
_PAGE = 4096  # a far SYNCED frame lands on a later page than what it proves (WAL-16)
MIN_PREALLOC = 1 << 20  # a full disk halves a new file's preallocation down to this (FLT-8)


@dataclass(frozen=True)
class WalOptions:
    file_bytes: int = 64 << 20
    prealloc: str = "fallocate"  # "fallocate" | "zero" | "none"
    commit_interval_ms: int = 10
    recycle: int = 2  # retired files kept per shard as spares for new files (WAL-15)


def wal_dir(root: str, shard: int, shard_count: int) -> str:
    return (
        os.path.join(root, "wal")
        if shard_count == 1
        else os.path.join(root, "wal", f"shard-{shard:02d}")
    )


def wal_file_name(gen: int) -> str:
    return f"wal-{gen:016x}.log"


class WalShard:
    # slots: every op reads and writes many of these (a plain instance dict with this many keys
    # is not shared, so each access is a hinted dict lookup); no ``__dict__``: a test that
    # wraps a method patches the class (monkeypatch), not the instance
    __slots__ = (
        "fs", "outer", "dir", "shard", "shard_count", "store_id", "options", "_file_bytes",
        "lock", "cond", "_cond_waiters", "_tick", "_nudged", "_asked", "_waiters", "_gather",
        "_gathering", "_arrived", "_arrived_at_sync", "_released", "_gathered_round", "_sync_s",
        "pending", "records", "_run", "_run_tid", "_run_ts", "_run_first", "_run_next",
        "_run_durable", "submitted", "written", "synced", "ops", "ops_placed", "ops_written",
        "ops_synced", "leading", "_written_to", "_synced_to", "_mark_end", "_far", "_idle_ops",
        "failed", "gen", "first_gen", "offset", "files", "stats", "_zero_ahead", "_zeroed",
        "spares", "_stop", "_thread",
    )  # fmt: skip

    def __init__(
        self,
        fs: FS,
        root: str,
        shard: int,
        shard_count: int,
        store_id: bytes,
        options: WalOptions,
        first_gen: int,
        outer: threading.RLock,
    ) -> None:
        self.fs = fs
        self.outer = outer
        self.dir = wal_dir(root, shard, shard_count)
        self.shard = shard
        self.shard_count = shard_count
        self.store_id = store_id
        self.options = options
        self._file_bytes = options.file_bytes  # read on every placement
        self.lock = threading.Lock()
        self.cond = threading.Condition(self.lock)  # flush/close waiting for a leader to end
        self._cond_waiters = 0
        self._tick = threading.Condition(self.lock)  # the committer's own: to stop, or nudged
        self._nudged = False  # the committer writes and syncs now, not at its next tick
        # the committer found ``outer`` busy: the appender holding it places the deferred
        # records at its next new run (defer), instead of making the committer queue for it
        self._asked = False
        # ops waiting for a sync, each thread on a lock of its own (held until it is woken):
        # a sync wakes exactly the waiters it covered, plus one other to lead the next
        self._waiters: list[tuple[int, _Gate]] = []
        # gathering (module docstring): threads the last sync released, counted back in
        self._gather = threading.Condition(self.lock)
        self._gathering = False
        self._arrived = 0  # wait_synced calls so far
        self._arrived_at_sync = 0  # ... when the last sync ended
        self._released = 0  # threads the last sync released (its covered waiters and leader)
        self._gathered_round = -1  # _arrived_at_sync of the round already gathered
        self._sync_s = 0.0  # duration of the last write + fdatasync
        # gen, offset, data, end, op
        self.pending: list[tuple[int, int, bytes | bytearray, int, int]] = []
        # deferred single records, op order, not yet placed: closed runs (topic, ts, durable,
        # first seq, payloads) and the open run they are appended to while they extend it
        self.records: list[tuple[int, int, bool, int, list[bytes]]] = []
        self._run: list[bytes] = []
        self._run_tid = self._run_ts = self._run_first = self._run_next = -1
        self._run_durable = False
        self.submitted = 0  # stream positions: bytes of frames placed / written / synced
        self.written = 0
        self.synced = 0
        self.ops = 0  # ops submitted (placed or deferred) / written / synced, in op order
        self.ops_placed = 0
        self.ops_written = 0
        self.ops_synced = 0
        self.leading = False
        # WAL-16: where the last successful write ended and how far it was synced (gen, file
        # offset), and where the last SYNCED frame placed ends: a SYNCED frame is placed before
        # the next chunk once synced bytes lie beyond it
        self._written_to = (first_gen, HEADER_SIZE)
        self._synced_to = (first_gen, HEADER_SIZE)
        self._mark_end = HEADER_SIZE
        self._far: tuple[int, int, bytes] | None = None  # a far SYNCED frame to write, WAL-16
        self._idle_ops = -1  # ops_placed at the committer's previous tick
        self.failed: StorageError | None = None
        self.gen = first_gen  # gen of the file receiving new placements
        self.first_gen = first_gen
        self.offset = HEADER_SIZE
        self.files: dict[int, Handle] = {}
        self.stats = {"writes": 0, "fdatasyncs": 0, "bytes": 0, "zeroed": 0, "recycled": 0}
        # zero-ahead only where it is a physical matter: real files with unwritten extents
        self._zero_ahead = options.prealloc == "fallocate" and isinstance(fs, OsFS)
        self._zeroed: dict[int, int] = {}  # gen -> offset up to which the file was written
        make_dirs(self.fs, self.dir)
        self.spares: list[str] = self._find_spares()  # guarded by the shard lock
        self._open_file(first_gen)
        self._stop = False
        self._thread = threading.Thread(
            target=self._committer, name=f"tidelog-wal-{shard}", daemon=True
        )
        self._thread.start()

    # -- files -----------------------------------------------------------------------------
    def _find_spares(self) -> list[str]:
        """Spare files left by an earlier run (WAL-15): kept up to ``recycle``, others removed."""
        names = [n for n in self.fs.listdir(self.dir) if walfmt.parse_spare_name(n) is not None]
        keep = names[: self.options.recycle]
        for name in names[len(keep) :]:
            self.fs.unlink(os.path.join(self.dir, name))
        if len(keep) < len(names):
            self.fs.fsync_dir(self.dir)
        return [os.path.join(self.dir, n) for n in keep]

    def _open_file(self, gen: int) -> Handle:
        """Make the file of ``gen`` durable and ready (header first): a recycled spare if there
        is one (WAL-15), else a new, preallocated file."""
        path = os.path.join(self.dir, wal_file_name(gen))
        with self.lock:
            spare = self.spares.pop() if self.spares else None
        if spare is not None:
            return self._recycle(spare, path, gen)
        h = self.fs.open(path)
        try:
            self._preallocate(h)
            h.pwrite(self._header(gen, h), 0)  # names the size reserved: shorter is damage
            h.fsync()
            self.fs.fsync_dir(self.dir)
        except BaseException:
            # FLT-8: a file that could not be made ready is removed, not left behind
            with contextlib.suppress(OSError):
                h.close()
            with contextlib.suppress(OSError):
                self.fs.unlink(path)
                self.fs.fsync_dir(self.dir)
            raise
        self.files[gen] = h
        return h

    def _preallocate(self, h: Handle) -> None:
        """Reserve the file's blocks (``prealloc``): ``file_bytes``, or on a full disk the
        largest halving of it that fits, down to ``MIN_PREALLOC`` (FLT-8); below that the
        ENOSPC is raised. A file reserved short grows past its reservation as frames come."""
        size = self.options.file_bytes
        while self.options.prealloc != "none":
            try:
                if self.options.prealloc == "zero":
                    zero = bytes(1 << 20)
                    for off in range(max(HEADER_SIZE, h.size()), size, len(zero)):
                        h.pwrite(zero[: min(len(zero), size - off)], off)
                else:
                    h.allocate(size)
                return
            except OSError as exc:
                if exc.errno != errno.ENOSPC or size <= MIN_PREALLOC:
                    raise
            size = max(MIN_PREALLOC, size // 2)

    def _header(self, gen: int, h: Handle) -> bytes:
        """The file's header (WAL-1), recording its size as it is now (its reservation)."""
        created = time.time_ns() // 1_000_000
        return walfmt.encode_header(
            gen, self.shard, self.shard_count, created, self.store_id, size=h.size()
        )

    def _recycle(self, spare: str, path: str, gen: int) -> Handle:
        """WAL-15: the new header over the spare's, synced, then the file takes its new name
        (directory synced) before any frame is written to it. Its blocks up to the first hole
        were written in its earlier life: zero-ahead starts there. If that fails, the file
        stays a spare (or, renamed, an empty newest file): nothing to remove (FLT-8)."""
        h = self.fs.open(spare, create=False)
        try:
            if self.options.prealloc == "fallocate" and h.size() < self.options.file_bytes:
                self._preallocate(h)  # only if the option grew since
            h.pwrite(self._header(gen, h), 0)
            h.fdatasync()
            self.fs.rename(spare, path)
            self.fs.fsync_dir(self.dir)
        except BaseException:
            with contextlib.suppress(OSError):
                h.close()
            raise
        if self._zero_ahead:
            self._zeroed[gen] = max(HEADER_SIZE, written_prefix(h))
        self.stats["recycled"] += 1
        self.files[gen] = h
        return h

    # -- submitting ------------------------------------------------------------------------
    def submit(self, data: bytes | bytearray, seed: int) -> int:
        """Place one op's frames, encoded with ``seed`` (read from ``gen`` before; ``outer``
        held); returns its op number (the ticket for ``wait_synced``)."""
        with self.lock:
            if self.failed is not None:
                raise self.failed
            if self.records or self._run:
                self._place_records()
            self.ops += 1
            self._place(data, self.ops, seed)
            return self.ops

    def defer(self, tid: int, ts: int, durable: bool, seq: int, payload: bytes) -> int:
        """Queue one op of a single record without tag or node (module docstring; ``outer``
        held); returns its op number. It is placed before anything submitted after it. A
        record continuing the open run (same topic and ts, the next seq) joins its list (the
        engine's lane does that case itself for ``disk``/``memory`` topics, reading ``_run``,
        ``_run_ts``, ``_run_next``, ``failed`` and bumping ``_run_next`` and ``ops``: lane.py,
        "Open runs"; keep the two in step)."""
        if self.failed is not None:
            raise self.failed
        if seq == self._run_next and tid == self._run_tid and ts == self._run_ts:
            self._run.append(payload)  # a topic's class never changes: same durable
        else:
            if self._run:
                self._close_run()
            if self._asked:
                self._place_asked()
            self._run_tid, self._run_ts, self._run_durable = tid, ts, durable
            self._run_first = seq
            self._run = [payload]
        self._run_next = seq + 1
        self.ops += 1
        return self.ops

    def place_now(self, data: bytes, seed: int) -> int:
        """Place ``data``, one whole batch that belongs to no op (a seq reservation placed
        ahead of need, WAL-12), at once: ahead of the records still deferred, whose runs it
        does not cut. ``outer`` held. Returns the stream position at its end: it is durable
        once ``synced`` reaches that."""
        with self.lock:
            if self.failed is not None:
                raise self.failed
            self._place(data, self.ops_placed, seed)  # no op number of its own
            return self.submitted

    def _place_deferred(self, block: bool = True) -> bool:
        """Place the deferred records now; called without the shard lock (takes ``outer``,
        then the shard lock, the order every submit uses). Without ``block``, only if
        ``outer`` is free: False if it was not."""
        if not self.outer.acquire(blocking=block):
            return False
        try:
            with self.lock:
                if self.records or self._run:
                    self._place_records()
                self._asked = False
        finally:
            self.outer.release()
        return True

    def _place_asked(self) -> None:
        """The committer asked (``_asked``): place the closed runs and wake it to write them
        (``outer`` held)."""
        with self.lock:
            self._place_records()
            self._asked = False
            self._tick.notify()

    def _take_deferred(self) -> None:
        """The committer's placing (module docstring): the deferred records now if ``outer``
        is free; else the appender holding it is asked to place them at its next new run (a
        ms at most on the wall clock) and wake the committer, which waits that long for it
        before it takes its turn at ``outer`` after all."""
        if self._place_deferred(block=False):
            return
        with self.lock:
            self._asked = True
            self._tick.wait(_ASK_WAIT_S)
            asked = self._asked and not self._stop
        if asked:
            self._place_deferred()

    def nudge(self) -> None:
        """Have the committer write and sync what is placed now instead of at its next tick
        (a seq reservation placed ahead of need, WAL-12)."""
        with self.lock:
            self._nudged = True
            self._tick.notify()

    def _place(self, data: bytes | bytearray, op: int, seed: int) -> None:
        """Give ``data`` (ops up to ``op``, frames encoded with ``seed``) its place in the
        stream, after a SYNCED frame if one is due (WAL-16): an entry of its own, written with
        ``data`` in one vectored write (``_write``), not prepended to it (a copy of the whole
        chunk per op); lock held."""
        gen, synced = self._synced_to
        due = gen == self.gen and synced > self._mark_end
        room = len(data) + _END_ROOM + (walfmt.SYNCED_SIZE if due else 0)
        if self.offset + room > self.options.file_bytes and self.offset > HEADER_SIZE:
            # rotate: the chunk starts the next file (frames never split); this one ends with
            # FILE_END (WAL-15), written and synced before the next file gets a byte (_write)
            self._place_end(self.ops_placed)
            self.gen += 1
            self.offset = HEADER_SIZE
            self._mark_end = HEADER_SIZE  # no SYNCED frame placed in the new file yet
            due = False
        if seed != self.gen:
            data = walfmt.reseed(data, self.gen)
        if due:
            self._place_mark(walfmt.encode_synced(self.gen, synced))
            self._mark_end = self.offset
        self.submitted += len(data)
        self.pending.append((self.gen, self.offset, data, self.submitted, op))
        self.offset += len(data)
        self.ops_placed = op

    def _place_plain(
        self, tid: int, seq: int, ts: int, payload: bytes, flags: int, op: int, hold: bool = False
    ) -> bytes | None:
        """``_place`` of one record without tag or node (op ``op``): its APPEND frame and the
        SYNCED frame due before it encoded in one piece (``walfmt.encode_plain``); a chunk that
        does not fit the file goes through ``_place``, which rotates (then None). ``hold``: the
        chunk is returned, placed but not queued (``_direct`` writes it). Lock held."""
        gen = self.gen
        synced_gen, synced = self._synced_to
        if synced_gen != gen or synced <= self._mark_end:
            synced = 0
        offset = self.offset
        size = walfmt.FRAME_OVERHEAD + len(payload)
        if synced:
            size += walfmt.SYNCED_SIZE
        if offset + size + _END_ROOM > self._file_bytes and offset > HEADER_SIZE:
            self._place(walfmt.encode_plain(tid, seq, ts, payload, flags, gen), op, gen)
            return None
        data = walfmt.encode_plain(tid, seq, ts, payload, flags, gen, synced)
        if synced:
            self._mark_end = offset + walfmt.SYNCED_SIZE
        self.submitted += size
        if not hold:
            self.pending.append((gen, offset, data, self.submitted, op))
        self.offset = offset + size
        self.ops_placed = op
        return data

    def _synced_past_mark(self) -> int:
        """WAL-16: the current file's synced offset when bytes before it were synced since the
        last SYNCED frame placed, so a SYNCED frame should come next; else 0. Lock held."""
        gen, synced = self._synced_to
        return synced if gen == self.gen and synced > self._mark_end else 0

    def _place_synced(self, synced: int, *, far: bool = False) -> None:
        """Place a SYNCED frame (WAL-16): every byte of this file before ``synced`` is durable.
        It rides with the next chunk's write and costs no write or sync of its own. ``far``
        (a flush, an idle tick, a clean close: the last proof before a pause): a copy of it is
        also written beyond the log's end, at the start of a later page than the last synced
        byte's, in the same write and sync, so one lost or zeroed page cannot take the last op
        and its proof together; only if the file has room. Lock held."""
        self._place_mark(walfmt.encode_synced(self.gen, synced))
        self._mark_end = self.offset
        if far:
            at = max(((synced - 1) // _PAGE + 1) * _PAGE, -(-self.offset // _PAGE) * _PAGE)
            if at + walfmt.SYNCED_SIZE <= self.options.file_bytes:
                self._far = (self.gen, at, walfmt.encode_synced(self.gen, synced))

    def _place_mark(self, mark: bytes) -> None:
        self.submitted += len(mark)
        self.pending.append((self.gen, self.offset, mark, self.submitted, self.ops_placed))
        self.offset += len(mark)

    def _place_end(self, op: int) -> None:
        """Place the FILE_END frame that closes the current file (WAL-15); lock held."""
        end = walfmt.encode_file_end(self.gen)
        self.submitted += len(end)
        self.pending.append((self.gen, self.offset, end, self.submitted, op))
        self.offset += len(end)

    def _close_run(self) -> None:
        self.records.append(
            (self._run_tid, self._run_ts, self._run_durable, self._run_first, self._run)
        )
        self._run = []
        self._run_next = -1

    def _place_records(self) -> None:
        """Place the deferred records, in op order, each run of one topic sharing a ts as one
        APPEND_BATCH frame (WAL-14; one op batch, BATCH_END): a run costs a few C-level calls,
        not a frame encode per record. ``outer`` and the shard lock held."""
        if self._run:
            self._close_run()
        runs, self.records = self.records, []
        op = self.ops_placed  # deferred records are the newest ops: they follow it
        for tid, ts, durable, first, payloads in runs:
            if len(payloads) == 1:
                op += 1
                flags = _DURABLE_END if durable else walfmt.BATCH_END
                self._place_plain(tid, first, ts, payloads[0], flags, op)
                continue
            seed = self.gen
            frame = walfmt.encode_append_batch(
                tid, first, ts, None, None, payloads, batch_end=True, durable=durable, seed=seed
            )
            op += len(payloads)
            self._place(frame, op, seed)

    def position(self) -> tuple[int, int]:
        """(gen, offset) just after the last submitted op's frames: where replay would resume
        (deferred records are placed first; ``outer`` held)."""
        with self.lock:
            if self.records or self._run:
                self._place_records()
            return self.gen, self.offset

    def wait_synced(self, op: int) -> None:
        """Block until op ``op`` (and every op before it) is on stable storage: lead a write +
        fdatasync if nobody is, else sleep until a sync covers the op (or this thread is
        picked to lead the next one)."""
        arrived = False
        if self._released <= 1 and not self.leading and self.ops_placed < op:  # hints
            if self._direct(op):
                return
            arrived = True
        while True:
            place = False
            self.lock.acquire()
            try:
                if not arrived:
                    arrived = True
                    self._arrived += 1
                    if self._gathering:
                        self._gather.notify()
                if self.ops_synced >= op:
                    return
                if self.failed is not None:
                    raise self.failed
                if not self.leading:
                    # about to lead: deferred ops (maybe this one) are placed first, by the
                    # leader alone (one store-lock round trip per sync, not per op)
                    place = self.ops_placed < self.ops
                    if not place and (self._released <= 1 or not self._gathered()):
                        self._lead(sync=True, waiter=True)
                    continue
                gate = _Gate()
                self._waiters.append((op, gate))
            finally:
                self.lock.release()
                if place:
                    self._place_deferred()
            gate.wait()

    def _direct(self, op: int) -> bool:
        """The lone writer's path (its op deferred, no leader, no gathering due): place the
        deferred records and lead the write + fdatasync in one turn of ``outer`` and the shard
        lock, not one turn to place and more to lead; a lone single record is encoded with
        no run list round trip. Same frames, same order, as the loop of ``wait_synced``.
        True once op ``op`` is durable; False (its arrival counted) hands over to the loop."""
        outer, lock = self.outer, self.lock
        outer.acquire()
        lock.acquire()
        try:
            self._arrived += 1
            if self._gathering:
                self._gather.notify()
            if self.leading or self._released > 1 or self.failed is not None:
                outer.release()
                return False
            if self.ops_synced >= op:
                outer.release()
                return True
            alone = None  # the lone record's chunk, placed but not queued
            try:
                run = self._run
                if self.records or len(run) != 1:
                    self._place_records()
                else:  # one record deferred: it is op ``ops``, right after ``ops_placed``
                    flags = _DURABLE_END if self._run_durable else walfmt.BATCH_END
                    self._run = []  # taken, as _place_records takes it, even if encoding fails
                    self._run_next = -1
                    tid, first, ts = self._run_tid, self._run_first, self._run_ts
                    hold = not self.pending and self._far is None  # nothing else to write
                    alone = self._place_plain(tid, first, ts, run[0], flags, self.ops, hold)
                    if not hold:
                        alone = None
                self._asked = False
            finally:
                outer.release()
            if alone is not None:
                self._lead_one(alone)
            else:
                self._lead(sync=True, waiter=True)
            if self.failed is not None:
                raise self.failed
            return self.ops_synced >= op
        finally:
            lock.release()

    def _gathered(self) -> bool:
        """About to lead (lock held): gather (module docstring) the threads the last sync
        released. True if it waited: the caller then places what arrived and leads."""
        expect = self._released
        if expect <= 1 or self._gathered_round == self._arrived_at_sync:
            return False
        self._gathered_round = self._arrived_at_sync
        deadline = time.monotonic() + min(self._sync_s * 0.5, _GATHER_MAX_S)
        self.leading = self._gathering = True
        try:
            while self._arrived - self._arrived_at_sync < expect:
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self._gather.wait(left)
        finally:
            self.leading = self._gathering = False
        return True

    def flush(self, sync: bool, *, prove: bool = True) -> None:
        """Write everything pending (and fdatasync it if ``sync``, then prove it durable with a
        SYNCED frame unless ``prove`` is false: WAL-16); used at close and flush()."""
        if self.records or self._run:
            self._place_deferred()
        with self.lock:
            while self.leading:
                self._cond_waiters += 1
                try:
                    self.cond.wait()
                finally:
                    self._cond_waiters -= 1
            if self.failed is not None:
                raise self.failed
            if self.pending or (sync and self.synced < self.written):
                self._lead(sync=sync)
            if prove and sync and self.failed is None and (synced := self._synced_past_mark()):
                # an explicit flush proves what is durable (WAL-16): damage to it is never
                # taken for a torn tail, even if the process dies right after
                self._place_synced(synced, far=True)
                self._lead(sync=True)
            if self.failed is not None:
                raise self.failed

    def _lead(self, sync: bool, waiter: bool = False) -> None:
        """Called with the lock held and no leader: write (and sync) all pending chunks, then
        wake the waiters that covered, and one more to lead if any are left. ``waiter``: the
        leader itself waits for an op (it counts as a thread the sync releases)."""
        self.leading = True
        batch, self.pending = self.pending, []
        far, self._far = self._far, None
        self.lock.release()
        started = time.monotonic()
        try:
            end = self._write(batch, sync, far)
            error = None
        except OSError as exc:
            error = storage_error(exc, f"WAL shard {self.shard}")
            end = 0
        finally:
            self.lock.acquire()
        if batch:
            gen, offset, data, _, op = batch[-1]
            self._settle(error, sync, waiter, started, end, op, gen, offset + len(data))
        else:
            self._settle(error, sync, waiter, started, -1, 0, 0, 0)

    def _lead_one(self, data: bytes) -> None:
        """``_lead`` of one chunk ``_direct`` placed without queueing it (nothing else pending,
        no far SYNCED frame): the same write, zero-ahead, fdatasync and wake-ups, with no
        pending list round trip. Lock held, the chunk the last one placed."""
        gen, end, op, at = self.gen, self.submitted, self.ops_placed, self.offset
        self.leading = True
        self.lock.release()
        started = time.monotonic()
        try:
            h = self.files.get(gen) or self._prepare(gen)
            self._put(h, gen, [data], at - len(data), len(data), None, True)
            error = None
        except OSError as exc:
            error = storage_error(exc, f"WAL shard {self.shard}")
        finally:
            self.lock.acquire()
        self._settle(error, True, True, started, end, op, gen, at)

    def _settle(
        self,
        error: StorageError | None,
        sync: bool,
        waiter: bool,
        started: float,
        end: int,
        op: int,
        gen: int,
        at: int,
    ) -> None:
        """A leader's turn ends (lock held again): its failure poisons the shard (FLT-4), or
        what it wrote (up to stream position ``end``, op ``op``, file offset ``at`` in the
        file of ``gen``; ``end`` -1: nothing) and synced is recorded; the waiters that covered
        are woken, and one more to lead if any are left."""
        self.leading = False
        if error is not None:
            self.failed = error
        else:
            if end >= 0:
                if end > self.written:
                    self.written = end
                if op > self.ops_written:
                    self.ops_written = op
                self._written_to = (gen, at)
            if sync:
                self.synced = self.written
                self.ops_synced = self.ops_written
                self._synced_to = self._written_to
                self._sync_s = time.monotonic() - started
        waiters = self._waiters
        if self.failed is not None:
            woken, self._waiters = waiters, []
        elif not waiters:  # nobody else waits (a lone writer): nothing to sort
            woken = waiters
            if sync:
                self._released = 1 if waiter else 0
                self._arrived_at_sync = self._arrived
        else:
            synced = self.ops_synced
            woken = [w for w in waiters if w[0] <= synced]
            self._waiters = rest = [w for w in waiters if w[0] > synced] if woken else waiters
            if sync:  # threads this sync returns to their callers (they tend to come back)
                self._released = len(woken) + waiter
                self._arrived_at_sync = self._arrived
            if rest:  # the next leader: its op is placed or will be when it wakes
                woken.append(rest.pop(0))
        for _, gate in woken:
            gate.open()
        if self._cond_waiters:
            self.cond.notify_all()

    def _write(
        self,
        batch: list[tuple[int, int, bytes | bytearray, int, int]],
        sync: bool,
        far: tuple[int, int, bytes] | None = None,
    ) -> int:
        """One vectored write per run of chunks in the same file (no joined copy); a file is
        synced before the next file gets its first byte. ``far``: a SYNCED frame written beyond
        the log's end of its file, after the chunks and their zero-ahead (which would clear
        it), before the sync."""
        end = 0
        i = 0
        n = len(batch)
        files = self.files
        while i < n:
            gen, offset, _, start, _ = batch[i]
            j = i + 1
            while j < n and batch[j][0] == gen:
                j += 1
            parts = [c[2] for c in batch[i:j]]
            start -= len(parts[0])  # the stream position where the run begins
            end = batch[j - 1][3]
            h = files.get(gen) or self._prepare(gen)
            if j < n:  # the next file gets no byte before this one is synced
                self._put(h, gen, parts, offset, end - start, None, True)
            else:
                self._put(
                    h, gen, parts, offset, end - start, far if far and far[0] == gen else None,
                    sync,
                )  # fmt: skip
            i = j
        return end

    def _put(
        self,
        h: Handle,
        gen: int,
        parts: list[bytes | bytearray],
        offset: int,
        size: int,
        far: tuple[int, int, bytes] | None,
        sync: bool,
    ) -> None:
        """A leader's write into one file: ``parts`` (``size`` bytes in all) back to back at
        ``offset``, its zero-ahead, the far SYNCED frame ``far`` (after the zeros, which would
        clear it), then fdatasync if ``sync``."""
        write_parts(h, parts, offset)
        stats = self.stats
        stats["writes"] += 1
        stats["bytes"] += size
        # _zero_past has nothing to do while half a window is zeroed past the data
        if self._zero_ahead and offset + size + _HALF_AHEAD > self._zeroed.get(gen, 0):
            self._zero_past(h, gen, offset + size, size)
        if far is not None:
            h.pwrite(far[2], far[1])
            stats["writes"] += 1
        if sync:
            h.fdatasync()
            stats["fdatasyncs"] += 1

    def _zero_past(self, h: Handle, gen: int, end: int, size: int) -> None:
        """Zero-ahead (module docstring): called by the leader, right after writing frames that
        end at ``end``; nothing placed later can have been written yet (leaders take turns)."""
        done = max(self._zeroed.get(gen, HEADER_SIZE), end)
        limit = self.options.file_bytes
        if size < _ZERO_BELOW and done - end < _HALF_AHEAD and done < limit:
            hi = min(limit, (end + ZERO_AHEAD) & ~4095)
            if hi > done:
                h.pwrite(memoryview(_ZEROS)[: hi - done], done)
                self.stats["zeroed"] += hi - done
                done = hi
        self._zeroed[gen] = done

    def _prepare(self, gen: int) -> Handle:
        """The previous file is complete: make it durable, then open the next one."""
        prev = self.files.get(gen - 1)
        if prev is not None:
            prev.fdatasync()
            self.stats["fdatasyncs"] += 1
        return self._open_file(gen)

    # -- background committer -------------------------------------------------------------
    def _committer(self) -> None:
        interval = self.options.commit_interval_ms / 1000.0
        while True:
            with self.lock:
                if not self._nudged:
                    self._tick.wait(interval)
                self._nudged = False
                if self._stop:
                    return
            if self.failed is None and (self.records or self._run):  # a hint; placing rechecks
                self._take_deferred()
            with self.lock:
                if self.failed is not None or self.leading:
                    continue
                idle, self._idle_ops = self._idle_ops == self.ops_placed, self.ops_placed
                if idle and not self.pending and self.synced == self.written:
                    # quiet for a tick: a SYNCED frame now proves the last synced ops durable
                    # (WAL-16), so damage to them is never taken for a torn tail
                    synced = self._synced_past_mark()
                    if synced:  # _END_ROOM keeps its room
                        self._place_synced(synced, far=True)
                if self.pending or self.synced < self.written:
                    self._lead(sync=True)

    def poison(self, error: StorageError) -> None:
        """FLT-4: the store failed elsewhere (a checkpoint, a progress file): nothing more is
        written; every later submit, wait or flush raises ``error`` (or the shard's own)."""
        with self.lock:
            if self.failed is None:
                self.failed = error
            if not self.leading:  # else the leader wakes them when its write ends
                for _, gate in self._waiters:
                    gate.open()
                self._waiters = []
            self.cond.notify_all()

    def close(self) -> None:
        try:
            if self.failed is None:
                # a clean close syncs what is pending and proves it durable (flush: WAL-16),
                # then ends the file with FILE_END (WAL-15): the next open, which starts a new
                # file, then has nothing to seal
                self.flush(sync=True)
                with self.outer, self.lock:
                    if self.records or self._run:
                        self._place_records()
                    self._place_end(self.ops_placed)
            self.flush(sync=True, prove=False)  # nothing follows FILE_END
        finally:
            error = self._shutdown()
        if error is not None:
            raise error

    def _shutdown(self) -> StorageError | None:
        """Stop the committer and close every file, even if closing one fails (FLT-4: a
        failed store still releases everything); returns the first failure."""
        with self.lock:
            self._stop = True
            self.cond.notify_all()
            self._tick.notify_all()
        self._thread.join(timeout=5)
        error = None
        for h in self.files.values():
            try:
                h.close()
            except OSError as exc:
                error = error or storage_error(exc, f"closing WAL shard {self.shard}")
        self.files.clear()
        return error

    def abandon(self) -> None:
        """Stop the committer and close files without writing what is pending (crash tests)."""
        with self.lock:
            self._stop = True
            self.pending = []
            self.records, self._run, self._run_next = [], [], -1
            if self._waiters:  # nothing will be written: whoever waits gets an error
                self.failed = self.failed or StorageError(f"WAL shard {self.shard} abandoned")
                for _, gate in self._waiters:
                    gate.open()
                self._waiters = []
        self._shutdown()  # what it fails to close, a killed process would not have closed either

    def retire_before(self, gen: int) -> list[int]:
        """Retire files older than ``gen`` (a durable checkpoint absorbed them): the newest
        become spares while fewer than ``recycle`` are kept (WAL-15), the rest are deleted."""
        removed = []
        with self.lock:
            # list(): a leader may open the next file concurrently (it never touches old gens)
            for g in sorted(g for g in list(self.files) if g < gen):
                self.files.pop(g).close()
                self._zeroed.pop(g, None)
        old = sorted(
            (old_gen, name)
            for name in self.fs.listdir(self.dir)
            if (old_gen := walfmt.parse_file_name(name)) is not None and old_gen < gen
        )
        with self.lock:
            room = self.options.recycle - len(self.spares)
        kept: list[str] = []
        for g, name in reversed(old):
            path = os.path.join(self.dir, name)
            # only files this writer created: a file recovery replayed may still be mapped by
            # a chunk a reader holds (WTAIL-2), so it must not change: it is unlinked
            if len(kept) < room and g >= self.first_gen:
                kept.append(os.path.join(self.dir, walfmt.spare_name(g)))
                self.fs.rename(path, kept[-1])
            else:
                self.fs.unlink(path)
            removed.append(g)
        if removed:
            self.fs.fsync_dir(self.dir)
        with self.lock:  # usable only once their names are durable
            self.spares += kept
        return sorted(removed)
