"""How long a change of the shared part waits (spec/INSTANCES.md INST-21), and which instances
a drop or subscribe sends requests to (INST-6): a holder of an instance whose writer never
applies requests (no maintenance thread) makes a drop ``locked`` naming that instance and its
PID within R, another change waiting for ``.shared.lock`` meanwhile is not refused for the
lock but gets the same named error when it finishes the drop itself; a request left behind
never overtakes a later change; instances without a copy are never sent a request."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import instances_helpers
import pytest
from instances_helpers import open_in

import tidelog
from tidelog.backends.instances import InstancesBackend, merged, shared
from tidelog.errors import Locked, NoSuchTopic
from tidelog.fsio import OsFS
from tidelog.hooks import hooks
from tidelog.records import Record

opened = instances_helpers.opened  # the fixture
Q = "instances=3&prealloc=none"
#: a holder of an instance that never applies requests: no maintenance thread
STUCK = Q + "&background=false"


@pytest.fixture
def short_r(monkeypatch: pytest.MonkeyPatch) -> float:
    monkeypatch.setattr(shared, "REQUEST_TIMEOUT_S", 0.6)
    return 0.6


def _payloads(topic: tidelog.Topic) -> list[tuple[int, bytes]]:
    items = merged(topic).read(None, 1000).items
    return sorted((e.instance, e.item.payload) for e in items if isinstance(e.item, Record))


def test_INST_21_a_stuck_holder_makes_the_drop_locked_naming_its_instance(
    tmp_path: Path, opened: list, short_r: float
) -> None:
    """INST-21, INST-6: the drop waits R for instance 1's writer, then is ``locked`` naming
    instance 1 and its holder's PID; the topic is left dropping (gone), and a drop once the
    holder has gone finishes it (XPR-3)."""
    a = open_in(opened, tmp_path, Q)
    stuck = open_in(opened, tmp_path, STUCK)
    a.topic("t").append(b"a")
    stuck.topic("t").append(b"s")
    began = time.monotonic()
    with pytest.raises(Locked, match=rf"instance 1 \(held by pid {os.getpid()}\).*INST-21"):
        a.drop_topic("t")
    assert short_r <= time.monotonic() - began < short_r + 5
    assert a.topics() == []
    assert shared.read_topic(OsFS(), str(tmp_path), "t").state == shared.DROPPING  # type: ignore[union-attr]
    stuck.close()
    a.drop_topic("t")
    with tidelog.open(f"file://{tmp_path}/instances/1?readonly=true") as view:
        assert view.topics() == []


def test_INST_21_a_waiter_for_the_lock_is_not_refused_behind_a_drop_within_its_bound(
    tmp_path: Path, opened: list, short_r: float
) -> None:
    """INST-21: while a drop holds ``.shared.lock`` waiting R on a stuck instance, another
    store's create waits for the lock (W > R) instead of failing with the lock's ``locked``;
    it then finishes the drop itself and gets the error naming the stuck instance."""
    a = open_in(opened, tmp_path, Q)
    stuck = open_in(opened, tmp_path, STUCK)
    c = open_in(opened, tmp_path, Q)
    a.topic("t").append(b"a")
    stuck.topic("t").append(b"s")
    errors: list[BaseException] = []

    def drop() -> None:
        try:
            a.drop_topic("t")
        except BaseException as exc:
            errors.append(exc)

    dropper = threading.Thread(target=drop)
    dropper.start()
    deadline = time.monotonic() + 10
    while shared.read_topic(OsFS(), str(tmp_path), "t").live:  # type: ignore[union-attr]
        assert time.monotonic() < deadline
        time.sleep(0.005)
    with pytest.raises(Locked) as waited:
        c.topic("t")  # waits behind the drop, then finishes it and meets instance 1 itself
    dropper.join(timeout=30)
    assert [type(e) for e in errors] == [Locked]
    assert "instance 1 (held by pid" in str(waited.value)
    assert "shared part" not in str(waited.value)


def test_INST_21_the_lock_waiter_names_a_holder_stuck_outside_requests(
    tmp_path: Path, opened: list, monkeypatch: pytest.MonkeyPatch
) -> None:
    """INST-21: a holder of ``.shared.lock`` that is not waiting on a request and does not
    let go makes a waiter ``locked`` after W = R + margin, naming the holder's PID."""
    a = open_in(opened, tmp_path, Q)
    monkeypatch.setattr(shared, "REQUEST_TIMEOUT_S", 0.2)
    monkeypatch.setattr(shared, "LOCK_MARGIN_S", 0.2)
    with shared.shared_lock(OsFS(), str(tmp_path)):
        began = time.monotonic()
        with pytest.raises(Locked, match=rf"by pid {os.getpid()} for 0.4 s.*INST-21"):
            a.topic("t")
        assert time.monotonic() - began >= 0.4


def test_INST_21_a_request_left_behind_never_overtakes_a_later_change(
    tmp_path: Path, opened: list, short_r: float
) -> None:
    """INST-21: a drop that timed out left its request in instance 1's queue; instance 1's
    own holder then creates the topic again (finishing the drop) and appends: the old
    request, applied at its next tick, does not drop the new incarnation's copy."""
    a = open_in(opened, tmp_path, Q)
    stuck = open_in(opened, tmp_path, STUCK)
    a.topic("t").append(b"a")
    stuck.topic("t").append(b"s")
    with pytest.raises(Locked):
        a.drop_topic("t")
    again = stuck.topic("t")
    assert again.incarnation == 2
    again.append(b"new")
    hooks(stuck, InstancesBackend).own.apply_requests()  # type: ignore[union-attr]
    assert _payloads(again) == [(1, b"new")]


def test_INST_6_requests_go_only_to_instances_listed_with_a_copy(
    tmp_path: Path, opened: list
) -> None:
    """INST-6: the shared file lists the instances that made a copy; a drop and a subscribe
    send no request to an instance not listed (an idle instance is never opened), and the
    list is emptied by the drop."""
    a, b, c = (open_in(opened, tmp_path, Q) for _ in range(3))
    a.topic("t").append(b"a")
    b.topic("u")  # b's instance has a snapshot, but no copy of t
    b.close()
    c.close()
    fs = OsFS()
    assert shared.read_topic(fs, str(tmp_path), "t").copies == (0,)  # type: ignore[union-attr]
    merged(a.topic("t")).subscribe("s")
    a.drop_topic("t")
    for i in (1, 2):
        assert not (tmp_path / "instances" / str(i) / "requests").exists()
    assert shared.read_topic(fs, str(tmp_path), "t").copies == ()  # type: ignore[union-attr]
    b = open_in(opened, tmp_path, Q)
    b.topic("t").append(b"b")
    assert shared.read_topic(fs, str(tmp_path), "t").copies == (1,)  # type: ignore[union-attr]
    a.drop_topic("t")
    with pytest.raises(NoSuchTopic):
        b.topic("t", create=False)
    with tidelog.open(f"file://{tmp_path}/instances/1?readonly=true") as view:
        assert view.topics() == ["u"]


def test_INST_6_a_file_without_copies_reaches_every_instance_with_a_snapshot(
    tmp_path: Path, opened: list
) -> None:
    """INST-6: a shared file written before the list existed means every instance that has a
    snapshot may hold a copy: the drop still reaches them."""
    a, b = (open_in(opened, tmp_path, Q) for _ in range(2))
    a.topic("t").append(b"a")
    b.topic("t").append(b"b")
    b.close()
    fs = OsFS()
    found = shared.read_topic(fs, str(tmp_path), "t")
    assert found is not None
    shared.write_topic(fs, str(tmp_path), "t", found.config, found.incarnation, found.state)
    assert shared.read_topic(fs, str(tmp_path), "t").copies is None  # type: ignore[union-attr]
    a.drop_topic("t")
    with tidelog.open(f"file://{tmp_path}/instances/1?readonly=true") as view:
        assert view.topics() == []
