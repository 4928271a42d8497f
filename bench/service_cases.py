"""The service cases: ``tidelog serve`` beside NATS JetStream and Redis Streams, each a real
server in its own process on 127.0.0.1 (``service_servers``), driven by the same load
generator (``service_clients``: asyncio in the bench process, one connection per client, one
request in flight per connection, each system through its usual Python client). A fresh server
per case and round, stopped by PID, its files in the case's temp dir.

``append_rate``: durable appends from ``clients`` concurrent clients, one record per request
(tidelog: a ``durability=fsync`` topic, raw ``POST .../records``; JetStream: ``publish``
awaiting its PubAck; Redis: ``XADD``), for ``ctx.seconds``: rec/s, p50/p99 of each request,
client and server CPU per record. Afterwards the system must hold exactly the answered appends.

``push_latency``: one client appends at a fixed ``RATE`` (one request in flight; an append
that answers later than the next one is due delays the schedule, never bunches it: the row's
``rec_per_s`` is the rate reached) while one live stream on another
connection of the same process receives (tidelog SSE ``GET .../events``, a JetStream push
consumer, ``XREAD BLOCK``). **Latency** is from just before the append request is handed to the
client library to the moment the stream's task has decoded that record (the same process, the
same ``time.perf_counter`` clock, the same event loop, for all three). Also reported: the
append's own round trip, and event minus the append's answer (negative when the event came
first), SVC-29's measure.

``consume_rate``: ``prefill`` records are stored first (not timed), then one client takes
them in batches of ``BATCH`` and acknowledges each batch with one call (JetStream: pull consumer
``fetch`` + ``ack_sync`` of the last with AckPolicy all; Redis: ``XREADGROUP`` + ``XACK`` of the
batch's ids; tidelog: ``POST .../poll`` + ``.../commit`` of the last seq). Afterwards the
system must show exactly the consumed records as acknowledged.

``priority_latency`` (tidelog only): ``push_latency`` on a topic of priority 1000 (its appends
sent with ``X-Tidelog-No-Throttle: 1``, SVC-45), idle, and while a load process
(``service_load``) appends as fast as the server answers to ``LOW_TOPICS`` topics of priority
-1000, each with an SSE stream, after ``SATURATE_S`` of that load (the governor's samples,
SVC-41, SVC-42). The loaded row reports the low topics' append rate and the server's CPU use
over the measured window, and what the load saw (429s, deferrals).
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import os
import selectors
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from . import service_servers as servers
from .measure import Ctx, Metrics, percentile

if TYPE_CHECKING:  # imported when a case runs: service_clients -> http_stacks -> harness -> here
    from .service_clients import Driver

__all__ = [
    "append_rate",
    "push_latency",
    "consume_rate",
    "priority_latency",
    "SYSTEMS",
    "RATE",
    "BATCH",
    "MIN_SAMPLES",
    "WARM",
    "LOW_TOPICS",
    "LOW_WRITERS",
    "SATURATE_S",
]

#: system -> (start its server in a dir, the name of its driver class in service_clients, the
#: Python client it needs: the ``bench`` extra's)
SYSTEMS: dict[str, tuple[Callable[[Path], servers.ServerProcess], str, str | None]] = {
    "tidelog": (servers.tidelog_server, "TidelogDriver", None),
    "nats": (servers.nats_server, "NatsDriver", "nats"),
    "redis": (servers.redis_server, "RedisDriver", "redis"),
}
#: appends per second of the latency cases: moderate, sustained by every system here
RATE = 500
#: latency samples at least (short runs), and appends before them that are not counted
MIN_SAMPLES, WARM = 100, 20
#: records per fetch and per acknowledgement of the consume cases
BATCH = 100
#: prefill of the consume cases: records per second of ``ctx.seconds``, within these bounds
PREFILL_PER_S, PREFILL_MIN, PREFILL_MAX = 50_000, 1_000, 200_000
#: payload bytes one append case may write (a fast machine stops there)
BUDGET_BYTES = 256 << 20
#: the priority cases: low-priority topics, the load's writers, seconds of load before measuring
LOW_TOPICS, LOW_WRITERS, SATURATE_S = 4, 8, 1.5
#: seconds an awaited event may take before the case fails; the load process's bounds
STUCK_S, LOAD_START_S, LOAD_STOP_S = 10.0, 30.0, 10.0


def _run(ctx: Ctx, system: str, body: Callable[[servers.ServerProcess], Any]) -> Metrics:
    """Start ``system``'s server in the case's dir, run ``body(server)`` (a coroutine function)
    on a new event loop, stop the server whatever happens."""
    start, _, client = SYSTEMS[system]
    if client is not None and importlib.util.find_spec(client) is None:  # before any install
        raise ImportError(f"{client} (the {system} client; pip install 'tidelog[bench]')")
    with start(Path(ctx.base)) as srv:
        out: Metrics = asyncio.run(body(srv))
    return out


def _driver(system: str, srv: servers.ServerProcess, topic: str) -> Driver:
    from . import service_clients

    driver: Driver = getattr(service_clients, SYSTEMS[system][1])(srv.port, topic)
    return driver


class _Cpu:
    """Server and client (this process) CPU seconds over a window, per record."""

    def __init__(self, srv: servers.ServerProcess) -> None:
        self.srv = srv
        self.server0, self.client0, self.wall0 = (
            srv.cpu_s(),
            time.process_time(),
            time.perf_counter(),
        )

    def per_record(self, n: int) -> Metrics:
        server, client = self.srv.cpu_s() - self.server0, time.process_time() - self.client0
        wall = time.perf_counter() - self.wall0
        return {
            "server_cpu_us_per_rec": server / max(n, 1) * 1e6,
            "client_cpu_us_per_rec": client / max(n, 1) * 1e6,
            "server_cpu_share": server / wall if wall > 0 else 0.0,
        }


# -- durable appends ------------------------------------------------------------------------------
def append_rate(ctx: Ctx, system: str, clients: int) -> Metrics:
    async def body(srv: servers.ServerProcess) -> Metrics:
        drv = _driver(system, srv, "append")
        try:
            return await _append_rate(ctx, drv, srv, clients)
        finally:
            await drv.close()

    return _run(ctx, system, body)


async def _append_rate(ctx: Ctx, drv: Driver, srv: servers.ServerProcess, clients: int) -> Metrics:
    await drv.setup()
    conns = [await drv.appender() for _ in range(clients)]
    data = ctx.payload
    try:
        for append, _ in conns:  # warm: every connection's first request, not timed
            await append(data)
        before = await drv.stored()
        per_client = max(3, BUDGET_BYTES // ctx.size // clients)
        counts = [0] * clients
        lat: list[float] = []
        clock = time.perf_counter
        cpu = _Cpu(srv)
        t0 = clock()
        end = t0 + ctx.seconds

        async def one(i: int) -> None:
            append, n, mine = conns[i][0], 0, []
            while True:
                s = clock()
                await append(data)
                e = clock()
                mine.append((e - s) * 1e6)
                n += 1
                if n >= 3 and (e >= end or n >= per_client):
                    break
            counts[i] = n
            lat.extend(mine)

        await asyncio.gather(*(one(i) for i in range(clients)))
        elapsed = clock() - t0
        n = sum(counts)
        out = cpu.per_record(n)
    finally:
        for _, close in conns:
            got = close()
            if asyncio.iscoroutine(got):
                await got
    stored = await drv.stored()
    if stored != before + n:
        raise RuntimeError(f"{drv.name}: {n} appends answered, {stored - before} stored")
    lat.sort()
    return {
        **out,
        "records": float(n),
        "rec_per_s": n / elapsed,
        "clients": float(clients),
        "mb_per_s": n * ctx.size / elapsed / 1e6,
        "p50_us": percentile(lat, 0.5),
        "p99_us": percentile(lat, 0.99),
    }


# -- append -> live delivery ----------------------------------------------------------------------
def push_latency(ctx: Ctx, system: str) -> Metrics:
    async def body(srv: servers.ServerProcess) -> Metrics:
        drv = _driver(system, srv, "push")
        try:
            await drv.setup()
            return await _push(ctx, drv, srv)
        finally:
            await drv.close()

    return _run(ctx, system, body)


def _indexed(size: int, i: int) -> bytes:
    """A payload of ``size`` bytes (at least 8) carrying index ``i`` in its first 8."""
    return i.to_bytes(8, "big") + bytes(max(0, size - 8))


async def _push(ctx: Ctx, drv: Driver, srv: servers.ServerProcess) -> Metrics:
    n = max(MIN_SAMPLES, round(ctx.seconds * RATE))
    total = WARM + n
    clock = time.perf_counter
    sent, answered, got = [0.0] * total, [0.0] * total, [0.0] * total
    arrived = dups = 0
    all_in = asyncio.Event()

    def on_payload(p: bytes) -> None:
        nonlocal arrived, dups
        i = int.from_bytes(p[:8], "big")
        if i >= total:
            raise RuntimeError(f"{drv.name}: a record the case did not append: {p[:16]!r}")
        if got[i]:
            dups += 1
            return
        got[i] = clock()
        arrived += 1
        if arrived == total:
            all_in.set()

    append, close = await drv.appender()
    live = await drv.live(on_payload)
    payloads = [_indexed(ctx.size, i) for i in range(total)]
    try:
        period = 1.0 / RATE
        cpu: _Cpu | None = None
        due = clock()
        for i in range(total):
            if i == WARM:
                cpu = _Cpu(srv)
            delay = due - clock()
            if delay > 0:
                await asyncio.sleep(delay)
            sent[i] = clock()
            await append(payloads[i])
            answered[i] = clock()
            due = max(due + period, answered[i])  # behind: no burst to catch up
            if live.task is not None and live.task.done():
                break
        waiter = asyncio.create_task(all_in.wait())
        pending = {waiter} | ({live.task} if live.task is not None else set())
        await asyncio.wait(pending, timeout=STUCK_S, return_when=asyncio.FIRST_COMPLETED)
        waiter.cancel()
        if live.task is not None and live.task.done():
            raise live.task.exception() or RuntimeError(f"{drv.name}: the live stream ended")
        if not all_in.is_set():
            raise RuntimeError(
                f"{drv.name}: {total - arrived} of {total} records not delivered within {STUCK_S} s"
            )
        assert cpu is not None
        out = cpu.per_record(n)
    finally:
        await live.close()
        got_close = close()
        if asyncio.iscoroutine(got_close):
            await got_close
    span = slice(WARM, total)
    lat = sorted((g - s) * 1e6 for g, s in zip(got[span], sent[span]))
    call = sorted((a - s) * 1e6 for a, s in zip(answered[span], sent[span]))
    after = sorted((g - a) * 1e6 for g, a in zip(got[span], answered[span]))
    out |= {
        "records": float(n),
        "rec_per_s": (n - 1) / (sent[total - 1] - sent[WARM]),
        "p50_us": percentile(lat, 0.5),
        "p99_us": percentile(lat, 0.99),
        "min_us": lat[0],
        "max_us": lat[-1],
        "append_p50_us": percentile(call, 0.5),
        "append_p99_us": percentile(call, 0.99),
        "after_answer_p50_us": percentile(after, 0.5),
        "after_answer_p99_us": percentile(after, 0.99),
        "before_answer_share": sum(1 for a in after if a < 0) / n,
        "duplicates": float(dups),
    }
    for note, count in live.notes.items():
        out[f"events_{note}"] = float(count)
    return out


# -- consume + ack --------------------------------------------------------------------------------
def prefill_count(ctx: Ctx) -> int:
    return min(PREFILL_MAX, max(PREFILL_MIN, int(ctx.seconds * PREFILL_PER_S)))


def consume_rate(ctx: Ctx, system: str) -> Metrics:
    async def body(srv: servers.ServerProcess) -> Metrics:
        drv = _driver(system, srv, "consume")
        try:
            return await _consume(ctx, drv, srv)
        finally:
            await drv.close()

    return _run(ctx, system, body)


async def _consume(ctx: Ctx, drv: Driver, srv: servers.ServerProcess) -> Metrics:
    total = prefill_count(ctx)
    await drv.setup()
    await drv.prefill(total, ctx.payload)
    if (stored := await drv.stored()) != total:
        raise RuntimeError(f"{drv.name}: {stored} records stored of {total} prefilled")
    fetch, ack = await drv.consumer(BATCH)
    clock = time.perf_counter
    n = calls = 0
    cpu = _Cpu(srv)
    t0 = clock()
    end = t0 + ctx.seconds
    while n < total:
        k = await fetch()
        if k == 0:
            raise RuntimeError(f"{drv.name}: nothing handed out after {n} of {total} records")
        acked = await ack()
        if acked >= 0 and acked != k:
            raise RuntimeError(f"{drv.name}: {acked} records acknowledged of a batch of {k}")
        n += k
        calls += 1
        if calls >= 3 and clock() >= end:
            break
    elapsed = clock() - t0
    out = cpu.per_record(n)
    await drv.check_consumed(n)
    return {
        **out,
        "records": float(n),
        "rec_per_s": n / elapsed,
        "mb_per_s": n * ctx.size / elapsed / 1e6,
        "batch": float(BATCH),
        "prefill": float(total),
        "drained": float(n == total),
    }


# -- priority: a high-priority topic's push while low-priority topics saturate the server ---------
class LoadProcess:
    """``python -m tidelog.bench.service_load`` against ``port``: started, waited for (its
    ``READY`` line), stopped by PID; ``stop`` returns the JSON it printed last."""

    def __init__(self, root: Path, port: int, topics: list[str], size: int, seconds: float) -> None:
        argv = [
            sys.executable,
            "-m",
            "tidelog.bench.service_load",
            "--port",
            str(port),
            "--seconds",
            f"{seconds:.3f}",
            "--size",
            str(size),
            "--writers",
            str(LOW_WRITERS),
            *topics,
        ]
        self._err = open(root / "load.err", "w+b")  # noqa: SIM115 (closed in stop)
        self.proc = subprocess.Popen(
            argv, cwd=root, stdout=subprocess.PIPE, stderr=self._err, stdin=subprocess.DEVNULL
        )
        try:
            line = self._line(LOAD_START_S)
            if line.strip() != b"READY":
                raise RuntimeError(f"the load process did not start: {line!r} {self._tail()}")
        except BaseException:
            self.stop()
            raise

    def _line(self, timeout: float) -> bytes:
        assert self.proc.stdout is not None
        with selectors.DefaultSelector() as sel:
            sel.register(self.proc.stdout, selectors.EVENT_READ)
            if not sel.select(timeout):
                return b""
        return self.proc.stdout.readline()

    def _tail(self) -> str:
        self._err.seek(0)
        return self._err.read()[-800:].decode(errors="replace")

    def stop(self) -> dict[str, Any]:
        """SIGTERM (it prints its figures and exits), SIGKILL after ``LOAD_STOP_S``."""
        stats: dict[str, Any] = {}
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGTERM)
        try:
            line = self._line(LOAD_STOP_S)
            if line.startswith(b"{"):
                stats = json.loads(line)
            self.proc.wait(LOAD_STOP_S)
        except subprocess.TimeoutExpired:
            os.kill(self.proc.pid, signal.SIGKILL)
            self.proc.wait(LOAD_STOP_S)
        finally:
            if self.proc.stdout is not None:
                self.proc.stdout.close()
            tail = self._tail()
            self._err.close()
        if self.proc.returncode not in (0, -signal.SIGTERM) or "error" in stats:
            raise RuntimeError(
                f"the load process failed ({self.proc.returncode}): {stats.get('error', '')} {tail}"
            )
        return stats


def priority_latency(ctx: Ctx, loaded: bool) -> Metrics:
    from .service_clients import TidelogDriver

    async def body(srv: servers.ServerProcess) -> Metrics:
        hi = TidelogDriver(srv.port, "hi", durability="disk", priority=1000, no_throttle=True)
        lows = [
            TidelogDriver(srv.port, f"lo-{i}", durability="disk", priority=-1000)
            for i in range(LOW_TOPICS)
        ]
        load: LoadProcess | None = None
        try:
            for drv in (hi, *lows):
                await drv.setup()
            if loaded:
                n = max(MIN_SAMPLES, round(ctx.seconds * RATE)) + WARM
                seconds = SATURATE_S + n / RATE + STUCK_S  # its own bound; stopped before
                load = LoadProcess(
                    Path(ctx.base), srv.port, [d.topic for d in lows], ctx.size, seconds
                )
                await asyncio.sleep(SATURATE_S)
            heads = [await d.head_seq() for d in lows]
            t0 = time.perf_counter()
            out = await _push(ctx, hi, srv)
            elapsed = time.perf_counter() - t0
            low = sum([await d.head_seq() for d in lows]) - sum(heads)
            out["low_rec_per_s"] = low / elapsed
            if load is not None:
                stats, load = load.stop(), None
                out["low_throttled"] = float(stats["throttled"])
                out["low_events"] = float(stats["events"])
                for note, count in stats["notes"].items():
                    out[f"low_events_{note}"] = float(count)
            return out
        finally:
            if load is not None:
                load.stop()
            for drv in (hi, *lows):
                await drv.close()

    return _run(ctx, "tidelog", body)
