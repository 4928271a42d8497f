"""The request log of ``tidelog serve`` (spec/SERVICE.md SVC-55).

The app calls ``log_request`` once per answered request; the record carries the request's fields
(``record.request``) and the formatter ``configure`` installs writes it as one line, plain
(``key=value`` pairs) or JSON. Every other ``tidelog`` log record (a tokens reload, the receiver)
goes through the same formatter, so a JSON log is JSON throughout.
"""

from __future__ import annotations

import collections
import datetime
import json
import logging
import re
import sys
import threading
import time
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
    the name of the caller's token (``Principal.name``), never the token.

    Cheap, since it runs once per request: nothing is built when the logger would drop the
    record; when the records would reach exactly the handler ``configure`` installed (nothing
    else listening or filtering), the line is formatted once and handed to its writer thread,
    with no ``LogRecord``; otherwise it is an ordinary record (no ``findCaller``), whose plain
    message is built only when a formatter asks for it."""
    error = status == 500
    level = logging.ERROR if error else logging.INFO
    if not logger.isEnabledFor(level):
        return
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
    exc_info = (type(exc), exc, exc.__traceback__) if error and exc is not None else None
    handler = _direct_handler(logger, level) if exc_info is None else None
    if handler is not None:
        formatter = handler.formatter
        assert isinstance(formatter, _Formatter)
        line = formatter.line(time.time(), logging.getLevelName(level), logger.name, fields)
        handler.put(line)
        return
    record = logger.makeRecord(
        logger.name, level, __file__, 0, _Line(fields), (), exc_info, extra={"request": fields}
    )
    logger.handle(record)


def _direct_handler(logger: logging.Logger, level: int) -> _Handler | None:
    """The handler ``configure`` installed, if a record of ``logger`` at ``level`` would reach
    it and nothing else: no filter and no other handler on the way up to the logger it is on,
    which does not propagate further."""
    node: logging.Logger | None = logger
    while node is not None:
        if node.filters:
            return None
        if node.handlers:
            if len(node.handlers) != 1 or node.propagate:
                return None
            handler = node.handlers[0]
            if (
                type(handler) is not _Handler
                or handler.filters
                or level < handler.level
                or not isinstance(handler.formatter, _Formatter)
            ):
                return None
            return handler
        if not node.propagate:
            return None
        parent = node.parent
        node = parent if isinstance(parent, logging.Logger) else None
    return None


class _Line:
    """A request record's message: its ``key=value`` pairs, made when first asked for."""

    __slots__ = ("fields", "text")

    def __init__(self, fields: dict[str, Any]) -> None:
        self.fields = fields
        self.text: str | None = None

    def __str__(self) -> str:
        if self.text is None:
            self.text = _pairs(self.fields)
        return self.text


_SAFE: dict[str, str] = {}  # strings already checked: as they are written


def _bare(value: object) -> str:
    if value is None:
        return "-"
    if type(value) is str:
        known = _SAFE.get(value)
        if known is not None:
            return known
    elif type(value) is int or type(value) is float:
        return str(value)
    text = str(value)
    out = text if _BARE.fullmatch(text) and text.isprintable() else json.dumps(text)
    if len(_SAFE) >= 4096:  # topic names come and go: the cache stays bounded
        _SAFE.clear()
    _SAFE[text] = out
    return out


def _pairs(fields: dict[str, Any]) -> str:
    """``key=value`` pairs; a value with a space, quote or control character is a JSON string,
    so no value can start a line of its own."""
    if fields.keys() == _REQUEST_KEYS:  # a request's: one f-string, numbers as they are
        f = fields
        return (
            f"method={_bare(f['method'])} route={_bare(f['route'])} "
            f"topic={_bare(f['topic'])} status={_bare(f['status'])} "
            f"duration_ms={_bare(f['duration_ms'])} bytes_in={_bare(f['bytes_in'])} "
            f"bytes_out={_bare(f['bytes_out'])} token={_bare(f['token'])}"
        )
    return " ".join([f"{key}={_bare(value)}" for key, value in fields.items()])


_REQUEST_KEYS = dict.fromkeys(
    ("method", "route", "topic", "status", "duration_ms", "bytes_in", "bytes_out", "token")
).keys()


_second: list[Any] = [None, ""]  # the last whole second formatted, and its text


def _time(created: float) -> str:
    """A record's time, UTC with milliseconds; the date and time of day made once a second."""
    second = int(created)
    if _second[0] != second:
        when = datetime.datetime.fromtimestamp(second, datetime.UTC)
        _second[:] = [second, when.strftime("%Y-%m-%dT%H:%M:%S")]
    millis = min(999, int((created - second) * 1000))
    return f"{_second[1]}.{millis:03d}Z"


_ENCODE = json.JSONEncoder(ensure_ascii=False, separators=(",", ":")).encode


class _Formatter(logging.Formatter):
    def line(self, created: float, level: str, name: str, fields: dict[str, Any]) -> str:
        """A request's line without its trace (the direct write of ``log_request``)."""
        raise NotImplementedError


class PlainFormatter(_Formatter):
    """``<time> <LEVEL> <logger>: <message>``; a request's message is its ``key=value`` pairs;
    a trace follows on the next lines."""

    def line(self, created: float, level: str, name: str, fields: dict[str, Any]) -> str:
        return f"{_time(created)} {level} {name}: {_pairs(fields)}"

    def format(self, record: logging.LogRecord) -> str:
        line = f"{_time(record.created)} {record.levelname} {record.name}: {record.getMessage()}"
        if record.exc_info:
            line += "\n" + self.formatException(record.exc_info).rstrip("\n")
        return line


class JsonFormatter(_Formatter):
    """One JSON object per record, on one line: ``time``, ``level``, ``logger``, then a
    request's fields, or ``message`` for any other record, and ``trace`` when there is one."""

    def line(self, created: float, level: str, name: str, fields: dict[str, Any]) -> str:
        return _ENCODE({"time": _time(created), "level": level, "logger": name, **fields})

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "time": _time(record.created),
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
        return _ENCODE(out)


class _Handler(logging.Handler):
    """The handler ``configure`` installs (``log_request`` hands it lines directly). Lines go
    to a bounded buffer that a thread of its own writes to the stream, so a request never waits
    for the stream: a stderr nobody reads (a full pipe) must not stall the event loop and with
    it every append (SVC-55). Past ``limit`` bytes waiting, lines are dropped and counted; the
    next write says how many."""

    def __init__(self, stream: TextIO, limit: int = 4 << 20) -> None:
        super().__init__()
        self.stream = stream
        self.limit = limit
        self.dropped = 0  # lines dropped since the last report (and in all: ``dropped_total``)
        self.dropped_total = 0
        self._lines: collections.deque[str] = collections.deque()
        self._waiting = 0  # characters in ``_lines``
        self._wake = threading.Event()
        self._idle = threading.Event()
        self._idle.set()
        self._stop = False
        self._thread = threading.Thread(target=self._run, name="tidelog-log-writer", daemon=True)
        self._thread.start()

    def put(self, line: str) -> None:
        with self.lock:  # type: ignore[union-attr]
            if self._waiting + len(line) > self.limit:
                self.dropped += 1
                self.dropped_total += 1
                return
            self._lines.append(line)
            self._waiting += len(line)
            self._idle.clear()
        if not self._wake.is_set():
            self._wake.set()

    def emit(self, record: logging.LogRecord) -> None:
        try:
            self.put(self.format(record))
        except Exception:  # as StreamHandler.emit: reported, never raised into the request
            self.handleError(record)

    def _run(self) -> None:
        while True:
            self._wake.wait()
            self._wake.clear()
            with self.lock:  # type: ignore[union-attr]
                lines, self._lines = self._lines, collections.deque()
                self._waiting = 0
                dropped, self.dropped = self.dropped, 0
                stop = self._stop
            if dropped:
                formatter = self.formatter
                assert isinstance(formatter, _Formatter)
                note = {"dropped_lines": dropped, "why": "the log stream did not keep up"}
                lines.append(formatter.line(time.time(), "WARNING", ACCESS.name, note))
            if lines:
                try:
                    self.stream.write("\n".join(lines) + "\n")
                    self.stream.flush()
                except Exception:  # a closed or broken stream: the lines are lost, not the loop
                    pass
            with self.lock:  # type: ignore[union-attr]
                if not self._lines and not self.dropped:
                    self._idle.set()
            if stop:
                return

    def flush(self, timeout: float = 2.0) -> None:
        """Wait (at most ``timeout`` s) until every line handed over so far is written."""
        self._idle.wait(timeout)

    def close(self, timeout: float = 2.0) -> None:
        """Write what is waiting (at most ``timeout`` s: a stream that stays blocked is left
        to the daemon thread) and stop the writer."""
        with self.lock:  # type: ignore[union-attr]
            self._stop = True
        self._wake.set()
        self._thread.join(timeout)
        super().close()


def configure(fmt: str, stream: TextIO | None = None, level: int = logging.INFO) -> logging.Handler:
    """SVC-55, ``--log-format``: write every ``tidelog`` log record at ``level`` or above to
    ``stream`` (stderr) in ``fmt`` (``plain`` or ``json``), and only there (not also through
    the root logger). Returns the handler, for the caller to remove."""
    if fmt not in FORMATS:
        raise BadOption(f"--log-format {fmt!r}: expected one of {', '.join(FORMATS)} (SVC-55)")
    handler = _Handler(sys.stderr if stream is None else stream)
    handler.setFormatter(JsonFormatter() if fmt == "json" else PlainFormatter())
    root = logging.getLogger("tidelog")
    root.addHandler(handler)
    root.setLevel(level)
    root.propagate = False
    return handler
