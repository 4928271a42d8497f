"""Which async HTTP stack serves tidelog's topics service: measured side by side (not a test).

    python -m tidelog.bench.http_stacks [--seconds 1] [--rounds 3] [--rate 500] [--events 1000]
                                        [--stacks starlette,aiohttp,websockets]
                                        [--loop asyncio|uvloop]
                                        [--json FILE]

Each stack serves the same three paths from a ``memory://`` store in its own process on
127.0.0.1 (so server and load generator do not share a GIL):

* ``POST /v0/topics/{t}/records``: the body (100 B) appended as one record, ``{"seq": n}`` back;
* ``GET /v0/topics/{t}/events?after=n``: a Server-Sent Events stream of the records after ``n``
  (``id:`` = seq, ``data:`` = the record as JSON with its payload in base64), woken by an
  in-loop notification on every append, never by polling;
* ``/v0/topics/{t}/ws``: a WebSocket whose every binary message is appended, the seq sent back
  (the store-and-forward receiver's path, spec/FORWARD.md FWD-18, reduced to its append).

Stacks: ``starlette`` (Starlette on uvicorn, httptools parser), ``aiohttp`` (aiohttp.web) and
``websockets`` (the ``websockets`` server the receiver uses today: WebSocket rows only). One
load generator drives them all: a raw HTTP/1.1 keep-alive client on asyncio streams (the same
bytes for every stack) and the ``websockets`` client. Measured, in interleaved rounds (round 1 of
every stack, then round 2, ...): appends/s from 1 and 8 connections with the server's CPU time
per request (``/proc/<pid>/stat``), WebSocket appends/s from 1 and 8 connections, and append ->
SSE delivery latency (from just before the POST is written to the event's arrival) at a fixed
rate. Every count is checked against the topic's ``head_seq``. Stacks not installed are listed
as not measured (``pip install 'tidelog[bench]'`` installs them all).
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import importlib.util
import json
import os
import selectors
import signal
import socket
import statistics
import struct
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable
from importlib import metadata
from typing import Any

import tidelog
from tidelog.cli_forward import bind_listen
from tidelog.records import Tombstone

from .harness import _machine
from .http_client import Http
from .measure import payload, percentile

__all__ = ["STACKS", "main", "run"]

#: stack -> (the modules it needs, what it is)
STACKS: dict[str, tuple[tuple[str, ...], str]] = {
    "starlette": (("starlette", "uvicorn", "httptools"), "Starlette on uvicorn (httptools)"),
    "aiohttp": (("aiohttp",), "aiohttp.web"),
    "websockets": (("websockets",), "websockets server (today's receiver; WebSocket only)"),
}
DISTS = ("starlette", "uvicorn", "httptools", "aiohttp", "websockets", "uvloop")
PAYLOAD = 100
SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
#: bounds on every wait (seconds): a server's start and stop, one response, the last SSE event
START_S, STOP_S, IO_S = 30.0, 5.0, 10.0


def _json(obj: object) -> bytes:
    return json.dumps(obj).encode()


# -- the server side (runs in the stack's own process) ---------------------------------------------
class Service:
    """The store and the per-topic change notification the stacks share (in-loop: an append
    wakes every SSE stream of its topic)."""

    def __init__(self) -> None:
        self.store = tidelog.open("memory://")
        self.topics: dict[str, tidelog.Topic] = {}
        self.events: dict[str, asyncio.Event] = {}

    def topic(self, name: str) -> tidelog.Topic:
        t = self.topics.get(name)
        if t is None:
            t = self.topics[name] = self.store.topic(name, durability="memory")
        return t

    def append(self, name: str, body: bytes) -> int:
        seq = self.topic(name).append(body)
        event = self.events.pop(name, None)
        if event is not None:
            event.set()
        return seq

    def state(self, name: str) -> bytes:
        return b'{"head_seq":%d}' % self.topic(name).state().head_seq

    async def sse(self, name: str, after: int) -> AsyncIterator[bytes]:
        """The stream's chunks: a comment first (the client knows it is connected), then each
        batch of records as one chunk of events."""
        topic = self.topic(name)
        yield b": open\n\n"
        while True:
            items = topic.read(after, limit=1000)
            if not items:
                event = self.events.get(name)
                if event is None:
                    event = self.events[name] = asyncio.Event()
                await event.wait()
                continue
            out = []
            for r in items:
                if isinstance(r, Tombstone):  # none here (no retention set); encoded all the same
                    gap = {"gap_from": r.gap_from, "gap_to": r.gap_to}
                    out.append(b"id: %d\nevent: tombstone\ndata: %s\n\n" % (r.gap_to, _json(gap)))
                    after = r.gap_to
                    continue
                data = {"seq": r.seq, "ts": r.ts, "payload": base64.b64encode(r.payload).decode()}
                out.append(b"id: %d\nevent: record\ndata: %s\n\n" % (r.seq, _json(data)))
                after = r.seq
            yield b"".join(out)


def _starlette(svc: Service, sock: socket.socket, loop: str) -> None:
    import uvicorn
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import Response, StreamingResponse
    from starlette.routing import Route, WebSocketRoute
    from starlette.websockets import WebSocket, WebSocketDisconnect

    async def append(request: Request) -> Response:
        seq = svc.append(request.path_params["topic"], await request.body())
        return Response(b'{"seq":%d}' % seq, media_type="application/json")

    async def state(request: Request) -> Response:
        return Response(svc.state(request.path_params["topic"]), media_type="application/json")

    async def events(request: Request) -> Response:
        after = int(request.query_params.get("after", "0"))
        chunks = svc.sse(request.path_params["topic"], after)
        return StreamingResponse(chunks, media_type="text/event-stream", headers=SSE_HEADERS)

    async def ws(websocket: WebSocket) -> None:
        name = websocket.path_params["topic"]
        await websocket.accept()
        with contextlib.suppress(WebSocketDisconnect):
            while True:
                data = await websocket.receive_bytes()
                await websocket.send_bytes(struct.pack("<Q", svc.append(name, data)))

    app = Starlette(routes=[
        Route("/v0/topics/{topic}/records", append, methods=["POST"]),
        Route("/v0/topics/{topic}", state),
        Route("/v0/topics/{topic}/events", events),
        WebSocketRoute("/v0/topics/{topic}/ws", ws),
    ])  # fmt: skip
    config = uvicorn.Config(
        app, loop=loop, http="httptools", ws="websockets-sansio", lifespan="off",
        log_level="warning", access_log=False, ws_per_message_deflate=False,
        timeout_graceful_shutdown=1,
    )  # fmt: skip
    uvicorn.Server(config).run(sockets=[sock])


async def _aiohttp(svc: Service, sock: socket.socket, stop: asyncio.Event) -> None:
    from aiohttp import WSMsgType, web

    async def append(request: web.Request) -> web.Response:
        seq = svc.append(request.match_info["topic"], await request.read())
        return web.Response(body=b'{"seq":%d}' % seq, content_type="application/json")

    async def state(request: web.Request) -> web.Response:
        body = svc.state(request.match_info["topic"])
        return web.Response(body=body, content_type="application/json")

    async def events(request: web.Request) -> web.StreamResponse:
        after = int(request.query.get("after", "0"))
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", **SSE_HEADERS})
        await resp.prepare(request)
        async for chunk in svc.sse(request.match_info["topic"], after):
            await resp.write(chunk)
        return resp

    async def ws(request: web.Request) -> web.WebSocketResponse:
        name = request.match_info["topic"]
        sock_ = web.WebSocketResponse(compress=False, max_msg_size=16 << 20)
        await sock_.prepare(request)
        async for msg in sock_:
            if msg.type == WSMsgType.BINARY:
                await sock_.send_bytes(struct.pack("<Q", svc.append(name, msg.data)))
        return sock_

    app = web.Application()
    app.router.add_post("/v0/topics/{topic}/records", append)
    app.router.add_get("/v0/topics/{topic}", state)
    app.router.add_get("/v0/topics/{topic}/events", events)
    app.router.add_get("/v0/topics/{topic}/ws", ws)
    runner = web.AppRunner(app, access_log=None, handle_signals=False, shutdown_timeout=1.0)
    await runner.setup()
    await web.SockSite(runner, sock).start()
    await stop.wait()
    await runner.cleanup()


async def _websockets(svc: Service, sock: socket.socket, stop: asyncio.Event) -> None:
    from websockets.asyncio.server import ServerConnection, serve

    async def handler(conn: ServerConnection) -> None:
        assert conn.request is not None  # the handler runs after the handshake
        name = conn.request.path.split("/")[3]  # /v0/topics/{t}/ws
        async for message in conn:
            await conn.send(struct.pack("<Q", svc.append(name, message)))  # type: ignore[arg-type]

    async with serve(handler, sock=sock, compression=None, max_queue=1):
        await stop.wait()


def serve(stack: str, loop: str) -> None:
    """The server process: bind 127.0.0.1:0, print ``READY <port>``, serve until SIGTERM."""
    # Bound as `tidelog serve` binds (CLI-9): a socket made with proto 0 (socket.create_server)
    # never gets TCP_NODELAY from asyncio's transports, and uvicorn on the stdlib loop then
    # waits ~40 ms (Nagle + delayed ACK) on every keep-alive response.
    (sock,) = bind_listen("127.0.0.1", 0)
    svc = Service()
    print(f"READY {sock.getsockname()[1]}", flush=True)
    if stack == "starlette":
        _starlette(svc, sock, loop)
        return
    factory: Callable[[], asyncio.AbstractEventLoop] = asyncio.new_event_loop
    if loop == "uvloop":
        import uvloop

        factory = uvloop.new_event_loop

    async def main() -> None:
        stop = asyncio.Event()
        asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
        await (_aiohttp if stack == "aiohttp" else _websockets)(svc, sock, stop)

    with asyncio.Runner(loop_factory=factory) as runner:
        runner.run(main())


class Server:
    """One stack's server process, started and stopped by PID."""

    def __init__(self, stack: str, loop: str) -> None:
        argv = [sys.executable, "-m", "tidelog.bench.http_stacks", "--serve", stack, "--loop", loop]
        self.proc = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True)
        self.pid = self.proc.pid
        try:
            line = _readline(self.proc, START_S)
            if not line.startswith("READY "):
                raise RuntimeError(f"{stack} server did not start: {line!r}")
            self.port = int(line.split()[1])
        except BaseException:
            self.stop()
            raise

    def cpu_s(self) -> float:
        """User + system CPU time of the server process so far (seconds)."""
        with open(f"/proc/{self.pid}/stat", encoding="ascii") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(STOP_S)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(STOP_S)
        if self.proc.stdout is not None:
            self.proc.stdout.close()


def _readline(proc: subprocess.Popen[str], timeout: float) -> str:
    assert proc.stdout is not None
    with selectors.DefaultSelector() as sel:
        sel.register(proc.stdout, selectors.EVENT_READ)
        if not sel.select(timeout):
            raise RuntimeError(f"no answer from server process {proc.pid} within {timeout} s")
    return proc.stdout.readline().strip()


# -- the load generator ---------------------------------------------------------------------------
def _post(topic: str, body: bytes) -> bytes:
    return (
        b"POST /v0/topics/%s/records HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        b"Content-Type: application/octet-stream\r\nContent-Length: %d\r\n\r\n%s"
        % (topic.encode(), len(body), body)
    )


async def _head_seq(port: int, topic: str) -> int:
    conn = await Http.open(port)
    try:
        body = await conn.request(
            b"GET /v0/topics/%s HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n" % topic.encode()
        )
        return int(json.loads(body)["head_seq"])
    finally:
        conn.close()


async def _post_rate(port: int, topic: str, conns: int, seconds: float) -> int:
    """Appends from ``conns`` keep-alive connections, one request in flight on each."""
    raw = _post(topic, payload(PAYLOAD))
    deadline = time.perf_counter() + seconds

    async def one() -> int:
        conn = await Http.open(port)
        n = 0
        try:
            # at least one each: a connection opened late on a loaded machine still counts
            while n == 0 or time.perf_counter() < deadline:
                await conn.request(raw)
                n += 1
        finally:
            conn.close()
        return n

    return sum(await asyncio.gather(*(one() for _ in range(conns))))


async def _ws_rate(port: int, topic: str, conns: int, seconds: float) -> int:
    from websockets.asyncio.client import connect

    body = payload(PAYLOAD)
    deadline = time.perf_counter() + seconds

    async def one() -> int:
        n = 0
        url = f"ws://127.0.0.1:{port}/v0/topics/{topic}/ws"
        async with connect(url, compression=None, open_timeout=IO_S) as ws:
            while n == 0 or time.perf_counter() < deadline:  # at least one, as above
                await ws.send(body)
                await asyncio.wait_for(ws.recv(), IO_S)
                n += 1
        return n

    return sum(await asyncio.gather(*(one() for _ in range(conns))))


async def _sse_latency(port: int, topic: str, events: int, rate: float) -> list[float]:
    """Microseconds from just before each POST is written to its SSE event's arrival, appending
    at ``rate`` per second on one connection while one SSE stream reads."""
    sent: list[float] = [0.0] * events
    got: list[float] = [0.0] * events
    sse = await Http.open(port)
    sse.writer.write(b"GET /v0/topics/%s/events?after=0 HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                     b"Accept: text/event-stream\r\n\r\n" % topic.encode())  # fmt: skip
    status, headers = await sse.head()
    if status != 200 or "text/event-stream" not in headers.get("content-type", ""):
        raise RuntimeError(f"SSE stream refused: HTTP {status} {headers}")
    opened = asyncio.get_running_loop().create_future()

    async def reader() -> None:
        buf, seen = b"", 0
        async for chunk in sse.chunks():
            buf += chunk
            *blocks, buf = buf.split(b"\n\n")
            for block in blocks:
                if block.startswith(b":"):
                    if not opened.done():
                        opened.set_result(None)
                    continue
                now = time.perf_counter()
                data = next(x for x in block.split(b"\n") if x.startswith(b"data: "))
                record = json.loads(data[6:])
                (index,) = struct.unpack_from("<Q", base64.b64decode(record["payload"]))
                got[index] = now
                seen += 1
                if seen == events:
                    return

    task = asyncio.create_task(reader())
    post = await Http.open(port)
    try:
        await asyncio.wait_for(opened, IO_S)
        body = bytearray(payload(PAYLOAD))
        t0 = time.perf_counter()
        for i in range(events):
            delay = t0 + i / rate - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            struct.pack_into("<Q", body, 0, i)
            sent[i] = time.perf_counter()
            await post.request(_post(topic, bytes(body)))
        await asyncio.wait_for(task, IO_S)
    finally:
        task.cancel()
        post.close()
        sse.close()
    return [(g - s) * 1e6 for s, g in zip(sent, got)]


# -- the run ---------------------------------------------------------------------------------------
def available(stack: str) -> str | None:
    """None when ``stack`` can run here, else why not."""
    missing = [m for m in STACKS[stack][0] if importlib.util.find_spec(m) is None]
    return f"not installed: {', '.join(missing)}" if missing else None


async def _warm_up(port: int, stack: str) -> None:
    """Every path once before the clock starts: a server's first request pays its lazy imports
    and set-up (100-250 ms here), which a short round would count as its rate."""
    await _ws_rate(port, "warm-up", 1, 0.05)
    if stack != "websockets":
        await _post_rate(port, "warm-up", 2, 0.05)
        await _sse_latency(port, "warm-up-sse", 5, 1000.0)


async def _round(
    server: Server, stack: str, r: int, args: argparse.Namespace, row: dict[str, Any]
) -> None:
    port = server.port
    await _warm_up(port, stack)
    cases: list[tuple[str, int]] = [("ws", 1), ("ws", 8)]
    if stack != "websockets":
        cases = [("post", 1), ("post", 8), *cases]
    for kind, conns in cases:
        topic = f"{kind}-c{conns}-r{r}"
        cpu0, t0 = server.cpu_s(), time.perf_counter()
        n = await (_post_rate if kind == "post" else _ws_rate)(port, topic, conns, args.seconds)
        elapsed, cpu = time.perf_counter() - t0, server.cpu_s() - cpu0
        head = await _head_seq(port, topic) if kind == "post" else None
        if head is not None and head != n:
            raise RuntimeError(f"{stack}: {n} appends answered, head_seq {head} on {topic}")
        row[f"{kind}_c{conns}_per_s"].append(n / elapsed)
        row[f"{kind}_c{conns}_cpu_us"].append(cpu / n * 1e6 if n else float("nan"))
    if stack != "websockets":
        row["sse_latency_us"] += await _sse_latency(port, f"sse-r{r}", args.events, args.rate)


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Every selected stack, in interleaved rounds; the results as one JSON-able dict."""
    loop = args.loop
    unavailable = {s: why for s in args.stacks if (why := available(s)) is not None}
    stacks = [s for s in args.stacks if s not in unavailable]
    metrics = [f"{k}_c{c}_{m}" for k in ("post", "ws") for c in (1, 8) for m in ("per_s", "cpu_us")]
    rows = {s: {"stack": s, "what": STACKS[s][1], "pids": [], "sse_latency_us": [],
                **{m: [] for m in metrics}} for s in stacks}  # fmt: skip
    for r in range(args.rounds):
        for stack in stacks[r % len(stacks) :] + stacks[: r % len(stacks)] if stacks else []:
            server = Server(stack, loop)  # a fresh process per round: no state carried over
            rows[stack]["pids"].append(server.pid)
            try:
                asyncio.run(_round(server, stack, r, args, rows[stack]))
            finally:
                server.stop()
    out_rows = []
    for row in rows.values():
        lat = sorted(row.pop("sse_latency_us"))
        per_round = {m: v for m in metrics if (v := row.pop(m))}
        summary: dict[str, Any] = {m: statistics.median(v) for m, v in per_round.items()}
        summary["per_round"] = per_round
        if lat:
            summary |= {"sse_p50_us": percentile(lat, 0.5), "sse_p99_us": percentile(lat, 0.99),
                        "sse_max_us": lat[-1], "sse_events": len(lat)}  # fmt: skip
        out_rows.append({**row, **summary})
    versions = {}
    for dist in DISTS:
        with contextlib.suppress(metadata.PackageNotFoundError):
            versions[dist] = metadata.version(dist)
    return {
        "machine": _machine(os.getcwd()) | {"python": sys.version.split()[0]},
        "versions": versions,
        "settings": {
            "seconds": args.seconds,
            "rounds": args.rounds,
            "rate": args.rate,
            "events": args.events,
            "loop": loop,
            "payload_bytes": PAYLOAD,
        },
        "rows": out_rows,
        "unavailable": unavailable,
    }


def table(result: dict[str, Any]) -> str:
    """The results as a Markdown table (medians over rounds; latency over every event)."""

    def num(row: dict[str, Any], key: str, fmt: str = "{:,.0f}") -> str:
        return fmt.format(row[key]) if key in row else "-"

    s = result["settings"]
    lines = [
        f"CPU: {result['machine'].get('cpu', '?')} ({result['machine']['cpus']} cpus), "
        f"Python {result['machine']['python']}, loop {s['loop']}; {s['rounds']} rounds of "
        f"{s['seconds']} s per case, {s['payload_bytes']} B records, memory:// store; SSE at "
        f"{s['rate']:g}/s, {s['events']} events per round",
        "",
        "| stack | POST append/s, 1 conn | 8 conns | server CPU µs per append, 1 / 8 conns | "
        "append -> SSE p50 / p99 µs | WS append/s, 1 conn | 8 conns | server CPU µs per WS "
        "append, 8 conns |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for row in result["rows"]:
        cpu = f"{num(row, 'post_c1_cpu_us', '{:.0f}')} / {num(row, 'post_c8_cpu_us', '{:.0f}')}"
        lat = f"{num(row, 'sse_p50_us')} / {num(row, 'sse_p99_us')}"
        lines.append(
            f"| {row['what']} | {num(row, 'post_c1_per_s')} | {num(row, 'post_c8_per_s')} | "
            f"{cpu} | {lat} | {num(row, 'ws_c1_per_s')} | {num(row, 'ws_c8_per_s')} | "
            f"{num(row, 'ws_c8_cpu_us', '{:.0f}')} |"
        )
    for stack, why in result["unavailable"].items():
        lines.append(f"| {STACKS[stack][1]} | not measured: {why} | | | | | | |")
    versions = ", ".join(f"{k} {v}" for k, v in result["versions"].items())
    return "\n".join([*lines, "", f"Versions: {versions}"])


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seconds", type=float, default=1.0, help="per throughput case and round")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--rate", type=float, default=500.0, help="appends/s of the latency case")
    p.add_argument("--events", type=int, default=1000, help="appends per latency round")
    p.add_argument(
        "--stacks", default=",".join(STACKS), help="comma-separated, of " + ", ".join(STACKS)
    )
    p.add_argument(
        "--loop", choices=["asyncio", "uvloop"], default="asyncio", help="the servers' event loop"
    )
    p.add_argument("--json", help="also write the results here")
    p.add_argument("--serve", choices=list(STACKS), help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    args.stacks = [s.strip() for s in args.stacks.split(",") if s.strip()]
    if args.loop == "uvloop" and importlib.util.find_spec("uvloop") is None:
        p.error("--loop uvloop: uvloop is not installed")
    unknown = sorted(set(args.stacks) - set(STACKS))
    if unknown:
        p.error(f"unknown stack(s) {', '.join(unknown)}; known: {', '.join(STACKS)}")
    if not (0 < args.seconds <= 60 and 1 <= args.rounds <= 20 and 0 < args.rate <= 20000
            and 1 <= args.events <= 100_000):  # fmt: skip
        p.error(
            "bounds: 0 < seconds <= 60, 1 <= rounds <= 20, 0 < rate <= 20000, 1 <= events <= 100000"
        )
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.serve:
        serve(args.serve, args.loop)
        return 0
    result = run(args)
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(result, f, indent=1)
    print(table(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
