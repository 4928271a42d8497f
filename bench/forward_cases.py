"""Forwarding cases: frames/s from a sender in this process, through its store-and-forward slot
(``sf_dir``, ``sf_durability=memory``), over WebSocket on 127.0.0.1, into a ``tidelog serve``
process (a file:// store, so sender and receiver do not share a GIL). Two senders with the same
settings: tidelog's own ``Forwarder`` and the real QuestDB client, questdb 6.0.0 (Rust client
7.2.0, QWP to ``/api/v4/write``); each with plain acks and with ``request_durable_ack=on``.

The sender publishes one frame per call for ``ctx.seconds``; the clock stops when the last
frame is acknowledged (OK, or the durable ack). The client sends QWP messages made of rows, so
its frame is one row whose string column is sized to make the stored record about
``ctx.size`` bytes; the forwarder sends payloads of exactly that stored size. Afterwards the
receiver is stopped and the records it stored are counted and measured (``stored_b_*``)."""

from __future__ import annotations

import contextlib
import os
import selectors
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from tidelog.records import Tombstone

from .measure import Ctx, Metrics, payload, timed

__all__ = ["tidelog_forwarder", "questdb_client", "Receiver", "client_filler", "stored_sizes"]

#: bounds on every wait (seconds): a receiver's start and stop, the final acknowledgement
START_S = 30.0
STOP_S = 15.0
ACK_S = 120.0
#: bytes a one-row QWP message of questdb 6.0.0 adds around its string column (header, table
#: and column names, schema, timestamp): measured, the same for every frame of a connection;
#: each round reports the stored sizes it got (``stored_b_*``), so a change shows
ROW_OVERHEAD = 45


class Receiver:
    """``tidelog serve`` on 127.0.0.1 (a free port), topic ``events``, in its own process,
    started and stopped by PID; stdout gives the port, stderr goes to a file in ``root``."""

    def __init__(self, root: Path, durability: str = "disk", flush_ms: int = 10) -> None:
        self.root = root
        self.uri = f"file://{root / 'rx'}"
        argv = [sys.executable, "-m", "tidelog", "serve", "--uri", self.uri, "--topic", "events",
                "--host", "127.0.0.1", "--port", "0", "--flush-interval-ms", str(flush_ms),
                "--topic-option", f"durability={durability}"]  # fmt: skip
        self._err = open(root / "serve.err", "w+b")  # noqa: SIM115 (closed in stop)
        # cwd: never a checkout, whose ./tidelog folder `-m` would import instead of the package
        self.proc = subprocess.Popen(argv, cwd=root, stdout=subprocess.PIPE, stderr=self._err)
        try:
            self.port = self._port()
        except BaseException:
            self.stop()
            raise

    def _port(self) -> int:
        assert self.proc.stdout is not None
        with selectors.DefaultSelector() as sel:
            sel.register(self.proc.stdout, selectors.EVENT_READ)
            if not sel.select(START_S):
                raise RuntimeError(f"tidelog serve printed nothing in {START_S} s")
        line = self.proc.stdout.readline().decode()
        if not line.startswith("listening on ws://127.0.0.1:"):
            self._err.seek(0)
            raise RuntimeError(f"tidelog serve did not start: {line!r} {self._err.read()[-500:]!r}")
        return int(line.split(":")[2].split("/")[0])

    def stop(self) -> None:
        """SIGTERM (a clean stop), SIGKILL if it outlives ``STOP_S``; idempotent."""
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(STOP_S)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(self.proc.pid, signal.SIGKILL)
                self.proc.wait(STOP_S)
        if self.proc.stdout is not None:
            self.proc.stdout.close()
        self._err.close()


def stored_sizes(uri: str) -> list[int]:
    """The payload size of every record of topic ``events`` in the (stopped) receiver's store."""
    import tidelog

    sizes: list[int] = []
    with tidelog.open(f"{uri}?readonly=true") as store:
        topic = store.topic("events", create=False)
        after = 0
        while True:
            got = topic.read(after, 10_000)
            if not got:
                return sizes
            for item in got:
                if isinstance(item, Tombstone):  # a receiver's store never has one; a loss
                    raise RuntimeError(f"the receiver's store lost seqs {item}")
                sizes.append(len(item.payload))
            last = got[-1]
            after = last.gap_to if isinstance(last, Tombstone) else last.seq


def client_filler(size: int) -> str:
    """The string column of the client's row for a stored record of about ``size`` bytes."""
    return "x" * max(1, size - ROW_OVERHEAD)


def _metrics(n: int, elapsed: float, sent: float, sizes: list[int]) -> Metrics:
    if len(sizes) != n:
        raise RuntimeError(f"the receiver stored {len(sizes)} records for {n} frames sent")
    ordered = sorted(sizes)
    total = sum(sizes)
    return {
        "records": float(n),
        "rec_per_s": n / elapsed,
        "mb_per_s": total / elapsed / 1e6,
        "send_s": sent,
        "drain_s": elapsed - sent,
        "stored_b_median": float(ordered[len(ordered) // 2]),
        "stored_b_min": float(ordered[0]),
        "stored_b_max": float(ordered[-1]),
    }


def _conf(port: int, ctx: Ctx, durable: bool) -> str:
    """The settings both senders get (the client takes the forwarder's key names, SF-23)."""
    return (
        f"ws::addr=127.0.0.1:{port};sf_dir={Path(ctx.base) / 'sf'};sender_id=bench;"
        f"sf_durability=memory;request_durable_ack={'on' if durable else 'off'};"
    )


def tidelog_forwarder(ctx: Ctx, durable: bool) -> Metrics:
    from tidelog.forward import Forwarder

    rx = Receiver(Path(ctx.base))
    try:
        fwd = Forwarder(_conf(rx.port, ctx, durable))
        try:
            deadline = time.monotonic() + START_S  # connected before the clock, as the
            while not fwd.connected:  # client's establish() is
                if time.monotonic() > deadline:
                    raise RuntimeError(f"the forwarder did not connect in {START_S} s")
                time.sleep(0.001)
            data = payload(ctx.size)
            append = fwd.append
            t0 = time.perf_counter()
            n, _ = timed(lambda: append(data) >= 0, ctx.seconds)
            fwd.flush()
            sent = time.perf_counter() - t0
            if not fwd.wait_acked(timeout=ACK_S):
                raise RuntimeError(f"not acknowledged in {ACK_S} s: {fwd.counters()}")
            elapsed = time.perf_counter() - t0
        finally:
            fwd.close()
    finally:
        rx.stop()
    return _metrics(n, elapsed, sent, stored_sizes(rx.uri))


def questdb_client(ctx: Ctx, durable: bool) -> Metrics:
    from questdb import Sender, TimestampNanos  # ImportError: reported unavailable

    rx = Receiver(Path(ctx.base))
    try:
        sender = Sender.from_conf(_conf(rx.port, ctx, durable) + "auto_flush=off;")
        try:
            sender.establish()
            column: dict[str, Any] = {"p": client_filler(ctx.size)}
            row, flush = sender.row, sender.flush_and_get_fsn
            fsn = -1
            ts = 1_700_000_000_000_000_000

            def one() -> int:
                nonlocal fsn, ts
                ts += 1
                row("bench", columns=column, at=TimestampNanos(ts))
                got = flush()
                if got is not None:  # None: nothing was pending (never after a row)
                    fsn = got
                return 1

            t0 = time.perf_counter()
            n, _ = timed(one, ctx.seconds)
            sent = time.perf_counter() - t0
            # the OK level may answer first; with durable acks the durable one comes later
            deadline = time.monotonic() + ACK_S
            while not sender.await_acked_fsn(fsn, timeout_millis=1000):
                if time.monotonic() > deadline:
                    raise RuntimeError(f"FSN {fsn} not acknowledged in {ACK_S} s")
            elapsed = time.perf_counter() - t0
        finally:
            sender.close(flush=False)
    finally:
        rx.stop()
    return _metrics(n, elapsed, sent, stored_sizes(rx.uri))
