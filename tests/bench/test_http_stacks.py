"""The HTTP stack comparison (bench/http_stacks.py) runs end to end in a tiny mode: every
installed stack is started in its own process, measured in every round, checked against the
store (each answered append is in the topic) and stopped by PID; a stack that is not installed
is reported as not measured. Nothing here checks a speed."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from tidelog.bench import http_stacks

TINY = ["--seconds", "0.05", "--rounds", "2", "--events", "20", "--rate", "400"]


def _gone(pid: int) -> bool:
    try:
        Path(f"/proc/{pid}").stat()
    except FileNotFoundError:
        return True
    return False


def test_http_stacks_tiny_run_measures_every_installed_stack(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Each installed stack has a row with every figure of its paths from both rounds (the
    WebSocket-only stack none of HTTP's), the SSE latency of every event, servers gone; the
    table has a line per stack. ``websockets`` is a core dependency, so it always runs."""
    out = tmp_path / "result.json"
    assert http_stacks.main([*TINY, "--json", str(out)]) == 0
    data = json.loads(out.read_text())
    rows = {row["stack"]: row for row in data["rows"]}
    installed = {s for s in http_stacks.STACKS if http_stacks.available(s) is None}
    assert "websockets" in installed
    assert set(rows) == installed
    assert set(data["unavailable"]) == set(http_stacks.STACKS) - installed
    http = ("post_c1", "post_c8")
    for stack, row in rows.items():
        assert len(row["pids"]) == 2 and all(_gone(pid) for pid in row["pids"])
        kinds = ("ws_c1", "ws_c8") if stack == "websockets" else (*http, "ws_c1", "ws_c8")
        for kind in kinds:
            assert len(row["per_round"][f"{kind}_per_s"]) == 2
            assert row[f"{kind}_per_s"] > 0
            assert row[f"{kind}_cpu_us"] >= 0 and not math.isnan(row[f"{kind}_cpu_us"])
        if stack == "websockets":
            assert not any(k.startswith(("post_", "sse_")) for k in row)
            continue
        assert row["sse_events"] == 2 * 20
        assert 0 < row["sse_p50_us"] <= row["sse_p99_us"] <= row["sse_max_us"]
    text = capsys.readouterr().out
    assert "| stack |" in text and f"{data['settings']['loop']}" in text
    for stack in http_stacks.STACKS:
        assert http_stacks.STACKS[stack][1] in text


def test_http_stacks_reports_a_missing_stack_as_not_measured(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A stack whose modules are missing is not started: it is listed with what is missing,
    in the JSON and in the table, and the other stacks still run."""
    monkeypatch.setitem(http_stacks.STACKS, "nope", (("tidelog_no_such_module",), "absent stack"))
    out = tmp_path / "result.json"
    assert http_stacks.main([*TINY, "--rounds", "1", "--stacks", "nope,websockets",
                             "--json", str(out)]) == 0  # fmt: skip
    data = json.loads(out.read_text())
    assert data["unavailable"] == {"nope": "not installed: tidelog_no_such_module"}
    assert [row["stack"] for row in data["rows"]] == ["websockets"]
    assert "| absent stack | not measured: not installed: tidelog_no_such_module |" in (
        capsys.readouterr().out
    )
