"""A tiny HTTP client for the service tests: one keep-alive connection, JSON in and out."""

from __future__ import annotations

import http.client
import json
from typing import Any
from urllib.parse import urlsplit


class Client:
    def __init__(self, url: str, timeout: float = 30.0) -> None:
        parts = urlsplit(url)
        self.conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=timeout)

    def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        raw: bytes | None = None,
        ctype: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> tuple[int, Any, http.client.HTTPResponse]:
        hdrs = dict(headers or {})
        data: bytes | None = None
        if raw is not None:
            data = raw
            hdrs["Content-Type"] = ctype or "application/octet-stream"
        elif body is not None:
            data = json.dumps(body).encode()
            hdrs["Content-Type"] = ctype or "application/json"
        self.conn.request(method, path, body=data, headers=hdrs)
        resp = self.conn.getresponse()
        payload = resp.read()
        is_json = resp.headers.get("Content-Type", "").startswith("application/json")
        value = json.loads(payload) if payload and is_json else (payload or None)
        return resp.status, value, resp

    def get(self, path: str, **kw: Any) -> tuple[int, Any]:
        status, value, _ = self.request("GET", path, **kw)
        return status, value

    def post(self, path: str, body: Any = None, **kw: Any) -> tuple[int, Any]:
        status, value, _ = self.request("POST", path, body, **kw)
        return status, value

    def put(self, path: str, body: Any = None, **kw: Any) -> tuple[int, Any]:
        status, value, _ = self.request("PUT", path, body, **kw)
        return status, value

    def delete(self, path: str, **kw: Any) -> tuple[int, Any]:
        status, value, _ = self.request("DELETE", path, **kw)
        return status, value

    def close(self) -> None:
        self.conn.close()


def sse_events(data: bytes) -> list[dict[str, str]]:
    """Parse a text/event-stream body into events (comments and `retry:` lines dropped)."""
    events = []
    for block in data.decode().split("\n\n"):
        ev: dict[str, str] = {}
        for line in block.split("\n"):
            if not line or line.startswith(":") or line.startswith("retry:"):
                continue
            key, _, value = line.partition(": ")
            ev[key] = value
        if ev:
            events.append(ev)
    return events
