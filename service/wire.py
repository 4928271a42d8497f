"""The service's wire encoding (spec/SERVICE.md SVC-5..SVC-10), shared by the server
(service/app.py) and the remote backend (backends/remote): JSON objects, payloads in base64,
errors as ``{"error": {"code", "message"}}`` with one HTTP status per code.

Nothing here does I/O or imports an HTTP stack, so the client side needs no aiohttp.
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Mapping
from typing import Any

from tidelog.errors import ERROR_CODES, BadArgument, TidelogError
from tidelog.records import Item, Lease, Record, Tombstone, TopicState

__all__ = [
    "STATUS",
    "RETRY_CODES",
    "b64",
    "unb64",
    "item_to_json",
    "item_from_json",
    "lease_to_json",
    "lease_from_json",
    "state_to_json",
    "state_from_json",
    "error_json",
    "error_from_json",
    "dumps",
    "loads",
]

#: SVC-10: one status per code. Codes absent here (a code newer than this table) answer 500.
STATUS: dict[str, int] = {
    "bad_argument": 400,
    "bad_name": 400,
    "bad_option": 400,
    "bad_uri": 400,
    "unknown_scheme": 400,
    "unauthorized": 401,
    "forbidden": 403,
    "no_such_topic": 404,
    "no_such_subscriber": 404,
    "not_found": 404,
    "method_not_allowed": 405,
    "request_timeout": 408,
    "config_mismatch": 409,
    "router_dest_fan_in": 409,
    "lease_lost": 409,
    "read_only": 409,
    "too_large": 413,
    "unsupported_media_type": 415,
    "topic_full": 422,
    "backpressure": 429,
    "throttled": 429,
    "headers_too_large": 431,
    "corrupt": 500,
    "io_error": 500,
    "internal": 500,
    "not_available": 501,
    "closed": 503,
    "locked": 503,
    "busy": 503,
    "store_full": 507,
}

#: SVC-10: the codes answered with ``Retry-After`` (the client may repeat after it, SVC-11).
RETRY_CODES = frozenset({"backpressure", "throttled", "closed", "locked", "busy"})


def b64(data: bytes) -> str:
    """SVC-5: standard base64 with padding."""
    return base64.b64encode(data).decode("ascii")


def unb64(text: object, field: str) -> bytes:
    if not isinstance(text, str):
        raise BadArgument(f"{field}: expected a base64 string, got {type(text).__name__} (SVC-5)")
    try:
        return base64.b64decode(text.encode("ascii"), validate=True)
    except (binascii.Error, UnicodeEncodeError, ValueError):
        raise BadArgument(f"{field}: not standard base64 with padding (SVC-5)") from None


def item_to_json(item: Item) -> dict[str, Any]:
    """SVC-7: a record keeps its five fields; a tombstone is told apart by having no ``seq``."""
    if isinstance(item, Tombstone):
        return {"gap_from": item.gap_from, "gap_to": item.gap_to}
    return {
        "seq": item.seq,
        "ts": item.ts,
        "tag": item.tag,
        "node": item.node,
        "payload": b64(item.payload),
    }


def item_from_json(obj: Mapping[str, Any]) -> Item:
    if "seq" in obj:
        return Record(
            int(obj["seq"]),
            int(obj["ts"]),
            obj.get("tag"),
            obj.get("node"),
            unb64(obj["payload"], "payload"),
        )
    return Tombstone(int(obj["gap_from"]), int(obj["gap_to"]))


def lease_to_json(lease: Lease) -> dict[str, Any]:
    return {
        "seq": lease.seq,
        "lease_id": lease.lease_id,
        "deadline_ms": lease.deadline_ms,
        "deliveries": lease.deliveries,
        "record": item_to_json(lease.record),
    }


def lease_from_json(obj: Mapping[str, Any]) -> Lease:
    record = item_from_json(obj["record"])
    assert isinstance(record, Record)
    return Lease(
        int(obj["seq"]),
        int(obj["lease_id"]),
        int(obj["deadline_ms"]),
        int(obj["deliveries"]),
        record,
    )


_STATE_FIELDS = ("head_seq", "earliest_seq", "evict_floor", "count", "bytes")


def state_to_json(state: TopicState) -> dict[str, int]:
    return {f: getattr(state, f) for f in _STATE_FIELDS}


def state_from_json(obj: Mapping[str, Any]) -> TopicState:
    return TopicState(**{f: int(obj[f]) for f in _STATE_FIELDS})


def error_json(code: str, message: str, retry_after_ms: int | None = None) -> dict[str, Any]:
    """SVC-9: the body of every answer with a status of 400 or more."""
    err: dict[str, Any] = {"code": code, "message": message}
    if retry_after_ms is not None:
        err["retry_after_ms"] = retry_after_ms
    return {"error": err}


def error_from_json(status: int, body: bytes) -> TidelogError:
    """SVC-9: the exception an error answer stands for, of the class its code names (ERR-1), so
    a failure raises the same class over HTTP as in process."""
    try:
        err = json.loads(body)["error"]
        code, message = str(err["code"]), str(err["message"])
    except (ValueError, KeyError, TypeError):
        text = body[:200].decode("utf-8", "replace")
        return TidelogError(f"HTTP {status} without an error body (SVC-9): {text!r}")
    cls = ERROR_CODES.get(code)
    exc = cls(message) if cls is not None else TidelogError(message)
    if cls is None:
        exc.code = code  # a code newer than this client: kept, so callers can still branch on it
    retry = err.get("retry_after_ms") if isinstance(err, dict) else None
    if isinstance(retry, int):
        exc.retry_after_ms = retry  # type: ignore[attr-defined]
    return exc


#: ``json.dumps`` with arguments builds an encoder per call; this one is built once
_ENCODE = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False).encode


def dumps(obj: object) -> bytes:
    return _ENCODE(obj).encode("utf-8")


def loads(body: bytes, what: str = "request body") -> Any:
    """SVC-12: invalid JSON is ``bad_argument``, never a crash."""
    try:
        return json.loads(body)
    except (ValueError, UnicodeDecodeError) as exc:
        raise BadArgument(f"{what}: not valid JSON ({exc}) (SVC-12)") from None
