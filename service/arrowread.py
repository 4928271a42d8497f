"""Arrow reads (spec/SERVICE.md SVC-61..SVC-64): ``GET /v0/topics/{t}/arrow`` answers a range of a
topic as an Arrow IPC stream, for Spark executors on hosts that do not see the store's directory
(spec/BUNDLES.md SPK-40, SPK-41).

The batches are the ones an executor builds from a view of its own: the Spark adapter's
``reading.read_store`` on the served store (the adapter never imports pyspark, SPK-1). Each
batch is built and encoded on a worker thread and written once the socket took the previous one;
the stream's last message says how it ended (SVC-63).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from collections.abc import Generator, Iterator
from typing import TYPE_CHECKING, Any

import pyarrow as pa
from aiohttp import web

from tidelog.adapters.spark.columns import log_schema
from tidelog.adapters.spark.netread import ARROW_STREAM, END_KEY, ERROR_KEY
from tidelog.adapters.spark.options import SourceOptions
from tidelog.api import Store, Topic
from tidelog.backends.file.store import FileBackend
from tidelog.errors import BadArgument, Closed, Internal, NotAvailable, TidelogError
from tidelog.hooks import hooks, offers

from .request import check_query, query_int, query_str
from .streams import _admit as admit_stream
from .wire import dumps, error_json

if TYPE_CHECKING:
    from .app import Service

__all__ = ["add_routes", "served_store_id", "MAX_BATCH_RECORDS"]

log = logging.getLogger("tidelog.service")
MAX_BATCH_RECORDS = 1_000_000  # SVC-61's range of batch_records


def served_store_id(store: Store) -> str:
    """SVC-62: a file store's own id; for any other store a random one drawn now, at start."""
    if offers(store, FileBackend):
        return str(hooks(store, FileBackend).store_id.hex())
    return uuid.uuid4().hex


class _Encoder:
    """One Arrow IPC stream, message by message (SVC-61, SVC-63): each message is serialized on
    its own (one copy, straight into the buffer handed to the socket)."""

    def __init__(self, schema: pa.Schema) -> None:
        self.schema = schema
        self.head: pa.Buffer | None = schema.serialize()  # sent before the first message

    def _with_head(self, body: pa.Buffer) -> list[pa.Buffer]:
        head, self.head = self.head, None
        return [body] if head is None else [head, body]

    def batch(self, batch: pa.RecordBatch) -> list[pa.Buffer]:
        return self._with_head(batch.serialize())

    def last(self, meta: dict[bytes, bytes]) -> list[pa.Buffer]:
        """SVC-63: a batch of 0 rows carrying the outcome, then the end-of-stream marker. A
        writer makes both (batch.serialize() takes no metadata); its schema message is cut."""
        sink = pa.BufferOutputStream()
        with pa.ipc.new_stream(sink, self.schema) as writer:
            empty = pa.RecordBatch.from_pylist([], schema=self.schema)
            writer.write_batch(empty, custom_metadata=meta)
        whole = sink.getvalue()
        return self._with_head(whole.slice(len(self.schema.serialize())))


async def _send(response: web.StreamResponse, buffers: list[pa.Buffer]) -> None:
    for buffer in buffers:
        await response.write(memoryview(buffer))


def _reader() -> Any:
    """The adapter's ``read_store`` (its columnar paths need numpy, the ``spark`` extra)."""
    try:
        from tidelog.adapters.spark.reading import read_store
    except ImportError as exc:
        raise NotAvailable(
            f"Arrow reads need numpy in the service's environment ({exc}): pip install "
            "'tidelog[spark]' (SVC-61)"
        ) from None
    return read_store


def _next(batches: Iterator[pa.RecordBatch], encoder: _Encoder) -> list[pa.Buffer] | None:
    """On a worker thread: the next batch, encoded; None at the end."""
    for batch in batches:
        if batch.num_rows:
            return encoder.batch(batch)
    return None


def add_routes(app: web.Application, svc: Service) -> None:
    async def arrow(request: web.Request) -> web.StreamResponse:
        check_query(request, ("incarnation", "after", "until", "tombstones", "batch_records"))
        after = query_int(request, "after", None, 0)
        until = query_int(request, "until", None, 0)
        if after is None or until is None:
            raise BadArgument("query parameters 'after' and 'until' are required (SVC-61)")
        if until < after:
            raise BadArgument(f"'until' ({until}) is below 'after' ({after}) (SVC-61)")
        tombstones = query_str(request, "tombstones") or "fail"
        if tombstones not in ("fail", "rows"):
            raise BadArgument(f"query parameter 'tombstones': fail or rows, got {tombstones!r}")
        batch_records = query_int(request, "batch_records", 65_536, 1)
        assert batch_records is not None
        if batch_records > MAX_BATCH_RECORDS:
            raise BadArgument(f"'batch_records' is at most {MAX_BATCH_RECORDS} (SVC-61)")
        name = request.match_info["t"]
        incarnation = query_int(request, "incarnation", None, 1)
        who = svc.principal(request)
        admit_stream(svc, who)  # SVC-64: it counts as a stream
        read_store = _reader()

        def start(t: Topic) -> tuple[int, int]:
            return t.state().head_seq, t.incarnation

        head, life = await svc.call(svc.on_topic, name, incarnation, start)
        end = min(until, head)
        opts = SourceOptions(
            root=svc.store.uri, topic=name, tombstones=tombstones, batch_records=batch_records
        )
        batches: Generator[pa.RecordBatch, None, None] = read_store(svc.store, opts, after + 1, end)
        encoder = _Encoder(log_schema(tombstones == "rows"))
        response = web.StreamResponse(
            headers={
                "Content-Type": ARROW_STREAM,
                "Cache-Control": "no-store",
                "X-Tidelog-Store-Id": svc.store_id,
                "X-Tidelog-Incarnation": str(life),
                "X-Tidelog-Head-Seq": str(head),
            }
        )
        await response.prepare(request)
        task = asyncio.current_task()
        assert task is not None
        svc.streams.add(task)
        svc.streams_of[who.name] = svc.streams_of.get(who.name, 0) + 1
        try:
            try:
                while True:
                    if svc.stopping:
                        raise Closed("the service is shutting down (SVC-57)")
                    data = await svc.call(_next, batches, encoder)
                    if data is None:
                        break
                    await _send(response, data)
                meta = {END_KEY: str(end).encode()}
            except TidelogError as exc:
                meta = {ERROR_KEY: dumps(error_json(exc.code, exc.message))}
            except (ConnectionResetError, asyncio.CancelledError):
                raise
            except Exception:
                log.exception("internal error on an Arrow read of topic %r", name)
                err = Internal(f"internal error on an Arrow read of topic {name!r}")
                meta = {ERROR_KEY: dumps(error_json(err.code, err.message))}
            await _send(response, encoder.last(meta))
            await response.write_eof()
        finally:
            with contextlib.suppress(ValueError):  # still running on a worker: it ends there
                batches.close()  # a generator: lets its pins go
            svc.streams.discard(task)
            svc.streams_of[who.name] -= 1
        return response

    route = app.router.add_get("/v0/topics/{t}/arrow", arrow)
    svc.rights[route] = "read"  # SVC-48
