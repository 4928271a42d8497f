"""A topic handle's ``append`` and ``append_many`` (tidelog/api.py ``_appender``,
``_many_appender``): on the engine's backends they are the lanes themselves
(backends/common/lane.py), which hand every record or batch they do not take to the general
path. Whatever path it takes, the result and the errors are the general path's."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import pytest
from lane_helpers import General, count_general, is_many_lane

import tidelog
from tidelog.backends.common.lane import make_lane
from tidelog.errors import BadArgument, BadName, Closed, NoSuchTopic, TooLarge

URIS = ["memory://", "file://{d}/st?commit_interval_ms=60000"]


@pytest.fixture(params=URIS, ids=["memory", "file"])
def store(request: pytest.FixtureRequest, tmp_path: object) -> Iterator[tidelog.Store]:
    uri = request.param.format(d=tmp_path)
    s = tidelog.open(uri + ("&" if "?" in uri else "?") + "max_record_bytes=64")
    yield s
    s.close()


def test_TOP_6_handle_append_is_the_lane_and_falls_back(store: tidelog.Store) -> None:
    """TOP-6, TOP-5: the handle's ``append`` is the engine's lane (one frame per append: a
    closure of lane.py, made once per handle); labelled records, bytes-like payloads that
    are not bytes, and appends on a topic with a router out of it all take the general path
    through it, with the same seqs and records."""
    t = store.topic("t")
    ap = t.append
    assert ap is t.append and ap.__code__ is make_lane(*_lane_args(store)).__code__
    assert ap(b"a") == 1
    assert ap(b"b", tag="x") == 2
    assert ap(bytearray(b"c"), node="n") == 3
    assert ap(memoryview(b"d")) == 4
    store.topic("dest")
    store.router("r", "t", "dest")  # a router out of t: every append is the general one
    assert t.append(b"e") == 5
    got = [(r.seq, r.payload, r.tag, r.node) for r in t.read(0)]
    assert got == [
        (1, b"a", None, None),
        (2, b"b", "x", None),
        (3, b"c", None, "n"),
        (4, b"d", None, None),
        (5, b"e", None, None),
    ]
    assert t.state().count == 5


def _lane_args(store: tidelog.Store) -> tuple:
    e = store._backend
    t = e.topics["t"]
    return e, t, None


def test_ERR_1_lane_refusals_are_the_general_paths(store: tidelog.Store) -> None:
    """ERR-1, TOP-10, DUR-8: through the handle's ``append``, a payload over
    ``max_record_bytes`` raises too_large, one that is not bytes-like bad_argument, an empty tag
    bad_name, an append
    to a dropped topic no_such_topic, and one after the store closed (a handle's ``append``
    bound before) closed; nothing is appended by a refused one."""
    t = store.topic("t")
    ap = t.append
    with pytest.raises(TooLarge):
        ap(bytes(65))
    with pytest.raises(BadArgument):
        ap("text")  # type: ignore[arg-type]
    with pytest.raises(BadName):
        ap(b"x", tag="")
    assert t.state().count == 0 and ap(bytes(64)) == 1
    store.drop_topic("t")
    with pytest.raises(NoSuchTopic):
        ap(b"y")
    u = store.topic("u")
    up = u.append
    store.close()
    with pytest.raises(Closed):
        up(b"z")


def test_BND_9_bundles_topic_append_checks_every_payload(store: tidelog.Store) -> None:
    """BND-9: a topic of bundles has no lane; its handle's ``append`` checks every payload."""
    t = store.topic("b", payload="bundles")
    with pytest.raises(BadArgument):
        t.append(b"not a bundle")
    assert t.state().count == 0


@pytest.fixture
def general(monkeypatch: pytest.MonkeyPatch) -> General:
    return count_general(monkeypatch)


def test_TOP_6_handle_append_many_is_the_batch_lane_and_falls_back(
    store: tidelog.Store, general: General
) -> None:
    """TOP-6, TOP-5, TOP-11: the handle's ``append_many`` is the engine's batch lane (a closure
    of lane.py, made once per handle). A batch of bytes without labels or producer is the
    lane's; labelled batches, a tuple or a generator, bytes-like payloads that are not bytes,
    a producer, an empty list and batches on a topic with a router out of it all take the
    general path through it, with the same seqs and records."""
    t = store.topic("t")
    am = t.append_many
    assert am is t.append_many and is_many_lane(am)
    assert am([b"a", b"b"]) == [1, 2] and general == []
    assert am([b"c"]) == [3] and general == []
    assert am([b"d", b"e"], tag="x") == [4, 5]
    assert am((b"f",)) == [6]
    assert am(p for p in [b"g"]) == [7]
    assert am([bytearray(b"h"), memoryview(b"i")]) == [8, 9]
    assert am([b"j"], producer=("p", 1)) == [10]
    assert am([b"again"], producer=("p", 1)) == []  # TOP-11: already applied
    assert am([]) == []
    # the tagged, tuple, generator and bytes-like batches and both producer batches; the empty
    # list is answered before the backend
    assert len(general) == 6
    store.topic("dest")
    store.router("r", "t", "dest")  # a router out of t: every batch is the general one
    assert am([b"k", b"l"]) == [11, 12] and len(general) == 7
    got = [(r.seq, r.payload, r.tag) for r in t.read(0)]
    assert got == [
        (1, b"a", None), (2, b"b", None), (3, b"c", None), (4, b"d", "x"), (5, b"e", "x"),
        (6, b"f", None), (7, b"g", None), (8, b"h", None), (9, b"i", None), (10, b"j", None),
        (11, b"k", None), (12, b"l", None),
    ]  # fmt: skip
    assert all(type(r.payload) is bytes for r in t.read(0))
    st = t.state()
    assert st.count == 12 and st.bytes == 12
    assert [r.payload for r in store.topic("dest").read(0)] == [b"k", b"l"]


def test_TOP_6_the_batch_lane_keeps_no_hold_on_the_callers_list(store: tidelog.Store) -> None:
    """TOP-6: the records are the payloads the call was given: changing the caller's list once
    the call returned changes no record (a lane that kept the list itself, say as a run to
    frame later, would show the change)."""
    t = store.topic("t")
    batch = [b"a", b"b"]
    assert t.append_many(batch) == [1, 2]
    batch[0] = b"changed"
    batch.append(b"more")
    assert [r.payload for r in t.read(0)] == [b"a", b"b"] and t.state().count == 2


def test_ERR_1_batch_lane_refusals_are_the_general_paths(store: tidelog.Store) -> None:
    """ERR-1, ERR-2, TOP-10, DUR-8: through the handle's ``append_many``, a record over
    ``max_record_bytes`` raises too_large, one payload or text bad_argument, a payload that is
    not bytes-like bad_argument, an empty tag bad_name, a batch to a dropped topic
    no_such_topic, and one after the store closed closed; a refused batch appends nothing."""
    t = store.topic("t")
    am = t.append_many
    with pytest.raises(TooLarge):
        am([b"ok", bytes(65)])
    with pytest.raises(BadArgument):
        am(b"one payload")
    with pytest.raises(BadArgument):
        am("text")
    with pytest.raises(BadArgument):
        am([b"ok", 5])
    with pytest.raises(BadName):
        am([b"x"], tag="")
    assert t.state().count == 0 and am([bytes(64)] * 3) == [1, 2, 3]
    store.drop_topic("t")
    with pytest.raises(NoSuchTopic):
        am([b"y"])
    u = store.topic("u")
    um = u.append_many
    store.close()
    with pytest.raises(Closed):
        um([b"z"])


def test_BND_9_bundles_topic_append_many_checks_every_payload(store: tidelog.Store) -> None:
    """BND-9: a topic of bundles has no batch lane; its handle's ``append_many`` checks every
    payload."""
    t = store.topic("b", payload="bundles")
    assert not is_many_lane(t.append_many)
    with pytest.raises(BadArgument):
        t.append_many([b"not a bundle"])
    assert t.state().count == 0


def test_CON_3_a_waiting_reader_wakes_for_a_lane_batch(store: tidelog.Store) -> None:
    """CON-3: a reader waiting for records wakes when the lane appends a batch (the lane
    notifies as the general path does), long before its wait would run out."""
    t = store.topic("t", durability="fsync")
    got: list[list[int]] = []
    waiting = threading.Event()

    def reader() -> None:
        waiting.set()
        got.append([r.seq for r in t.read(0, wait_ms=60_000)])

    th = threading.Thread(target=reader)
    th.start()
    waiting.wait(10)
    time.sleep(0.05)  # let it reach its wait (an append before that is found at once, too)
    started = time.monotonic()
    assert t.append_many([b"a", b"b"]) == [1, 2]
    th.join(30)
    assert got == [[1, 2]] and time.monotonic() - started < 30
