"""Live push (SVC-27..SVC-35): a Server-Sent Events stream is a reader over the log. It writes
what successive reads return, one event per item, and waits for the topic's next delivery (the
scheduler's, section 7, woken by the store's change notification) when it has caught up.

A stream holds at most one batch it has not written and reads the next only once the socket
took the previous one (SVC-32): a slow client costs bounded memory and falls behind like a slow
reader, never delaying writers or other streams.
"""

from __future__ import annotations

import asyncio
import json
from typing import TYPE_CHECKING, Any

from aiohttp import web

from tidelog.api import Topic
from tidelog.errors import BadArgument, Busy, TidelogError
from tidelog.records import Tombstone

from .keys import TOKENS_GENERATION
from .request import check_query, query_int, query_str
from .wire import error_json, item_to_json

if TYPE_CHECKING:
    from .app import Service
    from .auth import Principal

__all__ = ["add_routes", "encode_events"]

#: SVC-31: the most a stream reads and writes at once
BATCH_EVENTS = 1000
BATCH_BYTES = 1 << 20


def encode_events(items: list[Any]) -> tuple[bytes, int]:
    """SVC-27: one event per item, ``id`` the record's seq or the tombstone's ``gap_to``;
    returns the bytes and the cursor after them."""
    out: list[str] = []
    cursor = 0
    for item in items:
        if isinstance(item, Tombstone):
            cursor = item.gap_to
            data = json.dumps(item_to_json(item), separators=(",", ":"))
            out.append(f"event: tombstone\nid: {cursor}\ndata: {data}\n\n")
        else:
            cursor = item.seq
            data = json.dumps(item_to_json(item), separators=(",", ":"), ensure_ascii=False)
            out.append(f"event: record\nid: {cursor}\ndata: {data}\n\n")
    return "".join(out).encode("utf-8"), cursor


def _event(name: str, data: object) -> bytes:
    return f"event: {name}\ndata: {json.dumps(data, separators=(',', ':'))}\n\n".encode()


def _last_event_id(request: web.Request) -> int | None:
    raw = request.headers.get("Last-Event-ID")
    if raw is None:
        return None
    raw = raw.strip()
    if not raw.isascii() or not raw.isdigit():
        raise BadArgument(f"Last-Event-ID must be a decimal seq, got {raw!r} (SVC-28)")
    return int(raw)


def add_routes(app: web.Application, svc: Service) -> None:
    async def topic_events(request: web.Request) -> web.StreamResponse:
        check_query(request, ("incarnation", "after", "exclude_node"))
        name = request.match_info["t"]
        incarnation = query_int(request, "incarnation", None, 1)
        exclude = query_str(request, "exclude_node")
        resume = _last_event_id(request)
        after = query_int(request, "after", None, 0)

        def start(t: Topic) -> int:
            # SVC-28: after Last-Event-ID, else `after`, else from now (the head at connect)
            if resume is not None:
                return resume
            return after if after is not None else t.state().head_seq

        cursor = await svc.run(name, None, svc.on_topic, name, incarnation, start)
        return await _stream(svc, request, name, incarnation, cursor, exclude)

    async def subscriber_events(request: web.Request) -> web.StreamResponse:
        check_query(request, ("incarnation", "after"))
        name, s = request.match_info["t"], request.match_info["s"]
        incarnation = query_int(request, "incarnation", None, 1)
        resume = _last_event_id(request)
        after = query_int(request, "after", None, 0)

        def start(t: Topic) -> int:
            # SVC-33: after the larger of the hwm and Last-Event-ID (else `after`, else 0)
            hwm = t.subscriber(s).hwm
            given = resume if resume is not None else (after or 0)
            return max(hwm, given)

        cursor = await svc.run(name, None, svc.on_topic, name, incarnation, start)
        return await _stream(svc, request, name, incarnation, cursor, None, subscriber=s)

    app.router.add_get("/v0/topics/{t}/events", topic_events)
    app.router.add_get("/v0/topics/{t}/subscribers/{s}/events", subscriber_events)


def _admit(svc: Service, who: Principal) -> None:
    """SVC-51: at most --max-streams streams in all and --max-streams-per-token per token
    (with tokens); more are 503 ``busy`` before the stream starts."""
    limits = svc.limits
    if len(svc.streams) >= limits.max_streams:
        raise Busy(f"{len(svc.streams)} event streams are open, the most --max-streams allows")
    if not svc.authz.open and svc.streams_of.get(who.name, 0) >= limits.max_streams_per_token:
        raise Busy(
            f"token {who.name!r} has {limits.max_streams_per_token} event streams open, the "
            "most --max-streams-per-token allows (SVC-51)"
        )


async def _stream(
    svc: Service,
    request: web.Request,
    name: str,
    incarnation: int | None,
    cursor: int,
    exclude: str | None,
    subscriber: str | None = None,
) -> web.StreamResponse:
    who = svc.principal(request)
    _admit(svc, who)
    response = web.StreamResponse(
        headers={
            "Content-Type": "text/event-stream",
            "Cache-Control": "no-cache",
            "X-Accel-Buffering": "no",
        }
    )
    await response.prepare(request)
    await response.write(b"retry: 1000\n\n")
    task = asyncio.current_task()
    assert task is not None
    svc.streams.add(task)
    svc.streams_of[who.name] = svc.streams_of.get(who.name, 0) + 1
    svc.metrics.stream_opened(name)
    heartbeat = svc.sse_heartbeat_ms / 1000.0
    stall = svc.sse_stall_ms / 1000.0
    tokens_seen = request.get(TOKENS_GENERATION, svc.authz.generation)
    deferred = False
    loop = asyncio.get_running_loop()

    def read(t: Topic) -> list[Any]:
        if subscriber is not None:
            t.subscriber(subscriber)  # SVC-34: ends once the subscriber is gone
        return t.read(cursor, BATCH_EVENTS, exclude_node=exclude)

    try:
        with svc.push_interest(name) as interest:
            while not svc.stopping:
                gen = interest.gen
                try:
                    if svc.authz.generation != tokens_seen:  # SVC-49: tokens reloaded
                        tokens_seen = request.get(TOKENS_GENERATION, svc.authz.generation)
                        who = svc.authz.recheck(who, "read", name)
                    items = await svc.run(name, cursor, svc.on_topic, name, incarnation, read)
                except TidelogError as exc:  # SVC-34: the topic, subscriber or right is gone
                    await response.write(_event("error", error_json(exc.code, exc.message)))
                    return response
                if svc.push is not None and svc.push.is_deferred(name) != deferred:
                    deferred = not deferred  # SVC-35: said once at each start and end
                    await response.write(_event("deferred" if deferred else "resumed", {}))
                if items and not deferred:
                    data, cursor = encode_events(_within(items))
                    # waits until the socket took it; a socket that takes nothing for
                    # --sse-stall-ms is closed (SVC-32): the client resumes with Last-Event-ID
                    stalled = loop.call_later(stall, _abort, request)
                    try:
                        await response.write(data)
                    finally:
                        stalled.cancel()
                    svc.metrics.stream_events(name, data.count(b"\nid: "))
                    continue
                if not await interest.changed_since(gen, heartbeat) and not svc.stopping:
                    await response.write(b": hb\n\n")  # SVC-30
            await response.write(b"event: shutdown\ndata: {}\n\n")  # SVC-57
    except (ConnectionResetError, asyncio.CancelledError):
        pass
    finally:
        svc.streams.discard(task)
        svc.streams_of[who.name] -= 1
        svc.metrics.stream_closed(name)
    return response


def _abort(request: web.Request) -> None:
    """SVC-32: the socket took nothing for --sse-stall-ms: the connection is dropped (the
    stream's write then fails and the stream ends)."""
    if request.transport is not None:
        request.transport.abort()


def _within(items: list[Any]) -> list[Any]:
    """SVC-31: at most BATCH_BYTES of payload per write (at least one item)."""
    total = 0
    for i, item in enumerate(items):
        if not isinstance(item, Tombstone):
            total += len(item.payload)
            if total > BATCH_BYTES and i > 0:
                return items[:i]
    return items
