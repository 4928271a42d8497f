"""Router cases (spec/SPEC.md section 16): what routers cost a source append, and how soon a
copy is readable in dest, each beside the same measurement without routers (the baseline).

``route_rate``: single appends to a file:// source topic with 0, 1 or 4 routers (4 routers feed
4 dests), as ``tl_file_*`` measures them: rec/s, p50/p99 per call, and the WAL's writes, bytes and
fdatasyncs per source append (RTR-10: the copies join the source append's WAL write, so writes
per append should not grow with the fan-out). Afterwards every dest must hold one copy per
source append and every router's lag must be 0, else the case fails.

``route_latency``: one writer appends at a fixed, moderate rate (``RATE``); a reader thread
blocked in ``read(after, wait_ms=...)`` on the watched topic (dest with one router, the source
itself without routers) notes when each record becomes readable. Latency is from the moment
the writer calls ``append`` to that moment (p50/p99); the append call's own duration is
reported beside it.

Topics have the default options, as a user gets them (and as ``tl_file_*`` use them); what a
case writes is bounded instead by ``budget_bytes``: the rate loop stops once the source and
its dests would hold that many payload bytes, whatever the machine's speed.
"""

from __future__ import annotations

import os
import threading
import time
from typing import Any

import tidelog

from .cases import append_loop
from .measure import Ctx, Metrics, percentile

__all__ = ["route_rate", "route_latency", "RATE", "budget_bytes"]

#: appends per second of the latency cases: well below what an fsync append sustains
RATE = 1000
#: the latency cases' minimum number of samples (short runs)
MIN_SAMPLES = 100
#: seconds the latency reader waits for the next record before it reports the case as stuck
STUCK_S = 10.0


def budget_bytes(ctx: Ctx) -> int:
    """Payload bytes one rate case may append, copies included."""
    return (64 << 20) if ctx.quick else (256 << 20)


def _store(ctx: Ctx, durability: str, routers: int) -> tuple[Any, Any, list[Any]]:
    """A file:// store with topic ``src`` and ``routers`` dests ``dest-i``, each fed by router
    ``r-i`` from ``src``; all of ``durability``, otherwise default options."""
    store = tidelog.open(f"file://{os.path.join(ctx.base, 'store')}")
    try:
        src = store.topic("src", durability=durability)
        dests = [store.topic(f"dest-{i}", durability=durability) for i in range(routers)]
        for i in range(routers):
            store.router(f"r-{i}", "src", f"dest-{i}")
    except BaseException:
        store.close()
        raise
    return store, src, dests


def _check_copies(store: Any, src: Any, dests: list[Any]) -> None:
    """Every dest got one copy per source append and no router lags (RTR-4, RTR-8)."""
    head = src.state().head_seq
    for dest in dests:
        if dest.state().head_seq != head:
            raise RuntimeError(
                f"{dest.name} holds {dest.state().head_seq} copies of {head} source records"
            )
    lagging = {r.name: r.lag for r in store.routers() if r.lag}
    if lagging:
        raise RuntimeError(f"routers lag after the run: {lagging}")


def route_rate(ctx: Ctx, durability: str, routers: int) -> Metrics:
    """Single appends to ``src`` for ``ctx.seconds`` with ``routers`` routers out of it."""
    store, src, dests = _store(ctx, durability, routers)
    with store:
        limit = max(3, budget_bytes(ctx) // (ctx.size * (1 + routers)))
        out = append_loop(ctx, store, src, 1, max_records=limit)
        _check_copies(store, src, dests)
    out["routers"] = float(routers)
    return out


def _reader(
    watch: Any, first: int, seen: list[float], errors: list[BaseException], started: Any
) -> None:
    """Note when each seq from ``first`` on becomes readable in ``watch``, until all are."""
    clock = time.perf_counter
    after = first - 1
    last = first + len(seen) - 1
    try:
        started.set()
        while after < last:
            items = watch.read(after, 1000, wait_ms=int(STUCK_S * 1000))
            now = clock()
            if not items:
                raise RuntimeError(f"{watch.name}: nothing after seq {after} in {STUCK_S} s")
            for item in items:
                if not isinstance(item, tidelog.Record):
                    raise RuntimeError(f"{watch.name}: a tombstone in the latency run: {item}")
                seen[item.seq - first] = now
            after = items[-1].seq
    except BaseException as exc:  # re-raised by the writer's thread
        errors.append(exc)


def route_latency(ctx: Ctx, durability: str, routers: int) -> Metrics:
    """Appends at ``RATE`` per second; p50/p99 of append call -> readable in the watched topic
    (dest of the one router, or the source when ``routers`` is 0)."""
    n = max(MIN_SAMPLES, round(ctx.seconds * RATE))
    store, src, dests = _store(ctx, durability, routers)
    with store:
        watch = dests[0] if dests else src
        data = ctx.payload
        src.append(data)  # warm: files touched, first copy made
        first = watch.state().head_seq + 1
        if first != src.state().head_seq + 1:
            raise RuntimeError(f"{watch.name} is not in step with the source before the run")
        sent = [0.0] * n
        seen = [0.0] * n
        calls = [0.0] * n
        errors: list[BaseException] = []
        started = threading.Event()
        reader = threading.Thread(
            target=_reader, args=(watch, first, seen, errors, started), daemon=True
        )
        reader.start()
        started.wait(STUCK_S)
        clock, append, period = time.perf_counter, src.append, 1.0 / RATE
        t0 = due = clock()
        for i in range(n):
            delay = due - clock()
            if delay > 0:
                time.sleep(delay)
            sent[i] = clock()
            append(data)
            calls[i] = clock() - sent[i]
            due += period
            if errors:
                break
        reader.join(STUCK_S + 1.0)
        elapsed = clock() - t0
        if reader.is_alive():
            raise RuntimeError(f"the latency reader of {watch.name} did not finish")
        if errors:
            raise errors[0]
        _check_copies(store, src, dests)
    lat = sorted((seen[i] - sent[i]) * 1e6 for i in range(n))
    call = sorted(c * 1e6 for c in calls)
    return {
        "records": float(n),
        "rec_per_s": n / elapsed,
        "mb_per_s": n * ctx.size / elapsed / 1e6,
        "p50_us": percentile(lat, 0.5),
        "p99_us": percentile(lat, 0.99),
        "max_us": lat[-1],
        "min_us": lat[0],
        "append_p50_us": percentile(call, 0.5),
        "append_p99_us": percentile(call, 0.99),
        "routers": float(routers),
    }
