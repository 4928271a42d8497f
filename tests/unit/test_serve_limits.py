"""The receiver's memory bounds (spec/FORWARD.md FWD-25; CLI-9 for `serve`'s start-up, FWD-18
and CLI-1 for its stop).

In-process tests hold the receiver's appends back with a gate, so what it buffers meanwhile is
deterministic. The flood tests start a receiver process (`tidelog serve`) and a flooding client
process on 127.0.0.1, read the receiver's RssAnon from /proc, and kill every process by PID;
their limits are generous and only a receiver that keeps memory fails them.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed, InvalidStatus

import tidelog
import tidelog.service.main as service_main
from tidelog.cli import main
from tidelog.errors import BadOption
from tidelog.forward import Forwarder, Receiver, SenderError, budget, wire
from tidelog.forward.budget import MESSAGE_OVERHEAD, Account, ByteBudget, ServeLimits
from tidelog.forward.dedup import forwarded

WAIT = 30.0
KIB, MIB = 1 << 10, 1 << 20


def rx_uri(path: Path, **options: object) -> str:
    query = "&".join(f"{k}={v}" for k, v in {"wal_file_bytes": "1MiB", **options}.items())
    return f"file://{path}?{query}"


def stored(uri: str) -> list[tuple[str, int, bytes]]:
    with tidelog.open(uri) as store:
        return [(c, f, r.payload) for c, f, r in forwarded(store.topic("events", create=False))]


async def dial(port: int, client: str) -> ClientConnection:
    return await connect(
        f"ws://127.0.0.1:{port}/write/v4",
        additional_headers={wire.H_CLIENT_ID: client, wire.H_FSN_AT_ZERO: "0"},
        proxy=None,
        compression=None,
        ping_interval=None,
        max_size=None,
        open_timeout=WAIT,
    )


def until(pred: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + WAIT
    while not pred():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.005)


@pytest.fixture
def gated(tmp_path: Path) -> Iterator[tuple[Receiver, threading.Event]]:
    """A receiver whose appends wait for the gate (a store slower than the network); small
    bounds: 64 KiB frames, 256 KiB per connection, 384 KiB in total."""
    rx = Receiver.open(
        rx_uri(tmp_path / "rx"),
        "events",
        max_frame_bytes="64KiB",
        max_connection_bytes="256KiB",
        max_total_bytes="384KiB",
    ).start()
    gate = threading.Event()
    real = rx._append

    def held_back(*args: Any) -> Any:
        gate.wait(WAIT)
        return real(*args)

    rx._append = held_back  # type: ignore[method-assign]
    try:
        yield rx, gate
    finally:
        gate.set()
        rx.stop()


def queued(rx: Receiver) -> list[int]:
    """Per connection, the bytes taken off its socket and waiting in its queue."""
    return [
        sum(len(m) for m in list(c.queue._queue) if isinstance(m, bytes))  # type: ignore[attr-defined]
        for c in list(rx._conns)
    ]


# -- options -----------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("options", "match"),
    [
        ({"max_frame_bytes": 100}, r"max_frame_bytes=100: must be at least 1KiB"),
        ({"max_frame_bytes": "2GiB"}, r"max_frame_bytes='2GiB': must be at most 1073741824"),
        ({"max_connection_bytes": "lots"}, r"max_connection_bytes='lots': expected a size"),
        ({"max_connection_bytes": True}, r"expected a size"),
        ({"max_total_bytes": "65GiB"}, r"must be at most 68719476736"),
        (
            {"max_connection_bytes": "2MiB", "max_total_bytes": "1MiB"},
            r"max_total_bytes='1MiB': must be at least max_connection_bytes \(2097152 bytes\)",
        ),
        ({"max_connections": 0}, r"max_connections=0: must be at least 1"),
        ({"max_connections": 10001}, r"must be at most 10000"),
    ],
)
def test_FWD_25_limits_are_validated_before_the_store_opens(
    tmp_path: Path, options: dict[str, object], match: str
) -> None:
    """FWD-25: every bound has a range; a bad one is bad_option naming it, and nothing is
    created."""
    with pytest.raises(BadOption, match=match):
        ServeLimits.parse(**options)  # type: ignore[arg-type]
    with pytest.raises(BadOption, match=match):
        Receiver.open(rx_uri(tmp_path / "rx"), "events", **options)
    assert not (tmp_path / "rx").exists()


def test_FWD_25_defaults() -> None:
    """FWD-25: the defaults the spec and README state."""
    assert ServeLimits.parse() == ServeLimits(16 * MIB, 64 * MIB, 256 * MIB, 64)
    assert (
        ServeLimits.parse(max_connection_bytes="8MiB", max_total_bytes="8MiB").max_total_bytes
        == 8 * MIB
    )


def test_CLI_9_serve_checks_its_limits_before_the_store(tmp_path: Path) -> None:
    """CLI-9, FWD-25: `serve` refuses a bad limit with one bad_option line, creating nothing."""
    result = CliRunner().invoke(
        main,
        ["serve", "--uri", f"file://{tmp_path}/rx", "--topic", "events", "--port", "0",
         "--max-connection-bytes", "1MiB", "--max-total-bytes", "512KiB"],
    )  # fmt: skip
    assert result.exit_code == 2, result.output
    assert result.stderr.startswith("tidelog: error: bad_option: option max_total_bytes=")
    assert list(tmp_path.iterdir()) == []


def test_CLI_9_serve_keeps_the_port_it_checked(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """CLI-9 regression: between the address check and the service's start (the store opened,
    the receiver made) the port stays taken (the service serves the very sockets the check
    bound), so no other process can get it; it used to be released in between."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    probes: list[str] = []
    real_init = Receiver.__init__

    def probing_init(self: Receiver, *args: Any, **kwargs: Any) -> None:
        with socket.socket() as other:
            other.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                other.bind(("127.0.0.1", port))
                other.listen(1)
                probes.append("taken by another socket")
            except OSError:
                probes.append("held")
        real_init(self, *args, **kwargs)

    def serve_once(store: Any, sockets: Any, *, on_ready: Any, **kwargs: Any) -> None:
        on_ready(None)  # says where it listens, then stops at once
        for sock in sockets:
            sock.close()
        store.close()

    monkeypatch.setattr(Receiver, "__init__", probing_init)
    monkeypatch.setattr(service_main, "run_service", serve_once)
    result = CliRunner().invoke(
        main, ["serve", "--uri", f"file://{tmp_path}/rx", "--topic", "events", "--port", str(port)]
    )
    assert result.exit_code == 0, result.output
    assert f"listening on ws://127.0.0.1:{port}/write/v4" in result.stdout
    assert probes == ["held"]


# -- the budget --------------------------------------------------------------------------------
def test_FWD_25_byte_budget_per_connection_total_and_fifo() -> None:
    """FWD-25: a connection waits for its own room, then for the total in arrival order; a
    connection that holds nothing always fits its own bound; a waiter that is cancelled gives
    its place (and anything granted) back."""

    async def go() -> None:
        b = ByteBudget(per_connection=100, total=150)
        a, c, d = Account(), Account(), Account()
        await b.take(a, 60)
        await b.take(a, 40)  # exactly full
        own = asyncio.create_task(b.take(a, 10))  # waits for a's own room
        await b.take(c, 50)  # total 150: full
        first = asyncio.create_task(b.take(c, 10))
        await asyncio.sleep(0)
        second = asyncio.create_task(b.take(d, 5))
        await asyncio.sleep(0)
        assert not (own.done() or first.done() or second.done())
        b.release(a, 60)  # a has room now, the total 60: first, second, then own, in order
        await asyncio.gather(own, first, second)
        assert (a.held, c.held, d.held, b.held) == (50, 60, 5, 115)
        big = Account()
        waiter = asyncio.create_task(b.take(big, 200))  # larger than a connection: held alone
        await asyncio.sleep(0)
        e = Account()
        queued_behind = asyncio.create_task(b.take(e, 1))
        await asyncio.sleep(0)
        waiter.cancel()
        await asyncio.gather(waiter, return_exceptions=True)
        await queued_behind  # the cancelled waiter no longer blocks the queue
        assert b.held == 116 and big.held == 0
        for acct, n in ((a, 50), (c, 60), (d, 5), (e, 1)):
            b.release(acct, n)
        await b.take(big, 200)  # nothing else held: admitted although above both bounds
        assert b.held == 200

    asyncio.run(go())


# -- backpressure --------------------------------------------------------------------------------
def test_FWD_25_a_flood_is_held_back_not_buffered(
    gated: tuple[Receiver, threading.Event], tmp_path: Path
) -> None:
    """FWD-25 regression: while appends lag (held back here), the receiver takes no more than
    its bounds off the sockets -- per connection and in total -- instead of queueing whatever
    arrives (it used to queue everything); once appends resume every frame is stored in order
    and acknowledged, and nothing stays held."""
    rx, gate = gated
    frame = b"f" * (16 * KIB)
    count = 600  # 9.4 MiB per connection
    charge = len(frame) + MESSAGE_OVERHEAD

    async def flood(ws: ClientConnection, tag: bytes) -> wire.Response:
        async def send() -> None:
            for i in range(count):
                await ws.send(tag + b"%05d" % i + frame)

        sender = asyncio.create_task(send())
        last: wire.Response | None = None
        while not (isinstance(last, wire.Ok) and last.sequence == count - 1):
            last = wire.decode(await asyncio.wait_for(ws.recv(), WAIT))
            assert not isinstance(last, wire.ErrorFrame), last
        await sender
        return last

    async def go() -> None:
        a, b = await dial(rx.port, "a"), await dial(rx.port, "b")
        floods = [asyncio.create_task(flood(a, b"a")), asyncio.create_task(flood(b, b"b"))]
        loop = asyncio.get_running_loop()
        # Both readers stop once the total is used up (each connection holds its first
        # batch in the held-back append, and its queue behind it).
        await loop.run_in_executor(
            None, until, lambda: rx.held_bytes > 384 * KIB - charge, "the total bound"
        )
        for _ in range(50):  # meanwhile the clients keep sending: nothing more is taken
            assert rx.held_bytes <= 384 * KIB
            assert all(q <= 256 * KIB for q in queued(rx)), queued(rx)
            assert sum(queued(rx)) <= 384 * KIB
            await asyncio.sleep(0.01)
        assert not any(f.done() for f in floods)
        gate.set()
        await asyncio.gather(*floods)
        await a.close()
        await b.close()

    asyncio.run(go())
    until(lambda: not rx._conns, "the connections to end")
    assert rx.held_bytes == 0 and rx.stats["stored"] == 2 * count
    assert 0 < rx.stats["peak_held_bytes"] <= 384 * KIB
    rx.stop()
    got = stored(rx_uri(tmp_path / "rx"))
    for tag in (b"a", b"b"):
        mine = [(f, p[:6]) for c, f, p in got if c == tag.decode()]
        assert mine == [(i, tag + b"%05d" % i) for i in range(count)]


def test_FWD_25_a_message_above_the_connection_bound_is_refused(tmp_path: Path) -> None:
    """FWD-25, FWD-21: a message longer than max_connection_bytes (but within max_frame_bytes)
    gets an OK for the frames before it, WRITE_ERROR too_large for itself and close 1011; a
    forwarder drops it by default (FWD-9) and delivers the rest (its next connection starts
    right after it, FWD-26). A message above max_frame_bytes is closed with 1009 unread."""
    uri = rx_uri(tmp_path / "rx")
    rx = Receiver.open(
        uri, "events", max_frame_bytes="64KiB", max_connection_bytes="4KiB", max_total_bytes="4KiB"
    ).start()

    async def raw() -> tuple[list[wire.Response], int | None]:
        got: list[wire.Response] = []
        async with await dial(rx.port, "raw") as ws:
            for frame in (b"a", b"b", b"x" * 5000, b"never stored"):
                await ws.send(frame)
            with pytest.raises(ConnectionClosed):
                while True:
                    got.append(wire.decode(await asyncio.wait_for(ws.recv(), WAIT)))
        return got, ws.close_code

    async def too_big() -> int | None:
        async with await dial(rx.port, "big") as ws:
            await ws.send(b"y" * (65 * KIB))
            with pytest.raises(ConnectionClosed):
                await asyncio.wait_for(ws.recv(), WAIT)
        return ws.close_code

    errors: list[SenderError] = []
    try:
        got, code = asyncio.run(raw())
        assert code == 1011
        assert isinstance(got[-1], wire.ErrorFrame) and got[-1].status == 0x09
        assert got[-1].sequence == 2
        assert "too_large: a frame of 5000 bytes" in got[-1].message
        assert "max_connection_bytes (4096) (FWD-25)" in got[-1].message
        assert isinstance(got[-2], wire.Ok) and got[-2].sequence == 1
        assert asyncio.run(too_big()) == 1009
        conf = (
            f"ws::addr=127.0.0.1:{rx.port};sf_dir={tmp_path / 'sf'};sender_id=s;"
            "reconnect_initial_backoff_millis=1;reconnect_max_backoff_millis=10;"
        )
        with Forwarder(conf, error_handler=errors.append) as fwd:
            for payload in (b"1", b"2" * 5000, b"3"):
                fwd.append(payload)
            assert fwd.wait_acked(timeout=WAIT)
            assert fwd.last_terminal_error is None
        until(lambda: not rx._conns, "the connections to end")
        assert rx.held_bytes == 0
    finally:
        rx.stop()
    assert [e.category for e in errors] == ["WRITE_ERROR"] and errors[0].first_fsn == 1
    assert [(c, f, p) for c, f, p in stored(uri)] == [
        ("raw", 0, b"a"), ("raw", 1, b"b"), ("s", 0, b"1"), ("s", 2, b"3"),
    ]  # fmt: skip


def test_FWD_25_a_message_of_max_frame_bytes_is_read_one_byte_more_is_1009(tmp_path: Path) -> None:
    """FWD-25 regression: --max-frame-bytes is the largest message read: one of exactly that
    length is stored, one byte more is closed with 1009 unread. (aiohttp refuses a message of
    its max_msg_size already; passed --max-frame-bytes, it refused the largest one allowed.)"""
    rx = Receiver.open(rx_uri(tmp_path / "rx"), "events", max_frame_bytes="64KiB").start()

    async def send(size: int) -> wire.Response | int | None:
        async with await dial(rx.port, f"size-{size}") as ws:
            await ws.send(b"x" * size)
            try:
                return wire.decode(await asyncio.wait_for(ws.recv(), WAIT))
            except ConnectionClosed:
                return ws.close_code

    try:
        assert asyncio.run(send(64 * KIB)) == wire.Ok(0, {"events": 1})
        assert asyncio.run(send(64 * KIB + 1)) == 1009
    finally:
        rx.stop()


def layer_queues(rx: Receiver) -> list[tuple[int, int]]:
    """Per connection, what aiohttp's WebSocket reader counts as queued (each parsed message's
    length + 128) and the count above which it stops parsing and reading (FWD-25)."""
    return [(c.ws._reader._size, c.ws._reader._limit) for c in list(rx._conns)]  # type: ignore[union-attr]


def test_FWD_25_the_websocket_layer_stops_reading_at_its_mark(
    gated: tuple[Receiver, threading.Event],
) -> None:
    """FWD-25: while the receiver waits for room on a connection (its appends held back), the
    WebSocket layer parses and reads no further than FWD-25 derives: its queue of parsed
    messages stops past 512 KiB counted, by at most the one message that crossed the mark, and
    the rest stays in the socket. Once appends resume every frame is acknowledged."""
    rx, gate = gated
    frame = b"f" * (16 * KIB)
    count = 200  # 3.1 MiB: beyond the 256 KiB the connection may hold and the layer's mark
    mark = 512 * KIB

    async def go() -> None:
        ws = await dial(rx.port, "a")

        async def send() -> None:
            for _ in range(count):
                await ws.send(frame)

        sender = asyncio.create_task(send())
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(
            None,
            until,
            lambda: any(size > limit for size, limit in layer_queues(rx)),
            "the WebSocket layer's mark",
        )
        for _ in range(50):  # with megabytes more to read, nothing more is parsed
            [(size, limit)] = layer_queues(rx)
            assert limit == mark
            assert size <= mark + len(frame) + 128
            assert rx.held_bytes <= 256 * KIB
            await asyncio.sleep(0.01)
        gate.set()
        await sender
        last: wire.Response | None = None
        while not (isinstance(last, wire.Ok) and last.sequence == count - 1):
            last = wire.decode(await asyncio.wait_for(ws.recv(), WAIT))
            assert not isinstance(last, wire.ErrorFrame), last
        await ws.close()

    asyncio.run(go())
    until(lambda: not rx._conns, "the connection to end")
    assert rx.held_bytes == 0 and rx.stats["stored"] == count


def test_FWD_25_connections_above_the_limit_are_refused_with_503(tmp_path: Path) -> None:
    """FWD-25: with max_connections open, one more upgrade is HTTP 503; once one closes, a new
    one is accepted."""
    rx = Receiver.open(rx_uri(tmp_path / "rx"), "events", max_connections=2).start()

    async def go() -> None:
        one, two = await dial(rx.port, "1"), await dial(rx.port, "2")
        with pytest.raises(InvalidStatus) as exc:
            await dial(rx.port, "3")
        assert exc.value.response.status_code == 503
        assert b"max_connections, FWD-25" in exc.value.response.body
        await one.close()
        await two.close()

    try:
        asyncio.run(go())
        until(lambda: not rx._conns, "the connections to end")

        async def again() -> None:
            async with await dial(rx.port, "3"):
                pass

        asyncio.run(again())
    finally:
        rx.stop()


# -- floods from another process ----------------------------------------------------------------
FLOOD_CLIENT = textwrap.dedent(
    """
    import asyncio, sys
    from websockets.asyncio.client import connect
    from tidelog.forward import wire

    async def one(port, n, frame, client):
        headers = {wire.H_CLIENT_ID: client, wire.H_FSN_AT_ZERO: "0"}
        async with connect(f"ws://127.0.0.1:{port}/write/v4", additional_headers=headers,
                           proxy=None, compression=None, ping_interval=None) as ws:
            async def acks():
                last = -1
                while last < n - 1:
                    resp = wire.decode(await ws.recv())
                    if isinstance(resp, wire.ErrorFrame):
                        raise SystemExit(f"error frame: {resp}")
                    if isinstance(resp, wire.Ok):
                        last = resp.sequence
            reader = asyncio.create_task(acks())
            for _ in range(n):
                await ws.send(frame)
            await reader

    async def main(port, total, size, connections):
        n = total // size // connections
        frame = b"x" * size
        await asyncio.gather(*(one(port, n, frame, f"flood-{i}") for i in range(connections)))
        print("acknowledged", n * connections, flush=True)

    asyncio.run(main(*map(int, sys.argv[1:5])))
    """
)

# A store slower than the network (100 MB/s), slow outside the receiver's append lock, so the
# receiver's event loop keeps reading while appends lag.
SLOW_SERVE = textwrap.dedent(
    """
    import sys, time
    from tidelog.forward.receiver import Receiver
    real = Receiver._append
    def slow(self, conn, first_wire, batch):
        time.sleep(sum(map(len, batch)) / 100e6)
        return real(self, conn, first_wire, batch)
    Receiver._append = slow
    from tidelog.cli import main
    main(sys.argv[1:])
    """
)

# A store that takes nothing until the test creates the file TIDELOG_TEST_GATE (at most 60 s),
# waiting outside the receiver's append lock, so the receiver's event loop keeps reading.
GATED_SERVE = textwrap.dedent(
    """
    import os, sys, time
    from tidelog.forward.receiver import Receiver
    real = Receiver._append
    def gated(self, conn, first_wire, batch):
        deadline = time.monotonic() + 60
        while not os.path.exists(os.environ["TIDELOG_TEST_GATE"]) and time.monotonic() < deadline:
            time.sleep(0.01)
        return real(self, conn, first_wire, batch)
    Receiver._append = gated
    from tidelog.cli import main
    main(sys.argv[1:])
    """
)

FLOOD_BYTES = 300 * MIB
FLOOD_FRAME = 256 * KIB
BOUNDS = ["--max-frame-bytes", "1MiB", "--max-connection-bytes", "8MiB",
          "--max-total-bytes", "16MiB"]  # fmt: skip


def rss_anon_mib(pid: int) -> float:
    status = Path(f"/proc/{pid}/status").read_text()
    m = re.search(r"^RssAnon:\s+(\d+) kB", status, re.MULTILINE)
    assert m is not None, status
    return int(m.group(1)) / 1024


class Served:
    """A receiver process: started, its port read from its first line, killed by PID."""

    def __init__(self, argv: list[str], env: dict[str, str]) -> None:
        self.proc = subprocess.Popen(
            argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env
        )
        line = self._first_line()
        m = re.search(r"ws://127\.0\.0\.1:(\d+)/", line)
        assert m is not None, line
        self.port = int(m.group(1))

    def _first_line(self) -> str:
        box: list[str] = []
        reader = threading.Thread(target=lambda: box.append(self.proc.stdout.readline()))  # type: ignore[union-attr]
        reader.start()
        reader.join(WAIT)
        assert box and box[0], f"the receiver did not start: {self.stop_and_stderr()}"
        return box[0]

    def terminate(self) -> dict[str, Any]:
        """SIGTERM (a clean stop) and the stats the receiver prints on exit."""
        self.proc.send_signal(signal.SIGTERM)
        _, err = self.proc.communicate(timeout=WAIT)
        self.stderr = err
        stats = [line for line in err.splitlines() if line.startswith('{"receiver"')]
        assert stats, err
        return json.loads(stats[-1])["receiver"]  # type: ignore[no-any-return]

    def stop_and_stderr(self) -> str:
        self.proc.kill()
        _, err = self.proc.communicate(timeout=WAIT)
        return err

    def kill(self) -> None:
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGKILL)
            self.proc.communicate(timeout=WAIT)


@pytest.fixture
def served(tmp_path: Path) -> Iterator[Callable[..., Served]]:
    started: list[Served] = []
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}

    def start(uri: str, *args: str, script: str | None = None, **extra: str) -> Served:
        head = [sys.executable, "-c", script] if script else [sys.executable, "-m", "tidelog"]
        argv = [*head, "serve", "--uri", uri, "--topic", "events", "--port", "0", *args]
        s = Served(argv, {**env, **extra})
        started.append(s)
        return s

    yield start
    for s in started:
        s.kill()
    shutil.rmtree(tmp_path / "rx", ignore_errors=True)  # hundreds of MB


def test_FWD_18_sigterm_stops_serve_cleanly(tmp_path: Path, served: Callable[..., Served]) -> None:
    """FWD-18, CLI-1 regression: SIGTERM ends `tidelog serve` with a clean stop: its connection
    is closed with 1001, the final flush writes the de-dup checkpoint (the flush interval is too
    long for any other), nothing is logged, status 0. It used to close the store under the
    running receiver: on Python 3.11 the signal, taken inside Thread.join, made the receiver's
    thread look ended (no close frame, "flush failed: ... is closed", no checkpoint)."""
    uri = rx_uri(tmp_path / "rx")
    rx = served(uri, "--flush-interval-ms", "600000")

    async def go() -> int | None:
        ws = await dial(rx.port, "c")
        await ws.send(b"0")
        assert wire.decode(await asyncio.wait_for(ws.recv(), WAIT)) == wire.Ok(0, {"events": 1})
        stats = await asyncio.get_running_loop().run_in_executor(None, rx.terminate)
        assert stats["stored"] == 1
        await asyncio.wait_for(ws.wait_closed(), WAIT)
        return ws.close_code

    assert asyncio.run(go()) == 1001
    assert rx.proc.returncode == 0
    quiet = [
        line
        for line in rx.stderr.splitlines()
        if not line.startswith('{"receiver"') and " INFO tidelog.service.access: " not in line
    ]  # the stats line and SVC-55's request lines, nothing else (no warning, no error)
    assert quiet == []
    with tidelog.open(uri) as store:
        index = list(store.topic("events.fwd-index", create=False).read())
    assert json.loads(index[-1].payload) == {"through_seq": 1, "clients": {"c": 0}, "refused": {}}


def flood(
    tmp_path: Path,
    port: int,
    sample: Callable[[], None],
    *,
    frame: int = FLOOD_FRAME,
    connections: int = 1,
) -> None:
    """Run the flooding client process to the end (``FLOOD_BYTES`` in ``frame``-byte
    messages over ``connections`` connections, every frame acknowledged), calling ``sample``
    every 10 ms meanwhile; it is killed by PID if it outlives the limit."""
    script = tmp_path / "flood.py"
    script.write_text(FLOOD_CLIENT)
    client = subprocess.Popen(
        [sys.executable, str(script), str(port), str(FLOOD_BYTES), str(frame), str(connections)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 120
    try:
        while client.poll() is None and time.monotonic() < deadline:
            sample()
            time.sleep(0.01)
    finally:
        if client.poll() is None:
            os.kill(client.pid, signal.SIGKILL)
        out, err = client.communicate(timeout=WAIT)
    assert client.returncode == 0 and "acknowledged" in out, (client.returncode, out, err)


def memory_returned(pid: int, limit_mib: float) -> float:
    """Wait (bounded) for the receiver's anonymous memory to drop to ``limit_mib``; the last
    value read."""
    deadline = time.monotonic() + 20
    now = rss_anon_mib(pid)
    while now > limit_mib and time.monotonic() < deadline:
        time.sleep(0.1)
        now = rss_anon_mib(pid)
    return now


@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads RssAnon from /proc")
def test_FWD_25_a_flood_against_a_slow_store_stays_within_the_bounds(
    tmp_path: Path, served: Callable[..., Served]
) -> None:
    """FWD-25 regression: a 300 MiB flood from another process against a receiver whose store
    takes 100 MB/s (in-memory, capped at 8 MiB, so its own memory is small): the receiver's
    anonymous memory never grows by more than 96 MiB (bounds: 16 MiB held, 1 MiB frames; the
    rest is slack) and the sender is paced by TCP. It used to queue what the store had not
    taken yet: about 300 MiB, and kept it."""
    rx = served(
        "memory://", *BOUNDS, "--topic-option", "cap_bytes=8MiB", "--topic-option",
        "discard=old", script=SLOW_SERVE,
    )  # fmt: skip
    base = rss_anon_mib(rx.proc.pid)
    peak = [base]
    flood(tmp_path, rx.port, lambda: peak.append(rss_anon_mib(rx.proc.pid)))
    assert max(peak) - base <= 96, f"RssAnon grew from {base:.0f} to {max(peak):.0f} MiB"
    assert memory_returned(rx.proc.pid, base + 64) <= base + 64
    stats = rx.terminate()
    assert stats["stored"] == FLOOD_BYTES // FLOOD_FRAME
    assert 0 < stats["peak_held_bytes"] <= 16 * MIB


@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads RssAnon from /proc")
@pytest.mark.skipif(not budget.CAN_RETURN_MEMORY, reason="no malloc_trim (not glibc)")
def test_FWD_25_memory_is_returned_after_a_flood(
    tmp_path: Path, served: Callable[..., Served]
) -> None:
    """FWD-25 regression: after a 300 MiB flood into a file:// store, the receiver's anonymous
    memory comes back to within 128 MiB of where it started (the store keeps up to
    checkpoint_bytes of records in memory; the rest is slack for a loaded CI machine, where
    64 MiB was once exceeded by 9). It used to keep 270-380 MiB: the C allocator held on to
    the freed frame buffers."""
    uri = rx_uri(
        tmp_path / "rx", wal_file_bytes="8MiB", checkpoint_bytes="4MiB", segment_max_bytes="8MiB"
    )
    rx = served(uri, *BOUNDS)
    base = rss_anon_mib(rx.proc.pid)
    flood(tmp_path, rx.port, lambda: None)
    after = memory_returned(rx.proc.pid, base + 128)
    assert after <= base + 128, f"RssAnon {base:.0f} MiB before the flood, {after:.0f} after"
    stats = rx.terminate()
    assert stats["stored"] == FLOOD_BYTES // FLOOD_FRAME
    assert 0 < stats["peak_held_bytes"] <= 16 * MIB


@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads RssAnon from /proc")
def test_FWD_25_many_connections_cost_what_the_websocket_layer_buffers(
    tmp_path: Path, served: Callable[..., Served]
) -> None:
    """FWD-25: 8 connections flood 1 MiB messages at a receiver whose store takes nothing for
    the first 3 s (then everything; in-memory, capped at 8 MiB): its anonymous memory grows by
    no more than FWD-25's bound -- 16 MiB held + 8 x (4 x 1 MiB + 1 MiB) = 56 MiB -- plus the
    store's 8 MiB and 32 MiB of slack, though the clients have 300 MiB to send."""
    gate = tmp_path / "gate"
    rx = served(
        "memory://", *BOUNDS, "--topic-option", "cap_bytes=8MiB", "--topic-option",
        "discard=old", script=GATED_SERVE, TIDELOG_TEST_GATE=str(gate),
    )  # fmt: skip
    base = rss_anon_mib(rx.proc.pid)
    peak = [base]
    began = time.monotonic()

    def sample() -> None:
        peak.append(rss_anon_mib(rx.proc.pid))
        if time.monotonic() - began > 3:
            gate.touch()

    flood(tmp_path, rx.port, sample, frame=MIB, connections=8)
    assert gate.exists()  # the flood ended after the store began taking
    grown = max(peak) - base
    assert grown <= 56 + 8 + 32, f"RssAnon grew from {base:.0f} to {max(peak):.0f} MiB"
    stats = rx.terminate()
    assert stats["stored"] == FLOOD_BYTES // MIB // 8 * 8
    assert 0 < stats["peak_held_bytes"] <= 16 * MIB
