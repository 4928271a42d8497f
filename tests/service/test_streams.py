"""Live push over Server-Sent Events against a live service (spec/SERVICE.md section 6)."""

from __future__ import annotations

import json
import select
import socket
import time
from typing import Any

from .conftest import Served


class Stream:
    """A raw SSE connection over HTTP/1.0 (so the body is the bare event stream, not chunked):
    reads events as they come, with a deadline."""

    def __init__(self, served: Served, path: str, headers: dict[str, str] | None = None):
        self.sock = socket.create_connection((served.thread.host, served.thread.port), timeout=10)
        head = "".join(f"{k}: {v}\r\n" for k, v in (headers or {}).items())
        self.sock.sendall(f"GET {path} HTTP/1.0\r\nHost: x\r\n{head}\r\n".encode())
        raw = b""
        while b"\r\n\r\n" not in raw:
            chunk = self.sock.recv(65536)
            if not chunk:
                break
            raw += chunk
        head_bytes, _, self.buf = raw.partition(b"\r\n\r\n")
        lines = head_bytes.decode("latin-1").split("\r\n")
        self.status = int(lines[0].split(" ")[1])
        self.headers = {k.lower(): v for k, _, v in (x.partition(": ") for x in lines[1:])}
        self.ended = False

    def events(self, n: int, timeout: float = 10.0, keep_comments: bool = False) -> list[Any]:
        out: list[Any] = []
        deadline = time.monotonic() + timeout
        while True:
            while b"\n\n" in self.buf and len(out) < n:
                block, self.buf = self.buf.split(b"\n\n", 1)
                ev = _parse(block.decode(), keep_comments)
                if ev:
                    out.append(ev)
            left = deadline - time.monotonic()
            if len(out) >= n or left <= 0 or self.ended:
                return out
            ready, _, _ = select.select([self.sock], [], [], left)
            if not ready:
                return out
            chunk = self.sock.recv(65536)
            if not chunk:
                self.ended = True
            self.buf += chunk

    def rest(self, timeout: float = 10.0) -> bytes:
        """Everything until the service closes the stream."""
        deadline = time.monotonic() + timeout
        while not self.ended and time.monotonic() < deadline:
            ready, _, _ = select.select([self.sock], [], [], deadline - time.monotonic())
            if ready:
                chunk = self.sock.recv(65536)
                self.ended = not chunk
                self.buf += chunk
        return self.buf

    def close(self) -> None:
        self.sock.close()


def _parse(block: str, keep_comments: bool) -> dict[str, Any] | None:
    ev: dict[str, Any] = {}
    for line in block.split("\n"):
        if line.startswith(":"):
            if keep_comments:
                ev["comment"] = line[1:].strip()
            continue
        key, _, value = line.partition(": ")
        if key == "retry":
            continue
        ev[key] = json.loads(value) if key == "data" else value
    return ev or None


def _append(served: Served, topic: str, data: bytes) -> int:
    status, body = served.client.post(f"/v0/topics/{topic}/records", raw=data)
    assert status == 200, body
    return int(body["seq"])


def test_SVC_27_a_stream_delivers_records_as_they_are_appended(served: Served) -> None:
    served.topic("a")
    stream = Stream(served, "/v0/topics/a/events")
    try:
        assert stream.status == 200
        assert stream.headers["content-type"].startswith("text/event-stream")
        assert stream.headers["cache-control"] == "no-cache"
        _append(served, "a", b"first")
        _append(served, "a", b"second")
        events = stream.events(2)
        assert [e["event"] for e in events] == ["record", "record"]
        assert [e["id"] for e in events] == ["1", "2"]
        assert events[0]["data"]["payload"] == "Zmlyc3Q="
    finally:
        stream.close()


def test_SVC_27_an_eviction_is_a_tombstone_event(served: Served) -> None:
    served.topic("a", cap_records=2, retention="drop_oldest")
    for i in range(4):
        _append(served, "a", b"%d" % i)
    stream = Stream(served, "/v0/topics/a/events?after=0")
    try:
        events = stream.events(3)
        assert events[0] == {"event": "tombstone", "id": "2", "data": {"gap_from": 1, "gap_to": 2}}
        assert [e["id"] for e in events[1:]] == ["3", "4"]
    finally:
        stream.close()


def test_SVC_28_resuming_with_last_event_id_skips_nothing_and_repeats_nothing(
    served: Served,
) -> None:
    """SVC-28: Resuming with last event id skips nothing and repeats nothing."""
    served.topic("a")
    for i in range(5):
        _append(served, "a", b"%d" % i)
    stream = Stream(served, "/v0/topics/a/events?after=0", {"Last-Event-ID": "3"})
    try:
        assert [e["id"] for e in stream.events(2)] == ["4", "5"]
    finally:
        stream.close()
    status, body = served.client.get("/v0/topics/a/events", headers={"Last-Event-ID": "three"})
    assert status == 400 and body["error"]["code"] == "bad_argument"


def test_SVC_28_without_a_cursor_a_stream_starts_from_now(served: Served) -> None:
    """SVC-28: Without a cursor a stream starts from now."""
    served.topic("a")
    _append(served, "a", b"old")
    stream = Stream(served, "/v0/topics/a/events")
    try:
        _append(served, "a", b"new")
        events = stream.events(1)
        assert [e["id"] for e in events] == ["2"]
    finally:
        stream.close()


def test_SVC_29_push_is_woken_by_the_append_not_an_interval(served: Served) -> None:
    """SVC-29: With a 200 ms heartbeat, a push arriving well before it shows the wake-up came from
    the append (the median over several appends, so one slow scheduling does not decide)."""
    served.topic("a")
    stream = Stream(served, "/v0/topics/a/events")
    try:
        stream.events(0)
        lags = []
        for i in range(9):
            time.sleep(0.02)
            started = time.monotonic()
            _append(served, "a", b"%d" % i)
            assert stream.events(1)[0]["id"] == str(i + 1)
            lags.append(time.monotonic() - started)
        assert sorted(lags)[4] < 0.15, lags
    finally:
        stream.close()


def test_SVC_30_an_idle_stream_gets_heartbeats(served: Served) -> None:
    """SVC-30: An idle stream gets heartbeats."""
    served.topic("a")
    stream = Stream(served, "/v0/topics/a/events")
    try:
        beats = stream.events(2, timeout=3.0, keep_comments=True)
        assert [b.get("comment") for b in beats] == ["hb", "hb"]
    finally:
        stream.close()


def test_SVC_31_a_backlog_goes_out_in_batches_with_one_id_per_item(served: Served) -> None:
    """SVC-31: A backlog goes out in batches with one id per item."""
    served.topic("a")
    payloads = [f"p{i}".encode() for i in range(1500)]
    import base64

    for i in range(0, 1500, 100):
        batch = {"payloads": [base64.b64encode(p).decode() for p in payloads[i : i + 100]]}
        assert served.client.post("/v0/topics/a/batch", batch)[0] == 200
    stream = Stream(served, "/v0/topics/a/events?after=0")
    try:
        events = stream.events(1500, timeout=20)
        assert [int(e["id"]) for e in events] == list(range(1, 1501))
    finally:
        stream.close()


def test_SVC_32_a_stalled_client_is_cut_off_without_slowing_writers(served: Served) -> None:
    """SVC-32: A client that reads nothing: writers go on, and the service ends the stream and
    closes its connection once the socket took nothing for --sse-stall-ms; the client then finds the
    connection closed before it got everything (it resumes with Last-Event-ID)."""
    service = served.thread.service
    assert service is not None
    service.sse_stall_ms = 300
    served.topic("a")
    big = b"x" * 60_000
    sock = socket.create_connection((served.thread.host, served.thread.port))
    sock.sendall(b"GET /v0/topics/a/events?after=0 HTTP/1.1\r\nHost: x\r\n\r\n")
    try:
        started = time.monotonic()
        for _ in range(200):
            _append(served, "a", big)
        assert time.monotonic() - started < 20
        deadline = time.monotonic() + 10
        while service.streams and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not service.streams
        received, closed = 0, False
        sock.settimeout(1.0)
        while time.monotonic() < deadline and not closed:
            try:
                chunk = sock.recv(1 << 20)
            except TimeoutError:
                continue
            except ConnectionResetError:
                break
            closed = chunk == b""
            received += len(chunk)
        assert received < 200 * len(big)
    finally:
        sock.close()


def test_SVC_33_a_subscriber_stream_starts_after_its_hwm_and_moves_nothing(
    served: Served,
) -> None:
    """SVC-33: A subscriber stream starts after its hwm and moves nothing."""
    served.topic("a")
    c = served.client
    c.put("/v0/topics/a/subscribers/s", {"start": "earliest"})
    for i in range(3):
        _append(served, "a", b"%d" % i)
    c.post("/v0/topics/a/subscribers/s/poll", {"max": 1})
    c.post("/v0/topics/a/subscribers/s/commit", {"seq": 1})
    stream = Stream(served, "/v0/topics/a/subscribers/s/events")
    try:
        assert [e["id"] for e in stream.events(2)] == ["2", "3"]
    finally:
        stream.close()
    assert c.get("/v0/topics/a/subscribers/s") == (200, {"name": "s", "hwm": 1})
    status, body = c.get("/v0/topics/a/subscribers/nobody/events")
    assert status == 404 and body["error"]["code"] == "no_such_subscriber"


def test_SVC_34_a_stream_ends_with_an_error_event_when_its_topic_is_dropped(
    served: Served,
) -> None:
    """SVC-34: A stream ends with an error event when its topic is dropped."""
    served.topic("a")
    stream = Stream(served, "/v0/topics/a/events")
    try:
        stream.events(0)
        assert served.client.delete("/v0/topics/a")[0] == 204
        events = stream.events(1)
        assert events[0]["event"] == "error"
        assert events[0]["data"]["error"]["code"] == "no_such_topic"
        stream.rest()
        assert stream.ended  # the service closed the stream
    finally:
        stream.close()
