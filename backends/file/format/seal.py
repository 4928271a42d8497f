"""Sealing: a run of one topic's records, held in memory as columns, encoded as a segment's
``.data`` version 2 (run frames, spec/FORMATS-seg3.md SEG-14..16, SEG-18) and ``.idx`` version 3
(SEG-17) with C-level calls only: array conversions, one ``join`` and one XXH3-64 per run frame
of ~64 KiB, strided copies for the index entries. Nothing runs in Python per record (label runs,
when records carry labels, take one simple pass: ``segment.label_runs``). Most C-level work per
record is avoided too where records look alike: a frame of equal lengths is cut by arithmetic
and its payload offsets made in one big-int step (``_steps``), a run of equal ts is converted
once and repeated (``_u64_column``), dead slots are visited alone (``dead_slots``), and the
checkpoint gets the decoded index from the columns (``build_indexed``), not by parsing the .idx.

A checkpoint seals every record the WAL took, on the maintenance thread, under the same GIL as
the appenders: per-record framing (``segment.SegmentBuilder``, .data version 1) cost ~0.7 µs
per 100-byte record even column-wise, six times what appending it costs; see FORMATS-seg3.md.
"""

from __future__ import annotations

import struct
from array import array
from bisect import bisect_right
from collections.abc import Callable, Sequence
from itertools import accumulate, pairwise
from typing import Any

import xxhash

from tidelog.errors import BadArgument, TooLarge

from . import segment as segfmt

__all__ = ["build_columns", "build_indexed", "dead_slots"]

_U64 = struct.Struct("<Q")
_PER_RECORD = 12  # a run frame's ts (u64) + length (u32) per record (SEG-15)
_PIECE_BYTES = 1 << 20  # build_indexed's sink: .data handed over about this much at a time
#: u64 items from Python ints: 'L' where it is 8 bytes converts without the generic
#: ``_PyLong_AsByteArray`` that 'Q' goes through (a third of the instructions)
_U64_FAST = "L" if array("L").itemsize == 8 else segfmt._U64_CODE
_RUN_MIN = 16  # a run of equal ts at least this long is repeated, not converted item by item
_STEPS: dict[tuple[int, int], tuple[int, int]] = {}  # (length, count) -> _steps' two ints


def _little(column: array[int]) -> array[int]:
    """``column`` with little-endian items (a copy on a big-endian host)."""
    if segfmt._BIG_ENDIAN:
        column = array(column.typecode, column)
        column.byteswap()
    return column


def dead_slots(payloads: Sequence[bytes | None], start: int = 0) -> list[int]:
    """The slots from ``start`` on whose payload is None (removed before sealing), ascending:
    found by ``list.index`` (a C-level scan), so the Python work is per dead slot, not per
    slot."""
    items = payloads if isinstance(payloads, list) else list(payloads)
    out: list[int] = []
    i = start - 1
    try:
        while True:
            i = items.index(None, i + 1)
            out.append(i)
    except ValueError:
        return out


def _u64_column(tss: Sequence[int]) -> array[int]:
    """``tss`` as an array of u64 items. Runs of equal ts (TOP-5: a ts never decreases, and
    records of one millisecond share it) are found by bisection and repeated, with one
    conversion per run; a run is taken as one only once ``count`` has checked every item of it,
    so an input that is not sorted still comes out exactly (item by item)."""
    n = len(tss)
    if not isinstance(tss, list) or n < 2 * _RUN_MIN:
        return array(_U64_FAST, tss)
    out = array(_U64_FAST)
    i = 0
    while i < n:
        t = tss[i]
        j = bisect_right(tss, t, i, n)
        # ``is``: a run shares its int object when the engine reused it (TOP-5's clamp, a
        # batch's ts); the count then compares by identity, else converting is as cheap
        if j - i >= _RUN_MIN and tss[j - 1] is t and tss[i:j].count(t) == j - i:
            out.frombytes(array(_U64_FAST, (t,)).tobytes() * (j - i))  # bytes: by doubling
        else:
            j = min(n, max(j, i + 8 * _RUN_MIN))
            out += array(_U64_FAST, tss[i:j])
        i = j
    return out


def _steps(length: int, count: int) -> tuple[int, int]:
    """Two ints whose lanes of 32 bits (little-endian) hold ``length * k`` and ``1`` for
    ``k < count``: ``(steps + start * ones).to_bytes(4 * count, "little")`` is the offsets of
    ``count`` payloads of ``length`` bytes from ``start``, one C-level pass per frame (no lane
    carries over: every offset is below 2**32, SEG-8). Frames of one topic mostly share their
    shape, so the few are kept."""
    got = _STEPS.get((length, count))
    if got is None:
        if len(_STEPS) >= 64:
            _STEPS.clear()
        code = segfmt._U32_CODE
        lanes = array(code, range(0, length * count, length) if length else [0] * count)
        if segfmt._BIG_ENDIAN:
            lanes.byteswap()
        ones = int.from_bytes(b"\x01\x00\x00\x00" * count, "little")
        got = _STEPS[(length, count)] = (int.from_bytes(lanes.tobytes(), "little"), ones)
    return got


def _uniform_end(lens: array[int], raw: bytes, i: int, b: int) -> tuple[int, int, int] | None:
    """SEG-18's frame from slot ``i`` (in a label run ending at ``b``) when all its payloads
    have one length ``L``: (end, payload bytes, L), found by arithmetic, and checked with one
    compare of the lengths' bytes ``raw``; None when they differ (``_frame_end`` seeks)."""
    length = lens[i]
    per = length + _PER_RECORD
    e = min(b, i + max(1, -(-segfmt.RUN_FRAME_BYTES // per)))  # ceil: the first to reach it
    if lens[e - 1] != length or raw[4 * i : 4 * e] != raw[4 * i : 4 * i + 4] * (e - i):
        return None
    return e, length * (e - i), length


def build_columns(
    topic_id: int, first_seq: int, *columns: Sequence[Any], dead: bool = True
) -> tuple[bytes, bytes]:
    """``build_indexed`` with the .data joined: (.data, .idx) bytes (tests, vectors)."""
    parts, idx, _ = build_indexed(topic_id, first_seq, *columns, dead=dead)
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


def build_indexed(
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
) -> tuple[list[bytes], bytes, segfmt.SegmentIndex]:
    """(.data pieces, .idx, the .idx decoded) of records ``first_seq ..``: record ``i`` has
    ``payloads[i]``, ``tss[i]``, ``tags[i]`` and ``nodes[i]``. A None payload is a slot removed
    before sealing: it is written as an empty record without labels (the snapshot lists it as
    dead). ``dead=False`` promises there is no None, which saves a scan. ``lens``: the payloads'
    lengths (0 for a None) as an unsigned 32-bit array, when the caller has them (a checkpoint
    takes them once per tail for its cuts). The .data is the list of its pieces, to be written
    as they are (``fsio.write_parts``): joining them would copy the segment once more. With
    ``sink``, the pieces are handed to it in order as they are built, about ``_PIECE_BYTES`` at
    a time, and none are returned: the writer writes each at once and the memory is reused
    for the next (fresh memory's page faults cost about a third of sealing on a VM). The
    decoded index is made from the columns the .idx was encoded from, as ``read_index`` would
    decode that .idx (its columns already cut: no strided copies when the segment is read)."""
    n = len(payloads)
    if first_seq < 1:
        raise BadArgument(f"first_seq must be >= 1, got {first_seq}")
    at = dead_slots(payloads) if dead else []
    if at:  # the dead slots alone are visited: most of a tail is live
        payloads, tags, nodes = list(payloads), list(tags), list(nodes)
        for i in at:
            payloads[i], tags[i], nodes[i] = b"", None, None
    data_payloads: Sequence[bytes] = payloads  # type: ignore[assignment]  # no None left
    try:
        if lens is None:
            lens = array(segfmt._U32_CODE, list(map(len, data_payloads)))  # a list: preallocated
        ts_col = _u64_column(tss)
    except OverflowError as exc:
        raise BadArgument(f"segment record field out of range ({exc})") from None
    runs = segfmt.label_runs(tags, nodes)
    if runs.nls and max(max(runs.nls), max(runs.tls)) > 0xFFFF:
        raise BadArgument("a tag or node longer than 65535 UTF-8 bytes cannot be sealed (SEG-8)")
    # the columns' bytes, sliced per frame without a copy (join reads any buffer)
    little_ts = memoryview(_little(ts_col)).cast("B")
    little_lens = memoryview(_little(lens)).cast("B")
    raw_lens = little_lens.tobytes()  # bytes: slices compare with memcmp (_uniform_end)
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
            got = _uniform_end(lens, raw_lens, i, b)
            if got is None:
                e, size = _frame_end(lens, i, b, i + guess)
                length = -1
            else:
                e, size, length = got
            count = guess = e - i
            header = segfmt.RUN_HEADER_SIZE + nl + tl + _PER_RECORD * count
            frame_len = header + size + 8 - 4
            if pos + frame_len + 4 > segfmt.MAX_DATA_SIZE:  # u32 .idx offsets
                raise TooLarge(f"segment would exceed {segfmt.MAX_DATA_SIZE} bytes")
            # the frame's pieces in the one list its payloads are sliced into (a tuple with
            # ``*payloads`` would copy their references twice more)
            part: list[Any] = data_payloads[i:e]  # type: ignore[assignment]  # checked:
            if type(part) is not list:
                part = list(part)
            part[:0] = (pack_head(frame_len, flags, first_seq + i, count, nl, tl), label,
                        little_ts[8 * i:8 * e], little_lens[4 * i:4 * e])  # fmt: skip
            body = b"".join(part)
            check = _U64.pack(digest(memoryview(body)[4:]))
            block = xxhash.xxh3_64(body)
            block.update(check)
            sums.append(block.intdigest())
            parts += (body, check)
            if length >= 0 and not segfmt._BIG_ENDIAN:  # equal lengths: offsets by steps
                steps, ones = _steps(length, count)
                offsets.frombytes((steps + (pos + header) * ones).to_bytes(4 * count, "little"))
            else:
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
    per_slot = bytes(n)  # each slot's flags: its label run's
    if any(runs.flags):
        bounds = [*runs.firsts, n]
        per_slot = b"".join(
            bytes((f,)) * (y - x) for f, x, y in zip(runs.flags, bounds, bounds[1:])
        )
    if segfmt._BIG_ENDIAN:  # the strided copies below assume little-endian words
        entries: bytes | bytearray = b"".join(
            map(segfmt._ENTRY.pack, offsets, lens, ts_col, per_slot)
        )
    else:
        # entry: offset | length | ts lo | ts hi | flags+pad, as u32 words. An array's strided
        # slice assignment copies an item once; a memoryview's copies it twice (via a buffer)
        code = segfmt._U32_CODE
        words = array(code, bytes(segfmt.ENTRY_SIZE * n))
        words[0::5] = offsets
        words[1::5] = lens if lens.typecode == code else array(code, lens)
        halves = array(code, ts_col.tobytes())
        words[2::5] = halves[0::2]
        words[3::5] = halves[1::2]
        if any(runs.flags):
            words[4::5] = array(code, iter(per_slot))  # ints, not raw bytes
        entries = words.tobytes()
    idx = segfmt.encode_index(topic_id, first_seq, None, entries, (), tags, nodes, runs=runs,
                              frames=frames, sums=(pos, sums))  # fmt: skip
    tss_q = ts_col
    if ts_col.typecode != segfmt._U64_CODE:
        tss_q = array(segfmt._U64_CODE, ts_col.tobytes())  # the same items, the index's type
    index = segfmt.SegmentIndex(
        topic_id,
        first_seq,
        n,
        b"",
        version=segfmt.IDX_VERSION_RUNS,
        data_size=pos,
        block_slots=array(segfmt._U32_CODE, [f for f, _ in frames]),
        block_offsets=array(segfmt._U32_CODE, [o for _, o in frames]),
        block_hashes=array(segfmt._U64_CODE, sums),
        runs=runs,
        flags=array("B", per_slot),
        columns=(offsets, lens, tss_q),
    )
    return parts, idx, index
