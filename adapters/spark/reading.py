"""What Spark's executors and the streaming source runner do with the store: read-only views
(spec/FORMATS.md XPR-1), never the writer lock (SPK-2).

A Python worker process is reused across tasks, so it keeps one read-only view per store and
``refresh()``es it before each task instead of replaying the WAL from scratch every time; the
view is a cache, not state: every task reads only what its partition names.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Iterator
from typing import Any

import pyarrow as pa

import tidelog
from tidelog.api import Store, Topic
from tidelog.bundle import decode_bundle
from tidelog.errors import TidelogError
from tidelog.hooks import EngineTopics, hooks
from tidelog.records import Tombstone

from . import fastread
from .columns import (
    TombstoneFound,
    log_batch,
    merge_slot_schemas,
    slot_batch,
    slot_schema,
)
from .options import SourceOptions

__all__ = ["view", "topic", "read_log", "read_slot", "seq_bounds", "infer_slot_columns", "split"]

_views: dict[str, tuple[Store, dict[str, Any]]] = {}
_views_lock = threading.Lock()


def view(root: str, *, fresh: bool = True, options: dict[str, Any] | None = None) -> Store:
    """This process's read-only view of the store at ``root`` (opened once, refreshed), opened
    with ``options`` (``SourceOptions.view_options()``: the cold tier, SPK-30); reopened when a
    read asks for other options."""
    want = dict(options or {})
    with _views_lock:
        store, opened = _views.get(root, (None, want))
        if store is not None and opened != want:
            store.close()  # idempotent
            store = None
        if store is None or store.closed:
            store = tidelog.open(f"file://{root}", readonly=True, **want)
            _views[root] = (store, want)
        elif fresh:
            store.refresh()
        return store


def topic(opts: SourceOptions, *, fresh: bool = True) -> Topic:
    return view(opts.root, fresh=fresh, options=opts.view_options()).topic(opts.topic, create=False)


def split(lo: int, hi: int, size: int) -> list[tuple[int, int]]:
    """Inclusive seq ranges of at most ``size`` seqs covering ``lo..hi`` (SPK-3)."""
    return [(s, min(s + size - 1, hi)) for s in range(lo, hi + 1, size)]


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
    opts: SourceOptions, lo: int, hi: int, limit: int, *, fresh: bool = True
) -> Iterator[list[Any]]:
    """Lists of items with seqs in ``lo..hi``, in order, at most ``limit`` per list.
    Tombstones are clipped to the range, so adjacent partitions never repeat one."""
    t = topic(opts, fresh=fresh)
    cursor = lo - 1
    while cursor < hi:
        got = t.read(after=cursor, limit=min(limit, hi - cursor))
        if not got:
            return  # past head_seq (TOP-8)
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
    opts: SourceOptions, lo: int, hi: int, accept: Any = None
) -> tuple[list[Any], int]:
    """Live runs of sealed segments the columnar readers can serve within ``lo..hi``, and the
    first seq they do not cover. Only where the public read would return exactly those
    records: at or above ``evict_floor``, no loss range, no ts filter (else no runs)."""
    if opts.from_ts is not None or opts.to_ts is not None or not fastread.available():
        return [], lo
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


def read_log(opts: SourceOptions, lo: int, hi: int) -> Iterator[pa.RecordBatch]:
    """Seqs ``lo..hi`` as ``log_schema`` batches (the Arrow fast path, SPK-3): sealed
    segments column by column (fastread), the rest through ``Topic.read``."""
    rows = opts.tombstones == "rows"
    topic(opts)  # refresh this process's view once per task
    runs, resume = _sealed_runs(opts, lo, hi)
    for chunk, i0, i1 in runs:
        yield from fastread.read_chunk(opts.topic, chunk, i0, i1, opts.batch_records, rows)
    if resume <= hi:
        for items in _items(opts, resume, hi, opts.batch_records, fresh=False):
            yield log_batch(opts.topic, items, rows)


def read_slot(opts: SourceOptions, lo: int, hi: int, target: pa.Schema) -> Iterator[pa.RecordBatch]:
    """Slot ``opts.slot`` of every bundle in ``lo..hi``, shaped to ``target`` (SPK-5). Sealed
    Quiver segments hand their bundles over zero-copy from the mapped file (QSEG-11); the rest
    is decoded from the records ``Topic.read`` returns."""
    topic(opts)  # refresh this process's view once per task
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
