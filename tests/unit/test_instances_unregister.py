"""Unregistering a merged subscriber across instances (spec/INSTANCES.md INST-22): gone from
every instance (one held by another store, one nobody holds) and from the shared part; a
handle of it is no_such_subscriber; no re-open, commit or subscribe brings the old
registration back, even an open that read the subscriber files before the unregister."""

from __future__ import annotations

from pathlib import Path

import instances_helpers
import pytest
from instances_helpers import open_in

import tidelog
from tidelog.backends.instances import MergedSubscriber, merged, shared
from tidelog.errors import NoSuchSubscriber, NoSuchTopic
from tidelog.fsio import OsFS

opened = instances_helpers.opened  # the fixture
Q = "instances=3&prealloc=none"


def _registered(root: Path, i: int) -> list[str]:
    """The subscribers instance ``i`` has for topic ``t`` (a read-only view of it)."""
    with tidelog.open(f"file://{root}/instances/{i}?readonly=true") as view:
        if "t" not in view.topics():
            return []
        return view.topic("t", create=False).subscribers()


def _everywhere(root: Path) -> list[list[str]]:
    return [_registered(root, i) for i in range(3)]


def _three(tmp_path: Path, opened: list) -> tuple[tidelog.Store, tidelog.Store]:
    """Three instances with topic t, each with two records; the third closed (nobody holds
    it); subscriber s registered everywhere and committed to 1 in each."""
    a, b, c = (open_in(opened, tmp_path, Q) for _ in range(3))
    for k, s in enumerate((a, b, c)):
        s.topic("t").append_many([f"{k}:0".encode(), f"{k}:1".encode()])
    c.close()
    sub = merged(a.topic("t")).subscribe("s")
    sub.commit("1.1.1")
    assert _everywhere(tmp_path) == [["s"]] * 3
    return a, b


def test_INST_22_unregister_leaves_every_instance_and_the_shared_part(
    tmp_path: Path, opened: list
) -> None:
    """INST-22: after unregister no instance has the subscriber (the other store's through
    its writer, the closed one handed off), its shared file is gone, and every use of a
    handle is no_such_subscriber; a new subscribe of the name starts anew (INST-15)."""
    a, b = _three(tmp_path, opened)
    old = merged(b.topic("t")).subscribe("s")
    assert old.hwm == "1.1.1"
    merged(a.topic("t")).subscribe("s").unregister()
    assert _everywhere(tmp_path) == [[]] * 3
    assert shared.read_subscribers(OsFS(), str(tmp_path), "t") == {}
    assert not (tmp_path / "subscribers" / "t" / "s.json").exists()
    for use in (lambda: old.poll(5), lambda: old.hwm, lambda: old.commit("2.2.2")):
        with pytest.raises(NoSuchSubscriber, match="INST-22"):
            use()
    with pytest.raises(NoSuchSubscriber):
        old.ack(0, 2)
    with pytest.raises(NoSuchSubscriber):
        old.unregister()
    again = merged(b.topic("t")).subscribe("s", start="latest")
    assert again.hwm == "2.2.2"  # registered anew at each head, never resumed at 1.1.1


def test_INST_22_a_reopen_never_resurrects_it(tmp_path: Path, opened: list) -> None:
    """INST-22, INST-15: every holder closing and re-opening the store and the topic (which
    registers the shared part's subscribers in its instance) leaves the subscriber gone."""
    a, b = _three(tmp_path, opened)
    merged(a.topic("t")).subscribe("s").unregister()
    a.close()
    b.close()
    stores = [open_in(opened, tmp_path, Q) for _ in range(3)]
    for s in stores:
        s.topic("t")  # INST-15: an open registers the shared part's subscribers
    assert _everywhere(tmp_path) == [[]] * 3


def test_INST_22_an_open_that_read_the_files_before_the_unregister_does_not_register(
    tmp_path: Path, opened: list, monkeypatch: pytest.MonkeyPatch
) -> None:
    """INST-22, INST-15: an open's fast path read the subscriber files, then an unregister
    ran before it registered: its registration, made only under the lock from the files read
    again there, does not bring the subscriber back."""
    a, b = _three(tmp_path, opened)
    b.close()  # b's instance forgets its handles: its next open takes the registering path
    registered_before = shared.read_subscribers(OsFS(), str(tmp_path), "t")
    assert registered_before == {"s": "earliest"}
    merged(a.topic("t")).subscribe("s").unregister()
    b = open_in(opened, tmp_path, Q)
    assert _everywhere(tmp_path) == [[]] * 3
    # the race: this open's unlocked read saw the files as they were before the unregister
    stale = iter([registered_before])
    real = shared.read_subscribers

    def first_stale(fs: object, root: str, topic: str) -> dict[str, str]:
        return next(stale, None) or real(fs, root, topic)  # type: ignore[arg-type]

    monkeypatch.setattr(shared, "read_subscribers", first_stale)
    b.topic("t", create=False)
    monkeypatch.undo()
    assert _everywhere(tmp_path) == [[]] * 3


def test_INST_22_an_unfinished_unregister_is_finished_by_the_next_subscribe(
    tmp_path: Path, opened: list
) -> None:
    """INST-22: a crash after step (1) leaves the file unregistering while instances still
    have the registration: the name is no subscriber, and subscribing it again unregisters
    it everywhere first, so it starts anew rather than at the old progress."""
    a, b = _three(tmp_path, opened)
    old = merged(a.topic("t")).subscribe("s")
    fs = OsFS()
    shared.mark_unregistering(fs, str(tmp_path), "t", "s", "earliest")
    assert _everywhere(tmp_path) == [["s"]] * 3  # step (2) not done
    assert shared.unregistering_subscribers(fs, str(tmp_path), "t") == {"s": "earliest"}
    with pytest.raises(NoSuchSubscriber):
        old.poll(5)
    fresh = merged(b.topic("t")).subscribe("s", start="latest")
    assert fresh.hwm == "2.2.2"
    assert _everywhere(tmp_path) == [["s"]] * 3
    assert shared.read_subscribers(fs, str(tmp_path), "t") == {"s": "latest"}


def test_INST_22_unregister_of_a_dropped_topic_or_unknown_name(
    tmp_path: Path, opened: list
) -> None:
    """INST-22: an unknown name is no_such_subscriber; a handle from before a drop is
    no_such_topic."""
    a, _ = _three(tmp_path, opened)
    sub = merged(a.topic("t")).subscribe("s")
    a.drop_topic("t")
    with pytest.raises(NoSuchTopic):
        sub.unregister()
    with pytest.raises(NoSuchSubscriber):
        MergedSubscriber(merged(a.topic("t")), "nobody", "earliest").unregister()
