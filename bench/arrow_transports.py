"""The service's Arrow read (HTTP, spec/SERVICE.md SVC-61) beside an Arrow Flight ``do_get``
serving the same batches, side by side in one process on 127.0.0.1 (not a test; prints two
lines). Both serve ``reading.read_store`` on the owner's store; the client reads the whole range.

    python bench/arrow_transports.py [--rows 1000000] [--runs 7] [--tail]

``--tail`` keeps the owner open with nothing sealed (the unsealed tail); otherwise every record
is in sealed segments. Client and servers share one process (and its GIL): the figures compare
the two transports, they are not what a remote executor gets.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
import threading
import time
from typing import Any

import pyarrow.flight as fl

import tidelog
from tidelog.adapters.spark import reading
from tidelog.adapters.spark.options import parse_options
from tidelog.service.server import ServiceThread


class _Flight(fl.FlightServerBase):  # type: ignore[misc]
    """``do_get(b"lo:hi")``: the batches the Arrow read would send."""

    def __init__(self, store: tidelog.Store, root: str) -> None:
        super().__init__("grpc://127.0.0.1:0")
        self.store, self.root = store, root

    def do_get(self, context: Any, ticket: Any) -> Any:
        lo, hi = map(int, ticket.ticket.decode().split(":"))
        opts = parse_options({"path": self.root, "topic": "b"})
        batches = reading.read_store(self.store, opts, lo, hi)
        first = next(batches)

        def all_batches() -> Any:
            yield first
            yield from batches

        return fl.GeneratorStream(first.schema, all_batches())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--runs", type=int, default=7)
    ap.add_argument("--tail", action="store_true")
    args = ap.parse_args()
    work = tempfile.mkdtemp(prefix="tidelog-arrow-transports-")
    root = os.path.join(work, "store")
    store = tidelog.open(f"file://{root}?segment_max_records=500000&checkpoint_bytes=64GiB")
    t = store.topic("b", durability="disk", trim="none")
    data = os.urandom(100 * 10_000)
    for start in range(0, args.rows, 10_000):
        n = min(10_000, args.rows - start)
        t.append_many([data[i * 100 : (i + 1) * 100] for i in range(n)], tag="b")
    if not args.tail:
        store.close()
        store = tidelog.open(f"file://{root}")  # every record sealed
    flight = _Flight(store, root)
    threading.Thread(target=flight.serve, daemon=True).start()
    client = fl.connect(f"grpc://127.0.0.1:{flight.port}")
    service = ServiceThread(store).start()
    opts = parse_options({"path": service.url, "topic": "b"})

    def via_flight() -> int:
        return sum(c.data.num_rows for c in client.do_get(fl.Ticket(f"1:{args.rows}".encode())))

    def via_http() -> int:
        return sum(b.num_rows for b in reading.read_log(opts, 1, args.rows))

    cases = {"flight": via_flight, "http": via_http}
    times: dict[str, list[tuple[float, float]]] = {k: [] for k in cases}
    try:
        for fn in cases.values():
            assert fn() == args.rows  # warm-up
        for _ in range(args.runs):
            for name, fn in cases.items():
                c0, t0 = time.process_time(), time.perf_counter()
                fn()
                times[name].append((time.perf_counter() - t0, time.process_time() - c0))
        for name, runs in times.items():
            walls = [w for w, _ in runs]
            cpu = statistics.median(c for _, c in runs)
            print(
                f"{name:7} {args.rows / statistics.median(walls):>12,.0f} rows/s median "
                f"[{args.rows / max(walls):,.0f}-{args.rows / min(walls):,.0f}], process CPU "
                f"{cpu / args.rows * 1e9:.0f} ns/row"
            )
    finally:
        service.stop()
        flight.shutdown()
        store.close()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
