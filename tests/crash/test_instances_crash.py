"""Power loss while an instances store creates its shared part, a topic's shared config and
appends (spec/INSTANCES.md INST-2, INST-5; CRASH-*): at every sync point, sampled disk states
a crash may leave all reopen, the identity and the config are whole or absent (never torn),
and nothing is read that was not appended; after the last point every acknowledged fsync
record is there."""

from __future__ import annotations

import json

from tidelog import FakeClock
from tidelog.api import Store
from tidelog.backends.instances import merged, open_instances
from tidelog.backends.instances.verify import is_instances_root, verify_instances
from tidelog.conformance.crashfs import RecordingFS
from tidelog.records import Record
from tidelog.report import INFO, Report

ROOT = "/data/s"
OPTIONS = {
    "instances": 2,
    "prealloc": "none",
    "background": False,
    "wal_file_bytes": "64KiB",
    "commit_interval_ms": 60_000,
}
PAYLOADS = [f"r{i}".encode() for i in range(5)]


def _open(fs: RecordingFS) -> Store:
    return Store(open_instances(fs, ROOT, FakeClock(), OPTIONS), f"file://{ROOT}")


def _workload(fs: RecordingFS) -> list[int]:
    """Returns, per payload, the length of the history when its append returned."""
    store = _open(fs)
    topic = store.topic("t", cap_records=10)
    returned = []
    for p in PAYLOADS:
        topic.append(p)
        returned.append(len(fs.history))
    return returned  # no close: the last state is what a kill right after the appends leaves


def verified(state: RecordingFS) -> Report:
    """INST-20, INST-23: ``tidelog verify`` of a crash state, before anything reopens it:
    what a crash leaves is never an error. (Before `instances.json` exists the root is none.)"""
    if not is_instances_root(state, ROOT):
        return Report(ROOT)
    report = verify_instances(state, ROOT)
    assert report.errors == [], (state.description, [str(p) for p in report.errors])
    return report


def _listed_without_copy(report: Report) -> bool:
    return any(p.rule == "INST-23" and p.severity == INFO for p in report.problems)


def _check(state: RecordingFS, acked: list[bytes]) -> bool:
    """Checks one state; whether verify found an instance listed in copies without a copy."""
    listed = _listed_without_copy(verified(state))
    tree = state.tree()
    ident = tree.get(f"{ROOT}/instances.json")
    if ident is not None:
        assert json.loads(ident)["instances"] == 2, state.description
    config = tree.get(f"{ROOT}/config/t.json")
    if config is not None:
        assert json.loads(config)["config"]["cap_records"] == 10, state.description
    store = _open(state)  # recovery never fails, whatever the crash left
    try:
        if config is None:
            assert store.topics() == []
            return listed
        topic = store.topic("t")
        got = [e.item for e in merged(topic).read(None, 100).items]
        assert all(isinstance(r, Record) for r in got)
        payloads = [r.payload for r in got if isinstance(r, Record)]
        assert payloads == PAYLOADS[: len(payloads)], state.description  # nothing invented
        assert payloads[: len(acked)] == acked, state.description  # nothing acked lost
    finally:
        store.close()
    return listed


def test_INST_2_INST_5_a_crash_leaves_the_shared_part_whole_or_absent() -> None:
    """INST-2, INST-5, DUR-2, INST-23: after every op of the workload, every disk state a power
    loss may leave (torn writes included): reopen works, shared files are whole or absent,
    fsync appends acknowledged before the crash survive; verify finds no error in any, and
    the topic listed in `copies` before its copy exists is `info`."""
    fs = RecordingFS(dirs=["/data"])
    returned = _workload(fs)
    points = range(len(fs.history) + 1)
    assert len(points) > 10
    checked = listed = 0
    for at in points:
        acked = [p for p, when in zip(PAYLOADS, returned) if when <= at]
        for state in fs.crash_states(at=at):
            listed += _check(state, acked)
            checked += 1
    assert checked > 300, checked
    assert listed > 0  # INST-23: a crash between the listing and the copy is info, seen
