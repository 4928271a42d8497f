"""Every I/O call x every fault, for small file:// workloads (spec/SPEC.md FLT-3..FLT-8).

Like the crash suite enumerates crash points (tests/crash/test_file_crash.py), each workload is
run once without faults to list its I/O calls (open, pwrite, pread, truncate, allocate,
fdatasync, fsync, write_out, fsync_dir, rename, unlink, mkdir, map), then once per call and per
fault that applies to it (EIO, ENOSPC, a short write, a failed sync or write-out that drops the
unsynced writes), and
checked as tests/faults/faultrun.py says: only typed io_errors, nothing acknowledged after the
failure, recovery from the durable and the volatile image gives a state the model allows (every
acknowledged fsync op, a prefix of disk ops behind a tombstone, the op that raised whole or
absent, no seq reused), and close releases the lock. The counts are printed (and summed by the
nox sessions from $TIDELOG_FAULT_REPORT).
"""

from __future__ import annotations

from typing import Any

import pytest
from faultrun import OPTIONS, Campaign, Step, Tally

from tidelog.conformance.faultfs import Fault

_K = 20_000

WORKLOADS: dict[str, tuple[list[Step], dict[str, Any]]] = {
    # fsync appends, a checkpoint (segments, snapshot, WAL retirement), close, recovery
    "fsync": (
        [
            ("open",),
            ("create", "t", {"durability": "fsync"}),
            ("append", "t", b"a" * 300, None),
            ("append_many", "t", [b"b" * 200, b"c" * 10]),
            ("checkpoint",),
            ("append", "t", b"d", "tag"),
            ("close",),
            ("open",),
            ("append", "t", b"e" * 100, None),
            ("close",),
        ],
        {**OPTIONS, "write_out_bytes": 64},  # every segment written out (SEG-20)
    ),
    # a disk topic (HEAD_RESERVE, committer-less flush), a subscriber's ack and progress file
    "disk": (
        [
            ("open",),
            ("create", "d", {"durability": "disk", "trim": "acked"}),
            ("subscribe", "d", "s", "earliest"),
            ("append_many", "d", [b"1", b"2", b"3", b"4"]),
            ("append", "d", b"5" * 300, None),
            ("ack", "d", "s", 2),
            ("flush_sub", "d", "s"),
            ("checkpoint",),
            ("append", "d", b"6", None),
            ("flush",),
            ("close",),
            ("open",),
            ("append", "d", b"7", None),
            ("close",),
        ],
        OPTIONS,
    ),
    # 64 KiB WAL files: a rotation, a checkpoint keeping the old file as a spare, a rotation
    # into that spare (WAL-15)
    "rotate": (
        [("open",), ("create", "r", {"durability": "fsync"})]
        + [("append", "r", bytes([65 + i]) * _K, None) for i in range(4)]
        + [("checkpoint",)]
        + [("append", "r", bytes([75 + i]) * _K, None) for i in range(4)]
        + [("close",)],
        OPTIONS,
    ),
    # the second checkpoint seals from the WAL frames (WTAIL-6, WTAIL-7: in the writer through
    # the fault FS; in the seal worker process under the real mechanisms), over a batch whose
    # frame the dead prefix cuts
    "sealwal": (
        [
            ("open",),
            ("create", "t", {"durability": "fsync"}),
            ("create", "d", {"durability": "disk"}),
            ("append_many", "t", [b"a" * 100] * 3),
            ("checkpoint",),
            ("append_many", "t", [b"b%d" % i * 50 for i in range(6)]),
            ("append", "d", b"c" * 300, None),
            ("delete", "t", 6),
            ("checkpoint",),
            ("append", "t", b"e", None),
            ("close",),
            ("open",),
            ("append", "t", b"f" * 10, None),
            ("close",),
        ],
        {**OPTIONS, "seal_worker_bytes": 0, "write_out_bytes": 64},
    ),
    # 4 MiB WAL files: a preallocation refused for room falls back to a smaller one (FLT-8)
    "prealloc": (
        [
            ("open",),
            ("create", "t", {"durability": "fsync"}),
            ("append", "t", b"p" * 100, None),
            ("close",),
            ("open",),
            ("append", "t", b"q" * 100, None),
            ("close",),
        ],
        {**OPTIONS, "wal_file_bytes": "4MiB"},
    ),
}


@pytest.mark.parametrize("name", sorted(WORKLOADS))
def test_FLT_3_FLT_4_FLT_5_every_io_call_every_fault(name: str) -> None:
    """FLT-3 (typed), FLT-4 (poisoned, close releases the lock), FLT-5 (indeterminate op, every
    acknowledged op kept: DUR-2, DUR-3, DUR-6), FLT-8 (preallocation falls back): one fault at
    each I/O call of the workload, each fault kind that applies to the call."""
    steps, options = WORKLOADS[name]
    campaign = Campaign(steps, options)
    tally = Tally()
    for index, fault in campaign.cases():
        campaign.run_case([Fault(fault, at=index)], tally)
    tally.report(f"faults/{name}")
    assert tally.cases == tally.injected > len(campaign.calls)  # every case injected its fault
    assert tally.states >= 3 * tally.cases  # durable image twice, volatile image
    if name == "prealloc":
        assert tally.absorbed >= 2  # ENOSPC on either file's reservation fell back
    tally.check()
