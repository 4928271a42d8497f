"""``RemoteBackend``: the Backend interface over ``tidelog serve``'s HTTP API (SERVICE.md SVC-58).

Every method is one request of SVC-13's table (``Client.call``; repeated only as SVC-60
allows), so ``tidelog.api`` checks arguments and builds its conveniences (``Topic.iter``,
bundles, waits) exactly as over an in-process backend. Every request on a topic carries the
handle's incarnation (SVC-14), so a handle on a dropped topic fails with ``no_such_topic`` as
in process (TOP-10), even once the name is recreated.
"""

from __future__ import annotations

import json
import math
import threading
import uuid
from collections.abc import Callable, Mapping, Sequence
from typing import Any
from urllib.parse import quote, urlencode

from tidelog.backend import Backend, Capabilities, TopicRef
from tidelog.config import TopicConfig
from tidelog.errors import BadOption, StorageError, TidelogError
from tidelog.records import Item, Lease, RouterConfig, RouterInfo, TopicState
from tidelog.service.wire import b64, dumps, item_from_json, lease_from_json, state_from_json

from .client import Client, Request

__all__ = ["RemoteBackend", "capabilities_from_json", "router_from_json"]

#: SVC-16: the longest wait a service holds a request for unless its ``limits`` say otherwise
DEFAULT_MAX_WAIT_MS = 30_000


def capabilities_from_json(obj: Mapping[str, Any]) -> Capabilities:
    """The served store's CAP flags (``GET /v0``, SVC-4); flags this client does not know are
    ignored (SVC-4: responses only gain fields within v0)."""
    fields = Capabilities.__dataclass_fields__
    flags: dict[str, Any] = {k: v for k, v in obj.items() if k in fields}
    if "durability" in flags:
        flags["durability"] = frozenset(flags["durability"])
    return Capabilities(**flags)


def router_from_json(obj: Mapping[str, Any]) -> RouterInfo:
    """``RouterInfo.to_dict()`` read back (SVC-7)."""
    keys = RouterConfig.__dataclass_fields__
    config = RouterConfig(**{k: obj[k] for k in keys if k in obj})
    return RouterInfo(str(obj["name"]), config, int(obj["cursor"]), int(obj["lag"]))


def _config_from_json(obj: Mapping[str, Any]) -> TopicConfig:
    keys = TopicConfig.keys()
    return TopicConfig(**{k: v for k, v in obj.items() if k in keys})


def _name(name: str) -> str:
    return quote(name, safe="")


def _request_id() -> str:
    """SVC-25: 1..64 of ASCII letters, digits, ``_``, ``-``; unique per call."""
    return uuid.uuid4().hex


class RemoteBackend(Backend):
    """A store served by ``tidelog serve``, reached over HTTP."""

    def __init__(self, client: Client, hello: Mapping[str, Any]) -> None:
        self.client = client
        self.hello = dict(hello)
        self.capabilities = capabilities_from_json(hello.get("capabilities") or {})
        limits = hello.get("limits") or {}
        wait = limits.get("max_wait_ms") if isinstance(limits, dict) else None
        self._max_wait_ms = wait if isinstance(wait, int) and wait > 0 else DEFAULT_MAX_WAIT_MS
        # TOP-9: config never changes within an incarnation: name -> the latest incarnation
        # this client saw, and its config (one entry per name, so bounded)
        self._configs: dict[str, tuple[int, TopicConfig]] = {}
        self._configs_lock = threading.Lock()

    # -- plumbing -----------------------------------------------------------------------------
    def _call(self, req: Request, what: str) -> Any:
        return self.client.call(req, what)

    def _topic_req(
        self, method: str, ref: TopicRef, rest: str = "", query: Mapping[str, object] | None = None,
        body: object = None, **kw: Any,
    ) -> Request:  # fmt: skip
        """A request on topic ``ref``'s incarnation (SVC-14)."""
        params: dict[str, object] = {"incarnation": ref.incarnation}
        params.update({k: v for k, v in (query or {}).items() if v is not None})
        return Request(
            method,
            f"/v0/topics/{_name(ref.name)}{rest}",
            query=urlencode(params, quote_via=quote),
            body=None if body is None else dumps(body),
            **kw,
        )

    def _sub_path(self, name: str, rest: str = "") -> str:
        return f"/subscribers/{_name(name)}{rest}"

    def _remember(self, answer: Mapping[str, Any]) -> tuple[TopicRef, TopicConfig]:
        ref = TopicRef(str(answer["name"]), int(answer["incarnation"]))
        config = _config_from_json(answer["config"])
        with self._configs_lock:
            known = self._configs.get(ref.name)
            if known is None or known[0] <= ref.incarnation:
                self._configs[ref.name] = (ref.incarnation, config)
        return ref, config

    # -- store ----------------------------------------------------------------------------------
    def open_topic(self, name: str, options: Mapping[str, object], create: bool) -> TopicRef:
        path = f"/v0/topics/{_name(name)}"
        if not create:  # SVC-13: GET never creates; the keys given must match (TOP-9)
            answer = self._call(Request("GET", path, safe=True), f"topic {name!r}")
            ref, config = self._remember(answer)
            config.check_matches(name, options)
            return ref
        try:
            body = dumps(dict(options))
        except (TypeError, ValueError):
            # not JSON: the config's own parser names the key and value (URI-2), else this
            TopicConfig.parse(options)
            raise BadOption(f"topic {name!r}: options must be JSON values: {options!r}") from None
        answer = self._call(Request("PUT", path, body=body, safe=True), f"topic {name!r}")
        return self._remember(answer)[0]

    def topic_config(self, ref: TopicRef) -> TopicConfig:
        known = self._configs.get(ref.name)
        if known is not None and known[0] == ref.incarnation:
            return known[1]
        # not this life's: ask (404 no_such_topic when it was dropped, TOP-10)
        answer = self._call(self._topic_req("GET", ref, safe=True), f"topic {ref.name!r}")
        return self._remember(answer)[1]

    def list_topics(self) -> list[str]:
        return list(self._call(Request("GET", "/v0/topics", safe=True), "topics")["topics"])

    def drop_topic(self, name: str) -> None:
        req = Request("DELETE", f"/v0/topics/{_name(name)}", safe=True, gone_ok=True)
        self._call(req, f"drop topic {name!r}")
        with self._configs_lock:
            self._configs.pop(name, None)

    def flush(self) -> None:
        self._call(Request("POST", "/v0/flush", safe=True), "flush")

    def refresh(self) -> None:
        self._call(Request("POST", "/v0/refresh", safe=True), "refresh")

    def close(self) -> None:
        self.client.close()

    # -- topic log --------------------------------------------------------------------------------
    def append(
        self,
        ref: TopicRef,
        payloads: Sequence[bytes],
        tag: str | None,
        node: str | None,
        producer: tuple[str, int] | None = None,
    ) -> list[int]:
        body = {"payloads": [b64(p) for p in payloads], "tag": tag, "node": node,
                "producer": _producer(producer)}  # fmt: skip
        return self._batch(ref, body, producer)

    def append_records(
        self,
        ref: TopicRef,
        records: Sequence[tuple[bytes, str | None, str | None]],
        producer: tuple[str, int] | None = None,
    ) -> list[int]:
        rows = [{"payload": b64(p), "tag": tag, "node": node} for p, tag, node in records]
        return self._batch(ref, {"records": rows, "producer": _producer(producer)}, producer)

    def _batch(
        self, ref: TopicRef, body: dict[str, Any], producer: tuple[str, int] | None
    ) -> list[int]:
        # SVC-24: a producer batch is applied at most once, so it is safe to repeat
        req = self._topic_req("POST", ref, "/batch", body=body, safe=producer is not None)
        return [int(s) for s in self._call(req, f"append to {ref.name!r}")["seqs"]]

    def lane(self, ref: TopicRef) -> Callable[[bytes], int | None]:
        """SVC-6: the raw append, the payload as the body byte for byte (the service checks
        and refuses as ``append`` would, so the lane takes every record)."""
        what = f"append to {ref.name!r}"

        def append(payload: bytes) -> int | None:
            req = self._topic_req("POST", ref, "/records", content_type="application/octet-stream")
            req.body = payload
            return int(self._call(req, what)["seq"])

        return append

    def read(self, ref: TopicRef, after: int, limit: int, exclude_node: str | None) -> list[Item]:
        query = {"after": after, "limit": limit, "exclude_node": exclude_node}
        answer = self._call(self._topic_req("GET", ref, "/records", query, safe=True),
                            f"read {ref.name!r}")  # fmt: skip
        return [item_from_json(i) for i in answer["items"]]

    def state(self, ref: TopicRef) -> TopicState:
        answer = self._call(self._topic_req("GET", ref, "/state", safe=True), f"{ref.name!r}")
        return state_from_json(answer)

    def delete(
        self, ref: TopicRef, before_seq: int | None, tag: str | None, tag_glob: str | None
    ) -> int:
        # not safe to repeat: a repeat removes what matches then (SVC-23)
        query = {"before_seq": before_seq, "tag": tag, "tag_glob": tag_glob}
        req = self._topic_req("DELETE", ref, "/records", query)
        return int(self._call(req, f"delete from {ref.name!r}")["deleted"])

    # -- subscribers ------------------------------------------------------------------------------
    def subscribe(self, ref: TopicRef, name: str, start: str) -> None:
        req = self._topic_req("PUT", ref, self._sub_path(name), body={"start": start}, safe=True)
        self._call(req, f"subscribe {name!r} to {ref.name!r}")

    def subscribers(self, ref: TopicRef) -> list[str]:
        req = self._topic_req("GET", ref, "/subscribers", safe=True)
        return list(self._call(req, f"subscribers of {ref.name!r}")["subscribers"])

    def poll(self, ref: TopicRef, name: str, limit: int) -> list[Item]:
        body = {"max": limit, "request_id": _request_id()}  # SVC-25: the repeat is a replay
        req = self._topic_req("POST", ref, self._sub_path(name, "/poll"), body=body, safe=True)
        return [item_from_json(i) for i in self._call(req, f"poll {name!r}")["items"]]

    def _resolve(self, ref: TopicRef, name: str, op: str, seq: int) -> Any:
        # SVC-23: resolving a resolved seq changes nothing
        req = self._topic_req("POST", ref, self._sub_path(name, f"/{op}"), body={"seq": seq},
                              safe=True)  # fmt: skip
        return self._call(req, f"{op} {seq} for {name!r}")

    def ack(self, ref: TopicRef, name: str, seq: int) -> bool:
        return bool(self._resolve(ref, name, "ack", seq)["changed"])

    def reject(self, ref: TopicRef, name: str, seq: int) -> bool:
        return bool(self._resolve(ref, name, "reject", seq)["changed"])

    def commit(self, ref: TopicRef, name: str, seq: int) -> int:
        return int(self._resolve(ref, name, "commit", seq)["acked"])

    def hwm(self, ref: TopicRef, name: str) -> int:
        req = self._topic_req("GET", ref, self._sub_path(name), safe=True)
        return int(self._call(req, f"subscriber {name!r}")["hwm"])

    def flush_subscriber(self, ref: TopicRef, name: str) -> None:
        req = self._topic_req("POST", ref, self._sub_path(name, "/flush"), safe=True)
        self._call(req, f"flush subscriber {name!r}")

    def unregister(self, ref: TopicRef, name: str) -> None:
        req = self._topic_req("DELETE", ref, self._sub_path(name), safe=True, gone_ok=True)
        self._call(req, f"unregister {name!r}")

    # -- queue mode -------------------------------------------------------------------------------
    def claim(self, ref: TopicRef, node: str, limit: int, lease_ms: int | None) -> list[Lease]:
        body = {"node": node, "max": limit, "lease_ms": lease_ms, "request_id": _request_id()}
        req = self._topic_req("POST", ref, "/claim", body=body, safe=True)
        return [lease_from_json(x) for x in self._call(req, f"claim {ref.name!r}")["leases"]]

    def _finish(self, ref: TopicRef, op: str, seq: int, lease_id: int, **extra: int) -> None:
        body = {"seq": seq, "lease_id": lease_id, **extra, "request_id": _request_id()}
        req = self._topic_req("POST", ref, f"/{op}", body=body, safe=True)
        self._call(req, f"{op} seq {seq} of {ref.name!r}")

    def complete(self, ref: TopicRef, seq: int, lease_id: int) -> None:
        self._finish(ref, "complete", seq, lease_id)

    def release(self, ref: TopicRef, seq: int, lease_id: int) -> None:
        self._finish(ref, "release", seq, lease_id)

    def nack(self, ref: TopicRef, seq: int, lease_id: int, delay_ms: int) -> None:
        self._finish(ref, "nack", seq, lease_id, delay_ms=delay_ms)

    # -- routers ----------------------------------------------------------------------------------
    def router(self, name: str, config: RouterConfig) -> RouterInfo:
        req = Request("PUT", f"/v0/routers/{_name(name)}", body=dumps(config.to_dict()),
                      safe=True)  # fmt: skip
        return router_from_json(self._call(req, f"router {name!r}"))

    def list_routers(self) -> list[RouterInfo]:
        answer = self._call(Request("GET", "/v0/routers", safe=True), "routers")
        return [router_from_json(r) for r in answer["routers"]]

    def drop_router(self, name: str) -> bool:
        req = Request("DELETE", f"/v0/routers/{_name(name)}", safe=True)
        return bool(self._call(req, f"drop router {name!r}")["dropped"])

    # -- change notification (SVC-21, SVC-59) -----------------------------------------------------
    def changes(self, ref: TopicRef) -> int:
        req = self._topic_req("GET", ref, "/changes", safe=True)
        return int(self._call(req, f"changes of {ref.name!r}")["changes"])

    def wait(self, ref: TopicRef, since: int, timeout: float) -> None:
        """Until the served topic's counter differs from ``since``, woken by the served store's
        notification (CON-3); at most the service's longest wait per request (the caller
        loops). Waking early is allowed: a failure here is left to the caller's next try."""
        wait_ms = min(max(math.ceil(timeout * 1000), 0), self._max_wait_ms)
        req = self._topic_req("GET", ref, "/changes", {"since": since, "wait_ms": wait_ms},
                              safe=True, wait_ms=wait_ms)  # fmt: skip
        try:
            self._call(req, f"wait on {ref.name!r}")
        except TidelogError:
            return

    # -- introspection ----------------------------------------------------------------------------
    def describe(self) -> dict[str, object]:
        return {
            "backend": "remote",
            "address": str(self.client.address),
            "api": self.hello.get("api"),
            "server": self.hello.get("tidelog"),
            "limits": self.hello.get("limits"),
        }


def _producer(producer: tuple[str, int] | None) -> dict[str, object] | None:
    return None if producer is None else {"id": producer[0], "seq": producer[1]}


def open_remote(client: Client) -> RemoteBackend:
    """``GET /v0`` (SVC-4): the API version and the served store's capabilities."""
    try:
        hello = client.call(Request("GET", "/v0", safe=True), f"open {client.address}")
    except TidelogError:
        client.close()
        raise
    if not isinstance(hello, dict) or hello.get("api") != "v0":
        client.close()
        raise StorageError(
            f"{client.address} does not serve tidelog's API v0 (GET /v0 answered "
            f"{json.dumps(hello)[:200]}) (SVC-4)"
        )
    return RemoteBackend(client, hello)
