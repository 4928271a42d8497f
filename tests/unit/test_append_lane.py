"""A topic handle's ``append`` (tidelog/api.py ``_appender``): on the engine's backends it is the
lane itself (backends/common/lane.py), which hands every record it does not take to the general
path. Whatever path a record takes, the result and the errors are the general path's."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

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
