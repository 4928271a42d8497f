"""Sealing: a run of one topic's records, held in memory as columns, encoded as a segment's
``.data`` and version-2 ``.idx`` (SEG-1..SEG-5, SEG-9..SEG-11) with C-level calls only: no
Python-level loop per record (label runs, when records carry labels, take one simple pass).

The bytes are exactly ``segment.SegmentBuilder``'s (the tests compare them). This encoder exists
because a checkpoint seals every record the WAL took: record by record in Python, sealing cost
about ten times what appending the record did, on the maintenance thread, under the same GIL as
the appenders. Here each record still gets its own header, checksum and index entry (the
format requires them), but through ``map`` over the columns.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from itertools import accumulate, repeat
from operator import add

import xxhash

from tidelog.errors import BadArgument, TooLarge

from . import segment as segfmt

__all__ = ["build_columns"]

# A record frame after its frame_len field: flags | seq | ts | node_len | tag_len | data_len.
_REST = struct.Struct("<BQQHHI")
_U32 = struct.Struct("<I")
_U64 = struct.Struct("<Q")
assert _U32.size + _REST.size == segfmt.RECORD_HEADER_SIZE
_FRAME_EXTRA = 4 + 8  # frame_len field + XXH3-64 trailer around the body built here


def build_columns(
    topic_id: int,
    first_seq: int,
    payloads: Sequence[bytes | None],
    tss: Sequence[int],
    tags: Sequence[str | None],
    nodes: Sequence[str | None],
    *,
    dead: bool = True,
) -> tuple[bytes, bytes]:
    """(.data, .idx) of records ``first_seq ..``: record ``i`` has ``payloads[i]``, ``tss[i]``,
    ``tags[i]`` and ``nodes[i]``. A None payload is a slot removed before sealing: it is written
    as an empty record without labels (the snapshot lists it as dead). ``dead=False`` promises
    there is no None, which saves a scan."""
    n = len(payloads)
    if first_seq < 1:
        raise BadArgument(f"first_seq must be >= 1, got {first_seq}")
    if dead and None in payloads:
        live = [p is not None for p in payloads]
        payloads = [b"" if p is None else p for p in payloads]
        tags = [t if k else None for t, k in zip(tags, live)]
        nodes = [x if k else None for x, k in zip(nodes, live)]
    data_payloads: Sequence[bytes] = payloads  # type: ignore[assignment]  # no None left
    seqs = range(first_seq, first_seq + n)
    lens = list(map(len, data_payloads))
    try:
        if tags.count(None) == n and nodes.count(None) == n:  # no labels: the common case
            flags: Sequence[int] | repeat[int] = repeat(0)
            rests = map(_REST.pack, repeat(0), seqs, tss, repeat(0), repeat(0), lens)
            bodies = list(map(add, rests, data_payloads))
            body_lens: list[int] = list(map(add, lens, repeat(_REST.size)))
        else:
            tbs = [b"" if t is None else t.encode("utf-8") for t in tags]
            nbs = [b"" if x is None else x.encode("utf-8") for x in nodes]
            flags = [
                (segfmt.HAS_TAG if t is not None else 0) | (segfmt.HAS_NODE if x is not None else 0)
                for t, x in zip(tags, nodes)
            ]
            rests = map(_REST.pack, flags, seqs, tss, map(len, nbs), map(len, tbs), lens)
            bodies = list(map(b"".join, zip(rests, nbs, tbs, data_payloads)))
            body_lens = list(map(len, bodies))
    except struct.error as exc:
        raise BadArgument(f"segment record field out of range ({exc})") from None
    sizes = list(map(add, body_lens, repeat(_FRAME_EXTRA)))  # whole frames
    offsets = list(accumulate(sizes, initial=segfmt.HEADER_SIZE))
    if offsets[-1] > segfmt.MAX_DATA_SIZE:
        raise TooLarge(f"segment would exceed {segfmt.MAX_DATA_SIZE} bytes (u32 idx offsets)")
    # frame_len | body | checksum, per record, interleaved by slice assignment (no tuples)
    parts: list[bytes] = [b""] * (3 * n + 1)
    parts[0] = segfmt._DATA_HEADER.pack(
        segfmt.DATA_MAGIC, segfmt.VERSION, segfmt.HEADER_SIZE, 0, topic_id, first_seq
    )
    parts[1::3] = map(_U32.pack, map(add, body_lens, repeat(_FRAME_EXTRA - 4)))
    parts[2::3] = bodies
    parts[3::3] = map(_U64.pack, map(xxhash.xxh3_64_intdigest, bodies))
    data = b"".join(parts)
    entries = b"".join(map(segfmt._ENTRY.pack, offsets, sizes, tss, flags))
    return data, segfmt.encode_index(topic_id, first_seq, data, entries, offsets, tags, nodes)
