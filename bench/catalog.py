"""The benchmark's cases: what each measures, against which physical limit, with which
durability guarantee (the tiers: ``harness``). The harness runs them; ``report`` summarises
them by id. Neither imports the other for this list."""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass

from tidelog.fsio import WRITE_OUT_BYTES

from . import cases, forward_cases, instance_cases, limits, peers, router_cases, service_cases
from .measure import Ctx, Metrics

__all__ = ["Case", "CASES", "SIZES"]

SIZES = (100, 4096)


@dataclass(frozen=True)
class Case:
    id: str
    label: str
    group: str  # "limit" | "tidelog" | "peer"
    fn: Callable[[Ctx], Metrics]
    tier: str = "-"  # "durable" | "buffered" | "-" (limits, reads)
    mode: str = "single"  # single | batch | read | consume | forward | route | latency | other
    # | svc_append_c1 | svc_append_c8 | svc_push | svc_consume | svc_priority (the service)
    limit: str | None = None  # the physical limit this case is compared with
    baseline: str | None = None  # the same measurement without the feature (routers: rt_*)
    guarantee: str = ""
    sizes: tuple[int, ...] = SIZES
    quick: bool = True


P = functools.partial
_DUR = "acknowledged put survives power loss"
_FWD = (
    "sf_dir slot, sf_durability=memory -> tidelog serve (file://, durability=disk) on "
    "127.0.0.1; acked = appended by the receiver (survives its process crash, not power "
    "loss); unacked frames are lost with the sender's process"
)
_FWD_DUR = (
    "as plain, but acked = request_durable_ack=on: the receiver's group commit synced it "
    "(survives power loss of the receiver)"
)


def _instance_cases() -> list[Case]:
    """N processes of fsync appends or append_many(1000), one instance each, and one process
    (the figure the others are compared with, ``instance_cases.targets``); each beside its
    ceiling: N processes of raw pwrite + fdatasync, one file each."""
    out: list[Case] = []
    for cid, n, batch, kind in instance_cases.CASES:
        what = "append" if batch == 1 else f"append_many({batch})"
        if kind == "raw":
            what = "pwrite+fdatasync" if batch == 1 else f"{batch} joined: pwrite+fdatasync"
            out.append(Case(cid, f"raw {what}, {n} process(es), a preallocated file each",
                            "limit", P(instance_cases.instances_append, procs=n, batch=batch,
                                       raw=True), "durable", "single" if batch == 1 else "batch",
                            guarantee=_DUR, sizes=(100,)))  # fmt: skip
            continue
        steady = kind == "steady"
        state = ", steady state (recycled WAL files, WAL-15)" if steady else ""
        out.append(Case(cid, f"tidelog file://?instances={n} fsync {what}, {n} process(es)"
                        f"{state}", "tidelog",
                        P(instance_cases.instances_append, procs=n, batch=batch, steady=steady),
                        "durable", "single" if batch == 1 else "batch",
                        limit=instance_cases.ceiling(cid), guarantee=_DUR,
                        sizes=(100,)))  # fmt: skip
    return out


def _router_cases() -> list[Case]:
    """Per durability class (``disk``, ``fsync``): appends with no router (the baseline), 1
    router and 4 routers into 4 dests; append -> readable latency without and with a router."""
    rate = router_cases.route_rate
    latency = router_cases.route_latency
    paced = f"append at {router_cases.RATE}/s, a reader blocked in read(wait_ms)"
    classes = (
        ("disk", "buffered", "loop_floor",
         "as tl_file_disk; copies follow dest's class, re-derived after a crash (RTR-11)"),
        ("fsync", "durable", "raw_overwrite",
         _DUR + "; copies re-derived from their source record after a crash (RTR-11)"),
    )  # fmt: skip
    out: list[Case] = []
    for dur, tier, limit, guarantee in classes:
        base = f"rt_plain_{dur}"
        for n, what in ((0, f"no router (baseline of rt_*_{dur})"),
                        (1, "1 router out of the topic"), (4, "4 routers to 4 dests")):  # fmt: skip
            out.append(Case(base if n == 0 else f"rt_{n}_{dur}",
                            f"file:// {dur} append, 1 thread, {what}", "tidelog",
                            P(rate, durability=dur, routers=n), tier, "route", limit=limit,
                            baseline=None if n == 0 else base, guarantee=guarantee))  # fmt: skip
    for dur, tier, _, guarantee in classes:
        base = f"rt_lat_plain_{dur}"
        for n, what in ((0, "append -> readable in the source"),
                        (1, "source append -> copy readable in dest, 1 router")):  # fmt: skip
            out.append(Case(base if n == 0 else f"rt_lat_{n}_{dur}",
                            f"file:// {dur}: {what} ({paced})", "tidelog",
                            P(latency, durability=dur, routers=n), tier, "latency",
                            baseline=None if n == 0 else base, guarantee=guarantee,
                            sizes=(100,)))  # fmt: skip
    return out


#: the service cases' systems: (id part, what it is, group, tier of an append's answer, guarantee)
_SVC_SYSTEMS = (
    ("tidelog", "tidelog serve (HTTP /v0, file://, topic durability=fsync)", "tidelog", "durable",
     _DUR + " (fsync topic, DUR-2)"),
    ("nats", "NATS JetStream 2.9 (file storage)", "peer", "buffered",
     "acked once written to the page cache; 2.9 fsyncs its blocks every 2 min and has no "
     "sync-always option: survives a server crash, not power loss"),
    ("redis", "Redis Streams (appendonly, appendfsync always)", "peer", "durable",
     _DUR + " (AOF fdatasync before the reply)"),
)  # fmt: skip
_SVC_CONSUME = {
    "tidelog": ("buffered", "poll + commit: the subscriber's progress is at least once, synced "
                "at flush or close (DUR-9)"),
    "nats": ("buffered", "ack_sync of the last (AckPolicy all): the consumer's state is "
             "written, never fsynced per ack (no fsync in a traced run)"),
    "redis": ("durable", "XACK: in the synced AOF before the reply"),
}  # fmt: skip


def _service_cases() -> list[Case]:
    """tidelog serve beside NATS JetStream and Redis Streams (service_cases.py): durable appends
    from 1 and 8 clients, append -> live delivery at a fixed rate, consume + ack; then tidelog's
    high-priority push latency idle and while low-priority topics saturate the server."""
    svc = service_cases
    one = (100,)
    out: list[Case] = []
    for clients in (1, 8):
        for sid, what, group, tier, guarantee in _SVC_SYSTEMS:
            out.append(Case(f"service_{sid}_append_c{clients}",
                            f"{what}: appends, {clients} client(s), one record per request",
                            group, P(svc.append_rate, system=sid, clients=clients), tier,
                            f"svc_append_c{clients}", guarantee=guarantee, sizes=one))  # fmt: skip
    for sid, what, group, tier, guarantee in _SVC_SYSTEMS:
        out.append(Case(f"service_{sid}_push", f"{what}: append -> live delivery at "
                        f"{svc.RATE}/s", group, P(svc.push_latency, system=sid), tier,
                        "svc_push", guarantee=guarantee, sizes=one))  # fmt: skip
    for sid, what, group, _, _ in _SVC_SYSTEMS:
        tier, guarantee = _SVC_CONSUME[sid]
        out.append(Case(f"service_{sid}_consume", f"{what}: fetch {svc.BATCH} + ack them",
                        group, P(svc.consume_rate, system=sid), tier, "svc_consume",
                        guarantee=guarantee, sizes=one))  # fmt: skip
    prio = f"tidelog serve: priority 1000 topic (disk), append -> SSE at {svc.RATE}/s"
    load = (f"while {svc.LOW_WRITERS} writers saturate {svc.LOW_TOPICS} priority -1000 topics "
            "with SSE streams")  # fmt: skip
    for loaded, suffix, what in ((False, "idle", "server idle"), (True, "loaded", load)):
        out.append(Case(f"service_tidelog_prio_{suffix}", f"{prio}, {what}", "tidelog",
                        P(svc.priority_latency, loaded=loaded), "buffered", "svc_priority",
                        guarantee="disk topics (DUR-3)", sizes=one))  # fmt: skip
    return out


CASES: list[Case] = [
    # -- physical limits ------------------------------------------------------------------------
    Case("raw_append", "os.write+fdatasync per record, appending", "limit", limits.raw_append,
         "durable", guarantee=_DUR),
    Case("raw_overwrite", "os.pwrite+fdatasync per record, overwriting a preallocated file",
         "limit", limits.raw_overwrite, "durable", guarantee=_DUR),
    Case("raw_joined", "1000 records joined: one os.pwrite + one fdatasync", "limit",
         limits.raw_joined, "durable", "batch", guarantee=_DUR),
    Case("raw_joined_sealed", "raw_joined, and each 32 MiB written again as a segment, written "
         f"out every {WRITE_OUT_BYTES >> 20} MiB and synced by a second thread (the device "
         "ceiling of a WAL + segments log)", "limit",
         limits.raw_joined_sealed, "durable", "batch", guarantee=_DUR),
    Case("seq_write", "1 MiB sequential os.write, fdatasync at end", "limit", limits.seq_write,
         mode="other", sizes=(1 << 20,)),
    Case("mmap_read", "mmap read of a page-cached file (record-sized slices -> bytes)", "limit",
         limits.mmap_read, mode="read"),
    Case("loop_floor", "Python per-record floor: pack header + copy + XXH3 (no I/O)", "limit",
         limits.loop_floor, mode="other"),
    # -- tidelog ---------------------------------------------------------------------------------
    Case("tl_memory", "tidelog memory:// append, 1 thread", "tidelog", cases.memory_single,
         "buffered", limit="loop_floor", guarantee="process memory only"),
    Case("tl_file_fsync", "tidelog file:// fsync append, 1 thread", "tidelog",
         P(cases.file_single, durability="fsync"), "durable", limit="raw_overwrite",
         guarantee=_DUR),
    Case("tl_file_fsync_steady", "tidelog file:// fsync append, 1 thread, steady state "
         "(recycled WAL file, WAL-15)", "tidelog",
         P(cases.file_single, durability="fsync", steady=True), "durable",
         limit="raw_overwrite", guarantee=_DUR),
    Case("tl_file_disk", "tidelog file:// disk append, 1 thread", "tidelog",
         P(cases.file_single, durability="disk"), "buffered", limit="loop_floor",
         guarantee="synced within commit_interval_ms (10 ms); crash loses a suffix, seqs kept"),
    Case("tl_file_memory", "tidelog file:// memory append, 1 thread", "tidelog",
         P(cases.file_single, durability="memory"), "buffered", limit="loop_floor",
         guarantee="as disk, but head may regress after a crash (DUR-4)"),
    Case("tl_file_ephemeral", "tidelog file:// ephemeral append, 1 thread", "tidelog",
         P(cases.file_single, durability="ephemeral"), "buffered", limit="loop_floor",
         guarantee="records end with the process (DUR-5)"),
    Case("tl_file_fsync_many", "tidelog file:// fsync append_many(1000), 1 thread", "tidelog",
         P(cases.file_many, durability="fsync"), "durable", "batch", limit="raw_joined",
         guarantee=_DUR),
    Case("tl_file_fsync_many_steady", "tidelog file:// fsync append_many(1000), 1 thread, "
         "steady state (recycled WAL file, WAL-15)", "tidelog",
         P(cases.file_many, durability="fsync", steady=True), "durable", "batch",
         limit="raw_joined", guarantee=_DUR),
    Case("tl_file_disk_many", "tidelog file:// disk append_many(1000), 1 thread", "tidelog",
         P(cases.file_many, durability="disk"), "buffered", "batch", limit="loop_floor",
         guarantee="synced within commit_interval_ms (10 ms)"),
    Case("tl_file_fsync_t8", "tidelog file:// fsync append, 8 threads (group commit)", "tidelog",
         P(cases.file_threads, durability="fsync"), "durable", limit="raw_overwrite",
         guarantee=_DUR),
    Case("tl_blockdev_fsync", "tidelog blockdev:// image fsync append, 1 thread", "tidelog",
         P(cases.blockdev_single, durability="fsync"), "durable", limit="raw_overwrite",
         guarantee=_DUR, sizes=(100, -1)),
    Case("tl_blockdev_fsync_many", "tidelog blockdev:// image fsync append_many(1000)",
         "tidelog", P(cases.blockdev_many, durability="fsync"), "durable", "batch",
         limit="raw_joined", guarantee=_DUR, sizes=(100, -1)),
    Case("tl_read_sealed", "tidelog file:// read(after, limit=10000), sealed segments",
         "tidelog", cases.read_sealed, mode="read", limit="mmap_read"),
    Case("tl_read_tail", "tidelog file:// read(after, limit=10000), unsealed tail", "tidelog",
         cases.read_tail, mode="read", limit="mmap_read"),
    Case("fwd_tidelog", "tidelog Forwarder -> tidelog serve, one frame per append", "tidelog",
         P(forward_cases.tidelog_forwarder, durable=False), "buffered", "forward",
         guarantee=_FWD),
    Case("fwd_tidelog_durable", "tidelog Forwarder -> tidelog serve, request_durable_ack=on",
         "tidelog", P(forward_cases.tidelog_forwarder, durable=True), "durable", "forward",
         guarantee=_FWD_DUR),
    Case("tl_sub_commit", "tidelog subscriber poll(1000) + commit(last)", "tidelog",
         cases.subscriber_commit, "buffered", "consume", limit="mmap_read",
         guarantee="progress file at least once (DUR-9)"),
    Case("tl_sub_ack", "tidelog subscriber poll(1000) + ack(seq) per record", "tidelog",
         cases.subscriber_ack, "buffered", "consume", limit="mmap_read",
         guarantee="progress file at least once (DUR-9)"),
    # -- several writer processes (spec/INSTANCES.md): N processes, one instance each ---------
    *_instance_cases(),
    # -- routers (spec RTR): each beside the same appends without routers (its baseline) -------
    *_router_cases(),
    # -- the service (service_cases.py): tidelog serve beside NATS JetStream and Redis Streams -----
    *_service_cases(),
    # -- peers -------------------------------------------------------------------------------------
    Case("sqlite_full_1", "sqlite3 WAL synchronous=FULL, 1 row/txn", "peer",
         P(peers.sqlite, synchronous="FULL", per_txn=1), "durable", guarantee=_DUR),
    Case("sqlite_full_1000", "sqlite3 WAL synchronous=FULL, 1000 rows/txn", "peer",
         P(peers.sqlite, synchronous="FULL", per_txn=1000), "durable", "batch", guarantee=_DUR),
    Case("sqlite_normal_1", "sqlite3 WAL synchronous=NORMAL, 1 row/txn", "peer",
         P(peers.sqlite, synchronous="NORMAL", per_txn=1), "buffered",
         guarantee="survives a process crash, not power loss"),
    Case("sqlite_normal_1000", "sqlite3 WAL synchronous=NORMAL, 1000 rows/txn", "peer",
         P(peers.sqlite, synchronous="NORMAL", per_txn=1000), "buffered", "batch",
         guarantee="survives a process crash, not power loss"),
    Case("pq_sqlite", "persist-queue SQLiteQueue (WAL, FULL)", "peer", peers.persist_queue,
         "durable", guarantee=_DUR),
    Case("pq_sqlite_ack", "persist-queue SQLiteAckQueue (WAL, FULL)", "peer",
         P(peers.persist_queue, ack=True), "durable", guarantee=_DUR),
    Case("dc_sync2", "diskcache Deque sqlite_synchronous=2 (FULL)", "peer",
         P(peers.diskcache_deque, sqlite_synchronous=2), "durable", guarantee=_DUR),
    Case("dc_default", "diskcache Deque default (synchronous=1 NORMAL)", "peer",
         P(peers.diskcache_deque, sqlite_synchronous=None), "buffered",
         guarantee="survives a process crash, not power loss"),
    Case("queuelib_fifo", "queuelib FifoDiskQueue (never fsyncs)", "peer", peers.queuelib_fifo,
         "buffered", guarantee="head/tail info written only at close: a crash loses the queue"),
    Case("litequeue", "litequeue default (WAL, NORMAL hard-coded)", "peer",
         P(peers.litequeue_queue, full=False), "buffered",
         guarantee="survives a process crash, not power loss"),
    Case("litequeue_full", "litequeue + PRAGMA synchronous=FULL", "peer",
         P(peers.litequeue_queue, full=True), "durable", guarantee=_DUR),
    Case("lmdb_sync_1", "lmdb sync=True, 1 put/txn", "peer",
         P(peers.lmdb_env, sync=True, per_txn=1), "durable", guarantee=_DUR),
    Case("lmdb_sync_1000", "lmdb sync=True, 1000 puts/txn", "peer",
         P(peers.lmdb_env, sync=True, per_txn=1000), "durable", "batch", guarantee=_DUR),
    Case("lmdb_nosync_1", "lmdb sync=False, 1 put/txn", "peer",
         P(peers.lmdb_env, sync=False, per_txn=1), "buffered",
         guarantee="survives a process crash, not power loss"),
    Case("lmdb_nosync_1000", "lmdb sync=False, 1000 puts/txn", "peer",
         P(peers.lmdb_env, sync=False, per_txn=1000), "buffered", "batch",
         guarantee="survives a process crash, not power loss"),
    Case("fwd_questdb", "questdb 6.0.0 Sender (QWP/WebSocket) -> tidelog serve, one row per "
         "flush", "peer", P(forward_cases.questdb_client, durable=False), "buffered", "forward",
         guarantee=_FWD),
    Case("fwd_questdb_durable", "questdb 6.0.0 Sender -> tidelog serve, request_durable_ack=on",
         "peer", P(forward_cases.questdb_client, durable=True), "durable", "forward",
         guarantee=_FWD_DUR),
]  # fmt: skip
