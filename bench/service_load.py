"""The low-priority load of the priority case (``service_cases.priority_latency``), in its own
process so that it competes for the server, not for the measuring client's event loop:

    python -m tidelog.bench.service_load --port P --seconds S --size B --writers W TOPIC...

One SSE stream per topic (counting the records it receives and its other events, e.g.
``deferred``/``resumed`` of a deferral) and ``W`` writers appending raw records round-robin over the
topics as fast as the server answers, each with one request in flight. A 429 (SVC-44) is
honoured: the writer waits the answer's ``retry_after_ms`` (at most what is left of the run) and
counts it. Prints ``READY`` once every connection is open, and on SIGTERM or after ``S``
seconds one JSON line: appended, throttled, events, notes (or ``error``)."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import signal
import sys
import time
from typing import Any

from .service_clients import TidelogDriver, TidelogHttp, raw_append


async def _writer(
    http: TidelogHttp,
    topic: str,
    data: bytes,
    stop: asyncio.Event,
    deadline: float,
    stats: dict[str, Any],
) -> None:
    raw = raw_append(topic, data)
    while not stop.is_set():
        http.writer.write(raw)
        status, _, body = await http.answer()
        if status == 200:
            stats["appended"] += 1
        elif status == 429:
            stats["throttled"] += 1
            wait_ms = json.loads(body)["error"].get("retry_after_ms", 1000)
            left = deadline - time.monotonic()
            if left <= 0:
                return
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), min(wait_ms / 1000, left))
        else:
            raise RuntimeError(f"append to {topic}: HTTP {status}: {body[:300]!r}")


async def run(
    port: int, seconds: float, size: int, writers: int, topics: list[str]
) -> dict[str, Any]:
    stats: dict[str, Any] = {"appended": 0, "throttled": 0, "events": 0, "notes": {}}
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    deadline = time.monotonic() + seconds
    drivers = [TidelogDriver(port, t) for t in topics]
    lives = []

    def on_payload(_: bytes) -> None:
        stats["events"] += 1

    conns: list[TidelogHttp] = []
    try:
        for drv in drivers:
            lives.append(await drv.live(on_payload))
        for _ in range(writers):
            conns.append(await drivers[0].conn())
        print("READY", flush=True)
        tasks = [
            asyncio.create_task(
                _writer(conns[i], topics[i % len(topics)], bytes(size), stop, deadline, stats)
            )
            for i in range(writers)
        ]
        watched = [*tasks, *(live.task for live in lives if live.task is not None)]
        stopped = asyncio.create_task(stop.wait())
        await asyncio.wait(
            [*watched, stopped],
            timeout=max(0.0, deadline - time.monotonic()),
            return_when=asyncio.FIRST_COMPLETED,
        )
        stop.set()
        failed = [t.exception() for t in watched if t.done() and not t.cancelled()]
        for task in [*tasks, stopped]:
            task.cancel()
        await asyncio.gather(*tasks, stopped, return_exceptions=True)
        for exc in failed:
            if exc is not None:
                raise exc
    finally:
        for live in lives:
            for note, count in live.notes.items():
                stats["notes"][note] = stats["notes"].get(note, 0) + count
            await live.close()
        for conn in conns:
            conn.close()
        for drv in drivers:
            await drv.close()
    return stats


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--seconds", type=float, required=True)
    p.add_argument("--size", type=int, default=100)
    p.add_argument("--writers", type=int, default=8)
    p.add_argument("topics", nargs="+")
    a = p.parse_args(argv)
    try:
        stats = asyncio.run(run(a.port, a.seconds, a.size, a.writers, a.topics))
    except Exception as exc:  # reported to the bench, which fails the case with it
        print(json.dumps({"error": f"{type(exc).__name__}: {exc}"}), flush=True)
        return 1
    print(json.dumps(stats), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
