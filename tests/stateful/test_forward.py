"""A real forwarder against a real receiver on 127.0.0.1, through a fault-injecting proxy
(spec/FORWARD.md FWD-5..FWD-24, SPEC FSN-1..FSN-10).

Seeded scenarios: each draws durable-ack on/off, the source (SF slot or tidelog topic), error
policies and a sequence of actions -- publish, drop the connection, close it with any code,
inject an error frame of every category in place of an OK, hold durable acks back and release
them reordered, refuse upgrades (404, 421, 503), restart the receiver, restart the sender,
delete records from a topic source (holes) -- then heals the faults and drains. Checked:

- the forwarder's trace, replayed into ``ForwarderModel`` (the oracle), gives the same
  recovered seed (FSN-5), the same frames in the same order on every connection (FSN-1,
  FSN-6), and the same ``ackedFsn`` after every response frame (FWD-6, FWD-7, FWD-9, FWD-11);
- at every single acknowledgement, ``ackedFsn`` is at most what the receiver had confirmed by
  then through the proxy -- OK/error frames, or in durable mode durable acks covering the OKs
  -- apart from FSNs deleted from a topic source (FSN-3, FSN-10);
- at the receiver, per sender: FSNs strictly increasing (no reordering), no FSN twice (no
  duplicates), every payload byte-identical, and at the end every published FSN present
  (nothing acknowledged is lost; nothing is lost at all, since injected errors replace the OK of
  a frame the receiver stored).

A second test SIGKILLs and restarts a sender process (SF slot, durable acks) and the receiver
process (``tidelog serve``) under load, checking recovery against the model after every kill.

Every scenario appends what it injected to TIDELOG_FORWARD_REPORT (one JSON line); ``python3
run.py tests`` prints the totals. Default CI: DEFAULT_SCENARIOS scenarios of DEFAULT_STEPS steps
(seeds 5005, 5006, ...) and DEFAULT_KILLS kills. Longer campaigns: ``python3 run.py forward``
(TIDELOG_FORWARD_SCENARIOS, TIDELOG_FORWARD_STEPS, TIDELOG_FORWARD_KILLS, TIDELOG_FORWARD_SEED).
A failure names its scenario seed: rerun it with TIDELOG_FORWARD_SEED=<seed>
TIDELOG_FORWARD_SCENARIOS=1. Nothing here asserts on time: waits are events with generous
limits, and a scenario's checks hold whatever the timing.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import websockets
from websockets.asyncio.server import ServerConnection, serve
from websockets.exceptions import ConnectionClosed, InvalidStatus

import tidelog
from tidelog.backends.sf.recovery import read_watermark, recover
from tidelog.forward import Forwarder, Receiver, SenderFailed, wire
from tidelog.forward.dedup import forwarded
from tidelog.model.fsn import ForwarderModel, effective_policy, status_category

DEFAULT_SCENARIOS = 32
DEFAULT_STEPS = 16
DEFAULT_KILLS = 6
SCENARIOS = int(os.environ.get("TIDELOG_FORWARD_SCENARIOS", DEFAULT_SCENARIOS))
STEPS = int(os.environ.get("TIDELOG_FORWARD_STEPS", DEFAULT_STEPS))
KILLS = int(os.environ.get("TIDELOG_FORWARD_KILLS", DEFAULT_KILLS))
BASE_SEED = int(os.environ.get("TIDELOG_FORWARD_SEED", "5005"))
SMALL_WAL = "wal_file_bytes=1MiB"
WAIT = 30.0  # generous: a timeout is a failure, never a correctness mechanism
TERMINAL_CODES = (1002, 1003, 1007, 1008, 1009, 1010)
RECONNECT_CODES = (1000, 1001, 1011, 1012, 4000)
ERROR_STATUSES = (3, 5, 6, 8, 9, 4, 0x07, 0xFF)  # every category, and UNKNOWN


def payload(fsn: int) -> bytes:
    """Deterministic, varied sizes (so segments rotate at different frames)."""
    return f"frame-{fsn:06d}-".encode() + bytes([fsn % 251]) * (fsn * 37 % 90)


def report(kind: str, seed: int, faults: dict[str, int]) -> None:
    """One line per scenario: what was injected. ``python3 run.py tests`` sums the lines of
    TIDELOG_FORWARD_REPORT into the fault count of the run (noxfile.py)."""
    line = json.dumps({"kind": kind, "seed": seed, "faults": faults}, sort_keys=True)
    print(line)
    path = os.environ.get("TIDELOG_FORWARD_REPORT")
    if path:
        with open(path, "a", encoding="utf-8") as f:
            f.write(line + "\n")  # one short append per line: whole lines across workers


# ---------------------------------------------------------------------------------------------
# the fault-injecting proxy
# ---------------------------------------------------------------------------------------------
_PASS_REQUEST = (
    wire.H_MAX_VERSION,
    wire.H_CLIENT_ID,
    wire.H_REQUEST_DURABLE_ACK,
    wire.H_FSN_AT_ZERO,
)
_PASS_RESPONSE = (wire.H_VERSION, wire.H_DURABLE_ACK, wire.H_LAST_FSN)


@dataclass(eq=False)
class _Pair:
    client: ServerConnection
    upstream: Any
    client_id: str
    fsn_at_zero: int
    durable: bool
    relayed: int = 0  # frames relayed client -> receiver on this connection
    held: list[bytes] = field(default_factory=list)
    # durable mode: (fsn, seqTxns) of every OK passed to the sender, in order (an injected
    # error counts as an entry without tables: the sender may drop it), and the watermarks of
    # the durable acks passed so far
    entries: list[tuple[int, dict[str, int]]] = field(default_factory=list)
    watermarks: dict[str, int] = field(default_factory=dict)


class FaultProxy:
    """A WebSocket man in the middle. ``bound(client)`` is the highest FSN the receiver has
    confirmed to the sender through it -- by an OK or error frame, or in durable mode by a
    durable ack covering the frame's OK: an upper bound of any correct ``ackedFsn`` (FSN-3),
    computed from what really crossed the wire."""

    def __init__(self, upstream: Callable[[], int | None], rng: random.Random) -> None:
        self.upstream = upstream
        self.rng = rng
        self.port = 0
        self.refuse: int | None = None  # HTTP status for upgrades, or None
        self.hold = False
        self.inject: list[int] = []  # statuses to put in place of the next OKs
        self.injected: list[tuple[str, int, int]] = []  # (client, fsn, status)
        self.confirmed: dict[str, int] = {}  # by OK or error frames
        self.durable_confirmed: dict[str, int] = {}  # by durable acks covering OKs
        self.durable_clients: set[str] = set()
        self.counts: dict[str, int] = {}  # faults really delivered, by kind
        self.on_confirm: Callable[[], None] = lambda: None  # after every bound change
        self.pairs: set[_Pair] = set()
        self._pending: dict[ServerConnection, Any] = {}
        self._reapers: set[asyncio.Task[None]] = set()
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> FaultProxy:
        self._thread.start()
        self._ready.wait()
        return self

    def _run(self) -> None:
        with asyncio.Runner(loop_factory=lambda: self._loop) as runner:
            runner.run(self._main())

    async def _main(self) -> None:
        self._stop = asyncio.Event()
        server = await serve(
            self._handler,
            "127.0.0.1",
            0,
            process_request=self._process_request,
            process_response=self._process_response,
            compression=None,
            max_size=None,
            ping_interval=None,
            close_timeout=1,
        )
        self.port = server.sockets[0].getsockname()[1]
        self._ready.set()
        await self._stop.wait()
        server.close()
        await server.wait_closed()
        rest = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        for t in rest:
            t.cancel()
        await asyncio.gather(*rest, return_exceptions=True)

    def call(self, fn: Callable[[], Any]) -> Any:
        async def run() -> Any:
            result = fn()
            if asyncio.iscoroutine(result):
                result = await result
            return result

        return asyncio.run_coroutine_threadsafe(run(), self._loop).result(WAIT)

    def stop(self) -> None:
        self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(WAIT)

    async def _process_request(self, conn: ServerConnection, request: Any) -> Any:
        if self.refuse is not None:
            self.count(f"upgrade refused HTTP {self.refuse}")
            return conn.respond(self.refuse, "refused by the fault proxy\n")
        port = self.upstream()
        if port is None:
            return conn.respond(503, "receiver down\n")
        headers = {h: request.headers[h] for h in _PASS_REQUEST if h in request.headers}
        try:
            up = await websockets.connect(
                f"ws://127.0.0.1:{port}{request.path}",
                additional_headers=headers,
                compression=None,
                proxy=None,
                max_size=None,
                ping_interval=None,
                open_timeout=5,
                close_timeout=1,
            )
        except InvalidStatus as exc:
            return conn.respond(exc.response.status_code, "upstream refused\n")
        except (OSError, TimeoutError):
            return conn.respond(503, "receiver down\n")
        self._pending[conn] = up
        reaper = asyncio.create_task(self._reap(conn, up))
        self._reapers.add(reaper)
        reaper.add_done_callback(self._reapers.discard)
        return None

    async def _reap(self, conn: ServerConnection, up: Any) -> None:
        """Close the upstream of a handshake that never reaches ``_handler``: a sender killed
        while the proxy connected upstream. Left open, it answers the receiver's pings and
        holds the client id there, so every later connection of it got 409 (FWD-27)."""
        await conn.wait_closed()
        if self._pending.pop(conn, None) is up:
            up.transport.abort()

    def _process_response(self, conn: ServerConnection, request: Any, response: Any) -> Any:
        up = self._pending.get(conn)
        if up is not None and response.status_code == 101:
            for h in _PASS_RESPONSE:
                if h in up.response.headers:
                    response.headers[h] = up.response.headers[h]
        return None

    async def _handler(self, client: ServerConnection) -> None:
        up = self._pending.pop(client)
        assert client.request is not None
        durable = up.response.headers.get(wire.H_DURABLE_ACK, "") == "enabled"
        pair = _Pair(
            client,
            up,
            client.request.headers.get(wire.H_CLIENT_ID, ""),
            int(client.request.headers.get(wire.H_FSN_AT_ZERO, "0")),
            durable,
        )
        if durable:
            self.durable_clients.add(pair.client_id)
        self.pairs.add(pair)
        tasks = [asyncio.create_task(self._c2u(pair)), asyncio.create_task(self._u2c(pair))]
        try:
            await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            self.pairs.discard(pair)
            code = up.close_code
            if code is not None and code not in (1005, 1006, 1015):
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(client.close(code, "upstream closed"), 2)
            client.transport.abort()
            up.transport.abort()

    async def _c2u(self, pair: _Pair) -> None:
        async for message in pair.client:
            pair.relayed += 1
            await pair.upstream.send(message)

    def bound(self, client: str) -> int:
        """What the receiver confirmed to ``client`` so far (see the class docstring)."""
        table = self.durable_confirmed if client in self.durable_clients else self.confirmed
        return table.get(client, -1)

    def count(self, kind: str, n: int = 1) -> None:
        if n:
            self.counts[kind] = self.counts.get(kind, 0) + n

    def _confirm(self, pair: _Pair, sequence: int, tables: dict[str, int]) -> int:
        fsn = pair.fsn_at_zero + min(sequence, pair.relayed - 1)
        self.confirmed[pair.client_id] = max(self.confirmed.get(pair.client_id, -1), fsn)
        if pair.durable:
            pair.entries.append((fsn, tables))
            self._cover(pair)
        self.on_confirm()
        return fsn

    def _cover(self, pair: _Pair) -> None:
        """Durable mode: the OKs at the head whose every seqTxn the durable acks passed so far
        reach are durably confirmed (FWD-7, from the receiver's side of the wire)."""
        marks = pair.watermarks
        while pair.entries and all(
            marks.get(t, -1) >= txn for t, txn in pair.entries[0][1].items()
        ):
            fsn = pair.entries.pop(0)[0]
            cid = pair.client_id
            self.durable_confirmed[cid] = max(self.durable_confirmed.get(cid, -1), fsn)

    async def _to_client(self, pair: _Pair, message: bytes) -> None:
        resp = wire.decode(message)
        if isinstance(resp, wire.DurableAck):
            for t, txn in resp.tables.items():
                pair.watermarks[t] = max(pair.watermarks.get(t, txn), txn)
            self._cover(pair)
            self.on_confirm()
        await pair.client.send(message)

    async def _u2c(self, pair: _Pair) -> None:
        async for message in pair.upstream:
            assert isinstance(message, bytes)
            resp = wire.decode(message)
            if isinstance(resp, wire.Ok):
                if self.inject:
                    status = self.inject.pop(0)
                    fsn = self._confirm(pair, resp.sequence, {})
                    self.injected.append((pair.client_id, fsn, status))
                    self.count(f"error frame 0x{status:02x} ({status_category(status)})")
                    message = wire.encode_error(status, resp.sequence, "injected by the proxy")
                else:
                    self._confirm(pair, resp.sequence, dict(resp.tables))
            elif isinstance(resp, wire.DurableAck) and self.hold:
                pair.held.append(message)
                continue
            await self._to_client(pair, message)

    # faults (called from the test thread)
    def drop_all(self) -> None:
        def go() -> None:
            self.count("connection dropped", len(self.pairs))
            for pair in list(self.pairs):
                pair.client.transport.abort()
                pair.upstream.transport.abort()

        self.call(go)

    def close_all(self, code: int) -> None:
        async def go() -> None:
            self.count(f"close code {code}", len(self.pairs))
            for pair in list(self.pairs):
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(pair.client.close(code, "fault proxy"), 2)
                pair.upstream.transport.abort()

        self.call(go)

    def release(self) -> None:
        """Deliver held durable acks, shuffled (they are cumulative: order must not matter)."""

        async def go() -> None:
            self.hold = False
            for pair in list(self.pairs):
                held, pair.held = pair.held, []
                self.rng.shuffle(held)
                self.count("durable ack delayed and reordered", len(held))
                for message in held:
                    with contextlib.suppress(ConnectionClosed):
                        await self._to_client(pair, message)

        self.call(go)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# ---------------------------------------------------------------------------------------------
# oracle: replay a forwarder's trace into the model
# ---------------------------------------------------------------------------------------------
class Oracle:
    """Feeds one forwarder's trace into ForwarderModel and compares ackedFsn event by event.

    ``bound()`` is read at the moment the forwarder reports a new ``ackedFsn``: what the
    receiver had confirmed through the proxy by then, and which FSNs were deleted from a topic
    source by then (FSN-3, FSN-10)."""

    def __init__(
        self,
        model: ForwarderModel,
        overrides: dict[str, str],
        bound: Callable[[], tuple[int, int]],
        deleted: list[int],
    ) -> None:
        self.model = model
        self.overrides = overrides
        self.bound = bound
        self.deleted = deleted
        self.events: list[tuple[str, dict[str, Any]]] = []
        self._lock = threading.Lock()

    def tracer(self, event: str, data: dict[str, Any]) -> None:
        if "acked" in data:
            data = {**data, "_bound": self.bound()}
        with self._lock:
            self.events.append((event, data))

    def replay(self, where: str) -> int:
        m = self.model
        checked = 0
        for i, (event, data) in enumerate(self.events):
            ctx = f"{where}: event #{i} {event} {data}"
            if "_bound" in data:
                # FSN-3 at the very moment: never above what the receiver confirmed, except
                # FSNs known never to exist (holes of a topic source, FSN-10).
                confirmed, n_deleted = data.pop("_bound")
                beyond = set(range(confirmed + 1, data["acked"] + 1))
                assert beyond <= set(self.deleted[:n_deleted]), (
                    f"{ctx}: FSN-3: ackedFsn {data['acked']} > confirmed {confirmed}"
                )
            if event == "start":  # FSN-5: the forwarder starts from the recovered seed
                assert m.published_fsn == data["published"], ctx
            elif event == "connect":
                m.connect(durable=data["durable"])
                assert m.fsn_at_zero == data["fsn_at_zero"], ctx  # FSN-1, FSN-6
            elif event == "send":
                if data["fsn"] > m.published_fsn:
                    m.publish(data["fsn"] - m.published_fsn)
                assert m.next_frame() == data["fsn"], ctx  # strict order (FSN-1)
            elif event == "ok":
                m.on_ok(data["sequence"], data["tables"])
            elif event == "durable":
                m.on_durable_ack(data["tables"])
            elif event == "error":
                m.on_error(data["status"], data["sequence"], self.overrides)
                expected = effective_policy(status_category(data["status"]), self.overrides)
                assert (m.halted is not None) == (expected == "HALT"), ctx
            elif event == "close":
                m.on_close(data["code"])
            elif event == "disconnect":
                m.disconnect()
            elif event == "halt" and m.halted is None:
                m.give_up()
            elif event == "gap":  # a topic hole (FWD-22): the window moves past it
                if data["next_fsn"] - 1 > m.published_fsn:
                    m.publish(data["next_fsn"] - 1 - m.published_fsn)
                m.skip_to(data["next_fsn"])
            if "acked" in data:
                assert m.acked_fsn == data["acked"], f"{ctx}: model acked {m.acked_fsn}"
                checked += 1
            m.check_invariants()
        return checked


# ---------------------------------------------------------------------------------------------
# one scenario
# ---------------------------------------------------------------------------------------------
class Scenario:
    def __init__(self, seed: int, tmp: Path) -> None:
        self.seed = seed
        self.rng = random.Random(seed)
        self.tmp = tmp
        # Every run covers both ack modes and both sources, whatever the base seed.
        self.durable = seed % 2 == 0
        self.source = "topic" if seed % 4 in (1, 2) and seed % 3 else "slot"
        self.client = f"s{seed}"
        self.overrides: dict[str, str] = {}
        extra = ""
        # Sometimes flip a policy through the connect-string keys (FWD-9).
        if self.rng.random() < 0.3:
            extra += "on_parse_error=drop_and_continue;"
            self.overrides["PARSE_ERROR"] = "DROP_AND_CONTINUE"
        if self.rng.random() < 0.3:
            extra += "on_write_error=halt;"
            self.overrides["WRITE_ERROR"] = "HALT"
        sf = (
            f"sf_dir={tmp / 'sf'};sf_max_bytes=2048;sf_durability=flush;"
            if self.source == "slot"
            else ""
        )
        self.conf_text = (
            f"ws::addr=127.0.0.1:{{port}};sender_id={self.client};{sf}"
            f"request_durable_ack={'on' if self.durable else 'off'};"
            "reconnect_initial_backoff_millis=1;reconnect_max_backoff_millis=20;"
            "reconnect_max_duration_millis=120000;initial_connect_retry=async;"
            "close_flush_timeout_millis=0;durable_ack_keepalive_interval_millis=20;"
            f"tidelog_max_batch_frames={self.rng.choice([1, 7, 64])};{extra}"
        )
        # Small WAL files: the 64 MiB default is preallocated, and a campaign has many stores.
        self.rx_uri = f"file://{tmp / 'rx'}?{SMALL_WAL}"
        self.rx: Receiver | None = None
        self.proxy = FaultProxy(lambda: self.rx.port if self.rx is not None else None, self.rng)
        self.src_store = (
            tidelog.open(f"file://{tmp / 'src'}?{SMALL_WAL}") if self.source == "topic" else None
        )
        self.model = ForwarderModel()
        self.oracles: list[Oracle] = []
        self.fwd: Forwarder | None = None
        self.published = -1
        self.log: list[str] = []
        self.stats: dict[str, int] = {}
        self.batches = 0
        self.tags: dict[str, list[int]] = {}  # topic source: publish batch tag -> FSNs
        self.deleted: list[int] = []  # FSNs deleted from a topic source, in deletion order

    # -- parts ---------------------------------------------------------------------------------
    def start_receiver(self) -> None:
        self.rx = Receiver.open(
            self.rx_uri,
            "events",
            flush_interval_ms=self.rng.choice([1, 5, 20]),
            topic_options={"durability": "disk"},
            # A topic source steps over its holes with FSN jumps, which only a receiver that
            # trusts them accepts (FWD-26, FWD-22).
            trust_fsn_jumps=self.source == "topic",
        ).start()

    def stop_receiver(self) -> None:
        rx, self.rx = self.rx, None
        if rx is not None:
            rx.stop()
            for key, value in rx.stats.items():
                self.stats["rx_" + key] = self.stats.get("rx_" + key, 0) + value

    def start_sender(self) -> None:
        """A new forwarder over the same slot or subscriber: the model restarts from disk."""
        conf = self.conf_text.format(port=self.proxy.port)
        if self.source == "slot":
            slot_dir = str(self.tmp / "sf" / self.client)
            if os.path.isdir(slot_dir):
                rec = recover(tidelog.fsio.OsFS(), slot_dir)
                segments = [(s.base_seq, s.frame_count) for s in rec.segments]
                self.model.restart(segments, read_watermark(tidelog.fsio.OsFS(), slot_dir))
            oracle = self._oracle()
            self.fwd = Forwarder(conf, tracer=oracle.tracer, rng=random.Random(self.seed))
        else:
            assert self.src_store is not None
            topic = self.src_store.topic("out")
            sub = topic.subscribe("fwd", start="earliest")
            acked, published = sub.hwm - 1, topic.state().head_seq - 1
            self.model.restart([(acked + 1, published - acked)], None)
            oracle = self._oracle()
            self.fwd = Forwarder.for_topic(
                conf, topic, subscriber="fwd", tracer=oracle.tracer, rng=random.Random(self.seed)
            )
        self.oracles.append(oracle)  # its replay checks the recovered seed ("start", FSN-5)

    def _oracle(self) -> Oracle:
        def bound() -> tuple[int, int]:
            return self.proxy.bound(self.client), len(self.deleted)

        return Oracle(self.model, self.overrides, bound, self.deleted)

    def stop_sender(self) -> None:
        fwd, self.fwd = self.fwd, None
        if fwd is None:
            return
        for key, value in fwd.counters().items():
            if isinstance(value, int) and key not in ("acked_fsn", "published_fsn"):
                self.stats[key] = self.stats.get(key, 0) + value
        # A latched halt nobody saw makes close() rethrow: the safety net (FWD-15).
        with contextlib.suppress(SenderFailed):
            fwd.close()
        # The oracle replays this forwarder's whole life into the shared model.
        self.oracles[-1].replay(f"seed {self.seed} forwarder #{len(self.oracles)}")

    def publish(self, n: int) -> None:
        for _ in range(n):
            fsn = self.published + 1
            if self.source == "slot":
                try:
                    assert self._fwd().append(payload(fsn)) == fsn
                except SenderFailed:  # halted since the last step: restart it, append again
                    self.restart_sender("halted during publish")
                    assert self._fwd().append(payload(fsn)) == fsn
            else:
                assert self.src_store is not None
                topic = self.src_store.topic("out")
                assert topic.append(payload(fsn), tag=f"b{self.batches}") == fsn + 1
                self.tags.setdefault(f"b{self.batches}", []).append(fsn)
            self.published = fsn
        self.batches += 1
        with contextlib.suppress(SenderFailed):
            self._fwd().flush()

    def _fwd(self) -> Forwarder:
        assert self.fwd is not None
        return self.fwd

    def restart_sender(self, why: str) -> None:
        self.log.append(f"restart sender ({why})")
        self.stop_sender()
        self.start_sender()

    def halted(self) -> bool:
        return self.fwd is not None and self.fwd.last_terminal_error is not None

    # -- checks ------------------------------------------------------------------------------
    def check_bounds(self) -> None:
        """FSN-3: ackedFsn never exceeds what the receiver confirmed (durably, in durable
        mode); the oracle checks the same at every single acknowledgement."""
        assert self.fwd is not None
        acked = self.fwd.acked_fsn
        bound = self.proxy.bound(self.client)
        # Beyond what the receiver confirmed, only holes of a topic source (FSN-10) may be
        # acknowledged: those FSNs no longer exist.
        beyond = set(range(bound + 1, acked + 1))
        assert beyond <= set(self.deleted), f"seed {self.seed}: acked {acked} > confirmed {bound}"

    def received(self) -> list[tuple[int, bytes]]:
        with tidelog.open(self.rx_uri) as store:
            topic = store.topic("events", create=False)
            return [(f, r.payload) for c, f, r in forwarded(topic) if c == self.client]

    def check_receiver(self, final: bool) -> None:
        got = self.received()
        fsns = [f for f, _ in got]
        assert all(a < b for a, b in itertools.pairwise(fsns)), (
            f"seed {self.seed}: receiver FSNs not strictly increasing (reordered or duplicated)"
        )
        for f, data in got:
            assert data == payload(f), f"seed {self.seed}: payload of FSN {f} differs"
        if final:
            # Records deleted from a topic source before they were delivered are the only
            # frames allowed to be missing (voluntary deletes, FWD-22).
            missing = sorted(set(range(self.published + 1)) - set(fsns) - set(self.deleted))
            assert not missing, f"seed {self.seed}: receiver misses FSNs {missing[:10]}"

    # -- the run -------------------------------------------------------------------------------
    def run(self, steps: int) -> None:
        self.proxy.start()
        self.start_receiver()
        self.start_sender()
        try:
            for _ in range(steps):
                self.step()
            self.heal_and_drain()
            self.stop_sender()  # replays the last forwarder's trace into the model
        finally:
            if self.fwd is not None:  # a failure above: clean up without judging
                with contextlib.suppress(Exception):
                    self.fwd.close()
            self.stop_receiver()
            self.proxy.stop()
            if self.src_store is not None:
                self.src_store.close()
        self.check_receiver(final=True)

    def step(self) -> None:
        rng = self.rng
        if self.halted():
            self.proxy.count("observed: sender halted, restarted")
            self.restart_sender("halted")
        action = rng.choices(
            ["publish", "drop", "close", "error", "hold", "release", "refuse", "rx", "tx", "del"],
            weights=[6, 2, 2, 3, 1, 1, 1, 1, 1, 2 if self.source == "topic" else 0],
        )[0]
        self.log.append(action)
        if action == "publish":
            self.publish(rng.randint(1, 40))
        elif action == "drop":
            self.proxy.drop_all()
        elif action == "close":
            self.proxy.close_all(rng.choice(TERMINAL_CODES + RECONNECT_CODES))
        elif action == "error":
            self.proxy.inject.append(rng.choice(ERROR_STATUSES))
            self.publish(rng.randint(1, 5))
        elif action == "hold":
            self.proxy.hold = True
        elif action == "release":
            self.proxy.release()
        elif action == "refuse":
            self.proxy.refuse = rng.choice([503, 404, 421])
            self.publish(rng.randint(1, 5))
            self.settle(0.02)
            self.proxy.refuse = None
        elif action == "rx":
            self.proxy.count("receiver restart")
            self.stop_receiver()
            self.publish(rng.randint(0, 5))
            self.start_receiver()
        elif action == "tx":
            self.proxy.count("sender restart")
            self.restart_sender("action")
        elif action == "del" and self.tags:
            # Delete a recent publish batch from the topic: a hole the forwarder steps over.
            assert self.src_store is not None
            tag = rng.choice(sorted(self.tags)[-3:])
            self.deleted.extend(self.tags.pop(tag))  # before the forwarder can see the hole
            self.src_store.topic("out").delete(tag=tag)
            self.proxy.count("topic hole (deleted batch)")
            self.publish(rng.randint(1, 5))
        self.settle(0.05)
        if self.fwd is not None:
            self.check_bounds()

    def settle(self, seconds: float) -> None:
        """Let traffic flow a little (not a correctness mechanism: any amount is valid)."""
        assert self.fwd is not None
        self.fwd.wait_acked(timeout=seconds)

    def heal_and_drain(self) -> None:
        self.proxy.refuse = None
        self.proxy.inject.clear()
        self.proxy.release()
        # An error the proxy injected just before the clear may still halt the sender after
        # this point; one restart absorbs it (no new faults are injected from here on).
        for _ in range(2):
            if self.halted():
                self.proxy.count("observed: sender halted, restarted")
                self.restart_sender("halted")
            assert self.fwd is not None
            ok = self.fwd.wait_acked(self.published, timeout=WAIT)
            if ok or not self.halted():
                break
        assert ok, (
            f"seed {self.seed}: not drained: acked {self.fwd.acked_fsn} of {self.published}; "
            f"terminal={self.fwd.last_terminal_error}; actions={self.log}"
        )
        self.check_bounds()


@pytest.mark.parametrize("index", range(SCENARIOS))
def test_forward_fault_scenarios(index: int, tmp_path: Path) -> None:
    """FWD-5..FWD-13, FWD-19, FWD-24 (and FSN-1..FSN-8): a seeded fault scenario against the
    model and the receiver's contents. Reproduce with TIDELOG_FORWARD_SEED."""
    seed = BASE_SEED + index
    scenario = Scenario(seed, tmp_path)
    try:
        scenario.run(STEPS)
    except AssertionError as exc:
        raise AssertionError(
            f"scenario seed {seed} ({scenario.source}, durable="
            f"{scenario.durable}) failed after {scenario.log}: {exc}"
        ) from exc
    report("fault scenario", seed, scenario.proxy.counts)
    # Passed: free the disk now (a long campaign would otherwise keep every store until the
    # session ends); a failed scenario keeps its directory for the post-mortem.
    shutil.rmtree(tmp_path, ignore_errors=True)


# ---------------------------------------------------------------------------------------------
# SIGKILL: a sender process and a receiver process
# ---------------------------------------------------------------------------------------------
SENDER = textwrap.dedent(
    """
    import json, sys, time
    from tidelog.forward import Forwarder
    conf, total, cap = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])

    def payload(fsn):
        return f"frame-{fsn:06d}-".encode() + bytes([fsn % 251]) * (fsn * 37 % 90)

    def say(**kw):
        # time.monotonic() is CLOCK_MONOTONIC, shared with the test process: the test compares
        # each ackedFsn with what the proxy had confirmed by that moment.
        kw["acked"], kw["t"] = fwd.acked_fsn, time.monotonic()
        print(json.dumps(kw), flush=True)

    seed = {}

    def trace(event, data):
        if event == "start":
            seed.update(data)

    fwd = Forwarder(conf, tracer=trace)
    # FSN-5: the seed recovery gave, traced before the I/O thread starts; fwd.acked_fsn may
    # have moved by now (initial_connect_retry=async: the receiver confirms replays at once).
    t = time.monotonic()
    print(json.dumps({"start": seed["published"], "acked": seed["acked"], "t": t}), flush=True)
    while fwd.published_fsn < total - 1:
        if 0 <= cap <= fwd.published_fsn:
            time.sleep(0.01)  # past the test's kill point: wait for the SIGKILL
            continue
        n = min(17, total - 1 - fwd.published_fsn)
        for _ in range(n):
            fsn = fwd.published_fsn + 1
            assert fwd.append(payload(fsn)) == fsn
        fwd.flush()
        say(published=fwd.published_fsn)
    while not fwd.wait_acked(timeout=0.05):
        say(published=fwd.published_fsn)
    say(done=fwd.acked_fsn)
    fwd.close()
    """
)


class Proc:
    def __init__(self, args: list[str]) -> None:
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        self.p = subprocess.Popen(
            args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env
        )
        self.lines: list[str] = []
        # stderr read too: `tidelog serve` logs a line per request (SVC-55), and a full pipe
        # blocks its event loop in that write (acks stop, SIGTERM is never handled)
        self.errors: list[str] = []
        self._cond = threading.Condition()
        threading.Thread(target=self._pump, daemon=True).start()
        threading.Thread(target=self._pump_errors, daemon=True).start()

    def _pump(self) -> None:
        assert self.p.stdout is not None
        for line in self.p.stdout:
            with self._cond:
                self.lines.append(line.strip())
                self._cond.notify_all()
        with self._cond:
            self.lines.append("<eof>")
            self._cond.notify_all()

    def _pump_errors(self) -> None:
        assert self.p.stderr is not None
        for line in self.p.stderr:
            self.errors.append(line.rstrip("\n"))

    def wait_line(self, pred: Callable[[str], bool], timeout: float = WAIT) -> str:
        end = time.monotonic() + timeout
        with self._cond:
            seen = 0
            while True:
                for line in self.lines[seen:]:
                    if pred(line):
                        return line
                seen = len(self.lines)
                left = end - time.monotonic()
                if left <= 0 or (self.lines and self.lines[-1] == "<eof>"):
                    err = "\n".join(self.errors[-10:])
                    raise AssertionError(f"no expected line; got {self.lines[-5:]}; stderr {err}")
                self._cond.wait(left)

    def kill(self) -> None:
        self.p.send_signal(signal.SIGKILL)
        self.p.wait(WAIT)


def test_sigkill_sender_and_receiver(tmp_path: Path) -> None:
    """FWD-19, FWD-20, SF-10, SF-11, FSN-3, FSN-5, FSN-6: SIGKILL the sender (SF slot, durable
    acks) and the receiver (``tidelog serve``) at seeded moments. After every kill the slot's
    recovery matches the model's (``ForwarderModel.restart``) and never seeds ackedFsn above
    what the receiver had durably confirmed; every ackedFsn a sender reported was within what
    the receiver had durably confirmed at that moment; at the end the receiver holds every
    frame exactly once, in order, byte-identical."""
    rng = random.Random(BASE_SEED)
    total = 300 + 80 * KILLS
    rx_port = free_port()
    rx_uri = f"file://{tmp_path / 'rx'}?{SMALL_WAL}"
    slot_dir = str(tmp_path / "sf" / "killme")
    serve_args = [
        str(Path(sys.executable).parent / "tidelog"), "serve", "--uri", rx_uri, "--topic", "events",
        "--port", str(rx_port), "--flush-interval-ms", "5", "--topic-option", "durability=disk",
    ]  # fmt: skip
    receiver: Proc | None = None

    def start_receiver() -> Proc:
        proc = Proc(serve_args)
        proc.wait_line(lambda s: s.startswith("listening"))
        return proc

    receiver = start_receiver()
    rx_up = {"port": rx_port}
    proxy = FaultProxy(lambda: rx_up["port"], rng).start()
    history: list[tuple[float, int]] = [(0.0, -1)]  # (monotonic time, durably confirmed)
    proxy.on_confirm = lambda: history.append((time.monotonic(), proxy.bound("killme")))
    conf = (
        f"ws::addr=127.0.0.1:{proxy.port};sf_dir={tmp_path / 'sf'};sender_id=killme;"
        "sf_max_bytes=4096;sf_durability=flush;request_durable_ack=on;"
        "reconnect_initial_backoff_millis=1;reconnect_max_backoff_millis=20;"
        "initial_connect_retry=async;close_flush_timeout_millis=0;"
    )

    def confirmed_at(t: float) -> int:
        return max(b for when, b in list(history) if when <= t)

    def check_reports(sender: Proc) -> int:
        """FSN-3 at every reported moment; returns the highest flushed FSN reported."""
        flushed = -1
        for text in sender.lines:
            if text.startswith("{"):
                doc = json.loads(text)
                bound = confirmed_at(doc["t"])
                assert doc["acked"] <= bound, f"FSN-3: {text} but confirmed {bound}"
                flushed = max(flushed, doc.get("published", -1))
        return flushed

    kills = 0
    progress = 0
    expected_start: tuple[int, int] | None = None
    try:
        while True:
            # Kill number k once published passes a seeded point of the k-th stretch of the
            # run, well before the end: every run makes exactly KILLS kills. A sender the test
            # is slow to kill (a loaded machine) stops publishing half a stretch past that
            # point, so the next one starts before the next point, never at the end.
            stretch = (total - 40) // (KILLS + 1)
            target = stretch * (kills + 1) + rng.randint(0, stretch // 2)
            cap = target + stretch // 2 if kills < KILLS else -1
            # -P: the installed tidelog, never a source tree in the working directory
            sender = Proc([sys.executable, "-P", "-c", SENDER, conf, str(total), str(cap)])
            start = json.loads(sender.wait_line(lambda s: s.startswith('{"start"')))
            if expected_start is not None:  # FSN-5: the process recovered what the model says
                assert (start["acked"], start["start"]) == expected_start, start
            progress = max(progress, start["start"])
            line = sender.wait_line(
                lambda s, target=target: (
                    s.startswith('{"done"')
                    or (s.startswith('{"published"') and json.loads(s)["published"] >= target)
                )
            )
            if line.startswith('{"done"') or kills >= KILLS:
                sender.wait_line(lambda s: s.startswith('{"done"'))
                sender.p.wait(WAIT)
                check_reports(sender)
                break
            sender.kill()
            kills += 1
            proxy.count("sender SIGKILL")
            progress = max(progress, check_reports(sender))
            # FSN-5 after a crash: recovery from what is on disk, checked against the model,
            # never above what the receiver had durably confirmed.
            rec = recover(tidelog.fsio.OsFS(), slot_dir)
            model = ForwarderModel()
            model.restart(
                [(seg.base_seq, seg.frame_count) for seg in rec.segments],
                read_watermark(tidelog.fsio.OsFS(), slot_dir),
            )
            assert (model.acked_fsn, model.published_fsn) == (rec.acked_fsn, rec.published_fsn)
            assert rec.acked_fsn <= proxy.bound("killme"), "FSN-3: recovery seeded past confirmed"
            assert rec.published_fsn >= progress, "SF-11: flushed frames lost by a SIGKILL"
            expected_start = (rec.acked_fsn, rec.published_fsn)
            if rng.random() < 0.5:  # and the receiver too
                receiver.kill()
                proxy.count("receiver SIGKILL")
                receiver = start_receiver()
            else:
                proxy.drop_all()
    finally:
        proxy.stop()
        if receiver is not None:
            receiver.p.send_signal(signal.SIGTERM)
            receiver.p.wait(WAIT)
    with tidelog.open(rx_uri) as store:
        got = [(f, r.payload) for c, f, r in forwarded(store.topic("events", create=False))]
    fsns = [f for f, _ in got]
    assert fsns == list(range(total)), f"receiver FSNs: {fsns[:20]}... ({len(fsns)} of {total})"
    assert all(data == payload(f) for f, data in got)
    assert kills == KILLS
    report("sigkill scenario", BASE_SEED, proxy.counts)


# ---------------------------------------------------------------------------------------------
# the harness itself
# ---------------------------------------------------------------------------------------------
def test_proc_reads_stderr_so_a_logging_child_never_blocks() -> None:
    """SVC-55: `tidelog serve` logs a line per request to stderr. A Proc reads it, so a child
    that logs more than a pipe holds (64 KiB) keeps running (it used to block in the write:
    the receiver's acks stopped and it never handled SIGTERM)."""
    code = "import sys\nsys.stderr.write(('y' * 99 + '\\n') * 4000)\nprint('ok', flush=True)"
    proc = Proc([sys.executable, "-c", code])
    try:
        assert proc.wait_line(lambda s: s == "ok", timeout=10) == "ok"
        assert proc.p.wait(WAIT) == 0
    finally:
        if proc.p.poll() is None:
            proc.kill()


def test_FWD_27_proxy_closes_the_upstream_of_an_abandoned_handshake(tmp_path: Path) -> None:
    """FWD-27 through the fault proxy: a sender that goes away while the proxy connects
    upstream for it (a SIGKILL mid-handshake) leaves no connection open at the receiver, so
    the next connection of its client id is let in. The proxy used to keep that upstream open;
    it answered the receiver's pings and held the id, and every reconnect got 409."""
    rx = Receiver.open(f"file://{tmp_path / 'rx'}?{SMALL_WAL}", "events").start()
    calls = 0

    def upstream() -> int:
        nonlocal calls
        calls += 1
        if calls == 1:
            time.sleep(0.5)  # the proxy's loop stalls: the client is gone when it resumes
        return rx.port

    proxy = FaultProxy(upstream, random.Random(0)).start()
    headers = {wire.H_CLIENT_ID: "gone", wire.H_FSN_AT_ZERO: "0"}
    try:
        with socket.create_connection(("127.0.0.1", proxy.port), timeout=WAIT) as sock:
            sock.sendall(
                (
                    "GET /write/v4 HTTP/1.1\r\nHost: 127.0.0.1\r\nUpgrade: websocket\r\n"
                    "Connection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
                    "Sec-WebSocket-Version: 13\r\n"
                    + "".join(f"{k}: {v}\r\n" for k, v in headers.items())
                    + "\r\n"
                ).encode()
            )
        end = time.monotonic() + WAIT
        while rx.stats["connections"] == 0 and time.monotonic() < end:
            time.sleep(0.01)  # until the proxy connected upstream for the sender that left
        assert rx.stats["connections"] == 1

        async def reconnect() -> int:
            end = time.monotonic() + 10
            while True:
                try:
                    async with websockets.connect(
                        f"ws://127.0.0.1:{proxy.port}/write/v4",
                        additional_headers=headers,
                        proxy=None,
                        open_timeout=5,
                    ):
                        return 101
                except InvalidStatus as exc:
                    if time.monotonic() > end:
                        return exc.response.status_code
                await asyncio.sleep(0.05)

        assert asyncio.run(reconnect()) == 101
    finally:
        proxy.stop()
        rx.stop()
