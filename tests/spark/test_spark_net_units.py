"""The Spark source's pieces for a served store (spec/BUNDLES.md SPK-40..SPK-42), without a
SparkSession: planning through the remote backend, a task's Arrow read and its checks."""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

import tidelog
from tidelog.adapters.spark import netread, reading, staging
from tidelog.adapters.spark.columns import TombstoneFound
from tidelog.adapters.spark.guard import Planned, StaleView
from tidelog.adapters.spark.options import parse_options
from tidelog.backends.file.store import FileBackend
from tidelog.errors import BadOption, StorageError
from tidelog.hooks import Checkpoint, hooks
from tidelog.service.server import ServiceThread

pytest.importorskip("numpy")


@contextlib.contextmanager
def serve(tmp_path: Path) -> Iterator[tuple[tidelog.Store, str]]:
    """A file store owned by this process and served on 127.0.0.1: (store, url)."""
    store = tidelog.open(f"file://{tmp_path}/store?progress_flush_ms=10")
    thread = ServiceThread(store).start()
    try:
        yield store, thread.url
    finally:
        thread.stop()
        store.close()


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[tidelog.Store, str]]:
    """Sealed segments (1..100) and an unsealed tail (101..150)."""
    with serve(tmp_path) as (store, url):
        t = store.topic("ev", durability="memory")
        t.append_many([b"s%d" % i for i in range(100)])
        hooks(store, Checkpoint).checkpoint()
        t.append_many([b"t%d" % i for i in range(50)])
        yield store, url


def _opts(url: str, **extra: str) -> Any:
    return parse_options({"path": url, "topic": "ev", **extra})


def _seqs(batches: Iterator[pa.RecordBatch]) -> list[int]:
    return [s for b in batches for s in b.column("seq").to_pylist()]


def test_SPK_40_a_served_store_is_a_url_with_a_token_never_shown() -> None:
    opts = parse_options({"path": "http://h:9000", "topic": "ev", "token": "s3cret"})
    assert opts.root == "http://h:9000" and opts.token == "s3cret"
    assert "s3cret" not in repr(opts)
    assert netread.is_served(opts.root) and not netread.is_served("/var/lib/x")
    with pytest.raises(BadOption, match="slot reads"):
        netread.check_served(parse_options({"path": "https://h", "topic": "ev", "slot": "0"}))


def test_SPK_40_the_plan_comes_from_the_owner(served: tuple[tidelog.Store, str]) -> None:
    store, url = served
    opts = _opts(url)
    planned = reading.plan(opts)
    t = store.topic("ev", create=False)
    assert planned == Planned(hooks(store, FileBackend).store_id.hex(), t.incarnation, 150)
    assert reading.seq_bounds(opts) == (1, 150)
    assert netread.owner_host(opts) == "127.0.0.1"


def test_SPK_40_subscribe_and_commit_go_through_the_subscriber_endpoints(
    served: tuple[tidelog.Store, str],
) -> None:
    """SPK-9/SPK-10 over the network: the commit moves the durable subscriber's hwm, so a
    ``trim=acked`` topic may drop what was committed and nothing above it."""
    store, url = served
    opts = _opts(url, subscriber="q")
    assert staging.request(opts, {"op": "subscribe", "subscriber": "q", "start": "earliest"}) == {
        "ok": True,
        "hwm": 0,
    }
    got = staging.request(opts, {"op": "commit", "subscriber": "q", "seq": 40, "start": "earliest"})
    assert got["hwm"] == 40
    assert store.topic("ev", create=False).subscriber("q").hwm == 40
    got = staging.request(opts, {"op": "commit", "subscriber": "q", "seq": 999})
    assert got["hwm"] == 150  # never past the head


def test_SPK_41_a_task_reads_its_range_through_the_owner(
    served: tuple[tidelog.Store, str],
) -> None:
    """SPK-43 too: the owner's batches reach the task as built (Arrow IPC, no per-row work on
    either side): ``batchRecords`` rows each, the sealed run's and the tail's apart."""
    _store, url = served
    opts = _opts(url, batchRecords="16")
    planned = reading.plan(opts)
    batches = list(reading.read_log(opts, 1, 150, planned))
    assert [b.num_rows for b in batches] == [16] * 6 + [4] + [16] * 3 + [2]
    assert _seqs(iter(batches)) == list(range(1, 151))
    assert _seqs(reading.read_log(opts, 90, 110, planned)) == list(range(90, 111))
    payloads = [
        p for b in reading.read_log(opts, 99, 102, planned) for p in b.column("payload").to_pylist()
    ]
    assert payloads == [b"s98", b"s99", b"t0", b"t1"]


def test_SPK_41_another_store_fails_the_task(served: tuple[tidelog.Store, str]) -> None:
    _store, url = served
    opts = _opts(url)
    planned = reading.plan(opts)
    other = Planned("0" * 32, planned.incarnation, planned.head)
    with pytest.raises(StaleView, match="another store"):
        list(reading.read_log(opts, 1, 10, other))


def test_SPK_41_a_head_below_the_range_waits_then_fails(served: tuple[tidelog.Store, str]) -> None:
    store, url = served
    opts = _opts(url, freshnessTimeoutMs="200")
    planned = reading.plan(opts)
    with pytest.raises(StaleView, match="behind the driver's plan") as err:
        list(reading.read_log(opts, 140, 160, planned))
    assert "its head 150, the plan's end 160" in str(err.value)
    # appended meanwhile: the wait ends as soon as the head reaches the range's end
    opts = _opts(url, freshnessTimeoutMs="10000")
    timer = threading.Timer(0.3, lambda: store.topic("ev", create=False).append_many([b"x"] * 10))
    timer.start()
    try:
        assert _seqs(reading.read_log(opts, 140, 160, planned)) == list(range(140, 161))
    finally:
        timer.join()


def test_SPK_41_a_dropped_topic_fails_the_task(served: tuple[tidelog.Store, str]) -> None:
    store, url = served
    opts = _opts(url)
    planned = reading.plan(opts)
    store.drop_topic("ev")
    store.topic("ev").append_many([b"n"] * 200)
    with pytest.raises(StaleView, match="is gone"):
        list(reading.read_log(opts, 1, 10, planned))


def test_SPK_41_tombstones_fail_the_task_or_become_rows(tmp_path: Path) -> None:
    store = tidelog.open(f"file://{tmp_path}/store")
    t = store.topic("capped", cap_records=10)
    for i in range(25):
        t.append(b"x%d" % i)
    with ServiceThread(store) as thread:
        opts = parse_options({"path": thread.url, "topic": "capped"})
        planned = reading.plan(opts)
        with pytest.raises(TombstoneFound, match=r"1\.\.15"):
            list(reading.read_log(opts, 1, 25, planned))
        opts = parse_options({"path": thread.url, "topic": "capped", "tombstones": "rows"})
        batches = list(reading.read_log(opts, 1, 25, planned))
        assert batches[0].column("gap_to").to_pylist()[0] == 15
        assert _seqs(iter(batches)) == [1, *range(16, 26)]
    store.close()


def _fake_service(body: bytes, head: int) -> tuple[socket.socket, threading.Thread]:
    """A service that answers one Arrow read with ``body`` and closes the connection."""
    server = socket.create_server(("127.0.0.1", 0))

    def serve() -> None:
        conn, _ = server.accept()
        with conn:
            conn.recv(65536)
            head_lines = (
                "HTTP/1.1 200 OK\r\nContent-Type: application/vnd.apache.arrow.stream\r\n"
                f"X-Tidelog-Store-Id: {'a' * 32}\r\nX-Tidelog-Head-Seq: {head}\r\n"
                "Connection: close\r\n\r\n"
            )
            conn.sendall(head_lines.encode() + body)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    return server, thread


def test_SPK_41_a_stream_without_its_end_fails_the_task() -> None:
    """A connection that drops after some batches (no ``tidelog.end``, SVC-63) is never taken
    for a short range: the task fails with io_error."""
    from tidelog.adapters.spark.columns import log_schema

    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, log_schema(False)) as writer:
        writer.write_batch(
            pa.RecordBatch.from_pylist(
                [{"topic": "ev", "seq": 1, "ts": None, "tag": None, "node": None, "payload": b"x"}],
                schema=log_schema(False),
            )
        )
    server, thread = _fake_service(sink.getvalue().to_pybytes(), head=5)
    try:
        url = f"http://127.0.0.1:{server.getsockname()[1]}"
        opts = parse_options({"path": url, "topic": "ev"})
        with pytest.raises(StorageError, match=r"without tidelog\.end") as err:
            list(reading.read_log(opts, 1, 5, Planned("a" * 32, 1, 5)))
        assert err.value.code == "io_error"
    finally:
        thread.join(10)
        server.close()


def test_SPK_42_partitions_of_a_served_store_prefer_its_host(
    served: tuple[tidelog.Store, str],
) -> None:
    pytest.importorskip("pyspark")
    from tidelog.adapters.spark.source import SeqRange, _partitions

    _store, url = served
    parts = _partitions(_opts(url, partitionRecords="60"), 1, 150)
    assert [(p.lo, p.hi) for p in parts] == [(1, 60), (61, 120), (121, 150)]
    assert all(p.preferredLocations() == ["127.0.0.1"] for p in parts)
    assert SeqRange(1, 2).preferredLocations() == []  # a file store's: none


def test_SPK_40_the_token_option_or_TIDELOG_TOKEN_authorizes_plan_and_reads(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A served store with tokens: option ``token`` (else ``TIDELOG_TOKEN``) reaches both the
    remote backend (the plan) and every Arrow read; without one the service answers 401."""
    import json

    from tidelog.errors import Unauthorized
    from tidelog.service.auth import hash_token

    tokens = tmp_path / "tokens.json"
    grant = [{"topics": "ev", "rights": ["read"]}]
    tokens.write_text(
        json.dumps({"tokens": [{"name": "r", "sha256": hash_token("r-1"), "grants": grant}]})
    )
    store = tidelog.open(f"file://{tmp_path}/store")
    store.topic("ev").append_many([b"x"] * 5)
    with ServiceThread(store, tokens=str(tokens)) as thread:
        opts = parse_options({"path": thread.url, "topic": "ev", "token": "r-1"})
        assert _seqs(reading.read_log(opts, 1, 5, reading.plan(opts))) == [1, 2, 3, 4, 5]
        planned = reading.plan(opts)
        monkeypatch.delenv("TIDELOG_TOKEN", raising=False)
        bare = parse_options({"path": thread.url + "/", "topic": "ev"})
        with pytest.raises(Unauthorized):
            list(reading.read_log(bare, 1, 5, planned))
        monkeypatch.setenv("TIDELOG_TOKEN", "r-1")
        assert _seqs(reading.read_log(bare, 1, 5, planned)) == [1, 2, 3, 4, 5]
    store.close()
