"""A scripted stand-in for ``tidelog serve`` (tests of the remote backend's own behaviour:
retries, lost answers, headers). Standard library only, HTTP/1.1 with keep-alive.

``GET /v0`` answers a hello (the capabilities of ``memory://``); every other request takes the
next action of the script: ``answer(status, body, headers)`` (a JSON body, or bytes as they
are), ``DROP`` (read the request, close the connection without a word: a lost answer),
``hang(seconds)`` (say nothing for that long, then close), ``answer_then_close(...)`` (answer
as if keeping the connection alive, then close it: a keep-alive connection the server closed
while it was idle). An empty script answers ``{"seq": 1}``. Every request is kept in ``requests``.

``LossyProxy`` stands between a client and a real service: it relays every request and answer,
except that the first request matching each of its ``lose`` entries reaches the service and its
answer does not reach the client (the connection closes): a lost answer, after the call was
applied.
"""

from __future__ import annotations

import http.client
import json
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from tidelog.backends.memory import CAPABILITIES

__all__ = [
    "FakeService", "LossyProxy", "Seen", "answer", "answer_then_close", "hang", "DROP",
    "fake_service",
]  # fmt: skip


@dataclass(frozen=True)
class Action:
    kind: str  # answer | drop | hang | answer_then_close
    status: int = 200
    body: Any = None
    headers: dict[str, str] = field(default_factory=dict)
    seconds: float = 0.0


def answer(status: int = 200, body: Any = None, headers: dict[str, str] | None = None) -> Action:
    return Action("answer", status, body, headers or {})


def answer_then_close(status: int = 200, body: Any = None) -> Action:
    return Action("answer_then_close", status, body)


def hang(seconds: float) -> Action:
    return Action("hang", seconds=seconds)


DROP = Action("drop")


@dataclass(frozen=True)
class Seen:
    method: str
    path: str
    headers: dict[str, str]
    body: bytes
    connection: int  # which TCP connection carried it (counted from 1)

    def json(self) -> Any:
        return json.loads(self.body)


def _reply(
    handler: BaseHTTPRequestHandler, status: int, headers: list[tuple[str, str]], data: bytes
) -> None:
    handler.send_response(status)
    for k, v in headers:
        handler.send_header(k, v)
    handler.send_header("Content-Length", str(len(data)))
    handler.end_headers()
    handler.wfile.write(data)


class _Server:
    """An HTTP/1.1 server on 127.0.0.1 (TLS with ``tls``, an ``ssl.SSLContext``) on a thread."""

    def _listen(self, handler: type[BaseHTTPRequestHandler], tls: Any = None) -> None:
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.server.daemon_threads = True
        if tls is not None:
            self.server.socket = tls.wrap_socket(self.server.socket, server_side=True)
        scheme = "https" if tls is not None else "http"
        self.url = f"{scheme}://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def start(self) -> Any:
        self.thread.start()
        return self

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(timeout=10)

    def __enter__(self) -> Any:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


HELLO = {
    "api": "v0",
    "tidelog": "0.1.0",
    "capabilities": CAPABILITIES.to_dict(),
    "limits": {"max_wait_ms": 30000},
}


class FakeService(_Server):
    def __init__(
        self, script: list[Action] | None = None, hello: Any = None, tls: Any = None
    ) -> None:
        self.script = list(script or [])
        self.hello = HELLO if hello is None else hello
        self.requests: list[Seen] = []
        self.connections = 0
        self.lock = threading.Lock()
        fake = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def setup(self) -> None:
                super().setup()
                with fake.lock:
                    fake.connections += 1
                    self.number = fake.connections

            def log_message(self, *args: object) -> None:  # quiet
                pass

            def _any(self) -> None:
                n = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(n) if n else b""
                if self.command == "GET" and self.path == "/v0":
                    self._send(answer(200, fake.hello))
                    return
                with fake.lock:
                    fake.requests.append(
                        Seen(self.command, self.path, dict(self.headers), body, self.number)
                    )
                    action = fake.script.pop(0) if fake.script else answer(200, {"seq": 1})
                if action.kind == "drop":
                    self.close_connection = True
                elif action.kind == "hang":
                    time.sleep(action.seconds)
                    self.close_connection = True
                else:
                    self._send(action)
                    if action.kind == "answer_then_close":
                        self.close_connection = True

            def _send(self, action: Action) -> None:
                body = action.body
                data = (
                    body
                    if isinstance(body, bytes)
                    else b""
                    if body is None
                    else (json.dumps(body).encode())
                )
                headers = list(action.headers.items())
                if data:
                    headers.append(("Content-Type", "application/json"))
                _reply(self, action.status, headers, data)

            do_GET = do_POST = do_PUT = do_DELETE = _any

        self._listen(Handler, tls)


@contextmanager
def fake_service(
    script: list[Action] | None = None, hello: Any = None, tls: Any = None
) -> Iterator[FakeService]:
    svc = FakeService(script, hello, tls).start()
    try:
        yield svc
    finally:
        svc.stop()


class LossyProxy(_Server):
    """A relay to ``upstream`` that loses the answer of the first request starting with each of
    ``lose`` (``"POST /v0/topics/t/claim"``), after the service applied it."""

    def __init__(self, upstream: str, lose: list[str]) -> None:
        self.lose = list(lose)
        self.lost: list[str] = []
        self.seen: list[str] = []
        self.lock = threading.Lock()
        host, port = upstream.removeprefix("http://").split(":")
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: object) -> None:
                pass

            def _any(self) -> None:
                n = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(n) if n else None
                line = f"{self.command} {self.path}"
                headers = {k: v for k, v in self.headers.items() if k.lower() != "host"}
                up = http.client.HTTPConnection(host, int(port), timeout=30)
                try:
                    up.request(self.command, self.path, body=body, headers=headers)
                    resp = up.getresponse()
                    data = resp.read()
                finally:
                    up.close()
                with proxy.lock:
                    proxy.seen.append(line)
                    hit = next((p for p in proxy.lose if line.startswith(p)), None)
                    if hit is not None:
                        proxy.lose.remove(hit)
                        proxy.lost.append(line)
                if hit is not None:  # applied upstream; the client hears nothing
                    self.close_connection = True
                    return
                skip = ("content-length", "connection", "date", "server")
                headers = [(k, v) for k, v in resp.getheaders() if k.lower() not in skip]
                _reply(self, resp.status, headers, data)

            do_GET = do_POST = do_PUT = do_DELETE = _any

        self._listen(Handler)
