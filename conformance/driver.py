"""tidelog's own conformance driver: ``tidelog conformance driver --uri TEMPLATE``.

It speaks the driver protocol (spec/CONFORMANCE.md §3) on stdin/stdout: one JSON request per
line in, one JSON response per line out, in order. Each request is executed through tidelog's
public API on the store ``TEMPLATE.format(name=...)`` (e.g. ``memory://{name}`` or
``file:///conf/{name}?background=false``), held by a ``LocalSut``. Every request may carry the
runner's clock (``now``); the store's injected clock is set to it first, so time-dependent
rules (TTL, leases) are exact. Other implementations write the same loop around their own API.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from typing import IO, Any

from tidelog.api import Subscriber, Topic
from tidelog.clock import FakeClock
from tidelog.errors import BadArgument, Closed, NotAvailable, TidelogError

from .forwarding import SlotSender
from .protocol import (
    PROTOCOL,
    VERSION,
    b64,
    item_to_json,
    lease_to_json,
    router_to_json,
    state_to_json,
    unb64,
)
from .sut import LocalSut

__all__ = ["Driver", "OPS", "serve", "make_driver"]

OPS = (
    "hello", "open", "close", "crash", "dispose", "capabilities",
    "topic", "topics", "drop_topic", "flush", "config",
    "append", "append_many", "append_records", "read", "state", "delete",
    "subscribe", "subscribers", "poll", "ack", "reject", "commit", "hwm", "flush_sub",
    "unregister", "claim", "complete", "release", "nack",
    "router", "routers", "drop_router",
    "ring_head",
    "sf_open", "sf_publish", "sf_connect", "sf_send", "sf_ok", "sf_durable_ack", "sf_error",
    "sf_close_code", "sf_disconnect", "sf_state", "sf_reopen", "sf_crash",
)  # fmt: skip


class Driver:
    """Executes protocol requests on a ``LocalSut``. ``handle(request) -> response``."""

    def __init__(self, sut: LocalSut) -> None:
        self.sut = sut
        self.clock = FakeClock(0)
        self.store: Any = None
        self.name = ""
        self.handles: dict[int, Topic] = {}
        self.sender: SlotSender | None = None
        self.slot = ""

    # -- helpers ---------------------------------------------------------------------------
    def _store(self) -> Any:
        if self.store is None:
            raise Closed("no store is open (send an 'open' request first)")
        return self.store

    def _topic(self, req: dict[str, Any]) -> Topic:
        try:
            return self.handles[int(req["handle"])]
        except KeyError:
            raise BadArgument(f"unknown topic handle {req.get('handle')!r}") from None

    def _sub(self, req: dict[str, Any]) -> Subscriber:
        return Subscriber(self._topic(req), req["sub"])

    def _sender(self) -> SlotSender:
        if self.sender is None:
            raise Closed("no SF slot is open (send an 'sf_open' request first)")
        return self.sender

    @staticmethod
    def _producer(req: dict[str, Any]) -> tuple[str, int] | None:
        p = req.get("producer")
        return None if p is None else (p[0], p[1])

    # -- dispatch --------------------------------------------------------------------------
    def handle(self, req: dict[str, Any]) -> dict[str, Any]:
        rid = req.get("id")
        if "now" in req:
            self.clock.set(int(req["now"]))
        op = req.get("op")
        handler: Callable[[dict[str, Any]], Any] | None = getattr(self, f"op_{op}", None)
        if handler is None or op not in OPS:
            message = f"unknown op {op!r}"
            return {"id": rid, "ok": False, "code": "not_available", "message": message}
        seed = req.get("crash_seed")
        try:
            if seed is not None:  # power loss inside this op: no result (spec §3.4)
                events = self.sut.crash_during(int(seed), lambda: handler(req))
                self._forget_store()
                out: dict[str, Any] = {"id": rid, "ok": True, "value": None, "crashed": True}
                if events:
                    out["ring_evictions"] = [e.to_json() for e in events]
                return out
            resp: dict[str, Any] = {"id": rid, "ok": True, "value": handler(req)}
        except TidelogError as exc:
            resp = {"id": rid, "ok": False, "code": exc.code, "message": exc.message}
        except (KeyError, TypeError, ValueError, IndexError) as exc:
            resp = {"id": rid, "ok": False, "code": "bad_argument", "message": repr(exc)}
        events = self.sut.ring_evictions()  # also those a close wrote (the last page)
        if events:
            resp["ring_evictions"] = [e.to_json() for e in events]
        return resp

    def _forget_store(self) -> None:
        self.store = None
        self.handles = {}

    # -- store lifecycle -------------------------------------------------------------------
    def op_hello(self, req: dict[str, Any]) -> dict[str, Any]:
        return {
            "protocol": PROTOCOL,
            "version": VERSION,
            "implementation": self.sut.hello["implementation"],
            "ops": list(OPS),
            "reopen": self.sut.hello["reopen"],
            "crash": list(self.sut.hello["crash"]),
        }

    def op_open(self, req: dict[str, Any]) -> dict[str, Any]:
        if self.store is not None:
            self.store.close()
        self._forget_store()
        self.name = str(req["name"])
        self.store = self.sut.open(self.name, self.clock)
        return {
            "capabilities": self.store.capabilities.to_dict(),
            "ring_pages": self.sut.ring_pages(),
        }

    def op_capabilities(self, req: dict[str, Any]) -> dict[str, object]:
        return dict(self._store().capabilities.to_dict())

    def op_close(self, req: dict[str, Any]) -> None:
        if self.store is not None:
            self.store.close()
        self._forget_store()

    def op_crash(self, req: dict[str, Any]) -> None:
        self._store()
        try:
            self.sut.crash(int(req.get("seed", 0)))
        finally:
            self._forget_store()

    def op_dispose(self, req: dict[str, Any]) -> None:
        self.sut.dispose(str(req["name"]))
        self._forget_store()
        self.sender = None

    def op_topic(self, req: dict[str, Any]) -> str:
        topic = self._store().topic(req["name"], create=req.get("create", True),
                                    **req.get("config") or {})
        self.handles[int(req["handle"])] = topic
        return str(topic.name)

    def op_topics(self, req: dict[str, Any]) -> list[str]:
        return list(self._store().topics())

    def op_drop_topic(self, req: dict[str, Any]) -> None:
        self._store().drop_topic(req["name"])

    def op_flush(self, req: dict[str, Any]) -> None:
        self._store().flush()

    def op_config(self, req: dict[str, Any]) -> dict[str, Any]:
        return self._topic(req).config.to_dict()

    # -- log -------------------------------------------------------------------------------
    def op_append(self, req: dict[str, Any]) -> int:
        return self._topic(req).append(unb64(req["payload"]), tag=req.get("tag"),
                                       node=req.get("node"))

    def op_append_many(self, req: dict[str, Any]) -> list[int]:
        return self._topic(req).append_many([unb64(p) for p in req["payloads"]],
                                            tag=req.get("tag"), node=req.get("node"),
                                            producer=self._producer(req))

    def op_append_records(self, req: dict[str, Any]) -> list[int]:
        records = [(unb64(p), tag, node) for p, tag, node in req["records"]]
        return self._topic(req).append_records(records, producer=self._producer(req))

    def op_read(self, req: dict[str, Any]) -> list[dict[str, Any]]:
        items = self._topic(req).read(req.get("after", 0), req.get("limit", 1000),
                                      exclude_node=req.get("exclude_node"))
        return [item_to_json(i) for i in items]

    def op_state(self, req: dict[str, Any]) -> dict[str, int]:
        return state_to_json(self._topic(req).state())

    def op_delete(self, req: dict[str, Any]) -> int:
        return self._topic(req).delete(req.get("before_seq"), tag=req.get("tag"),
                                       tag_glob=req.get("tag_glob"))

    # -- subscribers -----------------------------------------------------------------------
    def op_subscribe(self, req: dict[str, Any]) -> int:
        return self._topic(req).subscribe(req["sub"], start=req.get("start", "resume")).hwm

    def op_subscribers(self, req: dict[str, Any]) -> list[str]:
        return self._topic(req).subscribers()

    def op_poll(self, req: dict[str, Any]) -> list[dict[str, Any]]:
        return [item_to_json(i) for i in self._sub(req).poll(req.get("max", 100))]

    def op_ack(self, req: dict[str, Any]) -> bool:
        return self._sub(req).ack(req["seq"])

    def op_reject(self, req: dict[str, Any]) -> bool:
        return self._sub(req).reject(req["seq"])

    def op_commit(self, req: dict[str, Any]) -> int:
        return self._sub(req).commit(req["seq"])

    def op_hwm(self, req: dict[str, Any]) -> int:
        return self._sub(req).hwm

    def op_flush_sub(self, req: dict[str, Any]) -> None:
        self._sub(req).flush()

    def op_unregister(self, req: dict[str, Any]) -> None:
        self._sub(req).unregister()

    # -- queue -----------------------------------------------------------------------------
    def op_claim(self, req: dict[str, Any]) -> list[dict[str, Any]]:
        leases = self._topic(req).claim(req["node"], max=req.get("max", 1),
                                        lease_ms=req.get("lease_ms"))
        return [lease_to_json(lease) for lease in leases]

    def op_complete(self, req: dict[str, Any]) -> None:
        self._topic(req).complete(req["seq"], req["lease_id"])

    def op_release(self, req: dict[str, Any]) -> None:
        self._topic(req).release(req["seq"], req["lease_id"])

    def op_nack(self, req: dict[str, Any]) -> None:
        self._topic(req).nack(req["seq"], req["lease_id"], delay_ms=req.get("delay_ms", 0))

    # -- ring head detection (RING-3..RING-5) ----------------------------------------------
    # -- routers (RTR) ---------------------------------------------------------------------
    def op_router(self, req: dict[str, Any]) -> dict[str, Any]:
        info = self._store().router(
            req["name"], req["source"], req["dest"], filter_tag=req.get("filter_tag"),
            exclude_node=req.get("exclude_node"), preserve_tag=req.get("preserve_tag", True),
            preserve_node=req.get("preserve_node", True),
            allow_cycle=req.get("allow_cycle", False),
        )  # fmt: skip
        return router_to_json(info)

    def op_routers(self, req: dict[str, Any]) -> list[dict[str, Any]]:
        return [router_to_json(info) for info in self._store().routers()]

    def op_drop_router(self, req: dict[str, Any]) -> bool:
        return bool(self._store().drop_router(req["name"]))

    def op_ring_head(self, req: dict[str, Any]) -> dict[str, int] | None:
        seqs = [None if s is None else int(s) for s in req["seqs"]]
        got = self.sut.ring_head(int(req["pages"]), seqs)
        return None if got is None else {"index": got[0], "parity": got[1]}

    # -- store-and-forward sender (FSN) ----------------------------------------------------
    def op_sf_open(self, req: dict[str, Any]) -> dict[str, object]:
        self.slot = str(req["slot"])
        self.sender = self.sut.sender(self.slot)
        return self.sender.state()

    def op_sf_publish(self, req: dict[str, Any]) -> list[int]:
        return self._sender().publish([unb64(p) for p in req["payloads"]])

    def op_sf_connect(self, req: dict[str, Any]) -> None:
        self._sender().connect(bool(req.get("durable", False)))

    def op_sf_send(self, req: dict[str, Any]) -> list[dict[str, Any]]:
        frames = self._sender().send(int(req.get("max", 1)))
        return [{"fsn": fsn, "payload": b64(p)} for fsn, p in frames]

    def op_sf_ok(self, req: dict[str, Any]) -> None:
        self._sender().on_ok(int(req["sequence"]), dict(req.get("tables") or {}))

    def op_sf_durable_ack(self, req: dict[str, Any]) -> None:
        self._sender().on_durable_ack(dict(req.get("tables") or {}))

    def op_sf_error(self, req: dict[str, Any]) -> None:
        self._sender().on_error(int(req["status"]), int(req["sequence"]))

    def op_sf_close_code(self, req: dict[str, Any]) -> None:
        self._sender().on_close(int(req["code"]))

    def op_sf_disconnect(self, req: dict[str, Any]) -> None:
        self._sender().disconnect()

    def op_sf_state(self, req: dict[str, Any]) -> dict[str, object]:
        return self._sender().state()

    def op_sf_reopen(self, req: dict[str, Any]) -> dict[str, object]:
        self._sender().close()
        return self.op_sf_open({"slot": self.slot})

    def op_sf_crash(self, req: dict[str, Any]) -> dict[str, object]:
        self._sender()
        self.sender = None
        self.sut.sender_crash(int(req.get("seed", 0)))
        return self.op_sf_open({"slot": self.slot})


def serve(driver: Driver, stdin: IO[str] | None = None, stdout: IO[str] | None = None) -> int:
    """The driver's main loop: one JSON request per line in, one response per line out."""
    src = stdin or sys.stdin
    dst = stdout or sys.stdout
    for line in src:
        line = line.strip()
        if not line:
            continue
        try:
            req = json.loads(line)
            if not isinstance(req, dict):
                raise BadArgument("a request is a JSON object")
            resp = driver.handle(req)
        except (ValueError, BadArgument) as exc:
            resp = {"id": None, "ok": False, "code": "bad_argument", "message": str(exc)}
        dst.write(json.dumps(resp) + "\n")
        dst.flush()
    driver.sut.shutdown()
    return 0


def make_driver(template: str, *, fs: str = "os", http: bool = False) -> Driver:
    """tidelog's driver for stores ``template.format(name=...)``; with ``http`` each is served
    by the service and driven through the remote backend (``ServedSut``, CNF-24)."""
    if "{name}" not in template:
        raise BadArgument(f"the store template needs {{name}}: {template!r}")
    if fs not in ("os", "recording"):
        raise NotAvailable(f"--fs must be 'os' or 'recording', not {fs!r}")
    if http:
        from .served import ServedSut

        return Driver(ServedSut(template, fs=fs))
    return Driver(LocalSut(template, fs=fs))  # type: ignore[arg-type]

