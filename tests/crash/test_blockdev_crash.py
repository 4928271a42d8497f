"""Torn-write / power-loss simulation of the blockdev ring (spec/CRASH.md CRASH-7; DUR-2, DUR-4,
DUR-6, DUR-9; FORMATS-blockdev BDEV-10, BDEV-14, BDEV-15, BDEV-17; RING-3..RING-6).

Every workload runs once on a RecordingFS holding one image file; recovery then runs on every disk
state a power loss may leave at each crash point. With 512-byte pages a page is one sector, so a
crash point is a page boundary ("page granularity"); with 1 KiB and 4 KiB pages a page spans
several sectors that persist or tear independently ("512-byte sector granularity", CRASH-1).

The checks are tidelog.conformance.crashcheck's (CRASH-7: recovery never raises, acknowledged
fsync appends and everything before a flush survive byte-identical, the recovered topic equals a
state the model allows, subscriber hwm within DUR-9's bounds, recovery idempotent, new seqs above
the recovered head), with the ring's documented relaxations (tidelog.conformance.ringcrash:
BDEV-17, subscriber progress and trims are at-least-once; BDEV-16, a crash while overwriting
live records may lose them visibly) and one more check: no subscriber silently misses a record
it had not resolved (SUB-7).
"""

from __future__ import annotations

import os
import random
from typing import Any

import pytest

import tidelog
from tidelog.backends.blockdev import open_store
from tidelog.clock import Clock, FakeClock
from tidelog.conformance.crashcheck import CrashRun, Op
from tidelog.conformance.crashfs import RecordingFS
from tidelog.conformance.ringcrash import RingCrashRun
from tidelog.hooks import Abandon, hooks

IMAGE = "/ring.img"


def report(test: str, states: int) -> None:
    """Print, and append to $TIDELOG_CRASH_REPORT, how many crash states a test checked."""
    print(f"{test}: {states} crash states checked")
    path = os.environ.get("TIDELOG_CRASH_REPORT")
    if path:
        with open(path, "a", encoding="utf-8") as f:
            f.write(f"blockdev {test}\t{states}\n")


def factory(pages: int, page_size: int, **extra: Any) -> Any:
    size = 4096 + pages * page_size

    def open_ring(fs: RecordingFS, clock: Clock) -> tidelog.Store:
        return open_store(fs, IMAGE, clock, size=size, page_size=page_size, topic="t", **extra)

    return open_ring


def every_point(run: CrashRun) -> list[int]:
    return list(range(len(run.fs.history) + 1))


# ---------------------------------------------------------------------------------------------
def test_DUR_2_fsync_appends_every_point_page_granularity() -> None:
    """DUR-2, DUR-6, CRASH-7, BDEV-15: fsync appends (one 512-byte page = one sector each) and a
    batch spanning two pages, at every crash point, every sector old/new/zero/garbage."""
    ops: list[Op] = [
        ("create", "t", {"durability": "fsync"}),
        ("append", "t", b"a" * 100, None),
        ("append_many", "t", [b"b" * 200, b"c" * 300]),
        ("append", "t", b"d", "tag"),
        ("append_many", "t", [b"e", b"f", b"g"]),
    ]
    run = RingCrashRun(factory(8, 512), ops)
    n = run.check(every_point(run), torn="garbage")
    assert n > 300
    report("fsync, 512 B pages, every point", n)


def test_DUR_2_torn_pages_sector_granularity() -> None:
    """DUR-2, CRASH-1, RING-4: 1 KiB pages (two sectors): a page write may persist one sector and
    not the other, or tear either one; the CRC (with the ring id) rejects every such page."""
    ops: list[Op] = [
        ("create", "t", {"durability": "fsync"}),
        ("append", "t", b"a" * 700, None),
        ("append_many", "t", [b"b" * 600, b"c" * 5]),
        ("append", "t", b"d" * 900, "x"),
    ]
    run = RingCrashRun(factory(6, 1024), ops)
    n = run.check(every_point(run), torn="all")
    assert n > 200
    report("fsync, 1 KiB pages, every point, torn=all", n)


def test_DUR_4_memory_class_and_flush() -> None:
    """DUR-4, DUR-7, BDEV-14, BDEV-15: memory-class records reach the device when a page fills or
    at flush; a crash loses only a suffix after the last flush (seqs may be reused)."""
    ops: list[Op] = [
        ("create", "t", {"durability": "memory"}),
        ("append", "t", b"m1", None),
        ("append_many", "t", [b"x" * 150, b"y" * 150]),
        ("flush",),
        ("append", "t", b"z" * 200, None),
        ("append", "t", b"w" * 200, "tag"),  # fills a page: written without a flush
        ("append", "t", b"v", None),
        ("flush",),
        ("append", "t", b"u", None),
    ]
    run = RingCrashRun(factory(8, 512), ops)
    n = run.check(every_point(run), torn="garbage")
    assert n > 200
    report("memory + flush, every point", n)


def test_RING_3_wraps_and_torn_pages_across_laps() -> None:
    """RING-1, RING-3, RING-4, RING-6, BDEV-16: a 4-page ring written through three laps, a crash
    at every point of every lap (including torn first pages of a new lap). The cap keeps the
    overwritten pages dead, so ring overwrite never evicts what the model keeps."""
    ops: list[Op] = [("create", "t", {"durability": "fsync", "cap_records": 2})]
    ops += [("append", "t", bytes([65 + i]) * (50 + i), None) for i in range(12)]
    run = RingCrashRun(factory(4, 512), ops)
    n = run.check(every_point(run), torn="garbage")
    assert n > 300
    report("4-page ring, 3 laps, every point", n)


class FullRingCrashRun(RingCrashRun):
    """BDEV-16: a ring too small for what the topic keeps overwrites live records, and that
    eviction is on the device as soon as the overwriting write starts: a crash during that write
    may lose the oldest page's records although the op did not complete. Allowed: an allowed
    state minus some of its oldest records, below a floor that tombstones them."""

    ring_full = True


@pytest.mark.parametrize("cls", ["fsync", "memory"])
def test_BDEV_16_full_ring_crash_loses_oldest_only_visibly(cls: str) -> None:
    """BDEV-16, TMB-1, RING-4: an uncapped topic on a 4-page ring: every page written after the
    first lap overwrites live records (ring eviction). A crash at any point keeps an allowed state
    or one that also lost its oldest records, always below the floor (a tombstone)."""
    ops: list[Op] = [("create", "t", {"durability": cls})]
    for i in range(10):
        ops.append(("append", "t", bytes([97 + i]) * 300, None))
        if cls == "memory" and i % 3 == 2:
            ops.append(("flush",))
    run = FullRingCrashRun(factory(4, 512), ops)
    n = run.check(every_point(run), torn="garbage")
    assert n > 100
    report(f"full 4-page ring ({cls}), every point", n)


def test_BDEV_17_subscribers_at_least_once() -> None:
    """BDEV-17, DUR-9, SUB-9: subscriber progress is in the metadata slot (flush, register,
    close) and in page trailers (min hwm); trims are not written by themselves, so a crash may
    bring trimmed records back (at-least-once), never lose an unresolved one silently."""
    ops: list[Op] = [
        ("create", "t", {"durability": "fsync", "trim": "acked", "cap_records": 6}),
        ("subscribe", "t", "s", "earliest"),
        ("append_many", "t", [b"1" * 90, b"2" * 90, b"3" * 90]),
        ("ack", "t", "s", 1),
        ("append", "t", b"4" * 100, None),
        ("flush_sub", "t", "s"),
        ("commit", "t", "s", 3),
        ("append", "t", b"5" * 300, None),
        ("append", "t", b"6" * 300, None),
        ("flush",),
        ("commit", "t", "s", 6),
        ("append", "t", b"7", None),
    ]
    run = RingCrashRun(factory(6, 512), ops)
    n = run.check(every_point(run), torn="garbage")
    assert n > 100
    report(f"subscribers, every point ({run.relaxed} needed BDEV-17)", n)


def _relaxed_everywhere(ops: list[Op], label: str) -> RingCrashRun:
    """Every crash point, every sector state, on an 8-page ring of 512-byte pages; some states
    must have needed a BDEV-17 relaxation (the states of the original failure were reached)."""
    run = RingCrashRun(factory(8, 512), ops)
    n = run.check(every_point(run), torn="all")
    assert run.relaxed > 0
    report(label, n)
    return run


def test_BDEV_17_progress_newer_than_records_regression() -> None:
    """BDEV-17, DUR-9, SUB-5 (regression: TIDELOG_SEED=319459973, CRASH-7 workload 1, crash point
    30). A memory-class topic: ``flush_sub`` writes the subscriber's hwm 4 to the slot while
    record 4 is still only in the open page. A crash after that slot write recovers records 1..3
    with the hwm clamped to 3 (DUR-9), so 1..3 are trimmed again (SUB-5): silent, because the
    subscriber had resolved them before the crash. (The checker used to demand a tombstone.)"""
    ops: list[Op] = [
        ("create", "t", {"durability": "memory"}),
        ("subscribe", "t", "s", "earliest"),
        ("append_many", "t", [b"a" * 20, b"b" * 20, b"c" * 20]),
        ("flush",),
        ("append", "t", b"d" * 10, None),
        ("commit", "t", "s", 4),
        ("flush_sub", "t", "s"),
    ]
    run = _relaxed_everywhere(ops, "progress newer than records (regression), every point")
    assert run.results[-2:] == [4, None]


def test_BDEV_17_progress_newer_than_records_original_workload() -> None:
    """The original failing workload (seed 319460074, its first 17 ops: the crash was in the
    17th, ``flush_sub``), every crash point, every sector state."""
    ops: list[Op] = [
        ("create", "t", {"durability": "memory", "cap_records": 5}),
        ("subscribe", "t", "s", "earliest"),
        ("advance", 1),
        ("append_many", "t", [b"m" * 23, b"m" * 9, b"m" * 34]),
        ("append_many", "t", [b"m" * 49, b"m" * 36, b"m" * 34]),
        ("flush",),
        ("append", "t", b"A" * 10, "x"),
        ("commit", "t", "s", 4),
        ("append", "t", b"\xcb", "x"),
        ("append_many", "t", [b"m" * 42, b"m" * 35, b"m" * 63]),
        ("append", "t", b"\xe2" * 10, None),
        ("append_many", "t", [b"m" * 66, b"m" * 49, b"m" * 41]),
        ("append", "t", b"\x19" * 300, "x"),
        ("commit", "t", "s", 1),
        ("append", "t", b"\xfb" * 10, None),
        ("append", "t", b"\x0b" * 100, None),
        ("flush_sub", "t", "s"),
    ]
    _relaxed_everywhere(ops, "original CRASH-7 workload 319460074, every point")


def test_BDEV_17_floor_as_new_as_progress_regression() -> None:
    """BDEV-14, BDEV-17, TMB-3 (regression: found by the stateful power-loss rule, hypothesis
    seeds 2 and 5). A memory topic with cap_records=1: appending record 2 evicts record 1 (the
    subscriber's hwm passes it, with a gap), while record 2 is still only in the open page; then
    Subscriber.flush() writes the slot. A crash after that recovers record 1 from the device with
    the hwm 1: the slot used to keep the floor of its last sealed moment (1), so record 1 was
    trimmed silently, though the history had evicted it (a reader lost its tombstone). The floor
    is now always as new as the progress written next to it: record 1 is below it, tombstoned."""
    ops: list[Op] = [
        ("create", "t", {"durability": "memory", "cap_records": 1, "retention": "drop_oldest"}),
        ("subscribe", "t", "s", "earliest"),
        ("append", "t", b"a" * 30, None),
        ("flush",),
        ("append", "t", b"b" * 30, None),
        ("flush_sub", "t", "s"),
    ]
    _relaxed_everywhere(ops, "floor as new as progress (regression), every point")


def test_BDEV_11_drop_and_recreate() -> None:
    """TOP-10, BDEV-11, RING-5: drop writes a new ring id (every old page becomes invalid), the
    next incarnation starts at page 0; a crash at any point leaves one incarnation or the other."""
    ops: list[Op] = [
        ("create", "t", {"durability": "fsync"}),
        ("append", "t", b"old" * 30, None),
        ("append", "t", b"old2", None),
        ("drop", "t"),
        ("create", "t", {"durability": "fsync", "cap_records": 3}),
        ("append", "t", b"new", None),
    ]
    run = RingCrashRun(factory(4, 512), ops)
    n = run.check(every_point(run), torn="garbage")
    assert n > 100
    report("drop + recreate, every point", n)


def test_CRASH_6_four_kib_pages_sampled() -> None:
    """CRASH-1, CRASH-6, DUR-2, DUR-4: 4 KiB pages (8 sectors each) are too many combinations to
    enumerate: a seeded sample of states at every crash point."""
    ops: list[Op] = [
        ("create", "t", {"durability": "fsync"}),
        ("append", "t", b"a" * 3000, None),
        ("append_many", "t", [b"b" * 2000, b"c" * 2500]),
        ("append", "t", b"d", "tag"),
    ]
    run = RingCrashRun(factory(4, 4096), ops)
    n = 0
    for at in every_point(run):
        n += run.check([at], mode="sample", seed=at, limit=12, torn="all")
    assert n > 100
    report("fsync, 4 KiB pages, sampled", n)


def _random_ops(rng: random.Random, n: int) -> list[Op]:
    cls = rng.choice(["fsync", "memory"])
    # caps well inside the 8-page ring: it never overwrites a record live in a durable state
    config: dict[str, Any] = {"durability": cls, "cap_records": rng.choice([2, 3, 5])}
    if rng.random() < 0.5:
        config["trim"] = "none"
    ops: list[Op] = [("create", "t", config)]
    if rng.random() < 0.6:
        ops.append(("subscribe", "t", "s", rng.choice(["earliest", "latest"])))
    for _ in range(n):
        k = rng.random()
        if k < 0.45:
            size = rng.choice([1, 10, 100, 300])
            ops.append(("append", "t", bytes([rng.randrange(256)]) * size, rng.choice([None, "x"])))
        elif k < 0.6:
            ops.append(("append_many", "t", [b"m" * rng.randrange(80) for _ in range(3)]))
        elif k < 0.72:
            ops.append(("commit", "t", "s", rng.randrange(0, 10)))
        elif k < 0.8:
            ops.append(("flush_sub", "t", "s"))
        elif k < 0.9:
            ops.append(("flush",))
        else:
            ops.append(("advance", rng.choice([1, 50])))
    return ops


@pytest.mark.parametrize("workload", range(int(os.environ.get("TIDELOG_CRASH_WORKLOADS", "3"))))
def test_CRASH_7_random_workloads_sampled(workload: int) -> None:
    """CRASH-6, CRASH-7, BDEV-17: seeded random workloads on a small ring (wraps included), a
    seeded sample of states at every crash point. Reproduce with the seed in the assertion."""
    seed = int(os.environ.get("TIDELOG_SEED", "20261122")) + 100 + workload
    rng = random.Random(seed)
    run = RingCrashRun(factory(8, 512), _random_ops(rng, 40))
    per_point = int(os.environ.get("TIDELOG_CRASH_SAMPLES", "4"))
    n = 0
    for at in every_point(run):
        try:
            n += run.check([at], mode="sample", seed=seed + at, limit=per_point, torn="all")
        except AssertionError as exc:
            raise AssertionError(f"[workload seed {seed}, crash point {at}] {exc}") from None
    report(f"random workload seed {seed}", n)
    assert n > 0


def test_TOP_11_BDEV_9_producer_marks_survive_a_torn_overwrite() -> None:
    """TOP-11, BDEV-9, RING-4, FLT-5: producers whose current mark lives only in the oldest
    pages, while a 4-page ring wraps under other appends: at every crash point, in every state
    (torn pages included), each acknowledged producer op is still known, so retrying it with its
    producer id is a no-op. A torn write of the page that replaced the only copy of a mark used
    to lose it (the carried copy went down with the torn page), and the retry appended again."""
    fs = RecordingFS()
    clock = FakeClock(1)
    store = factory(4, 512)(fs, clock)
    t = store.topic("t", durability="fsync", cap_records=3, retention="drop_oldest")
    acked: list[tuple[int, str, int]] = []  # (history length when acknowledged, producer, seq)
    for k in range(12):
        if k in (0, 1, 5):
            t.append_many([b"p" * 40], producer=(f"p{k % 2}", k + 1))
            acked.append((len(fs.history), f"p{k % 2}", k + 1))
        else:
            t.append(bytes([65 + k]) * (60 + k))
    hooks(store, Abandon).abandon()
    n = 0
    for at in range(len(fs.history) + 1):
        for state in fs.crash_states(at=at, torn="garbage"):
            known = {pid: q for when, pid, q in acked if when <= at}
            recovered = factory(4, 512)(state, FakeClock(10**6))
            try:
                rt = recovered.topic("t")
                for pid, q in sorted(known.items()):
                    again = rt.append_many([b"retry"], producer=(pid, q))
                    assert again == [], (state.description, pid, q, again)
            finally:
                recovered.close()
            n += 1
    report("producer marks across torn overwrites, every point", n)
    assert n > 100
