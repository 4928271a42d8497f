"""The public API around the semantics: URIs and options (URI), errors (ERR), capabilities (CAP),
store lifecycle (DUR-1, DUR-7, DUR-8), concurrency and waiting (CON)."""

from __future__ import annotations

import threading
import time
import uuid

import pytest

import tidelog
from tidelog import FakeClock, Record, registry
from tidelog.errors import ERROR_CODES, TidelogError
from tidelog.options import parse_bool, parse_size
from tidelog.uri import parse_uri

# -- URI ------------------------------------------------------------------------------------


def test_URI_1_schemes_and_registry() -> None:
    """URI-1: schemes and registry."""
    assert {"memory", "file", "blockdev", "model"} <= set(registry.known_schemes())
    with pytest.raises(tidelog.UnknownScheme, match="known schemes"):
        tidelog.open("nosuch://x")
    with pytest.raises(tidelog.BadOption, match="size="):  # a missing image needs a size
        tidelog.open("blockdev:///nonexistent-tidelog-dir/img")
    with pytest.raises(ValueError, match="built in"):
        registry.register("memory", "x:y")


def test_URI_1_third_party_scheme_by_registration() -> None:
    """URI-1: third party scheme by registration."""
    from tidelog.backends.memory import open_backend

    opened: list[str] = []

    def factory(uri: tidelog.URI, options: dict[str, object], clock: tidelog.Clock) -> object:
        opened.append(uri.location)
        return open_backend(parse_uri("memory://"), options, clock)

    registry.register("acme", factory)
    try:
        with pytest.raises(ValueError, match="already registered"):
            registry.register("acme", factory)
        with tidelog.open("acme://somewhere") as store:
            assert store.topic("t").append(b"x") == 1
        assert opened == ["somewhere"]
    finally:
        registry.unregister("acme")


def test_URI_1_third_party_scheme_by_entry_point(monkeypatch: pytest.MonkeyPatch) -> None:
    """URI-1: a scheme published in the tidelog.backends entry-point group is found and loaded;
    an entry point cannot shadow a built-in scheme."""
    from importlib.metadata import EntryPoint

    eps = [
        EntryPoint("viaep", "tidelog.backends.memory:open_backend", registry.ENTRY_POINT_GROUP),
        EntryPoint("memory", "no.such.module:factory", registry.ENTRY_POINT_GROUP),
    ]
    monkeypatch.setattr(
        registry, "entry_points", lambda group: [e for e in eps if e.group == group]
    )
    assert "viaep" in registry.known_schemes()
    with tidelog.open("viaep://") as store:
        assert store.topic("t").append(b"x") == 1
    with tidelog.open("memory://") as store:  # the built-in wins
        assert store.capabilities.persistent is False


def test_URI_2_options_validated_before_anything_is_created() -> None:
    """URI-2: options validated before anything is created."""
    name = f"uri2-{uuid.uuid4().hex[:8]}"
    with pytest.raises(tidelog.BadOption, match="unknown option 'colour'"):
        tidelog.open(f"memory://{name}?colour=red")
    with pytest.raises(tidelog.BadOption, match="given twice"):
        tidelog.open("memory://?max_bytes=1&max_bytes=2")
    with pytest.raises(tidelog.BadOption, match="max_bytes"):
        tidelog.open("memory://", max_bytes="lots")
    from tidelog.backends.memory import _named

    assert name not in _named  # nothing created
    for bad in ("memory", "memory://x#frag", "memory://u:p@x", "memory://x:80", 42):
        with pytest.raises(tidelog.BadURI):
            tidelog.open(bad)  # type: ignore[arg-type]


def test_URI_2_keyword_options_override_the_query() -> None:
    """URI-2: keyword options override the query."""
    with tidelog.open("memory://?max_bytes=4", max_bytes=100) as store:
        store.topic("t").append(b"x" * 50)


def test_URI_3_value_syntax() -> None:
    """URI-3: value syntax."""
    assert parse_size("k", "64KiB") == 64 << 10
    assert parse_size("k", "64M") == 64 << 20
    assert parse_size("k", "1GiB") == 1 << 30
    assert parse_size("k", 4096) == 4096
    for bad in ("64XB", "-1", "", True, 1.5):
        with pytest.raises(tidelog.BadOption):
            parse_size("k", bad)
    assert parse_bool("k", "on") is True and parse_bool("k", "No") is False
    with pytest.raises(tidelog.BadOption):
        parse_bool("k", "maybe")
    with pytest.raises(tidelog.BadOption, match="one of"):
        tidelog.open("memory://").topic("t", durability="sometimes")


def test_URI_4_names_are_checked_before_anything_is_created() -> None:
    """URI-4: names are checked before anything is created."""
    with tidelog.open("memory://") as store:
        for bad in ("", "../etc", "a/b", ".hidden", "x" * 201, "caf\u00e9", "a\nb"):
            with pytest.raises(tidelog.BadName):
                store.topic(bad)
        assert store.topics() == []
    with pytest.raises(tidelog.BadName):
        tidelog.open("memory://bad%2Fname")


def test_URI_5_common_options() -> None:
    """URI-5: common options."""
    with tidelog.open("memory://?max_record_bytes=4KiB&max_bytes=1MiB") as store:
        t = store.topic("t")
        t.append(b"x" * 4096)
        with pytest.raises(tidelog.TooLarge):
            t.append(b"x" * 4097)


# -- ERR ------------------------------------------------------------------------------------


def test_ERR_1_every_error_has_a_stable_code_and_builtin_base() -> None:
    """ERR-1: every error has a stable code and builtin base."""
    assert len(ERROR_CODES) == len(set(ERROR_CODES)) >= 18
    for code, cls in ERROR_CODES.items():
        assert issubclass(cls, TidelogError) and cls.code == code
    assert issubclass(tidelog.BadArgument, ValueError)
    assert issubclass(tidelog.NoSuchTopic, LookupError)
    assert issubclass(tidelog.StorageError, OSError)


def test_ERR_2_a_failed_op_changes_nothing() -> None:
    """ERR-2: a failed op changes nothing."""
    with tidelog.open("memory://", clock=FakeClock()) as store:
        t = store.topic("t", cap_records=2, discard="reject")
        t.append_many([b"a", b"b"])
        before = (t.state(), t.read())
        for call in (
            lambda: t.append(b"c"),
            lambda: t.append_many([b"c", "not bytes"]),  # type: ignore[list-item]
            lambda: t.delete(tag="x", tag_glob="y"),
            lambda: t.complete(1, 99),
            lambda: t.subscribe("s").ack(99),
        ):
            with pytest.raises(TidelogError):
                call()
        assert (t.state(), t.read()) == before


def test_ERR_3_messages_name_the_value_and_the_choices() -> None:
    """ERR-3: messages name the value and the choices."""
    with tidelog.open("memory://") as store:
        with pytest.raises(tidelog.BadOption) as exc:
            store.topic("t", discard="sometimes")
        assert "sometimes" in str(exc.value) and "old" in str(exc.value)
        with pytest.raises(tidelog.BadArgument) as exc2:
            store.topic("t").read(limit=0)
        assert "limit" in str(exc2.value)


# -- CAP ------------------------------------------------------------------------------------


def test_CAP_1_memory_backend_declares_what_it_provides() -> None:
    """CAP-1: memory backend declares what it provides."""
    with tidelog.open("memory://") as store:
        caps = store.capabilities
        assert caps.persistent is False and caps.crash_safe is False
        assert caps.subscribers and caps.queue and caps.deletes and caps.multi_topic
        assert caps.durability == frozenset(tidelog.DURABILITY_CLASSES)
        assert caps.to_dict()["durability"] == sorted(tidelog.DURABILITY_CLASSES)


def test_CAP_2_unoffered_durability_is_a_bad_option() -> None:
    """CAP-2: unoffered durability is a bad option."""
    from tidelog.backend import Capabilities, StoreOptions
    from tidelog.backends.common import Engine

    engine = Engine(FakeClock(), StoreOptions(), Capabilities(durability=frozenset({"fsync"})))
    store = tidelog.Store(engine, "test://")
    with pytest.raises(tidelog.BadOption, match="not offered"):
        store.topic("t", durability="memory")
    store.topic("t", durability="fsync")


# -- DUR (lifecycle on the memory backend) --------------------------------------------------


def test_DUR_8_close_is_idempotent_and_handles_die() -> None:
    """DUR-8: close is idempotent and handles die."""
    store = tidelog.open("memory://")
    t = store.topic("t")
    sub = t.subscribe("s")
    store.close()
    store.close()
    for call in (store.topics, lambda: t.append(b"x"), sub.poll, lambda: store.topic("u")):
        with pytest.raises(tidelog.Closed):
            call()


def test_DUR_8_named_store_is_exclusive_and_survives_reopen() -> None:
    """DUR-8: named store is exclusive and survives reopen."""
    uri = f"memory://dur8-{uuid.uuid4().hex[:8]}"
    store = tidelog.open(uri)
    with pytest.raises(tidelog.Locked):
        tidelog.open(uri)
    store.topic("t").append(b"kept")
    store.close()
    with tidelog.open(uri) as again:
        assert [r.payload for r in again.topic("t").read()] == [b"kept"]  # type: ignore[union-attr]


def test_DUR_7_flush_returns_on_every_backend() -> None:
    """DUR-7: flush returns on every backend."""
    with tidelog.open("memory://") as store:
        s = store.topic("t").subscribe("s")
        store.flush()
        s.flush()


# -- CON ------------------------------------------------------------------------------------


def test_CON_1_concurrent_appends_get_unique_gapless_seqs() -> None:
    """CON-1: concurrent appends get unique gapless seqs."""
    with tidelog.open("memory://") as store:
        t = store.topic("t")
        got: list[list[int]] = [[] for _ in range(8)]

        def producer(i: int) -> None:
            for k in range(500):
                if k % 10 == 0:
                    got[i] += t.append_many([b"x"] * 3)
                else:
                    got[i].append(t.append(bytes([i])))

        threads = [threading.Thread(target=producer, args=(i,)) for i in range(8)]
        for th in threads:
            th.start()
        for th in threads:
            th.join()
        all_seqs = sorted(q for seqs in got for q in seqs)
        assert all_seqs == list(range(1, len(all_seqs) + 1))
        for seqs in got:
            assert seqs == sorted(seqs)  # each thread sees its own appends in order


def test_CON_1_concurrent_consumers_ack_everything_exactly_once() -> None:
    """CON-1: concurrent consumers ack everything exactly once."""
    with tidelog.open("memory://") as store:
        t = store.topic("t")
        sub = t.subscribe("s", start="earliest")
        t.append_many([bytes([i % 256]) for i in range(2000)])
        acked: list[int] = []
        lock = threading.Lock()

        def consumer() -> None:
            while True:
                items = sub.poll(50)
                if not items:
                    return
                for item in items:
                    assert isinstance(item, Record)
                    if sub.ack(item.seq):
                        with lock:
                            acked.append(item.seq)

        threads = [threading.Thread(target=consumer) for _ in range(4)]
        for th in threads:
            th.start()
        for th in threads:
            th.join()
        assert sorted(acked) == list(range(1, 2001))
        assert sub.hwm == 2000 and t.state().count == 0


def test_CON_2_handles_share_one_subscriber_cursor() -> None:
    """CON-2: handles share one subscriber cursor."""
    with tidelog.open("memory://") as store:
        t = store.topic("t")
        a, b = t.subscribe("s"), store.topic("t").subscriber("s")
        t.append_many([b"1", b"2"])
        assert [i.seq for i in a.poll(1)] == [1]  # type: ignore[union-attr]
        assert [i.seq for i in b.poll(1)] == [2]  # type: ignore[union-attr]
        with pytest.raises(tidelog.NoSuchSubscriber):
            t.subscriber("ghost")
        assert t.subscribers() == ["s"]


@pytest.mark.parametrize("scheme", ["memory", "model"])
def test_CON_3_read_and_poll_wait_for_data(scheme: str) -> None:
    """CON-3: read and poll wait for data."""
    with tidelog.open(f"{scheme}://") as store:
        t = store.topic("t")
        sub = t.subscribe("s")
        assert t.read(wait_ms=0) == []
        start = time.monotonic()
        assert t.read(wait_ms=30) == []
        assert time.monotonic() - start >= 0.025
        timer = threading.Timer(0.05, lambda: t.append(b"late"))
        timer.start()
        start = time.monotonic()
        items = t.read(wait_ms=5000)
        assert [i.payload for i in items] == [b"late"]  # type: ignore[union-attr]
        assert time.monotonic() - start < 4
        assert [i.payload for i in sub.poll(wait_ms=1000)] == [b"late"]  # type: ignore[union-attr]
        timer.join()


def test_CON_3_backpressure_wait_blocks_until_a_subscriber_acks() -> None:
    """CON-3: backpressure wait blocks until a subscriber acks."""
    with tidelog.open("memory://") as store:
        t = store.topic("t", cap_records=2, backpressure_wait_ms=5000)
        sub = t.subscribe("s")
        t.append_many([b"1", b"2"])
        threading.Timer(0.05, lambda: sub.ack(1)).start()
        assert t.append(b"3") == 3  # waited for the ack (trim made room)
        quick = store.topic("q", cap_records=1, backpressure_wait_ms=20)
        quick.subscribe("s")
        quick.append(b"1")
        with pytest.raises(tidelog.Backpressure, match="after waiting 20 ms"):
            quick.append(b"2")
