"""The conformance suite through tidelog's own driver, across a real process boundary, against
every backend (spec/CONFORMANCE.md §3, §4): ``tidelog conformance driver``
serves memory://, file:// (a directory) and blockdev:// (an image file) and the level runner
drives it from this process with the model as the oracle. Ordinary levels run on real files;
the crash level runs the same backends on the recording FS so a crash is a power loss. Small
example counts here; `python3 run.py conformance` runs long ones with a printed seed."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from conformance_helpers import MUTANTS_FILE, driver_factory

from tidelog.cli_conformance import own_driver_command
from tidelog.conformance.runner import format_report, run_level
from tidelog.conformance.suite import session_seed

FILE_OPTIONS = (
    "background=false&commit_interval_ms=60000&prealloc=none&wal_file_bytes=64KiB"
    "&checkpoint_bytes=4KiB"
    "&segment_max_records=4&head_reserve=3"
)
RING = "size=7168&page_size=512&topic=t0"
# TIDELOG_CONFORMANCE_EXAMPLES raises it (the nox `conformance` session)
EXAMPLES, STEPS = int(os.environ.get("TIDELOG_CONFORMANCE_EXAMPLES", "25")), 30

# backend -> (template on real files, template on the recording FS, {level: expected status})
BACKENDS = {
    "memory": ("memory://{{name}}", None,
               {"log": "pass", "subscribers": "pass", "queue": "pass", "routers": "pass",
                "crash": "n/a", "ring": "pass", "forward": "pass"}),
    "file": ("file://{root}/{{name}}?" + FILE_OPTIONS, "file:///c/{{name}}?" + FILE_OPTIONS,
             {"log": "pass", "subscribers": "pass", "queue": "pass", "routers": "pass",
              "crash": "pass"}),
    # every checkpoint seals from the WAL frames (WTAIL-6): in the seal worker on real files,
    # in the writer on the recording FS
    "file-sealwal": (
        "file://{root}/{{name}}?" + FILE_OPTIONS + "&seal_worker_bytes=0",
        "file:///c/{{name}}?" + FILE_OPTIONS + "&seal_worker_bytes=0",
        {"log": "pass", "subscribers": "pass", "queue": "pass", "routers": "pass",
         "crash": "pass"}),
    "blockdev": ("blockdev://{root}/{{name}}.img?" + RING, "blockdev:///c/{{name}}.img?" + RING,
                 {"log": "pass", "subscribers": "pass", "queue": "n/a", "routers": "n/a",
                  "crash": "pass", "ring": "pass"}),
}
CASES = [(b, level) for b, (_, _, levels) in BACKENDS.items() for level in levels]


@pytest.mark.parametrize(("backend", "level"), CASES, ids=[f"{b}-{lv}" for b, lv in CASES])
def test_backend_through_driver(backend: str, level: str, tmp_path: Path) -> None:
    """CNF-1: each level's verdict for tidelog's own backends, through tidelog's driver
    in a separate process (CNF-13, CNF-24): pass where the capabilities make the level apply
    (CAP, CNF-3), n/a (never a pass) where they do not. The levels exercise the model oracle
    (CNF-2), the runner's clock (CNF-4), ring evictions reported in responses (CNF-5, CNF-19),
    crashes (CNF-6, CNF-7, CNF-20), ring head detection (CNF-8, CNF-21), the forwarder against
    its model (CNF-9, CNF-22), routers (CNF-33) and power loss inside forwarding (CNF-34), and
    every store operation (CNF-16, CNF-17, CNF-18)."""
    on_files, on_recording, expected = BACKENDS[backend]
    if level == "crash" and on_recording is not None:
        factory = driver_factory(on_recording.format(), fs="recording")
    else:
        factory = driver_factory(on_files.format(root=tmp_path))
    seed = session_seed()
    result = run_level(factory, level, examples=EXAMPLES, steps=STEPS, seed=seed)
    assert result.status == expected[level], "\n".join(format_report([result]))
    if result.status == "n/a":
        assert result.examples == 0 and result.detail


def test_run_report_and_replay(tmp_path: Path) -> None:
    """CNF-25, CNF-26, CNF-27: `tidelog conformance run --driver CMD` prints passed levels and,
    for a failure, the shrunk operation sequence with expected vs actual, and writes a replay
    file; `--replay FILE` sends it again and shows the first differing response (exit 1 both
    times)."""
    driver = own_driver_command("reject-after-ack", "os", MUTANTS_FILE)
    run = subprocess.run(
        [sys.executable, "-P", "-m", "tidelog.cli", "conformance", "run", "--driver", driver,
         "--level", "log", "--level", "forward", "--examples", "60", "--seed", str(session_seed()),
         "--shrink-seconds", "5", "--replay-dir", str(tmp_path)],
        capture_output=True, text=True, check=False, timeout=600,
    )
    assert run.returncode == 1, run.stdout + run.stderr
    out = run.stdout
    assert "FAIL log" in out and "PASS forward" in out, out
    assert "shrunk to:" in out and "difference:" in out and "-> {" in out, out
    assert "passed levels: forward" in out, out
    replay_files = list(tmp_path.glob("tidelog-replay-log-*.json"))
    assert len(replay_files) == 1
    requests = json.loads(replay_files[0].read_text())["requests"]
    # the replay holds the ops sent (an append of some kind: the failing example may use any)
    assert any(r["op"] in ("append", "append_many", "append_records") for r in requests)
    again = subprocess.run(
        [sys.executable, "-P", "-m", "tidelog.cli", "conformance", "run",
         "--replay", str(replay_files[0])],
        capture_output=True, text=True, check=False, timeout=300,
    )
    assert again.returncode == 1, again.stdout + again.stderr
    out = again.stdout
    assert "\n!= {" in out and "   expected: {" in out and "   actual:   {" in out, out


def test_driver_speaks_json_lines() -> None:
    """CNF-13, CNF-14, CNF-15, CNF-16, CNF-17, CNF-18, CNF-23: the protocol on the wire
    (spec/CONFORMANCE.md §3): one JSON response per request line, ids echoed, `hello` names
    the protocol, its version and ops, bytes as base64, topics by handle, errors as stable
    codes, bad lines answered rather than fatal."""
    lines = [
        {"id": 1, "op": "hello"},
        {"id": 2, "op": "open", "name": "wire", "now": 1000},
        {"id": 3, "op": "topic", "name": "t0", "create": True, "handle": 1,
         "config": {"cap_records": 1, "discard": "reject"}},
        {"id": 4, "op": "append", "handle": 1, "payload": "aGk="},
        {"id": 5, "op": "append", "handle": 1, "payload": "aGk="},
        {"id": 6, "op": "read", "handle": 1, "after": 0},
        {"id": 7, "op": "no_such_op"},
    ]
    text = "\n".join(json.dumps(x) for x in lines) + "\nnot json\n"
    proc = subprocess.run(
        shlex.split(own_driver_command("memory://{name}")),
        input=text, capture_output=True, text=True, check=True, timeout=60,
    )
    got = [json.loads(line) for line in proc.stdout.splitlines()]
    assert [g["id"] for g in got] == [1, 2, 3, 4, 5, 6, 7, None]
    assert got[0]["value"]["protocol"] == "tidelog-conformance"
    assert got[0]["value"]["version"] == 1 and "ring_head" in got[0]["value"]["ops"]
    assert got[3] == {"id": 4, "ok": True, "value": 1}
    assert got[4]["ok"] is False and got[4]["code"] == "topic_full"
    assert got[5]["value"][0]["payload"] == "aGk=" and got[5]["value"][0]["seq"] == 1
    assert got[6]["code"] == "not_available" and got[7]["code"] == "bad_argument"
