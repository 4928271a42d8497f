"""The conformance driver protocol (spec/CONFORMANCE.md §3): JSON lines over stdin/stdout.

One request per line from the runner, one response per line from the driver, in order:

    {"id": 7, "op": "append", "topic": "t0", "payload": "aGk=", "tag": null, "node": null}
    {"id": 7, "ok": true, "value": 3}
    {"id": 8, "ok": false, "code": "topic_full", "message": "..."}

Bytes travel as base64 text. Records and tombstones travel as objects with a "type". This module
holds the encodings both sides share; ``remote.py`` is the runner's side, ``driver.py`` tidelog's
own driver.
"""

from __future__ import annotations

import base64
from typing import Any

from tidelog.records import Item, Lease, Record, RouterConfig, RouterInfo, Tombstone, TopicState

__all__ = ["PROTOCOL", "VERSION", "b64", "unb64", "item_to_json", "item_from_json",
           "lease_to_json", "lease_from_json", "state_to_json", "state_from_json",
           "router_to_json", "router_from_json"]

PROTOCOL = "tidelog-conformance"
VERSION = 1


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def unb64(text: str) -> bytes:
    return base64.b64decode(text.encode("ascii"), validate=True)


def item_to_json(item: Item) -> dict[str, Any]:
    if isinstance(item, Tombstone):
        return {"type": "tombstone", "gap_from": item.gap_from, "gap_to": item.gap_to}
    return {"type": "record", "seq": item.seq, "ts": item.ts, "tag": item.tag,
            "node": item.node, "payload": b64(item.payload)}


def item_from_json(obj: dict[str, Any]) -> Item:
    if obj["type"] == "tombstone":
        return Tombstone(int(obj["gap_from"]), int(obj["gap_to"]))
    return Record(int(obj["seq"]), int(obj["ts"]), obj["tag"], obj["node"], unb64(obj["payload"]))


def lease_to_json(lease: Lease) -> dict[str, Any]:
    return {"seq": lease.seq, "lease_id": lease.lease_id, "deadline_ms": lease.deadline_ms,
            "deliveries": lease.deliveries, "record": item_to_json(lease.record)}


def lease_from_json(obj: dict[str, Any]) -> Lease:
    record = item_from_json(obj["record"])
    assert isinstance(record, Record)
    return Lease(int(obj["seq"]), int(obj["lease_id"]), int(obj["deadline_ms"]),
                 int(obj["deliveries"]), record)


def state_to_json(st: TopicState) -> dict[str, int]:
    return st.to_dict()


def state_from_json(obj: dict[str, Any]) -> TopicState:
    return TopicState(int(obj["head_seq"]), int(obj["earliest_seq"]), int(obj["evict_floor"]),
                      int(obj["count"]), int(obj["bytes"]))


def router_to_json(info: RouterInfo) -> dict[str, Any]:
    return {"name": info.name, "config": info.config.to_dict(), "cursor": info.cursor,
            "lag": info.lag}


def router_from_json(obj: dict[str, Any]) -> RouterInfo:
    return RouterInfo(str(obj["name"]), RouterConfig(**obj["config"]), int(obj["cursor"]),
                      int(obj["lag"]))
