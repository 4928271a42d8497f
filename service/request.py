"""Reading a request's arguments (SVC-5, SVC-8, SVC-12): query integers and strings, JSON
bodies with a fixed set of fields, each malformed value a ``bad_argument`` naming it."""

from __future__ import annotations

import asyncio
from collections.abc import Collection
from typing import Any

from aiohttp import web

from tidelog.errors import BadArgument, RequestTimeout, UnsupportedMediaType

from .wire import loads

__all__ = ["query_int", "query_str", "json_body", "field_int", "field_str", "field_bool"]

_MISSING: Any = object()
#: the app's --request-timeout-ms, in seconds (SVC-51)
REQUEST_TIMEOUT_S = web.AppKey("request_timeout_s", float)
_JSON_TYPES = ("application/json", "application/x-www-form-urlencoded", "text/plain", "")


def _one(request: web.Request, name: str) -> str | None:
    if not request.query_string:  # most requests: nothing to parse
        return None
    values = request.query.getall(name, [])
    if len(values) > 1:
        raise BadArgument(f"query parameter {name!r} given {len(values)} times (SVC-8)")
    return values[0] if values else None


def query_int(
    request: web.Request, name: str, default: int | None = None, minimum: int | None = None
) -> int | None:
    raw = _one(request, name)
    if raw is None:
        return default
    if not raw.lstrip("-").isdigit() or not raw.isascii():
        raise BadArgument(f"query parameter {name!r}: not a decimal integer: {raw!r} (SVC-8)")
    value = int(raw)
    if minimum is not None and value < minimum:
        raise BadArgument(f"query parameter {name!r}: must be >= {minimum}, got {value}")
    return value


def query_str(request: web.Request, name: str) -> str | None:
    return _one(request, name)


def check_query(request: web.Request, allowed: Collection[str]) -> None:
    """SVC-5: a parameter the endpoint does not know is refused, never ignored."""
    if not request.query_string:
        return
    unknown = sorted(set(request.query) - set(allowed))
    if unknown:
        raise BadArgument(
            f"unknown query parameter(s) {', '.join(unknown)}; this endpoint takes "
            f"{', '.join(sorted(allowed)) or 'none'} (SVC-5)"
        )


async def read_body(request: web.Request) -> bytes:
    """The whole body, within --request-timeout-ms of its head (SVC-51): a client that sends
    it slower gets 408 and the connection closes, so it cannot hold a worker."""
    if request.content.is_eof():  # all there: read it even if the client is gone (SVC-26)
        return await request.read()
    timeout = request.config_dict[REQUEST_TIMEOUT_S]
    try:
        return await asyncio.wait_for(request.read(), timeout)
    except TimeoutError:
        err = RequestTimeout(
            f"the request body did not arrive within {timeout * 1000:.0f} ms (SVC-51)"
        )
        err.close_connection = True  # type: ignore[attr-defined]  # answered, then closed
        raise err from None


async def json_body(request: web.Request, allowed: Collection[str] | None) -> dict[str, Any]:
    """The request's JSON object (an empty body is ``{}``), refusing fields not in ``allowed``
    (SVC-5; None: every field is an argument the API checks itself) and anything but an object
    (SVC-12)."""
    raw = await read_body(request)
    if not raw.strip():
        return {}
    ctype = request.content_type
    # curl -d sends its form type: the body is taken as JSON all the same (SVC-5)
    if ctype not in _JSON_TYPES:
        raise UnsupportedMediaType(f"expected application/json, got {ctype!r} (SVC-5)")
    body = loads(raw)
    if not isinstance(body, dict):
        raise BadArgument(f"request body must be a JSON object, got {type(body).__name__}")
    unknown = sorted(set(body) - set(allowed)) if allowed is not None else []
    if unknown and allowed is not None:
        raise BadArgument(
            f"unknown field(s) {', '.join(unknown)}; this endpoint takes "
            f"{', '.join(sorted(allowed)) or 'none'} (SVC-5)"
        )
    return body


def field_int(
    body: dict[str, Any], name: str, default: Any = _MISSING, minimum: int | None = None
) -> Any:
    value = body.get(name, default)
    if value is _MISSING:
        raise BadArgument(f"field {name!r} is required")
    if value is default and default is not _MISSING:
        return value
    if isinstance(value, bool) or not isinstance(value, int):
        raise BadArgument(f"field {name!r}: expected an integer, got {value!r} (SVC-12)")
    if minimum is not None and value < minimum:
        raise BadArgument(f"field {name!r}: must be >= {minimum}, got {value}")
    return value


def field_str(body: dict[str, Any], name: str, default: Any = _MISSING) -> Any:
    value = body.get(name, default)
    if value is _MISSING:
        raise BadArgument(f"field {name!r} is required")
    if value is None or (value is default and default is not _MISSING):
        return value
    if not isinstance(value, str):
        raise BadArgument(f"field {name!r}: expected a string, got {value!r} (SVC-12)")
    return value


def field_bool(body: dict[str, Any], name: str, default: bool) -> bool:
    value = body.get(name, default)
    if not isinstance(value, bool):
        raise BadArgument(f"field {name!r}: expected true or false, got {value!r} (SVC-12)")
    return value
