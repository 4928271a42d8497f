"""The real QuestDB client, questdb 6.0.0 (Rust client 7.2.0) from PyPI, streaming to
`tidelog serve` (spec/FORWARD.md FWD-18, FWD-28..FWD-30): the records serve stores equal, byte
for byte and in order, the frames in the client's own slot (read with tidelog's SF frame reader),
with and without durable acks; across a receiver SIGKILL and restart and a client SIGKILL and
restart no frame is lost, and the extra records are exactly what FWD-29 and FWD-30 say an
anonymous sender gets. The client is not optional: if questdb cannot be imported these tests
fail (the test extra installs it). Every process runs on 127.0.0.1, bounded in time, and is
killed by PID at the end (the `procs` fixture)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from importlib.metadata import version
from pathlib import Path

import pytest
from qwp_listener import data_messages, is_catch_up
from test_cli_process import WAIT, Lines, procs, start, tidelog_cmd
from test_sf_v2_slot import frames_in

import tidelog
from tidelog.records import Record

__all__ = ["procs"]  # a fixture, imported for the process tests

#: a client process driven line by line on stdin, answering one line per command
CLIENT = textwrap.dedent(
    """
    import shutil, sys, time
    from questdb import Sender, TimestampNanos
    port, sf_dir, durable = sys.argv[1], sys.argv[2], sys.argv[3]
    conf = (f"ws::addr=127.0.0.1:{port};sf_dir={sf_dir};sender_id=qc;auto_flush=off;"
            f"request_durable_ack={durable};initial_connect_retry=async;"
            "reconnect_initial_backoff_millis=10;reconnect_max_backoff_millis=50;")
    sender = Sender.from_conf(conf)
    sender.establish()
    print("ready", flush=True)
    for line in sys.stdin:
        cmd, *args = line.split()
        if cmd == "send":  # one row, one flush, one frame each: symbols repeat (a dictionary)
            for i in range(int(args[0]), int(args[1])):
                sender.row("t", symbols={"s": "s%d" % (i % 3)}, columns={"v": i},
                           at=TimestampNanos(1_700_000_000_000_000_000 + i))
                fsn = sender.flush_and_get_fsn()
            print("published", fsn, flush=True)
        elif cmd == "await":  # the OK level returns first; a durable ack may come later
            fsn, deadline = int(args[0]), time.monotonic() + float(args[1]) * 0.75
            while not (ok := sender.await_acked_fsn(fsn, timeout_millis=1000)):
                if time.monotonic() > deadline:
                    break
                time.sleep(0.01)
            print("acked", ok, sender.acked_fsn(), flush=True)
        elif cmd == "copy":  # the slot as it is now, before a drained close deletes it
            shutil.copytree(sf_dir, args[0])
            print("copied", flush=True)
        elif cmd == "close":
            sender.close(flush=False)
            print("closed", flush=True)
            break
    """
)


class Client:
    """One questdb client process on slot ``<sf_dir>/qc``."""

    def __init__(self, procs: list[subprocess.Popen[str]], tmp: Path, port: int, durable: str):
        args = [sys.executable, "-c", CLIENT, str(port), str(tmp / "sf"), durable]
        self.proc = start(procs, args, tmp, stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        self.lines = Lines(self.proc.stdout)
        assert self.lines.take(1) == ["ready"]

    def ask(self, line: str) -> list[str]:
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()
        [answer] = self.lines.take(1)
        assert answer is not None, f"client died on {line!r}"
        return answer.split()

    def send(self, first: int, end: int) -> int:
        return int(self.ask(f"send {first} {end}")[1])

    def await_acked(self, fsn: int) -> None:
        answer = self.ask(f"await {fsn} {WAIT}")
        assert answer == ["acked", "True", str(fsn)], answer

    def kill(self) -> None:
        os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait(timeout=WAIT)


def serve(
    procs: list[subprocess.Popen[str]], tmp: Path, port: int = 0, *args: str
) -> tuple[subprocess.Popen[str], int]:
    """`tidelog serve` on 127.0.0.1 (``port`` 0: a free one); the process and its port."""
    argv = tidelog_cmd(
        "serve", "--uri", f"file://{tmp / 'rx'}?wal_file_bytes=1MiB", "--topic", "events",
        "--host", "127.0.0.1", "--port", str(port), *args,
    )  # fmt: skip
    proc = start(procs, argv, tmp, stdout=subprocess.PIPE)
    [line] = Lines(proc.stdout).take(1)
    assert line is not None and line.startswith("listening on ws://127.0.0.1:"), line
    return proc, int(line.split(":")[2].split("/")[0])


def stop(proc: subprocess.Popen[str], sig: int = signal.SIGTERM) -> None:
    os.kill(proc.pid, sig)
    proc.wait(timeout=WAIT)


def stored(tmp: Path) -> list[bytes]:
    with tidelog.open(f"file://{tmp / 'rx'}?readonly=true") as store:
        items = store.topic("events", create=False).read(0, 100_000)
    assert all(isinstance(r, Record) for r in items)
    return [r.payload for r in items]  # type: ignore[union-attr]


def slot_frames(slot: Path) -> list[bytes]:
    """Every frame of a client slot in FSN order (the frame layout is the same in both slot
    formats, SF-4)."""
    frames = frames_in(slot)
    return [frames[fsn] for fsn in sorted(frames)]


def test_FWD_28_the_real_client_is_installed() -> None:
    """FWD-28 names the client version these tests hold tidelog to: questdb 6.0.0, installed
    by the test extra (a missing client fails here and in every test below, never skips)."""
    assert version("questdb") == "6.0.0"


@pytest.mark.parametrize("durable", ["off", "on"])
def test_FWD_28_client_frames_stored_byte_for_byte(
    tmp_path: Path, procs: list[subprocess.Popen[str]], durable: str
) -> None:
    """FWD-18, FWD-28: 30 rows from the real client, each flushed as one frame, with
    request_durable_ack off and on, are stored as 30 records equal, byte for byte and in order,
    to the frames in the client's slot (FSN 0..29); no catch-up frame on a first connection of
    a fresh slot."""
    rx, port = serve(procs, tmp_path)
    client = Client(procs, tmp_path, port, durable)
    assert client.send(0, 30) == 29
    client.await_acked(29)
    assert client.ask(f"copy {tmp_path / 'copy'}") == ["copied"]
    assert client.ask("close") == ["closed"]
    client.proc.wait(timeout=WAIT)
    stop(rx)
    frames = slot_frames(tmp_path / "copy" / "qc")
    assert len(frames) == 30 and all(not is_catch_up(f) for f in frames)
    assert stored(tmp_path) == frames


def test_FWD_29_receiver_sigkill_and_restart(
    tmp_path: Path, procs: list[subprocess.Popen[str]]
) -> None:
    """FWD-28, FWD-29: the receiver is SIGKILLed after acknowledging FSN 0..19, the client
    publishes FSN 20..39 while it is down, and a receiver restarted on the same port takes them
    when the client reconnects: every frame of the slot is stored exactly once and in order
    (nothing was unacknowledged at the break, so nothing is stored twice), and the reconnect
    adds exactly one record, the client's symbol-dictionary catch-up frame (table_count 0)."""
    rx, port = serve(procs, tmp_path)
    client = Client(procs, tmp_path, port, "off")
    client.await_acked(client.send(0, 20))
    stop(rx, signal.SIGKILL)
    assert client.send(20, 40) == 39
    serve(procs, tmp_path, port)
    client.await_acked(39)
    client.ask(f"copy {tmp_path / 'copy'}")
    client.ask("close")
    records = stored(tmp_path)
    frames = slot_frames(tmp_path / "copy" / "qc")
    assert len(frames) == 40
    assert data_messages(records) == frames
    catch_ups = [k for k, r in enumerate(records) if is_catch_up(r)]
    assert catch_ups == [20]  # the first message of the second connection
    assert records[20][12:] == b"\x00\x03\x02s0\x02s1\x02s2"  # ids 0..2 registered from 0


def test_FWD_30_client_sigkill_and_restart(
    tmp_path: Path, procs: list[subprocess.Popen[str]]
) -> None:
    """FWD-28, FWD-30: a durable-ack client whose 20 frames the receiver appended but has not
    yet confirmed durable (a flush interval of one minute) is SIGKILLed; a new client process
    on the same slot (durable acks off) replays all 20 after its catch-up frame and then sends
    FSN 20..29. Nothing is lost; an anonymous sender's duplicate window is exactly the frames
    it had not seen acknowledged: 20 records stored twice, plus one catch-up record."""
    rx, port = serve(procs, tmp_path, 0, "--flush-interval-ms", "60000")
    first = Client(procs, tmp_path, port, "on")
    assert first.send(0, 20) == 19
    wait_stored(tmp_path, 20)
    first.kill()
    second = Client(procs, tmp_path, port, "off")
    assert second.send(20, 30) == 29
    second.await_acked(29)
    second.ask(f"copy {tmp_path / 'copy'}")
    second.ask("close")
    stop(rx)
    records = stored(tmp_path)
    frames = slot_frames(tmp_path / "copy" / "qc")
    assert len(frames) == 30
    assert records[:20] == frames[:20]
    assert is_catch_up(records[20])
    assert records[21:] == frames  # the replay: FSN 0..19 again, then 20..29
    assert len(records) == 20 + 1 + 30


def wait_stored(tmp: Path, count: int) -> None:
    deadline = time.monotonic() + WAIT
    while len(stored(tmp)) < count:
        assert time.monotonic() < deadline, f"receiver stored fewer than {count} records"
        time.sleep(0.05)
