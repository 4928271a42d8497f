"""Columnar reads of sealed segments for Spark's executors (SPK-3's fast path).

``Topic.read`` builds one ``Record`` per seq in Python (about 7 µs each, mostly frame decoding);
a Spark scan then converts those back into columns. Here the live records of a sealed segment
become Arrow columns directly: the frame headers of a whole run are decoded with numpy, every
frame's XXH3-64 is still verified (SEG-2), and payloads, tags and nodes are gathered straight
out of the segment's mmap. Anything else (the unsealed tail, tombstones, ts filters, a backend
without ``SegChunk``s) goes through the public read path, which stays the reference: a test
compares the two on the same stores.

This module reads the file backend's in-memory structures (``TopicLog.chunks``, ``SegChunk``'s
index and dead map) of a read-only view that only this process refreshes; it checks their shape
and falls back rather than guess when they change.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import numpy as np  # the spark extra brings it (pyspark's Arrow paths need it too)
import pyarrow as pa
import xxhash

from tidelog.errors import Corrupt

from .columns import log_schema

__all__ = ["available", "chunk_ranges", "read_chunk", "is_qseg_chunk"]

_HDR = np.dtype(
    [
        ("frame_len", "<u4"),
        ("flags", "u1"),
        ("seq", "<u8"),
        ("ts", "<u8"),
        ("nl", "<u2"),
        ("tl", "<u2"),
        ("dl", "<u4"),
    ]
)  # the record frame header of FORMATS SEG-2, packed: 29 bytes

_HEADER = 29
_OVERHEAD = _HEADER + 8
_DATA_HEADER = 32  # .data file header (SEG-1)
_HAS_TAG, _HAS_NODE = 0x01, 0x02
_MAX_BATCH_BYTES = 256 << 20  # Arrow binary offsets are int32: stay far below 2 GiB per batch


def available() -> bool:
    """An Arrow with binary_view arrays (pyarrow >= 16)."""
    return hasattr(pa, "binary_view")


def _is_segchunk(chunk: Any) -> bool:
    index = getattr(chunk, "index", None)
    return (
        isinstance(getattr(chunk, "data", None), memoryview)
        and isinstance(getattr(chunk, "dead", None), bytearray)
        and index is not None
        and hasattr(index, "offsets")
        and hasattr(index, "lengths")
    )


def is_qseg_chunk(chunk: Any) -> bool:
    """A sealed Quiver segment of a bundle topic (``QsegChunk``): bundles straight from the
    mapped file, zero-copy (spec/BUNDLES.md QSEG-11)."""
    return callable(getattr(chunk, "bundle", None)) and isinstance(
        getattr(chunk, "dead", None), bytearray
    )


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


def _column(
    mv: memoryview, data: Any, starts: Any, lengths: Any, present: Any | None, typ: pa.DataType
) -> pa.Array:
    """Values ``mv[start:start+length]`` as a ``typ`` (binary or string) array, nulls where
    ``present`` is False. Built as a binary_view array over the mapped segment (16-byte views
    made with numpy, no per-value Python work), then cast to ``typ`` in C++: the cast copies
    the values into one contiguous buffer and, for strings, validates UTF-8."""
    n = len(starts)
    if present is not None:
        lengths = np.where(present, lengths, 0)
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
    validity = None
    nulls = 0
    if present is not None and not present.all():
        validity = pa.array(present, pa.bool_()).buffers()[1]
        nulls = int(n - present.sum())
    array = pa.Array.from_buffers(
        pa.binary_view(),
        n,
        [validity, pa.py_buffer(views), pa.py_buffer(mv[base:end])],
        null_count=nulls,
    )
    return array.cast(typ)


def read_chunk(
    topic: str, chunk: Any, i0: int, i1: int, batch_records: int, tombstone_rows: bool
) -> Iterator[pa.RecordBatch]:
    """Slots ``i0..i1`` (all live) of a SegChunk as ``log_schema`` batches, every frame
    checked as ``segment.read_record`` checks it (SEG-2, SEG-3)."""
    mv = chunk.data
    data = np.frombuffer(mv, np.uint8)
    all_offs = np.frombuffer(chunk.index.offsets, np.uint32)
    all_lens = np.frombuffer(chunk.index.lengths, np.uint32)
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
        yield _batch(topic, chunk, mv, data, offs, lens, chunk.first_seq + i, schema)
        i = j + 1


def _batch(
    topic: str,
    chunk: Any,
    mv: memoryview,
    data: Any,
    offs: Any,
    lens: Any,
    first_seq: int,
    schema: pa.Schema,
) -> pa.RecordBatch:
    n = len(offs)
    path = getattr(chunk, "path", "segment")
    ends = offs + lens
    if n and (offs.min() < _DATA_HEADER or lens.min() < _OVERHEAD or ends.max() > len(mv)):
        raise Corrupt(f"{path}: a record's index entry points outside the file (SEG-2)")
    hdr = np.frombuffer(data[offs[:, None] + np.arange(_HEADER)].tobytes(), _HDR)
    frame_len = hdr["frame_len"].astype(np.int64)
    nl, tl, dl = (hdr[k].astype(np.int64) for k in ("nl", "tl", "dl"))
    bad = (frame_len + 4 != lens) | (_OVERHEAD - 4 + nl + tl + dl != frame_len)
    seqs = np.arange(first_seq, first_seq + n, dtype=np.int64)
    bad |= hdr["seq"].astype(np.int64) != seqs
    if bad.any():
        k = int(np.nonzero(bad)[0][0])
        raise Corrupt(f"{path}: segment record at offset {int(offs[k])}: bad header (SEG-2/3)")
    stored = np.frombuffer(data[(ends - 8)[:, None] + np.arange(8)].tobytes(), "<u8")
    h = xxhash.xxh3_64_intdigest
    digests = np.array(
        [h(mv[a:b]) for a, b in zip((offs + 4).tolist(), (ends - 8).tolist())], np.uint64
    )
    if (digests != stored).any():
        k = int(np.nonzero(digests != stored)[0][0])
        raise Corrupt(f"{path}: segment record at offset {int(offs[k])}: XXH3-64 mismatch (SEG-2)")
    flags = hdr["flags"]
    body = offs + _HEADER
    try:
        node = _column(mv, data, body, nl, (flags & _HAS_NODE) != 0, pa.string())
        tag = _column(mv, data, body + nl, tl, (flags & _HAS_TAG) != 0, pa.string())
    except pa.ArrowInvalid as exc:
        raise Corrupt(f"{path}: a tag or node is not UTF-8 ({exc}) (SEG-2)") from None
    columns = [
        pa.repeat(pa.scalar(topic, pa.string()), n),
        pa.array(seqs),
        pa.array(hdr["ts"].astype(np.int64) * 1000, schema.field("ts").type),
        tag,
        node,
        _column(mv, data, body + nl + tl, dl, None, pa.binary()),
    ]
    if len(schema) == 7:
        columns.append(pa.nulls(n, pa.int64()))
    return pa.RecordBatch.from_arrays(columns, schema=schema)
