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
from tidelog.conformance.crashfs import RecordingFS
from tidelog.records import Record

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


def _check(state: RecordingFS, acked: list[bytes]) -> None:
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
            return
        topic = store.topic("t")
        got = [e.item for e in merged(topic).read(None, 100).items]
        assert all(isinstance(r, Record) for r in got)
        payloads = [r.payload for r in got if isinstance(r, Record)]
        assert payloads == PAYLOADS[: len(payloads)], state.description  # nothing invented
        assert payloads[: len(acked)] == acked, state.description  # nothing acked lost
    finally:
        store.close()


def test_INST_2_INST_5_a_crash_leaves_the_shared_part_whole_or_absent() -> None:
    """INST-2, INST-5, DUR-2: after every op of the workload, every disk state a power loss
    may leave (torn writes included): reopen works, shared files are whole or absent, fsync
    appends acknowledged before the crash survive."""
    fs = RecordingFS(dirs=["/data"])
    returned = _workload(fs)
    points = range(len(fs.history) + 1)
    assert len(points) > 10
    checked = 0
    for at in points:
        acked = [p for p, when in zip(PAYLOADS, returned) if when <= at]
        for state in fs.crash_states(at=at):
            _check(state, acked)
            checked += 1
    assert checked > 300, checked
