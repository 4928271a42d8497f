"""Priority, deferral and throttling through a live service (SVC-35, SVC-36, SVC-42, SVC-44,
SVC-45, SVC-46), driven by the service's injected clock: pressure comes from a real append
held in flight by the store's backpressure wait, with one in-flight slot."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import pytest

import tidelog
from tidelog import FakeClock
from tidelog.service.server import ServiceThread

from .http import Client
from .test_streams import Stream


class Pushed:
    def __init__(self) -> None:
        self.clock = FakeClock()
        self.store = tidelog.open("memory://")
        self.thread = ServiceThread(
            self.store,
            clock=self.clock,
            max_inflight_appends=1,
            sse_heartbeat_ms=100,
            priority=["hi-*=800"],
        ).start()
        self.url = self.thread.url
        self.client = Client(self.url)

    def advance(self, ms: int) -> None:
        """Move the service's clock; the push loop takes the due samples within 100 ms."""
        self.clock.advance(ms)
        time.sleep(0.3)


@pytest.fixture
def pushed() -> Iterator[Pushed]:
    p = Pushed()
    try:
        yield p
    finally:
        p.thread.stop()
        p.store.close()


def test_SVC_36_priority_from_options_and_put(pushed: Pushed) -> None:
    c = pushed.client
    assert c.put("/v0/topics/hi-1", {"durability": "memory"})[1]["priority"] == 800
    assert c.put("/v0/topics/lo", {"durability": "memory"})[1]["priority"] == 0
    assert c.put("/v0/topics/lo/priority", {"priority": -300}) == (200, {"priority": -300})
    assert c.get("/v0/topics/lo")[1]["priority"] == -300
    status, body = c.put("/v0/topics/lo/priority", {"priority": 1001})
    assert status == 400 and body["error"]["code"] == "bad_argument"
    assert c.put("/v0/topics/nope/priority", {"priority": 1})[0] == 404


def test_SVC_35_SVC_42_SVC_44_SVC_45_SVC_46_pressure_defers_low_push_and_throttles(
    pushed: Pushed,
) -> None:
    c = pushed.client
    for name in ("lo", "free"):
        c.put(f"/v0/topics/{name}", {"durability": "memory"})
    c.put("/v0/topics/lo/priority", {"priority": -10})
    c.put(
        "/v0/topics/q",
        {"durability": "memory", "cap_records": 1, "backpressure_wait_ms": 20000},
    )
    c.put("/v0/topics/q/subscribers/s", {"start": "earliest"})
    assert c.post("/v0/topics/q/records", raw=b"1")[0] == 200
    stream = Stream(pushed, "/v0/topics/lo/events")  # type: ignore[arg-type]
    held: list[object] = []
    holder = threading.Thread(
        target=lambda: held.append(Client(pushed.url).post("/v0/topics/q/records", raw=b"2"))
    )
    holder.start()  # waits in the store for room: the one slot is taken
    bypassed: list[object] = []
    unthrottled = tidelog.open(pushed.url, no_throttle=True, retry_ms=0)
    try:
        time.sleep(0.3)
        pushed.advance(1100)  # ten samples at pressure 1 (1 of 1 slots in flight)
        assert stream.events(1, timeout=5)[0]["event"] == "deferred"  # SVC-35, SVC-42
        # SVC-44: saturated and no free slot: refused before the store sees it
        status, body, resp = c.request("POST", "/v0/topics/free/records", raw=b"x")
        assert status == 429 and body["error"]["code"] == "throttled"
        assert int(resp.headers["Retry-After"]) >= 1
        assert pushed.store.topic("free", create=False).state().head_seq == 0
        # SVC-45: the override waits for a slot instead (no tokens: anyone may ask)
        # through the remote backend's option (SVC-58), as a Python writer would ask for it
        free = unthrottled.topic("free", create=False)
        bypass = threading.Thread(target=lambda: bypassed.append(free.append(b"y")))
        bypass.start()
        # SVC-46: a deferred topic's records are stored and readable, only not pushed (the
        # append is made in process: over HTTP it would wait for the one slot)
        assert pushed.store.topic("lo", create=False).append(b"late") == 1
        time.sleep(0.3)
        status, body = c.get("/v0/topics/lo/records?after=0")
        assert [i["seq"] for i in body["items"]] == [1]
        assert stream.events(1, timeout=0.5) == []
        # free the slot: commit the record the held append waits behind
        c.post("/v0/topics/q/subscribers/s/poll", {})
        c.post("/v0/topics/q/subscribers/s/commit", {"seq": 1})
        holder.join(10)
        bypass.join(10)
        assert held == [(200, {"seq": 2})]
        assert bypassed == [1]  # the override was admitted: free's first seq
        pushed.advance(1100)  # ten samples with nothing in flight: deferral ends
        events = stream.events(2, timeout=5)
        assert [e["event"] for e in events] == ["resumed", "record"]
        assert events[1]["id"] == "1"
    finally:
        stream.close()
        holder.join(30)
        unthrottled.close()
