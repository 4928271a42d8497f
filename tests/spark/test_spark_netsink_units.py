"""The network sink's pieces without a SparkSession (spec/BUNDLES.md SPK-44): a task's rows cut
into chunks under the service's request limit, the commit of the named attempts, the abort, and
the writers' commit and abort as Spark calls them."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pytest

import tidelog
from tidelog.adapters.spark import netsink
from tidelog.adapters.spark.options import parse_options
from tidelog.errors import NotFound, TooLarge
from tidelog.records import Record
from tidelog.service.server import ServiceThread

pytest.importorskip("pyspark")


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[tidelog.Store, ServiceThread]]:
    store = tidelog.open(f"file://{tmp_path}/store")
    thread = ServiceThread(store, max_request_bytes="64KiB").start()
    try:
        yield store, thread
    finally:
        thread.stop()
        store.close()


def _batches(n: int, size: int, per_batch: int = 100) -> list[pa.RecordBatch]:
    rows = [b"%06d" % i + b"p" * (size - 6) for i in range(n)]
    return [
        pa.RecordBatch.from_pydict(
            {"payload": rows[a : a + per_batch], "tag": ["t"] * len(rows[a : a + per_batch])}
        )
        for a in range(0, n, per_batch)
    ]


def _payloads(store: tidelog.Store, topic: str) -> list[bytes]:
    return [
        r.payload
        for r in store.topic(topic, create=False).read(0, 100_000)
        if isinstance(r, Record)
    ]


def test_SPK_44_a_task_sends_chunks_under_the_request_limit(
    served: tuple[tidelog.Store, ServiceThread],
) -> None:
    """3000 rows of 1 KB (3 MB) through a 64 KiB limit: chunks of at most 3/4 of it, each
    accepted; the commit of the two parts appends every row once, in part order."""
    store, thread = served
    opts = parse_options({"path": thread.url, "topic": "w"})
    assert netsink.chunk_limit(opts) == 48 * 1024
    batches = _batches(3000, 1000)
    chunks, rows = netsink.stage(opts, "job-a", 0, 0, iter(batches[:20]), None)
    assert rows == 2000 and chunks >= 2000 * 1000 // (48 * 1024)
    chunks1, rows1 = netsink.stage(opts, "job-a", 1, 3, iter(batches[20:]), None)
    assert rows1 == 1000
    store.topic("w")
    seqs = netsink.commit(opts, "job-a", [(0, 0, chunks), (1, 3, chunks1)], ("p", 1))
    assert seqs == [1, 3000]
    want = [b"%06d" % i + b"p" * 994 for i in range(3000)]
    assert _payloads(store, "w") == want
    assert netsink.commit(opts, "job-a", [(0, 0, chunks), (1, 3, chunks1)], ("p", 1)) == seqs
    netsink.abort(opts, "job-a")
    assert _payloads(store, "w") == want  # an abort after the commit drops only what is staged


def test_SPK_44_a_row_over_the_limit_is_too_large_and_an_aborted_write_takes_nothing(
    served: tuple[tidelog.Store, ServiceThread],
) -> None:
    store, thread = served
    opts = parse_options({"path": thread.url, "topic": "w"})
    big = pa.RecordBatch.from_pydict({"payload": [b"x" * 70_000]})
    with pytest.raises(TooLarge, match=r"1 row.*max-request-bytes"):
        netsink.stage(opts, "job-b", 0, 0, iter([big]), None)
    chunks, _ = netsink.stage(opts, "job-c", 0, 0, iter(_batches(10, 10)), None)
    netsink.abort(opts, "job-c")
    store.topic("w")
    with pytest.raises(NotFound, match="aborted"):
        netsink.commit(opts, "job-c", [(0, 0, chunks)], ("p", 1))
    assert _payloads(store, "w") == []


def test_SPK_44_the_writers_commit_the_parts_their_messages_name(
    served: tuple[tidelog.Store, ServiceThread],
) -> None:
    """ServedWriter: a task that failed after staging (attempt 0) and its retry (attempt 1);
    the commit names the retry's message only, creates the topic with its topic.* config and
    drops the failed attempt's chunks. ServedStreamWriter: producer from option producerId, a
    replayed micro-batch appends nothing."""
    store, thread = served
    opts = parse_options({"path": thread.url, "topic": "bw", "topic.durability": "disk"})
    writer = netsink.ServedWriter(opts)
    writer.write(iter(_batches(5, 10)))  # attempt 0 of partition 0: its message is lost
    rows = _batches(5, 10)
    message = netsink.ServedPart(writer._write_id(), 0, 1, 1, 5)
    netsink.stage(opts, writer._write_id(), 0, 1, iter(rows), None)
    writer.commit([message, None])
    assert _payloads(store, "bw") == [b"%06d" % i + b"pppp" for i in range(5)]
    assert store.topic("bw", create=False).config.durability == "disk"
    assert thread.service is not None and thread.service.staged.staged_bytes == 0

    sopts = parse_options({"path": thread.url, "topic": "sw", "producerId": "q1"})
    stream = netsink.ServedStreamWriter(sopts)
    for _ in range(2):  # batch 0, then Spark replays it after a restart
        copy = netsink.ServedStreamWriter(sopts)
        msg = copy.write(iter(_batches(3, 8)))
        stream.commit([msg], 0)
    assert len(_payloads(store, "sw")) == 3
    msg = netsink.ServedStreamWriter(sopts).write(iter(_batches(2, 8)))
    stream.abort([msg], 1)
    assert len(_payloads(store, "sw")) == 3
    assert thread.service.staged.staged_bytes == 0
