"""Tokens, rights and limits through a live service (SVC-47..SVC-51), and the start-up checks
of `tidelog serve` (SVC-3, SVC-50)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

import tidelog
from tidelog.service.auth import hash_token
from tidelog.service.server import ServiceThread

from .http import Client
from .test_streams import Stream

INGEST, READER, OPS = "ingest-secret", "reader-secret", "ops-secret"


def write_tokens(path: Path, reader_rights: list[str]) -> None:
    path.write_text(
        json.dumps(
            {
                "tokens": [
                    {"name": "ingest", "sha256": hash_token(INGEST),
                     "grants": [{"topics": "sensor-*", "rights": ["write"]}]},
                    {"name": "reader", "sha256": hash_token(READER),
                     "grants": [{"topics": "sensor-*", "rights": reader_rights}]},
                    {"name": "ops", "sha256": hash_token(OPS),
                     "grants": [{"topics": "*", "rights": ["read", "write", "admin"]}]},
                ]
            }
        )
    )  # fmt: skip


class Secured:
    def __init__(self, tmp_path: Path) -> None:
        self.tokens = tmp_path / "tokens.json"
        write_tokens(self.tokens, ["read"])
        self.store = tidelog.open("memory://")
        self.thread = ServiceThread(
            self.store, tokens=str(self.tokens), sse_heartbeat_ms=100, max_streams_per_token=2
        ).start()
        self.url = self.thread.url

    def client(self, token: str | None) -> Client:
        return Client(self.url)

    def headers(self, token: str | None) -> dict[str, str]:
        return {} if token is None else {"Authorization": f"Bearer {token}"}


@pytest.fixture
def secured(tmp_path: Path) -> Iterator[Secured]:
    s = Secured(tmp_path)
    try:
        yield s
    finally:
        s.thread.stop()
        s.store.close()


def call(s: Secured, token: str | None, method: str, path: str, **kw: object) -> tuple[int, object]:
    c = Client(s.url)
    try:
        status, body, _ = c.request(method, path, headers=s.headers(token), **kw)  # type: ignore[arg-type]
        return status, body
    finally:
        c.close()


def test_SVC_49_no_token_401_unknown_401_without_the_right_403(secured: Secured) -> None:
    assert call(secured, OPS, "PUT", "/v0/topics/sensor-1", body={"durability": "memory"})[0] == 200
    status, body = call(secured, None, "GET", "/v0/topics/sensor-1/records")
    assert status == 401 and body["error"]["code"] == "unauthorized"  # type: ignore[index]
    assert call(secured, "wrong", "GET", "/v0/topics/sensor-1/records")[0] == 401
    status, body = call(secured, INGEST, "GET", "/v0/topics/sensor-1/records")
    assert status == 403 and body["error"]["code"] == "forbidden"  # type: ignore[index]
    # decided before the topic is looked up: a missing topic outside the grants is also 403
    assert call(secured, INGEST, "GET", "/v0/topics/secret/records")[0] == 403
    assert call(secured, INGEST, "POST", "/v0/topics/sensor-1/records", raw=b"x")[0] == 200
    assert call(secured, READER, "GET", "/v0/topics/sensor-1/records")[0] == 200
    assert call(secured, None, "GET", "/v0/health")[0] == 200  # health needs no token


def test_SVC_48_rights_per_route_and_store_wide(secured: Secured) -> None:
    assert call(secured, READER, "PUT", "/v0/topics/sensor-2", body={})[0] == 403  # admin
    assert call(secured, OPS, "PUT", "/v0/topics/sensor-2", body={"durability": "memory"})[0] == 200
    assert call(secured, OPS, "PUT", "/v0/topics/other", body={"durability": "memory"})[0] == 200
    assert call(secured, READER, "GET", "/v0/topics") == (200, {"topics": ["sensor-2"]})
    assert call(secured, OPS, "GET", "/v0/topics") == (200, {"topics": ["other", "sensor-2"]})
    assert call(secured, READER, "POST", "/v0/flush")[0] == 403  # admin on '*'
    assert call(secured, OPS, "POST", "/v0/flush")[0] == 204
    assert call(secured, READER, "GET", "/v0/metrics")[0] == 403
    assert call(secured, OPS, "GET", "/v0/metrics")[0] == 200
    # routers: admin on source and dest
    status, _ = call(
        secured, OPS, "PUT", "/v0/routers/r", body={"source": "sensor-2", "dest": "other"}
    )
    assert status == 200
    assert call(secured, READER, "GET", "/v0/routers") == (200, {"routers": []})
    assert call(secured, READER, "DELETE", "/v0/routers/r")[0] == 403


def test_SVC_49_a_reload_that_takes_read_ends_the_stream(secured: Secured) -> None:
    call(secured, OPS, "PUT", "/v0/topics/sensor-3", body={"durability": "memory"})

    class Served:
        thread = secured.thread

    stream = Stream(Served(), "/v0/topics/sensor-3/events", secured.headers(READER))  # type: ignore[arg-type]
    try:
        assert stream.status == 200
        write_tokens(secured.tokens, ["write"])
        service = secured.thread.service
        assert service is not None
        assert service.authz.reload() is None
        events = stream.events(1, timeout=10)
        assert events[0]["event"] == "error"
        assert events[0]["data"]["error"]["code"] == "forbidden"
    finally:
        stream.close()


def test_SVC_51_streams_per_token_are_bounded(secured: Secured) -> None:
    call(secured, OPS, "PUT", "/v0/topics/sensor-4", body={"durability": "memory"})

    class Served:
        thread = secured.thread

    streams = [
        Stream(Served(), "/v0/topics/sensor-4/events", secured.headers(READER))  # type: ignore[arg-type]
        for _ in range(2)
    ]
    try:
        assert all(s.status == 200 for s in streams)
        time.sleep(0.2)
        status, body = call(secured, READER, "GET", "/v0/topics/sensor-4/events")
        assert status == 503 and body["error"]["code"] == "busy"  # type: ignore[index]
    finally:
        for s in streams:
            s.close()


def test_SVC_51_SVC_52_request_body_and_header_limits(tmp_path: Path) -> None:
    store = tidelog.open("memory://")
    with ServiceThread(store, max_request_bytes="4KiB", max_header_bytes="1KiB") as t:
        c = Client(t.url)
        c.put("/v0/topics/a", {"durability": "memory"})
        status, body, _ = c.request("POST", "/v0/topics/a/records", raw=b"x" * 5000)
        assert status == 413 and body["error"]["code"] == "too_large"
        c2 = Client(t.url)
        status, _, _ = c2.request("GET", "/v0", headers={"X-Big": "y" * 2000})
        assert status in (400, 431)
        assert Client(t.url).get("/v0")[0] == 200  # the service goes on (SVC-52)
    store.close()


def serve_argv(*args: str) -> list[str]:
    return [sys.executable, "-m", "tidelog", "serve", "--uri", "memory://", "--port", "0", *args]


def test_SVC_3_SVC_50_unsafe_addresses_are_refused_before_anything_binds(tmp_path: Path) -> None:
    for args, words in (
        (("--host", "0.0.0.0"), "--tokens"),
        (("--host", "0.0.0.0", "--tokens", "x.json"), None),
        (("--tls-cert", "c.pem"), "--tls-key"),
    ):
        result = subprocess.run(
            serve_argv(*args), cwd=tmp_path, capture_output=True, text=True, timeout=60
        )
        assert result.returncode != 0, args
        assert "bad_option" in result.stderr or "Error" in result.stderr, result.stderr
        if words:
            assert words in result.stderr


def test_SVC_50_https_with_a_certificate(tmp_path: Path) -> None:
    """TLS end to end: a self-signed certificate, the service answers over https only."""
    import ssl

    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
         "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1",
         "-keyout", str(key), "-out", str(cert)],
        check=True, capture_output=True, timeout=60,
    )  # fmt: skip
    proc = subprocess.Popen(
        serve_argv("--tls-cert", str(cert), "--tls-key", str(key)),
        cwd=tmp_path, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline().strip()
        assert line.startswith("listening on https://127.0.0.1:"), line
        port = int(line.rsplit(":", 1)[1].split("/")[0])
        import http.client

        ctx = ssl.create_default_context(cafile=str(cert))
        conn = http.client.HTTPSConnection("127.0.0.1", port, context=ctx, timeout=10)
        conn.request("GET", "/v0/health")
        assert conn.getresponse().status == 200
        plain = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
        with pytest.raises((ConnectionError, http.client.HTTPException, OSError)):
            plain.request("GET", "/v0/health")
            plain.getresponse()
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)


def test_SVC_51_a_slow_body_is_408_and_the_connection_closes() -> None:
    import socket as socketlib

    store = tidelog.open("memory://")
    with ServiceThread(store, request_timeout_ms=300) as t:
        Client(t.url).put("/v0/topics/a", {"durability": "memory"})
        with socketlib.create_connection((t.host, t.port), timeout=10) as sock:
            sock.sendall(
                b"POST /v0/topics/a/records HTTP/1.1\r\nHost: x\r\n"
                b"Content-Type: application/octet-stream\r\nContent-Length: 10\r\n\r\nab"
            )
            answer = b""
            while chunk := sock.recv(4096):
                answer += chunk
        assert answer.split(b"\r\n")[0].split(b" ")[1] == b"408"
        assert b"request_timeout" in answer
        assert store.topic("a", create=False).state().head_seq == 0
    store.close()


def test_SVC_51_one_connection_over_the_limit_is_503_busy() -> None:
    store = tidelog.open("memory://")
    with ServiceThread(store, max_http_connections=2) as t:
        first, second, third = Client(t.url), Client(t.url), Client(t.url)
        assert first.get("/v0")[0] == 200
        assert second.get("/v0")[0] == 200
        status, body = third.get("/v0")
        assert status == 503 and body["error"]["code"] == "busy"
        first.close()
        time.sleep(0.2)
        assert Client(t.url).get("/v0")[0] == 200  # room again once one closed
    store.close()
