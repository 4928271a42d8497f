"""A forwarded topic dropped and created again (spec/FORWARD.md FWD-34; SPEC TOP-10, INSTANCES
INST-6): the new incarnation's seqs start again at 1, so its FSNs do too; a forwarder started
again with the same sender_id must still get every record of it to a real receiver on
127.0.0.1, none answered as a replay of the old incarnation's frames."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from test_forward_instances import conf as inst_conf
from test_forward_instances import received, src_uri
from test_forward_unit import WAIT, conf, store_uri

import tidelog
from tidelog.errors import BadOption
from tidelog.forward import Forwarder, Receiver
from tidelog.forward.instances import InstancesForwarder
from tidelog.forward.source import topic_client_id


@pytest.fixture
def rx(tmp_path: Path) -> Iterator[Receiver]:
    receiver = Receiver.open(store_uri(tmp_path / "rx"), "events", flush_interval_ms=5).start()
    yield receiver
    receiver.stop()


def _forward(port: int, topic: tidelog.Topic) -> str:
    """Forward ``topic`` under sender_id `edge` until everything is acknowledged; the client
    id the forwarder sent under."""
    with Forwarder.for_topic(conf(port, sender_id="edge"), topic) as fwd:
        assert isinstance(fwd, Forwarder)
        assert fwd.wait_acked(timeout=WAIT)
        assert fwd.last_terminal_error is None
        return fwd.conf.client_id


@pytest.mark.parametrize(("n", "m"), [(3, 5), (5, 3)])
def test_FWD_34_a_recreated_topic_is_forwarded_whole(
    tmp_path: Path, rx: Receiver, n: int, m: int
) -> None:
    """FWD-34, TOP-10: N records forwarded, the topic dropped and created again, M appended, a
    forwarder started again with the same sender_id: the receiver holds all N + M, the new
    incarnation's under a client id of its own, which a forwarder restarted on the same
    incarnation keeps (M > N: before FWD-34 the new incarnation's first N records were
    answered as replays and lost silently; M <= N: halted by FWD-23)."""
    with tidelog.open(store_uri(tmp_path / "src")) as store:
        t = store.topic("t", durability="fsync")
        t.append_many([b"old%d" % i for i in range(n)])
        first = _forward(rx.port, t)
        store.drop_topic("t")
        t = store.topic("t", durability="fsync")
        t.append_many([b"new%d" % i for i in range(m - 1)])
        second = _forward(rx.port, t)
        t.append(b"new%d" % (m - 1))
        assert _forward(rx.port, t) == second  # restarted: the same id, its mark resumes
    rx.stop()
    got = received(tmp_path / "rx")
    payloads = [p for frames in got.values() for _, p in frames]
    assert sorted(payloads) == sorted(
        [b"old%d" % i for i in range(n)] + [b"new%d" % i for i in range(m)]
    )
    assert (first, second) == ("edge", "edge~g2")
    assert got == {
        first: [(i, b"old%d" % i) for i in range(n)],
        second: [(i, b"new%d" % i) for i in range(m)],
    }


def test_FWD_34_instances_store_recreated_topic_is_forwarded_whole(
    tmp_path: Path, rx: Receiver
) -> None:
    """FWD-34, FWD-33, INST-6: on an instances store, a topic forwarded, dropped, created
    again and forwarded again with the same sender_id: every instance's records of both
    incarnations reach the receiver, the new one's under `edge.<instance>~g2`."""
    root = tmp_path / "src"
    a, b = tidelog.open(src_uri(root)), tidelog.open(src_uri(root))
    try:
        ta, tb = a.topic("t", durability="fsync"), b.topic("t")
        ta.append_many([b"a%d" % i for i in range(2)])
        tb.append_many([b"b%d" % i for i in range(2)])
        with Forwarder.for_topic(inst_conf(rx.port), ta) as fwd:
            assert isinstance(fwd, InstancesForwarder)
            assert fwd.wait_acked(timeout=WAIT)
        a.drop_topic("t")
        ta, tb = a.topic("t", durability="fsync"), b.topic("t")
        ta.append_many([b"A%d" % i for i in range(4)])
        tb.append_many([b"B%d" % i for i in range(3)])
        with Forwarder.for_topic(inst_conf(rx.port), ta) as fwd:
            assert fwd.wait_acked(timeout=WAIT)
            assert fwd.last_terminal_error is None
    finally:
        a.close()
        b.close()
    rx.stop()
    assert received(tmp_path / "rx") == {
        "edge.0": [(i, b"a%d" % i) for i in range(2)],
        "edge.1": [(i, b"b%d" % i) for i in range(2)],
        "edge.0~g2": [(i, b"A%d" % i) for i in range(4)],
        "edge.1~g2": [(i, b"B%d" % i) for i in range(3)],
    }


def test_FWD_34_client_id_per_incarnation() -> None:
    """FWD-34: incarnation 1 keeps the client id as it is; a later one gets `~g<incarnation>`,
    and an id that would pass FWD-20's 200 bytes with it is `bad_option`."""
    assert topic_client_id("edge", 1) == "edge"
    assert topic_client_id("edge", 7) == "edge~g7"
    assert topic_client_id("x" * 200, 1) == "x" * 200
    with pytest.raises(BadOption, match="FWD-34"):
        topic_client_id("x" * 197, 12)
