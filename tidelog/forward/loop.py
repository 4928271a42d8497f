"""The forwarder's I/O loop: connect, send, receive, reconnect (FWD-3..FWD-15).

It runs on its own thread with its own asyncio event loop. Per connection: a send pump streams
frames in strict FSN order, one per binary WebSocket message; a receive pump maps OK, durable-ack
and error frames back to FSNs (``ConnState``) and advances the trim point; in durable-ack mode a
keepalive pump pings while confirmations are pending. The first pump to finish decides what
happens next: reconnect (with equal-jitter backoff inside a per-outage budget), halt, or stop.

Everything time-related is injectable: ``clock`` (the outage budget), ``sleep`` (the backoff
wait) and ``rng`` (the jitter), so tests never wait for real backoff (FSN-9).
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import inspect
import logging
import random
import ssl
import threading
import time
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import Any

from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed, InvalidHandshake, InvalidStatus

import tidelog
from tidelog.clock import Clock
from tidelog.errors import TidelogError
from tidelog.model.fsn import (
    backoff_sleep,
    close_code_is_terminal,
    effective_policy,
    status_category,
)

from . import wire
from .ackstate import ConnState
from .catchup import MAX_BATCH_HEADER, CatchUpTooLarge, DictMirror, batch_cap
from .conf import SenderConfig
from .errors import ErrorInbox, SenderError
from .source import Gap, Source

__all__ = ["IOLoop", "Counters", "Tracer"]

log = logging.getLogger("tidelog.forward")

#: ``tracer(event, data)`` on the loop thread, in processing order (the test oracle's feed).
Tracer = Callable[[str, dict[str, Any]], None]
Sleep = Callable[[float], Awaitable[None]]


# websockets >= 15 reads HTTP(S)_PROXY from the environment unless told not to; older versions
# have no proxy support (and no such argument). The receiver is addressed directly.
_NO_PROXY: dict[str, Any] = (
    {"proxy": None} if "proxy" in inspect.signature(connect.__init__).parameters else {}
)


class Outcome(enum.Enum):
    RECONNECT = "reconnect"  # transient: enter / continue the reconnect loop
    HALT = "halt"  # a terminal error is latched
    STOP = "stop"  # close() asked us to stop
    WINDOW = "window"  # a source gap was skipped: reconnect at once, not an outage (FWD-22)


class _Terminal(Exception):
    def __init__(self, category: str, message: str) -> None:
        super().__init__(message)
        self.category = category


class _RoleReject(Exception):
    pass


class _Transient(Exception):
    pass


class _SourceFailed(Exception):
    """Reading the source failed: a local fault (an unreadable segment, a closed store) that
    no reconnect can cure, so it halts instead of reconnecting forever (FWD-5)."""


class _MonotonicClock:
    def now_ms(self) -> int:
        return time.monotonic_ns() // 1_000_000


class Counters:
    """FWD-16 counters (snake_case), plus tidelog's own (``keepalive_pings``,
    ``window_resets``, ``frames_sent``). Written by the loop thread only."""

    def __init__(self) -> None:
        self.total_reconnect_attempts = 0
        self.total_reconnects_succeeded = 0
        self.total_frames_replayed = 0
        self.total_server_errors = 0
        self.total_backpressure_stalls = 0
        self.keepalive_pings = 0
        self.window_resets = 0
        self.frames_sent = 0
        self.connections = 0

    def as_dict(self) -> dict[str, int]:
        return dict(vars(self))


class IOLoop:
    """Owns the thread, the event loop and the connection state of one forwarder."""

    def __init__(
        self,
        conf: SenderConfig,
        source: Source,
        inbox: ErrorInbox,
        *,
        rng: random.Random | None = None,
        clock: Clock | None = None,
        sleep: Sleep | None = None,
        tracer: Tracer | None = None,
        replay_target: int = -1,
    ) -> None:
        self.conf = conf
        self.source = source
        self.inbox = inbox
        self.rng = rng or random.Random()
        self.clock: Clock = clock or _MonotonicClock()
        self._sleep_fn = sleep
        self.tracer = tracer
        self.counters = Counters()
        self.acked = source.acked_fsn()
        self.terminal: SenderError | None = None
        # Frames at or below this FSN may have been sent before: resending them is a replay.
        self.replay_target = replay_target
        self.state_cond = threading.Condition()
        self.connected = False
        self.ever_connected = False
        # Wall time the current outage began, for the backpressure message (FWD-14). Until
        # the first connect succeeds the loop is in its retry loop: that is an outage too.
        self.outage_since: float | None = time.time()
        self.outage_attempts = 0
        self.first_outcome = threading.Event()
        self._loop = asyncio.new_event_loop()
        # Created here, not in _main: a stop() requested before the thread first ran must not
        # be lost (asyncio.Event binds to the running loop only on first use, Python >= 3.10).
        self._stop_event = asyncio.Event()
        self._wakeup = asyncio.Event()
        self._ack_event = asyncio.Event()
        self._want_wakeup = False
        self._last_send = 0.0
        # FWD-32: the symbol dictionary sent so far, for a slot with a `.symbol-dict`; built
        # at the first connection (False: not built yet; None: the source has none).
        self._mirror: DictMirror | bool | None = False
        # A daemon: a forwarder nobody closed must not keep the interpreter alive in its
        # reconnect loop (the slot keeps what was not acknowledged).
        self._thread = threading.Thread(
            target=self._thread_main, name="tidelog-forward-io", daemon=True
        )
        source.add_listener(self._on_publish)
        # What recovery (or the subscriber) seeded, before anything moves it (FSN-5).
        self._trace("start", acked=self.acked, published=source.published_fsn())

    # -- thread plumbing ---------------------------------------------------------------------
    def start(self) -> None:
        self._thread.start()

    def _thread_main(self) -> None:
        try:
            # The Runner cancels and awaits whatever tasks are left before closing the loop.
            with asyncio.Runner(loop_factory=lambda: self._loop) as runner:
                runner.run(self._main())
        finally:
            self.first_outcome.set()

    def stop(self, timeout: float | None = None) -> None:
        """Ask the loop to stop (closing the connection with 1000) and join the thread."""
        if not self._thread.is_alive():
            return
        with contextlib.suppress(RuntimeError):  # the loop already finished
            self._loop.call_soon_threadsafe(self._request_stop)
        self._thread.join(timeout)

    def _request_stop(self) -> None:
        self._stop_event.set()
        self._wakeup.set()

    def _on_publish(self) -> None:
        # Called by producer threads after every append. Only wake the loop when the send pump
        # is parked: it sets the flag, then re-checks published_fsn before sleeping.
        if self._want_wakeup:
            self._want_wakeup = False
            with contextlib.suppress(RuntimeError):
                self._loop.call_soon_threadsafe(self._wakeup.set)

    def _trace(self, event: str, **data: Any) -> None:
        if self.tracer is not None:
            self.tracer(event, data)

    @property
    def running(self) -> bool:
        return self._thread.is_alive()

    # -- acknowledgement -----------------------------------------------------------------------
    def _advance(self, target: int) -> None:
        target = min(target, self.source.published_fsn())  # FSN-3
        if target > self.acked:
            self.acked = target
            self.source.acknowledge(target)
            self._ack_event.set()
            with self.state_cond:
                self.state_cond.notify_all()

    def _latch(self, error: SenderError) -> None:
        with self.state_cond:
            if self.terminal is None:
                self.terminal = error
            self.state_cond.notify_all()
        self.inbox.offer(error)
        self._trace("halt", category=error.category, status=error.status)

    def _synthesized(self, category: str, message: str, code: str = "sender_error") -> SenderError:
        return SenderError(
            category=category,
            policy="HALT",
            status=-1,
            sequence=-1,
            first_fsn=self.acked + 1,
            last_fsn=self.source.published_fsn(),
            message=message,
            client_id=self.conf.client_id,
            code=code,
        )

    def _latch_dropped(self) -> None:
        """FWD-35: the source's topic was dropped; a terminal error of code no_such_topic."""
        self._latch(
            self._synthesized(
                "PROTOCOL_VIOLATION",
                f"{self.source.dropped}; the forwarder stopped and sends nothing more under "
                f"client id {self.conf.client_id!r}: a forwarder started on the topic created "
                "again sends it under a client id of its own (FWD-35, FWD-34)",
                code="no_such_topic",
            )
        )

    # -- the reconnect loop (FWD-12) ---------------------------------------------------------
    async def _main(self) -> None:
        try:
            await self._reconnect_loop()
        except Exception as exc:  # a bug must surface as a terminal error, never vanish
            log.exception("forwarder I/O loop crashed")
            self._latch(self._synthesized("PROTOCOL_VIOLATION", f"I/O loop crashed: {exc!r}"))

    async def _reconnect_loop(self) -> None:
        conf = self.conf
        hosts = conf.addr
        attempt = 0
        tried: set[int] = set()
        start = 0
        outage_start: int | None = None
        seen_first = False
        role_reject_last = False
        while not self._stop_event.is_set():
            if self._gone():  # FWD-35: nothing left to connect for
                self._latch_dropped()
                return
            idx = next(
                (
                    i % len(hosts)
                    for i in range(start, start + len(hosts))
                    if i % len(hosts) not in tried
                ),
                None,
            )
            if idx is None:  # round exhausted: one sleep, then a fresh round (FWD-12)
                if outage_start is None:
                    outage_start = self.clock.now_ms()
                remaining = conf.reconnect_max_duration_millis - (
                    self.clock.now_ms() - outage_start
                )
                if role_reject_last:
                    delay: int | None = min(conf.reconnect_initial_backoff_millis, remaining)
                    delay = delay if remaining > 0 else None
                    attempt = 0  # role rejects do not double the backoff
                else:
                    delay = backoff_sleep(
                        attempt,
                        conf.reconnect_initial_backoff_millis,
                        conf.reconnect_max_backoff_millis,
                        remaining,
                        self.rng.random(),
                    )
                if delay is None:
                    self._latch(
                        self._synthesized(
                            "PROTOCOL_VIOLATION",
                            f"reconnect budget of {conf.reconnect_max_duration_millis} ms "
                            f"exhausted after {self.outage_attempts} attempts",
                        )
                    )
                    return
                self._trace("backoff", attempt=attempt, delay_ms=delay)
                await self._sleep(delay)
                if not role_reject_last:
                    attempt += 1
                tried.clear()
                continue
            tried.add(idx)
            if seen_first:
                self.counters.total_reconnect_attempts += 1
            self.outage_attempts += 1
            try:
                ws, catch_up = await self._connect(idx)
            except _Terminal as t:
                self._latch(self._synthesized(t.category, str(t)))
                return
            except _RoleReject:
                role_reject_last = True
                continue
            except _Transient as exc:
                role_reject_last = False
                log.info("connect to %s:%d failed: %s", *hosts[idx], exc)
                if outage_start is None:
                    outage_start = self.clock.now_ms()
                if self.outage_since is None:
                    self.outage_since = time.time()
                if not seen_first and conf.initial_connect_retry == "off":
                    self._latch(
                        self._synthesized(
                            "PROTOCOL_VIOLATION",
                            f"initial connect to {hosts[idx][0]}:{hosts[idx][1]} failed "
                            f"(initial_connect_retry=off): {exc}",
                        )
                    )
                    return
                continue
            # Connected: the budget and the doubling restart (FWD-12, FSN-9).
            if seen_first:
                self.counters.total_reconnects_succeeded += 1
            seen_first = True
            self.ever_connected = True
            self.first_outcome.set()
            attempt, outage_start, role_reject_last = 0, None, False
            self.outage_since, self.outage_attempts = None, 0
            tried, start = {idx}, idx
            outcome = await self._session(ws, catch_up)
            if outcome in (Outcome.HALT, Outcome.STOP):
                return
            if outcome is Outcome.WINDOW:
                self.counters.window_resets += 1
                tried.clear()  # not an outage: reconnect at once
                continue
            outage_start = self.clock.now_ms()
            self.outage_since = time.time()
            # Mid-stream failure: the next untried host is tried at once; with one host the
            # round is exhausted and one backoff sleep follows (FWD-12).

    async def _sleep(self, delay_ms: int) -> None:
        if self._sleep_fn is not None:
            await self._sleep_fn(delay_ms / 1000.0)
            return
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._stop_event.wait(), delay_ms / 1000.0)

    # -- connecting (FWD-3) --------------------------------------------------------------------
    def _headers(self, fsn_at_zero: int) -> dict[str, str]:
        conf = self.conf
        headers = {
            wire.H_MAX_VERSION: str(wire.QWP_VERSION),
            wire.H_CLIENT_ID: conf.client_id,
            wire.H_FSN_AT_ZERO: str(fsn_at_zero),
        }
        if conf.request_durable_ack:
            headers[wire.H_REQUEST_DURABLE_ACK] = "true"
        if conf.token is not None:
            headers["Authorization"] = f"Bearer {conf.token}"
        elif conf.username is not None and conf.password is not None:
            import base64

            raw = f"{conf.username}:{conf.password}".encode()
            headers["Authorization"] = "Basic " + base64.b64encode(raw).decode()
        return headers

    def _ssl(self) -> ssl.SSLContext | None:
        if self.conf.schema != "wss":
            return None
        ctx = ssl.create_default_context(cafile=self.conf.tls_roots)
        if not self.conf.tls_verify:
            ctx.check_hostname = False
            ctx.verify_mode = ssl.CERT_NONE
        return ctx

    async def _connect(self, idx: int) -> tuple[ClientConnection, list[bytes]]:
        conf = self.conf
        host, port = conf.addr[idx]
        uri = f"{conf.schema}://{host}:{port}{conf.tidelog_path}"
        fsn_at_zero = self.acked + 1
        try:
            ws = await connect(
                uri,
                additional_headers=self._headers(fsn_at_zero),
                user_agent_header=f"tidelog/{tidelog.__version__}",
                compression=None,
                **_NO_PROXY,
                open_timeout=conf.tidelog_connect_timeout_millis / 1000.0,
                ping_interval=None,  # keepalive is ours (FWD-8), not the library's
                close_timeout=1.0,
                max_size=None,
                ssl=self._ssl(),
            )
        except InvalidStatus as exc:
            status = exc.response.status_code
            if status in (401, 403):
                raise _Terminal("SECURITY_ERROR", f"upgrade rejected: HTTP {status}") from None
            if status == 421:
                raise _RoleReject(f"HTTP 421 from {host}:{port}") from None
            why = bytes(exc.response.body or b"").decode("utf-8", "replace").strip()
            if status == 409 and "FWD-26" in why:
                # the receiver refuses this FSN for good: retrying the same one cannot help
                raise _Terminal("PROTOCOL_VIOLATION", f"upgrade refused: HTTP 409: {why}") from None
            raise _Transient(f"HTTP {status}" + (f": {why}" if why else "")) from None
        except (OSError, TimeoutError, InvalidHandshake) as exc:
            raise _Transient(repr(exc)) from None
        headers = ws.response.headers if ws.response is not None else {}
        version = headers.get(wire.H_VERSION, str(wire.QWP_VERSION)).strip()
        if version != str(wire.QWP_VERSION):
            # FWD-3: a version outside what we asked for (X-QWP-Max-Version: 1) is a
            # per-endpoint mismatch: transient, so the walk moves on to the next host.
            ws.transport.abort()
            raise _Transient(f"{host}:{port} negotiated {wire.H_VERSION}: {version!r}, not 1")
        if conf.request_durable_ack and headers.get(wire.H_DURABLE_ACK, "").lower() != "enabled":
            await ws.close(1000)
            raise _Terminal(
                "PROTOCOL_VIOLATION",
                f"request_durable_ack=on but {host}:{port} did not answer "
                f"{wire.H_DURABLE_ACK}: enabled; refusing to buffer for acks that never come",
            )
        last = headers.get(wire.H_LAST_FSN)
        if last is not None:
            try:
                last_fsn = int(last)
            except ValueError:
                last_fsn = -1
            published = self.source.published_fsn()
            if last_fsn > published:
                await ws.close(1000)
                raise _Terminal(
                    "PROTOCOL_VIOLATION",
                    f"receiver already holds FSN {last_fsn} from client id "
                    f"{conf.client_id!r} but this sender only published up to {published}: the "
                    "FSN numbering went backwards (slot wiped or shared sender_id?); new frames "
                    "would be discarded as duplicates. Use a new sender_id.",
                )
        try:
            return ws, await self._catch_up(ws)
        except _SourceFailed as exc:
            await ws.close(1000)
            raise _Terminal("PROTOCOL_VIOLATION", f"FWD-32: {exc}") from None
        except CatchUpTooLarge as exc:
            # The cap is this endpoint's: another host may take it. A failed attempt, so the
            # reconnect budget keeps running (FWD-12, FWD-32).
            ws.transport.abort()
            raise _Transient(str(exc)) from None

    # -- one connection ----------------------------------------------------------------------
    # -- symbol-dictionary catch-up (FWD-32) -----------------------------------------------
    async def _dict_mirror(self) -> DictMirror | None:
        """The slot's `.symbol-dict`, extended by the unacknowledged frames' delta sections
        (read once, at the first connection, as the client does at recovery)."""
        if self._mirror is False:
            seed = self.source.symbol_dict()
            mirror = None if seed is None else DictMirror(seed)
            fsn = self.acked + 1
            while mirror is not None and fsn <= self.source.published_fsn():
                frames = await self._read(fsn)
                if isinstance(frames, Gap) or not frames or not mirror.fold(frames):
                    break
                fsn += len(frames)
            self._mirror = mirror
        assert not isinstance(self._mirror, bool)
        return self._mirror

    async def _catch_up(self, ws: ClientConnection) -> list[bytes]:
        """The catch-up messages for this connection: none to a tidelog receiver, which
        numbers an identified sender's frames by wire sequence (FWD-19) and decodes nothing."""
        headers = ws.response.headers if ws.response is not None else {}
        if wire.H_LAST_FSN in headers:
            return []
        try:
            mirror = await self._dict_mirror()
        except (TidelogError, OSError) as exc:
            raise _SourceFailed(
                f"reading the symbol dictionary of {self.source.name}: {exc!r}"
            ) from exc
        if mirror is None:
            return []
        return mirror.messages(batch_cap(headers.get(MAX_BATCH_HEADER)))

    async def _session(self, ws: ClientConnection, catch_up: list[bytes]) -> Outcome:
        st = ConnState(self.acked + 1, self.conf.request_durable_ack, len(catch_up))
        self.counters.connections += 1
        self.connected = True
        self._trace("connect", fsn_at_zero=st.fsn_at_zero, durable=st.durable)
        pumps = [
            asyncio.create_task(self._send_pump(ws, st, catch_up)),
            asyncio.create_task(self._recv_pump(ws, st)),
        ]
        if st.durable and self.conf.durable_ack_keepalive_interval_millis > 0:
            pumps.append(asyncio.create_task(self._keepalive_pump(ws, st)))
        stopper = asyncio.create_task(self._stop_event.wait())
        outcome = Outcome.RECONNECT
        try:
            done, _ = await asyncio.wait([*pumps, stopper], return_when=asyncio.FIRST_COMPLETED)
            if stopper in done:
                outcome = Outcome.STOP
            else:
                # The receive pump first: it sees the close frame that decides the routing.
                first = next(t for t in (pumps[1], pumps[0], *pumps[2:]) if t in done)
                exc = first.exception()
                if isinstance(exc, ConnectionClosed):
                    outcome = self._closed(exc)
                elif isinstance(exc, _SourceFailed):
                    self._latch(self._synthesized("PROTOCOL_VIOLATION", str(exc)))
                    outcome = Outcome.HALT
                elif exc is not None:
                    log.warning("connection failed: %r", exc)
                else:
                    outcome = first.result()
        finally:
            for task in [*pumps, stopper]:
                task.cancel()
            await asyncio.gather(*pumps, stopper, return_exceptions=True)
            self.connected = False
            if outcome in (Outcome.STOP, Outcome.WINDOW, Outcome.HALT):
                try:
                    await asyncio.wait_for(ws.close(1000), 2.0)
                except Exception:
                    ws.transport.abort()
            else:
                ws.transport.abort()
            # Frames published so far may be re-sent on the next connection (FSN-6).
            self.replay_target = self.source.published_fsn()
            self._trace("disconnect", outcome=outcome.value)
        return outcome

    def _closed(self, exc: ConnectionClosed) -> Outcome:
        """WebSocket close-code routing (FWD-11, FSN-8)."""
        code = exc.rcvd.code if exc.rcvd is not None else 1006
        reason = exc.rcvd.reason if exc.rcvd is not None else ""
        self._trace("close", code=code)
        if close_code_is_terminal(code):
            self._latch(self._synthesized("PROTOCOL_VIOLATION", f"ws-close[{code}]: {reason}"))
            return Outcome.HALT
        log.info("connection closed (code %d %s); reconnecting", code, reason)
        return Outcome.RECONNECT

    async def _read(self, fsn: int) -> list[bytes] | Gap:
        n = self.conf.tidelog_max_batch_frames
        if self.source.blocking_reads:
            return await asyncio.to_thread(self.source.read, fsn, n)
        return self.source.read(fsn, n)

    async def _send_pump(
        self, ws: ClientConnection, st: ConnState, catch_up: list[bytes]
    ) -> Outcome:
        """Frames in strict FSN order, one per binary message (FWD-5, FSN-6, FSN-1), after
        the connection's symbol-dictionary catch-up messages (FWD-32)."""
        for message in catch_up:
            self._trace("catch_up", wire_seq=st.sent())
            await ws.send(message)
        mirror = self._mirror if isinstance(self._mirror, DictMirror) else None
        while True:
            if self._gone():
                return await self._dropped(st)
            fsn = st.next_fsn()
            if fsn > self.source.published_fsn():
                self._wakeup.clear()
                self._want_wakeup = True
                if fsn > self.source.published_fsn() and not self._gone():
                    await self._wakeup.wait()
                self._want_wakeup = False
                continue
            try:
                frames = await self._read(fsn)
            except (TidelogError, OSError) as exc:
                if self._gone():
                    return await self._dropped(st)
                raise _SourceFailed(
                    f"reading {self.source.name} at FSN {fsn} failed: {exc!r}"
                ) from exc
            if isinstance(frames, Gap):
                return await self._skip_gap(st, fsn, frames.next_fsn)
            for payload in frames:
                if self.terminal is not None:
                    return Outcome.HALT  # a halted loop sends nothing more (FSN-7)
                wire_seq = st.sent()
                sent_fsn = st.fsn_sent(wire_seq)
                if sent_fsn <= self.replay_target:
                    self.counters.total_frames_replayed += 1
                self.counters.frames_sent += 1
                self._trace("send", fsn=sent_fsn, wire_seq=wire_seq)
                self._last_send = time.monotonic()
                await ws.send(payload)
                if mirror is not None:
                    mirror.accumulate(payload)  # the next connection re-registers it too

    def _gone(self) -> bool:
        """The source's topic was dropped (FWD-35); a call, so no check narrows it for good."""
        return self.source.dropped is not None

    async def _dropped(self, st: ConnState) -> Outcome:
        """FWD-35: the topic was dropped. Nothing more is sent; what was sent gets up to
        ``close_flush_timeout_millis`` to be acknowledged (it exists nowhere else now), then
        the loop halts with a terminal error of code ``no_such_topic``."""
        sent = st.next_fsn() - 1
        timeout_ms = self.conf.close_flush_timeout_millis
        if timeout_ms > 0:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._acked_up_to(sent), timeout_ms / 1000.0)
        self._latch_dropped()
        return Outcome.HALT

    async def _acked_up_to(self, fsn: int) -> None:
        while self.acked < fsn:
            self._ack_event.clear()
            if self.acked < fsn:
                await self._ack_event.wait()

    async def _skip_gap(self, st: ConnState, fsn: int, next_fsn: int) -> Outcome:
        """FSNs ``fsn .. next_fsn - 1`` will never exist (a topic hole). Once everything sent is
        acknowledged the trim point jumps over them and a fresh connection starts the next
        window at ``next_fsn`` (FWD-22): ``fsn = fsnAtZero + wireSeq`` stays exact."""
        await self._acked_up_to(fsn - 1)
        self._advance(next_fsn - 1)
        self._trace("gap", next_fsn=next_fsn, acked=self.acked)
        return Outcome.WINDOW

    async def _recv_pump(self, ws: ClientConnection, st: ConnState) -> Outcome:
        """Map every response back to FSNs (FWD-6, FWD-7, FWD-9, FSN-2, FSN-4, FSN-7)."""
        overrides = self.conf.policy_overrides
        while True:
            data = await ws.recv()
            if isinstance(data, str):
                log.warning("server sent a text frame; reconnecting")
                return Outcome.RECONNECT
            try:
                resp = wire.decode(data)
            except wire.WireError as exc:
                log.warning("undecodable response frame (%s); reconnecting", exc)
                return Outcome.RECONNECT
            if isinstance(resp, wire.Ok):
                target = st.on_ok(resp.sequence, resp.tables)
                event: tuple[str, dict[str, Any]] = (
                    "ok",
                    {"sequence": resp.sequence, "tables": dict(resp.tables)},
                )
            elif isinstance(resp, wire.DurableAck):
                target = st.on_durable_ack(resp.tables)
                event = ("durable", {"tables": dict(resp.tables)})
            else:
                self.counters.total_server_errors += 1
                category = status_category(resp.status)
                policy = effective_policy(category, overrides)
                fsn = st.fsn_for(resp.sequence)
                lo = fsn if fsn is not None else self.acked + 1
                error = SenderError(
                    category=category,
                    policy=policy,
                    status=resp.status,
                    sequence=resp.sequence,
                    first_fsn=lo,
                    last_fsn=fsn if fsn is not None else lo - 1,
                    message=resp.message,
                    client_id=self.conf.client_id,
                )
                event = ("error", {"status": resp.status, "sequence": resp.sequence})
                if policy == "HALT":
                    self._trace(event[0], **event[1], acked=self.acked)
                    self._latch(error)
                    return Outcome.HALT
                log.warning("server rejected a frame, dropping it: %s", error)
                self.inbox.offer(error)
                target = st.on_drop(resp.sequence)
            if target is not None:
                self._advance(target)
            self._trace(event[0], **event[1], acked=self.acked)

    async def _keepalive_pump(self, ws: ClientConnection, st: ConnState) -> Outcome:
        """WebSocket PINGs while durable confirmations are pending (FWD-8)."""
        interval = self.conf.durable_ack_keepalive_interval_millis / 1000.0
        last = time.monotonic()
        pings = 0
        while True:
            since = time.monotonic() - max(last, self._last_send)
            await asyncio.sleep(max(interval - since, interval / 10))
            if st.pending and time.monotonic() - max(last, self._last_send) >= interval:
                # A fresh payload each time: websockets refuses a second ping whose payload
                # equals one still awaiting its pong (FWD-8: any small payload will do).
                pings += 1
                await ws.ping(pings.to_bytes(4, "little"))
                self.counters.keepalive_pings += 1
                last = time.monotonic()

    # -- introspection -------------------------------------------------------------------------
    def backpressure_message(self, cap: int, deadline_ms: int) -> str:
        """The two distinct messages of FWD-14."""
        if not self.connected:
            began = self.outage_since if self.outage_since is not None else time.time()
            since = datetime.fromtimestamp(began, UTC).isoformat(timespec="seconds")
            return (
                f"backpressure while reconnecting: the buffer is full (cap {cap} bytes) and "
                f"did not drain within {deadline_ms} ms; reconnect attempt "
                f"{self.outage_attempts}, outage started at {since}"
            )
        return (
            f"backpressure while wire is publishing: the buffer is full (cap {cap} bytes) and "
            f"the server did not acknowledge fast enough to free space within {deadline_ms} ms"
        )
