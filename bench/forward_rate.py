"""Forwarded records/s over loopback, durable acks on and off (spec/FORWARD.md; not a test).

    python bench/forward_rate.py [--frames 50000] [--payload 100] [--source slot|memory|topic]
                                 [--sf-durability memory|flush|append] [--rx-durability disk|fsync]
                                 [--repeat 3]

The receiver runs as a separate process (``tidelog serve``, a file:// store) so sender and
receiver do not share a GIL; the sender appends ``--frames`` frames as fast as it can and the
clock stops when the last one is acknowledged (OK, or the durable ack in durable mode).
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import tidelog
from tidelog.bench.forward_cases import Receiver
from tidelog.forward import Forwarder, InstancesForwarder


def run(args: argparse.Namespace, durable: bool) -> dict[str, Any]:
    root = Path(tempfile.mkdtemp(prefix="tidelog-fwd-bench-"))
    rx = Receiver(root, args.rx_durability, args.flush_ms)  # started and stopped by PID
    port = rx.port
    payload = b"x" * args.payload
    conf = (
        f"ws::addr=127.0.0.1:{port};sender_id=bench;"
        f"request_durable_ack={'on' if durable else 'off'};"
        f"sf_max_total_bytes=1G;close_flush_timeout_millis=0;"
    )
    store = None
    fwd: Forwarder | InstancesForwarder
    try:
        if args.source == "slot":
            conf += f"sf_dir={root / 'sf'};sf_durability={args.sf_durability};sf_max_bytes=16M;"
            fwd = Forwarder(conf)
            t0 = time.perf_counter()
            for _ in range(args.frames):
                fwd.append(payload)
            fwd.flush()
        elif args.source == "memory":
            fwd = Forwarder(conf)
            t0 = time.perf_counter()
            for _ in range(args.frames):
                fwd.append(payload)
        else:
            store = tidelog.open(f"file://{root / 'src'}")
            topic = store.topic("out", durability="disk")
            batch = [payload] * 1000
            for _ in range(args.frames // 1000):
                topic.append_many(batch)
            fwd = Forwarder.for_topic(conf, topic)
            t0 = time.perf_counter()
        appended = time.perf_counter() - t0
        if not fwd.wait_acked(timeout=600):
            raise SystemExit(f"not drained: {fwd.counters()}")
        elapsed = time.perf_counter() - t0
        counters = fwd.counters()
        fwd.close()
    finally:
        if store is not None:
            store.close()
        rx.stop()
        shutil.rmtree(root, ignore_errors=True)
    n = counters["published_fsn"] + 1  # type: ignore[operator]
    return {
        "durable_ack": durable,
        "source": args.source,
        "frames": n,
        "payload_bytes": args.payload,
        "records_per_s": round(n / elapsed),
        "mb_per_s": round(n * args.payload / elapsed / 1e6, 2),
        "append_s": round(appended, 3),
        "drain_s": round(elapsed, 3),
        "connections": counters["connections"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--frames", type=int, default=50_000)
    parser.add_argument("--payload", type=int, default=100)
    parser.add_argument("--source", choices=["slot", "memory", "topic"], default="slot")
    parser.add_argument("--sf-durability", choices=["memory", "flush", "append"], default="memory")
    parser.add_argument("--rx-durability", choices=["disk", "fsync"], default="disk")
    parser.add_argument("--flush-ms", type=int, default=10, help="receiver group-commit interval")
    parser.add_argument("--repeat", type=int, default=3, help="runs per mode, interleaved")
    args = parser.parse_args()
    rates: dict[bool, list[int]] = {False: [], True: []}
    for _ in range(args.repeat):
        for durable in (False, True):  # interleaved, so drift in machine load hits both
            result = run(args, durable)
            rates[durable].append(int(result["records_per_s"]))
            print(json.dumps(result), flush=True)
    off, on = statistics.median(rates[False]), statistics.median(rates[True])
    print(
        f"forwarded records/s over loopback, {args.frames} frames of {args.payload} B payload "
        f"(source {args.source}, sf_durability {args.sf_durability}, receiver topic "
        f"{args.rx_durability}, group commit {args.flush_ms} ms), median of {args.repeat}:\n"
        f"  durable-ack off: {off:>9,.0f} records/s\n"
        f"  durable-ack on:  {on:>9,.0f} records/s   (on/off = {on / off:.2f})"
    )


if __name__ == "__main__":
    main()
