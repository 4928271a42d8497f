"""tidelog's own cases: every backend and durability class, single appends, ``append_many``
batches, 8 producer threads sharing group commits, reads through ``read()`` and through a
subscriber with acks. Stores are created with default options, as a user gets them."""

from __future__ import annotations

import os
import shutil
import threading
from collections.abc import Callable
from typing import Any

import tidelog
from tidelog.hooks import Checkpoint, IoCounters, hooks

from .measure import Cpu, Ctx, Io, Metrics, rate_metrics, timed, timed_latency, timed_puts

__all__ = [
    "append_loop",
    "memory_single",
    "file_single",
    "file_many",
    "file_threads",
    "blockdev_single",
    "blockdev_many",
    "read_sealed",
    "read_tail",
    "subscriber_commit",
    "subscriber_ack",
    "close_fixtures",
]


def _wal_stats(store: Any) -> tuple[int, int, int]:
    """The WAL's fdatasyncs, writes and bytes submitted so far (file://; zeros elsewhere)."""
    wal = store.describe().get("wal", {})
    return (
        int(wal.get("fdatasyncs", 0)),
        int(wal.get("writes", 0)),
        int(wal.get("submitted_bytes", 0)),
    )


def _seal_worker(store: Any) -> int | None:
    """The PID of the store's seal worker process, if it has one now (file://)."""
    pid = store.describe().get("checkpoint", {}).get("seal_worker_pid")
    return pid if isinstance(pid, int) else None


def append_loop(
    ctx: Ctx, store: Any, topic: Any, batch: int, threads: int = 1, max_records: int | None = None
) -> Metrics:
    """Append ``ctx.payload`` for ``ctx.seconds``: one record per call (``batch`` 1) or
    ``append_many`` of ``batch``; with ``threads`` > 1, that many producer threads. One thread
    stops early after ``max_records``."""
    data = ctx.payload
    many = [data] * batch
    more = 0  # records appended after the timed window (the latency pass of timed_puts)
    topic.append(data)  # warm: topic created, first file touched
    wal0 = _wal_stats(store)
    io = Io(ctx.device)
    cpu = Cpu(lambda: _seal_worker(store))
    if threads == 1:
        if batch == 1:
            append = topic.append
            n, elapsed, lat, more = timed_puts(
                lambda: append(data) and 1, ctx.seconds, max_records=max_records
            )
        else:
            append_many = topic.append_many
            n, elapsed, lat = timed_latency(
                lambda: len(append_many(many)), ctx.seconds, max_records=max_records
            )
    else:
        counts = [0] * threads
        lats: list[list[float]] = [[] for _ in range(threads)]
        start = threading.Barrier(threads + 1)

        def worker(i: int) -> None:
            start.wait()
            if batch == 1:
                counts[i], _, lats[i] = timed_latency(lambda: topic.append(data) and 1, ctx.seconds)
            else:
                counts[i], _, lats[i] = timed_latency(
                    lambda: len(topic.append_many(many)), ctx.seconds
                )

        ths = [threading.Thread(target=worker, args=(i,)) for i in range(threads)]
        for th in ths:
            th.start()
        import time

        start.wait()
        t0 = time.perf_counter()
        for th in ths:
            th.join()
        elapsed = time.perf_counter() - t0
        n = sum(counts)
        lat = [x for part in lats for x in part]
    out = rate_metrics(n, elapsed, ctx.size, lat if batch == 1 else None)
    if batch > 1 and lat:
        lat.sort()
        out["p50_us_per_batch"] = lat[len(lat) // 2]
    store.flush()  # buffered classes: count the bytes their commits wrote
    out.update(io.stop(n + more, (n + more) * ctx.size))
    out.update(cpu.stop(n + more, thread=threads == 1))
    wal1 = _wal_stats(store)
    if any(wal1) or any(wal0):
        syncs, writes, nbytes = (b - a for a, b in zip(wal0, wal1, strict=True))
        out["fdatasync_per_rec"] = syncs / max(n + more, 1)
        out["wal_writes_per_rec"] = writes / max(n + more, 1)
        out["wal_bytes_per_rec"] = nbytes / max(n + more, 1)
    return out


def memory_single(ctx: Ctx) -> Metrics:
    with tidelog.open("memory://") as store:
        t = store.topic("bench", durability="memory", trim="none")
        return append_loop(ctx, store, t, 1)


def _file_store(ctx: Ctx, **options: Any) -> Any:
    root = os.path.join(ctx.base, "store")
    return tidelog.open(f"file://{root}", **options)


#: the most a warm-up appends before it gives up (``warm_to_steady``)
STEADY_MAX_BYTES = 2 << 30


def warm_to_steady(
    append_many: Callable[[list[bytes]], object],
    wal: Callable[[], dict[str, int]],
    limit: int = STEADY_MAX_BYTES,
) -> None:
    """Append 1 MiB batches until a WAL file made from a retired one takes the frames
    (``wal()["recycled_files"]``, FORMATS.md WAL-15). Bounded: a store that never retires a
    WAL file (checkpoints off, say ``checkpoint_bytes=64GiB``) would take the whole disk, so
    after ``limit`` bytes it raises instead."""
    batch = [bytes(4096)] * 256
    written = 0
    while wal()["recycled_files"] < 1:
        if written >= limit:
            raise RuntimeError(
                f"no WAL file recycled after {written >> 20} MiB of warm-up: the store does not "
                "checkpoint (steady state needs checkpoint_bytes well below it)"
            )
        append_many(batch)
        written += 1 << 20


def _steady(store: Any) -> None:
    """Bring a new store to its steady state before the timer (FORMATS.md WAL-15): append
    until a WAL file made from a retired one (its blocks written in an earlier life, so no
    zero-ahead) takes the frames, then sync everything, so the timed window neither pays a
    new file's first writes nor sees the warm-up's writeback. The raw overwrite loop likewise
    zero-fills and syncs its file before its timer."""
    warm_to_steady(store.topic("warm-up", durability="disk").append_many,
                   lambda: store.describe()["wal"])  # fmt: skip
    hooks(store, Checkpoint).checkpoint()  # seal the warm-up now, not inside the timed window
    os.sync()


def file_single(ctx: Ctx, durability: str, steady: bool = False) -> Metrics:
    with _file_store(ctx) as store:
        if steady:
            _steady(store)
        return append_loop(ctx, store, store.topic("bench", durability=durability), 1)


def file_many(ctx: Ctx, durability: str, batch: int = 1000, steady: bool = False) -> Metrics:
    with _file_store(ctx) as store:
        if steady:
            _steady(store)
        return append_loop(ctx, store, store.topic("bench", durability=durability), batch)


def file_threads(ctx: Ctx, durability: str, threads: int = 8) -> Metrics:
    with _file_store(ctx) as store:
        return append_loop(ctx, store, store.topic("bench", durability=durability), 1, threads)


def _blockdev(ctx: Ctx, durability: str, batch: int) -> Metrics:
    img = os.path.join(ctx.base, "ring.img")
    size = "64MiB" if ctx.quick else "256MiB"
    with tidelog.open(f"blockdev://{img}?size={size}") as store:
        t = store.topic("default", durability=durability)
        out = append_loop(ctx, store, t, batch)
        stats: dict[str, Any] = hooks(store, IoCounters).io_stats()  # BDEV-19: device writes
        if stats.get("write_amplification") is not None:
            out["write_amplification"] = float(stats["write_amplification"])
        if out.get("records"):
            out["fdatasync_per_rec"] = int(stats.get("syncs", 0)) / out["records"]
        return out


def blockdev_single(ctx: Ctx, durability: str) -> Metrics:
    return _blockdev(ctx, durability, 1)


def blockdev_many(ctx: Ctx, durability: str, batch: int = 1000) -> Metrics:
    return _blockdev(ctx, durability, batch)


# --- reads: one prefilled store per record size, shared by every round ------------------------

_fixtures: dict[tuple[str, int], Any] = {}


def read_set_size(ctx: Ctx) -> int:
    total = (16 << 20) if ctx.quick else (256 << 20)
    return max(20_000, min(1_000_000, total // ctx.size))


def _read_fixture(ctx: Ctx, kind: str, rounds: int) -> tuple[Any, Any, int]:
    """(store, topic, records): a file store holding records of ``ctx.size``; for "sealed" it
    was closed and reopened so every record is read from mmap'd segments."""
    key = (kind, ctx.size)
    got = _fixtures.get(key)
    if got is not None:
        return got  # type: ignore[no-any-return]
    root = os.path.join(ctx.run_dir, f"fixture-{kind}-{ctx.size}")
    shutil.rmtree(root, ignore_errors=True)
    n = read_set_size(ctx)
    batch = [ctx.payload] * 10_000
    store = tidelog.open(f"file://{root}")
    t = store.topic("bench", durability="disk")
    if kind.startswith("subscriber"):  # one subscriber per round, all registered before any acks
        for r in range(rounds):
            t.subscribe(f"sub-{r}", start="earliest")
    for _ in range(0, n, len(batch)):
        t.append_many(batch)
    if kind == "sealed":
        store.close()
        store = tidelog.open(f"file://{root}")
        t = store.topic("bench")
    got = (store, t, t.state().head_seq)
    _fixtures[key] = got
    return got


def _read(ctx: Ctx, kind: str) -> Metrics:
    _, t, head = _read_fixture(ctx, kind, 1)
    cursor = [0]
    read = t.read

    def step() -> int:
        items = read(cursor[0], 10_000)
        if not items:
            cursor[0] = 0
            items = read(0, 10_000)
        cursor[0] = items[-1].seq
        return len(items)

    n, elapsed = timed(step, ctx.seconds)
    out = rate_metrics(n, elapsed, ctx.size)
    out["stored_records"] = float(head)
    return out


def read_sealed(ctx: Ctx) -> Metrics:
    """read(after, limit=10000) over sealed segments (closed and reopened)."""
    return _read(ctx, "sealed")


def read_tail(ctx: Ctx) -> Metrics:
    """read(after, limit=10000) over the unsealed tail (records still served from memory)."""
    return _read(ctx, "tail")


def _subscriber(ctx: Ctx, per_record: bool) -> Metrics:
    kind = "subscriber-ack" if per_record else "subscriber"
    rounds = ctx.rounds
    _, t, head = _read_fixture(ctx, kind, rounds)
    name = f"sub-{ctx.round}"
    sub = t.subscriber(name)
    poll = sub.poll

    def step() -> int:
        items = poll(1000)
        if not items:
            return 0
        if per_record:
            ack = sub.ack
            for rec in items:
                ack(rec.seq)
        else:
            sub.commit(items[-1].seq)
        return len(items)

    n, elapsed = timed(step, ctx.seconds)
    out = rate_metrics(n, elapsed, ctx.size)
    out["stored_records"] = float(head)
    return out


def subscriber_commit(ctx: Ctx) -> Metrics:
    """poll(max=1000) then commit(last seq) per batch."""
    return _subscriber(ctx, per_record=False)


def subscriber_ack(ctx: Ctx) -> Metrics:
    """poll(max=1000) then ack(seq) for every record."""
    return _subscriber(ctx, per_record=True)


def close_fixtures() -> None:
    for store, _, _ in _fixtures.values():
        store.close()
    _fixtures.clear()
