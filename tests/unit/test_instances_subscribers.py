"""Subscribers across instances (spec/INSTANCES.md INST-15..INST-17): one durable subscriber per
instance, polled through the merged read and committed by cursor."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import instances_helpers
import pytest
from instances_helpers import open_in

import tidelog
from tidelog.backends.instances import merged
from tidelog.errors import Backpressure, BadArgument, BadName

opened = instances_helpers.opened  # the fixture


def _open(stores: list[tidelog.Store], root: Path, n: int = 3, **kw: object) -> tidelog.Store:
    return open_in(stores, root, f"instances={n}", **kw)


def _payloads(items: list) -> list[bytes]:  # type: ignore[type-arg]
    return sorted(e.item.payload for e in items)


def test_INST_15_subscribe_registers_in_every_instance(tmp_path: Path, opened: list) -> None:
    """INST-15: the shared file first; the own instance, an instance another store holds (an
    XPR-2 request its maintenance applies) and one nobody holds (the caller applies it,
    XPR-3) all register; an instance that gets the topic later registers it when its writer
    opens the topic; an existing subscriber keeps its start."""
    a, b, c = (_open(opened, tmp_path) for _ in range(3))
    for s, p in ((a, b"a"), (b, b"b"), (c, b"c")):
        s.topic("t").append(p)
    c.close()
    opened.remove(c)  # instance 2: nobody holds it now
    sub = merged(a.topic("t")).subscribe("s", start="latest")
    body = json.loads((tmp_path / "subscribers" / "t" / "s.json").read_bytes())
    assert body == {"start": "latest"}
    assert sub.hwm == "1.1.1"  # latest: each instance's head when it registered
    assert b.topic("t").state().head_seq == 1
    again = merged(b.topic("t")).subscribe("s", start="earliest")
    assert again.hwm == "1.1.1"  # resumed, start kept
    c = _open(opened, tmp_path)  # takes slot 2 again: the subscriber is there
    assert "s" in c._backend.own.subscribers(c.topic("t")._ref)  # type: ignore[attr-defined]
    with pytest.raises(BadArgument):
        merged(a.topic("t")).subscribe("x", start="resume")
    with pytest.raises(BadName):
        merged(a.topic("t")).subscribe("no/slash")


def test_INST_15_an_instance_without_the_topic_registers_later(
    tmp_path: Path, opened: list
) -> None:
    """INST-15: an instance that held no copy of the topic at subscribe registers the
    subscriber (with its start) when its writer first opens the topic."""
    a = _open(opened, tmp_path, 2)
    b = _open(opened, tmp_path, 2)
    a.topic("t").append(b"a1")
    sub = merged(a.topic("t")).subscribe("s")
    assert sub.hwm == "0.0"
    b.topic("t").append(b"b1")  # the topic's first op in instance 1: registers "s" first
    assert _payloads(sub.poll(10).items) == [b"a1", b"b1"]


def test_INST_16_poll_merges_and_keeps_session_positions(tmp_path: Path, opened: list) -> None:
    """INST-16: poll is the merged read from max(session, hwm); a second poll gives only what
    is new; a new handle starts again from the hwms (at least once); wait_ms waits for
    another instance's append."""
    a = _open(opened, tmp_path, 2)
    b = _open(opened, tmp_path, 2)
    ta, tb = a.topic("t"), b.topic("t")
    sub = merged(ta).subscribe("s")
    ta.append_many([b"a1", b"a2"])
    tb.append(b"b1")
    first = sub.poll(2)
    second = sub.poll(10)
    assert _payloads(first.items + second.items) == [b"a1", b"a2", b"b1"]
    assert len(first.items) == 2 and second.cursor == "2.1"
    assert sub.poll(10).items == []
    fresh = merged(tb).subscribe("s")
    assert _payloads(fresh.poll(10).items) == [b"a1", b"a2", b"b1"]  # nothing committed
    timer = threading.Timer(0.1, lambda: tb.append(b"b2"))
    timer.start()
    try:
        late = sub.poll(10, wait_ms=5000)
    finally:
        timer.join()
    assert _payloads(late.items) == [b"b2"]


def test_INST_17_commit_is_durable_in_every_instance(tmp_path: Path, opened: list) -> None:
    """INST-17: commit(cursor) commits each instance's position durably (the own one
    directly, another through a request); after every store closed and reopened a new
    handle polls only what came after; hwm is the vector."""
    a = _open(opened, tmp_path, 2)
    b = _open(opened, tmp_path, 2)
    ta, tb = a.topic("t"), b.topic("t")
    sub = merged(ta).subscribe("s")
    ta.append_many([b"a1", b"a2"])
    tb.append_many([b"b1", b"b2"])
    got = sub.poll(3)
    sub.commit(got.cursor)
    assert sub.hwm == got.cursor
    ta.append(b"a3")
    for s in (a, b):
        s.close()
    opened.clear()
    view = _open(opened, tmp_path, 2, readonly=True)
    rest = merged(view.topic("t")).subscribe("s").poll(10)
    assert _payloads(got.items + rest.items) == [b"a1", b"a2", b"a3", b"b1", b"b2"]
    assert {e.item.payload for e in got.items}.isdisjoint({e.item.payload for e in rest.items})
    with pytest.raises(BadArgument):
        merged(view.topic("t")).subscribe("s").commit("1")
    merged(view.topic("t")).subscribe("s").commit(rest.cursor)  # nobody holds them: hand-off
    assert merged(view.topic("t")).subscribe("s").poll(10).items == []


def test_INST_17_each_instance_holds_records_for_its_subscriber(
    tmp_path: Path, opened: list
) -> None:
    """INST-17, SUB-6, INST-9: under retention=backpressure an instance at its cap share
    refuses to evict what the subscriber has not committed; a commit frees it."""
    a = _open(opened, tmp_path, 2)
    t = a.topic("t", cap_records=4)  # 2 per instance
    sub = merged(t).subscribe("s")
    t.append_many([b"1", b"2"])
    with pytest.raises(Backpressure):
        t.append(b"3")
    sub.commit(sub.poll(10).cursor)
    assert t.append(b"3") == 3
