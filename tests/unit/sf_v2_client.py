"""Run the real QuestDB client (questdb 6.0.0 from PyPI, Rust client 7.2.0) on a slot, in a
child process bounded in time and killed by PID, against ``qwp_listener.QwpListener``.

``python tests/unit/sf_v2_client.py SF_DIR SENDER PORT ROWS MODE`` is the child; MODE is
``close`` (clean close), ``exit`` (``os._exit`` after the rows) or ``open-exit`` (right after
connecting). Environment: ``SEG``/``TOTAL`` (sf_max_segment_bytes/sf_max_total_bytes), ``PAD``
(string column length), ``SYMS`` (distinct symbols, default 3), ``ROW_SLEEP`` (seconds between
rows), ``SETTLE`` (seconds to wait after the rows before stopping; with no rows the child waits
until its stdin closes), ``CONF_EXTRA`` (more connect-string keys, e.g. ``drain_orphans=on;``).

``make_fixtures(out)`` writes tests/unit/data/sf-v2/ again.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from qwp_listener import QwpListener  # noqa: E402

CHILD_TIMEOUT = 60.0


def run_client(
    sf_dir: Path,
    sender: str,
    rows: int,
    mode: str,
    *,
    acks: int = 1 << 62,
    done: Callable[[list[bytes]], bool] | None = None,
    env: dict[str, str] | None = None,
    kill_after: float | None = None,
    headers: dict[str, str] | None = None,
) -> QwpListener:
    """Run the client once; returns the (stopped) listener with every message it received.
    ``done``: the child is told to close once ``done(messages)`` holds (or the time is up).
    ``kill_after``: SIGKILL the child (by PID) after that many seconds instead.
    ``headers``: extra headers the listener answers the upgrade with."""
    listener = QwpListener(acks, headers)
    child_env = dict(os.environ, **(env or {}))
    proc = subprocess.Popen(
        [sys.executable, __file__, str(sf_dir), sender, str(listener.port), str(rows), mode],
        env=child_env,
        stdin=subprocess.PIPE,
    )
    try:
        deadline = time.monotonic() + CHILD_TIMEOUT
        if kill_after is not None:
            time.sleep(kill_after)
            proc.kill()
            proc.wait()
            return listener
        if done is not None:
            while not done(list(listener.messages)) and time.monotonic() < deadline:
                if proc.poll() is not None:
                    break
                time.sleep(0.02)
            time.sleep(0.3)  # anything more it would send (a replay of acked frames)
        if proc.poll() is None and proc.stdin is not None:
            proc.stdin.close()  # the child's cue to stop
        proc.wait(timeout=max(1.0, deadline - time.monotonic()))
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        listener.stop()
    if proc.returncode != 0:
        raise AssertionError(f"the questdb client exited with {proc.returncode}")
    return listener


def _child(sf_dir: str, sender: str, port: int, rows: int, mode: str) -> None:
    from questdb.ingress import Sender, TimestampNanos  # fails loudly when not installed

    seg, total = os.environ.get("SEG", "1024"), os.environ.get("TOTAL", "16384")
    conf = (
        f"ws::addr=127.0.0.1:{port};sf_dir={sf_dir};sender_id={sender};"
        f"sf_max_segment_bytes={seg};sf_max_total_bytes={total};initial_connect_retry=async;"
        f"auto_flush=off;close_flush_timeout_millis={os.environ.get('CLOSE_MS', '1500')};"
        + os.environ.get("CONF_EXTRA", "")
    )
    s = Sender.from_conf(conf)
    s.establish()
    if mode == "open-exit":
        os._exit(0)
    pad, syms = int(os.environ.get("PAD", "40")), int(os.environ.get("SYMS", "3"))
    for i in range(rows):
        s.row("t", symbols={"s": f"s{i % syms}"}, columns={"v": "x" * pad},
              at=TimestampNanos(1_700_000_000_000_000_000 + i))  # fmt: skip
        s.flush()
        time.sleep(float(os.environ.get("ROW_SLEEP", "0")))
    if rows:
        time.sleep(float(os.environ.get("SETTLE", "1.0")))
    else:
        sys.stdin.read()  # until the parent has seen what it expects
    if mode == "exit":
        os._exit(0)
    try:
        s.close()
    except Exception as exc:  # an undrained close reports its timeout: expected here
        print(f"close: {exc}", file=sys.stderr)


FIXTURES = {  # folder: (rows, acks, mode)
    "undrained-close": (20, 12, "close"),
    "crash-acked": (25, 12, "exit"),
    "crash-noserver": (15, 0, "exit"),
    "crash-at-open": (0, 0, "open-exit"),
}


def make_fixtures(out: Path) -> None:
    """Write the folders of tests/unit/data/sf-v2/ (lock files left out)."""
    for name, (rows, acks, mode) in FIXTURES.items():
        work = out / f".{name}.tmp"
        shutil.rmtree(work, ignore_errors=True)
        work.mkdir(parents=True)  # the client creates the slot, not its sf_dir
        run_client(work, "slot", rows, mode, acks=acks, env={"SETTLE": "1.0"})
        shutil.rmtree(out / name, ignore_errors=True)
        (out / name).mkdir(parents=True)
        for f in (work / "slot").iterdir():
            if f.name not in (".lock", ".lock.pid"):
                shutil.copy2(f, out / name / f.name)
        shutil.rmtree(work)


if __name__ == "__main__":
    if len(sys.argv) == 2:
        make_fixtures(Path(sys.argv[1]))
    else:
        a = sys.argv
        _child(a[1], a[2], int(a[3]), int(a[4]), a[5])
