"""Where the service runs a store call (service/calls.py): on the event loop when the backend
says it cannot block, on a thread otherwise. What a client sees does not change: an answer
follows the op's durability, and no call, blocked as it may be, holds up another request."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import tidelog
from tidelog.backends.common.engine import Engine
from tidelog.hooks import hooks
from tidelog.service.server import ServiceThread

from .http import Client


def _in_thread(fn: Any) -> tuple[threading.Thread, list[Any]]:
    out: list[Any] = []
    thread = threading.Thread(target=lambda: out.append(fn()), daemon=True)
    thread.start()
    return thread, out


def test_SVC_15_an_fsync_append_is_answered_only_once_it_is_durable(tmp_path: Path) -> None:
    """SVC-15, DUR-2: the answer to an append on an fsync topic goes out only after the op's
    sync; while the sync is held back nothing is answered and the record is not readable."""
    with tidelog.open(f"file://{tmp_path}/s") as store:
        store.topic("t", durability="fsync")
        journal = hooks(store, Engine).journal
        assert journal is not None
        synced = threading.Event()
        real_wait = journal.wait

        def held_wait(ticket: object) -> None:
            assert synced.wait(30)
            real_wait(ticket)

        journal.wait = held_wait  # type: ignore[method-assign]
        with ServiceThread(store) as svc:
            writer, answers = _in_thread(
                lambda: Client(svc.url).post("/v0/topics/t/records", raw=b"one")
            )
            time.sleep(0.3)
            assert answers == [] and writer.is_alive()
            status, body = Client(svc.url).get("/v0/topics/t/records")
            assert (status, body["items"]) == (200, [])  # not durable: not readable (DUR-2)
            synced.set()
            writer.join(30)
            assert answers == [(200, {"seq": 1})]
            status, body = Client(svc.url).get("/v0/topics/t/records")
            assert [item["seq"] for item in body["items"]] == [1]


def test_SVC_1_a_call_waiting_for_the_store_lock_holds_up_no_other_request() -> None:
    """SVC-1, SVC-52: while another thread holds the store lock, an append waits for it off
    the event loop: other requests are answered meanwhile, and the append once the lock is
    free."""
    with tidelog.open("memory://") as store:
        store.topic("t")
        engine = hooks(store, Engine)
        held, release = threading.Event(), threading.Event()

        def hold() -> None:
            with engine.lock:
                held.set()
                release.wait(30)

        holder = threading.Thread(target=hold, daemon=True)
        with ServiceThread(store) as svc:
            holder.start()
            assert held.wait(10)
            writer, answers = _in_thread(
                lambda: Client(svc.url).post("/v0/topics/t/records", raw=b"x")
            )
            time.sleep(0.2)
            started = time.monotonic()
            assert Client(svc.url).get("/v0/health")[0] == 200
            assert time.monotonic() - started < 2.0
            assert answers == []
            release.set()
            writer.join(30)
            assert answers == [(200, {"seq": 1})]
        holder.join(10)


def test_SUB_6_an_append_waiting_out_backpressure_holds_up_no_other_request() -> None:
    """SUB-6, SVC-1: an append that waits for room (backpressure_wait_ms) waits off the event
    loop; the commit that makes room is served meanwhile, and the append then goes in."""
    with tidelog.open("memory://") as store:
        topic = store.topic(
            "t", cap_records=1, retention="backpressure", backpressure_wait_ms=20_000
        )
        topic.subscribe("s", start="earliest")
        assert topic.append(b"a") == 1
        with ServiceThread(store) as svc:
            writer, answers = _in_thread(
                lambda: Client(svc.url).post("/v0/topics/t/records", raw=b"b")
            )
            time.sleep(0.3)
            assert answers == []  # waiting for room
            client = Client(svc.url)
            started = time.monotonic()
            status, body = client.post("/v0/topics/t/subscribers/s/commit", {"seq": 1})
            assert (status, body) == (200, {"acked": 1})
            assert time.monotonic() - started < 5.0
            writer.join(30)
            assert answers == [(200, {"seq": 2})]


def test_SVC_52_requests_for_no_route_leave_nothing_behind() -> None:
    """SVC-52, SVC-55: a request no route matches is answered 404 and logged under the
    template "(none)"; the per-route facts the service keeps (template, right) grow with the
    routes, never with such requests (aiohttp makes a new route object for each)."""
    with tidelog.open("memory://") as store, ServiceThread(store) as svc:
        client = Client(svc.url)
        for i in range(50):
            assert client.get(f"/nope/{i}")[0] == 404
        assert client.get("/v0/health")[0] == 200
        assert svc.service is not None and len(svc.service._routes) == 1
