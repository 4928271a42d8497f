"""Sealing without per-record Python work (format/seal.py, checkpoint.py): the column encoder
writes run frames (spec/FORMATS-seg3.md) holding exactly the records the record-by-record
SegmentBuilder frames one by one, dead slots included, and checkpoints cut tails into segments
within both limits."""

from __future__ import annotations

import struct
from array import array
from itertools import pairwise
from pathlib import Path

import pytest
import xxhash
from hypothesis import given, settings
from hypothesis import strategies as st

import tidelog
from tidelog.backends.file import FileBackend
from tidelog.backends.file.checkpoint import _split, _Tail
from tidelog.backends.file.format import segment as seg
from tidelog.backends.file.format.seal import build_columns, build_indexed, dead_slots
from tidelog.errors import BadArgument
from tidelog.hooks import hooks

labels = st.one_of(st.none(), st.text(max_size=8))
slots = st.tuples(
    st.one_of(st.none(), st.binary(max_size=200)),  # None: removed before sealing
    st.integers(0, 2**64 - 1),
    labels,
    labels,
)


def reference(
    tid: int, first: int, rows: list[tuple[bytes | None, int, str | None, str | None]]
) -> tuple[bytes, bytes]:
    builder = seg.SegmentBuilder(tid, first)
    for i, (payload, ts, tag, node) in enumerate(rows):
        if payload is None:
            builder.add(first + i, ts, None, None, b"")
        else:
            builder.add(first + i, ts, tag, node, payload)
    return builder.finish()


@given(
    tid=st.integers(0, 2**64 - 1),
    first=st.integers(1, 2**60),
    rows=st.lists(slots, max_size=30),
    unlabelled=st.booleans(),
)
def test_SEG_17_columns_encode_the_records_the_builder_would(
    tid: int,
    first: int,
    rows: list[tuple[bytes | None, int, str | None, str | None]],
    unlabelled: bool,
) -> None:
    """SEG-14..SEG-17: the run frames from columns (.data version 2, .idx version 3) hold
    exactly the records of the record-by-record SegmentBuilder's version-1 segment, for
    labelled and unlabelled runs, dead placeholders and empty runs; every entry points at its
    payload, the blocks are exactly the run frames, the label runs and strings are the same."""
    if unlabelled:
        rows = [(p, ts, None, None) for p, ts, _, _ in rows]
    data, idx = build_columns(
        tid,
        first,
        [r[0] for r in rows],
        [r[1] for r in rows],
        [r[2] for r in rows],
        [r[3] for r in rows],
        dead=any(r[0] is None for r in rows),
    )
    v1_data, v2_idx = reference(tid, first, rows)
    index = seg.read_index(idx, topic_id=tid, first_seq=first)
    assert index.version == seg.IDX_VERSION_RUNS
    assert index.count == len(rows) and index.data_size == len(data)
    scan, v1 = seg.scan_data(data), seg.scan_data(v1_data)
    assert scan.problem is None and scan.header.version == seg.DATA_VERSION_RUNS
    assert [(f.seq, f.ts, f.flags, f.tag, f.node) for f in scan.frames] == [
        (f.seq, f.ts, f.flags, f.tag, f.node) for f in v1.frames
    ]
    payloads = [data[f.offset : f.offset + f.length] for f in scan.frames]
    assert payloads == [b"" if r[0] is None else r[0] for r in rows]
    assert list(index.offsets) == [f.offset for f in scan.frames]
    assert list(index.lengths) == [f.length for f in scan.frames]
    assert list(zip(index.block_slots, index.block_offsets)) == scan.runs
    assert index.runs == seg.read_index(v2_idx).runs
    assert index.flags == seg.read_index(v2_idx).flags and index.tss == seg.read_index(v2_idx).tss


@settings(max_examples=40, deadline=None)
@given(
    sizes=st.lists(st.one_of(st.none(), st.integers(0, 70_000)), min_size=1, max_size=60),
    labelled=st.booleans(),
)
def test_SEG_17_pieces_handed_to_a_sink_with_given_lengths_are_the_same_segment(
    sizes: list[int | None], labelled: bool
) -> None:
    """SEG-14..SEG-17, checkpoint: a segment built with the lengths the checkpoint took for its
    cuts and handed to a sink piece by piece (run frames of up to 64 KiB, pieces of about
    1 MiB, as the checkpoint writes them) is byte for byte the segment built whole."""
    n = len(sizes)
    payloads = [None if z is None else bytes([i % 251]) * z for i, z in enumerate(sizes)]
    tss = [1_700_000_000_000 + i // 3 for i in range(n)]
    tags = [("a" if i % 4 < 2 else None) if labelled else None for i in range(n)]
    nodes = [None] * n
    dead = None in payloads
    whole, idx, _ = build_indexed(9, 5, payloads, tss, tags, nodes, dead=dead)
    pieces: list[bytes] = []
    lens = array(seg._U32_CODE, (z or 0 for z in sizes))
    rest, idx2, _ = build_indexed(
        9, 5, payloads, tss, tags, nodes, dead=dead, lens=lens, sink=pieces.extend
    )
    assert rest == [] and idx2 == idx
    assert b"".join(pieces) == b"".join(whole)


def test_SEG_8_column_encoder_refuses_what_the_format_cannot_hold() -> None:
    """SEG-8: a label longer than u16 and a first_seq of 0 are clear errors, as in the
    builder."""
    with pytest.raises(BadArgument):
        build_columns(1, 1, [b"x"], [0], ["t" * 70_000], [None])
    with pytest.raises(BadArgument):
        build_columns(1, 0, [b"x"], [0], [None], [None])


@given(
    sizes=st.lists(st.one_of(st.none(), st.integers(0, 300)), min_size=1, max_size=60),
    max_records=st.integers(1, 10),
    max_bytes=st.integers(1, 800),
)
def test_SEG_7_tails_are_cut_within_both_limits(
    sizes: list[int | None], max_records: int, max_bytes: int
) -> None:
    """SEG-7, checkpoint: segments cover the tail back to back; each holds at most
    segment_max_records records and segment_max_bytes of frames, or one record that is larger
    on its own; each is as long as the limits allow (the greedy cut)."""

    payloads = [None if s is None else b"x" * s for s in sizes]
    n = len(payloads)
    tail = _Tail(7, 100, payloads, [0] * n, [None] * n, [None] * n, dead=None in payloads)
    cuts = _split(tail, max_records, max_bytes)
    frame = [seg.RECORD_OVERHEAD + (s or 0) for s in sizes]
    pos = 0
    for first, count in cuts:
        assert first == 100 + pos and count >= 1
        size = sum(frame[pos : pos + count])
        assert count == 1 or (count <= max_records and size <= max_bytes)
        end = pos + count
        if end < n:  # greedy: one more record would break a limit
            assert count + 1 > max_records or size + frame[end] > max_bytes
        pos = end
    assert pos == n


def test_checkpoint_seals_labelled_dead_and_plain_records(tmp_path: Path) -> None:
    """SEG-2, WAL-13, DEL: a checkpoint seals a tail mixing labelled, unlabelled and deleted
    records; reads after reopening return exactly the live ones."""
    uri = f"file://{tmp_path / 's'}?background=false&segment_max_records=7"
    with tidelog.open(uri) as store:
        t = store.topic("t", durability="disk")
        t.append_many([b"p%d" % i for i in range(20)])
        t.append_records([(b"l1", "tag", None), (b"l2", None, "node"), (b"l3", "tag", "node")])
        t.append_many([b"q%d" % i for i in range(10)], tag="x")
        t.delete(tag="x", before_seq=27)
        t.delete(before_seq=4)
        want = [(r.seq, r.tag, r.node, r.payload) for r in t.read()]  # type: ignore[union-attr]
        b = hooks(store, FileBackend)
        b.checkpoint()
        assert [(r.seq, r.tag, r.node, r.payload) for r in t.read()] == want  # type: ignore[union-attr]
    with tidelog.open(uri) as store:
        got = [(r.seq, r.tag, r.node, r.payload) for r in store.topic("t").read()]  # type: ignore[union-attr]
        assert got == want


def _seg18_cuts(sizes: list[int], labels: list[str | None]) -> list[int]:
    """SEG-18 written out plainly: the first slot of every run frame."""
    firsts: list[int] = []
    room = 0
    for i, (size, label) in enumerate(zip(sizes, labels, strict=True)):
        if not firsts or label != labels[i - 1] or room >= 65536:
            firsts.append(i)
            room = 0
        room += 12 + size  # a record's ts (8), length (4) and payload in the frame
    return firsts


@given(
    st.lists(
        st.tuples(
            st.sampled_from((0, 10, 1000, 30_000, 70_000)), st.sampled_from((None, "a", "b"))
        ),
        min_size=1,
        max_size=40,
    )
)
def test_SEG_18_run_frames_end_at_label_runs_or_past_64_kib(
    rows: list[tuple[int, str | None]],
) -> None:
    """SEG-18: the writer ends a run frame at the end of a label run (SEG-11) or at the first
    record boundary where its ts, lengths and payloads reach 65536 bytes; a record of 64 KiB or
    more ends its frame. The index's blocks are exactly the frames (SEG-17)."""
    sizes = [s for s, _ in rows]
    tags = [t for _, t in rows]
    data, idx = build_columns(
        9, 1, [bytes(s) for s in sizes], [5] * len(rows), tags, [None] * len(rows), dead=False
    )
    index = seg.read_index(idx, topic_id=9, first_seq=1)
    assert list(index.block_slots) == _seg18_cuts(sizes, tags)
    assert seg.scan_data(data).problem is None


def _plain_data(first: int, payloads: list[bytes], tss: list[int]) -> bytes:
    """SEG-14..SEG-16 and SEG-18 written out record by record, for unlabelled records: the
    header, then run frames cut where SEG-18 cuts, each frame_len | flags | seq | count |
    node_len | tag_len | ts[] | len[] | payloads | XXH3-64 of all but frame_len."""
    out = [struct.pack("<8sHHIQQ", seg.DATA_MAGIC, 2, 32, 0, 9, first)]
    cuts = [*_seg18_cuts([len(p) for p in payloads], [None] * len(payloads)), len(payloads)]
    for a, b in pairwise(cuts):
        body = b"".join(
            [struct.pack("<Q", t) for t in tss[a:b]]
            + [struct.pack("<I", len(p)) for p in payloads[a:b]]
            + payloads[a:b]
        )
        head = struct.pack("<BQIHH", 0, first + a, b - a, 0, 0)
        frame = head + body
        frame += struct.pack("<Q", xxhash.xxh3_64_intdigest(frame))
        out.append(struct.pack("<I", len(frame)) + frame)
    return b"".join(out)


@settings(max_examples=60, deadline=None)
@given(
    groups=st.lists(
        st.tuples(st.sampled_from((0, 1, 100, 5000, 66_000)), st.integers(1, 1500)),
        min_size=1,
        max_size=5,
    ),
    ts_runs=st.lists(st.tuples(st.integers(0, 2**64 - 1), st.integers(1, 900)), min_size=1),
    shared=st.booleans(),
)
def test_SEG_15_frames_are_byte_exact_for_equal_lengths_and_ts_runs(
    groups: list[tuple[int, int]], ts_runs: list[tuple[int, int]], shared: bool
) -> None:
    """SEG-15, SEG-16, SEG-18: the column encoder's shortcuts (a frame of equal lengths cut
    by arithmetic and its offsets made in one step; a run of equal ts repeated, the ts in any
    order, one int object per run or one per record) write exactly the bytes the frame layout
    gives when written out record by record, and an index whose entries point at them."""
    payloads: list[bytes] = []
    for size, count in groups:
        payloads += [bytes([len(payloads) % 251]) * size] * min(count, 3 if size > 5000 else count)
    n = len(payloads)
    tss: list[int] = []
    for t, k in ts_runs:
        tss += [t] * k if shared else [int(str(t)) for _ in range(k)]
    tss = (tss * (n // len(tss) + 1))[:n]
    data, idx = build_columns(9, 3, payloads, tss, [None] * n, [None] * n, dead=False)
    assert data == _plain_data(3, payloads, tss)
    index = seg.read_index(idx, topic_id=9, first_seq=3)
    assert [data[o : o + k] for o, k in zip(index.offsets, index.lengths)] == payloads
    assert list(index.tss) == tss


@given(rows=st.lists(slots, max_size=40), big=st.integers(0, 3))
def test_SEG_17_the_writers_index_is_the_index_its_idx_decodes_to(
    rows: list[tuple[bytes | None, int, str | None, str | None]], big: int
) -> None:
    """SEG-17, checkpoint: the decoded index a checkpoint hands its new chunk, made from the
    columns the .idx was encoded from, is field for field (and type for type) what reading
    that .idx gives: entries, blocks, label runs, flags, sizes; labelled, dead, several frames."""
    rows = rows + [(bytes(70_000), 7, None, None)] * big  # frames of one record each
    cols = [[r[k] for r in rows] for k in range(4)]
    parts, idx, got = build_indexed(5, 11, *cols, dead=None in cols[0])
    want = seg.read_index(idx, topic_id=5, first_seq=11)
    for name in ("topic_id", "first_seq", "count", "version", "data_size", "runs"):
        assert getattr(got, name) == getattr(want, name), name
    for name in ("offsets", "lengths", "tss", "flags", "block_slots", "block_offsets",
                 "block_hashes"):  # fmt: skip
        a, b = getattr(got, name), getattr(want, name)
        assert (a.typecode, a.tolist()) == (b.typecode, b.tolist()), name
    assert [got.entry_offset(i) for i in range(got.count)] == list(want.offsets)
    assert got.data_size == sum(map(len, parts))


@given(st.lists(st.one_of(st.none(), st.binary(max_size=3)), max_size=50), st.booleans())
def test_SEG_17_dead_slots_are_the_none_payloads(
    payloads: list[bytes | None], as_tuple: bool
) -> None:
    """SEG-17, checkpoint: the slots sealed as dead placeholders are exactly the None payloads,
    ascending, from a list or any sequence."""
    got = dead_slots(tuple(payloads) if as_tuple else payloads)
    assert got == [i for i, p in enumerate(payloads) if p is None]
