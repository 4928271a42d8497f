"""Power loss at every step of unregistering a merged subscriber (spec/INSTANCES.md INST-22;
CRASH-*): two instances hold the topic and the subscriber, committed to 1 in each; the second
is closed (nobody holds it: its unregister is handed off, XPR-3) and the first unregisters.
After a crash at any op, reopening both instances and the topic (which registers the shared
part's subscribers, INST-15) shows the subscriber either whole at its old progress (not
begun) or gone: no instance registers it again, and a new subscribe of the name starts anew."""

from __future__ import annotations

import json

import pytest
from test_instances_crash import ROOT, _open, verified

from tidelog.api import Store
from tidelog.backends.instances import InstancesBackend, merged
from tidelog.conformance.crashfs import RecordingFS
from tidelog.errors import NoSuchSubscriber
from tidelog.hooks import hooks
from tidelog.report import INFO, WARNING


def _workload(fs: RecordingFS) -> tuple[int, int]:
    """Returns the history lengths before the unregister began and after it returned."""
    a = _open(fs)
    b = _open(fs)
    a.topic("t").append_many([b"a0", b"a1"])
    b.topic("t").append_many([b"b0", b"b1"])
    b.close()  # no maintenance thread here (crash tests): requests to it are handed off
    merged(a.topic("t")).subscribe("keep")  # holds every record: progress 1.1 is s's own
    sub = merged(a.topic("t")).subscribe("s")
    sub.commit("1.1")
    began = len(fs.history)
    sub.unregister()
    return began, len(fs.history)  # no close: a kill right after


def _registered(store: Store) -> list[str]:
    """The own instance's registrations, as its writer has them."""
    own = hooks(store, InstancesBackend).own
    assert own is not None
    return own.subscribers(own.open_topic("t", {}, False))


def _check(state: RecordingFS, began: bool, done: bool) -> str | None:
    """Checks one state; the severity of verify's INST-23 finding on the subscriber file."""
    raw = state.tree().get(f"{ROOT}/subscribers/t/s.json")
    body = None if raw is None else json.loads(raw)  # whole or absent, never torn
    found = [p for p in verified(state).problems if p.path == f"{ROOT}/subscribers/t/s.json"]
    if body is not None and body.get("state") == "unregistering":  # INST-23
        assert [(p.rule, "field state is unregistering" in p.message) for p in found] == [
            ("INST-23", True)
        ], state.description
    else:
        assert found == [], state.description
    severity = found[0].severity if found else None
    a = _open(state)  # recovery never fails, whatever the crash left
    try:
        a.topic("t")  # INST-15: an open registers what the shared part has
        second = _second(state)
        if body == {"start": "earliest"}:  # not begun
            assert not done, state.description  # a finished unregister is durable
            assert [_registered(a), second] == [["keep", "s"]] * 2, state.description
            assert merged(a.topic("t")).subscribe("s").hwm == "1.1", state.description
            return severity
        assert began, state.description
        if body is None:
            assert [_registered(a), second] == [["keep"]] * 2, state.description
        with pytest.raises(NoSuchSubscriber):
            hooks(a, InstancesBackend).check_subscriber("t", "s")
        fresh = merged(a.topic("t")).subscribe("s", start="latest")  # finishes it first
        assert fresh.hwm == "2.2", state.description  # anew, never the old progress 1.1
        assert [_registered(a), _second(state)] == [["keep", "s"]] * 2, state.description
    finally:
        a.close()
    return severity


def _second(state: RecordingFS) -> list[str]:
    """The second instance's registrations after a holder re-opened the topic there."""
    b = _open(state)
    try:
        b.topic("t")
        return _registered(b)
    finally:
        b.close()


def test_INST_22_a_crash_at_any_step_of_an_unregister_never_resurrects_it() -> None:
    """INST-22, INST-2, DUR-2, INST-23: after every op of the unregister, sampled disk states a
    power loss may leave reopen; the subscriber is whole at its progress or gone, and a
    re-open and a new subscribe never bring the old registration back; verify finds no error
    in any state and reports an `unregistering` file as warning or info."""
    fs = RecordingFS(dirs=["/data"])
    began, done = _workload(fs)
    checked = 0
    severities = set()
    for at in range(began - 3, len(fs.history) + 1):
        for state in fs.crash_states(at=at, mode="sample", seed=at, limit=8):
            severities.add(_check(state, at >= began, at >= done))
            checked += 1
    assert checked > 100, checked
    # INST-23: half done with an instance still registering it, and with none
    assert severities == {None, WARNING, INFO}, severities
