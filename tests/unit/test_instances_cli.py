"""`tidelog inspect` and `tidelog tail` on a store of several instances (spec/INSTANCES.md
INST-13, INST-14)."""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import sys
import threading
from pathlib import Path

from click.testing import CliRunner

import tidelog
from tidelog.cli import main

WAIT = 30


def _store(tmp_path: Path) -> str:
    """Two instances with records: a1 a2 in instance 0, b1 in instance 1."""
    uri = f"file://{tmp_path / 's'}?instances=2"
    a, b = tidelog.open(uri), tidelog.open(uri)
    try:
        a.topic("ev", cap_records=10).append_many([b"a1", b"a2"])
        b.topic("ev").append(b"b1")
    finally:
        a.close()
        b.close()
    return uri


def _run(*args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(main, list(args))
    return result.exit_code, result.stdout, result.stderr


def test_INST_13_inspect_shows_state_per_instance(tmp_path: Path) -> None:
    """INST-13: inspect --json shows the shared config and the state keyed by instance, and
    the store's per-instance facts; the human form has dotted keys, no reprs."""
    uri = _store(tmp_path)
    code, out, err = _run("inspect", uri, "--json")
    assert code == 0, err
    report = json.loads(out)
    ev = report["topics"]["ev"]
    assert ev["config"]["cap_records"] == 10
    assert ev["state"]["0"]["head_seq"] == 2 and ev["state"]["1"]["head_seq"] == 1
    assert ev["state"]["0"]["cap_fraction"] == 2 / 5
    assert report["describe"]["instances"] == 2 and report["read_only_view"] is True
    assert set(report["describe"]["per_instance"]) == {"0", "1"}
    code, out, _ = _run("inspect", uri)
    assert code == 0 and "0.head_seq" in out and "{'" not in out


def test_INST_14_tail_prints_the_merged_read_and_its_cursor(tmp_path: Path) -> None:
    """INST-14: tail's seq field is INSTANCE:SEQ, --json has "instance"; the cursor to resume
    from goes to stderr and --cursor resumes there; --after on instances and --cursor without
    them are bad_argument."""
    uri = _store(tmp_path)
    code, out, err = _run("tail", uri, "ev", "--limit", "2")
    assert code == 0, err
    lines = out.splitlines()
    assert [line.split("\t")[0] for line in lines] == ["0:1", "0:2"]
    assert err.strip() == "cursor 2.0"
    code, out, err = _run("tail", uri, "ev", "--cursor", "2.0", "--json")
    assert code == 0 and err.strip() == "cursor 2.1"
    [obj] = [json.loads(line) for line in out.splitlines()]
    assert obj["instance"] == 1 and obj["seq"] == 1 and obj["payload_b64"] == "YjE="
    code, _, err = _run("tail", uri, "ev", "--after", "1")
    assert code == 2 and "bad_argument" in err and "INST-14" in err
    tidelog.open(f"file://{tmp_path / 'single'}").close()
    code, _, err = _run("tail", f"file://{tmp_path / 'single'}", "ev", "--cursor", "0")
    assert code == 2 and ("bad_argument" in err or "no_such_topic" in err)


def test_INST_14_tail_follow_shows_every_instance_appends(tmp_path: Path) -> None:
    """INST-14, CLI-4: `tail --follow` (a process) prints what two writers in two instances
    append after it started, each record once; SIGTERM ends it with 0 and the cursor."""
    uri = _store(tmp_path)
    tail = subprocess.Popen(
        [sys.executable, "-m", "tidelog", "tail", uri, "ev", "--follow", "--interval", "0.05"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    lines: queue.Queue[str] = queue.Queue()
    assert tail.stdout is not None and tail.stderr is not None
    stdout = tail.stdout
    threading.Thread(target=lambda: [lines.put(x) for x in stdout], daemon=True).start()

    def take(n: int) -> list[str]:
        return [lines.get(timeout=WAIT).split("\t")[-1].strip() for _ in range(n)]

    try:
        assert sorted(take(3)) == ["a1", "a2", "b1"]
        a, b = tidelog.open(uri), tidelog.open(uri)
        try:
            a.topic("ev").append(b"a3")
            b.topic("ev").append_many([b"b2", b"b3"])
            assert sorted(take(3)) == ["a3", "b2", "b3"]
        finally:
            a.close()
            b.close()
        os.kill(tail.pid, signal.SIGTERM)
        assert tail.wait(timeout=WAIT) == 0
        assert tail.stderr.read().strip() == "cursor 3.3"
        assert lines.empty()
    finally:
        if tail.poll() is None:
            tail.kill()
            tail.wait(timeout=WAIT)
