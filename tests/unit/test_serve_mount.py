"""The receiver mounted in another aiohttp application (spec/FORWARD.md section 5, FWD-18): its
paths beside the host's own routes on one listener, its flusher on the host's loop, the store
the caller's. Real sockets on 127.0.0.1, one event loop per test, bounded waits."""

from __future__ import annotations

import asyncio
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import InvalidStatus

import tidelog
from tidelog.forward import Receiver, wire
from tidelog.forward.dedup import forwarded

WAIT = 30.0


async def dial(port: int, client: str, durable: bool = False) -> ClientConnection:
    headers = {wire.H_CLIENT_ID: client, wire.H_FSN_AT_ZERO: "0"}
    if durable:
        headers[wire.H_REQUEST_DURABLE_ACK] = "true"
    return await connect(
        f"ws://127.0.0.1:{port}/api/v4/write",
        additional_headers=headers,
        proxy=None,
        compression=None,
        ping_interval=None,
        open_timeout=WAIT,
    )


async def health(request: web.Request) -> web.Response:
    return web.json_response({"ok": True})


def test_FWD_18_the_receiver_serves_beside_another_applications_routes(tmp_path: Path) -> None:
    """FWD-18: mounted with add_routes, the receiver answers its paths on the host's listener
    (the host's own route and its 404 unchanged), its flusher runs on the host's loop (durable
    acks arrive), shutdown() closes its connections with 1001 and refuses later upgrades with
    503, and it leaves the caller's store open."""
    store = tidelog.open(f"file://{tmp_path / 'rx'}?wal_file_bytes=1MiB")
    rx = Receiver(store, "events", flush_interval_ms=5)
    app = web.Application()
    app.router.add_get("/v0/health", health)
    rx.add_routes(app)

    async def go() -> None:
        runner = web.AppRunner(app)
        await runner.setup()
        await rx.startup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = runner.addresses[0][1]
        try:
            async with aiohttp.ClientSession() as http:
                async with http.get(f"http://127.0.0.1:{port}/v0/health") as resp:
                    assert resp.status == 200 and await resp.json() == {"ok": True}
                async with http.get(f"http://127.0.0.1:{port}/nope") as resp:
                    assert resp.status == 404
            ws = await dial(port, "m", durable=True)
            for frame in (b"one", b"two"):
                await ws.send(frame)
            durable = None
            while durable is None or durable.tables["events"] < 2:
                resp = wire.decode(await asyncio.wait_for(ws.recv(), WAIT))
                if isinstance(resp, wire.DurableAck):
                    durable = resp
            await rx.shutdown()
            await asyncio.wait_for(ws.wait_closed(), WAIT)
            assert ws.close_code == 1001
            with pytest.raises(InvalidStatus) as refused:
                await dial(port, "late")
            assert refused.value.response.status_code == 503
            assert b"receiver not serving" in refused.value.response.body
        finally:
            await runner.cleanup()

    try:
        asyncio.run(go())
        assert [(c, f, r.payload) for c, f, r in forwarded(store.topic("events"))] == [
            ("m", 0, b"one"), ("m", 1, b"two"),
        ]  # fmt: skip
        assert rx.stats["stored"] == 2 and rx.held_bytes == 0
    finally:
        store.close()


def test_FWD_18_the_host_starts_and_stops_the_receiver_from_its_signals(tmp_path: Path) -> None:
    """FWD-18: startup() from the host's on_startup and shutdown() from its on_shutdown: the
    host's AppRunner.cleanup() ends the receiver's connections with 1001 (aiohttp would wait for
    their handlers otherwise) and the final flush makes the frame durable, with the flush
    interval too long for any other flush."""
    uri = f"file://{tmp_path / 'rx'}?wal_file_bytes=1MiB"
    store = tidelog.open(uri)
    rx = Receiver(store, "events", flush_interval_ms=600000)
    app = web.Application()
    rx.add_routes(app)

    async def on_startup(_: web.Application) -> None:
        await rx.startup()

    async def on_shutdown(_: web.Application) -> None:
        await rx.shutdown()

    app.on_startup.append(on_startup)
    app.on_shutdown.append(on_shutdown)

    async def go() -> int | None:
        runner = web.AppRunner(app, shutdown_timeout=WAIT)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", 0).start()
        ws = await dial(runner.addresses[0][1], "s")
        await ws.send(b"one")
        assert wire.decode(await asyncio.wait_for(ws.recv(), WAIT)) == wire.Ok(0, {"events": 1})
        await asyncio.wait_for(runner.cleanup(), WAIT)
        await asyncio.wait_for(ws.wait_closed(), WAIT)
        return ws.close_code

    try:
        assert asyncio.run(go()) == 1001
        assert rx.durable_seq == 1
    finally:
        store.close()
    with tidelog.open(uri) as again:
        assert [r.payload for r in again.topic("events").read()] == [b"one"]
