"""Crash simulation of relocation to a local-directory cold tier (spec/TIERING.md TIER-5,
TIER-6; spec/CRASH.md CRASH-7): a workload whose checkpoints relocate sealed segments runs
once on a RecordingFS holding both tiers, then every disk state a power loss may leave at
every crash point (seeded samples) recovers with every acknowledged record readable exactly
once, as the model has it."""

from __future__ import annotations

from typing import Any

from tidelog.backends.file import open_store
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
    cold="/data/cold",
    hot_retain_segments=1,
    cold_grace_ms=0,
)


def _open(fs: RecordingFS, clock: Clock) -> Any:
    return open_store(fs, "/data/store", clock, **OPTIONS)


def _walk(fs: RecordingFS, path: str) -> list[str]:
    out: list[str] = []
    for name in fs.listdir(path):
        sub = f"{path}/{name}"
        out += _walk(fs, sub) if fs.is_dir(sub) else [sub]
    return out


def test_TIER_6_CRASH_7_relocation_survives_a_crash_at_every_step() -> None:
    """TIER-5, TIER-6, CRASH-7, DUR-2: crash states at every barrier of two relocation passes
    (copy, flip, swap, hot delete, manifest, collection), with torn and reordered writes:
    recovery finds each segment in the tier that survived and every acknowledged fsync
    append is there exactly once."""
    ops: list[Op] = [("create", "t", {"durability": "fsync"})]
    ops += [("append", "t", b"r%02d" % i, None) for i in range(10)]
    ops += [("checkpoint",)]
    ops += [("append", "t", b"s%02d" % i, None) for i in range(4)]
    ops += [("checkpoint",)]
    run = CrashRun(_open, ops)
    topics = [p for p in _walk(run.fs, "/data/cold") if p.endswith(".data")]
    assert len(topics) >= 3  # segments were relocated (and some collected or kept)
    n = 0
    for at in run.fs.checkpoints():
        n += run.check([at], mode="sample", seed=1000 + at, limit=3, torn="all")
    assert n > 50
