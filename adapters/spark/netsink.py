"""Spark writes to a store that ``tidelog serve`` owns (spec/BUNDLES.md SPK-44): tasks stage their
rows on the owner as chunks (spec/SERVICE.md SVC-65), the driver-side commit asks it to append
the chunks of the attempts that won in one ``append_records`` (SVC-66), and every outcome ends
with an abort that drops what the write staged (SVC-67).

Requests go through the remote backend's client (backends/remote/client.py): its token, TLS,
timeouts and SVC-60's repeats. Every request here is safe to repeat after a lost answer (a
chunk's key replaces it, a commit is idempotent by write id, an abort is), so each is sent with
``safe=True``.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote, urlencode

import pyarrow as pa
from pyspark import TaskContext
from pyspark.sql.datasource import (
    DataSourceArrowWriter,
    DataSourceStreamArrowWriter,
    WriterCommitMessage,
)

from tidelog.backends.remote.backend import RemoteBackend
from tidelog.backends.remote.client import Request
from tidelog.errors import BadArgument, NoSuchTopic, TidelogError, TooLarge
from tidelog.hooks import hooks
from tidelog.service.wire import dumps

from . import netread, staging
from .columns import staged_table
from .options import SourceOptions

__all__ = [
    "ServedPart",
    "ServedWriter",
    "ServedStreamWriter",
    "stage",
    "commit",
    "abort",
    "chunk_limit",
]

log = logging.getLogger("tidelog.spark")
QUERY_ID_KEY = "sql.streaming.queryId"  # local property Spark sets on every streaming job
_DEFAULT_MAX_REQUEST = 16 << 20  # SVC-51's default, for a service that shows no limits


def _backend(opts: SourceOptions) -> RemoteBackend:
    return hooks(netread.store(opts), RemoteBackend)


def chunk_limit(opts: SourceOptions) -> int:
    """SPK-44: a chunk's Arrow payload is at most 3/4 of the service's ``max_request_bytes``
    (the rest: the stream's schema and message headers)."""
    limits = _backend(opts).hello.get("limits") or {}
    most = limits.get("max_request_bytes") if isinstance(limits, dict) else None
    return max(1, (most if isinstance(most, int) else _DEFAULT_MAX_REQUEST) * 3 // 4)


def _path(opts: SourceOptions, write: str, rest: str = "") -> str:
    return f"/v0/topics/{quote(opts.topic, safe='')}/staged/{write}{rest}"


def _pieces(batch: pa.RecordBatch, limit: int) -> Iterator[pa.RecordBatch]:
    """``batch`` cut into row slices of about ``limit`` bytes each (one row at least)."""
    if batch.num_rows == 0:
        return
    per_row = max(1.0, batch.nbytes / batch.num_rows)
    step = max(1, int(limit / per_row))
    for start in range(0, batch.num_rows, step):
        yield batch.slice(start, step)


def _encode(batches: list[pa.RecordBatch]) -> bytes:
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, batches[0].schema) as writer:
        for batch in batches:
            writer.write_batch(batch)
    return bytes(sink.getvalue())


def stage(
    opts: SourceOptions,
    write: str,
    part: int,
    attempt: int,
    batches: Iterator[pa.RecordBatch],
    slot: int | None,
) -> tuple[int, int]:
    """SPK-44, on an executor: send a task's rows as chunks keyed by (write, part, attempt,
    chunk index); returns (chunks, rows)."""
    backend = _backend(opts)
    limit = chunk_limit(opts)
    pending: list[pa.RecordBatch] = []
    size = chunks = rows = 0

    def send() -> None:
        nonlocal pending, size, chunks
        body = _encode(pending)
        query = urlencode({"part": part, "attempt": attempt, "chunk": chunks})
        req = Request(
            "PUT",
            _path(opts, write),
            query=query,
            body=body,
            content_type=netread.ARROW_STREAM,
            safe=True,
        )
        what = (
            f"staging chunk {chunks} of partition {part} (attempt {attempt}) of topic "
            f"{opts.topic!r}"
        )
        try:
            backend.client.call(req, what)
        except TooLarge as exc:
            raise TooLarge(
                f"{what}: {len(body)} bytes in {sum(b.num_rows for b in pending)} row(s); a row "
                f"over the service's --max-request-bytes cannot be written: {exc.message} "
                "(SPK-44, SVC-51)"
            ) from None
        chunks += 1
        pending, size = [], 0

    for batch in batches:
        for piece in _pieces(staged_table(batch, slot), limit):
            if pending and size + piece.nbytes > limit:
                send()
            pending.append(piece)
            size += piece.nbytes
            rows += piece.num_rows
    if pending:
        send()
    return chunks, rows


def commit(
    opts: SourceOptions,
    write: str,
    parts: list[tuple[int, int, int]],
    producer: tuple[str, int],
) -> list[int]:
    """SPK-44, on the driver: make sure the topic exists, then one commit (SVC-66)."""
    store = netread.store(opts)
    config: dict[str, Any] = dict(opts.topic_config)
    try:
        store.topic(opts.topic, create=False, **config)  # GET: the config must match (TOP-9)
    except NoSuchTopic:
        store.topic(opts.topic, **config)  # PUT: needs admin (SVC-48)
    body = {"parts": [list(p) for p in parts], "producer": {"id": producer[0], "seq": producer[1]}}
    req = Request("POST", _path(opts, write, "/commit"), body=dumps(body), safe=True)
    what = f"commit of write {write} to topic {opts.topic!r}"
    seqs: list[int] = _backend(opts).client.call(req, what)["seqs"]
    return seqs


def abort(opts: SourceOptions, write: str) -> None:
    """SVC-67: drop what the write staged (idempotent)."""
    req = Request("DELETE", _path(opts, write), safe=True)
    _backend(opts).client.call(req, f"abort of write {write} to topic {opts.topic!r}")


def _abort_quietly(opts: SourceOptions, write: str) -> None:
    """After a commit, whatever its outcome: a failure here leaves the chunks to SVC-68's
    collection, and must not hide the commit's own error."""
    try:
        abort(opts, write)
    except TidelogError as exc:
        log.warning("dropping staged write %s failed (collected later, SVC-68): %s", write, exc)


# -- the writers -----------------------------------------------------------------------------------
@dataclass
class ServedPart(WriterCommitMessage):
    """What a task staged (SPK-44): the write's id, its partition, attempt, number of chunks."""

    write: str
    part: int
    attempt: int
    chunks: int
    rows: int
    query_id: str | None = None


def _task() -> tuple[int, int, str | None]:
    ctx = TaskContext.get()
    if ctx is None:  # not in a Spark task (a direct call)
        return 0, 0, None
    return ctx.partitionId(), ctx.attemptNumber(), ctx.getLocalProperty(QUERY_ID_KEY)


def _served(messages: list[Any]) -> list[ServedPart]:
    return [m for m in messages if isinstance(m, ServedPart)]


class _Served:
    opts: SourceOptions

    def _write_id(self) -> str:
        raise NotImplementedError

    def write(self, iterator: Iterator[pa.RecordBatch]) -> ServedPart:
        part, attempt, query_id = _task()
        write = self._write_id()
        chunks, rows = stage(self.opts, write, part, attempt, iterator, self.opts.slot)
        return ServedPart(write, part, attempt, chunks, rows, query_id)

    def _commit(self, messages: list[Any], producer: Callable[[], tuple[str, int]]) -> None:
        """One commit of the tasks' parts, under the write id they staged with (the copy of the
        writer Spark commits on need not be the one it shipped to the tasks), then aborts."""
        served = _served(messages)
        writes = {m.write for m in served}
        try:
            if len(writes) > 1:
                raise BadArgument(f"the tasks of one write staged under several ids: {writes}")
            parts = [(m.part, m.attempt, m.chunks) for m in served if m.chunks]
            if parts:
                commit(self.opts, next(iter(writes)), parts, producer())
        finally:
            for write in writes:
                _abort_quietly(self.opts, write)


class ServedWriter(_Served, DataSourceArrowWriter):
    """A batch write (SPK-6, SPK-7) to a served store: write id ``job-<uuid>``, producer
    ``(spark-job-<uuid>, 1)``."""

    def __init__(self, opts: SourceOptions) -> None:
        self.opts = opts
        self.job_id = uuid.uuid4().hex  # drawn in the planner: tasks and commit share it

    def _write_id(self) -> str:
        return f"job-{self.job_id}"

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        self._commit(messages, lambda: (f"spark-job-{self.job_id}", 1))

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        for write in {self._write_id()} | {m.write for m in _served(messages)}:
            abort(self.opts, write)


class ServedStreamWriter(_Served, DataSourceStreamArrowWriter):
    """A streaming write (SPK-11) to a served store: a write id per micro-batch, drawn when the
    writer is shipped to its tasks; producer ``(spark-<queryId>, batchId + 1)``."""

    def __init__(self, opts: SourceOptions) -> None:
        self.opts = opts
        self.write_id: str | None = None

    def __getstate__(self) -> dict[str, Any]:
        self._write_id()
        return dict(self.__dict__)

    def _write_id(self) -> str:
        if self.write_id is None:
            self.write_id = f"mb-{uuid.uuid4().hex}"
        return self.write_id

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        ids = {m.query_id for m in _served(messages) if m.query_id}
        self._commit(messages, lambda: staging.stream_producer(self.opts, ids, batchId))

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        # the parts of tasks that failed or still run are not in messages: their chunks stay
        # until SVC-68's collection
        for write in {m.write for m in _served(messages)}:
            abort(self.opts, write)
