"""The request log of ``tidelog serve`` (spec/SERVICE.md SVC-55): what one request's line holds,
plain and JSON, and how a 500 is logged."""

from __future__ import annotations

import io
import json
import logging
import re
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from tidelog.errors import BadOption
from tidelog.service.auth import Authorizer, hash_token
from tidelog.service.logs import ACCESS, JsonFormatter, PlainFormatter, configure, log_request

TIME = r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z"


@pytest.fixture
def sink() -> Iterator[tuple[logging.Logger, io.StringIO, logging.Handler]]:
    """A logger of its own whose records go to a string, formatted by the test."""
    logger = logging.getLogger("tidelog.test.service.logs")
    logger.setLevel(logging.DEBUG)
    logger.propagate = False
    out = io.StringIO()
    handler = logging.StreamHandler(out)
    logger.addHandler(handler)
    try:
        yield logger, out, handler
    finally:
        logger.removeHandler(handler)


def _request(logger: logging.Logger, **over: object) -> None:
    fields: dict[str, object] = {
        "method": "POST",
        "route": "/v0/topics/{t}/records",
        "topic": "sensor-a",
        "status": 200,
        "seconds": 0.0012345,
        "bytes_in": 100,
        "bytes_out": 11,
        "token_name": "ingest",
    }
    fields.update(over)
    log_request(logger=logger, **fields)  # type: ignore[arg-type]


def test_SVC_55_one_plain_line_per_request(
    sink: tuple[logging.Logger, io.StringIO, logging.Handler],
) -> None:
    """SVC-55: one line per request at INFO with time, method, route, topic, status, duration,
    bytes in and out and the token's name; an absent topic or token is `-`."""
    logger, out, handler = sink
    handler.setFormatter(PlainFormatter())
    _request(logger)
    _request(logger, method="GET", route="/v0/health", topic=None, token_name=None, status=503)
    lines = out.getvalue().splitlines()
    assert len(lines) == 2
    assert re.fullmatch(
        TIME + r" INFO tidelog\.test\.service\.logs: method=POST route=/v0/topics/\{t\}/records "
        r"topic=sensor-a status=200 duration_ms=1\.234 bytes_in=100 bytes_out=11 token=ingest",
        lines[0],
    ), lines[0]
    assert lines[1].endswith(
        "INFO tidelog.test.service.logs: method=GET route=/v0/health topic=- status=503 "
        "duration_ms=1.234 bytes_in=100 bytes_out=11 token=-"
    )


def test_SVC_55_a_value_cannot_start_a_line_of_its_own(
    sink: tuple[logging.Logger, io.StringIO, logging.Handler],
) -> None:
    """SVC-55: a value with a space, quote, `=` or control character is written as a JSON
    string, so a request cannot forge a log line (one request, one line)."""
    logger, out, handler = sink
    handler.setFormatter(PlainFormatter())
    _request(logger, route='/x\nFAKE status=200 "', token_name="a b")
    lines = out.getvalue().splitlines()
    assert len(lines) == 1
    assert ' route="/x\\nFAKE status=200 \\"" ' in lines[0] and lines[0].endswith('token="a b"')


def test_SVC_55_json_lines(sink: tuple[logging.Logger, io.StringIO, logging.Handler]) -> None:
    """SVC-55, --log-format json: each request is one JSON object on one line with the same
    fields, typed (numbers as numbers, an absent topic or token as null)."""
    logger, out, handler = sink
    handler.setFormatter(JsonFormatter())
    _request(logger)
    _request(logger, topic=None, token_name=None, status=401, bytes_out=0)
    lines = out.getvalue().splitlines()
    assert len(lines) == 2
    first, second = (json.loads(line) for line in lines)
    assert re.fullmatch(TIME, first.pop("time"))
    assert first == {
        "level": "INFO",
        "logger": "tidelog.test.service.logs",
        "method": "POST",
        "route": "/v0/topics/{t}/records",
        "topic": "sensor-a",
        "status": 200,
        "duration_ms": 1.234,
        "bytes_in": 100,
        "bytes_out": 11,
        "token": "ingest",
    }
    assert (second["topic"], second["token"], second["status"]) == (None, None, 401)


def _boom() -> None:
    raise ZeroDivisionError("division by zero in a handler")


def test_SVC_55_a_500_is_logged_at_error_with_its_trace(
    sink: tuple[logging.Logger, io.StringIO, logging.Handler],
) -> None:
    """SVC-55: a 500 is logged at ERROR with the trace of the exception that caused it; other
    statuses, 503 included, stay INFO and carry no trace."""
    logger, out, handler = sink
    try:
        _boom()
    except ZeroDivisionError as exc:
        caught = exc
    handler.setFormatter(PlainFormatter())
    _request(logger, status=500, exc=caught)
    _request(logger, status=503, exc=caught)
    text = out.getvalue()
    head, *trace, last = text.splitlines()
    assert " ERROR " in head and "status=500" in head
    assert trace[0] == "Traceback (most recent call last):" and "in _boom" in text
    assert trace[-1] == "ZeroDivisionError: division by zero in a handler"
    assert " INFO " in last and "status=503" in last and text.count("Traceback") == 1

    out.seek(0)
    out.truncate()
    handler.setFormatter(JsonFormatter())
    _request(logger, status=500, exc=caught)
    (line,) = out.getvalue().splitlines()
    record = json.loads(line)
    assert record["level"] == "ERROR" and record["status"] == 500
    assert "ZeroDivisionError: division by zero in a handler" in record["trace"]


def test_SVC_55_the_line_names_the_token_never_the_token(
    tmp_path: Path, sink: tuple[logging.Logger, io.StringIO, logging.Handler]
) -> None:
    """SVC-55: the line carries the name of the caller's token as `check` found it; the token
    (nor its hash) is never written."""
    logger, out, handler = sink
    secret = "s3cret-token-value"
    path = tmp_path / "tokens.json"
    doc = {"tokens": [{"name": "ingest", "sha256": hash_token(secret), "grants": []}]}
    path.write_text(json.dumps(doc))
    principal = Authorizer(str(path)).check(f"Bearer {secret}", "any", None)
    for formatter in (PlainFormatter(), JsonFormatter()):
        handler.setFormatter(formatter)
        _request(logger, token_name=principal.name)
    text = out.getvalue()
    assert text.count("ingest") == 2
    assert secret not in text and hash_token(secret) not in text


def test_SVC_55_configure_makes_every_tidelog_record_one_format() -> None:
    """SVC-55: `--log-format json` makes every tidelog record a JSON line (a tokens reload's
    warning too), written once; an unknown format is `bad_option`."""
    with pytest.raises(BadOption, match="--log-format 'xml'"):
        configure("xml")
    root = logging.getLogger("tidelog")
    before = (root.level, root.propagate, list(root.handlers))
    out, elsewhere = io.StringIO(), io.StringIO()
    other = logging.StreamHandler(elsewhere)  # what `logging.basicConfig` would have set up
    logging.getLogger().addHandler(other)
    handler = configure("json", out)
    try:
        logging.getLogger("tidelog.service.auth").warning("tokens not reloaded: %s", "why")
        logging.getLogger("tidelog.service.auth").debug("not at INFO")
        log_request(
            method="GET",
            route="/v0",
            topic=None,
            status=200,
            seconds=0.0,
            bytes_in=0,
            bytes_out=2,
            token_name=None,
        )
    finally:
        logging.getLogger().removeHandler(other)
        root.removeHandler(handler)
        handler.close()  # its writer thread writes what is waiting, then stops
        root.setLevel(before[0])
        root.propagate = before[1]
    assert list(root.handlers) == before[2] and elsewhere.getvalue() == ""
    warning, access = (json.loads(line) for line in out.getvalue().splitlines())
    assert (warning["level"], warning["logger"], warning["message"]) == (
        "WARNING",
        "tidelog.service.auth",
        "tokens not reloaded: why",
    )
    assert (access["logger"], access["route"], access["bytes_out"]) == (
        "tidelog.service.access",
        "/v0",
        2,
    )


@pytest.mark.parametrize("fmt", ["plain", "json"])
def test_SVC_55_the_direct_line_is_the_formatters_line(fmt: str) -> None:
    """SVC-55: a request's line written straight to the handler `configure` installed is the
    line its formatter makes of the record when anything else listens (a filter here), time
    aside; and nothing is written when the level drops it."""
    root = logging.getLogger("tidelog")
    before = (root.level, root.propagate, list(root.handlers))
    out = io.StringIO()
    handler = configure(fmt, out)
    fields: dict[str, object] = {
        "method": "PUT",
        "route": "/v0/topics/{t}",
        "topic": 'odd "name"',
        "status": 409,
        "seconds": 0.0025,
        "bytes_in": 7,
        "bytes_out": 90,
        "token_name": "ingest",
    }
    seen: list[logging.LogRecord] = []

    def listen(record: logging.LogRecord) -> bool:
        seen.append(record)
        return True

    try:
        log_request(**fields)  # type: ignore[arg-type]
        ACCESS.addFilter(listen)
        try:
            log_request(**fields)  # type: ignore[arg-type]
        finally:
            ACCESS.removeFilter(listen)
        root.setLevel(logging.WARNING)
        log_request(**fields)  # type: ignore[arg-type]
    finally:
        root.removeHandler(handler)
        handler.close()
        root.setLevel(before[0])
        root.propagate = before[1]
    direct, through = out.getvalue().splitlines()
    assert len(seen) == 1  # the first went around logging's records, the second through them
    if fmt == "json":
        a, b = json.loads(direct), json.loads(through)
        assert re.fullmatch(TIME, a.pop("time")) and re.fullmatch(TIME, b.pop("time"))
        assert a == b and a["topic"] == 'odd "name"' and a["duration_ms"] == 2.5
    else:
        assert re.fullmatch(TIME + " .*", direct) and re.fullmatch(TIME + " .*", through)
        assert direct.split(" ", 1)[1] == through.split(" ", 1)[1]
        assert direct.endswith(
            'topic="odd \\"name\\"" status=409 duration_ms=2.5 bytes_in=7 bytes_out=90 token=ingest'
        )


class _BlockedStream(io.StringIO):
    """A stderr nobody reads: every write waits until ``release`` is set."""

    def __init__(self) -> None:
        super().__init__()
        self.release = threading.Event()
        self.entered = threading.Event()

    def write(self, text: str) -> int:
        self.entered.set()
        self.release.wait(30)
        return super().write(text)


def test_SVC_55_a_blocked_stderr_never_stalls_a_request() -> None:
    """SVC-55: with the stream blocked (a full pipe), requests are logged without waiting:
    lines beyond the 4 MiB buffer are dropped, and once the stream moves again every kept line
    is written, then a WARNING with `dropped_lines`; nothing is written twice."""
    root = logging.getLogger("tidelog")
    before = (root.level, root.propagate, list(root.handlers))
    out = _BlockedStream()
    handler = configure("json", out)
    done = threading.Event()
    count = 60_000  # ~200 bytes each: about 3x the buffer

    def requests() -> None:
        for i in range(count):
            log_request(
                method="POST", route="/v0/topics/{t}/records", topic=f"t{i}", status=200,
                seconds=0.0, bytes_in=100, bytes_out=11, token_name=None,
            )  # fmt: skip
        done.set()

    worker = threading.Thread(target=requests, daemon=True)
    try:
        worker.start()
        assert out.entered.wait(10), "the writer thread never wrote"
        # On the code that wrote from the request's thread, this waited behind the blocked write.
        assert done.wait(20), "a request waited for the blocked stream"
        out.release.set()
        handler.flush()
    finally:
        out.release.set()
        root.removeHandler(handler)
        handler.close()
        root.setLevel(before[0])
        root.propagate = before[1]
    lines = [json.loads(line) for line in out.getvalue().splitlines()]
    topics = [line["topic"] for line in lines if "topic" in line]
    warnings = [line for line in lines if line["level"] == "WARNING"]
    assert len(warnings) == 1 and warnings[0]["logger"] == "tidelog.service.access"
    dropped = warnings[0]["dropped_lines"]
    assert dropped > 0 and len(topics) + dropped == count
    assert len(set(topics)) == len(topics)  # none twice
    assert topics == sorted(topics, key=lambda t: int(t[1:]))  # in order
    assert handler.dropped_total == dropped
