"""Columnar reads of sealed segments for Spark's executors (SPK-3's fast path).

``Topic.read`` builds one ``Record`` per seq in Python; a Spark scan then converts those back
into columns. Here a live run of a sealed segment becomes Arrow columns directly, with array
operations only: the records are verified as a read verifies them (spec/FORMATS-seg2.md SEG-12:
one XXH3-64 per ~64 KiB block of the mapped ``.data``, or frame by frame where that is cheaper
or a block fails), seqs, timestamps and payload positions come from the index columns, tags and
nodes from its label runs (SEG-11), and the payload bytes are gathered straight out of the
segment's mmap. The unsealed tail, which a read-only view replays into per-column lists
(``TopicLog.payloads``, ``tss``, ``tags``, ``nodes``), becomes Arrow columns from slices of
those lists. Anything else (tombstones, ts filters, a backend without ``SegChunk``s) goes
through the public read path, which stays the reference: tests compare the two on the same
stores.

This module reads the file backend's in-memory structures (``TopicLog.chunks`` and its tail
lists, ``SegChunk``'s index, label runs and dead map) of a read-only view that only this process
refreshes, reached through the ``topics`` hook (REG-5); it serves only the chunk classes it
imports from the file backend and leaves any other chunk to the public read.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from itertools import pairwise
from typing import Any

import numpy as np  # the spark extra brings it (pyspark's Arrow paths need it too)
import pyarrow as pa

from tidelog.backends.file.chunk import SegChunk
from tidelog.backends.file.format.segment import RECORD_HEADER_SIZE
from tidelog.backends.file.qchunk import QsegChunk

from .columns import log_schema

__all__ = [
    "available",
    "chunk_ranges",
    "read_chunk",
    "is_segchunk",
    "is_qseg_chunk",
    "tail_span",
    "read_tail",
]

_HEADER = RECORD_HEADER_SIZE  # record frame header (FORMATS SEG-2)
_OVERHEAD = _HEADER + 8  # header + XXH3-64 trailer
_MAX_BATCH_BYTES = 256 << 20  # Arrow binary offsets are int32: stay far below 2 GiB per batch


def available() -> bool:
    """An Arrow with binary_view arrays (pyarrow >= 16)."""
    return hasattr(pa, "binary_view")


def _is_segchunk(chunk: Any) -> bool:
    """A sealed segment (``SegChunk``): its mapped ``.data``, index and label runs."""
    return isinstance(chunk, SegChunk)


def is_segchunk(chunk: Any) -> bool:
    """A sealed segment the columnar reader serves (``SegChunk``, a cold one included)."""
    return _is_segchunk(chunk)


def is_qseg_chunk(chunk: Any) -> bool:
    """A sealed Quiver segment of a bundle topic (``QsegChunk``): bundles straight from the
    mapped file, zero-copy (spec/BUNDLES.md QSEG-11)."""
    return isinstance(chunk, QsegChunk)


def chunk_ranges(
    log: Any, lo: int, hi: int, accept: Callable[[Any], bool] = _is_segchunk
) -> tuple[list[tuple[Any, int, int]], int]:
    """Live runs ``(chunk, i0, i1)`` (inclusive slot indexes) of sealed chunks within seqs
    ``lo..hi`` that ``accept`` takes, and the first seq not covered by them (where the public
    read takes over). Dead slots are skipped silently: above ``evict_floor`` they are voluntary
    removals (TMB-4), and the caller starts at the floor."""
    runs: list[tuple[Any, int, int]] = []
    resume = lo
    for chunk in log.chunks:
        first, count = chunk.first_seq, chunk.count
        if first + count - 1 < resume:
            continue
        if first > hi or not accept(chunk):
            break  # past the range, or another kind of chunk: the public read goes on here
        # seqs between sealed chunks belong to whole segments dropped once nothing in them
        # was live: removed, and read silently like any dead slot
        resume = max(resume, first)
        i0, i1 = resume - first, min(hi - first, count - 1)
        dead = chunk.dead
        i = i0
        while i <= i1:
            d = dead.find(1, i, i1 + 1)
            end = i1 if d < 0 else d - 1
            if end >= i:
                runs.append((chunk, i, end))
            if d < 0:
                break
            live = dead.find(0, d, i1 + 1)
            if live < 0:
                break
            i = live
        resume = first + i1 + 1
        if resume > hi:
            break
    return runs, resume


#: Below this many records per contiguous piece, building 16-byte views beats joining pieces.
_PIECE_RECORDS = 16


def _views(mv: memoryview, data: Any, starts: Any, lengths: Any, typ: pa.DataType) -> pa.Array:
    """Values ``mv[start:start+length]`` as a ``typ`` (binary) array. Built as a binary_view
    array over the mapped segment (16-byte views made with numpy, no per-value Python work),
    then cast to ``typ`` in C++, which copies the values into one contiguous buffer."""
    n = len(starts)
    base = int(starts.min()) if n else 0
    end = int((starts + lengths).max()) if n else 0
    views = np.zeros((n, 16), np.uint8)
    words = views.view(np.int32)
    k = np.arange(12)
    inline = data[np.minimum(starts[:, None] + k, len(data) - 1)]
    views[:, 4:] = np.where(k[None, :] < lengths[:, None], inline, 0)  # inline / 4-byte prefix
    words[:, 0] = lengths
    long_ = lengths > 12
    words[long_, 2] = 0  # buffer index
    words[long_, 3] = (starts - base)[long_]  # offset in the buffer
    array = pa.Array.from_buffers(
        pa.binary_view(), n, [None, pa.py_buffer(views), pa.py_buffer(mv[base:end])]
    )
    return array.cast(typ)


def _payloads(mv: memoryview, data: Any, starts: Any, lengths: Any, stride: int | None) -> pa.Array:
    """The payload column. When every frame of the batch has one size and one label run, the
    payloads lie at a fixed stride in the file: one strided copy makes the values buffer."""
    n = len(starts)
    if stride is not None and n:
        size = int(lengths[0])
        first = int(starts[0])
        rows = np.lib.stride_tricks.as_strided(
            data[first:], shape=(n, size), strides=(stride, 1), writeable=False
        )
        values = np.ascontiguousarray(rows).reshape(-1)
        offsets = (
            np.arange(0, (n + 1) * size, size, dtype=np.int32)
            if size
            else np.zeros(n + 1, np.int32)
        )
        return pa.Array.from_buffers(
            pa.binary(), n, [None, pa.py_buffer(offsets), pa.py_buffer(values)]
        )
    pieces = _contiguous(mv, starts, lengths)
    if pieces is not None:
        return pieces
    return _views(mv, data, starts, lengths, pa.binary())


def _contiguous(mv: memoryview, starts: Any, lengths: Any) -> pa.Array | None:
    """The payload column when the payloads lie back to back in a few pieces (run frames,
    FORMATS-seg3.md: each frame's payloads are contiguous): one join of a slice per piece and
    offsets from the lengths. None when there are many pieces (per-record frames)."""
    n = len(starts)
    if not n:
        return None
    ends = starts + lengths
    breaks = np.flatnonzero(starts[1:] != ends[:-1]) + 1
    if len(breaks) * _PIECE_RECORDS > n:
        return None
    bounds = [0, *breaks.tolist(), n]
    values = b"".join(mv[int(starts[a]) : int(ends[b - 1])] for a, b in pairwise(bounds))
    offsets = np.zeros(n + 1, np.int32)
    np.cumsum(lengths, out=offsets[1:])
    return pa.Array.from_buffers(
        pa.binary(), n, [None, pa.py_buffer(offsets), pa.py_buffer(values)]
    )


def _labels(values: list[str | None], counts: Any) -> pa.Array:
    """A tag or node column from the label runs' values and their row counts in the batch:
    one dictionary index per row (numpy), decoded to a string array in C++."""
    n = int(counts.sum())
    if len(values) == 1:
        return pa.repeat(pa.scalar(values[0], pa.string()), n)
    distinct = list(dict.fromkeys(v for v in values if v is not None))
    if not distinct:
        return pa.nulls(n, pa.string())
    code = {v: k for k, v in enumerate(distinct)}
    per_run = np.array([-1 if v is None else code[v] for v in values], np.int32)
    codes = np.repeat(per_run, counts)
    indices = pa.array(codes, pa.int32(), mask=codes < 0)
    labels = pa.DictionaryArray.from_arrays(indices, pa.array(distinct, pa.string()))
    return labels.dictionary_decode()


def read_chunk(
    topic: str, chunk: Any, i0: int, i1: int, batch_records: int, tombstone_rows: bool
) -> Iterator[pa.RecordBatch]:
    """Slots ``i0..i1`` (all live) of a SegChunk as ``log_schema`` batches, every record
    verified on this read as SEG-12 says (``SegChunk.verify_slots``: by block or by frame)."""
    chunk.verify_slots(i0, i1)
    mv = chunk.data
    data = np.frombuffer(mv, np.uint8)
    index = chunk.index
    all_offs = np.frombuffer(index.offsets, np.uint32)
    all_lens = np.frombuffer(index.lengths, np.uint32)
    all_tss = np.frombuffer(index.tss, np.uint64)
    schema = log_schema(tombstone_rows)
    i = i0
    while i <= i1:
        j = min(i1, i + batch_records - 1)
        lens = all_lens[i : j + 1].astype(np.int64)
        over = np.nonzero(np.cumsum(lens) > _MAX_BATCH_BYTES)[0]
        if len(over) and over[0] > 0:
            j = i + int(over[0]) - 1
            lens = lens[: j - i + 1]
        offs = all_offs[i : j + 1].astype(np.int64)
        tss = all_tss[i : j + 1].astype(np.int64)
        yield _batch(topic, chunk, mv, data, i, offs, lens, tss, schema)
        i = j + 1


def _batch(
    topic: str,
    chunk: Any,
    mv: memoryview,
    data: Any,
    i: int,
    offs: Any,
    lens: Any,
    tss: Any,
    schema: pa.Schema,
) -> pa.RecordBatch:
    """Slots ``i .. i + len(offs) - 1`` (verified) as one batch: payload positions from the
    entries and the runs' label lengths (SEG-12's "by block" reading of a record)."""
    n = len(offs)
    runs = chunk.runs
    r0 = runs.run_of(i)
    r1 = runs.run_of(i + n - 1)
    starts = [i, *runs.firsts[r0 + 1 : r1 + 1], i + n]
    counts = np.diff(np.array(starts, np.int64))
    if chunk.by_run:  # .data version 2: entries point at the payloads (FORMATS-seg3.md SEG-17)
        body, size = offs, lens
    else:
        label = np.repeat(np.array(runs.nls[r0 : r1 + 1], np.int64) + runs.tls[r0 : r1 + 1],
                          counts.astype(np.int64))  # fmt: skip
        body = offs + _HEADER + label
        size = lens - _OVERHEAD - label
    regular = r0 == r1 and n > 0 and bool((lens == lens[0]).all())
    if regular and n > 1:
        regular = bool((np.diff(offs) == lens[0]).all())  # back to back at one stride
    first_seq = chunk.first_seq + i
    columns = [
        pa.repeat(pa.scalar(topic, pa.string()), n),
        pa.array(np.arange(first_seq, first_seq + n, dtype=np.int64)),
        pa.array(tss * 1000, schema.field("ts").type),
        _labels(runs.tags[r0 : r1 + 1], counts),
        _labels(runs.nodes[r0 : r1 + 1], counts),
        _payloads(mv, data, body, size, int(lens[0]) if regular else None),
    ]
    if len(schema) == 7:
        columns.append(pa.nulls(n, pa.int64()))
    return pa.RecordBatch.from_arrays(columns, schema=schema)


# -- the unsealed tail --------------------------------------------------------------------------
def tail_span(log: Any, lo: int, hi: int) -> tuple[int, int] | None:
    """Tail slot indexes ``(i0, i1)`` (inclusive) serving seqs ``lo..hi`` of a view's log, or
    None when some of those seqs are not the tail's (a chunk still covers them): then the
    public read serves them. Seqs below the tail's first live slot are removed (dead slots or
    dropped chunks above ``evict_floor``: the caller starts at the floor), read silently."""
    for chunk in reversed(log.chunks):
        if chunk.first_seq <= hi:
            if chunk.first_seq + chunk.count - 1 >= lo:
                return None  # a chunk the sealed path did not take
            break
    base = log.base
    return max(lo - base, log._first, 0), min(hi, log.visible) - base


def read_tail(
    topic: str, tail: tuple[int, list[Any], list[Any], list[Any], list[Any]],
    batch_records: int, tombstone_rows: bool,
) -> Iterator[pa.RecordBatch]:  # fmt: skip
    """Tail slots (``(first_seq, payloads, tss, tags, nodes)``, copied from the log: None
    payloads are dead slots, skipped) as ``log_schema`` batches: one C-level conversion per
    column and batch, none per record in Python."""
    first, payloads, tss, tags, nodes = tail
    schema = log_schema(tombstone_rows)
    for a in range(0, len(payloads), batch_records):
        b = min(a + batch_records, len(payloads))
        body = pa.array(payloads[a:b], pa.binary())
        if isinstance(body, pa.ChunkedArray):  # past int32 offsets: halve the batch
            mid = a + (b - a) // 2
            part = (first, payloads[a:mid], tss[a:mid], tags[a:mid], nodes[a:mid])
            yield from read_tail(topic, part, batch_records, tombstone_rows)
            part = (first + mid - a, payloads[mid:b], tss[mid:b], tags[mid:b], nodes[mid:b])
            yield from read_tail(topic, part, batch_records, tombstone_rows)
            continue
        n = b - a
        columns = [
            pa.repeat(pa.scalar(topic, pa.string()), n),
            pa.array(np.arange(first + a, first + b, dtype=np.int64)),
            pa.array(np.array(tss[a:b], np.int64) * 1000, schema.field("ts").type),
            _tail_labels(tags[a:b]),
            _tail_labels(nodes[a:b]),
            body,
        ]
        if tombstone_rows:
            columns.append(pa.nulls(n, pa.int64()))
        batch = pa.RecordBatch.from_arrays(columns, schema=schema)
        if body.null_count:  # dead slots: removed records read silently (TMB-4)
            batch = batch.filter(body.is_valid())
        yield batch


def _tail_labels(values: list[str | None]) -> pa.Array:
    """A tag or node column; the common case, one value for the whole batch, without a
    conversion per row."""
    if values and values.count(values[0]) == len(values):
        return pa.repeat(pa.scalar(values[0], pa.string()), len(values))
    return pa.array(values, pa.string())
