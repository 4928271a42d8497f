"""What Spark's executors and the streaming source runner do with the store: read-only views
(spec/FORMATS.md XPR-1), never the writer lock (SPK-2).

A Python worker process is reused across tasks, so it keeps one read-only view per store and
``refresh()``es it before each task instead of replaying the WAL from scratch every time; the
view is a cache, not state: every task reads only what its partition names.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterable, Iterator
from typing import Any

import pyarrow as pa

import tidelog
from tidelog.api import Store, Topic
from tidelog.backends.file.coldchunk import ColdChunk
from tidelog.backends.file.store import FileBackend
from tidelog.bundle import decode_bundle
from tidelog.errors import TidelogError
from tidelog.hooks import EngineTopics, hooks, offers
from tidelog.records import Tombstone

from . import fastread, netread
from .columns import (
    TombstoneFound,
    log_batch,
    merge_slot_schemas,
    slot_batch,
    slot_schema,
)
from .guard import Planned, StaleView, another_store, behind, check_visible
from .options import SourceOptions

__all__ = [
    "view",
    "topic",
    "read_log",
    "read_store",
    "read_slot",
    "seq_bounds",
    "infer_slot_columns",
    "split",
    "split_even",
    "task_count",
]

_views: dict[str, tuple[Store, dict[str, Any]]] = {}
_views_lock = threading.Lock()


def view(
    root: str,
    *,
    fresh: bool = True,
    planned: Planned | None = None,
    options: dict[str, Any] | None = None,
) -> Store:
    """This process's read-only view of the store at ``root`` (opened once, refreshed), opened
    with ``options`` (``SourceOptions.view_options()``: the cold tier, SPK-30); reopened when a
    read asks for other options. ``planned``: the plan of the task asking (None on the
    driver), for SPK-16's message when this host has no store there."""
    want = dict(options or {})
    with _views_lock:
        store, opened = _views.get(root, (None, want))
        if store is not None and opened != want:
            store.close()  # idempotent
            store = None
        if store is None or store.closed:
            check_visible(root, planned)
            store = tidelog.open(f"file://{root}", readonly=True, **want)
            _views[root] = (store, want)
        elif fresh:
            store.refresh()
        return store


def _forget(root: str) -> None:
    with _views_lock:
        entry = _views.pop(root, None)
    if entry is not None:
        entry[0].close()


def topic(opts: SourceOptions, *, fresh: bool = True) -> Topic:
    if netread.is_served(opts.root):  # through the owner (SPK-40)
        return netread.topic(opts)
    return view(opts.root, fresh=fresh, options=opts.view_options()).topic(opts.topic, create=False)


def _identity(store: Store, name: str) -> tuple[str, int | None, int]:
    """(store_id, the topic's incarnation or None when the view lacks it, its head_seq)."""
    backend = hooks(store, FileBackend)  # the adapter reads file:// stores only (SPK-2)
    engine_topic = backend.topics.get(name)
    if engine_topic is None:
        return backend.store_id.hex(), None, 0
    head = store.topic(name, create=False).state().head_seq
    return backend.store_id.hex(), engine_topic.tid, head


def plan(opts: SourceOptions) -> Planned:
    """What the driver's partitions carry (SPK-14), from its freshly refreshed view."""
    if netread.is_served(opts.root):
        return netread.plan(opts)
    store = topic(opts).store  # refreshed; no_such_topic naming it when missing
    store_id, incarnation, head = _identity(store, opts.topic)
    assert incarnation is not None
    return Planned(store_id, incarnation, head)


def await_plan(opts: SourceOptions, planned: Planned, hi: int) -> None:
    """Block until this process's view is the planned store and topic with head_seq >= ``hi``
    (refreshing every 50 ms), or raise ``StaleView`` after ``freshnessTimeoutMs`` (SPK-14)."""
    start = time.monotonic()
    deadline = start + opts.freshness_timeout_ms / 1000
    reopened = False
    while True:
        store_id, incarnation, head = _identity(
            view(opts.root, planned=planned, options=opts.view_options()), opts.topic
        )
        if store_id != planned.store_id:
            if not reopened:  # the cached view may be of a store since replaced: look again
                _forget(opts.root)
                reopened = True
                continue
            raise another_store(opts.root, planned, store_id)
        if incarnation is not None and incarnation > planned.incarnation:
            raise StaleView(
                f"topic {opts.topic!r} of {opts.root} was dropped and re-created since the "
                f"driver planned this read (incarnation {incarnation}, the plan's "
                f"{planned.incarnation}): its records are gone"
            )
        if incarnation == planned.incarnation and head >= hi:
            return
        now = time.monotonic()
        if now >= deadline:
            why = "" if incarnation is not None else "; the view has no such topic"
            if incarnation is not None and incarnation < planned.incarnation:
                why = f"; the view has an earlier incarnation of the topic ({incarnation})"
            raise behind(opts.root, opts.topic, head, hi, int((now - start) * 1000), why)
        time.sleep(min(0.05, deadline - now))


def split(lo: int, hi: int, size: int) -> list[tuple[int, int]]:
    """Inclusive seq ranges of at most ``size`` seqs covering ``lo..hi`` (SPK-3)."""
    return [(s, min(s + size - 1, hi)) for s in range(lo, hi + 1, size)]


#: Spark's spark.sql.files.openCostInBytes default: no task is cut smaller than this many bytes
#: of payload for the sake of parallelism (SPK-3).
MIN_SPLIT_BYTES = 4 << 20


def task_count(opts: SourceOptions, volume: float) -> int:
    """SPK-3: how many tasks a range of ``volume`` bytes of payload is cut into: as many as
    ``partitionBytes`` make, and at least ``minPartitions`` (default this host's CPU count)
    while each keeps ``MIN_SPLIT_BYTES``."""
    by_size = -(-volume // opts.partition_bytes)  # ceil
    cores = opts.min_partitions or os.cpu_count() or 1
    return int(max(1, by_size, min(cores, volume // MIN_SPLIT_BYTES)))


def split_even(lo: int, hi: int, n: int) -> list[tuple[int, int]]:
    """``lo..hi`` in ``n`` inclusive ranges whose sizes differ by one at most (SPK-3)."""
    count = hi - lo + 1
    n = max(1, min(n, count))
    base, extra = divmod(count, n)
    out, start = [], lo
    for i in range(n):
        end = start + base + (1 if i < extra else 0) - 1
        out.append((start, end))
        start = end + 1
    return out


def seq_bounds(opts: SourceOptions) -> tuple[int, int]:
    """The inclusive seq range a batch read covers (SPK-3). Without ``fromSeq`` it starts at
    ``evict_floor``: what was evicted before is not this read's business. An explicit
    ``fromSeq`` below the floor meets the leading tombstone (TMB-1, SPK-4)."""
    state = topic(opts).state()
    lo = state.evict_floor if opts.from_seq is None else opts.from_seq
    hi = state.head_seq if opts.to_seq is None else min(opts.to_seq, state.head_seq)
    return lo, hi


def _fail_on(item: Tombstone, opts: SourceOptions) -> TombstoneFound:
    return TombstoneFound(
        f"topic {opts.topic!r}: seqs {item.gap_from}..{item.gap_to} were lost involuntarily "
        "(evicted or lost in a crash, spec TMB-1/2); set option tombstones=rows to read "
        "through the gap"
    )


def _items(
    opts: SourceOptions, lo: int, hi: int, limit: int, *, fresh: bool = True,
    store: Store | None = None,
) -> Iterator[list[Any]]:  # fmt: skip
    """Lists of items with seqs in ``lo..hi``, in order, at most ``limit`` per list.
    Tombstones are clipped to the range, so adjacent partitions never repeat one."""
    t = topic(opts, fresh=fresh) if store is None else store.topic(opts.topic, create=False)
    cursor = lo - 1
    while cursor < hi:
        got = t.read(after=cursor, limit=min(limit, hi - cursor))
        if not got:
            # past head_seq (TOP-8): complete only if the view reaches hi, else short (SPK-15)
            head = t.state().head_seq
            if head < hi:
                raise behind(opts.root, opts.topic, head, hi, None, f"; read up to {cursor}")
            return
        out: list[Any] = []
        done = False
        for item in got:
            if isinstance(item, Tombstone):
                if item.gap_from > hi:
                    done = True
                    break
                if opts.tombstones == "fail":
                    raise _fail_on(item, opts)
                out.append(Tombstone(max(item.gap_from, lo), min(item.gap_to, hi)))
                cursor = item.gap_to
                continue
            if item.seq > hi:
                done = True
                break
            cursor = item.seq
            if opts.from_ts is not None and item.ts < opts.from_ts:
                continue
            if opts.to_ts is not None and item.ts > opts.to_ts:
                done = True  # ts never decreases along seq (TOP-5): nothing later matches
                break
            out.append(item)
        if out:
            yield out
        if done:
            return


def _sealed_runs(
    opts: SourceOptions, lo: int, hi: int, accept: Any = None, store: Store | None = None
) -> tuple[list[Any], int]:
    """Live runs of sealed segments the columnar readers can serve within ``lo..hi``, and the
    first seq they do not cover. Only where the public read would return exactly those
    records: at or above ``evict_floor``, no loss range, no ts filter (else no runs)."""
    if opts.from_ts is not None or opts.to_ts is not None or not fastread.available():
        return [], lo
    if store is None:
        store = view(opts.root, fresh=False, options=opts.view_options())
    state = store.topic(opts.topic, create=False).state()  # applies lazy TTL first (RET-4)
    # the engine's topics, a hook of the file backend (REG-5): the sealed chunks to serve
    engine_topic = hooks(store, EngineTopics).topics.get(opts.topic)
    if engine_topic is None or lo < state.evict_floor:
        return [], lo
    log = engine_topic.log
    hi = min(hi, log.visible)
    if any(a <= hi and b >= lo for a, b in log.losses):
        return [], lo
    if accept is None:
        return fastread.chunk_ranges(log, lo, hi)
    return fastread.chunk_ranges(log, lo, hi, accept)


def _open_task(opts: SourceOptions, hi: int, planned: Planned | None) -> None:
    """Refresh this process's view once per task; a planned task first waits for its plan
    (SPK-14)."""
    if planned is None:
        topic(opts)
    else:
        await_plan(opts, planned, hi)


def read_log(
    opts: SourceOptions, lo: int, hi: int, planned: Planned | None = None
) -> Iterator[pa.RecordBatch]:
    """Seqs ``lo..hi`` as ``log_schema`` batches (the Arrow fast path, SPK-3): sealed
    segments column by column (fastread), the rest through ``Topic.read``; a served store's
    through its owner (SPK-41)."""
    if netread.is_served(opts.root):
        yield from netread.read_served(opts, lo, hi, planned)
        return
    _open_task(opts, hi, planned)
    yield from read_store(view(opts.root, fresh=False, options=opts.view_options()), opts, lo, hi)


def read_store(store: Store, opts: SourceOptions, lo: int, hi: int) -> Iterator[pa.RecordBatch]:
    """``read_log`` of an open ``store``: this process's view, or the store the process owns
    (the service's Arrow read, SERVICE.md SVC-61). A file store's sealed runs are chosen under
    its lock and their maps held (pinned) until read, so a checkpoint retiring one meanwhile
    leaves the map to this read (SVC-64); other backends are read through ``Topic.read``."""
    rows = opts.tombstones == "rows"
    fast = offers(store, FileBackend)
    pinned: list[tuple[pa.Buffer | None, Any, int, int]] = []
    resume = lo
    if fast:
        backend = hooks(store, FileBackend)
        # the owner reads cold segments through Topic.read, which fetches and pins them as the
        # tiering rules say (TIER-8); a view of its own may fetch them itself
        accept = None if backend.readonly else _hot_segment
        with backend.lock:
            runs, resume = _sealed_runs(opts, lo, hi, accept, store=store)
            # an export of each chunk's map (py_buffer takes one): closing the chunk leaves it
            pinned = [(_pin(chunk), chunk, i0, i1) for chunk, i0, i1 in runs]
    for _held, chunk, i0, i1 in pinned:
        yield from fastread.read_chunk(opts.topic, chunk, i0, i1, opts.batch_records, rows)
    del pinned  # the maps a checkpoint retired meanwhile go now
    if fast and resume <= hi:
        tail, resume = _tail(opts, resume, hi, store=store)
        if tail is not None:
            yield from fastread.read_tail(opts.topic, tail, opts.batch_records, rows)
    if resume <= hi:
        for items in _items(opts, resume, hi, opts.batch_records, fresh=False, store=store):
            yield log_batch(opts.topic, items, rows)


def _hot_segment(chunk: Any) -> bool:
    return fastread.is_segchunk(chunk) and not isinstance(chunk, ColdChunk)


def _pin(chunk: Any) -> pa.Buffer | None:
    """A hold on a sealed chunk's mapped bytes (None for a cold one not fetched yet)."""
    return None if chunk.data is None else pa.py_buffer(chunk.data)


def _tail(opts: SourceOptions, lo: int, hi: int, store: Store | None = None) -> tuple[Any, int]:
    """The unsealed tail's slots serving ``lo..hi`` (copied under the view's lock: list slices,
    references only) and the first seq they do not cover; (None, lo) where the public read must
    serve the range (SPK-3: the same records, column by column)."""
    if opts.from_ts is not None or opts.to_ts is not None or not fastread.available():
        return None, lo
    store = view(opts.root, fresh=False, options=opts.view_options()) if store is None else store
    state = store.topic(opts.topic, create=False).state()  # applies lazy TTL first (RET-4)
    backend = hooks(store, FileBackend)
    with backend.lock:
        engine_topic = backend.topics.get(opts.topic)
        if engine_topic is None or lo < state.evict_floor:
            return None, lo
        log = engine_topic.log
        if any(a <= hi and b >= lo for a, b in log.losses):
            return None, lo
        span = fastread.tail_span(log, lo, hi)
        if span is None:
            return None, lo
        i0, i1 = span
        end = log.base + i1  # the last seq served (a view behind hi leaves the rest short)
        if i1 < i0:
            return None, max(lo, end + 1)
        a, b = i0, i1 + 1
        tail = (log.base + a, *log.tail_columns(a, b))
    return tail, end + 1


def read_slot(
    opts: SourceOptions, lo: int, hi: int, target: pa.Schema, planned: Planned | None = None
) -> Iterator[pa.RecordBatch]:
    """Slot ``opts.slot`` of every bundle in ``lo..hi``, shaped to ``target`` (SPK-5). Sealed
    Quiver segments hand their bundles over zero-copy from the mapped file (QSEG-11); the rest
    is decoded from the records ``Topic.read`` returns."""
    _open_task(opts, hi, planned)
    runs, resume = _sealed_runs(opts, lo, hi, fastread.is_qseg_chunk)
    sealed = ((c.first_seq + i, c.bundle(i)) for c, i0, i1 in runs for i in range(i0, i1 + 1))
    yield from _slot_batches(opts, target, sealed)
    if resume <= hi:
        yield from _slot_batches(opts, target, _decoded(opts, resume, hi))


def _decoded(opts: SourceOptions, lo: int, hi: int) -> Iterator[tuple[int, Any]]:
    for items in _items(opts, lo, hi, opts.batch_records, fresh=False):
        for item in items:
            if isinstance(item, Tombstone):
                raise _fail_on(item, opts)  # a slot row has no place for a gap marker
            try:
                yield item.seq, decode_bundle(item.payload)
            except TidelogError as exc:
                raise type(exc)(f"topic {opts.topic!r} seq {item.seq}: {exc.message}") from None


def _slot_batches(
    opts: SourceOptions, target: pa.Schema, bundles: Iterable[tuple[int, Any]]
) -> Iterator[pa.RecordBatch]:
    """(seq, bundle) pairs as ``target`` batches of about ``batchRecords`` rows each."""
    assert opts.slot is not None
    out: list[pa.RecordBatch] = []
    rows = 0
    for seq, bundle in bundles:
        batch = bundle.get(opts.slot)
        if batch is not None and batch.num_rows:
            out.append(slot_batch(seq, batch, target))
            rows += batch.num_rows
            if rows >= opts.batch_records:
                yield _combine(out, target)
                out, rows = [], 0
    if out:
        yield _combine(out, target)


def _combine(batches: list[pa.RecordBatch], target: pa.Schema) -> pa.RecordBatch:
    return pa.Table.from_batches(batches, schema=target).combine_chunks().to_batches()[0]


def infer_slot_columns(opts: SourceOptions) -> pa.Schema:
    """The columns of slot ``opts.slot``: merged over up to ``sampleBundles`` bundles of the
    read range (schema drift, SPK-5)."""
    assert opts.slot is not None
    lo, hi = seq_bounds(opts)
    schemas: list[pa.Schema] = []
    seen = 0
    t = topic(opts)
    cursor = lo - 1
    while cursor < hi and seen < opts.sample_bundles:
        got = t.read(after=cursor, limit=min(1000, hi - cursor))
        if not got:
            break
        for item in got:
            if isinstance(item, Tombstone):
                cursor = item.gap_to
                continue
            cursor = item.seq
            if item.seq > hi or seen >= opts.sample_bundles:
                break
            seen += 1
            batch = decode_bundle(item.payload).get(opts.slot)
            if batch is not None and batch.schema not in schemas:
                schemas.append(batch.schema)
    columns = merge_slot_schemas(schemas)
    slot_schema(columns)  # checks the _seq name is free
    return columns
