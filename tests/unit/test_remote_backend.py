"""The remote backend's own behaviour (spec/SERVICE.md SVC-58..SVC-60): its URI and options, the
capabilities it takes from the service, typed errors and incarnations over HTTP, waits woken by
the served store, one request per call, and its retries, judged against a live service
(service/server.py's ServiceThread over a store opened here) or against a scripted one
(fake_service.py) where the service must misbehave: throttle, drop answers, hang."""

from __future__ import annotations

import gc
import shutil
import ssl
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fake_service import DROP, LossyProxy, answer, answer_then_close, fake_service, hang

import tidelog
from tidelog import FakeClock, registry
from tidelog.backends.remote.client import Client, Request
from tidelog.backends.remote.options import parse_address, parse_remote_options
from tidelog.backends.remote.retry import Outcome, backoff_ms, retry_delay_ms
from tidelog.errors import (
    Backpressure,
    BadName,
    BadOption,
    BadURI,
    Busy,
    ConfigMismatch,
    NoSuchSubscriber,
    NoSuchTopic,
    NotAvailable,
    StorageError,
    Throttled,
    TidelogError,
    TopicFull,
    Unauthorized,
)
from tidelog.uri import parse_uri

pytest.importorskip("aiohttp")
from tidelog.service.server import ServiceThread


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock(1_000_000)


@pytest.fixture
def served(clock: FakeClock) -> Iterator[tidelog.Store]:
    """A memory store under the test's clock (the one a service serves)."""
    store = tidelog.open("memory://", clock=clock)
    yield store
    store.close()


@pytest.fixture
def service(served: tidelog.Store) -> Iterator[ServiceThread]:
    with ServiceThread(served) as svc:
        yield svc


@pytest.fixture
def remote(service: ServiceThread) -> Iterator[tidelog.Store]:
    with tidelog.open(service.url) as store:
        yield store


def _count_requests(store: tidelog.Store, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every request the store's client sends from now on, as ``METHOD path``."""
    client: Client = store._backend.client  # type: ignore[attr-defined]
    sent: list[str] = []
    original = client._exchange

    def counting(req: Request) -> Any:
        sent.append(f"{req.method} {req.path}")
        return original(req)

    monkeypatch.setattr(client, "_exchange", counting)
    return sent


# -- the scheme, its address and options (SVC-58, URI-2) ------------------------------------------


def test_SVC_58_http_addresses_may_carry_a_port_no_other_location_may() -> None:
    """SVC-58, URI-2: an http:// or https:// location is host[:port][/base], the only one that
    may carry a port (80 and 443 by default); the rendered URI keeps it as given."""
    for text, (tls, host, port, base) in {
        "http://127.0.0.1:9000": (False, "127.0.0.1", 9000, ""),
        "https://example.org": (True, "example.org", 443, ""),
        "http://[::1]:8080/tl/": (False, "::1", 8080, "/tl"),
        "http://h": (False, "h", 80, ""),
    }.items():
        uri = parse_uri(text)
        a = parse_address(uri)
        assert (a.tls, a.host, a.port, a.base) == (tls, host, port, base)
    assert parse_uri("http://127.0.0.1:9000/x?retry_ms=5").render() == (
        "http://127.0.0.1:9000/x?retry_ms=5"
    )
    for bad in ("memory://x:80", "http://u:p@h:1", "http://h:99999", "http://h:x"):
        with pytest.raises(BadURI):
            tidelog.open(bad)
    with pytest.raises(BadURI, match="no host"):
        parse_address(parse_uri("http://:9000"))


def test_SVC_58_options_are_checked_before_anything_is_sent() -> None:
    """SVC-58, URI-2, URI-6: unknown keys (the served store's own options among them), values
    out of range and a token that cannot be a header are bad_option before a request; the token
    is never shown in the message."""
    with fake_service() as fake:
        for options, match in (
            ({"colour": "red"}, "unknown option 'colour'"),
            ({"max_bytes": "1MiB"}, "unknown option 'max_bytes'"),
            ({"timeout_ms": "0"}, "timeout_ms"),
            ({"retry_ms": 3_600_001}, "retry_ms"),
            ({"token": "two words"}, "not shown"),
        ):
            with pytest.raises(BadOption, match=match) as info:
                tidelog.open(fake.url, **options)
            assert "two words" not in str(info.value)
        assert fake.connections == 0  # nothing was sent, not even GET /v0
    opts = parse_remote_options("http", {"timeout_ms": "250"}, environ={"TIDELOG_TOKEN": "s3"})
    assert (opts.token, opts.timeout_ms, opts.retry_ms) == ("s3", 250, 10_000)
    mine = parse_remote_options("http", {"token": "mine"}, environ={"TIDELOG_TOKEN": "s3"})
    assert mine.token == "mine"
    with pytest.raises(BadOption, match="TIDELOG_TOKEN"):
        parse_remote_options("http", {}, environ={"TIDELOG_TOKEN": "bad token"})


def test_SVC_58_the_token_is_sent_as_a_bearer_header(monkeypatch: pytest.MonkeyPatch) -> None:
    """SVC-58, SVC-9: the token option, else $TIDELOG_TOKEN, goes in `Authorization: Bearer`
    on every request; without either there is no such header; 401 raises Unauthorized."""
    monkeypatch.setenv("TIDELOG_TOKEN", "from-env")
    with fake_service([answer(200, {"topics": []})] * 3) as fake:
        with tidelog.open(fake.url, token="from-option") as store:
            store.topics()
        with tidelog.open(fake.url) as store:
            store.topics()
        monkeypatch.delenv("TIDELOG_TOKEN")
        with tidelog.open(fake.url) as store:
            store.topics()
        auth = [r.headers.get("Authorization") for r in fake.requests]
    assert auth == ["Bearer from-option", "Bearer from-env", None]
    body = {"error": {"code": "unauthorized", "message": "no token"}}
    with (
        fake_service([answer(401, body, {"WWW-Authenticate": "Bearer"})]) as fake,
        tidelog.open(fake.url) as store,
        pytest.raises(Unauthorized, match="no token"),
    ):
        store.topics()


def test_SVC_58_SVC_45_no_throttle_sends_the_override_header() -> None:
    """SVC-58, SVC-45: with `no_throttle=true` every request carries `X-Tidelog-No-Throttle: 1`
    (the override the append endpoints read); without it, none does; a value that is not a
    boolean is bad_option before anything is sent."""
    with fake_service([answer(200, {"topics": []})] * 2) as fake:
        with tidelog.open(fake.url, no_throttle="true") as store:
            store.topics()
        with tidelog.open(fake.url) as store:
            store.topics()
        seen = [r.headers.get("X-Tidelog-No-Throttle") for r in fake.requests]
        with pytest.raises(BadOption, match="no_throttle"):
            tidelog.open(fake.url, no_throttle="sometimes")
    assert seen == ["1", None]  # the call of each store (the fake does not keep GET /v0)


def test_SVC_58_a_server_that_is_not_the_api_is_an_io_error() -> None:
    """SVC-58, SVC-4: an answer to GET /v0 without "api": "v0" is io_error at open."""
    with fake_service(hello={"api": "v9"}) as fake, pytest.raises(StorageError, match="v0"):
        tidelog.open(fake.url)


@pytest.fixture
def certificate(tmp_path: Path) -> tuple[str, str]:
    """A self-signed certificate for 127.0.0.1 (made by the openssl command)."""
    openssl = shutil.which("openssl")
    if openssl is None:
        pytest.skip("needs the openssl command to make a test certificate")
    cert, key = str(tmp_path / "cert.pem"), str(tmp_path / "key.pem")
    subprocess.run(
        [openssl, "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", key, "-out", cert,
         "-days", "1", "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1"],
        check=True, capture_output=True, timeout=60,
    )  # fmt: skip
    return cert, key


def test_SVC_58_https_verifies_the_service(
    certificate: tuple[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """SVC-58, SVC-60: https:// speaks TLS, verified with the ssl module's defaults: a service
    whose certificate is trusted (here through SSL_CERT_FILE) is used; one that is not is
    io_error at once (not repeated: nothing was sent)."""
    cert, key = certificate
    server_tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server_tls.load_cert_chain(cert, key)
    with fake_service([answer(200, {"topics": ["t0"]})], tls=server_tls) as fake:
        assert fake.url.startswith("https://")
        start = time.monotonic()
        with pytest.raises(StorageError, match=r"TLS.*not applied"):
            tidelog.open(fake.url)  # not trusted
        assert time.monotonic() - start < 2.0
        monkeypatch.setenv("SSL_CERT_FILE", cert)
        with tidelog.open(fake.url) as store:
            assert store.topics() == ["t0"]


# -- what the served store is (SVC-58, REG-4, CAP-1) ----------------------------------------------


def test_SVC_58_capabilities_are_the_served_stores(tmp_path: Path) -> None:
    """SVC-58, REG-4, CAP-1: a remote store claims the capabilities of the store it is served
    from (the descriptor declares none); what they lack is refused by the core, before a request
    is sent, with not_available."""
    assert registry.descriptor("http").capabilities is None
    assert registry.descriptor("https").location == "address"
    ring = tidelog.open(f"blockdev://{tmp_path}/ring.img?size=64KiB")
    try:
        with ServiceThread(ring) as svc, tidelog.open(svc.url) as store:
            assert store.capabilities == ring.capabilities
            topic = store.topic("default")
            with pytest.raises(NotAvailable, match="queue"):
                topic.claim("n0")
            with pytest.raises(NotAvailable, match="deletes"):
                topic.delete(1)
            assert store.routers() == []
    finally:
        ring.close()


def _workload(store: tidelog.Store, clock: FakeClock) -> list[Any]:
    """Appends of every kind, binary payloads and labels, evictions, reads with tombstones,
    subscribers and queue mode with a lease expiring on the store's clock; every result or
    error code, in order."""
    out: list[Any] = []

    def do(fn: Any) -> None:
        try:
            out.append(fn())
        except TidelogError as exc:
            out.append(exc.code)

    t = store.topic("t0", cap_records=3)
    do(lambda: t.append(bytes(range(256))))
    do(lambda: t.append(b"", tag="\u00e9t\u00e9 tag", node="n/1"))
    do(lambda: t.append_records([(b"\x00\xff", None, "n"), (b"r", "a", None)]))
    do(lambda: t.append_many([b"a", b"b"], producer=("p", 1)))
    do(lambda: t.append_many([b"a", b"b"], producer=("p", 1)))  # TOP-11: applied once
    do(lambda: t.read())
    do(lambda: t.read(after=1, limit=2, exclude_node="n"))
    do(lambda: list(t.iter(batch=1)))
    do(t.state)
    sub = t.subscribe("s0", start="earliest")
    do(lambda: sub.poll(2))
    do(lambda: (sub.ack(5), sub.reject(4), sub.commit(6), sub.hwm))
    do(t.subscribers)
    do(lambda: t.delete(tag="a"))
    q = store.topic("jobs", lease_ms=50, max_deliveries=2, dead_letter="dlq")
    do(lambda: q.append_many([b"j1", b"j2", b"j3"]))
    leases = q.claim("w", max=2)
    out.append(leases)
    clock.advance(50)
    do(lambda: q.complete(leases[0].seq, leases[0].lease_id))  # expired: lease_lost
    again = q.claim("w", max=3)
    out.append(again)
    do(lambda: q.nack(again[0].seq, again[0].lease_id, delay_ms=10))
    do(lambda: q.release(again[1].seq, again[1].lease_id))
    do(lambda: q.complete(again[2].seq, again[2].lease_id))
    clock.advance(10)
    do(lambda: q.claim("w", max=3))
    do(q.state)
    do(store.topics)
    do(lambda: store.router("r0", "t0", "dlq"))
    do(lambda: t.append(b"routed"))
    do(store.routers)
    do(lambda: store.drop_router("r0"))
    do(store.flush)
    return out


def test_SVC_58_the_same_api_over_http(remote: tidelog.Store, clock: FakeClock) -> None:
    """SVC-58, SVC-5, SVC-7, TOP-6, TOP-11, TMB-1, SUB-3, QUE-1, QUE-5, RTR-1: a workload of
    every kind of call gives over HTTP exactly what it gives in process (results and error
    codes), binary payloads and labels included, the lease expiring on the served store's clock."""
    local_clock = FakeClock(clock.now_ms())
    with tidelog.open("memory://", clock=local_clock) as local:
        expected = _workload(local, local_clock)
    assert _workload(remote, clock) == expected
    assert "lease_lost" in expected and any(isinstance(x, tidelog.Tombstone) for x in expected[5])


def test_SVC_58_errors_raise_their_class_over_http(remote: tidelog.Store) -> None:
    """SVC-58, SVC-9, SVC-14, ERR-1: an error answer raises the class its code names, with the
    served store's message, so `pytest.raises(NoSuchTopic)` works over HTTP as in process (an
    unknown topic option too: bad_option)."""
    with pytest.raises(NoSuchTopic, match="'nope'"):
        remote.topic("nope", create=False)
    t = remote.topic("t0", cap_records=1, discard="reject")
    with pytest.raises(ConfigMismatch, match="cap_records"):
        remote.topic("t0", cap_records=2)
    with pytest.raises(ConfigMismatch, match="cap_records"):  # checked by the client (TOP-9)
        remote.topic("t0", create=False, cap_records=2)
    with pytest.raises(BadOption, match="colour"):
        remote.topic("t1", colour="red")
    with pytest.raises(BadOption):
        remote.topic("t1", ttl_ms=object())
    t.append(b"x")
    with pytest.raises(TopicFull):
        t.append(b"y")
    with pytest.raises(NoSuchSubscriber):
        t.subscriber("s9")
    with pytest.raises(NoSuchSubscriber):
        tidelog.Subscriber(t, "s9").poll()
    with pytest.raises(BadName):  # checked by the client's API, no request
        remote.topic("../x")
    bp = remote.topic("bp", cap_records=1, retention="backpressure")
    bp.subscribe("s", start="earliest")
    bp.append(b"1")
    with pytest.raises(Backpressure):
        bp.append(b"2")


def test_SVC_58_a_dropped_topics_handles_fail_even_after_recreation(
    remote: tidelog.Store,
) -> None:
    """SVC-58, SVC-14, TOP-10: every request carries the handle's incarnation, so a handle (and
    its subscribers) from before a drop raises no_such_topic, even once the name is recreated;
    a new handle works on the new life. Config is read once per life: a handle dropped by
    another client still answers it (SVC-58's deviation), every call else raises."""
    old = remote.topic("t0")
    old.append(b"a")
    sub = old.subscribe("s0")
    remote.drop_topic("t0")
    new = remote.topic("t0")
    assert new.incarnation != old.incarnation
    new.append(b"b")
    for call in (
        lambda: old.append(b"x"),
        lambda: old.append(b"x", tag="t"),
        lambda: old.append_many([b"x"]),
        old.read,
        old.state,
        lambda: old.subscribe("s1"),
        lambda: sub.poll(),
        lambda: sub.hwm,
        old.changes,
    ):
        with pytest.raises(NoSuchTopic):
            call()
    assert [r.payload for r in new.read()] == [b"b"]  # type: ignore[union-attr]
    with pytest.raises(NoSuchTopic):
        old.config  # noqa: B018 - the property is the call
    with tidelog.open(remote.uri) as other:  # the deviation SVC-58 states: a drop elsewhere
        other.drop_topic("t0")
    assert new.config.durability == "fsync"  # answered from what this client read
    with pytest.raises(NoSuchTopic):
        new.state()


# -- waits (SVC-59) --------------------------------------------------------------------------------


def test_SVC_59_waits_are_woken_by_the_served_store(remote: tidelog.Store) -> None:
    """SVC-59, CON-3, SUB-6: read(wait_ms), poll(wait_ms) and backpressure_wait_ms end soon after
    another client's op changes the topic, long before their wait is over."""
    t = remote.topic("t0")
    bp = remote.topic("bp", cap_records=1, retention="backpressure", backpressure_wait_ms=20_000)
    bsub = bp.subscribe("s", start="earliest")
    bp.append(b"full")

    def later(fn: Any) -> threading.Thread:
        def run() -> None:
            time.sleep(0.2)
            fn()

        th = threading.Thread(target=run)
        th.start()
        return th

    for wait, act in (
        (lambda: t.read(after=0, wait_ms=20_000), lambda: t.append(b"one")),
        (lambda: t.subscribe("s0", start="latest").poll(wait_ms=20_000), lambda: t.append(b"2")),
        (lambda: bp.append(b"more"), lambda: bsub.ack(1)),
    ):
        th = later(act)
        start = time.monotonic()
        out = wait()
        took = time.monotonic() - start
        th.join()
        assert out and took < 5.0, (out, took)
    assert t.read(after=2, wait_ms=300) == []  # nothing came: an empty answer after the wait


def test_SVC_58_SVC_59_one_request_per_call_and_waits_do_not_poll(
    remote: tidelog.Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """SVC-58, SVC-59: each call is one request (a read without a wait reads no change
    counter); a wait of 1.5 s that nothing ends is a few requests, not a poll loop."""
    t = remote.topic("t0")
    sent = _count_requests(remote, monkeypatch)
    t.append(b"x")
    t.read()
    t.append(b"y", tag="a")
    assert sent == [
        "POST /v0/topics/t0/records",
        "GET /v0/topics/t0/records",
        "POST /v0/topics/t0/batch",
    ]
    sent.clear()
    assert t.read(after=2, wait_ms=1500) == []
    assert 3 <= len(sent) <= 6, sent


# -- threads (CON-1) ------------------------------------------------------------------------------


def test_SVC_58_many_threads_share_one_remote_store(remote: tidelog.Store) -> None:
    """SVC-58, CON-1: the API called from several threads at once (a keep-alive connection
    each): every append gets its own seq, the seqs are gapless, nothing fails."""
    t = remote.topic("t0")
    seqs: list[int] = []
    errors: list[BaseException] = []
    lock = threading.Lock()

    def work(i: int) -> None:
        try:
            got = [t.append(f"{i}-{k}".encode()) for k in range(40)]
            with lock:
                seqs.extend(got)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(6)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert not errors
    assert sorted(seqs) == list(range(1, 241))
    gc.collect()  # the threads ended: their connections closed with them
    assert remote._backend.client.open_connections() <= 1  # type: ignore[attr-defined]


# -- retries (SVC-60) -----------------------------------------------------------------------------


def test_SVC_60_retry_decisions() -> None:
    """SVC-60: the decision table. 503 and 429 throttled are repeated after their wait, 429
    backpressure and other answers never; unsent requests always, lost ones only when safe;
    nothing starts after retry_ms."""
    budget = {"attempt": 0, "elapsed_ms": 0, "retry_ms": 10_000}
    answered = {
        Outcome("answer", 503, "busy", 250): 250,
        Outcome("answer", 503, "closed", None): 1000,
        Outcome("answer", 503, None, None): 1000,  # a proxy's 503 without our body
        Outcome("answer", 429, "throttled", 400): 400,
        Outcome("answer", 429, "backpressure", 1000): None,
        Outcome("answer", 404, "no_such_topic"): None,
        Outcome("answer", 500, "io_error"): None,
        Outcome("answer", 409, "lease_lost"): None,
    }
    for outcome, delay in answered.items():
        for safe in (True, False):
            assert retry_delay_ms(outcome, safe=safe, **budget) == delay, outcome
    assert retry_delay_ms(Outcome("unsent"), safe=False, **budget) == 0
    assert retry_delay_ms(Outcome("lost"), safe=True, **budget) == 0
    assert retry_delay_ms(Outcome("lost"), safe=False, **budget) is None
    assert [backoff_ms(a) for a in range(9)] == [0, 50, 100, 200, 400, 800, 1000, 1000, 1000]
    late = {"attempt": 3, "elapsed_ms": 9_900, "retry_ms": 10_000}
    assert retry_delay_ms(Outcome("lost"), safe=True, **late) is None  # 9900 + 200 > 10000
    assert retry_delay_ms(Outcome("answer", 503, "busy", 100), safe=True, **late) == 100
    assert retry_delay_ms(Outcome("unsent"), safe=True, attempt=0, elapsed_ms=0,
                          retry_ms=0) == 0  # fmt: skip
    assert retry_delay_ms(Outcome("unsent"), safe=True, attempt=1, elapsed_ms=0,
                          retry_ms=0) is None  # fmt: skip


def _topic_answer() -> dict[str, Any]:
    """GET /v0/topics/t0's answer (SVC-14)."""
    return {"name": "t0", "incarnation": 1, "config": {}, "state": {}, "subscribers": [],
            "priority": 0}  # fmt: skip


def _throttled(ms: int) -> dict[str, Any]:
    return {"error": {"code": "throttled", "message": "saturated", "retry_after_ms": ms}}


def test_SVC_60_repeats_after_429_throttled_and_503_after_their_wait() -> None:
    """SVC-60: an append refused with 429 throttled (nothing stored) is sent again after
    retry_after_ms, as many times as retry_ms allows, and returns the seq of the one that was
    taken; one Retry-After without a body's retry_after_ms is read in whole seconds."""
    closing = {"error": {"code": "closed", "message": "shutting down"}}
    script = [answer(200, _topic_answer()), answer(429, _throttled(60)),
              answer(503, closing, {"Retry-After": "1"}), answer(200, {"seq": 7})]  # fmt: skip
    with fake_service(script) as fake, tidelog.open(fake.url) as store:
        t = store.topic("t0", create=False)
        start = time.monotonic()
        assert t.append(b"x") == 7
        took = time.monotonic() - start
        paths = [r.path for r in fake.requests[1:]]
    assert paths == ["/v0/topics/t0/records?incarnation=1"] * 3
    assert 1.0 <= took < 5.0  # 60 ms, then Retry-After's 1 s (the body gave no retry_after_ms)


def test_SVC_60_gives_up_after_retry_ms_with_the_last_error() -> None:
    """SVC-60: no repeat starts later than retry_ms after the first attempt: the last error is
    raised (Throttled with its retry_after_ms); retry_ms=0 never repeats; 429 backpressure is
    raised at once, never repeated."""
    script = [answer(200, _topic_answer())] + [answer(429, _throttled(100))] * 20
    with fake_service(script) as fake, tidelog.open(fake.url, retry_ms=350) as store:
        # the client's clock is virtual: only its sleeps move it, so a loaded machine's late
        # wake-ups cannot push a repeat past retry_ms
        now = [0.0]
        client = store._backend.client  # type: ignore[attr-defined]
        client._monotonic = lambda: now[0]
        client._sleep = lambda s: now.__setitem__(0, now[0] + s)
        t = store.topic("t0", create=False)
        with pytest.raises(Throttled) as info:
            t.append(b"x")
        assert info.value.retry_after_ms == 100
        assert len(fake.requests) == 1 + 4  # at 0, 100, 200, 300 ms; 400 is past 350
        assert now[0] == pytest.approx(0.3)
    busy = {"error": {"code": "busy", "message": "b"}}
    script = [answer(200, _topic_answer()), answer(503, busy)]
    with fake_service(script) as fake, tidelog.open(fake.url, retry_ms=0) as store:
        with pytest.raises(Busy):
            store.topic("t0", create=False).read()
        assert len(fake.requests) == 2
    full = {"error": {"code": "backpressure", "message": "full", "retry_after_ms": 1000}}
    with fake_service([answer(200, _topic_answer()), answer(429, full)]) as fake:
        with tidelog.open(fake.url) as store, pytest.raises(Backpressure):
            store.topic("t0", create=False).append(b"x")
        assert len(fake.requests) == 2


def test_SVC_60_a_lost_answer_is_repeated_only_when_safe() -> None:
    """SVC-60, SVC-23, SVC-24: after a lost answer a read and a producer batch are sent again
    (on a new connection) and succeed; an append without a producer is not: io_error saying it
    may have been applied, having reached the service once."""
    script = [answer(200, _topic_answer()), DROP, answer(200, {"items": [], "next_after": 0}),
              DROP, answer(200, {"seqs": [1]}), DROP]  # fmt: skip
    with fake_service(script) as fake, tidelog.open(fake.url) as store:
        t = store.topic("t0", create=False)
        assert t.read() == []
        assert t.append_many([b"a"], producer=("p", 1)) == [1]
        with pytest.raises(StorageError, match="may have been applied") as info:
            t.append(b"once")
        assert info.value.maybe_applied is True  # type: ignore[attr-defined]
        paths = [r.path.split("?")[0] for r in fake.requests]
        assert paths == ["/v0/topics/t0"] + ["/v0/topics/t0/records"] * 2 + (
            ["/v0/topics/t0/batch"] * 2 + ["/v0/topics/t0/records"]
        )
        assert fake.requests[3].body == fake.requests[4].body  # the same batch, unchanged


def test_SVC_60_handing_out_calls_repeat_with_the_same_request_id() -> None:
    """SVC-60, SVC-25: poll, claim, complete, release and nack carry a request_id the client
    makes per call: a repeat after a lost answer sends the same one, the next call a new one."""
    lease = {"seq": 1, "lease_id": 1, "deadline_ms": 5, "deliveries": 1,
             "record": {"seq": 1, "ts": 0, "tag": None, "node": None, "payload": ""}}  # fmt: skip
    script = [answer(200, _topic_answer()), DROP, answer(200, {"items": []}),
              answer(200, {"items": []}), DROP, answer(200, {"leases": [lease]}), DROP,
              answer(204), DROP, answer(204), DROP, answer(204)]  # fmt: skip
    with fake_service(script) as fake, tidelog.open(fake.url) as store:
        t = store.topic("t0", create=False)
        sub = tidelog.Subscriber(t, "s0")
        sub.poll()
        sub.poll()
        (got,) = t.claim("n0")
        t.complete(got.seq, got.lease_id)
        t.release(1, 1)
        t.nack(1, 1, delay_ms=5)
        ids = [r.json()["request_id"] for r in fake.requests[1:]]
    assert ids[0] == ids[1] != ids[2]  # poll repeated, then a second poll
    for i in (3, 5, 7, 9):  # claim, complete, release, nack: each sent twice, one id each
        assert ids[i] == ids[i + 1]
    assert len(set(ids)) == 6


def test_SVC_60_lost_answers_of_a_live_service_strand_nothing(
    service: ServiceThread, served: tidelog.Store
) -> None:
    """SVC-60, SVC-23, SVC-24, SVC-25: answers lost after the live service applied the call
    (a relay drops them): the repeat of a poll and of a claim gets the kept answer (nothing
    stranded, nothing handed out twice), complete's repeat is no lease_lost, a producer batch
    is stored once (its repeat answers [], TOP-11), a drop of a topic succeeds; an append
    without a producer raises io_error (may have been applied) and is stored once."""
    t0 = "POST /v0/topics/t0"
    lose = [f"{t0}/subscribers/s0/poll", f"{t0}/claim", f"{t0}/complete", f"{t0}/batch",
            f"{t0}/records", "DELETE /v0/topics/gone"]  # fmt: skip
    with LossyProxy(service.url, lose) as proxy, tidelog.open(proxy.url) as store:
        t = store.topic("t0")
        store.topic("gone")
        sub = t.subscribe("s0")
        served.topic("t0", create=False).append_many([b"a", b"b", b"c"])  # in process
        assert t.append_many([b"p"], producer=("prod", 1)) == []  # applied by the lost one
        assert [r.seq for r in sub.poll(2)] == [1, 2]  # type: ignore[union-attr]
        assert [r.seq for r in sub.poll(5)] == [3, 4]  # type: ignore[union-attr]
        (lease,) = t.claim("w")
        t.complete(lease.seq, lease.lease_id)
        # a claim applied twice would have stranded seq 1 and completed seq 2
        assert (lease.seq, [x.seq for x in t.claim("w", max=10)]) == (1, [2, 3, 4])
        with pytest.raises(StorageError, match="may have been applied"):
            t.append(b"once")
        store.drop_topic("gone")
        assert proxy.lose == [] and len(proxy.lost) == 6
    live = served.topic("t0", create=False)
    payloads = [r.payload for r in live.read()]  # type: ignore[union-attr]
    assert payloads.count(b"p") == 1 and payloads.count(b"once") == 1
    assert b"a" not in payloads  # completed, so deleted (QUE-3): it was leased once
    assert "gone" not in served.topics()


def test_SVC_60_a_repeated_drop_that_finds_it_gone_took_effect() -> None:
    """SVC-60, SVC-23: DELETE of a topic whose answer was lost is repeated; the repeat's 404
    means the first removed it: success. Without a lost answer a 404 is no_such_topic."""
    gone = {"error": {"code": "no_such_topic", "message": "topic 't0' does not exist"}}
    with fake_service([DROP, answer(404, gone), answer(404, gone)]) as fake:
        with tidelog.open(fake.url) as store:
            store.drop_topic("t0")
            with pytest.raises(NoSuchTopic):
                store.drop_topic("t0")
        assert len(fake.requests) == 3


def test_SVC_60_no_connection_means_not_applied() -> None:
    """SVC-60: when no connection can be made nothing was sent: io_error saying it was not
    applied (maybe_applied False), after repeating within retry_ms."""
    with fake_service() as fake:
        url = fake.url
    start = time.monotonic()
    with pytest.raises(StorageError, match="not applied") as info:
        tidelog.open(url, retry_ms=300)
    assert info.value.maybe_applied is False  # type: ignore[attr-defined]
    assert "attempt(s)" in info.value.message and time.monotonic() - start < 5


def test_SVC_60_a_timeout_is_a_lost_answer() -> None:
    """SVC-60, SVC-58: an answer that does not come within timeout_ms is lost: an append without
    a producer raises io_error (may have been applied) after one attempt."""
    with fake_service([answer(200, _topic_answer()), hang(2.0)]) as fake:
        with tidelog.open(fake.url, timeout_ms=200) as store:
            t = store.topic("t0", create=False)
            start = time.monotonic()
            with pytest.raises(StorageError, match=r"timed out.*may have been applied"):
                t.append(b"x")
            assert time.monotonic() - start < 1.5
        assert len(fake.requests) == 2


def test_SVC_60_an_idle_connection_the_service_closed_is_not_reused() -> None:
    """SVC-60: a keep-alive connection the service closed while the client was idle is found
    closed before the next request, which goes on a new connection: an append is not lost."""
    script = [answer_then_close(200, _topic_answer()), answer(200, {"seq": 1})]
    with fake_service(script) as fake, tidelog.open(fake.url, retry_ms=0) as store:
        t = store.topic("t0", create=False)
        time.sleep(0.1)  # the service's close reaches the client
        assert t.append(b"x") == 1
        assert [r.connection for r in fake.requests] == [1, 2]


def test_SVC_60_keep_alive_one_connection_per_thread(remote: tidelog.Store) -> None:
    """SVC-58: calls from one thread share one keep-alive connection."""
    t = remote.topic("t0")
    for _ in range(20):
        t.append(b"x")
    assert remote._backend.client.open_connections() == 1  # type: ignore[attr-defined]


def test_SVC_58_error_answers_without_an_error_body_are_typed() -> None:
    """SVC-9, ERR-1: an answer that is not the service's (a proxy's 502 with HTML) still raises
    a TidelogError naming the status; a 200 whose body is not JSON is io_error."""
    script = [answer(502, b"<html>bad gateway</html>"), answer(200, b"<html>hi</html>")]
    with fake_service(script) as fake, tidelog.open(fake.url, retry_ms=0) as store:
        with pytest.raises(TidelogError, match="HTTP 502"):
            store.topics()
        with pytest.raises(StorageError, match="not valid JSON"):
            store.topics()


def test_SVC_58_a_token_in_the_uri_is_never_echoed() -> None:
    """The store's URI, as repr and errors show it, hides the token's value."""
    from tidelog.uri import parse_uri

    shown = parse_uri("http://127.0.0.1:9/?token=s3cret&timeout_ms=5").render()
    assert "s3cret" not in shown and "token=%2A%2A%2A" in shown and "timeout_ms=5" in shown
