"""``tidelog serve`` in the foreground: serve until SIGTERM or SIGINT, then shut down in
SVC-57's order (stop accepting, end waits and streams, let requests in flight finish, flush and
close the store); a second signal skips the waiting."""

from __future__ import annotations

import asyncio
import contextlib
import signal
import socket
from collections.abc import Callable, Sequence
from typing import Any

from tidelog.api import Store

from .app import Service
from .server import start_sites

__all__ = ["run_service"]


def run_service(
    store: Store,
    sockets: Sequence[socket.socket],
    *,
    shutdown_timeout_ms: int = 10_000,
    on_ready: Callable[[Service], None] | None = None,
    **options: Any,
) -> None:
    """Serve ``store`` on ``sockets`` until a signal; the store is flushed and closed after."""
    try:
        asyncio.run(_serve(store, sockets, shutdown_timeout_ms, on_ready, options))
    finally:
        try:
            store.flush()
        finally:
            store.close()


async def _serve(
    store: Store,
    sockets: Sequence[socket.socket],
    shutdown_timeout_ms: int,
    on_ready: Callable[[Service], None] | None,
    options: dict[str, Any],
) -> None:
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    signals = 0

    def on_signal() -> None:
        nonlocal signals
        signals += 1
        stop.set()
        if signals > 1:  # SVC-57: a second signal does not wait for requests in flight
            raise SystemExit(1)

    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, on_signal)
    service = Service(store, **options)
    runner = await start_sites(service.app, sockets, shutdown_timeout=shutdown_timeout_ms / 1000.0)
    if on_ready is not None:
        on_ready(service)
    try:
        await stop.wait()
    finally:
        service.stopping = True  # SVC-54: health answers 503 from here
        await runner.cleanup()
        for sig in (signal.SIGTERM, signal.SIGINT):
            with contextlib.suppress(Exception):
                loop.remove_signal_handler(sig)
