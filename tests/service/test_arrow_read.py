"""The Arrow read (spec/SERVICE.md SVC-61..SVC-64) against a live service: what an executor on
another host reads of a topic, the unsealed tail included (spec/BUNDLES.md SPK-40, SPK-41)."""

from __future__ import annotations

import http.client
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

import tidelog
from tidelog import Record
from tidelog.adapters.spark.columns import log_schema
from tidelog.backends.file.store import FileBackend
from tidelog.hooks import Checkpoint, EngineTopics, hooks
from tidelog.service.auth import hash_token
from tidelog.service.server import ServiceThread

pytest.importorskip("numpy")  # the columnar paths (SVC-61)

ARROW = "application/vnd.apache.arrow.stream"


class Answer:
    def __init__(self, status: int, headers: Any, body: bytes) -> None:
        self.status = status
        self.headers = headers
        self.body = body

    def json(self) -> Any:
        return json.loads(self.body)

    def stream(self) -> tuple[pa.Schema, list[pa.RecordBatch], dict[bytes, bytes]]:
        """The batches with rows, and the last message's metadata (SVC-63)."""
        reader = pa.ipc.open_stream(pa.py_buffer(self.body))
        batches: list[pa.RecordBatch] = []
        last: dict[bytes, bytes] = {}
        while True:
            try:
                batch, meta = reader.read_next_batch_with_custom_metadata()
            except StopIteration:
                break
            if meta is not None:
                last = dict(meta)
                assert batch.num_rows == 0
            else:
                batches.append(batch)
        return reader.schema, batches, last


def get(url: str, path: str, token: str | None = None) -> Answer:
    host, port = url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=30)
    try:
        headers = {} if token is None else {"Authorization": f"Bearer {token}"}
        conn.request("GET", path, headers=headers)
        resp = conn.getresponse()
        return Answer(resp.status, resp.headers, resp.read())
    finally:
        conn.close()


def rows_of(batches: list[pa.RecordBatch]) -> list[tuple[Any, ...]]:
    table = pa.Table.from_batches(batches, schema=batches[0].schema) if batches else None
    if table is None:
        return []
    cols = table.to_pydict()
    return list(zip(*(cols[n] for n in table.schema.names), strict=True))


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[tidelog.Store, ServiceThread]]:
    """A file store with sealed segments (a checkpoint) and an unsealed tail."""
    store = tidelog.open(f"file://{tmp_path}/store")
    t = store.topic("ev", durability="memory")
    t.append_many([b"s%d" % i for i in range(300)], tag="a")
    hooks(store, Checkpoint).checkpoint()  # seals 1..300
    t.append_many([b"t%d" % i for i in range(200)], node="n")  # the tail: 301..500
    thread = ServiceThread(store, max_streams=4).start()
    try:
        yield store, thread
    finally:
        thread.stop()
        store.close()


def test_SVC_61_an_arrow_read_is_the_log_schema_with_every_record_once(
    served: tuple[tidelog.Store, ServiceThread],
) -> None:
    """Sealed segments and the unsealed tail, column by column, equal ``Topic.read``."""
    store, thread = served
    log: Any = hooks(store, EngineTopics).topics["ev"].log
    assert log.chunks and log.payloads  # both paths are taken
    answer = get(thread.url, "/v0/topics/ev/arrow?after=0&until=500&batch_records=64")
    assert answer.status == 200 and answer.headers["Content-Type"] == ARROW
    schema, batches, last = answer.stream()
    assert schema.equals(log_schema(False))
    assert last == {b"tidelog.end": b"500"}
    assert max(b.num_rows for b in batches) <= 64
    want = [
        ("ev", r.seq, r.ts * 1000, r.tag, r.node, r.payload)
        for r in store.topic("ev", create=False).read(0, 1000)
        if isinstance(r, Record)
    ]
    got = [(a, b, int(c.timestamp() * 1_000_000), d, e, f) for a, b, c, d, e, f in rows_of(batches)]
    assert got == want and len(got) == 500


def test_SVC_61_ranges_are_after_to_until_clipped_at_the_head(
    served: tuple[tidelog.Store, ServiceThread],
) -> None:
    _store, thread = served
    for after, until in ((0, 1), (299, 301), (250, 450), (499, 500), (500, 500)):
        answer = get(thread.url, f"/v0/topics/ev/arrow?after={after}&until={until}")
        _schema, batches, last = answer.stream()
        assert [r[1] for r in rows_of(batches)] == list(range(after + 1, until + 1))
        assert last == {b"tidelog.end": str(until).encode()}
    answer = get(thread.url, "/v0/topics/ev/arrow?after=490&until=900")
    _schema, batches, last = answer.stream()
    assert [r[1] for r in rows_of(batches)] == list(range(491, 501))
    assert last == {b"tidelog.end": b"500"}  # what it accounts for: the head (SVC-63)
    assert answer.headers["X-Tidelog-Head-Seq"] == "500"


def test_SVC_62_the_store_is_named_by_its_store_id(
    served: tuple[tidelog.Store, ServiceThread],
) -> None:
    """SVC-62: The store is named by its store id."""
    store, thread = served
    own = hooks(store, FileBackend).store_id.hex()
    assert get(thread.url, "/v0").json()["store_id"] == own
    answer = get(thread.url, "/v0/topics/ev/arrow?after=0&until=1")
    assert answer.headers["X-Tidelog-Store-Id"] == own
    incarnation = store.topic("ev", create=False).incarnation
    assert answer.headers["X-Tidelog-Incarnation"] == str(incarnation)
    memory = tidelog.open("memory://")
    with ServiceThread(memory) as other:
        sid = get(other.url, "/v0").json()["store_id"]
        assert len(sid) == 32 and sid != own
    memory.close()


def test_SVC_63_tombstones_fail_in_the_stream_or_become_rows(tmp_path: Path) -> None:
    """The leading tombstone of a capped topic (TMB-1): the stream ends with the error, or the
    gap is one row (SPK-4)."""
    store = tidelog.open(f"file://{tmp_path}/store")
    t = store.topic("capped", cap_records=10)
    for i in range(25):
        t.append(b"x%d" % i)
    assert t.state().evict_floor == 16
    with ServiceThread(store) as thread:
        answer = get(thread.url, "/v0/topics/capped/arrow?after=0&until=25")
        assert answer.status == 200
        _schema, batches, last = answer.stream()
        assert not batches
        error = json.loads(last[b"tidelog.error"])["error"]
        assert error["code"] == "tombstone" and "1..15" in error["message"]
        answer = get(thread.url, "/v0/topics/capped/arrow?after=0&until=25&tombstones=rows")
        schema, batches, last = answer.stream()
        assert schema.equals(log_schema(True))
        rows = rows_of(batches)
        assert rows[0] == ("capped", 1, None, None, None, None, 15)
        assert [r[1] for r in rows[1:]] == list(range(16, 26))
        assert last == {b"tidelog.end": b"25"}
    store.close()


def test_SVC_63_refusals_before_the_stream_are_error_answers(
    served: tuple[tidelog.Store, ServiceThread],
) -> None:
    store, thread = served
    cases = {
        "/v0/topics/ev/arrow?after=0": (400, "bad_argument"),
        "/v0/topics/ev/arrow?after=5&until=4": (400, "bad_argument"),
        "/v0/topics/ev/arrow?after=0&until=4&tombstones=skip": (400, "bad_argument"),
        "/v0/topics/ev/arrow?after=0&until=4&batch_records=1000001": (400, "bad_argument"),
        "/v0/topics/ev/arrow?after=0&until=4&frm=1": (400, "bad_argument"),
        "/v0/topics/nope/arrow?after=0&until=4": (404, "no_such_topic"),
    }
    for path, (status, code) in cases.items():
        answer = get(thread.url, path)
        assert (answer.status, answer.json()["error"]["code"]) == (status, code), path
    old = store.topic("ev", create=False).incarnation
    store.drop_topic("ev")
    store.topic("ev").append(b"new")
    answer = get(thread.url, f"/v0/topics/ev/arrow?after=0&until=1&incarnation={old}")
    assert (answer.status, answer.json()["error"]["code"]) == (404, "no_such_topic")


def test_SVC_64_an_arrow_read_counts_as_a_stream(tmp_path: Path) -> None:
    store = tidelog.open("memory://")
    store.topic("ev").append(b"x")
    with ServiceThread(store, max_streams=0) as thread:
        answer = get(thread.url, "/v0/topics/ev/arrow?after=0&until=1")
        assert (answer.status, answer.json()["error"]["code"]) == (503, "busy")
    with ServiceThread(store) as thread:  # a memory store: read through Topic.read
        _schema, batches, last = get(thread.url, "/v0/topics/ev/arrow?after=0&until=1").stream()
        assert [r[5] for r in rows_of(batches)] == [b"x"]
        assert last == {b"tidelog.end": b"1"}
        metrics = get(thread.url, "/v0/metrics").body.decode()
        assert 'route="/v0/topics/{t}/arrow"' in metrics  # SVC-53
    store.close()


def test_SVC_61_an_arrow_read_needs_read_on_the_topic(tmp_path: Path) -> None:
    """SVC-48: 401 without a valid token, 403 with a token without ``read`` on the topic."""
    tokens = tmp_path / "tokens.json"
    tokens.write_text(
        json.dumps(
            {
                "tokens": [
                    {"name": "w", "sha256": hash_token("w-secret"),
                     "grants": [{"topics": "ev", "rights": ["write"]}]},
                    {"name": "r", "sha256": hash_token("r-secret"),
                     "grants": [{"topics": "ev", "rights": ["read"]}]},
                ]
            }
        )
    )  # fmt: skip
    store = tidelog.open("memory://")
    store.topic("ev").append(b"x")
    with ServiceThread(store, tokens=str(tokens)) as thread:
        path = "/v0/topics/ev/arrow?after=0&until=1"
        assert get(thread.url, path).status == 401
        assert get(thread.url, path, "nobody").status == 401
        answer = get(thread.url, path, "w-secret")
        assert (answer.status, answer.json()["error"]["code"]) == (403, "forbidden")
        assert get(thread.url, path, "r-secret").stream()[2] == {b"tidelog.end": b"1"}
    store.close()


def test_SVC_64_a_retired_segment_stays_mapped_while_a_read_holds_it(tmp_path: Path) -> None:
    """A checkpoint closing a chunk whose map a reader still holds must not fail (the map goes
    with the reader)."""
    store = tidelog.open(f"file://{tmp_path}/store")
    t = store.topic("ev")
    t.append_many([b"p%d" % i for i in range(50)])
    hooks(store, Checkpoint).checkpoint()
    chunk = hooks(store, EngineTopics).topics["ev"].log.chunks[0]
    pin = pa.py_buffer(chunk.data)  # what reading.read_store holds (an export of the map)
    chunk.close()  # raised BufferError before SegChunk.close tolerated a held view
    assert pin.to_pybytes()[:4] == bytes(chunk.data[:4])  # still mapped, still readable
    del pin
    store.close()


def test_SVC_64_reads_during_checkpoints_and_trims_lose_nothing(tmp_path: Path) -> None:
    """Appends, checkpoints and deletes run while Arrow reads go on: each read returns its range
    in order, every live record once (a removed one silently, TMB-4), never an internal error."""
    store = tidelog.open(f"file://{tmp_path}/store")
    t = store.topic("ev", durability="memory")
    t.append_many([b"a%d" % i for i in range(2000)])
    with ServiceThread(store) as thread:
        for round_ in range(6):
            t.append_many([b"b%d" % i for i in range(500)])
            if round_ % 2:
                hooks(store, Checkpoint).checkpoint()
            head = t.state().head_seq
            answer = get(thread.url, f"/v0/topics/ev/arrow?after={head - 1500}&until={head}")
            _schema, batches, last = answer.stream()
            seqs = [r[1] for r in rows_of(batches)]
            assert seqs == list(range(head - 1499, head + 1))
            assert last == {b"tidelog.end": str(head).encode()}
            t.delete(before_seq=head - 1000)
    store.close()


def test_SVC_64_cold_segments_are_read_through_the_tiering_rules(tmp_path: Path) -> None:
    """A store with a cold tier (spec/TIERING.md): the owner's Arrow read leaves cold segments
    to ``Topic.read`` (which fetches and pins them, TIER-8) and still returns every record once;
    a read-only view of the store reads them column by column as before."""
    from tidelog.adapters.spark import reading
    from tidelog.adapters.spark.options import parse_options
    from tidelog.backends.file.coldchunk import ColdChunk

    root = tmp_path / "store"
    opts: dict[str, Any] = {"segment_max_records": 10, "hot_retain_segments": 1}
    store = tidelog.open(f"file://{root}", cold=str(tmp_path / "cold"), **opts)
    t = store.topic("ev")
    for lo in range(0, 60, 5):
        t.append_many([b"p%03d" % i for i in range(lo, lo + 5)])
    hooks(store, Checkpoint).checkpoint()
    t.append_many([b"tail"] * 3)
    chunks = list(hooks(store, EngineTopics).topics["ev"].log.chunks)
    assert any(isinstance(c, ColdChunk) for c in chunks)
    want = [r.payload for r in t.read(0, 1000) if isinstance(r, Record)]
    with ServiceThread(store) as thread:
        _schema, batches, last = get(thread.url, "/v0/topics/ev/arrow?after=0&until=63").stream()
        assert [r[5] for r in rows_of(batches)] == want and len(want) == 63
        assert last == {b"tidelog.end": b"63"}
    store.flush()
    view = tidelog.open(f"file://{root}", readonly=True, cold=str(tmp_path / "cold"))
    local = parse_options({"path": str(root), "topic": "ev"})
    got = [
        p for b in reading.read_store(view, local, 1, 63) for p in b.column("payload").to_pylist()
    ]
    assert got == want
    view.close()
    store.close()
