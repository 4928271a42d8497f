"""Drops, per-seq progress and deletes across instances (spec/INSTANCES.md INST-6, INST-18,
INST-19), in one test process: each open takes its own slot as a process would; a closed
store's slot is an instance no process holds (XPR-3's hand-off)."""

from __future__ import annotations

import json
from pathlib import Path

import instances_helpers
import pytest
from instances_helpers import open_in

import tidelog
from tidelog.backends.instances import InstancesBackend, merged
from tidelog.backends.instances import shared as sharedpart
from tidelog.errors import BadArgument, NoSuchSubscriber, NoSuchTopic, ReadOnly
from tidelog.hooks import hooks
from tidelog.records import Record

opened = instances_helpers.opened  # the fixture


def _open(stores: list[tidelog.Store], root: Path, n: int = 3, **kw: object) -> tidelog.Store:
    return open_in(stores, root, f"instances={n}", **kw)


def _payloads(topic: tidelog.Topic) -> list[tuple[int, bytes]]:
    items = merged(topic).read(None, 1000).items
    return sorted((e.instance, e.item.payload) for e in items if isinstance(e.item, Record))


def _shared_file(root: Path, name: str) -> dict:  # type: ignore[type-arg]
    body: dict = json.loads((root / "config" / f"{name}.json").read_text())  # type: ignore[type-arg]
    return body


def _three_writers(opened: list, root: Path) -> tuple[tidelog.Store, tidelog.Store]:  # type: ignore[type-arg]
    """Slots 0 and 1 held (stores a, b), slot 2 written then closed (held by nobody)."""
    a, b, c = _open(opened, root), _open(opened, root), _open(opened, root)
    for i, s in enumerate((a, b, c)):
        s.topic("t").append_many([f"{i}:{k}".encode() for k in range(3)])
    c.close()
    return a, b


# -- INST-6: drop --------------------------------------------------------------------------
def test_INST_6_drop_reaches_every_instance_and_a_recreate_is_new(
    tmp_path: Path, opened: list
) -> None:
    """INST-6, TOP-10: the dropper's own copy, a copy another store holds (its writer applies
    the request) and one nobody holds (the dropper applies it) all go, with the merged
    subscribers; the shared file says dropped; a re-create is incarnation 2, empty
    everywhere, with its own config; every handle from before raises no_such_topic."""
    a, b = _three_writers(opened, tmp_path)
    ta, tb = a.topic("t"), b.topic("t")
    merged(ta).subscribe("s")
    assert len(_payloads(tb)) == 9
    a.drop_topic("t")
    assert _shared_file(tmp_path, "t")["state"] == "dropped"
    assert _shared_file(tmp_path, "t")["incarnation"] == 1
    assert not (tmp_path / "subscribers" / "t").exists() or not list(
        (tmp_path / "subscribers" / "t").iterdir()
    )
    assert a.topics() == b.topics() == []
    with pytest.raises(NoSuchTopic):
        b.topic("t", create=False)
    for i in range(3):  # no instance keeps a copy
        with tidelog.open(f"file://{tmp_path}/instances/{i}?readonly=true") as view:
            assert view.topics() == []
    t2 = b.topic("t", cap_records=30)  # a new config is allowed: a new topic
    assert t2.incarnation == 2 and _shared_file(tmp_path, "t")["state"] == "live"
    assert t2.append(b"new") == 1
    assert _payloads(a.topic("t")) == [(1, b"new")]
    assert a.topic("t").config.cap_records == 30
    for call in (
        lambda: ta.append(b"x"),
        lambda: tb.append(b"x"),
        lambda: merged(ta).read(),
        lambda: merged(tb).subscribe("s"),
        lambda: ta.state(),
    ):
        with pytest.raises(NoSuchTopic):
            call()
    with pytest.raises(NoSuchTopic):
        a.drop_topic("missing")


def test_INST_6_a_read_only_store_does_not_drop(tmp_path: Path, opened: list) -> None:
    """INST-6: a read-only instances store gets read_only; nothing changes."""
    a = _open(opened, tmp_path, 2)
    a.topic("t").append(b"x")
    ro = _open(opened, tmp_path, 2, readonly=True)
    with pytest.raises(ReadOnly):
        ro.drop_topic("t")
    assert ro.topics() == ["t"] and _payloads(ro.topic("t")) == [(0, b"x")]


def test_INST_6_a_merged_read_never_mixes_incarnations(tmp_path: Path, opened: list) -> None:
    """INST-6: a drop and a re-create between the reads of two instances make the merged read
    no_such_topic (it checks the shared state after reading), never old records of one
    instance beside new ones of another."""
    a, b = _open(opened, tmp_path, 2), _open(opened, tmp_path, 2)
    ta, tb = a.topic("t"), b.topic("t")
    ta.append(b"old-a")
    tb.append(b"old-b")
    backend = hooks(a, InstancesBackend)
    real = backend._ref
    done: list[bool] = []

    def racing(i: int, name: str):  # type: ignore[no-untyped-def]
        if i == 1 and not done:  # instance 0 is read: now b drops, re-creates, appends
            done.append(True)
            b.drop_topic("t")
            b.topic("t").append(b"new-b")
            backend.refresh()
        return real(i, name)

    backend._ref = racing  # type: ignore[method-assign]
    with pytest.raises(NoSuchTopic, match="INST-6"):
        merged(ta).read()
    assert done
    backend._ref = real  # type: ignore[method-assign]
    assert _payloads(a.topic("t")) == [(1, b"new-b")]


def test_INST_6_a_create_finishes_a_drop_a_crash_left(tmp_path: Path, opened: list) -> None:
    """INST-6: a crash after step (1) leaves the topic dropping: it does not exist, and the
    next create drops every instance's old copy before writing incarnation 2."""
    a, b = _three_writers(opened, tmp_path)
    ta = a.topic("t")
    fs = hooks(a, InstancesBackend).fs
    found = sharedpart.read_topic(fs, str(tmp_path), "t")
    assert found is not None
    sharedpart.write_topic(fs, str(tmp_path), "t", found.config, 1, sharedpart.DROPPING)
    assert a.topics() == [] and b.topics() == []
    with pytest.raises(NoSuchTopic):
        merged(ta).read()
    with pytest.raises(NoSuchTopic):
        b.topic("t", create=False)
    t2 = b.topic("t")
    assert t2.incarnation == 2
    assert _payloads(t2) == []  # no old copy survived in any instance
    with pytest.raises(NoSuchTopic):
        ta.append(b"x")


def test_INST_6_a_copy_is_never_made_for_a_dropped_incarnation(
    tmp_path: Path, opened: list
) -> None:
    """INST-6: a store that saw the topic live, then lost a race with a drop before making its
    own copy, makes the copy only under the lock, as the next incarnation: its records are
    never taken for the dropped one's, nor the dropped one's copy for the new one."""
    a, b = _open(opened, tmp_path, 2), _open(opened, tmp_path, 2)
    a.topic("t").append(b"old")
    backend = hooks(b, InstancesBackend)
    real = backend._shared_topic
    done: list[bool] = []

    def racing(name: str):  # type: ignore[no-untyped-def]
        found = real(name)
        if not done:  # b has read "live, incarnation 1": now a drops the topic
            done.append(True)
            a.drop_topic("t")
        return found

    backend._shared_topic = racing  # type: ignore[method-assign]
    tb = b.topic("t")
    backend._shared_topic = real  # type: ignore[method-assign]
    assert done and tb.incarnation == 2
    tb.append(b"from-b")
    ta = a.topic("t")
    assert ta.incarnation == 2
    assert _payloads(ta) == [(1, b"from-b")]


# -- INST-18: per-seq ack and reject -------------------------------------------------------
def test_INST_18_ack_and_reject_reach_the_owning_instance(tmp_path: Path, opened: list) -> None:
    """INST-18: ack/reject by (instance, seq) settle the record in its instance (own, held by
    another store, held by nobody), durably: a new handle polls only what is left."""
    a, b = _three_writers(opened, tmp_path)
    sub = merged(a.topic("t")).subscribe("s")
    items = sub.poll(100).items
    assert len(items) == 9
    keep = [e for e in items if e.item.seq == 3]  # one left unsettled in each instance
    for e in items:
        if e.item.seq == 1:
            assert sub.reject(e.instance, e.item.seq) is True
        elif e.item.seq == 2:
            assert sub.ack(e.instance, e.item.seq) is True
    assert sub.ack(0, 1) is False  # settled already
    again = merged(b.topic("t")).subscribe("s")  # a new handle: from the hwms
    assert sorted((e.instance, e.item.payload) for e in again.poll(100).items) == sorted(
        (e.instance, e.item.payload) for e in keep
    )
    assert again.hwm == "2.2.2"


def test_INST_18_bad_addresses_and_stale_handles(tmp_path: Path, opened: list) -> None:
    """INST-18: an instance outside 0..N-1 or without a copy is bad_argument; a subscriber not
    registered there is no_such_subscriber; a handle from before a drop settles nothing of
    the next incarnation (the request names the copy's incarnation, refused on another)."""
    a, b = _open(opened, tmp_path, 3), _open(opened, tmp_path, 3)
    ta, tb = a.topic("t"), b.topic("t")
    ta.append(b"a")
    tb.append(b"b")
    sub = merged(ta).subscribe("s")
    for bad in (3, -1):
        with pytest.raises(BadArgument):
            sub.ack(bad, 1)
    with pytest.raises(BadArgument, match="no copy"):
        sub.ack(2, 1)  # slot 2 was never opened
    hooks(b, InstancesBackend).own.unregister(  # type: ignore[union-attr]
        hooks(b, InstancesBackend).locals[tb._ref], "s"
    )
    with pytest.raises(NoSuchSubscriber):
        sub.ack(1, 1)
    a.drop_topic("t")
    b.topic("t").append(b"new")
    new = merged(a.topic("t")).subscribe("s")
    with pytest.raises(NoSuchTopic):
        sub.ack(1, 1)
    with pytest.raises(NoSuchTopic):
        sub.commit("1.1.0")
    with pytest.raises(NoSuchTopic):
        sub.hwm  # noqa: B018
    with pytest.raises(NoSuchTopic):
        sub.poll(10)
    assert new.hwm == "0.0.0"
    assert [e.item.payload for e in new.poll(10).items] == [b"new"]


def test_INST_18_a_stale_request_is_refused_by_the_writer(tmp_path: Path, opened: list) -> None:
    """INST-18, XPR-2: a request naming an incarnation other than the copy's is no_such_topic
    and changes nothing."""
    a, b = _open(opened, tmp_path, 2), _open(opened, tmp_path, 2)
    b.topic("t").append(b"x")
    backend = hooks(a, InstancesBackend)
    body = {"op": "delete", "topic": "t", "before_seq": 5, "incarnation": 7}
    result = backend._request(1, body)
    assert result["ok"] is False and result["code"] == "no_such_topic"
    assert _payloads(a.topic("t")) == [(1, b"x")]


# -- INST-19: deletes ----------------------------------------------------------------------
def test_INST_19_tag_deletes_reach_every_instance(tmp_path: Path, opened: list) -> None:
    """INST-19, INST-10: deletes are claimed; a tag or glob delete removes matching records
    in every instance (own, held by another, held by nobody) and returns the total;
    before_seq is bad_argument (a seq of one instance)."""
    a, b, c = _open(opened, tmp_path), _open(opened, tmp_path), _open(opened, tmp_path)
    assert a.capabilities.deletes
    for i, s in enumerate((a, b, c)):
        s.topic("t").append_records([(b"%d-x" % i, "x", None), (b"%d-y" % i, "y1", None)])
    c.close()
    ta = a.topic("t")
    with pytest.raises(BadArgument, match="INST-19"):
        ta.delete(before_seq=2)
    assert ta.delete(tag="x") == 3
    assert [p for _, p in _payloads(ta)] == [b"0-y", b"1-y", b"2-y"]
    assert ta.delete(tag_glob="y*") == 3
    assert _payloads(ta) == [] and ta.delete(tag="x") == 0


def test_INST_19_a_cursor_bounds_the_merged_delete(tmp_path: Path, opened: list) -> None:
    """INST-19, DEL-1: merged delete(before=cursor) removes each instance's records up to its
    position (none where it is 0), intersected with a tag; bad arguments delete nothing."""
    a, b, c = _open(opened, tmp_path), _open(opened, tmp_path), _open(opened, tmp_path)
    for i, s in enumerate((a, b, c)):
        s.topic("t").append_records(
            [(b"%d-%d" % (i, k), "x" if k else "y", None) for k in range(4)]
        )
    m = merged(a.topic("t"))
    with pytest.raises(BadArgument):
        m.delete()
    with pytest.raises(BadArgument):
        m.delete(tag="x", tag_glob="x")
    with pytest.raises(BadArgument):
        m.delete(before="1.2")
    assert m.delete(before="2.0.9", tag="x") == 1 + 3  # instance 0: seq 2; instance 2: 2..4
    assert m.delete(before="1.0.0") == 1
    left = [p for _, p in _payloads(a.topic("t"))]
    assert left == [b"0-2", b"0-3", b"1-0", b"1-1", b"1-2", b"1-3", b"2-0"]
