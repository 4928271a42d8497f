"""tidelog's own conformance driver: ``tidelog conformance driver --uri TEMPLATE``.

It speaks the driver protocol (spec/CONFORMANCE.md §3) on stdin/stdout and executes each request
through tidelog's public API against the store ``TEMPLATE.format(name=...)`` (e.g.
``memory://{name}`` or ``file:///tmp/conf/{name}?background=false``). Every request carries the
runner's clock (``now``); the driver's injected clock is set to it first, so time-dependent rules
(TTL, leases) are exact. Other implementations write the same loop around their own API.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from importlib import import_module
from collections.abc import Callable
from typing import IO, Any

import tidelog
from tidelog.api import Store, Subscriber, Topic
from tidelog.clock import FakeClock
from tidelog.errors import BadArgument, NotAvailable, TidelogError
from tidelog.uri import parse_uri

from .protocol import (
    PROTOCOL,
    VERSION,
    item_to_json,
    lease_to_json,
    state_to_json,
    unb64,
)

__all__ = ["Driver", "serve"]

OPS = (
    "hello", "open", "close", "crash", "topic", "topics", "drop_topic", "flush", "config",
    "append", "append_many", "append_records", "read", "state", "delete", "subscribe",
    "subscribers", "poll", "ack", "reject", "commit", "hwm", "flush_sub", "unregister", "claim",
    "complete", "release", "nack", "capabilities", "dispose",
)  # fmt: skip


class Driver:
    def __init__(self, template: str) -> None:
        self.template = template
        self.clock = FakeClock(0)
        self.store: Store | None = None
        self.name = ""

    # -- helpers ---------------------------------------------------------------------------
    def _store(self) -> Store:
        if self.store is None:
            raise tidelog.Closed("no store is open (send an 'open' request first)")
        return self.store

    def _topic(self, req: dict[str, Any]) -> Topic:
        return self._store().topic(req["topic"], create=False)

    def _sub(self, req: dict[str, Any]) -> Subscriber:
        return Subscriber(self._topic(req), req["sub"])

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
            return {"id": rid, "ok": False, "code": "not_available", "message": f"unknown op {op!r}"}
        try:
            return {"id": rid, "ok": True, "value": handler(req)}
        except TidelogError as exc:
            return {"id": rid, "ok": False, "code": exc.code, "message": exc.message}
        except (KeyError, TypeError, ValueError) as exc:
            return {"id": rid, "ok": False, "code": "bad_argument", "message": repr(exc)}

    # -- store lifecycle -------------------------------------------------------------------
    def op_hello(self, req: dict[str, Any]) -> dict[str, Any]:
        scheme = self.template.split(":", 1)[0]
        return {"protocol": PROTOCOL, "version": VERSION,
                "implementation": f"tidelog {tidelog.__version__} ({self.template})",
                "ops": list(OPS), "reopen": True, "crash": scheme in ("file", "blockdev")}

    def op_open(self, req: dict[str, Any]) -> dict[str, Any]:
        if self.store is not None:
            self.store.close()
        self.name = req["name"]
        self.store = tidelog.open(self.template.format(name=self.name), clock=self.clock)
        return self.store.capabilities.to_dict()

    def op_capabilities(self, req: dict[str, Any]) -> dict[str, Any]:
        return self._store().capabilities.to_dict()

    def op_close(self, req: dict[str, Any]) -> None:
        if self.store is not None:
            self.store.close()
        self.store = None

    def op_crash(self, req: dict[str, Any]) -> None:
        """Power loss: drop everything unsynced (file backend: abandon, as if killed). The model
        has no unsynced state once the runner has flushed (it always does), so its crash is a
        close."""
        store = self._store()
        abandon = getattr(store._backend, "abandon", None)
        if abandon is not None:
            abandon()
        elif self.template.startswith("model:"):
            store.close()
        else:
            raise NotAvailable("this store cannot simulate a crash")
        self.store = None

    def op_dispose(self, req: dict[str, Any]) -> None:
        """Close the store named ``name`` and delete its data (the runner's example is over)."""
        if self.store is not None and self.name == req["name"]:
            self.store.close()
            self.store = None
        uri = parse_uri(self.template.format(name=req["name"]))
        if uri.scheme in ("memory", "model"):
            import_module(f"tidelog.{'model' if uri.scheme == 'model' else 'backends.memory'}"
                          ).forget(uri.location)
        elif uri.scheme == "file":
            shutil.rmtree(uri.location, ignore_errors=True)
        elif uri.scheme == "blockdev" and os.path.isfile(uri.location):
            os.unlink(uri.location)  # an image file; never a real device

    def op_topic(self, req: dict[str, Any]) -> str:
        return self._store().topic(req["name"], create=req.get("create", True),
                                   **req.get("config", {})).name

    def op_topics(self, req: dict[str, Any]) -> list[str]:
        return self._store().topics()

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


def serve(template: str, stdin: IO[str] | None = None, stdout: IO[str] | None = None,
          driver_factory: Callable[[str], Driver] = Driver) -> int:
    """The driver's main loop: one JSON request per line in, one response per line out."""
    src = stdin or sys.stdin
    dst = stdout or sys.stdout
    driver = driver_factory(template)
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
    if driver.store is not None:
        driver.store.close()
    return 0
