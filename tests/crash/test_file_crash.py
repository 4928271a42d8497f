"""Torn-write / power-loss simulation of the file backend (spec/CRASH.md CRASH-7; DUR-2..DUR-6,
DUR-9): every workload runs once on a RecordingFS, then recovery runs on every disk state a power
loss may leave at each crash point (exhaustive for small workloads, seeded samples for large
ones) and must match the model."""

from __future__ import annotations

import os
import random

import pytest

from tidelog.backends.file import open_store
from tidelog.backends.file.format import wal as walfmt
from tidelog.clock import Clock
from tidelog.conformance.crashcheck import CrashRun, Op
from tidelog.conformance.crashfs import RecordingFS

OPTIONS = dict(
    wal_file_bytes="64KiB",
    prealloc="none",
    background=False,
    commit_interval_ms=60_000,
    head_reserve=4,
    segment_max_records=3,
)
ROOT = "/data/store"


def report(test: str, states: int) -> None:
    """Print, and append to $TIDELOG_CRASH_REPORT (the nox crash session sums it), how many
    crash states a test recovered and checked."""
    print(f"{test}: {states} crash states checked")
    path = os.environ.get("TIDELOG_CRASH_REPORT")
    if path:
        with open(path, "a", encoding="utf-8") as f:
            f.write(f"{test}\t{states}\n")


def open_file_store(fs: RecordingFS, clock: Clock) -> object:
    return open_store(fs, ROOT, clock, **OPTIONS)


def check_every_point(ops: list[Op], *, torn: str, at_least: int) -> None:
    """Record ``ops`` once, recover every crash state at every crash point (exhaustive) and
    check each against the model; more than ``at_least`` states must have been checked."""
    run = CrashRun(open_file_store, ops)
    n = run.check(every_point(run), torn=torn)
    assert n > at_least
    report("exhaustive", n)


def sample_every_point(run: CrashRun, seed: int) -> int:
    """A seeded sample of states (``$TIDELOG_CRASH_SAMPLES``, default 6) at every crash point of
    a seeded workload, each checked against the model; a failure names the seed and the point.
    Returns how many states were checked."""
    per_point = int(os.environ.get("TIDELOG_CRASH_SAMPLES", "6"))
    n = 0
    for at in run.fs.checkpoints():
        try:
            n += run.check([at], mode="sample", seed=seed + at, limit=per_point, torn="all")
        except AssertionError as exc:
            raise AssertionError(f"[workload seed {seed}, crash point {at}] {exc}") from None
    return n


def test_DUR_2_fsync_appends_every_crash_point_exhaustive() -> None:
    """DUR-2, DUR-6, CRASH-7: acknowledged fsync appends survive every torn/reordered state."""
    ops: list[Op] = [
        ("create", "t", {"durability": "fsync"}),
        ("append", "t", b"a" * 300, None),
        ("append_many", "t", [b"b" * 200, b"c" * 10]),
        ("append", "t", b"d", "tag"),
    ]
    check_every_point(ops, torn="garbage", at_least=300)


def test_TOP_6_WAL_14_torn_batch_frames_at_every_sector() -> None:
    """TOP-6, WAL-14, DUR-2, CRASH-1: append_many frames spanning several 512-byte sectors, with
    each sector independently intact, half-written, zeroed or garbage at every crash point:
    recovery keeps a whole batch or none of it, and every acknowledged batch."""
    ops: list[Op] = [
        ("create", "t", {"durability": "fsync"}),
        ("append_many", "t", [bytes([65 + i]) * 150 for i in range(6)]),  # 950 B, 2-3 sectors
        ("append", "t", b"between", None),
        ("append_many", "t", [b"x" * 600, b"", b"y" * 300]),  # straddles 3 sectors
    ]
    check_every_point(ops, torn="all", at_least=200)


def test_DUR_3_WAL_14_single_appends_merged_into_runs() -> None:
    """DUR-3, DUR-2, WAL-14, WAL-11: consecutive single appends of a topic sharing a ts are
    framed as one APPEND_BATCH when placed (one op batch for several ops); torn at every
    sector at every crash point, recovery still gives a prefix of each topic's history with
    every flushed or fsync op, never half a run."""
    ops: list[Op] = [
        ("create", "d", {"durability": "disk"}),
        ("create", "f", {"durability": "fsync"}),
        ("append", "d", b"1" * 300, None),
        ("append", "d", b"2" * 300, None),
        ("append", "d", b"3", None),
        ("append", "f", b"f1", None),  # places d's run first, then syncs both
        ("advance", 1),
        ("append", "d", b"4" * 200, None),
        ("append", "d", b"5", None),
        ("flush",),
        ("append", "d", b"6", None),
        ("append", "d", b"7", None),
    ]
    run = CrashRun(open_file_store, ops)
    wal_dir = f"{ROOT}/wal"
    image = b"".join(
        run.fs.open_read(f"{wal_dir}/{name}").pread(1 << 20, 0)
        for name in run.fs.listdir(wal_dir)
        if name.endswith(".log")
    )
    types = [f.type for f in walfmt.scan_file(image).frames]
    assert types.count(walfmt.FrameType.APPEND_BATCH) >= 2  # d's runs were merged
    n = run.check(every_point(run), torn="garbage")
    assert n > 100
    report("exhaustive", n)


def every_point(run: CrashRun) -> list[int]:
    """Every crash point of the recorded I/O history (not only the sync barriers)."""
    return list(range(len(run.fs.history) + 1))


def test_DUR_3_DUR_4_weaker_classes_lose_only_a_suffix() -> None:
    """DUR-3 (disk: loss becomes a tombstone, no seq reuse), DUR-4 (memory), DUR-5 (ephemeral):
    never a middle hole, never a corrupted record."""
    ops: list[Op] = [
        ("create", "d", {"durability": "disk"}),
        ("create", "m", {"durability": "memory"}),
        ("create", "e", {"durability": "ephemeral"}),
        ("append", "d", b"d1", None),
        ("append", "m", b"m1", None),
        ("append", "e", b"e1", None),
        ("flush",),
        ("append", "d", b"d2" * 100, None),
        ("append", "m", b"m2", None),
        ("append", "d", b"d3", None),
    ]
    check_every_point(ops, torn="garbage", at_least=100)


def test_DUR_2_TOP_5_append_records_keep_per_record_labels_after_a_crash() -> None:
    """DUR-2, TOP-5: an append_records batch replayed from the WAL keeps each record's own tag
    and node (regression: replay once gave every record of the batch the first one's labels)."""
    ops: list[Op] = [
        ("create", "t", {"durability": "fsync"}),
        ("append_records", "t", [(b"a", None, "n1"), (b"b", "x", "y"), (b"c", "x", "y")]),
        ("append_records", "t", [(b"d", "z", None)]),
    ]
    check_every_point(ops, torn="all", at_least=50)


def test_DUR_9_subscriber_progress_and_checkpoints() -> None:
    """DUR-9 (hwm at least the flushed one, never ahead of acks), checkpoints and segment
    sealing interrupted at every point (snapshot tmp/rename, WAL retirement)."""
    ops: list[Op] = [
        ("create", "t", {"durability": "fsync", "trim": "acked"}),
        ("subscribe", "t", "s", "earliest"),
        ("append_many", "t", [b"1", b"2", b"3", b"4"]),
        ("ack", "t", "s", 1),
        ("flush_sub", "t", "s"),
        ("checkpoint",),
        ("commit", "t", "s", 3),
        ("append", "t", b"5", None),
        ("delete", "t", 5),
        ("checkpoint",),
    ]
    check_every_point(ops, torn="linear", at_least=200)


def test_PRG_8_progress_is_written_after_the_wal_ops_it_reflects() -> None:
    """PRG-8, DUR-9, TMB-1: the TTL evicts seqs 2..6 (journaled, not yet synced) and moves the
    subscriber past them; its flush writes that progress. At every crash point, recovery keeps
    the eviction wherever it keeps the progress: the evicted records read as a tombstone, never
    trimmed silently (found by the conformance crash level, seed 33)."""
    ops: list[Op] = [
        ("create", "t", {"durability": "fsync", "ttl_ms": 60, "trim": "acked"}),
        ("subscribe", "t", "s", "earliest"),
        ("append_many", "t", [b"1", b"2", b"3", b"4"]),
        ("ack", "t", "s", 1),
        ("append_many", "t", [b"5", b"6"]),
        ("flush",),
        ("advance", 60),
        ("flush_sub", "t", "s"),
        ("flush",),
    ]
    check_every_point(ops, torn="linear", at_least=20)


def test_PRG_9_progress_files_apply_after_the_replay() -> None:
    """PRG-9, SUB-5, TMB-1: s registers at 4; the cap evicts 1..3, then the TTL evicts 4..8
    and moves s past them (a gap); s's flush syncs that and writes hwm 8. Recovery applies the
    progress file only after replaying the WAL: applied at the registration frame, hwm 8 settled
    against records the replay had not evicted yet and trimmed 5..8 silently (no tombstone).
    Found by the conformance crash level (seed 111)."""
    ops: list[Op] = [
        ("create", "t", {"durability": "disk", "cap_records": 5, "ttl_ms": 5, "trim": "acked"}),
        ("append_many", "t", [b"1", b"2", b"3", b"4"]),
        ("subscribe", "t", "s", "resume"),
        ("append_many", "t", [b"5"]),
        ("append_many", "t", [b"6", b"7", b"8"]),
        ("advance", 5),
        ("flush_sub", "t", "s"),
        ("append", "t", b"9", None),
    ]
    check_every_point(ops, torn="linear", at_least=20)


def sample_each_point(run: CrashRun, limit: int) -> int:
    """``limit`` sampled states (seeded by the point) at every crash point of ``run``, each
    checked against the model; a failure names the point. Returns how many were checked."""
    n = 0
    for at in run.fs.checkpoints():
        try:
            n += run.check([at], mode="sample", seed=at, limit=limit, torn="all")
        except AssertionError as exc:
            raise AssertionError(f"[crash point {at}] {exc}") from None
    report("exhaustive", n)
    return n


def test_CRASH_7_wal_rotation() -> None:
    """WAL-1 rotation under load: a file is durable before the next receives a byte, so no
    crash keeps a newer file's frames while an older one is torn."""
    ops: list[Op] = [("create", "t", {"durability": "disk"})]
    ops += [("append", "t", bytes([i]) * 9000, None) for i in range(9)]
    ops += [("append", "t", b"last", None), ("flush",)]
    run = CrashRun(open_file_store, ops)
    assert any(".log" in str(op) and "wal-0000000000000002" in str(op) for op in run.fs.history)
    n = 0
    for at in run.fs.checkpoints():
        n += run.check([at], mode="sample", seed=at, limit=8, torn="all")
    report("exhaustive", n)
    assert n > 20


def _reused(op: str) -> bool:
    """A recorded rename of a spare to a WAL file name: a retired file was reused (WAL-15)."""
    return op.startswith("rename") and "spare-" in op and "/wal-" in op.split("spare-", 1)[1]


def test_WAL_15_recycled_wal_files_at_every_crash_point() -> None:
    """WAL-15: checkpoints retire WAL files into spares and rotation reuses them, so new frames
    land over an older gen's frames; at every crash point (header rewrite, rename, FILE_END,
    torn frames over stale ones) recovery finds exactly the acknowledged ops, never a stale one."""
    ops: list[Op] = [("create", "t", {"durability": "fsync"}), ("create", "d", {})]
    for round_ in range(3):
        ops += [("append", "t", bytes([round_ * 16 + i]) * 9000, None) for i in range(9)]
        ops += [("append", "d", b"disk-%d" % round_, "x"), ("checkpoint",)]
    ops += [("append_many", "t", [b"m" * 3000] * 4), ("append", "t", b"last", None)]
    run = CrashRun(open_file_store, ops)
    assert any(_reused(str(op)) for op in run.fs.history), "no spare was recycled"
    assert sample_each_point(run, 6) > 100


def _recycling_ops(rng: random.Random, n: int) -> list[Op]:
    """Random workloads that rotate 64 KiB WAL files often (payloads of 10-30 KB) and
    checkpoint often, so new files are recycled spares (WAL-15), mixed with the small ops of
    ``_random_ops``."""
    ops = _random_ops(rng, n)
    out: list[Op] = ops[:3]
    for op in ops[3:]:
        out.append(op)
        k = rng.random()
        if k < 0.35:
            out.append(
                (
                    "append",
                    rng.choice("ab"),
                    bytes([rng.randrange(256)]) * rng.randrange(10_000, 30_000),
                    None,
                )
            )
        elif k < 0.5:
            out.append(("checkpoint",))
    # and then surely: a rotation, a checkpoint retiring a file into a spare, a rotation into it
    big = [("append", "r", bytes([i]) * 25_000, None) for i in range(3)]  # fsync: written now
    return [*out, ("create", "r", {"durability": "fsync"}), *big, ("checkpoint",), *big]


@pytest.mark.parametrize("workload", range(int(os.environ.get("TIDELOG_CRASH_WORKLOADS", "3")) - 1))
def test_WAL_15_random_workloads_with_recycled_files_sampled(workload: int) -> None:
    """WAL-15, CRASH-7: seeded random workloads whose WAL files rotate and are recycled, a
    seeded sample of states at every crash point. Reproduce with the printed seed."""
    seed = int(os.environ.get("TIDELOG_SEED", "20261125")) + 1000 + workload
    rng = random.Random(seed)
    run = CrashRun(open_file_store, _recycling_ops(rng, 40))
    assert any(_reused(str(op)) for op in run.fs.history), f"[seed {seed}] nothing recycled"
    n = sample_every_point(run, seed)
    report(f"recycling workload seed {seed}", n)
    assert n > 0


@pytest.mark.parametrize(
    ("source", "dest"),
    [
        ("fsync", "fsync"),
        ("disk", "fsync"),
        ("fsync", "disk"),
        ("disk", "memory"),
        ("fsync", "ephemeral"),
    ],
)
def test_RTR_10_router_copies_and_cursor_at_every_crash_point(source: str, dest: str) -> None:
    """RTR-10, RTR-11, RTR-5, CRASH-7: a router forwarding between two topics, with tagged and
    filtered records, a drop_oldest eviction the router had not dealt with (a dest loss range)
    and a checkpoint in between; at every crash point and every torn state, the recovered
    source and dest, after recovery forwards from the recovered cursor, are what some allowed
    state of each forwards to: no source record lost or copied twice into dest."""
    ops: list[Op] = [
        ("create", "a", {"durability": source, "cap_records": 4}),
        ("create", "b", {"durability": dest, "cap_records": 2, "discard": "reject"}),
        ("router", "r", "a", "b", {"filter_tag": "k*"}),
        ("append", "a", b"1" * 100, "keep"),
        ("append_many", "a", [b"2" * 50, b"3" * 20]),  # untagged: filtered out
        ("append", "a", b"4" * 30, "k2"),
        ("append", "a", b"5" * 30, "k3"),  # b is full: waits (RTR-6)
        ("checkpoint",),
        ("append_many", "a", [b"6", b"7", b"8"]),  # evicts 4, 5 before they were forwarded
        ("delete", "b", 10),  # room: the loss range goes in (RTR-5)
        ("append", "a", b"9", "k9"),
        ("flush",),
    ]
    run = CrashRun(open_file_store, ops)
    n = run.check(every_point(run), torn="garbage")
    assert n > 100
    report(f"routers {source}->{dest}", n)


def _random_ops(rng: random.Random, n: int) -> list[Op]:
    ops: list[Op] = [
        ("create", "a", {"durability": "fsync", "cap_records": 5}),
        ("create", "b", {"durability": "disk", "trim": "none"}),
        ("create", "c", {"durability": "disk", "cap_records": 3, "discard": "reject"}),
        ("subscribe", "a", "s", "earliest"),
        ("router", "r", "a", "c", {"filter_tag": "x"}),  # RTR-10 at random points too
    ]
    for _ in range(n):
        k = rng.random()
        topic = rng.choice("ab")
        if k < 0.45:
            ops.append(
                (
                    "append",
                    topic,
                    bytes([rng.randrange(256)]) * rng.randrange(1, 700),
                    rng.choice([None, "x", "y"]),
                )
            )
        elif k < 0.51:
            ops.append(("append_many", topic, [b"m" * rng.randrange(50) for _ in range(3)]))
        elif k < 0.55:
            labels = [None, "x", "y"]
            rows = [(b"r" * rng.randrange(40), rng.choice(labels), rng.choice(labels))]
            rows += [
                (b"s", rng.choice(labels), rng.choice(labels)) for _ in range(rng.randrange(3))
            ]
            ops.append(("append_records", topic, rows))
        elif k < 0.62:
            ops.append(("delete", rng.choice([topic, "c"]), rng.randrange(1, 8)))
        elif k < 0.70:
            ops.append(("commit", "a", "s", rng.randrange(0, 6)))
        elif k < 0.75:
            ops.append(("flush_sub", "a", "s"))
        elif k < 0.80:
            ops.append(("checkpoint",))
        elif k < 0.85:
            ops.append(("flush",))
        elif k < 0.92:
            ops.append(("claim", "b", "w", 2))
        else:
            ops.append(("complete_first", "b"))
    return ops


@pytest.mark.parametrize("workload", range(int(os.environ.get("TIDELOG_CRASH_WORKLOADS", "3"))))
def test_CRASH_7_random_workloads_sampled(workload: int) -> None:
    """CRASH-6, CRASH-7: seeded random workloads, a seeded sample of states at every crash
    point. Reproduce a failure with the seed printed in the assertion."""
    seed = int(os.environ.get("TIDELOG_SEED", "20261122")) + workload
    rng = random.Random(seed)
    run = CrashRun(open_file_store, _random_ops(rng, 25))
    n = sample_every_point(run, seed)
    report(f"workload seed {seed}", n)
    assert n > 0


def test_WTAIL_6_WTAIL_7_sealing_from_the_wal_at_every_crash_point(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Checkpoints seal the tails from their WAL frames (WTAIL-6, here in the writer: a
    RecordingFS is not the OS's, WTAIL-8), over WAL files that rotate, with dead slots, labels
    and a dead prefix; at every crash point (segments written from the frames, the WAL sync
    moved before them, snapshot, retirement) recovery matches the model."""
    from tidelog.backends.file import store as file_store

    jobs: list[int] = []
    seal = file_store.seal_wal

    def counted(fs: object, job: object) -> object:
        jobs.append(len(job.ranges))  # type: ignore[attr-defined]
        return seal(fs, job)  # type: ignore[arg-type]

    monkeypatch.setattr(file_store, "seal_wal", counted)

    def opener(fs: RecordingFS, clock: Clock) -> object:
        return open_store(fs, ROOT, clock, **OPTIONS, seal_worker_bytes=0)

    ops: list[Op] = [("create", "t", {"durability": "fsync"}), ("create", "d", {})]
    for r in range(3):
        ops += [("append_many", "t", [bytes([r]) * 7000] * 4)]
        ops += [("append", "d", b"disk-%d-%d" % (r, i), "x" if i % 2 else None) for i in range(4)]
        ops += [("append_records", "t", [(b"a", None, "n1"), (b"b", "k", "n2")])]
        ops += [("delete", "d", 2 + 4 * r), ("append", "t", b"last-%d" % r, None)]
        # dead slots inside the tails, not only a dead prefix: d's tagged records, one of t's
        ops += [("delete_tag", "d", "x"), ("delete_tag", "t", "k"), ("checkpoint",)]
    run = CrashRun(opener, ops)
    assert jobs == [2, 2, 2], jobs  # every checkpoint sealed both topics so
    assert sample_each_point(run, 4) > 100
