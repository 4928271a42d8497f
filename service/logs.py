"""The request log of ``tidelog serve`` (spec/SERVICE.md SVC-55).

The app calls ``log_request`` once per answered request; the record carries the request's fields
(``record.request``) and the formatter ``configure`` installs writes it as one line, plain
(``key=value`` pairs) or JSON. Every other ``tidelog`` log record (a tokens reload, the receiver)
goes through the same formatter, so a JSON log is JSON throughout.
"""

from __future__ import annotations

import datetime
import json
import logging
import re
import sys
from typing import Any, Final, TextIO

from tidelog.errors import BadOption

__all__ = ["ACCESS", "FORMATS", "log_request", "PlainFormatter", "JsonFormatter", "configure"]

#: The request log's logger.
ACCESS: Final = logging.getLogger("tidelog.service.access")
FORMATS: Final = ("plain", "json")

# A value that needs no quotes in a key=value line: printable, no space, quote, '=' or '\'.
_BARE = re.compile(r'[^\s"=\\]+')


def log_request(
    *,
    method: str,
    route: str,
    topic: str | None,
    status: int,
    seconds: float,
    bytes_in: int,
    bytes_out: int,
    token_name: str | None,
    exc: BaseException | None = None,
    logger: logging.Logger = ACCESS,
) -> None:
    """SVC-55: one record per request: INFO, or ERROR for a 500, with the trace of ``exc``
    when given. ``route`` is the endpoint's path template; ``token_name`` is
    the name of the caller's token (``Principal.name``), never the token."""
    fields: dict[str, Any] = {
        "method": method,
        "route": route,
        "topic": topic,
        "status": status,
        "duration_ms": round(seconds * 1000, 3),
        "bytes_in": bytes_in,
        "bytes_out": bytes_out,
        "token": token_name,
    }
    error = status == 500
    exc_info = (type(exc), exc, exc.__traceback__) if error and exc is not None else None
    logger.log(
        logging.ERROR if error else logging.INFO,
        "%s",
        _pairs(fields),
        exc_info=exc_info,
        extra={"request": fields},
    )


def _bare(value: object) -> str:
    if value is None:
        return "-"
    text = str(value)
    return text if _BARE.fullmatch(text) and text.isprintable() else json.dumps(text)


def _pairs(fields: dict[str, Any]) -> str:
    """``key=value`` pairs; a value with a space, quote or control character is a JSON string,
    so no value can start a line of its own."""
    return " ".join(f"{key}={_bare(value)}" for key, value in fields.items())


def _time(record: logging.LogRecord) -> str:
    when = datetime.datetime.fromtimestamp(record.created, datetime.UTC)
    return when.isoformat(timespec="milliseconds").replace("+00:00", "Z")


class PlainFormatter(logging.Formatter):
    """``<time> <LEVEL> <logger>: <message>``; a request's message is its ``key=value`` pairs;
    a trace follows on the next lines."""

    def format(self, record: logging.LogRecord) -> str:
        line = f"{_time(record)} {record.levelname} {record.name}: {record.getMessage()}"
        if record.exc_info:
            line += "\n" + self.formatException(record.exc_info).rstrip("\n")
        return line


class JsonFormatter(logging.Formatter):
    """One JSON object per record, on one line: ``time``, ``level``, ``logger``, then a
    request's fields, or ``message`` for any other record, and ``trace`` when there is one."""

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "time": _time(record),
            "level": record.levelname,
            "logger": record.name,
        }
        request = getattr(record, "request", None)
        if isinstance(request, dict):
            out.update(request)
        else:
            out["message"] = record.getMessage()
        if record.exc_info:
            out["trace"] = self.formatException(record.exc_info)
        return json.dumps(out, ensure_ascii=False, separators=(",", ":"))


def configure(fmt: str, stream: TextIO | None = None, level: int = logging.INFO) -> logging.Handler:
    """SVC-55, ``--log-format``: write every ``tidelog`` log record at ``level`` or above to
    ``stream`` (stderr) in ``fmt`` (``plain`` or ``json``), and only there (not also through
    the root logger). Returns the handler, for the caller to remove."""
    if fmt not in FORMATS:
        raise BadOption(f"--log-format {fmt!r}: expected one of {', '.join(FORMATS)} (SVC-55)")
    handler = logging.StreamHandler(sys.stderr if stream is None else stream)
    handler.setFormatter(JsonFormatter() if fmt == "json" else PlainFormatter())
    root = logging.getLogger("tidelog")
    root.addHandler(handler)
    root.setLevel(level)
    root.propagate = False
    return handler
