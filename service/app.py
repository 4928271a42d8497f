"""The service's aiohttp application (spec/SERVICE.md): one store, its API as endpoints.

Every endpoint is one call of the public API (SVC-13), run on the loop when it cannot block and
on a worker thread otherwise (service/calls.py: a durable append waits for its group commit,
CON-1, on a thread of its own); waits and streams stay on the loop, woken by the store's change
notification through ``ChangeHub`` (SVC-29). Errors become SVC-9's body with SVC-10's status in
one middleware.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from aiohttp import web
from aiohttp.typedefs import Handler

from tidelog.api import Store, Topic
from tidelog.clock import Clock, SystemClock
from tidelog.errors import (
    BadArgument,
    Busy,
    Closed,
    Internal,
    MethodNotAllowed,
    NoSuchTopic,
    NotFound,
    TidelogError,
    TooLarge,
)
from tidelog.records import TopicState

from . import arrowread, endpoints, staged, streams
from .auth import ANYONE, Authorizer, Principal
from .calls import Calls
from .hub import ChangeHub
from .keys import PRINCIPAL, TOKENS_GENERATION
from .limits import Limits
from .logs import log_request
from .metrics import Metrics
from .push import Push
from .replays import Replays
from .request import REQUEST_TIMEOUT_S, query_int
from .responses import HTTP_CODES, error_response
from .schedule import Governor, parse_priority_rule

__all__ = ["Service", "SERVICE"]

log = logging.getLogger("tidelog.service")
T = TypeVar("T")
#: the Service an application belongs to
SERVICE: web.AppKey[Service] = web.AppKey("service")


class Service:
    """The state of one running service: its store, worker threads, topic handles, the change
    hub, the push loop, tokens, limits, metrics and the replies kept for retries (SVC-25)."""

    def __init__(
        self,
        store: Store,
        *,
        limits: Limits | None = None,
        tokens: str | None = None,
        clock: Clock | None = None,
        priority: Sequence[str] = (),
        delivery_workers: int = 4,
        max_inflight_appends: int = 1024,
        metrics_max_topics: int = 1000,
        workers: int = 64,
        sse_heartbeat_ms: int = 15_000,
        sse_stall_ms: int = 30_000,
        replay_window_ms: int = 60_000,
        max_replays: int = 10_000,
        **limit_options: object,
    ) -> None:
        # everything that can be refused is checked before anything starts (bad_option)
        self.limits = limits if limits is not None else Limits.from_options(**limit_options)
        self.authz = Authorizer(tokens)
        self.rules = [parse_priority_rule(rule) for rule in priority]
        self.check_options(delivery_workers=delivery_workers,
                           max_inflight_appends=max_inflight_appends)  # fmt: skip
        self.clock = clock if clock is not None else SystemClock()
        self.delivery_workers = delivery_workers
        self.max_inflight_appends = max_inflight_appends
        self.store = store
        self.store_id = arrowread.served_store_id(store)  # SVC-62
        self.calls = Calls(store, workers)
        self.staged = staged.StagedWrites.for_store(store, self.limits)  # SVC-65..SVC-68
        self.sse_heartbeat_ms = sse_heartbeat_ms
        self.sse_stall_ms = sse_stall_ms
        self.replays = Replays(replay_window_ms, max_replays)
        self.metrics = Metrics(max_topics=metrics_max_topics)
        self.handles: dict[str, Topic] = {}
        self.hub: ChangeHub | None = None
        self.push: Push | None = None
        self.stopping = False
        self.streams: set[asyncio.Task[Any]] = set()
        self.streams_of: dict[str | None, int] = {}  # per token name (SVC-51)
        self.rights: dict[Any, str] = {}  # route -> the right it needs (SVC-48)
        self.route_topics: dict[Any, str] = {}  # routes whose topic is not in the path
        self._routes: dict[Any, tuple[str, str, str | None]] = {}  # _route_info's answers
        #: open HTTP connections, as the running server counts them (set by start_sites)
        self.count_connections: Callable[[], int] = lambda: 0
        self.app = self._build()

    @staticmethod
    def check_options(**options: Any) -> None:
        """Refuse what the constructor would refuse, before a store is opened (bad_option)."""
        if options.get("tokens") is not None:
            Authorizer(options["tokens"])
        for rule in options.get("priority", ()):
            parse_priority_rule(rule)
        Governor(
            SystemClock(),
            delivery_workers=options.get("delivery_workers", 4),
            max_inflight_appends=options.get("max_inflight_appends", 1024),
        )

    def mount_receiver(self, receiver: Any) -> None:
        """SVC-2: the store-and-forward receiver's paths on this listener and loop; its upgrade
        needs ``write`` on its topic (SVC-48). It stops first at shutdown, with its final flush
        (FWD-18), before the store is flushed and closed (SVC-57)."""
        before = set(self.app.router.routes())
        receiver.add_routes(self.app)
        for route in set(self.app.router.routes()) - before:
            self.rights[route] = "write"
            self.route_topics[route] = receiver.table

        async def start(app: web.Application) -> None:
            await receiver.startup()

        async def stop(app: web.Application) -> None:
            await receiver.shutdown()

        self.app.on_startup.append(start)
        self.app.on_shutdown.insert(0, stop)

    @property
    def max_batch(self) -> int:
        return self.limits.max_batch

    @property
    def max_wait_ms(self) -> int:
        return self.limits.max_wait_ms

    def topic_states(self) -> dict[str, TopicState]:
        """On a worker thread: every topic's state, for the metrics' per-topic gauges."""
        out: dict[str, TopicState] = {}
        for name in self.store.topics():
            with contextlib.suppress(NoSuchTopic):
                out[name] = self.store.topic(name, create=False).state()
        return out

    # -- store calls (service/calls.py) --------------------------------------------------------
    async def call(self, fn: Callable[..., T], *args: Any) -> T:
        """Run one store call on a worker thread (one that may block on I/O). A client that
        goes away does not cancel it: the op completes or not as a whole (SVC-26, ERR-2)."""
        return await self.calls.thread(fn, *args)

    async def run(
        self, topic: str | None, after: int | None, fn: Callable[..., T], *args: Any
    ) -> T:
        """Run one store call of ``topic`` on the loop when it cannot block (reading payloads
        after ``after``: ``Engine.resident``), else on a worker thread (``Calls.inline``)."""
        return await self.calls.inline(topic, after, fn, *args)

    def handle(self, name: str, incarnation: int | None) -> Topic:
        """On a worker thread: the handle on topic ``name``, of life ``incarnation`` when given
        (SVC-14, TOP-10)."""
        topic = self.handles.get(name)
        if topic is None or (incarnation is not None and topic.incarnation != incarnation):
            topic = self.store.topic(name, create=False)
            self.handles[name] = topic
        if incarnation is not None and topic.incarnation != incarnation:
            raise NoSuchTopic(
                f"topic {name!r} incarnation {incarnation} was dropped; the name's current "
                f"life is {topic.incarnation} (TOP-10, SVC-14)"
            )
        return topic

    def on_topic(self, name: str, incarnation: int | None, fn: Callable[[Topic], T]) -> T:
        """On a worker thread: ``fn`` on the topic's handle. Without an incarnation a handle
        found dropped is opened again once: the call raised, so it changed nothing (ERR-2)."""
        topic = self.handle(name, incarnation)
        try:
            return fn(topic)
        except NoSuchTopic:
            if incarnation is not None:
                raise
            self.handles.pop(name, None)
            return fn(self.handle(name, None))

    async def topic_call(
        self,
        request: web.Request,
        fn: Callable[[Topic], T],
        name: str | None = None,
        *,
        after: int | None = None,
        inline: bool = True,
    ) -> T:
        """``fn`` on the request's topic (``name``, else the path's), on the loop when it
        cannot block (``run``; ``after`` as there) unless ``inline`` is False: then on a worker
        thread, for ops that do I/O under the store lock."""
        incarnation = query_int(request, "incarnation", None, 1)
        topic = name if name is not None else request.match_info["t"]
        if not inline:
            return await self.call(self.on_topic, topic, incarnation, fn)
        return await self.run(topic, after, self.on_topic, topic, incarnation, fn)

    async def wait_change(
        self,
        name: str,
        attempt: Callable[[], T],
        done: Callable[[T], bool],
        wait_ms: int,
        after: int | None = None,
    ) -> T:
        """CON-3 on the loop: run ``attempt`` (``run``, reading after ``after``) until ``done``
        says so or ``wait_ms`` pass, woken by the topic's changes (SVC-16, SVC-29). Ends early
        with the last answer when the service stops (SVC-57)."""
        assert self.hub is not None
        wait_ms = min(wait_ms, self.max_wait_ms)
        deadline = time.monotonic() + wait_ms / 1000.0
        with self.hub.interest(name) as interest:
            while True:
                gen = interest.gen
                value = await self.run(name, after, attempt)
                left = deadline - time.monotonic()
                if done(value) or left <= 0 or self.stopping:
                    return value
                await interest.changed_since(gen, left)

    def push_interest(self, name: str) -> contextlib.AbstractContextManager[Any]:
        """What a stream waits on between batches: the topic's deliveries (SVC-29, SVC-37)."""
        assert self.push is not None
        return self.push.interest(name)

    def principal(self, request: web.Request) -> Principal:
        who: Principal = request.get(PRINCIPAL, ANYONE)
        return who

    # -- the application ------------------------------------------------------------------------
    def _build(self) -> web.Application:
        app = web.Application(
            client_max_size=self.limits.max_request_bytes,
            middlewares=[self._serve],
            handler_args={
                "max_line_size": self.limits.max_header_bytes,
                "max_field_size": self.limits.max_header_bytes,
                "keepalive_timeout": self.limits.keepalive_timeout_ms / 1000.0,
                # a connection closed with a body still unread is read for at most 1 s more
                # (aiohttp's "lingering close"), so 408's close comes soon (SVC-51)
                "lingering_time": 1.0,
            },
        )
        endpoints.add_routes(app, self)
        streams.add_routes(app, self)
        arrowread.add_routes(app, self)
        staged.add_routes(app, self)
        app[REQUEST_TIMEOUT_S] = self.limits.request_timeout_ms / 1000.0
        app[SERVICE] = self
        app.on_startup.append(self._startup)
        app.on_shutdown.append(self._on_shutdown)
        app.on_cleanup.append(self._cleanup)
        return app

    async def _startup(self, app: web.Application) -> None:
        self.calls.start(asyncio.get_running_loop())
        self.hub = ChangeHub(self.store, asyncio.get_running_loop())
        self.push = Push(
            self.hub,
            self.clock,
            self.metrics,
            rules=self.rules,
            delivery_workers=self.delivery_workers,
            max_inflight_appends=self.max_inflight_appends,
        )
        self.push.start()

    async def _on_shutdown(self, app: web.Application) -> None:
        """SVC-57: waits end with their answer and streams with ``event: shutdown``."""
        self.stopping = True
        if self.push is not None:
            await self.push.close()
        if self.hub is not None:
            self.hub.close()
        for task in list(self.streams):
            with contextlib.suppress(Exception):
                await asyncio.wait_for(asyncio.shield(task), 2.0)

    async def _cleanup(self, app: web.Application) -> None:
        self.calls.close()
        self.staged.close()

    def _route_info(self, route: Any) -> tuple[str, str, str | None]:
        """A route's template (SVC-53, SVC-55), the right it needs (SVC-48) and its topic when
        the path has none (the receiver's), looked up once per route."""
        info = self._routes.get(route)
        if info is None:
            if route.resource is None:  # no route matched: a new one per request, not kept
                return ("(none)", "any", None)
            template = route.resource.canonical
            info = (template, self.rights.get(route, "any"), self.route_topics.get(route))
            self._routes[route] = info
        return info

    @web.middleware
    async def _serve(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        """Every request: refused with 503 while stopping (SVC-57) or over the connection limit
        (SVC-51); the route's right on its topic, checked before the topic is looked up (SVC-48,
        SVC-49); errors as SVC-9's body with SVC-10's status; counted, timed and logged once
        answered (SVC-53, SVC-55)."""
        started = time.monotonic()
        match = request.match_info
        template, right, fixed = self._route_info(match.route)
        topic = match.get("t") or fixed
        principal: Principal | None = None
        failure: BaseException | None = None
        status = 500
        response: web.StreamResponse | None = None
        try:
            try:
                if self.stopping and request.path != "/v0/health":
                    raise Closed("the service is shutting down (SVC-57)")
                if self.count_connections() > self.limits.max_http_connections:
                    busy = Busy(
                        f"more than --max-http-connections {self.limits.max_http_connections} "
                        "connections are open (SVC-51)"
                    )
                    busy.close_connection = True  # type: ignore[attr-defined]  # then closed
                    raise busy
                request[TOKENS_GENERATION] = self.authz.generation  # what the check below saw
                principal = self.authz.check(request.headers.get("Authorization"), right, topic)
                request[PRINCIPAL] = principal
                response = await handler(request)
            except TidelogError as exc:
                response = error_response(exc)
            except web.HTTPException as exc:
                if exc.status < 400:
                    status = exc.status
                    raise
                response = error_response(self._http_error(request, exc))
            except (asyncio.CancelledError, ConnectionResetError):
                raise
            except Exception as exc:
                failure = exc
                log.exception("internal error on %s %s", request.method, request.path)
                response = error_response(
                    Internal(f"internal error on {request.method} {request.path}")
                )
            status = response.status
            return response
        finally:
            seconds = time.monotonic() - started
            self.metrics.request(template, request.method, status, seconds)
            log_request(
                method=request.method,
                route=template,
                topic=topic,
                status=status,
                seconds=seconds,
                bytes_in=request.content_length or 0,
                bytes_out=_bytes_out(response),
                token_name=principal.name if principal is not None else None,
                exc=failure,
            )

    def _http_error(self, request: web.Request, exc: web.HTTPException) -> TidelogError:
        """An error of the HTTP layer (no route, no such method, a body over the limit) as
        SVC-9's error with its code."""
        code = HTTP_CODES.get(exc.status, "bad_argument")
        if exc.status == 413:
            err: TidelogError = TooLarge(
                f"request body over {self.limits.max_request_bytes} bytes (SVC-51)"
            )
        elif exc.status == 404:
            err = NotFound(f"no such path: {request.method} {request.path} (SVC-13)")
        elif exc.status == 405:
            err = MethodNotAllowed(f"{request.method} is not allowed on {request.path}")
            err.allow = exc.headers.get("Allow", "")  # type: ignore[attr-defined]
        else:
            err = BadArgument(f"{exc.reason} (SVC-12)")
        err.code = code if err.code == "error" else err.code
        return err


def _bytes_out(response: web.StreamResponse | None) -> int:
    """SVC-55's bytes out: a stream's written so far (it ended), an answer's body."""
    if response is None:
        return 0
    if response.prepared:
        return response.body_length
    body = getattr(response, "body", None)
    return len(body) if isinstance(body, bytes) else 0
