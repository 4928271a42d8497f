"""`tidelog serve` as a process: its address, health and graceful shutdown (SVC-3, SVC-54,
SVC-57). Every process is killed by PID at the end, whatever happened."""

from __future__ import annotations

import http.client
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import tidelog
from tidelog.records import Record

from .http import Client

WAIT = 30.0


@pytest.fixture
def procs() -> Iterator[list[subprocess.Popen[str]]]:
    started: list[subprocess.Popen[str]] = []
    yield started
    for proc in started:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=WAIT)


def serve(procs: list[subprocess.Popen[str]], tmp: Path, *args: str) -> tuple[Any, str]:
    argv = [sys.executable, "-m", "tidelog", "serve", "--port", "0", *args]
    # cwd: never the checkout, whose ./tidelog folder `-m` would import instead of the package
    proc = subprocess.Popen(argv, cwd=tmp, text=True, stdout=subprocess.PIPE)
    procs.append(proc)
    assert proc.stdout is not None
    line = proc.stdout.readline().strip()
    assert line.startswith("listening on http://127.0.0.1:"), line
    return proc, line.split(" ")[2].removesuffix("/v0")


def test_SVC_3_it_listens_on_loopback_unless_told(
    procs: list[subprocess.Popen[str]], tmp_path: Path
) -> None:
    _, url = serve(procs, tmp_path, "--uri", "memory://")
    assert url.startswith("http://127.0.0.1:")
    status, body = Client(url).get("/v0/health")
    # the pressure is measured (SVC-41: the loop's busy share counts too), so a loaded machine
    # may show some at start; it is a share, never more than 1
    assert (status, body["status"], sorted(body)) == (200, "ok", ["pressure", "status"])
    assert 0.0 <= body["pressure"] <= 1.0


def test_SVC_54_SVC_57_sigterm_drains_ends_streams_and_flushes_the_store(
    procs: list[subprocess.Popen[str]], tmp_path: Path
) -> None:
    """SIGTERM: streams end with `event: shutdown`, a long-poll in flight gets its empty
    answer, the process exits 0, and every acknowledged append is in the store after."""
    uri = f"file://{tmp_path / 'store'}"
    proc, url = serve(procs, tmp_path, "--uri", uri)
    client = Client(url)
    assert client.put("/v0/topics/a", {"durability": "disk"})[0] == 200
    for i in range(50):
        assert client.post("/v0/topics/a/records", raw=b"%d" % i)[0] == 200
    host, port = url.removeprefix("http://").split(":")
    stream = http.client.HTTPConnection(host, int(port), timeout=WAIT)
    stream.request("GET", "/v0/topics/a/events")
    events = stream.getresponse()
    waited: list[object] = []
    poller = Client(url)
    waiter = threading.Thread(
        target=lambda: waited.append(poller.get("/v0/topics/a/records?after=50&wait_ms=25000"))
    )
    waiter.start()
    time.sleep(0.5)
    started = time.monotonic()
    os.kill(proc.pid, signal.SIGTERM)
    body = events.read()  # until the service ends the stream
    waiter.join(WAIT)
    assert proc.wait(timeout=WAIT) == 0
    assert time.monotonic() - started < 20
    assert b"event: shutdown" in body
    assert waited == [(200, {"items": [], "next_after": 50})]
    with tidelog.open(uri) as store:
        items = store.topic("a", create=False).read(0, 100)
        assert [i.payload for i in items if isinstance(i, Record)] == [b"%d" % i for i in range(50)]


def test_SVC_56_CLI_12_every_serve_option_is_in_the_spec() -> None:
    """SVC-56: Each option of `tidelog serve` is a row of CLI-12's table, with the default it
    has."""
    import re

    import click

    from tidelog.cli import main

    spec = (Path(__file__).resolve().parents[2] / "spec" / "CLI.md").read_text()
    table = spec[spec.index("**CLI-12**") :]
    rows = dict(re.findall(r"^\| `(--[a-z-]+)` \| ([^|]+) \|", table, re.MULTILINE))
    command = main.commands["serve"]
    options = [p for p in command.params if isinstance(p, click.Option)]
    assert sorted(rows) == sorted(p.opts[0] for p in options)
    for p in options:
        if isinstance(p.default, int) and not isinstance(p.default, bool):
            assert rows[p.opts[0]].strip() == str(p.default), p.opts[0]


def test_SVC_2_the_receiver_beside_the_api_on_one_listener(
    procs: list[subprocess.Popen[str]], tmp_path: Path
) -> None:
    """SVC-2: With --topic, the receiver's WebSocket paths and the HTTP API share one port; the
    upgrade needs `write` on the topic when there are tokens (401 without one)."""
    import json as jsonlib

    from websockets.exceptions import InvalidStatus
    from websockets.sync.client import connect

    from tidelog.service.auth import hash_token

    tokens = tmp_path / "tokens.json"
    grant = [{"topics": "events", "rights": ["read", "write"]}]
    tokens.write_text(
        jsonlib.dumps({"tokens": [{"name": "w", "sha256": hash_token("s3cret"), "grants": grant}]})
    )
    argv = [
        sys.executable, "-m", "tidelog", "serve", "--port", "0", "--uri",
        f"file://{tmp_path / 'rx'}", "--topic", "events", "--tokens", str(tokens),
    ]  # fmt: skip
    proc = subprocess.Popen(argv, cwd=tmp_path, text=True, stdout=subprocess.PIPE)
    procs.append(proc)
    assert proc.stdout is not None
    ws_line = proc.stdout.readline().strip()
    http_line = proc.stdout.readline().strip()
    assert ws_line.startswith("listening on ws://127.0.0.1:") and "topic=events" in ws_line
    url = http_line.split(" ")[2].removesuffix("/v0")
    port = url.rsplit(":", 1)[1]
    assert ws_line.split(" ")[2] == f"ws://127.0.0.1:{port}/write/v4"
    auth = {"Authorization": "Bearer s3cret"}
    status, body, _ = Client(url).request("GET", "/v0/topics", headers=auth)
    assert (status, body) == (200, {"topics": ["events"]})
    with pytest.raises(InvalidStatus) as refused:
        connect(f"ws://127.0.0.1:{port}/write/v4", open_timeout=10).close()
    assert refused.value.response.status_code == 401
    with connect(f"ws://127.0.0.1:{port}/write/v4", additional_headers=auth, open_timeout=10) as ws:
        assert ws.protocol.state.name == "OPEN"
    os.kill(proc.pid, signal.SIGTERM)
    assert proc.wait(timeout=WAIT) == 0
