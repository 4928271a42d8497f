"""Running the service: on pre-bound sockets, in the foreground (``tidelog serve``) or on a
background thread (tests and embedding), with SVC-57's shutdown order."""

from __future__ import annotations

import asyncio
import socket
import ssl
import threading
from collections.abc import Sequence
from typing import Any

from aiohttp import web

from tidelog.api import Store

from .app import SERVICE, Service
from .loopclock import new_loop

__all__ = ["ServiceThread", "start_sites"]


async def start_sites(
    app: web.Application,
    sockets: Sequence[socket.socket],
    *,
    shutdown_timeout: float = 10.0,
    ssl_context: ssl.SSLContext | None = None,
) -> web.AppRunner:
    """Serve ``app`` on the given listening sockets (bound before the store opened, CLI-9)."""
    runner = web.AppRunner(
        app, handle_signals=False, access_log=None, shutdown_timeout=shutdown_timeout
    )
    await runner.setup()
    for sock in sockets:
        await web.SockSite(runner, sock, ssl_context=ssl_context).start()
    service = app.get(SERVICE)
    if service is not None:
        server = runner.server
        assert server is not None
        service.count_connections = lambda: len(server.connections)
    return runner


class ServiceThread:
    """The service over ``store`` on 127.0.0.1 (port 0: a free one) on a background thread:
    ``url`` is where it listens. The store stays the caller's (opened and closed by it), so a
    test keeps its injected clock. ``with ServiceThread(store) as svc: ...``"""

    def __init__(self, store: Store, *, host: str = "127.0.0.1", port: int = 0, **options: Any):
        self.store = store
        self.options = options
        self.sock = socket.create_server((host, port), family=socket.AF_INET)
        self.host = host
        self.port = self.sock.getsockname()[1]
        self.url = f"http://{host}:{self.port}"
        self.service: Service | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="tidelog-service", daemon=True)

    def start(self) -> ServiceThread:
        self._thread.start()
        self._ready.wait()
        if self._error is not None:
            raise self._error
        return self

    def _run(self) -> None:
        try:
            with asyncio.Runner(loop_factory=new_loop) as runner:
                runner.run(self._main())
        except BaseException as exc:  # reported by start() when it happens before ready
            self._error = exc
            self._ready.set()

    async def _main(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        self.service = Service(self.store, **self.options)
        runner = await start_sites(self.service.app, [self.sock], shutdown_timeout=2.0)
        self._ready.set()
        try:
            await self._stop.wait()
        finally:
            await runner.cleanup()

    def stop(self) -> None:
        if self._loop is not None and self._stop is not None and self._thread.is_alive():
            self._loop.call_soon_threadsafe(self._stop.set)
            self._thread.join(timeout=30)
        self.sock.close()

    def __enter__(self) -> ServiceThread:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
