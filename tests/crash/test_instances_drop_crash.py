"""Power loss at every step of a drop across instances and of the re-create after it
(spec/INSTANCES.md INST-6; CRASH-*): the dropper drops its own copy, applies the request to
an instance no process holds itself (XPR-3) and marks the shared file; after a crash at any
op, reopening shows the topic either live at incarnation 1 with every acknowledged record,
or not existing, or live at incarnation 2 with none of the old records; and a create after a
crash that left it half dropped finishes the drop first (no old record ever comes back)."""

from __future__ import annotations

import json

from test_instances_crash import ROOT, _open, verified

from tidelog.api import Store
from tidelog.backends.instances import merged
from tidelog.conformance.crashfs import RecordingFS
from tidelog.records import Record

OLD = [b"a0", b"a1", b"b0", b"b1"]


def _workload(fs: RecordingFS) -> tuple[int, int, int]:
    """Both instances hold the topic, the second is closed (nobody holds it), the first
    drops the topic and creates it again. Returns the history lengths when the appends had
    returned, when the drop had returned and when the new record was acknowledged."""
    a = _open(fs)
    b = _open(fs)
    a.topic("t", cap_records=10).append_many(OLD[:2])
    b.topic("t").append_many(OLD[2:])
    b.close()
    appended = len(fs.history)
    a.drop_topic("t")
    dropped = len(fs.history)
    a.topic("t", cap_records=20).append(b"new")
    return appended, dropped, len(fs.history)  # no close: a kill right after


def _payloads(store: Store) -> tuple[int, list[bytes]]:
    topic = store.topic("t")
    items = merged(topic).read(None, 100).items
    assert all(isinstance(e.item, Record) for e in items)
    return topic.incarnation, sorted(e.item.payload for e in items if isinstance(e.item, Record))


def _check(state: RecordingFS, appended: bool, dropped: bool, renewed: bool) -> None:
    verified(state)  # INST-23: no copies list a crash leaves is an error
    config = state.tree().get(f"{ROOT}/config/t.json")
    body = None if config is None else json.loads(config)  # whole or absent, never torn
    store = _open(state)  # recovery never fails, whatever the crash left
    try:
        listed = store.topics() == ["t"]
        if body is None or (body["state"] == "live" and body["incarnation"] == 1):
            assert listed == (body is not None), state.description
            assert not dropped, state.description  # a finished drop is durable
            if body is not None:
                g, got = _payloads(store)
                assert g == 1 and set(got) <= set(OLD), state.description
                if appended:
                    assert got == sorted(OLD), state.description
            return
        if body["state"] != "live":
            assert not listed and not renewed, state.description
        g, got = _payloads(store)  # a create here finishes a half drop first
        assert g == 2 and set(got) <= {b"new"}, state.description
        if renewed:
            assert got == [b"new"], state.description
    finally:
        store.close()


def test_INST_6_a_crash_at_any_step_of_a_drop_is_whole_or_not_begun() -> None:
    """INST-6, INST-2, DUR-2, INST-23: after every op of the drop and the re-create, sampled
    disk states a power loss may leave (torn writes included) reopen; the topic is old and
    whole, gone, or new without an old record; a create after a half drop finishes it;
    verify finds no error in any state."""
    fs = RecordingFS(dirs=["/data"])
    appended, dropped, renewed = _workload(fs)
    start = appended - 5
    checked = 0
    for at in range(start, len(fs.history) + 1):
        for state in fs.crash_states(at=at, mode="sample", seed=at, limit=12):
            _check(state, at >= appended, at >= dropped, at >= renewed)
            checked += 1
    assert checked > 400, checked
