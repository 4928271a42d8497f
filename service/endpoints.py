"""The endpoints of SVC-13: each is one call of the public API, its fields the call's arguments
and its answer the call's result; an endpoint adds only the encoding (service/wire.py)."""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

from aiohttp import web

import tidelog
from tidelog.api import Topic
from tidelog.errors import BadArgument, TooLarge
from tidelog.records import Tombstone

from .replays import check_request_id
from .request import (
    check_query,
    field_bool,
    field_int,
    field_str,
    json_body,
    query_int,
    query_str,
    read_body,
)
from .responses import json_response
from .wire import item_to_json, lease_to_json, state_to_json, unb64

if TYPE_CHECKING:
    from .app import Service

__all__ = ["add_routes", "topic_json", "producer_from_json"]


def _ok(obj: object, status: int = 200) -> web.Response:
    return json_response(obj, status)


def _no_content() -> web.Response:
    return web.Response(status=204)


def topic_json(svc: Service, topic: Topic) -> dict[str, Any]:
    """SVC-14: a topic's name, life, whole config, state, subscribers and priority."""
    store = topic.store
    return {
        "name": topic.name,
        "incarnation": topic.incarnation,
        "config": dataclasses.asdict(topic.config),
        "state": state_to_json(topic.state()),
        "subscribers": topic.subscribers() if store.capabilities.subscribers else [],
        "priority": svc.push.sched.priority(topic.name) if svc.push is not None else 0,
    }


def _next_after(items: list[Any], after: int) -> int:
    if not items:
        return after
    last = items[-1]
    return last.gap_to if isinstance(last, Tombstone) else last.seq


def _items(items: list[Any]) -> list[dict[str, Any]]:
    return [item_to_json(i) for i in items]


def producer_from_json(value: object) -> tuple[str, int] | None:
    if value is None:
        return None
    if not isinstance(value, dict) or set(value) != {"id", "seq"}:
        raise BadArgument(f"producer must be {{'id': str, 'seq': int}}, got {value!r} (SVC-15)")
    return (value["id"], value["seq"])  # the API checks their types (TOP-11)


def add_routes(app: web.Application, svc: Service) -> None:
    r = app.router

    # -- the store ----------------------------------------------------------------------------
    async def root(request: web.Request) -> web.Response:
        caps = svc.store.capabilities.to_dict()
        return _ok(
            {
                "api": "v0",
                "tidelog": tidelog.__version__,
                "capabilities": caps,
                "limits": svc.limits.to_dict(),
                "store_id": svc.store_id,  # SVC-62
            }
        )

    async def health(request: web.Request) -> web.Response:
        """SVC-54: liveness, with SVC-41's pressure."""
        if svc.stopping:
            return _ok({"status": "stopping"}, 503)
        pressure = svc.push.gov.pressure if svc.push is not None else 0.0
        return _ok({"status": "ok", "pressure": pressure})

    async def metrics(request: web.Request) -> web.Response:
        """SVC-53: the per-topic gauges read the store, on a worker thread."""
        svc.metrics.set_topic_states(svc.topic_states)
        body, content_type = await svc.call(svc.metrics.render)
        return web.Response(body=body, headers={"Content-Type": content_type})

    async def list_topics(request: web.Request) -> web.Response:
        """SVC-22, SVC-48: only the topics the caller may read."""
        check_query(request, ())
        topics = await svc.run(None, None, svc.store.topics)
        return _ok({"topics": svc.principal(request).readable(topics)})

    async def put_topic(request: web.Request) -> web.Response:
        name = request.match_info["t"]
        # the fields are the options: Store.topic refuses an unknown one (bad_option, URI-2)
        body = await json_body(request, None)

        def open_topic() -> dict[str, Any]:
            topic = svc.store.topic(name, create=True, **body)
            svc.handles[name] = topic
            return topic_json(svc, topic)

        return _ok(await svc.call(open_topic))

    async def get_topic(request: web.Request) -> web.Response:
        check_query(request, ("incarnation",))
        return _ok(await svc.topic_call(request, lambda t: topic_json(svc, t)))

    async def delete_topic(request: web.Request) -> web.Response:
        check_query(request, ("incarnation",))
        name = request.match_info["t"]
        incarnation = query_int(request, "incarnation", None, 1)

        def drop() -> None:
            if incarnation is not None:
                svc.handle(name, incarnation)  # 404 if that life is gone (SVC-14)
            svc.store.drop_topic(name)
            svc.handles.pop(name, None)

        await svc.call(drop)
        if svc.push is not None:
            svc.push.dropped(name)  # SVC-36: its priority ends with it
        return _no_content()

    async def flush(request: web.Request) -> web.Response:
        await svc.call(svc.store.flush)
        return _no_content()

    async def refresh(request: web.Request) -> web.Response:
        await svc.call(svc.store.refresh)
        return _no_content()

    def admitted(request: web.Request) -> Any:
        """SVC-44, SVC-45: a slot among the appends in flight, or 429 at saturation, unless
        an allowed caller asks not to be throttled."""
        assert svc.push is not None
        asked = request.headers.get("X-Tidelog-No-Throttle") == "1"
        bypass = asked and svc.principal(request).unthrottled
        return svc.push.admitted(request.match_info["t"], bypass)

    # -- appends and reads --------------------------------------------------------------------
    async def append(request: web.Request) -> web.Response:
        if request.content_type == "application/octet-stream":
            # SVC-6: the body byte for byte; tag and node from the query
            check_query(request, ("incarnation", "tag", "node"))
            payload = await read_body(request)
            tag, node = query_str(request, "tag"), query_str(request, "node")
        else:
            check_query(request, ("incarnation",))
            body = await json_body(request, ("payload", "tag", "node"))
            payload = unb64(body.get("payload"), "payload")
            tag, node = field_str(body, "tag", None), field_str(body, "node", None)
        async with admitted(request):
            seq = await svc.topic_call(request, lambda t: t.append(payload, tag=tag, node=node))
        svc.metrics.appended(request.match_info["t"], 1)
        # what _ok({"seq": seq}) writes, without an encoder for one integer
        return web.Response(body=b'{"seq":%d}' % seq, content_type="application/json")

    async def batch(request: web.Request) -> web.Response:
        check_query(request, ("incarnation",))
        body = await json_body(request, ("payloads", "records", "tag", "node", "producer"))
        producer = producer_from_json(body.get("producer"))
        if ("payloads" in body) == ("records" in body):
            raise BadArgument("a batch has either 'payloads' or 'records', exactly one (SVC-15)")
        if "payloads" in body:
            raw = body["payloads"]
            if not isinstance(raw, list):
                raise BadArgument("field 'payloads': expected a list (SVC-12)")
            _check_batch(svc, len(raw))
            payloads = [unb64(p, f"payloads[{i}]") for i, p in enumerate(raw)]
            tag, node = field_str(body, "tag", None), field_str(body, "node", None)

            def call(t: Topic) -> list[int]:
                return t.append_many(payloads, tag=tag, node=node, producer=producer)

        else:
            if "tag" in body or "node" in body:
                raise BadArgument("'records' carry their own tag and node (SVC-15)")
            raw = body["records"]
            if not isinstance(raw, list):
                raise BadArgument("field 'records': expected a list (SVC-12)")
            _check_batch(svc, len(raw))
            records = [_record_in(rec, i) for i, rec in enumerate(raw)]

            def call(t: Topic) -> list[int]:
                return t.append_records(records, producer=producer)

        async with admitted(request):
            seqs = await svc.topic_call(request, call)
        svc.metrics.appended(request.match_info["t"], len(seqs))
        return _ok({"seqs": seqs})

    async def read(request: web.Request) -> web.Response:
        check_query(request, ("incarnation", "after", "limit", "exclude_node", "wait_ms"))
        after = query_int(request, "after", 0, 0)
        limit = query_int(request, "limit", 1000, 1)
        wait_ms = query_int(request, "wait_ms", 0, 0)
        exclude = query_str(request, "exclude_node")
        assert after is not None and limit is not None and wait_ms is not None

        def attempt() -> list[Any]:
            return svc.on_topic(
                name, incarnation, lambda t: t.read(after, limit, exclude_node=exclude)
            )

        name = request.match_info["t"]
        incarnation = query_int(request, "incarnation", None, 1)
        items = await svc.wait_change(name, attempt, bool, wait_ms, after)
        return _ok({"items": _items(items), "next_after": _next_after(items, after)})

    async def delete_records(request: web.Request) -> web.Response:
        check_query(request, ("incarnation", "before_seq", "tag", "tag_glob"))
        before = query_int(request, "before_seq", None, 0)
        tag, glob = query_str(request, "tag"), query_str(request, "tag_glob")
        deleted = await svc.topic_call(
            request, lambda t: t.delete(before_seq=before, tag=tag, tag_glob=glob), inline=False
        )
        return _ok({"deleted": deleted})

    async def state(request: web.Request) -> web.Response:
        check_query(request, ("incarnation",))
        return _ok(state_to_json(await svc.topic_call(request, Topic.state)))

    async def changes(request: web.Request) -> web.Response:
        """SVC-21: the change counter once it differs from ``since``, or after ``wait_ms``."""
        check_query(request, ("incarnation", "since", "wait_ms"))
        since = query_int(request, "since", None)
        wait_ms = query_int(request, "wait_ms", 0, 0)
        assert wait_ms is not None
        name = request.match_info["t"]
        incarnation = query_int(request, "incarnation", None, 1)

        def attempt() -> int:
            return svc.on_topic(name, incarnation, Topic.changes)

        if since is None:
            return _ok({"changes": await svc.run(name, None, attempt)})
        value = await svc.wait_change(name, attempt, lambda c: c != since, wait_ms)
        return _ok({"changes": value})

    # -- subscribers ----------------------------------------------------------------------------
    def sub_call(request: web.Request, fn: Any, inline: bool = True) -> Any:
        s = request.match_info["s"]
        return svc.topic_call(request, lambda t: fn(t, s), inline=inline)

    async def list_subscribers(request: web.Request) -> web.Response:
        check_query(request, ("incarnation",))
        return _ok({"subscribers": await svc.topic_call(request, Topic.subscribers)})

    async def put_subscriber(request: web.Request) -> web.Response:
        check_query(request, ("incarnation",))
        body = await json_body(request, ("start",))
        start = field_str(body, "start", "resume")

        def subscribe(t: Topic, s: str) -> dict[str, Any]:
            sub = t.subscribe(s, start)
            return {"name": sub.name, "hwm": sub.hwm}

        return _ok(await sub_call(request, subscribe))

    async def get_subscriber(request: web.Request) -> web.Response:
        check_query(request, ("incarnation",))

        def get(t: Topic, s: str) -> dict[str, Any]:
            sub = t.subscriber(s)
            return {"name": sub.name, "hwm": sub.hwm}

        return _ok(await sub_call(request, get))

    async def delete_subscriber(request: web.Request) -> web.Response:
        check_query(request, ("incarnation",))
        # its progress file goes too (file://): I/O, on a worker thread
        await sub_call(request, lambda t, s: t.subscriber(s).unregister(), inline=False)
        return _no_content()

    async def poll(request: web.Request) -> web.Response:
        check_query(request, ("incarnation",))
        body = await json_body(request, ("max", "wait_ms", "request_id"))
        limit = field_int(body, "max", 100, 1)
        wait_ms = field_int(body, "wait_ms", 0, 0)
        request_id = check_request_id(body.get("request_id"))
        name, s = request.match_info["t"], request.match_info["s"]
        incarnation = query_int(request, "incarnation", None, 1)

        def attempt() -> list[Any]:
            return svc.on_topic(name, incarnation, lambda t: t.subscriber(s).poll(limit))

        async def run() -> web.Response:
            items = await svc.wait_change(name, attempt, bool, wait_ms, 0)
            return _ok({"items": _items(items)})

        return await svc.replays.run(("poll", name, s), request_id, run)

    def resolve(op: str, out: str) -> Any:
        async def handler(request: web.Request) -> web.Response:
            check_query(request, ("incarnation",))
            body = await json_body(request, ("seq",))
            seq = field_int(body, "seq")
            value = await sub_call(request, lambda t, s: getattr(t.subscriber(s), op)(seq))
            return _ok({out: value})

        return handler

    async def flush_subscriber(request: web.Request) -> web.Response:
        check_query(request, ("incarnation",))
        await sub_call(request, lambda t, s: t.subscriber(s).flush(), inline=False)
        return _no_content()

    # -- queue mode -----------------------------------------------------------------------------
    async def claim(request: web.Request) -> web.Response:
        check_query(request, ("incarnation",))
        body = await json_body(request, ("node", "max", "lease_ms", "request_id"))
        node = field_str(body, "node")
        limit = field_int(body, "max", 1, 1)
        lease_ms = field_int(body, "lease_ms", None, 1)
        request_id = check_request_id(body.get("request_id"))

        async def run() -> web.Response:
            leases = await svc.topic_call(
                request, lambda t: t.claim(node, max=limit, lease_ms=lease_ms), after=0
            )
            return _ok({"leases": [lease_to_json(x) for x in leases]})

        key = ("claim", request.match_info["t"], node)
        return await svc.replays.run(key, request_id, run)

    def end_lease(op: str) -> Any:
        async def handler(request: web.Request) -> web.Response:
            check_query(request, ("incarnation",))
            fields = ("seq", "lease_id", "request_id") + (("delay_ms",) if op == "nack" else ())
            body = await json_body(request, fields)
            seq = field_int(body, "seq")
            lease_id = field_int(body, "lease_id")
            kwargs = {"delay_ms": field_int(body, "delay_ms", 0, 0)} if op == "nack" else {}
            request_id = check_request_id(body.get("request_id"))

            async def run() -> web.Response:
                await svc.topic_call(request, lambda t: getattr(t, op)(seq, lease_id, **kwargs))
                return _no_content()

            key = (op, request.match_info["t"], seq)
            return await svc.replays.run(key, request_id, run)

        return handler

    # -- routers --------------------------------------------------------------------------------
    async def list_routers(request: web.Request) -> web.Response:
        """SVC-48: only routers whose source and dest the caller may read."""
        who = svc.principal(request)
        routers = await svc.call(svc.store.routers)
        shown = [
            x.to_dict()
            for x in routers
            if who.can("read", x.config.source) and who.can("read", x.config.dest)
        ]
        return _ok({"routers": shown})

    async def put_router(request: web.Request) -> web.Response:
        body = await json_body(request, _ROUTER_KEYS)
        name = request.match_info["r"]
        kwargs: dict[str, Any] = {
            "filter_tag": field_str(body, "filter_tag", None),
            "exclude_node": field_str(body, "exclude_node", None),
        }
        for key in ("preserve_tag", "preserve_node"):
            kwargs[key] = field_bool(body, key, True)
        kwargs["allow_cycle"] = field_bool(body, "allow_cycle", False)
        source, dest = field_str(body, "source"), field_str(body, "dest")
        for topic in (source, dest):  # SVC-48: admin on both ends
            svc.authz.authorize(svc.principal(request), "admin", topic)
        info = await svc.call(lambda: svc.store.router(name, source, dest, **kwargs))
        return _ok(info.to_dict())

    async def delete_router(request: web.Request) -> web.Response:
        name = request.match_info["r"]
        who = svc.principal(request)
        for info in await svc.call(svc.store.routers):
            if info.name == name:  # SVC-48: admin on both ends
                svc.authz.authorize(who, "admin", info.config.source)
                svc.authz.authorize(who, "admin", info.config.dest)
        dropped = await svc.call(svc.store.drop_router, name)
        return _ok({"dropped": dropped})

    async def put_priority(request: web.Request) -> web.Response:
        body = await json_body(request, ("priority",))
        priority = field_int(body, "priority")
        if not -1000 <= priority <= 1000:
            raise BadArgument(f"priority must be in -1000..1000, got {priority} (SVC-36)")
        await svc.topic_call(request, Topic.state)  # 404 for a topic that does not exist
        assert svc.push is not None
        svc.push.set_priority(request.match_info["t"], priority)
        return _ok({"priority": priority})

    t = "/v0/topics/{t}"
    sub = t + "/subscribers/{s}"
    # SVC-13's table with SVC-48's right of each route ("any": a valid token; "none": health)
    routes = [
        ("GET", "/v0", root, "any"),
        ("GET", "/v0/health", health, "none"),
        ("GET", "/v0/metrics", metrics, "admin"),
        ("GET", "/v0/topics", list_topics, "any"),
        ("PUT", t, put_topic, "admin"),
        ("GET", t, get_topic, "read"),
        ("DELETE", t, delete_topic, "admin"),
        ("POST", "/v0/flush", flush, "admin"),
        ("POST", "/v0/refresh", refresh, "admin"),
        ("POST", t + "/records", append, "write"),
        ("GET", t + "/records", read, "read"),
        ("DELETE", t + "/records", delete_records, "admin"),
        ("POST", t + "/batch", batch, "write"),
        ("GET", t + "/state", state, "read"),
        ("GET", t + "/changes", changes, "read"),
        ("PUT", t + "/priority", put_priority, "admin"),
        ("GET", t + "/subscribers", list_subscribers, "read"),
        ("PUT", sub, put_subscriber, "read"),
        ("GET", sub, get_subscriber, "read"),
        ("DELETE", sub, delete_subscriber, "read"),
        ("POST", sub + "/poll", poll, "read"),
        ("POST", sub + "/ack", resolve("ack", "changed"), "read"),
        ("POST", sub + "/reject", resolve("reject", "changed"), "read"),
        ("POST", sub + "/commit", resolve("commit", "acked"), "read"),
        ("POST", sub + "/flush", flush_subscriber, "read"),
        ("POST", t + "/claim", claim, "read"),
        ("POST", t + "/complete", end_lease("complete"), "read"),
        ("POST", t + "/release", end_lease("release"), "read"),
        ("POST", t + "/nack", end_lease("nack"), "read"),
        ("GET", "/v0/routers", list_routers, "any"),
        ("PUT", "/v0/routers/{r}", put_router, "any"),  # admin on source and dest: below
        ("DELETE", "/v0/routers/{r}", delete_router, "any"),
    ]
    for method, path, handler, right in routes:
        svc.rights[r.add_route(method, path, handler)] = right


def _check_batch(svc: Service, n: int) -> None:
    if n > svc.max_batch:
        raise TooLarge(f"a batch of {n} records is over --max-batch {svc.max_batch} (SVC-15)")


def _record_in(rec: object, i: int) -> tuple[bytes, str | None, str | None]:
    if not isinstance(rec, dict) or not set(rec) <= {"payload", "tag", "node"}:
        raise BadArgument(f"records[{i}]: expected {{'payload', 'tag', 'node'}}, got {rec!r}")
    return (
        unb64(rec.get("payload"), f"records[{i}].payload"),
        field_str(rec, "tag", None),
        field_str(rec, "node", None),
    )


_ROUTER_KEYS = (
    "source",
    "dest",
    "filter_tag",
    "exclude_node",
    "preserve_tag",
    "preserve_node",
    "allow_cycle",
)
