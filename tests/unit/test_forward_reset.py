"""A forwarded topic dropped and created again (spec/FORWARD.md FWD-34, FWD-35; SPEC TOP-10,
INSTANCES INST-6): the new incarnation's seqs start again at 1, so its FSNs do too; a forwarder
started again with the same sender_id must still get every record of it to a real receiver on
127.0.0.1, none answered as a replay of the old incarnation's frames; a forwarder running when
the topic is dropped stops with a terminal error and sends nothing of the new incarnation."""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from test_forward_instances import _forward_cmd, received, src_uri
from test_forward_instances import conf as inst_conf
from test_forward_unit import WAIT, _closed_port, conf, store_uri

import tidelog
from tidelog.errors import BadOption, NoSuchTopic
from tidelog.forward import Forwarder, Receiver, SenderFailed, TopicDropped
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
        ta = _create(a, b)
        with Forwarder.for_topic(inst_conf(rx.port), ta) as fwd:
            assert isinstance(fwd, InstancesForwarder)
            assert fwd.wait_acked(timeout=WAIT)
        ta = _recreate(a, b)
        with Forwarder.for_topic(inst_conf(rx.port), ta) as fwd:
            assert fwd.wait_acked(timeout=WAIT)
            assert fwd.last_terminal_error is None
    finally:
        a.close()
        b.close()
    rx.stop()
    assert received(tmp_path / "rx") == BOTH_INCARNATIONS


def _create(a: tidelog.Store, b: tidelog.Store) -> tidelog.Topic:
    """Topic `t` of an instances store with 2 records in each instance; the topic of ``a``."""
    ta, tb = a.topic("t", durability="fsync"), b.topic("t")
    ta.append_many([b"a%d" % i for i in range(2)])
    tb.append_many([b"b%d" % i for i in range(2)])
    return ta


def _recreate(a: tidelog.Store, b: tidelog.Store) -> tidelog.Topic:
    """Drop topic `t` of an instances store, create it again and append 4 records in instance
    0 (through ``a``) and 3 in instance 1 (through ``b``); the new topic of ``a``."""
    a.drop_topic("t")
    ta, tb = a.topic("t", durability="fsync"), b.topic("t")
    ta.append_many([b"A%d" % i for i in range(4)])
    tb.append_many([b"B%d" % i for i in range(3)])
    return ta


#: what the receiver holds after 2 records per instance, a re-create and `_recreate`'s records
BOTH_INCARNATIONS = {
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


def _stopped(fwd: Forwarder | InstancesForwarder) -> None:
    """Wait (bounded) until the forwarder's I/O loops ended, then check FWD-35's error."""
    end = time.monotonic() + WAIT
    while fwd.running and time.monotonic() < end:
        time.sleep(0.02)
    assert not fwd.running
    error = fwd.last_terminal_error
    assert error is not None and error.code == "no_such_topic"
    assert "topic 't" in error.message and "(incarnation 1) was dropped" in error.message
    assert "FWD-35" in error.message and error.client_id in error.message


def test_FWD_35_a_dropped_topic_stops_its_forwarder(tmp_path: Path, rx: Receiver) -> None:
    """FWD-35, TOP-10: a forwarder idle on a drained topic when the topic is dropped (and
    created again, and appended to) stops: running False, a terminal error of code
    no_such_topic naming topic, incarnation and client id, raised by check_error as
    TopicDropped (a SenderFailed and a NoSuchTopic); close() does not fail on the gone
    subscriber and does not raise it again (FWD-15 guard 2). The receiver holds the first
    incarnation's records under `edge` and nothing else; a forwarder started again sends the
    new one under `edge~g2`. (Before FWD-35 the forwarder kept running with no error.)"""
    with tidelog.open(store_uri(tmp_path / "src")) as store:
        t = store.topic("t", durability="fsync")
        t.append_many([b"old%d" % i for i in range(3)])
        fwd = Forwarder.for_topic(conf(rx.port, sender_id="edge"), t)
        assert isinstance(fwd, Forwarder)
        try:
            assert fwd.wait_acked(timeout=WAIT)
            store.drop_topic("t")
            t = store.topic("t", durability="fsync")
            t.append_many([b"new%d" % i for i in range(5)])
            _stopped(fwd)
            assert fwd.acked_fsn == 2
            with pytest.raises(TopicDropped, match="FWD-35") as caught:
                fwd.check_error()
            assert isinstance(caught.value, SenderFailed)
            assert isinstance(caught.value, NoSuchTopic)
            assert caught.value.code == "no_such_topic"
        finally:
            fwd.close()  # guard 2: check_error raised it already
        assert _forward(rx.port, t) == "edge~g2"
    rx.stop()
    assert received(tmp_path / "rx") == {
        "edge": [(i, b"old%d" % i) for i in range(3)],
        "edge~g2": [(i, b"new%d" % i) for i in range(5)],
    }


def test_FWD_35_dropped_while_sending_what_was_sent_is_acknowledged(
    tmp_path: Path, rx: Receiver
) -> None:
    """FWD-35: the topic dropped right after a batch was appended, the forwarder possibly
    still sending it: it stops with TopicDropped from close() (the safety net), and what the
    receiver stored under `edge` is exactly what the forwarder counts as acknowledged, a
    prefix of the first incarnation, with nothing of the second."""
    with tidelog.open(store_uri(tmp_path / "src")) as store:
        t = store.topic("t", durability="fsync")
        fwd = Forwarder.for_topic(
            conf(rx.port, sender_id="edge", close_flush_timeout_millis=10_000), t
        )
        try:
            t.append_many([b"old%d" % i for i in range(200)])
            store.drop_topic("t")
            store.topic("t").append_many([b"new%d" % i for i in range(300)])
            _stopped(fwd)
            acked = fwd.acked_fsn
        finally:
            with pytest.raises(TopicDropped):
                fwd.close()
    rx.stop()
    got = received(tmp_path / "rx")
    assert got.get("edge", []) == [(i, b"old%d" % i) for i in range(acked + 1)]
    assert set(got) <= {"edge"}


def test_FWD_35_dropped_while_reconnecting(tmp_path: Path) -> None:
    """FWD-35, FWD-12: a forwarder whose receiver is unreachable (initial_connect_retry=async,
    in its reconnect loop) stops at its next connect attempt once the topic is dropped,
    instead of retrying for a topic that is gone."""
    with tidelog.open(store_uri(tmp_path / "src")) as store:
        t = store.topic("t")
        t.append(b"never sent")
        port = _closed_port()
        fwd = Forwarder.for_topic(conf(port, sender_id="edge", initial_connect_retry="async"), t)
        try:
            time.sleep(0.1)
            assert fwd.running and fwd.last_terminal_error is None
            store.drop_topic("t")
            _stopped(fwd)
            assert fwd.acked_fsn == -1
        finally:
            with pytest.raises(TopicDropped):
                fwd.close()


def test_FWD_35_instances_store_dropped_topic_stops_every_instance(
    tmp_path: Path, rx: Receiver
) -> None:
    """FWD-35, FWD-33, INST-6: on an instances store a forwarder running when the topic is
    dropped, created again and appended to in both instances (more records than before, so
    FSNs above the old marks exist) stops in every instance with TopicDropped; nothing of the
    new incarnation goes under `edge.0`/`edge.1` (before FWD-35 instance 0 read the
    re-created copy by name and sent its records above the old mark under `edge.0`); a
    forwarder started again sends it under `edge.<i>~g2`."""
    root = tmp_path / "src"
    a, b = tidelog.open(src_uri(root)), tidelog.open(src_uri(root))
    try:
        ta = _create(a, b)
        fwd = Forwarder.for_topic(inst_conf(rx.port), ta)
        assert isinstance(fwd, InstancesForwarder)
        try:
            assert fwd.wait_acked(timeout=WAIT)
            ta = _recreate(a, b)
            _stopped(fwd)
            for one in fwd.forwarders:
                _stopped(one)
            assert fwd.acked == "2.2"
        finally:
            with pytest.raises(TopicDropped):
                fwd.close()
        with Forwarder.for_topic(inst_conf(rx.port), ta) as again:
            assert again.wait_acked(timeout=WAIT)
    finally:
        a.close()
        b.close()
    rx.stop()
    assert received(tmp_path / "rx") == BOTH_INCARNATIONS


def test_FWD_35_cli_forward_ends_when_its_topic_is_dropped(tmp_path: Path, rx: Receiver) -> None:
    """FWD-35, FWD-2, CLI-2: `tidelog forward --from URI?instances=2&readonly=true --topic t`
    (no --until-drained: it runs until stopped) ends once the topic is dropped: its counters
    with the error, then one `tidelog: error: no_such_topic: ...` line naming FWD-35, exit
    status 2. (Before FWD-35 it kept running.)"""
    root = tmp_path / "src"
    a, b = tidelog.open(src_uri(root)), tidelog.open(src_uri(root))
    try:
        a.topic("t", durability="fsync").append_many([b"a0", b"a1", b"a2"])
        b.topic("t").append(b"b0")
        proc = subprocess.Popen(
            _forward_cmd(rx.port, root), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        try:
            deadline = time.monotonic() + WAIT
            while rx.stats["stored"] < 4 and time.monotonic() < deadline:
                time.sleep(0.01)
            assert rx.stats["stored"] == 4  # both instances' forwarders are connected
            a.drop_topic("t")
            out, err = proc.communicate(timeout=WAIT)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait(timeout=30)
    finally:
        a.close()
        b.close()
    assert proc.returncode == 2, err
    last = err.strip().splitlines()[-1]  # after the default handler's log lines (FWD-10)
    assert last.startswith("tidelog: error: no_such_topic:") and "FWD-35" in last, err
    assert out.strip(), err
    counters = json.loads(out.strip().splitlines()[-1])
    assert "FWD-35" in counters["last_terminal_error"] and counters["acked_fsn"] == 3
