"""The crash check of routed topics (tidelog.conformance.crashcheck, CNF-6, CNF-34) against
tidelog's file backend: states the spec allows are accepted and a planted defect is not."""

from __future__ import annotations

from typing import Any

from tidelog.clock import Clock
from tidelog.conformance.crashcheck import CrashRun, Op
from tidelog.conformance.crashfs import RecordingFS
from tidelog.conformance.sut import FS_OPENERS, durable_dirs

OPTIONS = {
    "background": "false", "commit_interval_ms": "60000", "prealloc": "none",
    "wal_file_bytes": "64KiB", "head_reserve": "3",
}  # fmt: skip


def open_file_store(fs: RecordingFS, clock: Clock) -> Any:
    durable_dirs(fs, "/c")
    return FS_OPENERS["file"](fs, "/c/s", clock, **OPTIONS)


def test_RTR_10_DUR_3_raised_dest_head_then_forwarded_loss() -> None:
    """RTR-10, RTR-11, RTR-5, DUR-3, CNF-6: a router between two ``disk`` topics; a power loss
    takes the second append and its copy. Recovery raises both heads over their reserved seqs
    (DUR-3: a tombstone each) and then forwards the source's loss range into dest after dest's
    own (RTR-5): dest's head is its reserved ceiling plus the forwarded range. The check must
    accept that: the raise of a dest is its head minus what recovery forwarded into it; and
    the append after recovery that checks seq reuse (CRASH-7) expects dest's head once the
    append to the source has forwarded into it."""
    ops: list[Op] = [
        ("create", "t0", {"durability": "disk"}),
        ("create", "t1", {"durability": "disk"}),
        ("router", "r0", "t0", "t1", {}),
        ("append", "t0", b"a", None),
        ("append", "t0", b"bb", None),
    ]
    run = CrashRun(open_file_store, ops)
    assert run.check(None, mode="sample", seed=7, limit=20) > 0


def test_RTR_10_DUR_1_second_recovery_is_a_restart_of_the_first() -> None:
    """RTR-10, DUR-1, DUR-5, CNF-34: an ephemeral dest full of copies (the router lags, RTR-6)
    loses them in a power loss; recovery makes room, so the router forwards the next source
    record into it. Closing and opening that store again is a clean restart: the ephemeral dest
    drops that copy (DUR-1) and the router forwards the one after. Recovering twice must be
    judged against the model of the first recovery after a restart, not by equality."""
    ops: list[Op] = [
        ("create", "src", {"durability": "fsync"}),
        ("create", "dst", {"durability": "ephemeral", "cap_records": 1, "discard": "reject"}),
        ("router", "r0", "src", "dst", {}),
        ("flush",),
        ("append_many", "src", [b"1", b"2", b"3"]),
        ("flush",),
    ]
    run = CrashRun(open_file_store, ops)
    assert run.check([len(run.fs.history)]) > 0


def test_RTR_5_DUR_3_forwarded_loss_range_then_raised_head() -> None:
    """RTR-5, DUR-3, CNF-34: dest's newest seq is a loss range the router forwarded (the source's
    records expired before dest had room); a power loss then makes recovery raise dest's head
    over its reserved seqs, a second range right after it. The two stay separate ranges in the
    backend; the check must not require them merged (nor split)."""
    ops: list[Op] = [
        ("create", "src", {"durability": "fsync", "cap_records": 2, "ttl_ms": 60}),
        ("create", "dst", {"durability": "disk", "cap_records": 1, "discard": "reject"}),
        ("router", "r0", "src", "dst", {}),
        ("append", "src", b"1", None),
        ("append", "src", b"2", None),  # dst is full: the router lags (RTR-6)
        ("advance", 60),
        ("append", "src", b"3" * 40, None),  # 2 expired first: a loss range in dst (RTR-5)
    ]
    run = CrashRun(open_file_store, ops)
    assert run.check(list(range(len(run.fs.history) + 1))) > 0
