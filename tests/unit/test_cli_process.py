"""The `tidelog` command as real processes (spec/CLI.md): `python -m tidelog`, `tail --follow`
beside a writer in another process, stdin that arrives slowly, a progress line on a terminal,
Ctrl-C, a reader that goes away. Every process is bounded in time and killed by PID."""

from __future__ import annotations

import os
import pty
import queue
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import tidelog

WAIT = 20.0  # seconds any single expectation may take on a loaded machine

# Small WAL files and frequent checkpoints: a follower must survive the snapshot changing
# under it (XPR-1 reloads), not only new WAL frames.
SMALL = "wal_file_bytes=256KiB&checkpoint_bytes=16KiB"

WRITER = textwrap.dedent(
    """
    import sys, tidelog
    store = tidelog.open(sys.argv[1])
    events = store.topic(sys.argv[2])
    events.append(b"r1")
    next_id = 2
    print("ready", flush=True)
    for line in sys.stdin:
        for _ in range(int(line)):  # one append each: one WAL batch each
            events.append(b"r%d" % next_id + b"-" * 2000)
            next_id += 1
        print("ok", flush=True)
    store.close()
    """
)


def tidelog_cmd(*args: str) -> list[str]:
    return [sys.executable, "-m", "tidelog", *args]


class Lines:
    """A process's output lines, read on a thread so the pipe never fills; EOF is None."""

    def __init__(self, stream: object) -> None:
        self._queue: queue.Queue[str | None] = queue.Queue()

        def pump() -> None:
            for line in stream:  # type: ignore[attr-defined]
                self._queue.put(line.rstrip("\n"))
            self._queue.put(None)

        threading.Thread(target=pump, daemon=True).start()

    def take(self, n: int, timeout: float = WAIT) -> list[str]:
        out: list[str] = []
        end = time.monotonic() + timeout
        while len(out) < n:
            try:
                line = self._queue.get(timeout=max(0.0, end - time.monotonic()))
            except queue.Empty:
                raise AssertionError(f"{len(out)} of {n} lines in {timeout} s: {out}") from None
            if line is None:
                raise AssertionError(f"the process ended after {len(out)} of {n} lines: {out}")
            out.append(line)
        return out


@pytest.fixture
def procs() -> Iterator[list[subprocess.Popen[str]]]:
    started: list[subprocess.Popen[str]] = []
    yield started
    for proc in started:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=WAIT)


def start(procs: list[subprocess.Popen[str]], args: list[str], cwd: Path, **kw: object) -> Any:
    # cwd: never the checkout, whose ./tidelog folder `-m` would import instead of the package
    proc = subprocess.Popen(args, cwd=cwd, text=True, **kw)  # type: ignore[call-overload]
    procs.append(proc)
    return proc


def start_writer(procs: list[subprocess.Popen[str]], cwd: Path, uri: str, topic: str) -> Any:
    """WRITER on ``uri``: holds the store open; each stdin line N appends N records."""
    args = [sys.executable, "-c", WRITER, uri, topic]
    return start(procs, args, cwd, stdin=subprocess.PIPE, stdout=subprocess.PIPE)


def start_append(procs: list[subprocess.Popen[str]], cwd: Path, uri: str) -> Any:
    """`tidelog append URI events` reading its stdin from a pipe the test writes."""
    args = tidelog_cmd("append", uri, "events")
    pipes = {"stdin": subprocess.PIPE, "stdout": subprocess.PIPE, "stderr": subprocess.PIPE}
    return start(procs, args, cwd, **pipes)


def payload_of(line: str) -> str:
    return line.split("\t")[4].rstrip("-")


# -- python -m tidelog -----------------------------------------------------------------------
def test_python_dash_m_tidelog_runs_the_cli(tmp_path: Path) -> None:
    """spec/CLI.md: the command also runs as `python -m tidelog`."""
    result = subprocess.run(
        tidelog_cmd("version"), cwd=tmp_path, capture_output=True, text=True, timeout=WAIT
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == f"tidelog {tidelog.__version__}"


def store_uri(tmp_path: Path, scheme: str) -> tuple[str, str]:
    """A file store with frequent checkpoints, a ring of 4 KiB pages with room for every
    record the tests append (one page each: they are fsync appends) without wrapping, or an SF
    slot of 4 KiB segments (two records each: many rotations); and the topic to use."""
    if scheme == "file":
        return f"file://{tmp_path / 'store'}?{SMALL}", "events"
    if scheme == "sf":
        return f"sf://{tmp_path / 'sf' / 'a'}?sf_max_bytes=4KiB&sf_max_total_bytes=4MiB", "frames"
    return f"blockdev://{tmp_path / 'ring.img'}?size=264KiB&page_size=4096&topic=events", "events"


# -- tail --follow beside a writer process ---------------------------------------------------
@pytest.mark.parametrize("scheme", ["file", "blockdev", "sf"])
@pytest.mark.parametrize("query", ["", "&readonly=true"])
def test_CLI_4_tail_follow_shows_another_process_appends(
    tmp_path: Path, procs: list[subprocess.Popen[str]], query: str, scheme: str
) -> None:
    """CLI-3, CLI-4: `tail --follow` opens a read-only view (so the writer keeps its lock),
    refreshes it between polls and prints what the other process appends, through checkpoints
    that replace the snapshot (XPR-1), the ring's new pages (BDEV-28) or the slot's new segments
    (SF-21), every record once and in order; SIGTERM ends it with 0. A URI that asks for
    readonly=true itself must follow too."""
    uri, topic = store_uri(tmp_path, scheme)
    writer = start_writer(procs, tmp_path, uri, topic)
    acks = Lines(writer.stdout)
    assert acks.take(1) == ["ready"]
    tail = start(
        procs,
        tidelog_cmd("tail", uri + query, topic, "--follow", "--interval", "0.05"),
        tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    shown = Lines(tail.stdout)
    assert [payload_of(line) for line in shown.take(1)] == ["r1"]
    writer.stdin.write("3\n")
    writer.stdin.flush()
    assert acks.take(1) == ["ok"]
    assert [payload_of(line) for line in shown.take(3)] == ["r2", "r3", "r4"]
    writer.stdin.write("40\n")  # 80 KB of WAL: several checkpoints while the tail follows
    writer.stdin.flush()
    assert acks.take(1) == ["ok"]
    lines = shown.take(40)
    assert [payload_of(line) for line in lines] == [f"r{i}" for i in range(5, 45)]
    assert [int(line.split("\t")[0]) for line in lines] == list(range(5, 45))
    os.kill(tail.pid, signal.SIGTERM)
    assert tail.wait(timeout=WAIT) == 0
    assert tail.stderr.read() == ""
    writer.stdin.close()
    assert writer.wait(timeout=WAIT) == 0


@pytest.mark.parametrize("scheme", ["file", "blockdev", "sf"])
def test_CLI_3_inspect_and_tail_beside_a_live_writer(
    tmp_path: Path, procs: list[subprocess.Popen[str]], scheme: str
) -> None:
    """CLI-3: inspect and tail read a store or ring another process holds open for writing
    (they used to take the writer lock and fail with `locked`)."""
    uri, topic = store_uri(tmp_path, scheme)
    writer = start_writer(procs, tmp_path, uri, topic)
    assert Lines(writer.stdout).take(1) == ["ready"]
    for args in (("inspect", uri, "--json"), ("tail", uri, topic)):
        result = subprocess.run(
            tidelog_cmd(*args), cwd=tmp_path, capture_output=True, text=True, timeout=WAIT
        )
        assert result.returncode == 0, result.stderr
        assert result.stderr == ""
    assert payload_of(result.stdout.splitlines()[0]) == "r1"
    writer.stdin.close()
    assert writer.wait(timeout=WAIT) == 0


# -- append ----------------------------------------------------------------------------------
def test_CLI_6_append_appends_slow_input_as_it_arrives(
    tmp_path: Path, procs: list[subprocess.Popen[str]]
) -> None:
    """CLI-6: a batch ends where stdin has nothing more ready, so a line that arrives alone is
    appended (and its seq printed) while stdin is still open."""
    uri = f"file://{tmp_path / 'store'}?{SMALL}"
    proc = start_append(procs, tmp_path, uri)
    seqs = Lines(proc.stdout)
    for n, line in enumerate(("one", "two", "three"), start=1):
        proc.stdin.write(line + "\n")
        proc.stdin.flush()
        assert seqs.take(1) == [str(n)]
    proc.stdin.close()
    assert proc.wait(timeout=WAIT) == 0, proc.stderr.read()
    with tidelog.open(uri) as store:
        assert [r.payload for r in store.topic("events").read()] == [b"one", b"two", b"three"]


def test_CLI_6_append_shows_progress_on_a_terminal(tmp_path: Path) -> None:
    """CLI-6: with stderr on a terminal (and stdout not), append shows how many records it
    appended; the seqs still go to stdout, one per line."""
    master, slave = pty.openpty()
    try:
        proc = subprocess.Popen(
            tidelog_cmd("append", f"file://{tmp_path / 'store'}?{SMALL}", "events"),
            cwd=tmp_path,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=slave,
        )
        try:
            out, _ = proc.communicate(b"".join(b"line %d\n" % i for i in range(2500)), WAIT)
        finally:
            if proc.poll() is None:
                os.kill(proc.pid, signal.SIGKILL)
                proc.wait(timeout=WAIT)
        os.close(slave)
        slave = -1
        screen = b""
        while True:
            try:
                chunk = os.read(master, 65536)
            except OSError:  # EIO: the terminal's other side is closed and drained
                break
            if not chunk:
                break
            screen += chunk
    finally:
        os.close(master)
        if slave >= 0:
            os.close(slave)
    assert proc.returncode == 0, screen
    assert out.split() == [b"%d" % i for i in range(1, 2501)]
    assert b"appended 2,500 records" in screen


# -- exit status and pipes -------------------------------------------------------------------
def test_CLI_1_ctrl_c_exits_130(tmp_path: Path, procs: list[subprocess.Popen[str]]) -> None:
    """CLI-1: an interrupted command (here append, waiting on stdin) exits 130 with one line
    on stderr, not click's "Aborted!" and status 1."""
    uri = f"file://{tmp_path / 'store'}?{SMALL}"
    proc = start_append(procs, tmp_path, uri)
    proc.stdin.write("one\n")
    proc.stdin.flush()
    assert Lines(proc.stdout).take(1) == ["1"]
    os.kill(proc.pid, signal.SIGINT)
    assert proc.wait(timeout=WAIT) == 130
    assert proc.stderr.read() == "tidelog: interrupted\n"


def test_CLI_1_tail_into_a_reader_that_goes_away(tmp_path: Path) -> None:
    """`tidelog tail ... | head -1`: a reader that closes the pipe ends tail quietly with 0,
    no traceback."""
    uri = f"file://{tmp_path / 'store'}?{SMALL}"
    with tidelog.open(uri) as store:
        store.topic("events").append_many([b"x" * 100] * 5000)
    proc = subprocess.Popen(
        tidelog_cmd("tail", uri, "events"),
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        assert proc.stdout is not None and proc.stderr is not None
        assert proc.stdout.readline().startswith(b"1\t")
        proc.stdout.close()
        assert proc.wait(timeout=WAIT) == 0
        assert proc.stderr.read() == b""
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(timeout=WAIT)
