"""Answers of the service: JSON bodies, and errors as SVC-9's body with SVC-10's status."""

from __future__ import annotations

from aiohttp import web

from tidelog.errors import TidelogError

from .wire import RETRY_CODES, STATUS, dumps, error_json

__all__ = ["json_response", "error_response", "HTTP_CODES"]


def json_response(obj: object, status: int = 200) -> web.Response:
    return web.Response(body=dumps(obj), status=status, content_type="application/json")


def error_response(exc: TidelogError) -> web.Response:
    """SVC-9, SVC-10: the code's status, with ``Retry-After`` for the codes that ask to retry."""
    code = exc.code
    status = STATUS.get(code, 500)
    retry_ms: int | None = None
    headers: dict[str, str] = {}
    if code in RETRY_CODES:
        retry_ms = int(getattr(exc, "retry_after_ms", 1000))
        headers["Retry-After"] = str(max(1, -(-retry_ms // 1000)))
    if code == "unauthorized":
        headers["WWW-Authenticate"] = "Bearer"
    allow = getattr(exc, "allow", None)
    if allow:
        headers["Allow"] = allow
    response = web.Response(
        body=dumps(error_json(code, exc.message, retry_ms)),
        status=status,
        content_type="application/json",
        headers=headers,
    )
    if getattr(exc, "close_connection", False):
        response.force_close()  # SVC-51: the answer, then the connection closes
    return response


HTTP_CODES = {400: "bad_argument", 404: "not_found", 405: "method_not_allowed", 413: "too_large"}
