"""Defects of the router engine and model that the ``routers`` and ``crash`` levels found
(spec/CONFORMANCE.md CNF-33, CNF-34), each as its smallest reproduction, kept as regression
tests: each failed before its fix."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from test_router_crashcheck import open_file_store

import tidelog
from tidelog.clock import FakeClock
from tidelog.conformance.crashcheck import CrashRun, Op
from tidelog.hooks import hooks
from tidelog.model import ModelStore


def _every_point(ops: list[Op], after: int = 0) -> list[str]:
    """The failures of a file:// crash check at every crash point of ``ops`` once ``after`` of
    them were acknowledged."""
    run = CrashRun(open_file_store, ops)
    failures = []
    for at in range(len(run.fs.history) + 1):
        if run.acked_by(at) < after:
            continue
        try:
            run.check([at])
        except AssertionError as exc:
            failures.append(str(exc))
    return failures


def test_RTR_12_RTR_10_dropped_router_stays_dropped_after_power_loss() -> None:
    """RTR-12, RTR-10: file:// logs a router's creation and drop as ROUTER frames of dest's
    shard without syncing them unless dest is ``fsync`` (backends/file/journal.py
    ``router_created``, ``router_dropped``), where TOPIC_CREATE and TOPIC_DROP are synced. A
    power loss right after ``drop_router`` returned brings the router back with its old cursor;
    the model forgets a dropped router's config, so no allowed state has it (and creating a
    router into an ephemeral dest is lost the same way, while the model keeps it)."""
    ops: list[Op] = [
        ("create", "t0", {"durability": "fsync"}),
        ("create", "t1", {"durability": "disk"}),
        ("router", "r0", "t0", "t1", {}),
        ("flush",),
        ("drop_router", "r0"),
    ]
    assert _every_point(ops) == []


def test_RTR_10_DUR_5_cursor_into_ephemeral_dest_after_power_loss() -> None:
    """RTR-10, RTR-11, DUR-5: the model's crash candidates of an ``ephemeral`` topic are its last
    state only (``ModelStore.crash_candidates``), so a router's cursor in an ephemeral dest must
    recover at its newest value; file:// logs the cursor like any non-fsync control frame, and
    a power loss keeps an older one. Recovery then forwards again from it (RTR-10 allows that:
    the ephemeral dest's copies are gone anyway), which no allowed state has."""
    ops: list[Op] = [
        ("create", "t0", {"durability": "disk"}),
        ("create", "t1", {"durability": "ephemeral"}),
        ("router", "r0", "t0", "t1", {}),
        ("flush",),
        ("append", "t0", b"a", None),
        ("flush",),
        ("append", "t0", b"b", None),
    ]
    assert _every_point(ops, after=4) == []  # the router's creation is durable by then


def test_RTR_8_op_on_fsync_dest_sees_copies_its_time_effects_forwarded(tmp_path: Path) -> None:
    """RTR-8, RET-4: a router lags behind a full ``fsync`` dest (RTR-6); the clock passes dest's
    TTL. The next op on dest expires its records at its start, which makes room, and forwards
    (the model does the same). On file:// the copies into the fsync dest become readable only
    once durable, at the end of the op, so that op's result (``state()``) does not show them,
    while the model's does; the next op does."""
    states: dict[str, Any] = {}
    for uri in (f"file://{tmp_path}/s?background=false&commit_interval_ms=60000", "model://r8"):
        clock = FakeClock(1_000_000)
        store = tidelog.open(uri, clock=clock)
        try:
            dest = store.topic("t0", durability="fsync", cap_records=4, ttl_ms=5,
                               discard="reject")  # fmt: skip
            source = store.topic("t1", durability="disk")
            store.router("r0", "t1", "t0")
            dest.append_many([b"a", b"b"])
            source.append_many([b"1", b"2", b"3", b"4"])  # 3 and 4 wait: dest is full
            clock.advance(400)
            states[uri.split(":")[0]] = dest.state()
        finally:
            store.close()
    assert states["file"] == states["model"]


def test_RTR_7_SUB_5_dropping_a_router_releases_its_hold() -> None:
    """RTR-7, RTR-12, SUB-5: a router's cursor holds its source's ``trim="acked"`` trimming; when
    the router is dropped the hold is gone, but neither the model nor the engine settles the
    source again (``ModelStore._drop_router``, ``Routing.apply_drop``): an acknowledged record
    stays, and the model's own SUB-5 invariant fails."""
    store = tidelog.open("model://rtr7", clock=FakeClock(1000))
    try:
        source = store.topic("src", trim="acked")
        dest = store.topic("dst", cap_records=1, discard="reject")
        store.router("r", "src", "dst")
        dest.append(b"x")
        sub = source.subscribe("s", start="earliest")
        source.append(b"1")  # dest is full: the router's cursor stays at 0 (RTR-6)
        sub.ack(1)
        store.drop_router("r")
        hooks(store, ModelStore).check_invariants()
    finally:
        store.close()


def test_RTR_4_copies_are_appended_one_by_one() -> None:
    """RTR-4, RET-2, SUB-5: each copy is one append to dest, as the model makes them. The engine
    appends a run of copies as one batch (``Routing._copy``): into a full ``discard="old"`` dest
    whose subscriber acknowledged a record behind an unresolved one, the batch evicts both
    oldest records at once, where one-by-one appends evict one, which unblocks the hwm, and
    ack-trim removes the other (``evict_floor`` 4 against the model's 3)."""
    states = {}
    for uri in ("memory://rtr4", "model://rtr4"):
        store = tidelog.open(uri, clock=FakeClock(1000))
        try:
            dest = store.topic("t0", cap_records=4, discard="old", retention="drop_oldest",
                               trim="acked")  # fmt: skip
            source = store.topic("t1")
            store.router("r0", "t1", "t0")
            sub = dest.subscribe("s0")
            dest.append_many([b"a", b"b", b"c"])
            sub.ack(3)
            sub.reject(1)  # the hwm stops at 1: seq 2 is unresolved, 3 is acked
            source.append_many([b"1", b"2", b"3", b"4"])
            states[uri.split(":")[0]] = dest.state()
        finally:
            store.close()
    assert states["memory"] == states["model"]


def test_RTR_10_DUR_9_recovered_hwm_holds_back_the_trim_after_forwarding() -> None:
    """RTR-10, RTR-7, SUB-5, DUR-9: a full ``ephemeral`` dest holds its router's cursor below a
    source record whose acks are done; an ack's trim reaches the WAL but file:// keeps
    subscriber progress apart (DUR-9 allows it), so a power loss recovers the subscriber below
    that record. Recovery empties the dest, forwards the record and the router moves on: the
    ack-trim then holds at the recovered hwm and the record stays live. The check compared
    against the candidate's newer hwm, which trims it (``crashcheck._as_observed``)."""
    ephemeral = {"durability": "ephemeral", "cap_records": 1, "retention": "backpressure",
                 "trim": "acked"}
    ops: list[Op] = [
        ("create", "t0", ephemeral),
        ("create", "t1", {"durability": "disk", "retention": "backpressure", "trim": "acked"}),
        ("router", "r0", "t1", "t0", {}),
        ("subscribe", "t0", "s0", "earliest"),
        ("subscribe", "t1", "s1", "resume"),
        ("append_many", "t1", [b"a" * 12, b"b" * 9]),
        ("ack", "t1", "s1", 2),
        ("ack", "t1", "s1", 1),
        ("router", "r1", "t1", "t0", {"filter_tag": "*a", "preserve_tag": False}),
        ("subscribe", "t1", "s0", "latest"),
    ]
    assert _every_point(ops, after=9) == []
