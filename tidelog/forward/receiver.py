"""The receiver: ``tidelog serve`` (FWD-18..FWD-21).

A WebSocket endpoint (``/write/v4``; ``/api/v4/write`` too) that appends every binary message to
one topic of its own tidelog store, answers OK once the frame is appended, and a durable ack once
it is durable. QWP reports per-table ``seqTxn`` watermarks; here there is one pseudo-table named
after the topic whose ``seqTxn`` is the record's seq, and the durable ack carries the highest seq
covered by the last ``Store.flush()`` (FWD-18).

De-duplication (FWD-19, FWD-20): a sender names itself in ``X-QWP-Client-Id`` and tells the FSN
of its wire sequence 0 in ``X-Tidelog-Fsn-At-Zero`` (a tidelog header: QWP puts a message
sequence inside each payload, tidelog frames are opaque). Frame ``w`` of a connection has
``fsn = fsnAtZero + w``; if that is at or below the client's high-water mark it is a replay and
is acknowledged without being stored. The marks are recovered from the data (``dedup.py``), so
they survive receiver restarts and crashes exactly as the records do.

Appends are serialised across connections (one writer), batched per connection: every message
already queued is appended in one ``append_many``.

Memory is bounded (FWD-25, ``budget.py``): a connection's reader takes a message only when it
fits the per-connection and total bounds, else it waits and TCP pushes back on the sender. A
client id cannot be hijacked by an FSN jump (FWD-26) and has at most one connection (FWD-27).

The WebSocket layer is aiohttp's. ``start()`` serves the receiver's paths alone on a thread and
loop of its own; ``add_routes`` puts them into another aiohttp application (``tidelog serve``'s
HTTP API, one listener), whose loop then runs ``startup()`` and ``shutdown()``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from http import HTTPStatus
from typing import Any

from aiohttp import WSCloseCode, WSMsgType, web

import tidelog
from tidelog.api import Store, Topic
from tidelog.errors import Backpressure, BadOption, TidelogError, TooLarge, TopicFull

from . import wire
from .budget import MESSAGE_OVERHEAD, Account, ByteBudget, ServeLimits, return_free_memory
from .dedup import DedupIndex, batch_tag

__all__ = ["Receiver", "PATHS", "LIMIT_OPTIONS"]

log = logging.getLogger("tidelog.serve")

PATHS = ("/write/v4", "/api/v4/write")
_WRITE_ERROR = 0x09
_INTERNAL_ERROR = 0x06
_TRIM_AFTER = 16 << 20  # bytes taken since the last return of free memory that warrant one
_CLOSE_TIMEOUT = 1.0  # seconds a close waits for the peer's close frame
#: The ``Receiver`` keyword arguments that are FWD-25 limits (validated before a store opens).
LIMIT_OPTIONS = ("max_frame_bytes", "max_connection_bytes", "max_total_bytes", "max_connections")


def _status(exc: TidelogError) -> int:
    """A rejected append's status byte: the topic refuses writes (WRITE_ERROR, dropped by
    default) or something else went wrong (INTERNAL_ERROR, halts by default)."""
    return _WRITE_ERROR if isinstance(exc, TooLarge | TopicFull | Backpressure) else _INTERNAL_ERROR


@dataclass(frozen=True)
class _Oversize:
    """In a connection's queue in place of a message too large to hold (FWD-25)."""

    size: int


@dataclass(eq=False)
class _Conn:
    ws: web.WebSocketResponse
    client: str | None
    fsn_at_zero: int | None
    durable: bool
    wire_seq: int = 0
    max_ok: int = -1  # highest seqTxn an OK on this connection reported
    min_ok: int | None = None  # lowest one: a watermark below it covers nothing here
    durable_sent: int = -1  # the durable watermark last sent on this connection
    # messages taken off the socket, in order; None ends the stream
    queue: asyncio.Queue[bytes | _Oversize | None] = field(default_factory=asyncio.Queue)
    account: Account = field(default_factory=Account)  # its held bytes (FWD-25)


def _charge(frames: Sequence[bytes]) -> int:
    return sum(len(f) for f in frames) + MESSAGE_OVERHEAD * len(frames)


def _text(status: HTTPStatus, why: str) -> web.Response:
    return web.Response(status=int(status), text=why + "\n")


class Receiver:
    """Serve one topic of ``store`` on ``host:port`` (0 = any free port; see ``port``).

    ``ping_interval``: seconds without a byte from a peer before a ping; no answer within half
    of it drops the connection (FWD-27). None: no keepalive."""

    def __init__(
        self,
        store: Store,
        topic: str,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        durable_ack: bool = True,
        flush_interval_ms: int = 10,
        max_frame_bytes: int | str = 16 << 20,
        max_connection_bytes: int | str = 64 << 20,
        max_total_bytes: int | str = 256 << 20,
        max_connections: int | str = 64,
        trust_fsn_jumps: bool = False,
        ping_interval: float | None = 20.0,
        sockets: Sequence[socket.socket] = (),
        topic_options: dict[str, Any] | None = None,
        tracer: Callable[[str, dict[str, Any]], None] | None = None,
        owns_store: bool = False,
    ) -> None:
        self.limits = ServeLimits.parse(
            max_frame_bytes=max_frame_bytes,
            max_connection_bytes=max_connection_bytes,
            max_total_bytes=max_total_bytes,
            max_connections=max_connections,
        )
        if ping_interval is not None and not (
            isinstance(ping_interval, int | float) and ping_interval > 0
        ):
            raise BadOption(f"option ping_interval={ping_interval!r}: must be above 0 (FWD-27)")
        self.store = store
        self.topic: Topic = store.topic(topic, **(topic_options or {}))
        self.table = topic
        self.host = host
        # Listening sockets bound by the caller (the CLI binds them before it opens the store,
        # spec/CLI.md CLI-9); the receiver owns and closes them.
        self._sockets = list(sockets)
        self.port = self._sockets[0].getsockname()[1] if self._sockets else port
        self.durable_ack = durable_ack
        self.flush_interval = flush_interval_ms / 1000.0
        self.max_frame_bytes = self.limits.max_frame_bytes
        self.trust_fsn_jumps = trust_fsn_jumps
        self.ping_interval = ping_interval
        self.tracer = tracer
        self.owns_store = owns_store
        self.dedup = DedupIndex(store, self.topic)
        self.appended_seq = self.topic.state().head_seq
        self.durable_seq = self.appended_seq
        self.stats = {
            "frames": 0, "stored": 0, "duplicates": 0, "rejected": 0, "connections": 0,
            "upgrades_refused": 0, "peak_held_bytes": 0,
        }  # fmt: skip
        self._budget = ByteBudget(self.limits.max_connection_bytes, self.limits.max_total_bytes)
        self._conns: set[_Conn] = set()
        # One future per upgrade from its admission until its handler ends: counted against
        # max_connections (FWD-25), awaited by shutdown().
        self._live: set[asyncio.Future[None]] = set()
        self._claims: dict[str, asyncio.Future[None]] = {}  # client id -> its upgrade (FWD-27)
        self._accepting = False  # between startup() and shutdown()
        self._stopping: asyncio.Event | None = None
        self._flusher: asyncio.Task[None] | None = None
        self._warned: set[str] = set()
        self._taken_since_trim = 0  # bytes taken since the last returns of free memory began
        self._trims_due = 0
        self._checkpoints_seen: object = None  # the store's checkpoint at the last look
        self._refused_tried: dict[str, int] = {}
        self._next_trim = 0.0
        self._append_lock = threading.Lock()
        # start() / stop(): the receiver's own thread, loop and aiohttp runner
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._stop_requested: asyncio.Event | None = None
        self._started = threading.Event()
        self._finished = threading.Event()  # the thread's loop is closed
        self._start_error: BaseException | None = None

    @classmethod
    def open(cls, uri: str, topic: str, **kwargs: Any) -> Receiver:
        """Open the store at ``uri`` and serve ``topic`` (the receiver owns and closes it).
        The limits are checked before the store is opened (FWD-25)."""
        ServeLimits.parse(**{k: kwargs[k] for k in LIMIT_OPTIONS if k in kwargs})
        store = tidelog.open(uri)
        try:
            return cls(store, topic, owns_store=True, **kwargs)
        except BaseException:
            store.close()
            raise

    # -- in another aiohttp application ------------------------------------------------------
    def add_routes(self, app: web.Application) -> None:
        """Serve the receiver's paths (``PATHS``) in ``app``, beside its own routes. The host
        runs ``await startup()`` on its loop before serving (e.g. from ``app.on_startup``) and
        ``await shutdown()`` when it stops (from ``app.on_shutdown``, or before
        ``AppRunner.cleanup()``); the store stays the caller's to close, after ``shutdown()``."""
        for path in PATHS:
            app.router.add_get(path, self._handle, allow_head=False)

    async def startup(self) -> None:
        """Start taking upgrades and the flusher (group commit, FWD-18), on the loop that
        serves the routes."""
        if self._flusher is not None:
            raise RuntimeError("the receiver is started already")
        self._stopping = asyncio.Event()
        self._flusher = asyncio.create_task(self._flush_loop())
        self._accepting = True

    async def shutdown(self, *, final_flush: bool = True) -> None:
        """Refuse new upgrades (503), close every connection with 1001 and wait for their
        handlers, stop the flusher between two flushes, then flush and checkpoint once more
        unless ``final_flush`` is False (FWD-18, FWD-26). Call it no later than the host's
        ``on_shutdown``: aiohttp waits for the handlers of open connections after that (up to
        its shutdown timeout) and only this ends them. By then aiohttp parses nothing more on
        them, so a close may wait its timeout (1 s) for a peer that keeps its TCP open."""
        self._accepting = False
        await asyncio.gather(
            *(
                c.ws.close(code=WSCloseCode.GOING_AWAY, message=b"receiver stopping")
                for c in list(self._conns)
            ),
            return_exceptions=True,
        )
        while self._live:
            await asyncio.wait(set(self._live))
        if self._flusher is not None and self._stopping is not None:
            self._stopping.set()
            await self._flusher  # it stops between flushes: never cancelled inside a checkpoint
            self._flusher = None
        if final_flush:
            await self._flush_once(final=True)

    # -- on a thread of its own --------------------------------------------------------------
    def start(self) -> Receiver:
        """Listen on a background thread; returns once the socket is bound."""
        self._thread = threading.Thread(target=self._run, name="tidelog-serve", daemon=True)
        self._thread.start()
        self._started.wait()
        if self._start_error is not None:
            raise self._start_error
        return self

    def _run(self) -> None:
        loop = asyncio.new_event_loop()
        self._loop = loop
        # The Runner cancels and awaits whatever tasks are left (a handshake cut short by the
        # stop) before closing the loop.
        try:
            with asyncio.Runner(loop_factory=lambda: loop) as runner:
                runner.run(self._serve())
        finally:
            self._finished.set()

    async def _serve(self) -> None:
        self._stop_requested = asyncio.Event()
        app = web.Application()
        self.add_routes(app)
        runner = web.AppRunner(app, access_log=None, shutdown_timeout=_CLOSE_TIMEOUT)
        try:
            await runner.setup()
            await self.startup()
            sites: list[web.BaseSite] = (
                [web.SockSite(runner, sock) for sock in self._sockets]
                if self._sockets
                else [web.TCPSite(runner, self.host, self.port)]
            )
            for site in sites:
                await site.start()
        except BaseException as exc:
            await self.shutdown(final_flush=False)
            await runner.cleanup()
            self._close_sockets()
            self._start_error = exc
            self._started.set()
            return
        self.port = runner.addresses[0][1]
        self._started.set()
        await self._stop_requested.wait()
        for site in list(runner.sites):
            await site.stop()  # no new connections
        await self.shutdown(final_flush=not self._abort)
        await runner.cleanup()

    def stop(self, *, abort: bool = False) -> None:
        """Stop serving (connections close with 1001); a final flush and checkpoint unless
        ``abort``. Closes the store if the receiver opened it."""
        self._abort = abort
        # Not Thread.is_alive(): on Python 3.11 a KeyboardInterrupt (Ctrl-C, or SIGTERM in the
        # CLI) taken inside Thread.join() makes it say False for a thread that still runs.
        if self._loop is not None and self._thread is not None and not self._finished.is_set():
            assert self._stop_requested is not None
            with contextlib.suppress(RuntimeError):  # the loop closed just now
                self._loop.call_soon_threadsafe(self._stop_requested.set)
            self._finished.wait()
            self._thread.join()
        self._close_sockets()  # never handed to a server (not started), or closed already
        if self.owns_store:
            self.store.close()

    _abort = False

    def _close_sockets(self) -> None:
        for sock in self._sockets:
            sock.close()

    def _log_once(self, level: int, text: str) -> None:
        """A refused sender retries, a failing flush fails again: each distinct message is
        logged once at ``level``, its repeats at DEBUG."""
        if len(self._warned) > 1000:
            self._warned.clear()
        log.log(logging.DEBUG if text in self._warned else level, "%s", text)
        self._warned.add(text)

    @property
    def held_bytes(self) -> int:
        """Bytes taken off connections and not yet appended (FWD-25)."""
        return self._budget.held

    def serve_forever(self) -> None:
        """Block until interrupted (the CLI), starting first if needed."""
        if self._thread is None:
            self.start()
        assert self._thread is not None
        try:
            while not self._finished.wait(0.5):
                pass
        except KeyboardInterrupt:
            pass
        finally:
            self.stop()

    def _trace(self, event: str, **data: Any) -> None:
        if self.tracer is not None:
            self.tracer(event, data)

    # -- handshake -----------------------------------------------------------------------------
    def _admit(self, request: web.Request, token: asyncio.Future[None]) -> web.Response | None:
        """The refusal of an upgrade, or None (then ``token`` counts against max_connections
        and holds the client id, FWD-25, FWD-27). Synchronous, so two upgrades for one id are
        checked one after the other."""
        raw = request.headers.get(wire.H_FSN_AT_ZERO)
        if raw is not None and not (raw.strip().isascii() and raw.strip().isdigit()):
            return _text(HTTPStatus.BAD_REQUEST, f"bad {wire.H_FSN_AT_ZERO}: {raw!r}")
        client = request.headers.get(wire.H_CLIENT_ID)
        if client is not None and not 0 < len(client.encode("utf-8")) <= 200:
            # It becomes the TOP-11 producer id (at most 200 bytes).
            return _text(HTTPStatus.BAD_REQUEST, "client id must be 1..200 bytes")
        if not self._accepting:
            return self._refuse(HTTPStatus.SERVICE_UNAVAILABLE, "receiver not serving")
        # Counted from the upgrade request: those whose handshake is under way, and those
        # whose handler runs (FWD-25).
        if len(self._live) >= self.limits.max_connections:
            return self._refuse(
                HTTPStatus.SERVICE_UNAVAILABLE,
                f"receiver busy: {self.limits.max_connections} connections open "
                f"(max_connections, FWD-25)",
            )
        if client and raw is not None:
            refusal = self._claim(client, int(raw))
            if refusal is not None:
                return self._refuse(HTTPStatus.CONFLICT, refusal)
            self._claims[client] = token
        self._live.add(token)
        return None

    def _refuse(self, status: HTTPStatus, why: str) -> web.Response:
        self.stats["upgrades_refused"] += 1
        self._log_once(logging.WARNING, f"upgrade refused with HTTP {int(status)}: {why}")
        self._trace("refused", status=int(status), why=why)
        return _text(status, why)

    def _claim(self, client: str, fsn_at_zero: int) -> str | None:
        """Why ``client`` cannot connect now, or None (FWD-26, FWD-27)."""
        if client in self._claims:
            return (
                f"client id {client!r} is connected already: a second connection is refused "
                f"while the first is open (FWD-27)"
            )
        if not self.trust_fsn_jumps:
            mark = self.dedup.mark(client)
            allowed = self.dedup.next_allowed(client)
            if mark >= 0 and fsn_at_zero > allowed:
                return (
                    f"{wire.H_FSN_AT_ZERO} {fsn_at_zero} jumps ahead for client id {client!r}: "
                    f"the receiver holds its FSNs through {mark}, so a connection starts at "
                    f"{allowed} at most (FWD-26; a receiver started with --trust-fsn-jumps "
                    f"accepts jumps)"
                )
        return None

    def _socket(self) -> web.WebSocketResponse:
        return web.WebSocketResponse(
            timeout=_CLOSE_TIMEOUT,
            # aiohttp refuses a message of max_msg_size bytes or more with 1009 before reading
            # its payload; --max-frame-bytes is the largest one read (FWD-25).
            max_msg_size=self.limits.max_frame_bytes + 1,
            compress=False,
            # A ping once nothing came for ping_interval; no byte within half of it drops the
            # connection (FWD-27).
            heartbeat=self.ping_interval,
        )

    # -- one connection ------------------------------------------------------------------------
    async def _handle(self, request: web.Request) -> web.StreamResponse:
        ws = self._socket()
        if not ws.can_prepare(request):
            return _text(HTTPStatus.UPGRADE_REQUIRED, "a QWP endpoint: WebSocket upgrades only")
        token: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        refusal = self._admit(request, token)
        if refusal is not None:
            return refusal
        headers = request.headers
        client = headers.get(wire.H_CLIENT_ID) or None
        raw = headers.get(wire.H_FSN_AT_ZERO)
        fsn0 = int(raw) if raw is not None and client else None
        wants = headers.get(wire.H_REQUEST_DURABLE_ACK, "").lower() == "true"
        ws.headers[wire.H_VERSION] = str(wire.QWP_VERSION)
        if wants and self.durable_ack:
            ws.headers[wire.H_DURABLE_ACK] = "enabled"
        if client:
            ws.headers[wire.H_LAST_FSN] = str(self.dedup.mark(client))
        conn = _Conn(ws, client, fsn0, wants and self.durable_ack)
        try:
            await ws.prepare(request)
            if not self._accepting:  # shutdown() began during the handshake
                await ws.close(code=WSCloseCode.GOING_AWAY, message=b"receiver stopping")
                return ws
            self._conns.add(conn)
            self.stats["connections"] += 1
            self._trace("connect", client=client, fsn_at_zero=fsn0, durable=conn.durable)
            await self._connection(conn)
            return ws
        finally:
            self._conns.discard(conn)
            if client is not None and self._claims.get(client) is token:
                del self._claims[client]
            self._live.discard(token)
            token.set_result(None)

    async def _connection(self, conn: _Conn) -> None:
        reader = asyncio.create_task(self._reader(conn))
        try:
            await self._process(conn)
        except ConnectionError:
            pass  # the peer is gone; what it was not answered it sends again
        finally:
            reader.cancel()
            with contextlib.suppress(asyncio.CancelledError, ConnectionError):
                await reader
            # What was taken and not appended (after a refusal, a closed connection) is freed.
            while not conn.queue.empty():
                item = conn.queue.get_nowait()
                if isinstance(item, bytes):
                    self._budget.release(conn.account, _charge([item]))

    async def _reader(self, conn: _Conn) -> None:
        """Take messages off the socket while they fit the bounds (FWD-25): waiting for room
        reads nothing more, so the WebSocket layer stops reading and TCP pushes back."""
        try:
            while True:
                msg = await conn.ws.receive()
                if msg.type is WSMsgType.TEXT:
                    await conn.ws.close(
                        code=WSCloseCode.UNSUPPORTED_DATA, message=b"QWP frames are binary"
                    )
                    break
                if msg.type is not WSMsgType.BINARY:
                    break  # closed, closing or failed (1009, a lost peer, keepalive)
                message: bytes = msg.data
                if len(message) > self.limits.max_connection_bytes:
                    conn.queue.put_nowait(_Oversize(len(message)))
                    break  # nothing after it is stored (FWD-21)
                charge = _charge([message])
                await self._budget.take(conn.account, charge)
                conn.queue.put_nowait(message)
                self._taken_since_trim += charge
                if self._budget.held > self.stats["peak_held_bytes"]:
                    self.stats["peak_held_bytes"] = self._budget.held
        finally:
            conn.queue.put_nowait(None)

    async def _process(self, conn: _Conn) -> None:
        while True:
            items = [await conn.queue.get()]
            while isinstance(items[-1], bytes) and not conn.queue.empty():
                items.append(conn.queue.get_nowait())
            frames = [m for m in items if isinstance(m, bytes)]
            end = items[-1]
            oversize = end if isinstance(end, _Oversize) else None
            try:
                go_on = True
                if frames or oversize is not None:
                    go_on = await self._store_batch(conn, frames, oversize)
            finally:
                self._budget.release(conn.account, _charge(frames))
            if not go_on or not isinstance(end, bytes):
                return

    async def _store_batch(
        self, conn: _Conn, batch: list[bytes], oversize: _Oversize | None = None
    ) -> bool:
        """Append the new frames of ``batch`` and answer them; then refuse ``oversize``, the
        message after them, if any (FWD-25). False: stop reading."""
        first_wire = conn.wire_seq
        conn.wire_seq += len(batch)
        self.stats["frames"] += len(batch)
        results: list[int | None] = []
        head = 0
        failed: tuple[int, int, str] | None = None
        if batch:
            results, head, failed = await asyncio.to_thread(self._append, conn, first_wire, batch)
        if failed is None and oversize is not None:
            failed = (
                conn.wire_seq,
                _WRITE_ERROR,
                f"too_large: a frame of {oversize.size} bytes is larger than this receiver's "
                f"max_connection_bytes ({self.limits.max_connection_bytes}) (FWD-25)",
            )
            await asyncio.to_thread(self._locked, self._note_refused, conn, conn.wire_seq)
        seqtxns = [head if seq is None else seq for seq in results]
        replies: list[bytes] = []
        if results:
            # One OK for the batch: OKs are cumulative (the sender acknowledges everything up to
            # the sequence, FWD-6) and in durable mode the one queue entry carries the
            # batch's highest seqTxn, covered exactly when every frame of the batch is (FWD-18).
            last_wire = first_wire + len(results) - 1
            replies.append(wire.encode_ok(last_wire, {self.table: max(seqtxns)}))
        stored = [seq for seq in results if seq is not None]
        if stored:
            self.appended_seq = max(self.appended_seq, stored[-1])
        self.stats["duplicates"] += len(results) - len(stored)
        self.stats["stored"] += len(stored)
        if failed is not None:
            wseq, status, message = failed
            replies.append(wire.encode_error(status, wseq, message))
            self.stats["rejected"] += 1
        for reply in replies:
            await conn.ws.send_bytes(reply)
        if results:
            conn.max_ok = max(conn.max_ok, *seqtxns)
            conn.min_ok = max(seqtxns) if conn.min_ok is None else conn.min_ok
        await self._send_durable(conn)  # replays of durable frames are confirmed at once
        self._trace(
            "batch", client=conn.client, first_wire_seq=first_wire, n=len(batch),
            stored=len(stored), failed=failed is not None,
        )  # fmt: skip
        if failed is not None:
            # Nothing after a rejected frame is stored from this connection, so the client's
            # mark never passes a frame it does not hold (FWD-21); 1011 makes the sender
            # reconnect and replay from its first unacknowledged frame.
            await conn.ws.close(code=WSCloseCode.INTERNAL_ERROR, message=b"frame rejected")
            return False
        return True

    def _append(
        self, conn: _Conn, first_wire: int, batch: Sequence[bytes]
    ) -> tuple[list[int | None], int, tuple[int, int, str] | None]:
        """Worker thread: per frame its seq or None (a replay), the head seq, and the rejected
        frame (wire seq, status, message) if one failed.

        Under the append lock, so the replay check and the append are one step even when an
        old and a new connection of the same sender overlap (FWD-19)."""
        client = conn.client if conn.fsn_at_zero is not None else None
        with self._append_lock:
            head = self.topic.state().head_seq
            out: list[int | None] = []
            i = 0
            if client is not None:
                assert conn.fsn_at_zero is not None
                hint = self.dedup.mark(client)  # a lower bound of the topic's producer mark
                i = max(0, min(len(batch), hint - (conn.fsn_at_zero + first_wire) + 1))
                out += [None] * i
            one_by_one = False
            while i < len(batch):
                # Whole batches only while the client's mark is known exactly; otherwise frame
                # by frame, so a batch straddling the real mark is never applied whole.
                single = one_by_one or (client is not None and not self.dedup.is_exact(client))
                chunk = batch[i : i + 1] if single else batch[i:]
                try:
                    seqs = self._append_run(client, conn.fsn_at_zero, first_wire + i, chunk)
                except TidelogError as exc:
                    if len(chunk) > 1:
                        one_by_one = True  # find the frame that fails
                        continue
                    self._note_refused(conn, first_wire + i)
                    return out, head, (first_wire + i, _status(exc), f"{exc.code}: {exc.message}")
                out += seqs if seqs else [None] * len(chunk)
                i += len(chunk)
            return out, head, None

    def _note_refused(self, conn: _Conn, wire_seq: int) -> None:
        """Under the append lock: the frame at ``wire_seq`` gets an error frame; the sender may
        drop it, so its next connection may start after it (FWD-26)."""
        if conn.client is not None and conn.fsn_at_zero is not None:
            self.dedup.note_refused(conn.client, conn.fsn_at_zero + wire_seq)

    def _append_run(
        self, client: str | None, fsn_at_zero: int | None, first_wire: int, frames: Sequence[bytes]
    ) -> list[int]:
        if client is None or fsn_at_zero is None:
            return self.topic.append_many(frames)  # anonymous sender: no de-duplication
        first = fsn_at_zero + first_wire
        last = first + len(frames) - 1
        # TOP-11: the topic applies the batch only if last + 1 is above the client's producer
        # mark, and keeps the mark atomically with the records (crash-proof, trim-proof).
        seqs = self.topic.append_many(
            frames, tag=batch_tag(first, last), node=client, producer=(client, last + 1)
        )
        self.dedup.note(client, last, applied=bool(seqs))
        return seqs

    # -- durability ----------------------------------------------------------------------------
    async def _flush_loop(self) -> None:
        stopping = self._stopping
        assert stopping is not None
        while True:
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(stopping.wait(), self.flush_interval)
            if stopping.is_set():
                return
            await self._flush_once()
            await self._return_memory()

    async def _return_memory(self) -> None:
        """Once nothing is held after a flood, give freed buffers back to the operating system
        (FWD-25): at most once a second, three times after a flood, and three times again
        after each checkpoint the store makes meanwhile, since the store frees its own copies
        of the frames when it seals them, however late a loaded machine runs its checkpoints."""
        if self._budget.held:
            return
        now = asyncio.get_running_loop().time()
        if now < self._next_trim:
            return
        self._next_trim = now + 1.0
        checkpoints = await asyncio.to_thread(self._checkpoints)
        if self._taken_since_trim >= _TRIM_AFTER or checkpoints != self._checkpoints_seen:
            self._taken_since_trim = 0
            self._checkpoints_seen = checkpoints
            self._trims_due = 3
        if self._trims_due:
            self._trims_due -= 1
            await asyncio.to_thread(return_free_memory)

    def _checkpoints(self) -> object:
        """The store's last checkpoint, as ``describe()`` says (None where it has none)."""
        checkpoint = self.store.describe().get("checkpoint")
        return checkpoint.get("snapshot") if isinstance(checkpoint, dict) else None

    def _locked(self, fn: Callable[..., Any], *args: Any) -> Any:
        """``fn(*args)`` under the append lock, on a worker thread: an append may hold the lock
        through an fsync, and the event loop must keep reading and answering meanwhile."""
        with self._append_lock:
            return fn(*args)

    def _snapshot(self) -> tuple[int, dict[str, int], dict[str, int]]:
        return self.topic.state().head_seq, dict(self.dedup.marks), dict(self.dedup.refused)

    async def _flush_once(self, *, final: bool = False) -> None:
        """Flush and checkpoint what is new. A refused FSN whose checkpoint failed is retried
        only when it changes, except at the ``final`` flush of ``stop`` (FWD-26)."""
        through, marks, refused = await asyncio.to_thread(self._locked, self._snapshot)
        if through > self.durable_seq:
            try:
                await asyncio.to_thread(self.store.flush)
            except TidelogError as exc:
                # Nothing is confirmed durable until a flush succeeds; retried every interval.
                self._log_once(logging.ERROR, f"flush failed: {exc.code}: {exc.message}")
                return
            self.durable_seq = through
            self._trace("durable", seq=through)
            await self._checkpoint(through, marks, refused)
        elif self.dedup.refused_unsaved(refused) and (final or refused != self._refused_tried):
            await self._checkpoint(self.dedup.through_seq, {}, refused)  # FWD-26
        for conn in list(self._conns):
            await self._send_durable(conn)

    async def _checkpoint(
        self, through: int, marks: dict[str, int], refused: dict[str, int]
    ) -> None:
        """Write the de-dup checkpoint; a failure (e.g. a store whose max_record_bytes is
        smaller than the checkpoint) only costs a longer scan at the next start (FWD-19)."""
        self._refused_tried = refused
        try:
            await asyncio.to_thread(self.dedup.checkpoint, through, marks, refused)
        except TidelogError as exc:
            self._log_once(
                logging.WARNING, f"de-dup checkpoint not written: {exc.code}: {exc.message}"
            )

    async def _send_durable(self, conn: _Conn) -> None:
        """Send the cumulative durable watermark to a connection that has OKs it does not
        cover yet. Per connection, so a new connection gets the watermark afresh (FWD-7)
        even when nothing new was appended (its replays were all duplicates)."""
        if not conn.durable or conn.min_ok is None or self.durable_seq < conn.min_ok:
            return
        if conn.durable_sent >= min(conn.max_ok, self.durable_seq):
            return
        conn.durable_sent = self.durable_seq
        with contextlib.suppress(ConnectionError):
            await conn.ws.send_bytes(wire.encode_durable_ack({self.table: self.durable_seq}))
