"""Sealing: a run of one topic's records, held in memory as columns, encoded as a segment's
``.data`` version 2 (run frames, spec/FORMATS-seg3.md SEG-14..16, SEG-18) and ``.idx`` version 3
(SEG-17) with C-level calls only: array conversions, one ``join`` and one XXH3-64 per run frame
of ~64 KiB, strided copies for the index entries. Nothing runs in Python per record (label runs,
when records carry labels, take one simple pass: ``segment.label_runs``).

A checkpoint seals every record the WAL took, on the maintenance thread, under the same GIL as
the appenders: per-record framing (``segment.SegmentBuilder``, .data version 1) cost ~0.7 µs
per 100-byte record even column-wise, six times what appending it costs; see FORMATS-seg3.md.
"""

from __future__ import annotations

import struct
from array import array
from collections.abc import Callable, Sequence
from itertools import accumulate, pairwise
from typing import Any

import xxhash

from tidelog.errors import BadArgument, TooLarge

from . import segment as segfmt

__all__ = ["build_columns", "build_parts"]

_U64 = struct.Struct("<Q")
_PER_RECORD = 12  # a run frame's ts (u64) + length (u32) per record (SEG-15)
_PIECE_BYTES = 1 << 20  # build_parts' sink: .data handed over about this much at a time


def _little(column: array[int]) -> array[int]:
    """``column`` with little-endian items (a copy on a big-endian host)."""
    if segfmt._BIG_ENDIAN:
        column = array(column.typecode, column)
        column.byteswap()
    return column


def build_columns(
    topic_id: int, first_seq: int, *columns: Sequence[Any], dead: bool = True
) -> tuple[bytes, bytes]:
    """``build_parts`` with the .data joined: (.data, .idx) bytes (tests, vectors)."""
    parts, idx = build_parts(topic_id, first_seq, *columns, dead=dead)
    return b"".join(parts), idx


def _frame_end(lens: array[int], i: int, b: int, guess: int) -> tuple[int, int]:
    """(e, payload bytes of slots i..e-1): the run frame from slot ``i`` of a label run ending
    at ``b`` ends before the first slot ``e`` in (i, b) at which its slots' ts, lengths and
    payloads reach ``RUN_FRAME_BYTES`` (SEG-18), else at ``b``. Sought from ``guess`` (> i)
    by steps of one slot: frames of similar records take no step, and no running total of
    the lengths is made (a Python int per record)."""
    limit, step = segfmt.RUN_FRAME_BYTES, _PER_RECORD
    e = min(b, guess)
    w = sum(lens[i:e]) + step * (e - i)  # the frame's measure if it ended before e
    if w >= limit:
        while e - 1 > i:
            less = w - lens[e - 1] - step
            if less < limit:
                break
            w, e = less, e - 1
    else:
        while e < b and w < limit:
            w += lens[e] + step
            e += 1
    return e, w - step * (e - i)


def build_parts(
    topic_id: int,
    first_seq: int,
    payloads: Sequence[bytes | None],
    tss: Sequence[int],
    tags: Sequence[str | None],
    nodes: Sequence[str | None],
    *,
    dead: bool = True,
    lens: array[int] | None = None,
    sink: Callable[[list[bytes]], None] | None = None,
) -> tuple[list[bytes], bytes]:
    """(.data pieces, .idx) of records ``first_seq ..``: record ``i`` has ``payloads[i]``,
    ``tss[i]``, ``tags[i]`` and ``nodes[i]``. A None payload is a slot removed before sealing:
    it is written as an empty record without labels (the snapshot lists it as dead).
    ``dead=False`` promises there is no None, which saves a scan. ``lens``: the payloads'
    lengths (0 for a None) as an unsigned 32-bit array, when the caller has them (a checkpoint
    takes them once per tail for its cuts). The .data is the list of its pieces, to be written
    as they are (``fsio.write_parts``): joining them would copy the segment once more. With
    ``sink``, the pieces are handed to it in order as they are built, about ``_PIECE_BYTES`` at
    a time, and none are returned: the writer writes each at once and the memory is reused
    for the next (fresh memory's page faults cost about a third of sealing on a VM)."""
    n = len(payloads)
    if first_seq < 1:
        raise BadArgument(f"first_seq must be >= 1, got {first_seq}")
    if dead and None in payloads:
        live = [p is not None for p in payloads]
        payloads = [b"" if p is None else p for p in payloads]
        tags = [t if k else None for t, k in zip(tags, live)]
        nodes = [x if k else None for x, k in zip(nodes, live)]
    data_payloads: Sequence[bytes] = payloads  # type: ignore[assignment]  # no None left
    try:
        if lens is None:
            lens = array(segfmt._U32_CODE, map(len, data_payloads))
        ts_col = array(segfmt._U64_CODE, tss)
    except OverflowError as exc:
        raise BadArgument(f"segment record field out of range ({exc})") from None
    runs = segfmt.label_runs(tags, nodes)
    if runs.nls and max(max(runs.nls), max(runs.tls)) > 0xFFFF:
        raise BadArgument("a tag or node longer than 65535 UTF-8 bytes cannot be sealed (SEG-8)")
    # the columns' bytes, sliced per frame without a copy (join reads any buffer)
    little_ts = memoryview(_little(ts_col)).cast("B")
    little_lens = memoryview(_little(lens)).cast("B")
    head = segfmt._DATA_HEADER.pack(
        segfmt.DATA_MAGIC, segfmt.DATA_VERSION_RUNS, segfmt.HEADER_SIZE, 0, topic_id, first_seq
    )
    parts: list[bytes] = [head]
    frames: list[tuple[int, int]] = []  # (first slot, .data offset) of each run frame
    sums: list[int] = []  # each frame's XXH3-64 as a whole: its .idx block (SEG-10)
    # offsets[i]: payload i's .data offset: its frame's first payload's, plus the lengths
    # before it in that frame
    offsets = array(segfmt._U32_CODE)
    pos = segfmt.HEADER_SIZE
    handed = 0  # .data bytes already handed to ``sink``
    guess = 1  # where the next frame's end is sought first: the last frame's record count
    pack_head, digest = segfmt._RUN_HEAD.pack, xxhash.xxh3_64_intdigest
    for r, (a, b) in enumerate(pairwise([*runs.firsts, n])):
        label, nl, tl, flags = runs.labels[r], runs.nls[r], runs.tls[r], runs.flags[r]
        i = a
        while i < b:
            e, size = _frame_end(lens, i, b, i + guess)
            count = guess = e - i
            header = segfmt.RUN_HEADER_SIZE + nl + tl + _PER_RECORD * count
            frame_len = header + size + 8 - 4
            if pos + frame_len + 4 > segfmt.MAX_DATA_SIZE:  # u32 .idx offsets
                raise TooLarge(f"segment would exceed {segfmt.MAX_DATA_SIZE} bytes")
            body = b"".join(
                (pack_head(frame_len, flags, first_seq + i, count, nl, tl), label,
                 little_ts[8 * i:8 * e], little_lens[4 * i:4 * e], *data_payloads[i:e])
            )  # fmt: skip
            check = _U64.pack(digest(memoryview(body)[4:]))
            block = xxhash.xxh3_64(body)
            block.update(check)
            sums.append(block.intdigest())
            parts += (body, check)
            offsets.extend(accumulate(lens[i : e - 1], initial=pos + header))
            frames.append((i, pos))
            pos += frame_len + 4
            i = e
            if sink is not None and pos - handed >= _PIECE_BYTES:
                sink(parts)
                parts, handed = [], pos
    if sink is not None and parts:
        sink(parts)
        parts = []
    if segfmt._BIG_ENDIAN:  # the strided copies below assume little-endian words
        entry_flags = [runs.flags[runs.run_of(i)] for i in range(n)]
        entries: bytes | bytearray = b"".join(
            map(segfmt._ENTRY.pack, offsets, lens, ts_col, entry_flags)
        )
    else:
        raw = bytearray(segfmt.ENTRY_SIZE * n)
        words = memoryview(raw).cast("I")  # entry: offset | length | ts lo | ts hi | flags+pad
        words[0::5] = offsets
        words[1::5] = lens
        halves = memoryview(ts_col).cast("B").cast("I")
        words[2::5] = halves[0::2]
        words[3::5] = halves[1::2]
        if any(runs.flags):
            bounds = [*runs.firsts, n]
            per_slot = b"".join(
                bytes((f,)) * (y - x) for f, x, y in zip(runs.flags, bounds, bounds[1:])
            )
            words[4::5] = array("I", iter(per_slot))  # ints, not raw bytes
        entries = raw
    idx = segfmt.encode_index(topic_id, first_seq, None, entries, (), tags, nodes, runs=runs,
                              frames=frames, sums=(pos, sums))  # fmt: skip
    return parts, idx
