"""The forwarder and the receiver rule by rule (spec/FORWARD.md FWD-1..FWD-24; SPEC
FSN-1..FSN-9). Real sockets on 127.0.0.1; backoff, clock and jitter injected, so nothing
waits for real backoff; waits are events with generous timeouts.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import os
import random
import threading
import time
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from websockets.asyncio.server import ServerConnection, serve

import tidelog
from tidelog.backends.sf.recovery import FAILED_FILE
from tidelog.backends.sf.slot import Slot
from tidelog.clock import FakeClock
from tidelog.errors import Backpressure, BadOption, NotAvailable
from tidelog.forward import (
    ErrorInbox,
    Forwarder,
    Receiver,
    SenderError,
    SenderFailed,
    parse_conf,
    wire,
)
from tidelog.forward.ackstate import ConnState
from tidelog.forward.dedup import forwarded
from tidelog.forward.errors import default_error_handler
from tidelog.forward.orphans import LAST_ERROR_FILE, orphan_candidates
from tidelog.fsio import Handle, OsFS
from tidelog.model.fsn import ForwarderModel, backoff_sleep

WAIT = 30.0


# ---------------------------------------------------------------------------------------------
# helpers
# ---------------------------------------------------------------------------------------------
def store_uri(path: Path, **options: object) -> str:
    """A file:// store with a small WAL file (the 64 MiB default is preallocated: dozens of
    receivers would fill a CI disk)."""
    query = "&".join(f"{k}={v}" for k, v in {"wal_file_bytes": "1MiB", **options}.items())
    return f"file://{path}?{query}"


def conf(port: int, **keys: object) -> str:
    base: dict[str, object] = {
        "addr": f"127.0.0.1:{port}",
        "reconnect_initial_backoff_millis": 1,
        "reconnect_max_backoff_millis": 10,
        "close_flush_timeout_millis": 0,
    }
    base.update(keys)
    return "ws::" + "".join(f"{k}={v};" for k, v in base.items())


@pytest.fixture
def rx(tmp_path: Path) -> Iterator[Receiver]:
    receiver = Receiver.open(store_uri(tmp_path / "rx"), "events", flush_interval_ms=5).start()
    yield receiver
    receiver.stop()


def stored(receiver_uri: str, client: str | None = None) -> list[tuple[str, int, bytes]]:
    with tidelog.open(receiver_uri) as store:
        return [
            (c, f, r.payload)
            for c, f, r in forwarded(store.topic("events", create=False))
            if client is None or c == client
        ]


class Scripted:
    """A WebSocket server whose connection handler the test writes (status, frames, closes)."""

    def __init__(
        self,
        handler: Callable[[ServerConnection], Awaitable[None]],
        process_request: Callable[..., Any] | None = None,
        process_response: Callable[..., Any] | None = None,
    ) -> None:
        self.handler = handler
        self.process_request = process_request
        self.process_response = process_response
        self.port = 0
        self.upgrades = 0
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> Scripted:
        self._thread.start()
        self._ready.wait()
        return self

    def __exit__(self, *exc: object) -> None:
        self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(WAIT)

    def _run(self) -> None:
        with asyncio.Runner(loop_factory=lambda: self._loop) as runner:
            runner.run(self._main())

    async def _main(self) -> None:
        self._stop = asyncio.Event()

        def count(conn: ServerConnection, request: Any) -> Any:
            self.upgrades += 1
            return self.process_request(conn, request) if self.process_request else None

        server = await serve(
            self.handler,
            "127.0.0.1",
            0,
            process_request=count,
            process_response=self.process_response,
            compression=None,
            ping_interval=None,
        )
        self.port = server.sockets[0].getsockname()[1]
        self._ready.set()
        await self._stop.wait()
        server.close()
        await server.wait_closed()


class FakeTime:
    """An injected clock and sleep: a backoff sleep advances the clock, instantly."""

    def __init__(self) -> None:
        self.clock = FakeClock(0)
        self.sleeps: list[float] = []

    async def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.clock.advance(round(seconds * 1000))


# ---------------------------------------------------------------------------------------------
# FWD-1: connect strings
# ---------------------------------------------------------------------------------------------
EVERY_SEED_KEY = (
    "ws::addr=db1:9000,db2;sf_dir=/tmp/x;sender_id=edge;sf_max_bytes=1M;sf_max_total_bytes=64M;"
    "sf_durability=flush;sf_append_deadline_millis=5;drain_orphans=on;max_background_drainers=2;"
    "reconnect_max_duration_millis=1000;reconnect_initial_backoff_millis=10;"
    "reconnect_max_backoff_millis=100;initial_connect_retry=sync;close_flush_timeout_millis=-1;"
    "request_durable_ack=true;durable_ack_keepalive_interval_millis=0;error_inbox_capacity=16;"
    "on_server_error=drop_and_continue;on_schema_error=halt;on_parse_error=halt;"
    "on_internal_error=halt;on_security_error=halt;on_write_error=drop;username=u;password=p;;w;"
    "tls_verify=unsafe_off;tls_roots=/ca.pem;tls_roots_password=x;auto_flush=off;"
    "auto_flush_rows=off;auto_flush_bytes=1000;auto_flush_interval=off;init_buf_size=64K;"
    "max_buf_size=100M;max_name_len=127;max_schemas_per_connection=10;"
    "tidelog_path=/api/v4/write;tidelog_client_id=edge-a;tidelog_connect_timeout_millis=500;"
    "tidelog_max_batch_frames=8;"
)


def test_FWD_1_every_seed_key_parses() -> None:
    """FWD-1: every key FWD-1 lists is accepted and typed; ';;' is a literal ';'; aliases."""
    c = parse_conf(EVERY_SEED_KEY)
    assert c.addr == (("db1", 9000), ("db2", 9000))
    assert (c.sf_dir, c.sender_id, c.sf_max_bytes, c.sf_max_total_bytes) == (
        "/tmp/x", "edge", 1 << 20, 64 << 20,
    )  # fmt: skip
    assert c.initial_connect_retry == "on" and c.close_flush_timeout_millis == -1
    assert c.request_durable_ack and c.password == "p;w" and not c.tls_verify
    assert c.auto_flush_rows is None and c.auto_flush_bytes == 1000
    assert c.client_id == "edge-a" and c.tidelog_path == "/api/v4/write"
    # on_server_error covers every server category; a category's own key wins (FWD-9).
    assert c.policy_overrides == {
        "SCHEMA_MISMATCH": "HALT",
        "PARSE_ERROR": "HALT",
        "INTERNAL_ERROR": "HALT",
        "SECURITY_ERROR": "HALT",
        "WRITE_ERROR": "DROP_AND_CONTINUE",
    }
    assert parse_conf("ws::addr=h;initial_connect_retry=false;").initial_connect_retry == "off"
    assert parse_conf("ws::addr=h;initial_connect_retry=true").initial_connect_retry == "on"
    assert parse_conf("wss::addr=[::1]:9009;").addr == (("::1", 9009),)
    assert parse_conf("ws::addr=h;").sf_max_total_bytes == 128 << 20  # memory mode default
    assert parse_conf("ws::addr=h;sf_dir=/x;").sf_max_total_bytes == 10 << 30


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ("ws::addr=h;no_such_key=1;", "unknown connect-string key 'no_such_key'"),
        ("ws::addr=h;addr=i;", "given twice"),
        ("http::addr=h;", "WebSocket only"),
        ("tcp::addr=h;request_durable_ack=on;", "WebSocket only"),
        ("ws::sender_id=a;", "addr is required"),
        ("ws::addr=h;sender_id=a/b;", "path separators"),
        ("ws::addr=h;sender_id=;", "non-empty"),
        ("ws::addr=h;sf_durability=sometimes;", "sf_durability"),
        ("ws::addr=h;error_inbox_capacity=15;", "at least 16"),
        ("ws::addr=h;on_write_error=retry;", "halt or drop_and_continue"),
        ("ws::addr=h;initial_connect_retry=maybe;", "initial_connect_retry"),
        ("ws::addr=h;close_flush_timeout_millis=-2;", "-1, 0 or a positive"),
        ("ws::addr=h;username=u;", "go together"),
        ("ws::addr=h;drain_orphans=on;", "needs sf_dir"),
        ("ws::addr=h:99999;", "at most 65535"),
        (
            "ws::addr=h;reconnect_initial_backoff_millis=50;reconnect_max_backoff_millis=5;",
            "exceeds",
        ),
        ("ws::addr=h;sf_max_bytes=1M;sf_max_total_bytes=1M;", "twice"),
        ("ws::addr=h;tidelog_path=write;", "URL path"),
        ("ws::addr=h;garbage", "not key=value"),
        ("addr=h;", "expected ws::"),
    ],
)
def test_FWD_1_connect_string_rejections(text: str, match: str) -> None:
    """FWD-1: unknown keys, repeats, bad values and non-WebSocket schemas are BadOption."""
    with pytest.raises(BadOption, match=match):
        parse_conf(text)


# ---------------------------------------------------------------------------------------------
# FWD-5..FWD-7, FWD-9: response frames and the per-connection bookkeeping
# ---------------------------------------------------------------------------------------------
def test_FWD_6_FWD_7_FWD_9_response_frames_golden() -> None:
    """FWD-6 (OK §9.1), FWD-7 (durable ack §10.1), FWD-9 (error §14.1): byte layouts."""
    ok = wire.encode_ok(7, {"t": 5})
    assert ok == bytes.fromhex("00070000000000000001000100740500000000000000")
    assert wire.decode(ok) == wire.Ok(7, {"t": 5})
    assert wire.decode(bytes.fromhex("0003000000000000000000")) == wire.Ok(3, {})
    dur = wire.encode_durable_ack({"ab": 9})
    assert dur == bytes.fromhex("020100020061620900000000000000")
    assert wire.decode(dur) == wire.DurableAck({"ab": 9})
    err = wire.encode_error(0x09, 4, "no")
    assert err == bytes.fromhex("09040000000000000002006e6f")
    assert wire.decode(err) == wire.ErrorFrame(9, 4, "no")
    assert len(wire.decode(wire.encode_error(3, 0, "é" * 600)).message.encode()) <= 1024
    for bad in (b"", b"\x00\x01", b"\x02\x01\x00", b"\x05" + bytes(8) + b"\x09\x00ab"):
        with pytest.raises(wire.WireError):
            wire.decode(bad)
    with pytest.raises(ValueError):
        wire.encode_error(0x02, 0, "durable is not an error")


events = st.lists(
    st.one_of(
        st.tuples(st.just("send"), st.integers(1, 3)),
        # sequence -1: an OK or error for no frame sent (the conformance forward level sends it)
        st.tuples(st.just("ok"), st.integers(-1, 12), st.integers(0, 20)),
        st.tuples(st.just("durable"), st.integers(0, 25)),
        st.tuples(st.just("drop"), st.integers(-1, 12)),
    ),
    max_size=40,
)


@settings(max_examples=200, deadline=None)
@given(durable=st.booleans(), start=st.integers(0, 5), script=events)
def test_FWD_6_FWD_7_connstate_matches_the_model(durable: bool, start: int, script: list) -> None:
    """FWD-6, FWD-7, FWD-9 (FSN-2, FSN-4, FSN-7): ConnState acknowledges exactly what
    ForwarderModel does, for any interleaving of sends, OKs, durable acks and drops."""
    model = ForwarderModel()
    model.publish(start + 50)
    model.acked_fsn = start - 1
    model.connect(durable=durable)
    state = ConnState(start, durable)
    acked = start - 1
    for event in script:
        if event[0] == "send":
            for _ in range(event[1]):
                if model.next_frame() is not None:
                    state.sent()
            continue
        if event[0] == "ok":
            model.on_ok(event[1], {"t": event[2]})
            target = state.on_ok(event[1], {"t": event[2]})
        elif event[0] == "durable":
            model.on_durable_ack({"t": event[1]})
            target = state.on_durable_ack({"t": event[1]})
        else:
            model.on_error(3, event[1])  # SCHEMA_MISMATCH: DROP_AND_CONTINUE by default
            target = state.on_drop(event[1])
        if target is not None:
            acked = max(acked, target)
        assert acked == model.acked_fsn


def test_FSN_2_FSN_4_an_ok_for_sequence_minus_one_holds_back_a_later_drop() -> None:
    """Found by the conformance forward level (CI seed 2518058969): in durable mode an OK of
    sequence -1 carrying tables is an entry of the queue, as the model has it, so a later
    dropped frame (trivially covered) cannot drain past it; ConnState took every sequence
    below its catch-up count (0 here) for a catch-up message and ignored it, acking FSN 0."""
    model = ForwarderModel()
    model.publish(1)
    model.connect(durable=True)
    state = ConnState(0, True)
    assert model.next_frame() == 0
    state.sent()
    model.on_ok(-1, {"a": 0})
    assert state.on_ok(-1, {"a": 0}) is None
    model.on_error(3, 0)
    assert state.on_drop(0) is None and model.acked_fsn == -1
    model.on_durable_ack({"a": 0})
    assert state.on_durable_ack({"a": 0}) == 0 == model.acked_fsn


# ---------------------------------------------------------------------------------------------
# FWD-10: the error inbox
# ---------------------------------------------------------------------------------------------
def _err(i: int, policy: str = "DROP_AND_CONTINUE") -> SenderError:
    return SenderError("WRITE_ERROR", policy, 9, i, i, i, f"error {i}")


def test_FWD_10_inbox_drops_oldest_and_counts() -> None:
    """FWD-10: a bounded queue; overflow drops the oldest and counts it; a raising handler
    does not stop delivery."""
    gate = threading.Event()
    seen: list[int] = []

    def handler(e: SenderError) -> None:
        gate.wait(WAIT)
        seen.append(e.sequence)
        if e.sequence == 5:
            raise RuntimeError("a broken handler")

    inbox = ErrorInbox(16, handler)
    for i in range(40):
        inbox.offer(_err(i))
    gate.set()
    assert inbox.drain(WAIT)
    assert inbox.dropped == 40 - 16 - 1 or inbox.dropped == 40 - 16  # one may be in flight
    assert seen[-1] == 39 and seen == sorted(seen)
    assert inbox.delivered == len(seen) == 40 - inbox.dropped
    inbox.close()


def test_FWD_10_default_handler_is_never_silent(caplog: pytest.LogCaptureFixture) -> None:
    """FWD-10: the default handler logs ERROR for HALT and WARNING for DROP_AND_CONTINUE."""
    with caplog.at_level(logging.WARNING, logger="tidelog.forward"):
        default_error_handler(_err(1, "HALT"))
        default_error_handler(_err(2))
    levels = [r.levelno for r in caplog.records]
    assert levels == [logging.ERROR, logging.WARNING]
    assert "error 1" in caplog.records[0].getMessage()


# ---------------------------------------------------------------------------------------------
# FWD-2, FWD-5, FWD-18..FWD-20: end to end against the receiver
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("durable", ["off", "on"])
def test_FWD_5_FWD_18_slot_drains_in_order(rx: Receiver, tmp_path: Path, durable: str) -> None:
    """FWD-5, FWD-18, FWD-2: one frame per message, in FSN order; acknowledged frames are
    trimmed from the slot; the receiver stores each once under the sender's client id."""
    c = conf(rx.port, sf_dir=tmp_path / "sf", sender_id="edge", request_durable_ack=durable,
             sf_max_bytes="1K")  # fmt: skip
    with Forwarder(c) as fwd:
        for i in range(300):
            assert fwd.append(b"m%d" % i) == i
        assert fwd.wait_acked(timeout=WAIT)
        assert fwd.counters()["frames_sent"] == 300
        slot = fwd.source.slot  # type: ignore[attr-defined]
    assert slot.closed
    rx.stop()
    got = stored(store_uri(tmp_path / "rx"))
    assert got == [("edge", i, b"m%d" % i) for i in range(300)]
    with Slot.open(str(tmp_path / "sf"), "edge", max_bytes=1024) as s:
        assert s.acked_fsn == 299 and len(s.segment_names()) == 1  # trimmed, active kept


def test_FWD_18_receiver_answers_ok_then_durable(rx: Receiver) -> None:
    """FWD-18: a cumulative OK after the append, with the pseudo-table named after the topic and
    the record's seq; a durable ack once flushed; X-QWP-Durable-Ack echoed only when requested;
    unknown paths are 404."""
    from websockets.asyncio.client import connect
    from websockets.exceptions import InvalidStatus

    async def go() -> None:
        headers = {wire.H_CLIENT_ID: "raw", wire.H_FSN_AT_ZERO: "0",
                   wire.H_REQUEST_DURABLE_ACK: "true"}  # fmt: skip
        async with connect(f"ws://127.0.0.1:{rx.port}/write/v4", additional_headers=headers,
                           proxy=None) as ws:  # fmt: skip
            assert ws.response.headers[wire.H_DURABLE_ACK] == "enabled"
            assert ws.response.headers[wire.H_LAST_FSN] == "-1"
            await ws.send(b"one")
            await ws.send(b"two")
            # OKs are cumulative: one per batch of frames, for its last wire sequence.
            oks: list[wire.Ok] = []
            durable: list[wire.DurableAck] = []
            while not durable or not oks or oks[-1].sequence < 1:
                resp = wire.decode(await asyncio.wait_for(ws.recv(), WAIT))
                if isinstance(resp, wire.Ok):
                    oks.append(resp)
                elif isinstance(resp, wire.DurableAck):
                    durable.append(resp)
            assert [o.sequence for o in oks] in ([0, 1], [1])
            assert oks[-1] == wire.Ok(1, {"events": 2})
            assert oks[0].tables == {"events": oks[0].sequence + 1}
            assert durable[-1].tables["events"] >= 1
        async with connect(f"ws://127.0.0.1:{rx.port}/api/v4/write", proxy=None) as ws:
            assert wire.H_DURABLE_ACK not in ws.response.headers
        with pytest.raises(InvalidStatus) as exc:
            await connect(f"ws://127.0.0.1:{rx.port}/nope", proxy=None)
        assert exc.value.response.status_code == 404

    asyncio.run(go())


def test_FWD_18_durable_ack_only_after_the_flush(tmp_path: Path) -> None:
    """FWD-18: OKs come after the append, but no durable ack covers a frame before
    ``Store.flush()`` returned: with the flush held, none arrives at all (a sentinel frame's OK
    proves everything the receiver sent for earlier frames arrived); released, one does."""
    from websockets.asyncio.client import connect

    store = tidelog.open(store_uri(tmp_path / "rx"))
    gate = threading.Event()
    real_flush = store.flush

    def held_flush() -> None:
        gate.wait(WAIT)
        real_flush()

    store.flush = held_flush  # type: ignore[method-assign]
    r = Receiver(store, "events", flush_interval_ms=1, owns_store=True).start()

    async def go() -> list[wire.Response]:
        headers = {wire.H_CLIENT_ID: "c", wire.H_FSN_AT_ZERO: "0",
                   wire.H_REQUEST_DURABLE_ACK: "true"}  # fmt: skip
        got: list[wire.Response] = []

        async def until(pred: Callable[[wire.Response], bool]) -> None:
            while not got or not pred(got[-1]):
                got.append(wire.decode(await asyncio.wait_for(ws.recv(), WAIT)))

        async with connect(f"ws://127.0.0.1:{r.port}/write/v4", additional_headers=headers,
                           proxy=None) as ws:  # fmt: skip
            for i in range(20):
                await ws.send(b"f%d" % i)
            await until(lambda m: isinstance(m, wire.Ok) and m.sequence == 19)
            await ws.send(b"sentinel")
            await until(lambda m: isinstance(m, wire.Ok) and m.sequence == 20)
            assert not [m for m in got if isinstance(m, wire.DurableAck)], got
            gate.set()
            await until(lambda m: isinstance(m, wire.DurableAck) and m.tables["events"] >= 21)
        return got

    try:
        got = asyncio.run(go())
    finally:
        gate.set()
        r.stop()
    assert isinstance(got[-1], wire.DurableAck)


def test_FWD_19_receiver_deduplicates_across_restarts(tmp_path: Path) -> None:
    """FWD-19: replays are acknowledged, not stored again -- within a connection, across
    connections, across a clean receiver restart, and after a restart whose checkpoint is
    stale (the topic's producer marks, TOP-11, are the authority)."""
    from websockets.asyncio.client import connect

    uri = store_uri(tmp_path / "rx")

    async def send(port: int, fsn0: int, frames: list[bytes]) -> list[wire.Response]:
        headers = {wire.H_CLIENT_ID: "c", wire.H_FSN_AT_ZERO: str(fsn0)}
        async with connect(f"ws://127.0.0.1:{port}/write/v4", additional_headers=headers,
                           proxy=None) as ws:  # fmt: skip
            for f in frames:
                await ws.send(f)
            got: list[wire.Response] = []
            while (
                not got
                or not isinstance(got[-1], wire.Ok | wire.ErrorFrame)
                or (isinstance(got[-1], wire.Ok) and got[-1].sequence < len(frames) - 1)
            ):
                got.append(wire.decode(await asyncio.wait_for(ws.recv(), WAIT)))
            return got

    r = Receiver.open(uri, "events").start()
    asyncio.run(send(r.port, 0, [b"0", b"1", b"2"]))
    asyncio.run(send(r.port, 1, [b"1", b"2", b"3"]))  # overlaps 1..2
    r.stop()
    r = Receiver.open(uri, "events").start()  # checkpoint + scan
    assert r.dedup.mark("c") == 3
    asyncio.run(send(r.port, 2, [b"2", b"3", b"4"]))
    r.stop(abort=True)  # no final checkpoint
    with tidelog.open(uri) as store:  # make the checkpoint say less than the data holds
        store.topic("events.fwd-index").append(b'{"through_seq": 99, "clients": {"c": 0}}')
    r = Receiver.open(uri, "events").start()
    assert r.dedup.mark("c") == 0  # only a lower bound now
    oks = asyncio.run(send(r.port, 0, [b"0", b"1", b"2", b"3", b"4", b"5"]))
    assert all(isinstance(o, wire.Ok) for o in oks) and r.stats["stored"] == 1
    assert oks[-1].sequence == 5  # type: ignore[union-attr]
    r.stop()
    assert [(f, p) for _, f, p in stored(uri)] == [(i, str(i).encode()) for i in range(6)]


def test_FWD_20_client_id_and_FWD_23_receiver_ahead(rx: Receiver, tmp_path: Path) -> None:
    """FWD-20: the receiver de-duplicates by X-QWP-Client-Id (sender_id, or tidelog_client_id).
    FWD-23: a sender whose FSNs went backwards (a wiped slot under the same id) is stopped
    loudly at connect instead of having its new frames discarded as replays."""
    c = conf(rx.port, sf_dir=tmp_path / "sf", sender_id="a", tidelog_client_id="shared")
    with Forwarder(c) as fwd:
        for _i in range(5):
            fwd.append(b"x")
        assert fwd.wait_acked(timeout=WAIT)
    wiped = conf(rx.port, sf_dir=tmp_path / "sf2", sender_id="b", tidelog_client_id="shared")
    with pytest.raises(SenderFailed, match="FSN numbering went backwards"):
        Forwarder(wiped)
    assert rx.dedup.mark("shared") == 4


def test_FWD_21_rejected_frame_is_never_passed(tmp_path: Path) -> None:
    """FWD-21, FWD-9: a frame the receiver cannot store gets WRITE_ERROR (dropped by default)
    and the connection closes with 1011, so the receiver's mark never passes a frame it does
    not hold; the sender reconnects and delivers the rest."""
    uri = store_uri(tmp_path / "rx", max_record_bytes=64)
    r = Receiver.open(uri, "events").start()
    errors: list[SenderError] = []
    c = conf(r.port, sf_dir=tmp_path / "sf", sender_id="s")
    with Forwarder(c, error_handler=errors.append) as fwd:
        for payload in (b"a", b"b" * 100, b"c", b"d"):
            fwd.append(payload)
        assert fwd.wait_acked(timeout=WAIT)
        assert fwd.counters()["total_server_errors"] == 1
        assert fwd.counters()["connections"] >= 2
    r.stop()
    assert [e.category for e in errors] == ["WRITE_ERROR"] and errors[0].first_fsn == 1
    assert [(f, p) for _, f, p in stored(store_uri(tmp_path / "rx"))] == [
        (0, b"a"), (2, b"c"), (3, b"d"),
    ]  # fmt: skip


# ---------------------------------------------------------------------------------------------
# FWD-3, FWD-4, FWD-11..FWD-13: handshake, close codes, reconnect
# ---------------------------------------------------------------------------------------------
def test_FWD_4_durable_ack_must_be_confirmed(tmp_path: Path) -> None:
    """FWD-4: request_durable_ack=on against a server that does not echo
    X-QWP-Durable-Ack: enabled fails loudly instead of buffering for acks that never come."""
    r = Receiver.open(store_uri(tmp_path / "rx"), "events", durable_ack=False).start()
    try:
        with pytest.raises(SenderFailed, match="did not answer X-QWP-Durable-Ack"):
            Forwarder(conf(r.port, request_durable_ack="on", initial_connect_retry="on"))
    finally:
        r.stop()


def test_FWD_3_auth_failure_is_terminal_at_once() -> None:
    """FWD-3: HTTP 401/403 on the upgrade is SECURITY_ERROR, never retried (not even with
    initial_connect_retry=on); other statuses (503) are transient and retried."""

    async def never(ws: ServerConnection) -> None:
        await ws.wait_closed()

    statuses = iter([503, 503, 401])

    def reject(conn: ServerConnection, request: Any) -> Any:
        return conn.respond(next(statuses), "no\n")

    with Scripted(never, process_request=reject) as srv:
        fake = FakeTime()
        with pytest.raises(SenderFailed, match=r"SECURITY_ERROR.*HTTP 401"):
            Forwarder(conf(srv.port, initial_connect_retry="on", token="t"), sleep=fake.sleep,
                      clock=fake.clock)  # fmt: skip
        assert srv.upgrades == 3 and len(fake.sleeps) == 2


def test_FWD_3_version_outside_range_is_transient(tmp_path: Path) -> None:
    """FWD-3: an upgrade answering an X-QWP-Version other than 1 is a
    per-endpoint mismatch: transient (retried under initial_connect_retry=on, terminal at the
    first connect under off); an absent header means version 1."""
    versions = iter(["2", "2", None])

    async def ack(ws: ServerConnection) -> None:
        seq = 0
        async for _ in ws:
            await ws.send(wire.encode_ok(seq))
            seq += 1

    def answer(conn: ServerConnection, request: Any, response: Any) -> Any:
        version = next(versions, None)
        if version is not None:
            response.headers[wire.H_VERSION] = version
        return None

    with Scripted(ack, process_response=answer) as srv:
        with pytest.raises(SenderFailed, match=r"X-QWP-Version: '2'"):
            Forwarder(conf(srv.port))
        fake = FakeTime()
        with Forwarder(conf(srv.port, initial_connect_retry="on"), sleep=fake.sleep,
                       clock=fake.clock) as fwd:  # fmt: skip
            fwd.append(b"v1")
            assert fwd.wait_acked(timeout=WAIT)
        assert srv.upgrades == 3 and len(fake.sleeps) == 1


@pytest.mark.parametrize(("code", "terminal"), [(1008, True), (1002, True), (1011, False)])
def test_FWD_11_close_codes(tmp_path: Path, code: int, terminal: bool) -> None:
    """FWD-11 (FSN-8): 1002/1003/1007/1008/1009/1010 halt as PROTOCOL_VIOLATION with
    "ws-close[code]: reason"; any other code reconnects."""
    connections = 0

    async def handler(ws: ServerConnection) -> None:
        nonlocal connections
        connections += 1
        seq = 0
        async for _ in ws:
            if connections == 1:
                await ws.close(code, "go away")
                return
            await ws.send(wire.encode_ok(seq))
            seq += 1

    with Scripted(handler) as srv:
        fwd = Forwarder(conf(srv.port, sf_dir=tmp_path / "sf"))
        fwd.append(b"x")
        if terminal:
            fwd.wait_acked(timeout=WAIT)
            error = fwd.last_terminal_error
            assert error is not None and error.category == "PROTOCOL_VIOLATION"
            assert error.message == f"ws-close[{code}]: go away" and error.status == -1
            with pytest.raises(SenderFailed):
                fwd.close()  # the safety net (FWD-15)
        else:
            assert fwd.wait_acked(timeout=WAIT) and connections == 2
            fwd.close()


def test_FWD_12_backoff_is_equal_jitter_within_the_outage_budget() -> None:
    """FWD-12 (FSN-9): sleeps are the model's equal-jitter draws, clamped to the remaining
    budget; a spent budget is terminal PROTOCOL_VIOLATION."""
    fake = FakeTime()
    port = _closed_port()
    c = conf(port, initial_connect_retry="on", reconnect_initial_backoff_millis=100,
             reconnect_max_backoff_millis=1000, reconnect_max_duration_millis=3000)  # fmt: skip
    with pytest.raises(SenderFailed, match="reconnect budget of 3000 ms exhausted"):
        Forwarder(c, sleep=fake.sleep, clock=fake.clock, rng=random.Random(42))
    rng = random.Random(42)
    expected: list[float] = []
    spent = 0
    attempt = 0
    while True:
        ms = backoff_sleep(attempt, 100, 1000, 3000 - spent, rng.random())
        if ms is None:
            break
        expected.append(ms / 1000)
        spent += ms
        attempt += 1
    assert fake.sleeps == expected and sum(fake.sleeps) == 3.0  # the last one is clamped


def _closed_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_FWD_13_initial_connect_retry_modes(tmp_path: Path) -> None:
    """FWD-13: off fails at once; on blocks until the server answers; async returns at once
    and buffers (the slot) until it connects."""
    port = _closed_port()
    with pytest.raises(SenderFailed, match="initial_connect_retry=off"):
        Forwarder(conf(port))
    started: list[Receiver] = []
    fake = FakeTime()

    async def start_on_third(seconds: float) -> None:
        await fake.sleep(seconds)
        if len(fake.sleeps) == 2:
            started.append(Receiver.open(store_uri(tmp_path / "rx"), "events", port=port).start())

    with Forwarder(conf(port, initial_connect_retry="on"), sleep=start_on_third,
                   clock=fake.clock) as fwd:  # fmt: skip
        assert fwd.connected or fwd.counters()["connections"] == 1
    started[0].stop()
    port2 = _closed_port()
    fwd = Forwarder(conf(port2, initial_connect_retry="async", sf_dir=tmp_path / "sf"))
    for _ in range(10):
        fwd.append(b"early")
    assert fwd.acked_fsn == -1
    r = Receiver.open(store_uri(tmp_path / "rx2"), "events", port=port2).start()
    try:
        assert fwd.wait_acked(timeout=WAIT)
        fwd.close()
    finally:
        r.stop()


# ---------------------------------------------------------------------------------------------
# FWD-8: keepalive
# ---------------------------------------------------------------------------------------------
def test_FWD_8_keepalive_pings_only_while_durable_acks_are_pending(tmp_path: Path) -> None:
    """FWD-8: PINGs while durable confirmations are pending; none in non-durable mode."""
    pings = threading.Event()

    async def handler(ws: ServerConnection) -> None:
        seq = 0
        async for _ in ws:
            await ws.send(wire.encode_ok(seq, {"t": seq + 1}))  # never a durable ack
            seq += 1

    def echo(conn: ServerConnection, request: Any, response: Any) -> Any:
        response.headers[wire.H_DURABLE_ACK] = "enabled"
        return None

    with Scripted(handler, process_response=echo) as srv:
        with Forwarder(conf(srv.port, request_durable_ack="on",
                            durable_ack_keepalive_interval_millis=5)) as fwd:  # fmt: skip
            fwd.append(b"x")
            end = time.monotonic() + WAIT
            while fwd.counters()["keepalive_pings"] < 3 and time.monotonic() < end:
                pings.wait(0.01)
            assert fwd.counters()["keepalive_pings"] >= 3 and fwd.acked_fsn == -1
        with Forwarder(conf(srv.port)) as fwd:
            fwd.append(b"y")
            assert fwd.wait_acked(timeout=WAIT)
            assert fwd.counters()["keepalive_pings"] == 0


# ---------------------------------------------------------------------------------------------
# FWD-14: backpressure
# ---------------------------------------------------------------------------------------------
def test_FWD_14_backpressure_messages(tmp_path: Path) -> None:
    """FWD-14: a full buffer waits sf_append_deadline_millis, then fails with one of two
    distinct messages: reconnecting (attempt count, outage start) or publishing."""
    port = _closed_port()
    fwd = Forwarder(conf(port, initial_connect_retry="async", sf_max_bytes=256,
                         sf_max_total_bytes=512, sf_append_deadline_millis=10))  # fmt: skip
    with pytest.raises(Backpressure, match=r"while reconnecting.*attempt \d+, outage started"):
        for _ in range(100):
            fwd.append(b"z" * 40)
    assert fwd.counters()["total_backpressure_stalls"] >= 1
    fwd.close()

    async def silent(ws: ServerConnection) -> None:
        async for _ in ws:
            pass  # never acknowledges

    with Scripted(silent) as srv:
        fwd = Forwarder(conf(srv.port, sf_dir=tmp_path / "sf", sf_max_bytes=256,
                             sf_max_total_bytes=512, sf_append_deadline_millis=10))  # fmt: skip
        with pytest.raises(Backpressure, match="while wire is publishing"):
            for _ in range(100):
                fwd.append(b"z" * 40)
        fwd.close()


# ---------------------------------------------------------------------------------------------
# FWD-15, FWD-16: close and counters
# ---------------------------------------------------------------------------------------------
def _halting_server() -> Scripted:
    async def handler(ws: ServerConnection) -> None:
        async for _ in ws:
            await ws.send(wire.encode_error(5, 0, "bad frame"))  # PARSE_ERROR: HALT

    return Scripted(handler)


def test_FWD_15_close_flush_timeout(
    rx: Receiver, tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """FWD-15: close() waits up to close_flush_timeout_millis for acks (default
    5000); when they do not come it logs a WARNING and the frames stay in the slot for the next
    sender; 0 and -1 skip the wait entirely. No error is latched, so nothing is rethrown."""
    c = conf(rx.port, sf_dir=tmp_path / "sf", close_flush_timeout_millis=5000)
    fwd = Forwarder(c)
    for _ in range(200):
        fwd.append(b"f")
    fwd.close()
    assert fwd.acked_fsn == 199

    async def silent(ws: ServerConnection) -> None:
        async for _ in ws:
            pass  # never acknowledges

    waits: list[float] = []
    real_wait = Forwarder.wait_acked

    def spy(self: Forwarder, fsn: int | None = None, timeout: float = 30.0) -> bool:
        waits.append(timeout)
        return real_wait(self, fsn, timeout)

    monkeypatch.setattr(Forwarder, "wait_acked", spy)
    with Scripted(silent) as srv:
        for timeout_ms in (50, 0, -1):
            waits.clear()
            c = conf(srv.port, sf_dir=tmp_path / "sf", close_flush_timeout_millis=timeout_ms)
            fwd = Forwarder(c)
            fwd.append(b"kept %d" % timeout_ms)
            with caplog.at_level(logging.WARNING, logger="tidelog.forward"):
                caplog.clear()
                fwd.close()  # no terminal error: nothing to rethrow
            if timeout_ms > 0:
                assert waits == [timeout_ms / 1000.0]
                assert "still unacknowledged after 50 ms" in caplog.text
            else:
                assert waits == [] and "unacknowledged" not in caplog.text
    with Slot.open(str(tmp_path / "sf"), "default") as s:  # the lock was released each time
        assert s.read(s.acked_fsn + 1) == [b"kept 50", b"kept 0", b"kept -1"]


def test_FWD_15_safety_net_and_its_two_guards(tmp_path: Path) -> None:
    """FWD-15: close() rethrows a latched terminal error nobody saw; not when append/flush
    already raised it (guard 2), not when a custom handler received an error (guard 1); the
    slot is released whether or not it throws."""
    with _halting_server() as srv:
        c = conf(srv.port, sf_dir=tmp_path / "sf")
        fwd = Forwarder(c)
        fwd.append(b"x")
        fwd.wait_acked(timeout=WAIT)
        with pytest.raises(SenderFailed, match="PARSE_ERROR"):
            fwd.close()
        Slot.open(str(tmp_path / "sf"), "default").close()  # released

        fwd = Forwarder(c)
        fwd.wait_acked(timeout=WAIT)  # replays the frame, halts again
        with pytest.raises(SenderFailed):
            fwd.append(b"y")
        fwd.close()  # guard 2: the producer saw it

        got: list[SenderError] = []
        fwd = Forwarder(c, error_handler=got.append)
        fwd.wait_acked(timeout=WAIT)
        fwd.inbox.drain(WAIT)
        fwd.close()  # guard 1: the handler owned it
        assert got and got[0].category == "PARSE_ERROR"


def test_FWD_16_counters(rx: Receiver) -> None:
    """FWD-16: the counters, under snake_case names."""
    with Forwarder(conf(rx.port)) as fwd:
        fwd.append(b"x")
        fwd.wait_acked(timeout=WAIT)
        counters = fwd.counters()
    for key in (
        "total_reconnect_attempts",
        "total_reconnects_succeeded",
        "total_frames_replayed",
        "total_server_errors",
        "dropped_error_notifications",
        "total_error_notifications_delivered",
        "total_backpressure_stalls",
        "last_terminal_error",
        "active_background_drainers",
        "total_background_drainers_succeeded",
        "total_background_drainers_failed",
    ):
        assert key in counters
    assert counters["frames_sent"] == 1 and counters["last_terminal_error"] is None


# ---------------------------------------------------------------------------------------------
# FWD-17: orphans
# ---------------------------------------------------------------------------------------------
def test_FWD_17_orphan_adoption(rx: Receiver, tmp_path: Path) -> None:
    """FWD-17: with drain_orphans=on the sender drains sibling slots with frames and no
    .failed, with the orphan's own client id; a locked slot is skipped; a slot whose recovery
    is refused gets .failed; the counters say so."""
    sf = tmp_path / "sf"
    for name, n in (("orphan1", 5), ("orphan2", 3), ("failed", 2), ("busy", 2)):
        with Slot.open(str(sf), name) as s:
            for i in range(n):
                s.append(f"{name}-{i}".encode())
    (sf / "failed" / FAILED_FILE).write_text("earlier give-up")
    (sf / "empty").mkdir()
    broken = sf / "broken"
    broken.mkdir()
    (broken / "sf-0000000000000000.sfa").write_bytes(b"not a segment at all" * 3)
    busy = Slot.open(str(sf), "busy")
    try:
        c = conf(rx.port, sf_dir=sf, sender_id="main", drain_orphans="on",
                 max_background_drainers=2)  # fmt: skip
        with Forwarder(c) as fwd:
            fwd._drainers._pool.shutdown(wait=True)
            counters = fwd.counters()
    finally:
        busy.close()
    assert counters["total_background_drainers_succeeded"] == 2
    assert counters["total_background_drainers_failed"] == 1
    assert counters["active_background_drainers"] == 0
    assert (broken / FAILED_FILE).read_text().startswith("recovery refused")
    rx.stop()
    got = stored(store_uri(tmp_path / "rx"))
    assert sorted((c, f) for c, f, _ in got) == sorted(
        [("orphan1", i) for i in range(5)] + [("orphan2", i) for i in range(3)]
    )


def test_FWD_17_drainer_pool_is_bounded(tmp_path: Path) -> None:
    """FWD-17: five orphans, max_background_drainers=2, a receiver that never
    acknowledges: exactly two drainers run (two orphan connections), the rest wait; closing the
    sender stops them without .failed, and every orphan keeps its frames."""
    sf = tmp_path / "sf"
    names = [f"orphan{i}" for i in range(5)]
    for name in names:
        with Slot.open(str(sf), name) as s:
            s.append(name.encode())
    clients: list[str] = []

    async def silent(ws: ServerConnection) -> None:
        assert ws.request is not None
        clients.append(ws.request.headers[wire.H_CLIENT_ID])
        async for _ in ws:
            pass

    with Scripted(silent) as srv:
        c = conf(srv.port, sf_dir=sf, sender_id="main", drain_orphans="on",
                 max_background_drainers=2)  # fmt: skip
        fwd = Forwarder(c)
        pool = fwd._drainers
        end = time.monotonic() + WAIT
        while len(clients) < 3 and time.monotonic() < end:  # main + two drainers
            time.sleep(0.01)
        assert "main" in clients and len(clients) == 3
        assert pool.active == 2 and pool.peak_active == 2
        fwd.close()
    assert pool.peak_active == 2 and len({c for c in clients if c != "main"}) == 2
    counters = fwd.counters()
    assert counters["total_background_drainers_failed"] == 0
    assert counters["total_background_drainers_succeeded"] == 0
    for name in names:
        assert not (sf / name / FAILED_FILE).exists()
        with Slot.open(str(sf), name) as s:  # released, frames kept
            assert s.read(0) == [name.encode()]


def test_FWD_17_FWD_31_drainer_gives_up_with_last_error_not_failed(
    rx: Receiver, tmp_path: Path
) -> None:
    """FWD-17, FWD-31: a drainer whose reconnect budget runs out writes .last_error (not
    .failed) before releasing; the slot stays a candidate, and the next drain delivers its
    frame and removes .last_error."""
    sf = tmp_path / "sf"
    with Slot.open(str(sf), "orphan") as s:
        s.append(b"stuck")
    port = _closed_port()
    fake = FakeTime()
    c = conf(port, sf_dir=sf, sender_id="main", drain_orphans="on", initial_connect_retry="async",
             reconnect_max_duration_millis=50)  # fmt: skip
    fwd = Forwarder(c, sleep=fake.sleep, clock=fake.clock)
    fwd._drainers._pool.shutdown(wait=True)
    assert fwd.counters()["total_background_drainers_failed"] == 1
    with contextlib.suppress(SenderFailed):
        fwd.close()
    assert "budget" in (sf / "orphan" / LAST_ERROR_FILE).read_text()
    assert not (sf / "orphan" / FAILED_FILE).exists()
    assert orphan_candidates(OsFS(), str(sf), "main") == ["orphan"]
    with Forwarder(conf(rx.port, sf_dir=sf, sender_id="main", drain_orphans="on")) as fwd:
        fwd._drainers._pool.shutdown(wait=True)
        assert fwd.counters()["total_background_drainers_succeeded"] == 1
    assert not (sf / "orphan" / LAST_ERROR_FILE).exists()
    rx.stop()
    assert stored(store_uri(tmp_path / "rx"), "orphan") == [("orphan", 0, b"stuck")]


class _EioOnOrphanSegments(OsFS):
    """Opening any segment of the slot ``orphan`` fails with EIO (an ``io_error`` at open)."""

    def _check(self, path: str) -> None:
        if f"{os.sep}orphan{os.sep}" in path and path.endswith(".sfa"):
            raise OSError(errno.EIO, "injected media error", path)

    def open(self, path: str, *, create: bool = True) -> Handle:
        self._check(path)
        return super().open(path, create=create)

    def open_read(self, path: str) -> Handle:
        self._check(path)
        return super().open_read(path)


def test_FWD_31_halt_and_io_error_leave_last_error_never_failed(tmp_path: Path) -> None:
    """FWD-31: neither a halt from the receiver (PARSE_ERROR, e.g. a server refusing a frame)
    nor an io_error recovering the orphan is damage the client would refuse: each writes
    .last_error with its reason, no .failed, and the slot keeps its frame."""
    sf = tmp_path / "sf"
    with Slot.open(str(sf), "orphan") as s:
        s.append(b"kept")
    with _halting_server() as srv:
        c = conf(srv.port, sf_dir=sf, sender_id="main", drain_orphans="on")
        with Forwarder(c) as fwd:
            fwd._drainers._pool.shutdown(wait=True)
            assert fwd.counters()["total_background_drainers_failed"] == 1
    assert "bad frame" in (sf / "orphan" / LAST_ERROR_FILE).read_text()
    assert not (sf / "orphan" / FAILED_FILE).exists()
    c = conf(_closed_port(), sf_dir=sf, sender_id="main", drain_orphans="on",
             initial_connect_retry="async")  # fmt: skip
    with Forwarder(c, fs=_EioOnOrphanSegments()) as fwd:
        fwd._drainers._pool.shutdown(wait=True)
        assert fwd.counters()["total_background_drainers_failed"] == 1
    reason = (sf / "orphan" / LAST_ERROR_FILE).read_text()
    assert reason.startswith("opening the slot failed") and "injected media error" in reason
    assert not (sf / "orphan" / FAILED_FILE).exists()
    with Slot.open(str(sf), "orphan") as s:
        assert s.read(0) == [b"kept"]


# ---------------------------------------------------------------------------------------------
# FWD-22: tidelog topics as the source
# ---------------------------------------------------------------------------------------------
def test_FWD_22_topic_source_with_holes(tmp_path: Path) -> None:
    """FWD-22, FWD-2: a topic drains through a durable subscriber with fsn = seq - 1;
    deleted records are holes the forwarder steps over with a fresh connection (to a receiver
    that trusts FSN jumps, FWD-26); the subscriber's commit trims what was acknowledged;
    appends go to the topic itself."""
    rx = Receiver.open(store_uri(tmp_path / "rx"), "events", trust_fsn_jumps=True).start()
    with tidelog.open(store_uri(tmp_path / "src")) as store:
        topic = store.topic("out")
        for i in range(1, 21):
            topic.append(b"r%d" % i, tag="drop" if i in (5, 6, 12) else None)
        topic.delete(tag="drop")
        topic.delete(before_seq=3)  # seqs 1, 2 gone before the forwarder ever starts
        with Forwarder.for_topic(conf(rx.port, sender_id="t"), topic) as fwd:
            with pytest.raises(NotAvailable):
                fwd.append(b"no")
            assert fwd.wait_acked(timeout=WAIT)
            topic.append(b"r21")
            assert fwd.wait_acked(20, timeout=WAIT)
            assert fwd.counters()["window_resets"] >= 2
        assert topic.subscriber("forward").hwm == 21
        assert topic.state().count == 0  # trim="acked": everything delivered is trimmed
    rx.stop()
    got = stored(store_uri(tmp_path / "rx"))
    live = [i for i in range(3, 22) if i not in (5, 6, 12)]
    assert [(f, p) for _, f, p in got] == [(i - 1, b"r%d" % i) for i in live]


def test_FWD_5_a_failing_source_halts_instead_of_reconnecting_forever(rx: Receiver) -> None:
    """FWD-5: a source that cannot be read (an unreadable segment, a store closed under the
    forwarder) is a local fault no reconnect cures: the loop halts loudly, once."""
    from tidelog.errors import StorageError
    from tidelog.forward import MemorySource

    class Unreadable(MemorySource):
        def read(self, fsn: int, max_frames: int) -> Any:
            raise StorageError(f"segment holding FSN {fsn}: Input/output error")

    source = Unreadable(1 << 20, 1 << 16, 0)
    fwd = Forwarder(conf(rx.port), source=source)
    source.append(b"x")
    fwd.wait_acked(timeout=WAIT)
    error = fwd.last_terminal_error
    assert error is not None and error.category == "PROTOCOL_VIOLATION"
    assert "reading memory at FSN 0 failed" in error.message and "Input/output" in error.message
    assert fwd.counters()["connections"] == 1
    with pytest.raises(SenderFailed):
        fwd.close()


def test_FWD_15_stop_requested_before_the_loop_first_ran_is_not_lost() -> None:
    """FWD-15 regression (a hang seen on a loaded box): close() right after an async start
    can ask the I/O loop to stop before its thread ever ran; the request must still stop it
    (it used to be dropped, leaving close() joining a loop that reconnects forever)."""
    from tidelog.forward import MemorySource
    from tidelog.forward.loop import IOLoop

    c = parse_conf(conf(_closed_port(), initial_connect_retry="async"))
    io = IOLoop(c, MemorySource(1 << 20, 1 << 16, 0), ErrorInbox(16, None))
    io._loop.call_soon_threadsafe(io._request_stop)  # what stop() does, before start()
    io.start()
    io._thread.join(WAIT)
    assert not io.running


def test_FWD_2_cli_forward_drains_a_slot_or_a_topic(rx: Receiver, tmp_path: Path) -> None:
    """FWD-2, FWD-16: ``tidelog forward CONNECT_STRING`` drains the slot (stdin lines appended
    as frames) or ``--from URI --topic NAME``, prints the counters as JSON; a forwarder that
    cannot start is a one-line ``sender_error`` (exit 2), never a traceback."""
    import json

    from click.testing import CliRunner

    from tidelog.cli import main

    runner = CliRunner()
    slot_conf = conf(rx.port, sf_dir=tmp_path / "sf", sender_id="cli")
    result = runner.invoke(main, ["forward", slot_conf, "--stdin", "--until-drained"],
                           input="a\nb\nc\n")  # fmt: skip
    assert result.exit_code == 0, result.output
    counters = json.loads(result.stdout.strip().splitlines()[-1])
    assert (counters["acked_fsn"], counters["frames_sent"]) == (2, 3)
    assert counters["last_terminal_error"] == ""
    src = store_uri(tmp_path / "src")
    with tidelog.open(src) as store:
        store.topic("out").append_many([b"x", b"y"])
    result = runner.invoke(main, ["forward", conf(rx.port, sender_id="cli-topic"), "--from", src,
                                  "--topic", "out", "--until-drained"])  # fmt: skip
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout.strip().splitlines()[-1])["acked_fsn"] == 1
    result = runner.invoke(main, ["forward", conf(_closed_port())])
    assert result.exit_code == 2 and "tidelog: error: sender_error:" in result.stderr
    assert "initial_connect_retry=off" in result.stderr and "Traceback" not in result.output
    with _halting_server() as srv:  # a halt: counters, then the one-line error
        result = runner.invoke(main, ["forward", conf(srv.port, sender_id="h"), "--stdin",
                                      "--until-drained"], input="bad\n")  # fmt: skip
    assert result.exit_code == 2 and "PARSE_ERROR" in result.stderr
    counters = json.loads(result.stdout.strip().splitlines()[-1])
    assert "PARSE_ERROR" in counters["last_terminal_error"]
    rx.stop()
    got = stored(store_uri(tmp_path / "rx"))
    assert [(c, f, p) for c, f, p in got] == [
        ("cli", 0, b"a"), ("cli", 1, b"b"), ("cli", 2, b"c"), ("cli-topic", 0, b"x"),
        ("cli-topic", 1, b"y"),
    ]  # fmt: skip


def test_FWD_2_memory_mode(rx: Receiver) -> None:
    """FWD-2: without sf_dir the frames live in RAM (memory mode) and drain the same."""
    with Forwarder(conf(rx.port, sender_id="mem")) as fwd:
        for i in range(50):
            fwd.append(b"%d" % i)
        assert fwd.wait_acked(timeout=WAIT)
        assert fwd.source.name == "memory"
