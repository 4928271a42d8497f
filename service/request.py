"""Reading a request's arguments (SVC-5, SVC-8, SVC-12): query integers and strings, JSON
bodies with a fixed set of fields, each malformed value a ``bad_argument`` naming it."""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

from aiohttp import web

from tidelog.errors import BadArgument, UnsupportedMediaType

from .wire import loads

__all__ = ["query_int", "query_str", "json_body", "field_int", "field_str", "field_bool"]

_MISSING: Any = object()
_JSON_TYPES = ("application/json", "application/x-www-form-urlencoded", "text/plain", "")


def _one(request: web.Request, name: str) -> str | None:
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
    unknown = sorted(set(request.query) - set(allowed))
    if unknown:
        raise BadArgument(
            f"unknown query parameter(s) {', '.join(unknown)}; this endpoint takes "
            f"{', '.join(sorted(allowed)) or 'none'} (SVC-5)"
        )


async def json_body(request: web.Request, allowed: Collection[str]) -> dict[str, Any]:
    """The request's JSON object (an empty body is ``{}``), refusing fields not in ``allowed``
    (SVC-5) and anything but an object (SVC-12)."""
    raw = await request.read()
    if not raw.strip():
        return {}
    ctype = request.content_type
    # curl -d sends its form type: the body is taken as JSON all the same (SVC-5)
    if ctype not in _JSON_TYPES:
        raise UnsupportedMediaType(f"expected application/json, got {ctype!r} (SVC-5)")
    body = loads(raw)
    if not isinstance(body, dict):
        raise BadArgument(f"request body must be a JSON object, got {type(body).__name__}")
    unknown = sorted(set(body) - set(allowed))
    if unknown:
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
