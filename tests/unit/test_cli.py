"""The `tidelog` CLI (tidelog.cli), driven in-process through click's CliRunner.

Named memory stores (`memory://NAME`) are process-global, so a test fills one through the API,
closes it, and lets the CLI reopen it (a second concurrent open would raise `locked`).
"""

from __future__ import annotations

import _thread
import base64
import json
import re
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

import tidelog
import tidelog.cli
from tidelog import registry
from tidelog.backends import memory
from tidelog.cli import main


@pytest.fixture
def uri() -> Iterator[str]:
    name = f"clitest-{uuid.uuid4().hex[:12]}"
    yield f"memory://{name}"
    memory.forget(name)


def run(*args: str, input: str | None = None) -> Result:
    return CliRunner().invoke(main, list(args), input=input)


def no_traceback(result: Result) -> None:
    assert "Traceback" not in result.output
    assert result.exception is None or isinstance(result.exception, SystemExit)


def populate(uri: str) -> None:
    """Topic `events`: 5 records, subscriber `exporter` acked through seq 2; topic `empty`."""
    with tidelog.open(uri) as store:
        events = store.topic("events", durability="memory", cap_records=100, trim="none")
        sub = events.subscribe("exporter", start="earliest")
        events.append_many([b"one", b"two", b"three"], tag="sensor-1")
        events.append_many([b"four", b"five"], tag="sensor-2")
        sub.commit(2)
        store.topic("empty")


# -- inspect ---------------------------------------------------------------------------------
def test_inspect_prints_topics_state_config_and_subscribers(uri: str) -> None:
    """Human output names every topic, its state (TOP-2), config and subscriber lag (SUB-2)."""
    populate(uri)
    result = run("inspect", uri)
    assert result.exit_code == 0, result.output
    out = result.output
    assert "topic events" in out and "topic empty" in out
    assert re.search(r"head_seq\s+5\b", out)
    assert re.search(r"cap_records\s+100\b", out)
    assert re.search(r"durability\s+memory\b", out)
    assert re.search(r"exporter\s+2\s+3\b", out)  # hwm 2, lag 5 - 2
    assert "capabilities" in out and re.search(r"persistent\s+no\b", out)
    assert "no subscribers" in out  # the `empty` topic


def test_inspect_json_has_stable_keys_and_numbers(uri: str) -> None:
    """--json: state is TopicState (TOP-3), subscribers carry hwm and lag (SUB-2), caps (CAP-1)."""
    populate(uri)
    result = run("inspect", uri, "--json")
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert set(report) == {"uri", "read_only_view", "capabilities", "describe", "topics", "routers"}
    assert report["read_only_view"] is False  # memory:// has no read-only view (CLI-3)
    assert report["uri"] == uri
    assert sorted(report["topics"]) == ["empty", "events"]
    events = report["topics"]["events"]
    assert events["state"] == {
        "head_seq": 5,
        "earliest_seq": 1,
        "evict_floor": 1,
        "count": 5,
        "bytes": len(b"onetwothreefourfive"),
    }
    assert events["config"]["cap_records"] == 100
    assert events["config"]["durability"] == "memory"
    assert events["config"]["ttl_ms"] is None
    assert events["subscribers"] == {"exporter": {"hwm": 2, "lag": 3}}
    assert report["topics"]["empty"]["state"]["head_seq"] == 0
    assert report["capabilities"]["persistent"] is False
    assert report["capabilities"]["durability"] == ["disk", "ephemeral", "fsync", "memory"]
    assert report["describe"]["backend"] == "memory"


def test_inspect_one_topic_and_missing_topic(uri: str) -> None:
    """--topic limits the report; a missing topic is no_such_topic (ERR-1) and is not created."""
    populate(uri)
    result = run("inspect", uri, "--topic", "events", "--json")
    assert result.exit_code == 0, result.output
    assert list(json.loads(result.stdout)["topics"]) == ["events"]
    result = run("inspect", uri, "--topic", "nope")
    assert result.exit_code == 2
    assert "no_such_topic" in result.output
    no_traceback(result)
    with tidelog.open(uri) as store:
        assert "nope" not in store.topics()


@pytest.mark.parametrize(
    ("bad_uri", "code"),
    [
        ("not-a-uri", "bad_uri"),
        ("memory://x#frag", "bad_uri"),
        ("nosuchscheme://x", "unknown_scheme"),
        ("file://", "bad_uri"),
        ("file:///tmp/tidelog-cli-test?wal_shards=0", "bad_option"),
        ("blockdev:///nonexistent-tidelog-dir/tidelog-cli-test.img", "io_error"),  # CLI-3
        ("memory://?bogus=1", "bad_option"),
        ("memory://../x", "bad_name"),
    ],
)
def test_errors_exit_2_with_code_and_no_traceback(bad_uri: str, code: str) -> None:
    """ERR-1: a TidelogError is one line with its stable code, exit status 2 (URI-1, URI-2)."""
    result = run("inspect", bad_uri)
    assert result.exit_code == 2
    assert f"error: {code}:" in result.output
    assert len(result.stderr.strip().splitlines()) == 1
    no_traceback(result)


def test_usage_errors_are_clicks() -> None:
    assert run("frobnicate").exit_code == 2
    assert run("inspect").exit_code == 2  # missing URI
    assert run("tail", "memory://", "t", "--limit", "0").exit_code == 2


# -- append / tail ---------------------------------------------------------------------------
def test_append_then_tail_round_trips(uri: str) -> None:
    """TOP-5: payload, tag and node come back as appended; seqs are consecutive (TOP-1)."""
    result = run(
        "append",
        uri,
        "events",
        "--tag",
        "sensor-7",
        "--node",
        "gw-1",
        "--durability",
        "memory",
        "hello",
        "wörld",
    )
    assert result.exit_code == 0, result.output
    assert result.stdout.split() == ["1", "2"]
    result = run("append", uri, "events", input="line one\nline\ttwo\n")
    assert result.exit_code == 0, result.output
    assert result.stdout.split() == ["3", "4"]

    result = run("tail", uri, "events")
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert len(lines) == 4
    assert lines[0].split("\t")[0] == "1"
    assert lines[0].split("\t")[2:] == ["sensor-7", "gw-1", "hello"]
    assert lines[1].endswith("\twörld")
    assert lines[3].split("\t")[2:4] == ["-", "-"]

    result = run("tail", uri, "events", "--json", "--after", "1", "--limit", "2")
    assert result.exit_code == 0, result.output
    items = [json.loads(line) for line in result.stdout.splitlines()]
    assert [i["seq"] for i in items] == [2, 3]
    assert base64.b64decode(items[0]["payload_b64"]) == "wörld".encode()
    assert items[0]["tag"] == "sensor-7" and items[0]["node"] == "gw-1"
    assert base64.b64decode(items[1]["payload_b64"]) == b"line one"
    assert items[1]["tag"] is None
    assert isinstance(items[0]["ts"], int)


def test_append_config_mismatch_is_an_error(uri: str) -> None:
    """TOP-9: an existing topic's durability must match; config_mismatch, nothing appended."""
    assert run("append", uri, "t", "--durability", "memory", "x").exit_code == 0
    result = run("append", uri, "t", "--durability", "fsync", "y")
    assert result.exit_code == 2
    assert "config_mismatch" in result.output
    no_traceback(result)
    assert run("tail", uri, "t").stdout.count("\n") == 1


def test_tail_shows_tombstone_for_evicted_records(uri: str) -> None:
    """TMB-1: after cap eviction, a read from 0 starts with Tombstone(1, evict_floor - 1)."""
    with tidelog.open(uri) as store:
        store.topic("capped", cap_records=2)
    for payload in ("a", "b", "c", "d", "e"):
        assert run("append", uri, "capped", "--tag", "t", payload).exit_code == 0
    result = run("tail", uri, "capped", "--after", "0")
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert lines[0].startswith("TOMBSTONE gap 1..3")
    assert [line.split("\t")[0] for line in lines[1:]] == ["4", "5"]
    assert [line.split("\t")[-1] for line in lines[1:]] == ["d", "e"]

    result = run("tail", uri, "capped", "--json")
    first = json.loads(result.stdout.splitlines()[0])
    assert first == {"type": "tombstone", "gap_from": 1, "gap_to": 3}
    # TMB-5: a tombstone counts as one item against --limit.
    assert len(run("tail", uri, "capped", "--limit", "2").stdout.splitlines()) == 2


def test_tail_escapes_binary_and_newlines(uri: str) -> None:
    """Human tail keeps one record per line; bad utf-8 shows as backslash escapes."""
    with tidelog.open(uri) as store:
        store.topic("bin").append(b"a\nb\xff")
    result = run("tail", uri, "bin")
    assert result.exit_code == 0, result.output
    assert result.stdout.splitlines()[0].endswith("\ta\\nb\\xff")


def test_tail_missing_topic_is_no_such_topic(uri: str) -> None:
    """tail never creates a topic: a missing one is no_such_topic (ERR-1)."""
    result = run("tail", uri, "ghost")
    assert result.exit_code == 2 and "no_such_topic" in result.output
    no_traceback(result)


def test_tail_follow_sees_later_appends() -> None:
    """--follow keeps polling past head_seq (TOP-8) and prints records appended meanwhile."""
    backend = memory.open_backend(tidelog.parse_uri("memory://"), {}, tidelog.SystemClock())
    scheme = f"clishared{uuid.uuid4().hex[:8]}"
    registry.register(scheme, lambda uri, options, clock: backend)  # CLI and test share it
    store = tidelog.Store(backend, f"{scheme}://")
    store.topic("live").append(b"first")
    finished = threading.Event()

    def producer() -> None:
        time.sleep(0.05)
        store.topic("live").append_many([b"second", b"third"])
        if not finished.wait(10):  # a stuck follow loop ends like Ctrl-C, and the test fails
            _thread.interrupt_main()

    thread = threading.Thread(target=producer, daemon=True)
    thread.start()
    try:
        result = run(
            "tail", f"{scheme}://", "live", "--follow", "--interval", "0.01", "--limit", "3"
        )
    finally:
        finished.set()
        thread.join()
        registry.unregister(scheme)
    assert result.exit_code == 0, result.output
    assert [line.split("\t")[-1] for line in result.stdout.splitlines()] == [
        "first",
        "second",
        "third",
    ]


# -- demo ------------------------------------------------------------------------------------
def summary_value(output: str, key: str) -> str:
    match = re.search(rf"^\s+{re.escape(key)}\s+(.+?)\s*$", output, re.MULTILINE)
    assert match, f"{key!r} missing from:\n{output}"
    return match.group(1)


def test_demo_small_run_verifies_exactly_once() -> None:
    """The demo pipeline: backpressure (SUB-6) loses nothing, no tombstone (TMB-3), and
    trim="acked" leaves count 0 once the subscriber committed everything (SUB-5)."""
    start = time.perf_counter()
    result = run(
        "demo-local", "--records", "2000", "--producers", "2", "--batch", "50", "--seed", "7"
    )
    assert time.perf_counter() - start < 30
    assert result.exit_code == 0, result.output
    out = result.stdout
    assert "OK: 2000 records, 0 lost, 0 duplicated" in out
    assert summary_value(out, "produced") == "2000"
    assert summary_value(out, "consumed") == "2000"
    assert summary_value(out, "duplicates") == "0"
    assert summary_value(out, "missing") == "0"
    assert summary_value(out, "tombstones") == "0"
    assert int(summary_value(out, "backpressure retries")) >= 0
    assert summary_value(out, "final state") == (
        "head_seq=2000 earliest_seq=2001 evict_floor=1 count=0 bytes=0"
    )


def test_demo_uneven_split_and_model_backend() -> None:
    """Records not divisible by producers are all produced; the model backend runs it too."""
    result = run(
        "demo-local", "--uri", "model://", "--records", "301", "--producers", "3", "--batch", "7"
    )
    assert result.exit_code == 0, result.output
    assert summary_value(result.stdout, "consumed") == "301"


def test_demo_fails_when_a_record_is_seen_twice(monkeypatch: pytest.MonkeyPatch) -> None:
    """The demo's own check catches a duplicate delivery and exits 1."""
    original = tidelog.cli._check_record
    seen: list[int] = []

    def twice_first(demo: tidelog.cli._Demo, rec: tidelog.Record, last_seq: int) -> None:
        original(demo, rec, last_seq)
        if not seen:
            seen.append(rec.seq)
            demo.hits[0][0] += 1

    monkeypatch.setattr(tidelog.cli, "_check_record", twice_first)
    result = run("demo-local", "--records", "200", "--producers", "1", "--batch", "20")
    assert result.exit_code == 1
    assert "FAILED" in result.stdout
    assert summary_value(result.stdout, "duplicates") == "1"


def test_demo_refuses_an_existing_topic(uri: str) -> None:
    with tidelog.open(uri) as store:
        store.topic("demo").append(b"old")
    result = run("demo-local", "--uri", uri, "--records", "10")
    assert result.exit_code == 2
    assert "already exists" in result.output
    no_traceback(result)


def test_demo_local_flag_runs_the_in_process_pipeline() -> None:
    """`tidelog demo --local` is the in-process pipeline (no Spark); `tidelog demo` alone is
    the Spark pipeline (tests/spark/test_demo.py runs it end to end)."""
    result = run("demo", "--local", "--records", "300", "--producers", "2", "--seed", "3")
    assert result.exit_code == 0, result.output
    assert "OK: 300 records, 0 lost, 0 duplicated" in result.stdout
    assert summary_value(result.stdout, "consumed") == "300"
    help_text = run("demo", "--help").stdout
    assert "Spark" in help_text and "--master" in help_text and "--local" in help_text


# -- version ---------------------------------------------------------------------------------
def test_version() -> None:
    result = run("version")
    assert result.exit_code == 0
    assert tidelog.__version__ in result.stdout
    assert tidelog.__version__ in run("--version").stdout


def test_inspect_and_tail_a_file_store(tmp_path: Path) -> None:
    """DUR-1: a file store written by one process is read back by the CLI after reopen."""
    uri = f"file://{tmp_path / 'store'}"
    with tidelog.open(uri) as store:
        t = store.topic("events", cap_records=2)
        for payload in (b"a", b"b", b"c"):
            t.append(payload)
        t.subscribe("exp", start="earliest")
    result = run("inspect", uri, "--json")
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert report["read_only_view"] is True  # CLI-3
    assert report["topics"]["events"]["state"]["head_seq"] == 3
    assert report["describe"]["backend"] == "file"
    result = run("tail", uri, "events", "--json")
    items = [json.loads(line) for line in result.stdout.splitlines()]
    assert items[0] == {"type": "tombstone", "gap_from": 1, "gap_to": 1}


def test_verify_reports_corruption_with_file_offset_and_rule(tmp_path: Path) -> None:
    """SEG-15, SEG-19: a flipped byte in a sealed segment (a run frame of .data version 2) is
    reported (file, the frame's offset, rule) and verify exits 1; reading the record raises
    Corrupt and never returns the damaged bytes."""
    root = tmp_path / "store"
    with tidelog.open(f"file://{root}") as store:
        store.topic("t").append_many([b"p" * 100] * 5)
    assert run("verify", str(root)).exit_code == 0
    seg = next((root / "topics").glob("*/seg-*.data"))
    data = bytearray(seg.read_bytes())
    data[60] ^= 0xFF
    seg.write_bytes(bytes(data))
    result = run("verify", f"file://{root}", "--json")
    assert result.exit_code == 1
    report = json.loads(result.stdout)
    (problem,) = report["problems"]
    assert problem["rule"] == "SEG-15" and problem["path"] == str(seg)
    assert problem["offset"] == 32
    with tidelog.open(f"file://{root}") as store, pytest.raises(tidelog.Corrupt, match="seg-"):
        store.topic("t").read()
