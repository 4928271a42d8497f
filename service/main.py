"""``tidelog serve`` in the foreground: serve until SIGTERM or SIGINT, then shut down in
SVC-57's order (stop accepting, end waits and streams, let requests in flight finish, flush and
close the store); a second signal skips the waiting."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import signal
import socket
import ssl
from collections.abc import Callable, Sequence
from typing import Any

import tidelog
from tidelog.api import Store
from tidelog.errors import BadOption

from .app import Service
from .auth import check_listen, server_ssl_context
from .limits import Limits
from .logs import configure
from .loopclock import new_loop
from .server import start_sites

__all__ = ["run_service", "serve_api"]

#: options of ``tidelog serve`` that are not the Service's own keywords
_PROCESS_OPTIONS = (
    "no_auth", "tls_cert", "tls_key", "allow_plain_http", "log_format", "shutdown_timeout_ms",
)  # fmt: skip


def serve_api(
    uri: str,
    host: str,
    port: int,
    options: dict[str, Any],
    bind: Callable[[str, int], list[socket.socket]],
    *,
    receiver: Callable[[Store], Any] | None = None,
) -> None:
    """``tidelog serve``: check every option, bind (CLI-9), open the store and serve it until a
    signal; with ``receiver`` (a factory of the store-and-forward receiver over the open store)
    also its WebSocket paths on the same listener (SVC-2). A bad option binds and opens
    nothing (SVC-3)."""
    process = {k: options.pop(k) for k in _PROCESS_OPTIONS}
    cert, key = process["tls_cert"], process["tls_key"]
    if (cert is None) != (key is None):
        raise BadOption("--tls-cert and --tls-key go together (SVC-50)")
    check_listen(
        host, options.get("tokens"), cert is not None, process["no_auth"],
        process["allow_plain_http"],
    )  # fmt: skip
    tls = server_ssl_context(cert, key) if cert is not None else None
    options["priority"] = list(options.get("priority") or ())
    options["limits"] = Limits.from_options(
        **{name: options.pop(name) for _, name, _, _ in Limits.options()}
    )
    Service.check_options(**options)
    configure(process["log_format"])
    sockets = bind(host, port)
    try:
        store = tidelog.open(uri)
    except BaseException:
        for sock in sockets:
            sock.close()
        raise
    scheme = "https" if tls is not None else "http"
    bound = sockets[0].getsockname()[1]
    try:
        rx = receiver(store) if receiver is not None else None
    except BaseException:
        for sock in sockets:
            sock.close()
        store.close()
        raise

    def ready(service: Service) -> None:
        if rx is not None:
            ws = "wss" if tls is not None else "ws"
            print(f"listening on {ws}://{host}:{bound}/write/v4 topic={rx.table}", flush=True)
        print(f"listening on {scheme}://{host}:{bound}/v0", flush=True)

    run_service(
        store,
        sockets,
        ssl_context=tls,
        shutdown_timeout_ms=process["shutdown_timeout_ms"],
        on_ready=ready,
        receiver=rx,
        **options,
    )


def run_service(
    store: Store,
    sockets: Sequence[socket.socket],
    *,
    shutdown_timeout_ms: int = 10_000,
    on_ready: Callable[[Service], None] | None = None,
    ssl_context: ssl.SSLContext | None = None,
    receiver: Any = None,
    **options: Any,
) -> None:
    """Serve ``store`` on ``sockets`` until a signal; the store is flushed and closed after."""
    try:
        with asyncio.Runner(loop_factory=new_loop) as runner:  # SVC-41: its busy share
            serving = _serve(
                store, sockets, shutdown_timeout_ms, on_ready, ssl_context, receiver, options
            )
            runner.run(serving)
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
    ssl_context: ssl.SSLContext | None,
    receiver: Any,
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
    if receiver is not None:
        service.mount_receiver(receiver)
    loop.add_signal_handler(signal.SIGHUP, service.authz.reload)  # SVC-49
    runner = await start_sites(
        service.app,
        sockets,
        shutdown_timeout=shutdown_timeout_ms / 1000.0,
        ssl_context=ssl_context,
    )
    # What the process made to start (modules, the app, the opened store: ~40k objects) lives
    # as long as it does: frozen out of the collector, so that a full collection, when the
    # requests' leftovers trigger one, scans those only (a full one scanning everything took
    # 25-180 ms on the 2-vCPU bench VM: a stall of every stream and request, SVC-29)
    gc.collect()
    gc.freeze()
    if on_ready is not None:
        on_ready(service)
    try:
        await stop.wait()
    finally:
        service.stopping = True  # SVC-54: health answers 503 from here
        await runner.cleanup()
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            with contextlib.suppress(Exception):
                loop.remove_signal_handler(sig)
