"""Client ids at the receiver (spec/FORWARD.md FWD-26, FWD-27): an FSN jump cannot take over a
sender's id, and an id has one connection at a time. Real sockets on 127.0.0.1; every receiver
is stopped by the test; waits are events or polls with generous limits, never assertions on
time."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import InvalidStatus

import tidelog
from tidelog.forward import Forwarder, Receiver, SenderError, wire
from tidelog.forward.dedup import forwarded
from tidelog.forward.errors import SenderFailed

WAIT = 30.0


def rx_uri(tmp_path: Path, **options: object) -> str:
    query = "&".join(f"{k}={v}" for k, v in {"wal_file_bytes": "1MiB", **options}.items())
    return f"file://{tmp_path / 'rx'}?{query}"


def sender(port: int, sf_dir: Path, sender_id: str) -> str:
    return (
        f"ws::addr=127.0.0.1:{port};sf_dir={sf_dir};sender_id={sender_id};"
        "reconnect_initial_backoff_millis=1;reconnect_max_backoff_millis=10;"
        "close_flush_timeout_millis=0;"
    )


@pytest.fixture
def rx(tmp_path: Path) -> Iterator[Receiver]:
    receiver = Receiver.open(rx_uri(tmp_path), "events", flush_interval_ms=5).start()
    yield receiver
    receiver.stop()


def stored(uri: str) -> list[tuple[str, int, bytes]]:
    with tidelog.open(uri) as store:
        return [(c, f, r.payload) for c, f, r in forwarded(store.topic("events", create=False))]


async def dial(port: int, client: str | None, fsn_at_zero: int | None) -> ClientConnection:
    headers = {}
    if client is not None:
        headers[wire.H_CLIENT_ID] = client
    if fsn_at_zero is not None:
        headers[wire.H_FSN_AT_ZERO] = str(fsn_at_zero)
    return await connect(
        f"ws://127.0.0.1:{port}/write/v4",
        additional_headers=headers,
        proxy=None,
        compression=None,
        ping_interval=None,
        open_timeout=WAIT,
    )


async def upgrade_status(port: int, client: str, fsn_at_zero: int) -> tuple[int, str]:
    """101 (and the connection closed again) or the refusal's status and body."""
    try:
        ws = await dial(port, client, fsn_at_zero)
    except InvalidStatus as exc:
        return exc.response.status_code, exc.response.body.decode()
    await ws.close()
    return 101, ""


async def deliver(ws: ClientConnection, frames: list[bytes]) -> wire.Response:
    """Send ``frames`` and return the response that ends them: the OK for the last one or an
    error frame."""
    for frame in frames:
        await ws.send(frame)
    while True:
        resp = wire.decode(await asyncio.wait_for(ws.recv(), WAIT))
        if isinstance(resp, wire.ErrorFrame) or (
            isinstance(resp, wire.Ok) and resp.sequence == len(frames) - 1
        ):
            return resp


def until_accepted(port: int, client: str, fsn_at_zero: int) -> tuple[int, str]:
    """Poll the upgrade until it is accepted (a refused connection's handler ends on its own
    schedule); the last answer."""
    deadline = time.monotonic() + WAIT
    status, body = asyncio.run(upgrade_status(port, client, fsn_at_zero))
    while status != 101 and time.monotonic() < deadline:
        time.sleep(0.02)
        status, body = asyncio.run(upgrade_status(port, client, fsn_at_zero))
    return status, body


# -- FWD-26 ------------------------------------------------------------------------------------
def test_FWD_26_a_huge_fsn_cannot_hijack_a_client_id(tmp_path: Path) -> None:
    """FWD-26 regression: another client claiming sender "a"'s id with a huge FSN is refused
    with 409, so "a"'s later frames are still stored and acknowledged. It used to be accepted:
    its one frame raised the mark to 10**12, every later frame of "a" was then a "replay", and
    "a" halted at its next connect (FWD-23)."""
    uri = rx_uri(tmp_path)
    rx = Receiver.open(uri, "events", flush_interval_ms=5).start()
    a = sender(rx.port, tmp_path / "sf", "a")
    try:
        with Forwarder(a) as fwd:
            for i in range(5):
                fwd.append(b"a%d" % i)
            assert fwd.wait_acked(timeout=WAIT)

        async def hijack() -> tuple[int, str]:
            try:
                ws = await dial(rx.port, "a", 10**12)
            except InvalidStatus as exc:
                return exc.response.status_code, exc.response.body.decode()
            async with ws:
                await deliver(ws, [b"not a's"])
            return 101, ""

        status, body = asyncio.run(hijack())
        assert status == 409, "the jump was accepted"
        assert "10000000000000 jumps ahead" not in body  # the body names the numbers exactly:
        assert f"{wire.H_FSN_AT_ZERO} {10**12} jumps ahead" in body
        assert "through 4" in body and "starts at 5 at most" in body and "FWD-26" in body
        assert rx.dedup.mark("a") == 4 and rx.stats["upgrades_refused"] == 1
        with Forwarder(a) as fwd:
            for i in range(5, 10):
                fwd.append(b"a%d" % i)
            assert fwd.wait_acked(timeout=WAIT)
            assert fwd.last_terminal_error is None
    finally:
        rx.stop()
    assert stored(uri) == [("a", i, b"a%d" % i) for i in range(10)]


def test_FWD_26_what_is_not_a_jump(rx: Receiver) -> None:
    """FWD-26: a connection may start right after the mark or anywhere at or below it
    (replays); the first connection of an id may start anywhere; a refusal stores nothing."""

    async def go() -> None:
        async with await dial(rx.port, "c", 0) as ws:
            assert await deliver(ws, [b"0", b"1", b"2"]) == wire.Ok(2, {"events": 3})
        for start in (0, 2, 3):  # replays and the next FSN
            assert await upgrade_status(rx.port, "c", start) == (101, "")
        status, body = await upgrade_status(rx.port, "c", 4)
        assert status == 409 and "through 2, so a connection starts at 3 at most" in body
        assert await upgrade_status(rx.port, "new", 10**9) == (101, "")  # first contact
        async with await dial(rx.port, "c", 3) as ws:
            assert isinstance(await deliver(ws, [b"3"]), wire.Ok)

    asyncio.run(go())
    assert rx.dedup.mark("c") == 3 and rx.dedup.mark("new") == -1


def test_FWD_26_trust_fsn_jumps_accepts_them(tmp_path: Path) -> None:
    """FWD-26: a receiver started with trust_fsn_jumps accepts a jump (its mark grows)."""
    uri = rx_uri(tmp_path)
    rx = Receiver.open(uri, "events", trust_fsn_jumps=True).start()

    async def go() -> None:
        async with await dial(rx.port, "c", 0) as ws:
            await deliver(ws, [b"0"])
        async with await dial(rx.port, "c", 100) as ws:
            assert isinstance(await deliver(ws, [b"100"]), wire.Ok)

    try:
        asyncio.run(go())
        assert rx.dedup.mark("c") == 100
    finally:
        rx.stop()
    assert [f for _, f, _ in stored(uri)] == [0, 100]


def test_FWD_26_a_refused_frame_may_be_skipped_also_after_a_restart(tmp_path: Path) -> None:
    """FWD-26, FWD-21, FWD-9: after an error frame for FSN r (mark r - 1) the sender may drop
    it and start at r + 1, but no further; the refused FSN is kept in the checkpoint, so this
    holds across a receiver restart. A real forwarder with the default DROP policy goes on."""
    uri = rx_uri(tmp_path, max_record_bytes=128)
    rx = Receiver.open(uri, "events", flush_interval_ms=5).start()

    async def refuse() -> wire.Response:
        async with await dial(rx.port, "c", 0) as ws:
            return await deliver(ws, [b"ok", b"x" * 200])

    try:
        got = asyncio.run(refuse())
        assert isinstance(got, wire.ErrorFrame) and got.sequence == 1 and got.status == 0x09
    finally:
        rx.stop()
    rx = Receiver.open(uri, "events").start()
    try:
        assert rx.dedup.refused == {"c": 1}
        status, body = asyncio.run(upgrade_status(rx.port, "c", 3))
        assert status == 409 and "starts at 2 at most" in body
        assert asyncio.run(upgrade_status(rx.port, "c", 2)) == (101, "")
        errors: list[SenderError] = []
        c = sender(rx.port, tmp_path / "sf", "s")
        with Forwarder(c, error_handler=errors.append) as fwd:
            for payload in (b"a", b"b" * 200, b"c"):
                fwd.append(payload)
            assert fwd.wait_acked(timeout=WAIT)
            assert fwd.last_terminal_error is None
        assert [e.category for e in errors] == ["WRITE_ERROR"]
    finally:
        rx.stop()
    assert [(c, f) for c, f, _ in stored(uri)] == [("c", 0), ("s", 0), ("s", 2)]


def test_FWD_26_a_topic_hole_needs_a_trusting_receiver(rx: Receiver, tmp_path: Path) -> None:
    """FWD-26, FWD-22: a default receiver refuses the window reset after a hole in a topic
    source (it cannot tell it from a hijack): nothing after the hole is stored, the records
    stay in the source, and the refusals are counted."""
    with tidelog.open(f"file://{tmp_path / 'src'}?wal_file_bytes=1MiB") as store:
        topic = store.topic("out")
        for i in range(1, 7):
            topic.append(b"r%d" % i, tag="drop" if i == 3 else None)
        topic.delete(tag="drop")
        conf = sender(rx.port, tmp_path / "unused", "t").replace(f"sf_dir={tmp_path}/unused;", "")
        # halted at once, with the reason: close reports it
        with pytest.raises(SenderFailed, match="FWD-26"), Forwarder.for_topic(conf, topic) as fwd:
            assert fwd.wait_acked(1, timeout=WAIT)  # r1, r2
            deadline = time.monotonic() + WAIT
            while rx.stats["upgrades_refused"] == 0 and time.monotonic() < deadline:
                time.sleep(0.01)
            assert not fwd.wait_acked(5, timeout=0.2)
        assert topic.state().count == 3  # r4..r6 kept for a later forward
    assert rx.stats["upgrades_refused"] == 1 and rx.dedup.mark("t") == 1


# -- FWD-27 ------------------------------------------------------------------------------------
def test_FWD_27_one_connection_per_client_id(rx: Receiver) -> None:
    """FWD-27 regression: while "c" is connected, a second connection for "c" is refused with
    409 and the first keeps working; once it closed, the id is free again. Anonymous
    connections are not limited. (A second connection used to be accepted.)"""

    async def go() -> None:
        first = await dial(rx.port, "c", 0)
        try:
            status, body = await upgrade_status(rx.port, "c", 0)
            assert status == 409 and "'c' is connected already" in body and "FWD-27" in body
            assert isinstance(await deliver(first, [b"0", b"1"]), wire.Ok)
            async with await dial(rx.port, "c", None), await dial(rx.port, "c", None):
                pass  # no FSN header: anonymous, any number
            async with await dial(rx.port, None, 0), await dial(rx.port, None, 0):
                pass
            assert await upgrade_status(rx.port, "d", 0) == (101, "")
        finally:
            await first.close()

    asyncio.run(go())
    assert until_accepted(rx.port, "c", 2) == (101, "")
    assert rx.dedup.mark("c") == 1


def test_FWD_27_a_peer_gone_silent_is_found_by_keepalive(tmp_path: Path) -> None:
    """FWD-27: a connection whose peer sends nothing, not even a pong (here the client stops
    reading its socket), is dropped by the receiver's keepalive once a ping found no answer
    within half the ping interval -- not before 1.5 intervals after its last byte -- and the id
    can connect again."""
    interval = 1.0
    rx = Receiver.open(rx_uri(tmp_path), "events", ping_interval=interval).start()

    async def go() -> tuple[tuple[int, str], float]:
        began = time.monotonic()
        silent = await dial(rx.port, "c", 0)
        silent.transport.pause_reading()  # reads nothing more: no pong is ever sent
        status, body = await upgrade_status(rx.port, "c", 0)
        assert status == 409 and "FWD-27" in body
        deadline = time.monotonic() + WAIT
        while status != 101 and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
            status, body = await upgrade_status(rx.port, "c", 0)
        silent.transport.abort()
        return (status, body), time.monotonic() - began

    try:
        answer, took = asyncio.run(go())
        assert answer == (101, "")
        assert took >= 1.5 * interval
    finally:
        rx.stop()


def test_FWD_27_keepalive_keeps_a_quiet_peer_that_answers(tmp_path: Path) -> None:
    """FWD-27: a peer that sends no frame for many ping intervals but answers the pings (the
    client's WebSocket layer does) keeps its connection: the same connection is answered
    afterwards, and the id is still taken meanwhile."""
    rx = Receiver.open(rx_uri(tmp_path), "events", ping_interval=0.1).start()

    async def go() -> wire.Response:
        async with await dial(rx.port, "c", 0) as quiet:
            await asyncio.sleep(1.5)  # 15 intervals, each dropping the peer without a pong
            status, body = await upgrade_status(rx.port, "c", 0)
            assert status == 409 and "FWD-27" in body
            return await deliver(quiet, [b"0"])

    try:
        assert asyncio.run(go()) == wire.Ok(0, {"events": 1})
        assert rx.stats["connections"] == 1
    finally:
        rx.stop()


def test_FWD_26_a_refused_forwarder_halts_at_once_with_the_receivers_reason(
    tmp_path: Path,
) -> None:
    """FWD-26: a forwarder whose FSN jump a receiver refuses fails at its first connect with
    the receiver's reason (it treated the 409 as transient and retried until its reconnect
    budget ran out, then reported only "budget exhausted")."""
    first = Receiver.open(rx_uri(tmp_path / "one"), "events", flush_interval_ms=5).start()
    other = Receiver.open(rx_uri(tmp_path / "two"), "events", flush_interval_ms=5).start()
    try:
        with Forwarder(sender(other.port, tmp_path / "sf-old", "b")) as fwd:
            fwd.append(b"old")
            assert fwd.wait_acked(timeout=WAIT)  # "other" holds b through FSN 0
        slot = tmp_path / "sf"
        with Forwarder(sender(first.port, slot, "b")) as fwd:
            for i in range(20):
                fwd.append(b"b%d" % i)
            assert fwd.wait_acked(timeout=WAIT)  # the slot is acked through FSN 19
        budget = "reconnect_max_duration_millis=600000;"
        with pytest.raises(SenderFailed) as raised:  # the first connect says why, at once
            Forwarder(sender(other.port, slot, "b") + budget)
        assert "409" in str(raised.value) and "FWD-26" in str(raised.value)
        assert other.stats["upgrades_refused"] == 1  # one attempt, not a retry loop
    finally:
        first.stop()
        other.stop()
