"""`tidelog forward` and `tidelog serve` as a user runs them (spec/CLI.md CLI-8, CLI-9; the
forwarder and receiver themselves are FORWARD.md, tested in test_forward_unit.py). In-process
through click's CliRunner; every socket and receiver is closed by the test."""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

import tidelog
from tidelog.cli import main
from tidelog.forward import Receiver


def run(*args: str, input: str | None = None) -> Result:
    return CliRunner().invoke(main, list(args), input=input)


def conf(port: int, **keys: object) -> str:
    base: dict[str, object] = {
        "addr": f"127.0.0.1:{port}",
        "reconnect_initial_backoff_millis": 1,
        "reconnect_max_backoff_millis": 50,
    }
    base.update(keys)
    return "ws::" + "".join(f"{k}={v};" for k, v in base.items())


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def silent() -> Iterator[int]:
    """A port that accepts TCP connections and never answers the WebSocket handshake."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(16)
        yield int(s.getsockname()[1])


def slot_frames(sf_dir: Path, sender: str) -> list[bytes]:
    with tidelog.open(f"sf://{sf_dir}/{sender}") as slot:
        return [r.payload for r in slot.topic("frames", create=False).read()]


def counters(result: Result) -> dict[str, object]:
    return json.loads(result.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


# -- forward ---------------------------------------------------------------------------------
def test_CLI_8_until_drained_with_nothing_acknowledged_exits_1(tmp_path: Path) -> None:
    """CLI-8: --until-drained that times out with frames unacknowledged is status 1 with one
    stderr line (it was 0); the frames stay in the slot."""
    sf = tmp_path / "sf"
    c = conf(closed_port(), sf_dir=sf, sender_id="edge", initial_connect_retry="async")
    result = run("forward", c, "--stdin", "--until-drained", "--timeout", "1", input="a\nb\n")
    assert result.exit_code == 1, result.output
    assert counters(result)["acked_fsn"] == -1
    assert result.stderr.startswith("tidelog: not drained: 2 frames unacknowledged after 1 s")
    assert f"they stay in {sf / 'edge'}" in result.stderr
    assert slot_frames(sf, "edge") == [b"a", b"b"]


@pytest.mark.parametrize("mode", [None, "on"])
def test_CLI_8_timeout_bounds_connecting(tmp_path: Path, silent: int, mode: str | None) -> None:
    """CLI-8: against a server that never answers the handshake, --timeout 1 ends the command
    in about a second, connecting included (the first connect used to wait its own 10 s, and
    initial_connect_retry=on its whole reconnect budget, before the timeout even started)."""
    keys: dict[str, object] = {"sf_dir": tmp_path / "sf", "sender_id": "edge"}
    if mode is not None:
        keys.update(initial_connect_retry=mode, reconnect_max_duration_millis=30_000)
    began = time.monotonic()
    result = run(
        "forward", conf(silent, **keys), "--stdin", "--until-drained", "--timeout", "1", input="a\n"
    )
    elapsed = time.monotonic() - began
    assert result.exit_code == 1, result.output
    assert "tidelog: not drained: 1 frames unacknowledged after 1 s" in result.stderr
    assert elapsed < 6, elapsed
    assert slot_frames(tmp_path / "sf", "edge") == [b"a"]


def test_CLI_8_stdin_stores_first_while_the_receiver_is_down(tmp_path: Path) -> None:
    """CLI-8: `forward --stdin` with the receiver down stores every line in the slot (it used
    to fail at connect and store nothing); a later forward on the same slot drains them."""
    sf = tmp_path / "sf"
    result = run(
        "forward",
        conf(closed_port(), sf_dir=sf, sender_id="edge"),
        "--stdin",
        "--timeout",
        "0.5",
        input="one\ntwo\nthree\n",
    )
    assert result.exit_code == 0, result.output
    assert counters(result)["published_fsn"] == 2
    assert slot_frames(sf, "edge") == [b"one", b"two", b"three"]
    rx_uri = f"file://{tmp_path / 'rx'}?wal_file_bytes=1MiB"
    receiver = Receiver.open(rx_uri, "events", flush_interval_ms=5).start()
    try:
        c = conf(receiver.port, sf_dir=sf, sender_id="edge")
        result = run("forward", c, "--until-drained", "--timeout", "30")
    finally:
        receiver.stop()
    assert result.exit_code == 0, result.output
    assert counters(result)["acked_fsn"] == 2
    with tidelog.open(rx_uri) as store:
        assert [r.payload for r in store.topic("events").read()] == [b"one", b"two", b"three"]


def test_CLI_8_explicit_off_fails_at_once_and_stores_nothing(tmp_path: Path) -> None:
    """CLI-8: initial_connect_retry=off in the connect string keeps FWD-13's fail-fast
    start: a sender_error (status 2) before any line is read."""
    sf = tmp_path / "sf"
    c = conf(closed_port(), sf_dir=sf, sender_id="edge", initial_connect_retry="off")
    result = run("forward", c, "--stdin", "--timeout", "5", input="one\n")
    assert result.exit_code == 2
    assert "tidelog: error: sender_error:" in result.stderr
    assert slot_frames(sf, "edge") == []


def test_CLI_8_from_creates_neither_store_nor_topic(tmp_path: Path) -> None:
    """CLI-8, CLI-3: --from a missing store is io_error and creates nothing; --from a store
    without the topic is no_such_topic and does not create it."""
    c = conf(closed_port(), sender_id="edge")
    result = run("forward", c, "--from", f"file://{tmp_path}/typo", "--topic", "events")
    assert result.exit_code == 2
    assert result.stderr.startswith("tidelog: error: io_error: no store directory at ")
    assert list(tmp_path.iterdir()) == []
    uri = f"file://{tmp_path / 'app'}?wal_file_bytes=64KiB"
    with tidelog.open(uri) as store:
        store.topic("other")
    result = run("forward", c, "--from", uri, "--topic", "events")
    assert result.exit_code == 2
    assert result.stderr.startswith("tidelog: error: no_such_topic: ")
    with tidelog.open(uri) as store:
        assert store.topics() == ["other"]


# -- serve -----------------------------------------------------------------------------------
def test_CLI_9_serve_on_a_busy_port_creates_nothing(tmp_path: Path) -> None:
    """CLI-9, CLI-2: a port another socket listens on is one io_error line naming host and
    port, status 2, no traceback, and no store created (it used to create the store and then
    print a traceback)."""
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen(1)
        port = busy.getsockname()[1]
        result = run(
            "serve", "--uri", f"file://{tmp_path}/rx", "--topic", "events", "--port", str(port)
        )
    assert result.exit_code == 2
    assert result.stdout == ""
    assert result.stderr.startswith(f"tidelog: error: io_error: cannot listen on 127.0.0.1:{port}")
    assert result.stderr.count("\n") == 1
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    ("args", "code"),
    [
        # --no-auth: past SVC-3's refusal of an open writer on a network, to CLI-9's checks
        (("--host", "no-such-host.invalid", "--no-auth"), "bad_argument"),
        (("--host", "192.0.2.1", "--no-auth"), "io_error"),  # TEST-NET-1: not this host's
        (("--host", "192.0.2.1"), "bad_option"),  # SVC-3: no tokens off loopback
        (("--topic-option", "durability=sometimes"), "bad_option"),
    ],
)
def test_CLI_9_serve_refuses_before_creating_the_store(
    tmp_path: Path, args: tuple[str, ...], code: str
) -> None:
    """CLI-9: a host that does not resolve, an address not on this host or a bad topic option
    is refused with one line before the store exists."""
    uri = f"file://{tmp_path}/rx"
    result = run("serve", "--uri", uri, "--topic", "events", "--port", "0", *args)
    assert result.exit_code == 2, result.output
    assert result.stderr.startswith(f"tidelog: error: {code}: ")
    assert result.stderr.count("\n") == 1
    assert list(tmp_path.iterdir()) == []
