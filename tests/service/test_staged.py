"""Staged writes (spec/SERVICE.md SVC-65..SVC-68): chunks keyed by (write, part, attempt, chunk),
one commit of the winning attempts appended once, aborts, limits and collection."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

import tidelog
from tidelog.errors import StorageError
from tidelog.records import Record
from tidelog.service.auth import hash_token
from tidelog.service.limits import Limits
from tidelog.service.server import ServiceThread
from tidelog.service.staged import StagedWrites

from .conftest import Served
from .http import Client

ARROW = "application/vnd.apache.arrow.stream"
W = "/v0/topics/t/staged/w1"


def chunk(payloads: list[bytes], tag: str | None = None, **columns: Any) -> bytes:
    cols = {
        "payload": pa.array(payloads, pa.binary()),
        "tag": pa.array([tag] * len(payloads), pa.string()),
        **columns,
    }
    table = pa.table(cols)
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return bytes(sink.getvalue())


def put(client: Client, part: int, attempt: int, c: int, body: bytes, path: str = W) -> Any:
    q = f"?part={part}&attempt={attempt}&chunk={c}"
    return client.put(path + q, raw=body, ctype=ARROW)


def payloads(store: tidelog.Store, name: str = "t") -> list[bytes]:
    items = store.topic(name, create=False).read(0, 10_000)
    return [r.payload for r in items if isinstance(r, Record)]


def test_SVC_65_SVC_66_only_the_named_attempts_are_appended_once(served: Served) -> None:
    """SVC-66: Two attempts of part 0 (the first failed after one chunk), one of part 1, a
    chunk sent twice: the commit appends the named attempts' chunks in order, atomically, once; a
    commit asked again answers the same and appends nothing; a late chunk is refused."""
    served.topic("t")
    c = served.client
    assert put(c, 0, 0, 0, chunk([b"lost0", b"lost1"]))[0] == 200  # attempt 0 failed later
    status, body = put(c, 0, 1, 0, chunk([b"old"]))
    assert status == 200 and body["rows"] == 1
    status, body = put(c, 0, 1, 0, chunk([b"a0", b"a1"], tag="x"))  # a repeat replaces
    assert status == 200 and body["rows"] == 2 and body["bytes"] > 0
    assert put(c, 0, 1, 1, chunk([b"a2"]))[0] == 200
    assert put(c, 1, 0, 0, chunk([b"b0"]))[0] == 200
    assert served.thread.service is not None
    staged = served.thread.service.staged
    assert staged.staged_bytes > 0
    commit = {"parts": [[0, 1, 2], [1, 0, 1]], "producer": {"id": "spark-job-1", "seq": 1}}
    assert c.post(W + "/commit", commit) == (200, {"seqs": [1, 4]})
    assert payloads(served.store) == [b"a0", b"a1", b"a2", b"b0"]
    tags = [r.tag for r in served.store.topic("t").read(0, 10) if isinstance(r, Record)]
    assert tags == ["x", "x", None, None]
    assert staged.staged_bytes == 0  # the failed attempt's chunk went too
    assert c.post(W + "/commit", commit) == (200, {"seqs": [1, 4]})  # asked again: recorded
    assert c.delete(W)[0] == 204  # SVC-67: the driver's abort after its commit
    assert c.post(W + "/commit", commit) == (200, {"seqs": [1, 4]})  # the commit is kept
    assert payloads(served.store) == [b"a0", b"a1", b"a2", b"b0"]
    status, body = put(c, 2, 0, 0, chunk([b"late"]))
    assert status == 404 and body["error"]["code"] == "not_found"
    assert "committed or aborted" in body["error"]["message"]


def test_SVC_66_a_commit_lost_after_the_append_is_refused_by_the_producer_mark(
    tmp_path: Path,
) -> None:
    """SVC-66: A crash between the append and the recorded outcome: the chunks are still staged, the
    repeated commit reads them again and TOP-11's producer mark refuses the duplicate."""
    store = tidelog.open("memory://")
    t = store.topic("t")
    staged = StagedWrites(str(tmp_path / "staged"), Limits())
    staged.put("t", "w", 0, 0, 0, chunk([b"x", b"y"]))

    def crashing(records: list[Any], producer: Any) -> list[int]:
        t.append_records(records, producer=producer)
        raise StorageError("the owner died before recording the outcome")

    with pytest.raises(StorageError):
        staged.commit("t", "w", [(0, 0, 1)], ("p", 1), crashing)
    assert staged.staged_bytes > 0

    def append(records: list[Any], producer: Any) -> list[int]:
        return t.append_records(records, producer=producer)

    assert staged.commit("t", "w", [(0, 0, 1)], ("p", 1), append) == []
    assert [r.payload for r in t.read(0, 10) if isinstance(r, Record)] == [b"x", b"y"]
    assert staged.staged_bytes == 0
    store.close()


def test_SVC_66_a_missing_chunk_or_topic_appends_nothing(served: Served) -> None:
    """SVC-66: A missing chunk or topic appends nothing."""
    served.topic("t")
    c = served.client
    assert put(c, 0, 0, 0, chunk([b"a"]))[0] == 200
    status, body = c.post(W + "/commit", {"parts": [[0, 0, 2]]})
    assert status == 404 and body["error"]["code"] == "not_found"
    assert "chunk 1 of part 0 attempt 0" in body["error"]["message"]
    assert payloads(served.store) == []
    status, body = put(c, 0, 0, 0, chunk([b"a"]), path="/v0/topics/nope/staged/w1")
    assert status == 200  # the topic need not exist to stage
    status, body = c.post("/v0/topics/nope/staged/w1/commit", {"parts": [[0, 0, 1]]})
    assert status == 404 and body["error"]["code"] == "no_such_topic"
    for bad in ({"parts": [[0, 0]]}, {"parts": [[0, 0, 1], [0, 1, 1]]}, {"parts": "x"}):
        status, body = c.post(W + "/commit", bad)
        assert status == 400 and body["error"]["code"] == "bad_argument", bad
    assert c.post(W + "/commit", {"parts": [[0, 0, 1]]}) == (200, {"seqs": [1, 1]})


def test_SVC_67_abort_drops_the_write_and_refuses_what_comes_later(served: Served) -> None:
    served.topic("t")
    c = served.client
    assert put(c, 0, 0, 0, chunk([b"a"]))[0] == 200
    assert c.delete(W)[0] == 204
    assert c.delete(W)[0] == 204  # idempotent
    assert served.thread.service is not None
    assert served.thread.service.staged.staged_bytes == 0
    status, body = put(c, 0, 1, 0, chunk([b"b"]))
    assert status == 404 and body["error"]["code"] == "not_found"
    status, body = c.post(W + "/commit", {"parts": [[0, 0, 1]]})
    assert status == 404 and "aborted" in body["error"]["message"]
    assert payloads(served.store) == []
    assert c.delete("/v0/topics/t/staged/never")[0] == 204  # nothing staged: still 204


def test_SVC_65_malformed_chunks_are_refused(served: Served) -> None:
    c = served.client
    status, body = c.put(W + "?part=0&attempt=0&chunk=0", raw=chunk([b"a"]))
    assert status == 415 and body["error"]["code"] == "unsupported_media_type"
    status, body = put(c, 0, 0, 0, b"not arrow")
    assert status == 400 and "Arrow IPC" in body["error"]["message"]
    status, body = put(c, 0, 0, 0, chunk([b"a"], extra=pa.array([1])))
    assert status == 400 and "extra" in body["error"]["message"]
    nulls = pa.table({"payload": pa.array([None], pa.binary())})
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, nulls.schema) as writer:
        writer.write_table(nulls)
    status, body = put(c, 0, 0, 0, bytes(sink.getvalue()))
    assert status == 400 and "nulls" in body["error"]["message"]
    status, body = c.put(W + "?part=0&chunk=0", raw=chunk([b"a"]), ctype=ARROW)
    assert status == 400 and "required" in body["error"]["message"]
    status, body = put(c, 0, 0, 0, chunk([b"a"]), path="/v0/topics/t/staged/a.b")
    assert status == 400 and "write id" in body["error"]["message"]


@pytest.fixture
def limited(tmp_path: Path) -> Iterator[tuple[tidelog.Store, ServiceThread, Client]]:
    store = tidelog.open(f"file://{tmp_path}/store")
    thread = ServiceThread(
        store, max_request_bytes="64KiB", max_staged_bytes="1MiB", staged_ttl_ms=1000
    ).start()
    client = Client(thread.url)
    try:
        yield store, thread, client
    finally:
        client.close()
        thread.stop()
        store.close()


def test_SVC_65_SVC_51_a_chunk_over_the_limits_is_too_large_or_store_full(
    limited: tuple[tidelog.Store, ServiceThread, Client],
) -> None:
    _, thread, c = limited
    status, body = put(c, 0, 0, 0, chunk([b"x" * 70_000]))
    assert status == 413 and body["error"]["code"] == "too_large"
    for i in range(20):  # 20 x 60 KB > 1 MiB
        status, body = put(c, i, 0, 0, chunk([b"y" * 60_000]))
        if status != 200:
            break
    assert status == 507 and body["error"]["code"] == "store_full"
    assert "--max-staged-bytes 1048576" in body["error"]["message"]
    assert thread.service is not None
    assert thread.service.staged.staged_bytes <= 1 << 20
    assert c.delete(W)[0] == 204  # an abort frees the bytes
    assert thread.service.staged.staged_bytes == 0
    assert put(c, 0, 0, 0, chunk([b"y" * 60_000]), path="/v0/topics/t/staged/w2")[0] == 200


def test_SVC_68_an_idle_write_is_collected_and_the_directory_is_beside_the_store(
    limited: tuple[tidelog.Store, ServiceThread, Client], tmp_path: Path
) -> None:
    """The staging directory of a file store is `.store.spark-staging/served` (never inside
    the store); a write idle for --staged-ttl-ms is deleted on a later staging request."""
    store, thread, c = limited
    assert put(c, 0, 0, 0, chunk([b"a"]))[0] == 200
    served_dir = tmp_path / ".store.spark-staging" / "served"
    (wdir,) = served_dir.iterdir()
    assert [p.name for p in wdir.iterdir()] == ["p0-a0-c0.arrow"]
    old = time.time() - 5
    os.utime(wdir, (old, old))  # idle for longer than the TTL (1 s)
    time.sleep(0.15)  # collection looks at most every ttl / 10
    assert put(c, 0, 0, 0, chunk([b"b"]), path="/v0/topics/t/staged/w2")[0] == 200
    assert not wdir.exists()
    assert thread.service is not None
    assert thread.service.staged.staged_bytes == len(chunk([b"b"]))
    store.topic("t")
    status, body = c.post(W + "/commit", {"parts": [[0, 0, 1]]})
    assert status == 404 and "collected" in body["error"]["message"]


def test_SVC_68_a_memory_store_stages_in_a_temporary_directory_removed_at_stop() -> None:
    store = tidelog.open("memory://")
    thread = ServiceThread(store).start()
    try:
        assert thread.service is not None
        directory = thread.service.staged.directory
        assert not os.path.exists(directory)  # made by the first chunk only
        client = Client(thread.url)
        assert put(client, 0, 0, 0, chunk([b"a"]))[0] == 200
        client.close()
        assert os.path.isdir(directory) and os.stat(directory).st_mode & 0o777 == 0o700
    finally:
        thread.stop()
        store.close()
    assert not os.path.exists(directory)


def test_SVC_48_staging_needs_write_on_the_topic(tmp_path: Path) -> None:
    tokens = tmp_path / "tokens.json"
    grants = {"r": ["read"], "w": ["read", "write"]}
    doc = {
        "tokens": [
            {
                "name": n,
                "sha256": hash_token(n + "-secret"),
                "grants": [{"topics": "t", "rights": r}],
            }
            for n, r in grants.items()
        ]
    }
    tokens.write_text(json.dumps(doc))
    store = tidelog.open("memory://")
    store.topic("t")
    thread = ServiceThread(store, tokens=str(tokens)).start()
    client = Client(thread.url)
    try:
        reader = {"Authorization": "Bearer r-secret"}
        writer = {"Authorization": "Bearer w-secret"}
        status, body, _ = client.request(
            "PUT", W + "?part=0&attempt=0&chunk=0", raw=chunk([b"a"]), ctype=ARROW, headers=reader
        )
        assert status == 403 and "'r'" in body["error"]["message"]
        for method, path in (("POST", W + "/commit"), ("DELETE", W)):
            assert client.request(method, path, headers=reader)[0] == 403
        status, _, _ = client.request(
            "PUT", W + "?part=0&attempt=0&chunk=0", raw=chunk([b"a"]), ctype=ARROW, headers=writer
        )
        assert status == 200
        status, body, _ = client.request(
            "POST", W + "/commit", {"parts": [[0, 0, 1]]}, headers=writer
        )
        assert (status, body) == (200, {"seqs": [1, 1]})
    finally:
        client.close()
        thread.stop()
        store.close()
