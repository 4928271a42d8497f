"""Fixtures: a live service over a store the test opens (so its clock stays the test's)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import tidelog
from tidelog import FakeClock
from tidelog.service.server import ServiceThread

from .http import Client


class Served:
    def __init__(self, store: tidelog.Store, clock: FakeClock, thread: ServiceThread) -> None:
        self.store = store
        self.clock = clock
        self.thread = thread
        self.url = thread.url
        self.client = Client(thread.url)

    def topic(self, name: str = "t", **config: Any) -> dict[str, Any]:
        config.setdefault("durability", "memory")
        status, body = self.client.put(f"/v0/topics/{name}", config)
        assert status == 200, body
        return body


@pytest.fixture(params=["memory", "file"])
def served(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Served]:
    clock = FakeClock()
    uri = "memory://" if request.param == "memory" else f"file://{tmp_path}/store"
    store = tidelog.open(uri, clock=clock)
    thread = ServiceThread(store, sse_heartbeat_ms=200, max_batch=100).start()
    served = Served(store, clock, thread)
    try:
        yield served
    finally:
        served.client.close()
        thread.stop()
        store.close()
