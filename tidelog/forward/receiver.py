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
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from http import HTTPStatus
from typing import Any

from websockets.asyncio.server import Server, ServerConnection, serve
from websockets.datastructures import Headers
from websockets.exceptions import ConnectionClosed
from websockets.http11 import Request, Response

import tidelog
from tidelog.api import Store, Topic
from tidelog.errors import Backpressure, TidelogError, TooLarge, TopicFull

from . import wire
from .dedup import DedupIndex, batch_tag

__all__ = ["Receiver", "PATHS"]

log = logging.getLogger("tidelog.serve")

PATHS = ("/write/v4", "/api/v4/write")
_WRITE_ERROR = 0x09
_INTERNAL_ERROR = 0x06


def _status(exc: TidelogError) -> int:
    """A rejected append's status byte: the topic refuses writes (WRITE_ERROR, dropped by
    default) or something else went wrong (INTERNAL_ERROR, halts by default)."""
    return _WRITE_ERROR if isinstance(exc, TooLarge | TopicFull | Backpressure) else _INTERNAL_ERROR


@dataclass(eq=False)
class _Conn:
    ws: ServerConnection
    client: str | None
    fsn_at_zero: int | None
    durable: bool
    wire_seq: int = 0
    max_ok: int = -1  # highest seqTxn an OK on this connection reported
    min_ok: int | None = None  # lowest one: a watermark below it covers nothing here
    durable_sent: int = -1  # the durable watermark last sent on this connection
    queue: asyncio.Queue[bytes | None] = field(default_factory=asyncio.Queue)


class Receiver:
    """Serve one topic of ``store`` on ``host:port`` (0 = any free port; see ``port``)."""

    def __init__(
        self,
        store: Store,
        topic: str,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        durable_ack: bool = True,
        flush_interval_ms: int = 10,
        max_frame_bytes: int = 16 << 20,
        topic_options: dict[str, Any] | None = None,
        tracer: Callable[[str, dict[str, Any]], None] | None = None,
        owns_store: bool = False,
    ) -> None:
        self.store = store
        self.topic: Topic = store.topic(topic, **(topic_options or {}))
        self.table = topic
        self.host = host
        self.port = port
        self.durable_ack = durable_ack
        self.flush_interval = flush_interval_ms / 1000.0
        self.max_frame_bytes = max_frame_bytes
        self.tracer = tracer
        self.owns_store = owns_store
        self.dedup = DedupIndex(store, self.topic)
        self.appended_seq = self.topic.state().head_seq
        self.durable_seq = self.appended_seq
        self.stats = {"frames": 0, "stored": 0, "duplicates": 0, "rejected": 0, "connections": 0}
        self._conns: set[_Conn] = set()
        self._append_lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._server: Server | None = None
        self._started = threading.Event()
        self._start_error: BaseException | None = None

    @classmethod
    def open(cls, uri: str, topic: str, **kwargs: Any) -> Receiver:
        """Open the store at ``uri`` and serve ``topic`` (the receiver owns and closes it)."""
        store = tidelog.open(uri)
        try:
            return cls(store, topic, owns_store=True, **kwargs)
        except BaseException:
            store.close()
            raise

    # -- lifecycle ---------------------------------------------------------------------------
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
        with asyncio.Runner(loop_factory=lambda: loop) as runner:
            runner.run(self._serve())

    async def _serve(self) -> None:
        self._stopping = asyncio.Event()
        try:
            self._server = await serve(
                self._handler,
                self.host,
                self.port,
                process_request=self._process_request,
                process_response=self._process_response,
                compression=None,
                max_size=self.max_frame_bytes,
                ping_interval=None,
                close_timeout=1.0,
            )
        except BaseException as exc:
            self._start_error = exc
            self._started.set()
            return
        self.port = self._server.sockets[0].getsockname()[1]
        flusher = asyncio.create_task(self._flusher())
        self._started.set()
        await self._stopping.wait()
        self._server.close()
        await self._server.wait_closed()
        flusher.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await flusher
        if not self._abort:
            await self._flush_once()

    def stop(self, *, abort: bool = False) -> None:
        """Stop serving (connections close with 1001); a final flush and checkpoint unless
        ``abort``. Closes the store if the receiver opened it."""
        self._abort = abort
        if self._loop is not None and self._thread is not None and self._thread.is_alive():
            self._loop.call_soon_threadsafe(self._stopping.set)
            self._thread.join()
        if self.owns_store:
            self.store.close()

    _abort = False

    def serve_forever(self) -> None:
        """Block until interrupted (the CLI), starting first if needed."""
        if self._thread is None:
            self.start()
        assert self._thread is not None
        try:
            while self._thread.is_alive():
                self._thread.join(0.5)
        except KeyboardInterrupt:
            pass
        finally:
            self.stop()

    def _trace(self, event: str, **data: Any) -> None:
        if self.tracer is not None:
            self.tracer(event, data)

    # -- handshake -----------------------------------------------------------------------------
    def _process_request(self, conn: ServerConnection, request: Request) -> Response | None:
        path = request.path.split("?", 1)[0]
        if path not in PATHS:
            return conn.respond(HTTPStatus.NOT_FOUND, f"no QWP endpoint at {path}\n")
        raw = request.headers.get(wire.H_FSN_AT_ZERO)
        if raw is not None and not raw.strip().isdigit():
            return conn.respond(HTTPStatus.BAD_REQUEST, f"bad {wire.H_FSN_AT_ZERO}: {raw!r}\n")
        client = request.headers.get(wire.H_CLIENT_ID)
        if client is not None and not 0 < len(client.encode("utf-8")) <= 200:
            # It becomes the TOP-11 producer id (at most 200 bytes).
            return conn.respond(HTTPStatus.BAD_REQUEST, "client id must be 1..200 bytes\n")
        return None

    def _process_response(
        self, conn: ServerConnection, request: Request, response: Response
    ) -> Response | None:
        if response.status_code != 101:
            return None
        headers: Headers = response.headers
        headers[wire.H_VERSION] = str(wire.QWP_VERSION)
        wants = request.headers.get(wire.H_REQUEST_DURABLE_ACK, "").lower() == "true"
        if wants and self.durable_ack:
            headers[wire.H_DURABLE_ACK] = "enabled"
        client = request.headers.get(wire.H_CLIENT_ID)
        if client:
            headers[wire.H_LAST_FSN] = str(self.dedup.mark(client))
        return None

    # -- one connection ------------------------------------------------------------------------
    async def _handler(self, ws: ServerConnection) -> None:
        request = ws.request
        assert request is not None
        client = request.headers.get(wire.H_CLIENT_ID) or None
        raw = request.headers.get(wire.H_FSN_AT_ZERO)
        fsn0 = int(raw) if raw is not None and client else None
        wants = request.headers.get(wire.H_REQUEST_DURABLE_ACK, "").lower() == "true"
        conn = _Conn(ws, client, fsn0, wants and self.durable_ack)
        self._conns.add(conn)
        self.stats["connections"] += 1
        self._trace("connect", client=client, fsn_at_zero=fsn0, durable=conn.durable)
        reader = asyncio.create_task(self._reader(conn))
        try:
            await self._process(conn)
        except ConnectionClosed:
            pass
        finally:
            reader.cancel()
            with contextlib.suppress(asyncio.CancelledError, ConnectionClosed):
                await reader
            self._conns.discard(conn)

    async def _reader(self, conn: _Conn) -> None:
        try:
            async for message in conn.ws:
                if isinstance(message, str):
                    await conn.ws.close(1003, "QWP frames are binary")
                    break
                conn.queue.put_nowait(message)
        finally:
            conn.queue.put_nowait(None)

    async def _process(self, conn: _Conn) -> None:
        while True:
            first = await conn.queue.get()
            if first is None:
                return
            batch = [first]
            while not conn.queue.empty():
                item = conn.queue.get_nowait()
                if item is None:
                    conn.queue.put_nowait(None)
                    break
                batch.append(item)
            if not await self._store_batch(conn, batch):
                return

    async def _store_batch(self, conn: _Conn, batch: list[bytes]) -> bool:
        """Append the new frames of ``batch`` and answer them. False: stop reading."""
        first_wire = conn.wire_seq
        conn.wire_seq += len(batch)
        self.stats["frames"] += len(batch)
        results, head, failed = await asyncio.to_thread(self._append, conn, first_wire, batch)
        seqtxns = [head if seq is None else seq for seq in results]
        replies: list[bytes] = []
        if results:
            # One OK for the batch: OKs are cumulative (the sender acknowledges everything up to
            # the sequence, seed §9.2) and in durable mode the one queue entry carries the
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
            await conn.ws.send(reply)
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
            await conn.ws.close(1011, "frame rejected")
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
                    return out, head, (first_wire + i, _status(exc), f"{exc.code}: {exc.message}")
                out += seqs if seqs else [None] * len(chunk)
                i += len(chunk)
            return out, head, None

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
    async def _flusher(self) -> None:
        while True:
            await asyncio.sleep(self.flush_interval)
            await self._flush_once()

    async def _flush_once(self) -> None:
        with self._append_lock:
            through = self.topic.state().head_seq
            marks = dict(self.dedup.marks)
        if through > self.durable_seq:
            await asyncio.to_thread(self.store.flush)
            await asyncio.to_thread(self.dedup.checkpoint, through, marks)
            self.durable_seq = through
            self._trace("durable", seq=through)
        for conn in list(self._conns):
            await self._send_durable(conn)

    async def _send_durable(self, conn: _Conn) -> None:
        """Send the cumulative durable watermark to a connection that has OKs it does not
        cover yet. Per connection, so a new connection gets the watermark afresh (seed §10.3)
        even when nothing new was appended (its replays were all duplicates)."""
        if not conn.durable or conn.min_ok is None or self.durable_seq < conn.min_ok:
            return
        if conn.durable_sent >= min(conn.max_ok, self.durable_seq):
            return
        conn.durable_sent = self.durable_seq
        with contextlib.suppress(ConnectionClosed):
            await conn.ws.send(wire.encode_durable_ack({self.table: self.durable_seq}))
