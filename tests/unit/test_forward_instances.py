"""Forwarding a topic of an instances store (spec/FORWARD.md FWD-33, spec/INSTANCES.md INST-12):
one sender per instance under ``<client id>.<instance>``, progress a merged subscriber, to a real
receiver; writer processes appending meanwhile; the forwarder SIGKILLed and restarted. Every
process is killed by PID and bounded in time."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from test_forward_unit import conf as unit_conf

import tidelog
from tidelog.backends.instances import merged
from tidelog.errors import BadOption, NotAvailable
from tidelog.forward import Forwarder, Receiver
from tidelog.forward.dedup import forwarded
from tidelog.forward.instances import InstancesForwarder, instance_client_id

WAIT = 60.0
SMALL = "wal_file_bytes=1MiB"  # the 64 MiB default is preallocated per instance


def conf(port: int, **keys: object) -> str:
    return unit_conf(port, **{"sender_id": "edge", **keys})


def src_uri(root: Path, extra: str = "") -> str:
    return f"file://{root}?instances=2&{SMALL}{extra}"


@pytest.fixture
def rx(tmp_path: Path) -> Iterator[Receiver]:
    receiver = Receiver.open(
        f"file://{tmp_path / 'rx'}?{SMALL}", "events", flush_interval_ms=5
    ).start()
    yield receiver
    receiver.stop()


def received(path: Path) -> dict[str, list[tuple[int, bytes]]]:
    """Per client id, its (fsn, payload) pairs in the order the receiver stored them."""
    out: dict[str, list[tuple[int, bytes]]] = {}
    with tidelog.open(f"file://{path}?{SMALL}") as store:
        for client, fsn, rec in forwarded(store.topic("events", create=False)):
            out.setdefault(client, []).append((fsn, rec.payload))
    return out


def test_FWD_33_each_instance_is_sent_under_its_own_client_id(tmp_path: Path, rx: Receiver) -> None:
    """FWD-33, INST-12: a forwarder of a topic of an instances store (opened read-only: the
    writers hold both slots) sends instance i's records under `edge.i` with fsn = seq - 1 of
    that instance; records appended while it runs follow; its progress is the merged
    subscriber `forward`, committed per instance (INST-17)."""
    root = tmp_path / "src"
    a, b = tidelog.open(src_uri(root)), tidelog.open(src_uri(root))
    try:
        ta, tb = a.topic("t", durability="fsync"), b.topic("t")
        for i in range(5):
            ta.append(b"a%d" % i)
        for i in range(3):
            tb.append(b"b%d" % i)
        with tidelog.open(src_uri(root, "&readonly=true")) as view:
            fwd = Forwarder.for_topic(conf(rx.port), view.topic("t", create=False))
            assert isinstance(fwd, InstancesForwarder)
            with fwd:
                with pytest.raises(NotAvailable):
                    fwd.append(b"no")
                assert fwd.wait_acked(timeout=WAIT)
                tb.append(b"b3")
                ta.append(b"a5")
                deadline = time.monotonic() + WAIT
                while fwd.acked != "6.4" and time.monotonic() < deadline:
                    time.sleep(0.01)
                assert fwd.acked == "6.4"
                assert fwd.published_fsn - fwd.acked_fsn == 0
                counters = fwd.counters()
                assert len(counters["instances"]) == 2 and counters["acked_fsn"] == 9
        assert merged(ta).subscribe("forward").hwm == "6.4"  # durable in both instances
    finally:
        a.close()
        b.close()
    rx.stop()
    got = received(tmp_path / "rx")
    assert got == {
        "edge.0": [(i, b"a%d" % i) for i in range(6)],
        "edge.1": [(i, b"b%d" % i) for i in range(4)],
    }


def test_FWD_33_an_instance_first_written_after_the_forwarder_started(
    tmp_path: Path, rx: Receiver
) -> None:
    """FWD-33, INST-3, INST-15: a slot no writer had taken when the forwarder started (no
    instance directory yet) is drained once a writer takes it: its records reach the receiver
    under its client id, and the merged subscriber's position there is committed."""
    root = tmp_path / "src"
    a = tidelog.open(src_uri(root))
    try:
        a.topic("t").append(b"a0")
        assert not (root / "instances" / "1").exists()
        with (
            tidelog.open(src_uri(root, "&readonly=true")) as view,
            Forwarder.for_topic(conf(rx.port), view.topic("t", create=False)) as fwd,
        ):
            assert fwd.wait_acked(timeout=WAIT)
            with tidelog.open(src_uri(root)) as b:
                tb = b.topic("t")
                tb.append_many([b"b0", b"b1"])
                sub = merged(tb).subscribe("forward")
                deadline = time.monotonic() + WAIT
                while sub.hwm != "1.2" and time.monotonic() < deadline:
                    time.sleep(0.01)  # committed by the source's manager after the ack
                assert fwd.acked == "1.2" and sub.hwm == "1.2"
    finally:
        a.close()
    rx.stop()
    assert received(tmp_path / "rx") == {
        "edge.0": [(0, b"a0")],
        "edge.1": [(0, b"b0"), (1, b"b1")],
    }


def test_FWD_33_client_id_with_suffix_is_bounded(tmp_path: Path) -> None:
    """FWD-33, FWD-20: the suffixed client id is still at most 200 bytes, else bad_option
    before anything is registered."""
    assert instance_client_id("edge", 3) == "edge.3"
    with pytest.raises(BadOption, match="FWD-33"):
        instance_client_id("x" * 199, 0)
    root = tmp_path / "src"
    with tidelog.open(src_uri(root)) as store:
        topic = store.topic("t")
        with pytest.raises(BadOption, match="FWD-33"):
            Forwarder.for_topic(conf(9, tidelog_client_id="x" * 199), topic)
        assert not (root / "subscribers").exists() or not list((root / "subscribers").rglob("*"))


WRITER = textwrap.dedent(
    """
    import os, sys, time, tidelog
    uri, tag, count, go = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
    with tidelog.open(uri) as store:  # both writers hold their slots before either appends
        topic = store.topic("t", durability="fsync")
        print("READY", flush=True)
        deadline = time.monotonic() + 60
        while not os.path.exists(go) and time.monotonic() < deadline:
            time.sleep(0.005)
        for i in range(count):
            topic.append(b"%s-%d" % (tag.encode(), i))
            if i % 10 == 0:  # ~0.4 s a writer: the forwarder is killed mid-stream on a busy host
                time.sleep(0.01)
    """
)


def _forward_cmd(port: int, root: Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "tidelog", "forward", conf(port), "--from",
            src_uri(root, "&readonly=true"), "--topic", "t", *extra]  # fmt: skip


def test_FWD_33_two_writer_processes_forwarder_sigkilled_nothing_lost_nothing_twice(
    tmp_path: Path, rx: Receiver
) -> None:
    """FWD-33, FWD-19, FWD-22: two writer processes append while a forwarder process drains
    the topic; the forwarder is SIGKILLed mid-stream and started again with --until-drained:
    the receiver holds every record of both writers exactly once, each instance's in its order
    (its FSNs 0, 1, 2, ...), whatever the kill left uncommitted (replays are de-duplicated)."""
    root, go = tmp_path / "src", tmp_path / "go"
    count = 400
    procs: list[subprocess.Popen[str]] = []
    try:
        for tag in ("p", "q"):
            w = subprocess.Popen(
                [sys.executable, "-c", WRITER, src_uri(root), tag, str(count), str(go)],
                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            )  # fmt: skip
            procs.append(w)
            assert w.stdout is not None and w.stdout.readline().strip() == "READY"
        go.touch()
        first = subprocess.Popen(
            _forward_cmd(rx.port, root), stdout=subprocess.PIPE, stderr=subprocess.PIPE
        )
        procs.append(first)
        deadline = time.monotonic() + WAIT
        while rx.stats["stored"] < 50 and time.monotonic() < deadline:
            time.sleep(0.01)
        os.kill(first.pid, signal.SIGKILL)
        first.wait(timeout=WAIT)
        assert 0 < rx.stats["stored"] < 2 * count  # killed mid-stream
        for w in procs[:2]:
            _, err = w.communicate(timeout=WAIT)
            assert w.returncode == 0, err
        second = subprocess.run(
            _forward_cmd(rx.port, root, "--until-drained", "--timeout", "60"),
            capture_output=True, text=True, timeout=WAIT + 30,
        )  # fmt: skip
        assert second.returncode == 0, second.stderr
        counters = json.loads(second.stdout.strip().splitlines()[-1])
        assert counters["acked_fsn"] == counters["published_fsn"] == 2 * count - 1
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait(timeout=30)
    rx.stop()
    got = received(tmp_path / "rx")
    assert sorted(got) == ["edge.0", "edge.1"]
    tags = set()
    for pairs in got.values():
        assert [fsn for fsn, _ in pairs] == list(range(count))  # once each, in order
        tag = pairs[0][1].split(b"-")[0]
        assert [p for _, p in pairs] == [b"%s-%d" % (tag, i) for i in range(count)]
        tags.add(tag)
    assert tags == {b"p", b"q"}
