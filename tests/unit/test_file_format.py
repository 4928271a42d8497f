"""Byte formats of the file backend (spec/FORMATS.md): WAL, segments, progress files, snapshots.

Golden tests pin exact bytes (worked out field by field in the comments), so an accidental format
change fails here. Every decoder is fed short, garbage, bad-magic, bad-version, bad-checksum and
overflowing-length inputs; the WAL scanner is fuzzed with Hypothesis.
"""

from __future__ import annotations

import json
import re
import struct
import zlib
from array import array
from itertools import pairwise
from pathlib import Path

import crc32c
import pytest
import xxhash
from hypothesis import given, settings
from hypothesis import strategies as st

from tidelog.backends.common.progress import SubState
from tidelog.backends.file.format import (
    FormatCorrupt,
    dumps_body,
    loads_body,
    parse_shard_dir_name,
    parse_topic_dir_name,
    shard_dir_name,
    topic_dir_name,
    wal,
)
from tidelog.backends.file.format import progress as prg
from tidelog.backends.file.format import segment as seg
from tidelog.backends.file.format import snapshot as snap
from tidelog.backends.file.progressfiles import read_progress, write_progress
from tidelog.errors import BadArgument, Corrupt, TooLarge
from tidelog.fsio import OsFS

REPO = Path(__file__).resolve().parents[2]
STORE_ID = bytes(range(16))
TS = 1_700_000_000_000  # 0x018bcfe56800

texts = st.one_of(st.none(), st.text(max_size=20))
payloads = st.binary(max_size=300)


def flip(buf: bytes, at: int, bit: int = 0) -> bytes:
    out = bytearray(buf)
    out[at] ^= 1 << bit
    return bytes(out)


def corrupt_rule(exc: pytest.ExceptionInfo[Corrupt]) -> str:
    assert isinstance(exc.value, FormatCorrupt)
    return exc.value.rule


# --- shared: layout names, JSON bodies ------------------------------------------------------------


def test_layout_names_round_trip() -> None:
    """LAY-2: fixed-width names of the layout parse back; anything else is not a layout name."""
    assert topic_dir_name(10) == "000000000000000a"
    assert parse_topic_dir_name("000000000000000a") == 10
    assert parse_topic_dir_name("000000000000000A") is None  # lowercase only
    assert parse_topic_dir_name("0a") is None
    assert shard_dir_name(3) == "shard-03"
    assert parse_shard_dir_name("shard-03") == 3
    assert parse_shard_dir_name("shard-3") is None
    assert wal.file_name(255) == "wal-00000000000000ff.log"
    assert wal.parse_file_name("wal-00000000000000ff.log") == 255
    assert wal.parse_file_name("wal-ff.log") is None
    assert seg.data_name(1) == "seg-00000000000000000001.data"
    assert seg.idx_name(2**64 - 1) == "seg-18446744073709551615.idx"
    assert seg.parse_name("seg-00000000000000000001.data") == (1, "data")
    assert seg.parse_name("seg-00000000000000000001.idx") == (1, "idx")
    assert seg.parse_name("seg-1.data") is None
    assert snap.file_name(7) == "snapshot-0000000000000007.bin"
    assert snap.parse_file_name("snapshot-0000000000000007.bin") == 7
    assert snap.parse_file_name("snapshot.0007.bin") is None


def test_json_bodies_are_compact_and_canonical() -> None:
    """WAL-9, SNAP-3: compact, key-sorted, non-ASCII kept as UTF-8."""
    assert dumps_body({"b": 1, "a": [1, 2], "é": "ü"}) == '{"a":[1,2],"b":1,"é":"ü"}'.encode()
    assert loads_body(b'{"a":1}', "x", "WAL-9") == {"a": 1}
    for bad in (b"[1]", b"{", b"\xff", b"null"):
        with pytest.raises(FormatCorrupt) as exc:
            loads_body(bad, "x", "WAL-9")
        assert exc.value.rule == "WAL-9"


# --- WAL: file header -----------------------------------------------------------------------------

GOLDEN_WAL_HEADER = (
    "54444c57414c3031"  # magic "TDLWAL01"
    "02000000"  # version 2 (may hold APPEND_BATCH frames, WAL-14)
    "40000000"  # header_size 64
    "0100000000000000"  # gen 1
    "00000000"  # shard 0
    "01000000"  # shard_count 1
    "0068e5cf8b010000"  # created_ms 1_700_000_000_000 = 0x018bcfe56800
    "000102030405060708090a0b0c0d0e0f"  # store_id
    "00000000"  # reserved
    "3cc764a9"  # crc32c of bytes [0, 60)
)
# The same header as written before WAL-14 (version 1): still read.
GOLDEN_WAL_HEADER_V1 = GOLDEN_WAL_HEADER[:16] + "01000000" + GOLDEN_WAL_HEADER[24:-8] + "33ac3b40"
# Version 3 (WAL-15: frames seeded with the gen, FILE_END): what the writer writes now.
GOLDEN_WAL_HEADER_V3 = GOLDEN_WAL_HEADER[:16] + "03000000" + GOLDEN_WAL_HEADER[24:-8] + "96330a0d"


def test_wal_header_golden_bytes() -> None:
    """WAL-1: the 64-byte header, field by field; the CRC32C covers bytes [0, 60)."""
    got = wal.encode_header(1, 0, 1, TS, STORE_ID)
    assert got.hex() == GOLDEN_WAL_HEADER_V3
    assert wal.encode_header(1, 0, 1, TS, STORE_ID, version=2).hex() == GOLDEN_WAL_HEADER
    assert len(got) == wal.HEADER_SIZE == 64
    assert struct.unpack_from("<I", got, 60)[0] == crc32c.crc32c(got[:60])


def test_wal_header_version_1_still_reads() -> None:
    """WAL-1, WAL-14, WAL-15: files written before APPEND_BATCH (version 1) and before recycling
    (version 2) decode; the writer writes 3. Only version 3 seeds frame checksums."""
    old = bytes.fromhex(GOLDEN_WAL_HEADER_V1)
    assert struct.unpack_from("<I", old, 60)[0] == crc32c.crc32c(old[:60])
    assert wal.decode_header(old) == wal.WalHeader(1, 0, 1, TS, STORE_ID, 1, 64)
    v2 = wal.decode_header(bytes.fromhex(GOLDEN_WAL_HEADER))
    v3 = wal.decode_header(bytes.fromhex(GOLDEN_WAL_HEADER_V3))
    assert (v2.version, v3.version, wal.VERSION) == (2, 3, 3)
    assert (wal.frame_seed(v2), wal.frame_seed(v3)) == (0, 1)


@given(
    gen=st.integers(0, 2**64 - 1),
    count=st.integers(1, 2**32 - 1),
    data=st.data(),
    created=st.integers(0, 2**64 - 1),
    sid=st.binary(min_size=16, max_size=16),
)
def test_wal_header_round_trip(
    gen: int, count: int, data: st.DataObject, created: int, sid: bytes
) -> None:
    """WAL-1: every header field survives encode/decode."""
    shard = data.draw(st.integers(0, count - 1))
    got = wal.decode_header(wal.encode_header(gen, shard, count, created, sid))
    assert got == wal.WalHeader(gen, shard, count, created, sid, wal.VERSION, 64)


@pytest.mark.parametrize(
    "damage",
    [
        pytest.param(lambda b: b[:63], id="short"),
        pytest.param(lambda b: b"", id="empty"),
        pytest.param(lambda b: b"XDLWAL01" + b[8:], id="bad-magic"),
        pytest.param(lambda b: b[:8] + struct.pack("<I", 4) + b[12:], id="bad-version"),
        pytest.param(lambda b: b[:8] + struct.pack("<I", 0) + b[12:], id="version-0"),
        pytest.param(lambda b: b[:12] + struct.pack("<I", 128) + b[16:], id="bad-header-size"),
        pytest.param(lambda b: flip(b, 40), id="bad-crc"),
        pytest.param(lambda b: flip(b, 61), id="crc-itself"),
    ],
)
def test_wal_header_rejects_damage(damage: object) -> None:
    """WAL-1: short, bad magic, bad version, bad header_size and CRC mismatch are Corrupt."""
    good = wal.encode_header(1, 0, 1, TS, STORE_ID)
    with pytest.raises(Corrupt) as exc:
        wal.decode_header(damage(good))  # type: ignore[operator]
    assert corrupt_rule(exc) == "WAL-1"
    assert "WAL header" in str(exc.value)


def test_wal_header_shard_out_of_range() -> None:
    """WAL-1, WAL-2: shard < shard_count, on both sides."""
    with pytest.raises(BadArgument):
        wal.encode_header(1, 2, 2, 0, STORE_ID)
    with pytest.raises(BadArgument):
        wal.encode_header(1, 0, 1, 0, b"short")
    head = bytearray(wal.encode_header(1, 0, 1, 0, STORE_ID))
    struct.pack_into("<I", head, 24, 5)
    struct.pack_into("<I", head, 60, crc32c.crc32c(bytes(head[:60])))
    with pytest.raises(Corrupt, match="shard 5 out of range"):
        wal.decode_header(bytes(head))


# --- WAL: frames ----------------------------------------------------------------------------------

GOLDEN_APPEND = (
    "2d000000"  # frame_len 45 = 42 + node 0 + tag 1 + data 2
    "01"  # type APPEND
    "0d"  # flags HAS_TAG | DURABLE | BATCH_END
    "0100000000000000"  # topic_id 1
    "0100000000000000"  # seq 1
    "7b68e5cf8b010000"  # ts 1_700_000_000_123
    "0000"  # node_len 0
    "0100"  # tag_len 1
    "02000000"  # data_len 2
    "74"  # tag "t"
    "6869"  # payload "hi"
    "b295146db6fb4b8d"  # xxh3-64 of bytes [4, 41)
)
GOLDEN_EVICT = (
    "3a000000"  # frame_len 58 = 42 + 16-byte body
    "07"  # type EVICT
    "08"  # flags BATCH_END
    "0100000000000000"  # topic_id 1
    "0500000000000000"  # seq 5 = highest seq evicted
    "0700000000000000"  # ts 7
    "0000"
    "0000"
    "10000000"  # node_len 0, tag_len 0, data_len 16
    "7b22726561736f6e223a22636170227d"  # {"reason":"cap"}
    "371dcdeb488a322d"  # xxh3-64
)


def test_wal_append_frame_golden_bytes() -> None:
    """WAL-3, WAL-6: the frame layout byte for byte; checksum over [4, end-8)."""
    got = wal.encode_append(1, 1, TS + 123, "t", None, b"hi", batch_end=True, durable=True)
    assert got.hex() == GOLDEN_APPEND
    assert len(got) == wal.FRAME_OVERHEAD + 3
    assert struct.unpack_from("<Q", got, len(got) - 8)[0] == xxhash.xxh3_64_intdigest(got[4:-8])


def test_wal_control_frame_golden_bytes() -> None:
    """WAL-8, WAL-9: an EVICT frame: seq carries the highest seq evicted, body is compact JSON."""
    got = wal.encode_control(wal.FrameType.EVICT, 1, {"reason": "cap"}, seq=5, ts=7)
    assert got.hex() == GOLDEN_EVICT


def reference_frame(
    ftype: int, flags: int, tid: int, seq: int, ts: int, node: bytes, tag: bytes, data: bytes
) -> bytes:
    """An independent, obviously-correct encoder (WAL-3) to check the fast one against."""
    body = (
        struct.pack("<BBQQQHHI", ftype, flags, tid, seq, ts, len(node), len(tag), len(data))
        + node
        + tag
        + data
    )
    return (
        struct.pack("<I", len(body) + 8) + body + struct.pack("<Q", xxhash.xxh3_64_intdigest(body))
    )


def reference_flags(tag: str | None, node: str | None, batch_end: bool, durable: bool) -> int:
    """WAL-6 flags of a record frame, bit by bit."""
    return (
        (wal.HAS_TAG if tag is not None else 0)
        | (wal.HAS_NODE if node is not None else 0)
        | (wal.DURABLE if durable else 0)
        | (wal.BATCH_END if batch_end else 0)
    )


@given(
    tid=st.integers(0, 2**64 - 1),
    seq=st.integers(1, 2**64 - 1),
    ts=st.integers(0, 2**64 - 1),
    tag=texts,
    node=texts,
    payload=payloads,
    batch_end=st.booleans(),
    durable=st.booleans(),
)
def test_wal_append_round_trip(
    tid: int,
    seq: int,
    ts: int,
    tag: str | None,
    node: str | None,
    payload: bytes,
    batch_end: bool,
    durable: bool,
) -> None:
    """WAL-3, WAL-6: utf-8 tags/nodes, None vs "", empty payloads; equal to the reference."""
    frame = wal.encode_append(
        tid, seq, ts, tag, node, payload, batch_end=batch_end, durable=durable
    )
    flags = reference_flags(tag, node, batch_end, durable)
    nb = (node or "").encode()
    tb = (tag or "").encode()
    assert frame == reference_frame(1, flags, tid, seq, ts, nb, tb, payload)
    result = wal.scan(frame, 0)
    assert result.status == "clean" and result.end == len(frame)
    (got,) = result.frames
    assert (got.type, got.topic_id, got.seq, got.ts) == (1, tid, seq, ts)
    assert (got.tag, got.node, got.data) == (tag, node, payload)
    assert (got.batch_end, got.durable, got.offset, got.length) == (
        batch_end,
        durable,
        0,
        len(frame),
    )


@pytest.mark.parametrize("size", [0, 4095, 4096, 1 << 20])
def test_wal_append_large_and_empty_payloads(size: int) -> None:
    """WAL-3: the streaming-hash path for large payloads gives the same bytes as the reference;
    bytearray and memoryview payloads too."""
    payload = bytes(range(256)) * (size // 256) + b"x" * (size % 256)
    want = reference_frame(1, wal.HAS_NODE, 9, 3, 4, "nöde".encode(), b"", payload)
    for form in (payload, bytearray(payload), memoryview(payload)):
        got = wal.encode_append(9, 3, 4, None, "nöde", form, batch_end=False, durable=False)
        assert got == want
    assert wal.scan(want, 0).frames[0].data == payload


def test_wal_append_field_overflow_is_bad_argument() -> None:
    """WAL-3, SEG-8: a tag longer than u16 cannot be framed: a clear error, nothing written."""
    with pytest.raises(BadArgument, match="out of range"):
        wal.encode_append(1, 1, 0, "x" * 70000, None, b"", batch_end=True, durable=False)
    with pytest.raises(BadArgument):
        wal.encode_append(-1, 1, 0, None, None, b"", batch_end=True, durable=False)


CONTROL_BODIES: list[tuple[wal.FrameType, dict[str, object], int]] = [
    (
        wal.FrameType.TOPIC_CREATE,
        {"name": "évents", "incarnation": 3, "config": {"cap_records": None}},
        0,
    ),
    (wal.FrameType.TOPIC_DROP, {}, 0),
    (wal.FrameType.REMOVE, {"fate": "deleted", "ranges": [[1, 3], [7, 7]]}, 0),
    (wal.FrameType.EVICT, {"reason": "ttl"}, 99),
    (wal.FrameType.CHECKPOINT, {"snapshot": 4}, 0),
    (
        wal.FrameType.QUEUE,
        {"op": "delivered", "seq": 5, "lease_id": 2, "count": 1, "fresh": True},
        0,
    ),
    (wal.FrameType.QUEUE, {"op": "returned", "seq": 5}, 0),
    (wal.FrameType.QUEUE, {"op": "delayed", "seq": 5, "ready_at": 1234}, 0),
    (wal.FrameType.HEAD_RESERVE, {}, 1000),
    (wal.FrameType.SUB_REGISTER, {"name": "exporter", "base": 0}, 0),
    (wal.FrameType.SUB_UNREGISTER, {"name": "exporter"}, 0),
    (wal.FrameType.LOSS, {"lo": 10}, 12),
]


@pytest.mark.parametrize(("ftype", "body", "seq"), CONTROL_BODIES)
def test_wal_control_round_trip(ftype: wal.FrameType, body: dict[str, object], seq: int) -> None:
    """WAL-8, WAL-9: every control type carries its JSON body and seq; no tag/node flags."""
    frame = wal.encode_control(ftype, 7, body, seq=seq, ts=5, durable=True)
    (got,) = wal.scan(frame, 0).frames
    assert (got.type, got.topic_id, got.seq, got.ts, got.body) == (ftype, 7, seq, 5, body)
    assert got.flags == wal.DURABLE | wal.BATCH_END
    assert got.data == dumps_body(body)
    chained = wal.encode_control(ftype, 7, body, batch_end=False)
    assert not wal.scan(chained, 0).frames[0].batch_end


def test_wal_control_rejects_append_type_and_body_of_append() -> None:
    """WAL-8: APPEND is not a control type; an APPEND frame has a payload, not a body."""
    with pytest.raises(BadArgument):
        wal.encode_control(wal.FrameType.APPEND, 1, {})
    with pytest.raises(BadArgument):
        wal.encode_control(wal.FrameType.APPEND_BATCH, 1, {})
    with pytest.raises(BadArgument):
        wal.encode_control(300, 1, {})
    frame = wal.encode_append(1, 1, 0, None, None, b"{}", batch_end=True, durable=False)
    with pytest.raises(TypeError):
        wal.scan(frame, 0).frames[0].body  # noqa: B018


# --- WAL: APPEND_BATCH (WAL-14) -------------------------------------------------------------------

GOLDEN_APPEND_BATCH = (
    "3f000000"  # frame_len 63 = 42 + node 0 + tag 0 + data 21
    "10"  # type APPEND_BATCH
    "0c"  # flags DURABLE | BATCH_END
    "0100000000000000"  # topic_id 1
    "0500000000000000"  # seq 5: the first record's (records 5, 6, 7)
    "7b68e5cf8b010000"  # ts 1_700_000_000_123, every record's
    "0000"  # node_len 0
    "0000"  # tag_len 0
    "15000000"  # data_len 21 = 4 + 3 * 4 + 5
    "03000000"  # count 3
    "02000000"  # len 2
    "00000000"  # len 0
    "03000000"  # len 3
    "6869"  # "hi"
    "616263"  # "abc"
    "329f447ba5e56901"  # xxh3-64 of bytes [4, 59)
)


def reference_batch_data(payloads: list[bytes]) -> bytes:
    """WAL-14's data, written out the obvious way."""
    lengths = b"".join(struct.pack("<I", len(p)) for p in payloads)
    return struct.pack("<I", len(payloads)) + lengths + b"".join(payloads)


def test_wal_append_batch_golden_bytes() -> None:
    """WAL-14: count, u32 lengths, payloads back to back, one checksum over the frame."""
    got = wal.encode_append_batch(
        1, 5, TS + 123, None, None, [b"hi", b"", b"abc"], batch_end=True, durable=True
    )
    assert got.hex() == GOLDEN_APPEND_BATCH
    data = reference_batch_data([b"hi", b"", b"abc"])
    assert got == reference_frame(16, wal.DURABLE | wal.BATCH_END, 1, 5, TS + 123, b"", b"", data)


@given(
    tid=st.integers(0, 2**64 - 1),
    seq=st.integers(1, 2**63),
    ts=st.integers(0, 2**64 - 1),
    tag=texts,
    node=texts,
    records=st.lists(payloads, min_size=1, max_size=20),
    batch_end=st.booleans(),
    durable=st.booleans(),
)
def test_wal_append_batch_round_trip(
    tid: int,
    seq: int,
    ts: int,
    tag: str | None,
    node: str | None,
    records: list[bytes],
    batch_end: bool,
    durable: bool,
) -> None:
    """WAL-14, WAL-6: one frame per run, equal to the reference encoding; scanning and splitting
    give back every payload with the run's seq, ts and labels."""
    frame = wal.encode_append_batch(
        tid, seq, ts, tag, node, records, batch_end=batch_end, durable=durable
    )
    given_sizes = wal.encode_append_batch(
        tid, seq, ts, tag, node, records, batch_end=batch_end, durable=durable,
        sizes=[len(r) for r in records],
    )  # fmt: skip
    assert given_sizes == frame  # the caller's lengths: the same frame
    given_total = wal.encode_append_batch(
        tid, seq, ts, tag, node, records, batch_end=batch_end, durable=durable,
        sizes=[len(r) for r in records], total=sum(map(len, records)),
    )  # fmt: skip
    assert given_total == frame  # and their sum too
    flags = reference_flags(tag, node, batch_end, durable)
    nb, tb = (node or "").encode(), (tag or "").encode()
    data = reference_batch_data(records)
    assert frame == reference_frame(16, flags, tid, seq, ts, nb, tb, data)
    result = wal.scan(frame, 0)
    assert result.status == "clean" and result.end == len(frame)
    (got,) = result.frames
    assert (got.type, got.topic_id, got.seq, got.ts, got.tag, got.node) == (
        wal.FrameType.APPEND_BATCH,
        tid,
        seq,
        ts,
        tag,
        node,
    )
    assert (got.batch_end, got.durable) == (batch_end, durable)
    assert wal.split_append_batch(got.data, "x") == records


@given(size=st.integers(0, 40), n=st.integers(1, 50), extra=st.integers(-3, 3), odd=st.booleans())
def test_wal_append_batch_lengths_must_add_up(size: int, n: int, extra: int, odd: bool) -> None:
    """WAL-14: the length table must add up to the data after it, whether the lengths are all
    equal (checked by one byte compare) or not (summed); both ways give the same answer."""
    lengths = [size] * n
    if odd:
        lengths[-1] += 1
    body = b"x" * max(0, sum(lengths) + extra)
    data = struct.pack(f"<I{n}I", n, *lengths) + body
    for view in (data, memoryview(data)):
        if extra == 0 or len(body) == sum(lengths):
            count, got = wal.append_batch_lengths(view, "x")
            assert (count, list(got)) == (n, lengths)
        else:
            with pytest.raises(Corrupt, match="add up") as exc:
                wal.append_batch_lengths(view, "x")
            assert corrupt_rule(exc) == "WAL-14"


@given(
    records=st.lists(st.binary(max_size=40), min_size=1, max_size=30), limit=st.integers(48, 200)
)
def test_wal_append_batch_splits_runs_over_the_limit(records: list[bytes], limit: int) -> None:
    """WAL-14: a run whose data would exceed a u32 frame is several APPEND_BATCH frames with
    consecutive seqs, every data within the limit, BATCH_END only on the last (WAL-7)."""
    image = wal.encode_append_batch(
        3, 10, 7, "t", None, records, batch_end=True, durable=False, limit=limit
    )
    sizes = [len(r) for r in records]
    assert image == wal.encode_append_batch(
        3, 10, 7, "t", None, records, batch_end=True, durable=False, limit=limit,
        sizes=sizes, total=sum(sizes),
    )  # fmt: skip
    frames = wal.scan(image, 0).frames
    got = [p for f in frames for p in wal.split_append_batch(f.data, "x")]
    assert got == records
    seq = 10
    for f in frames:
        assert f.seq == seq and len(f.data) <= limit and f.tag == "t"
        seq += len(wal.split_append_batch(f.data, "x"))
    assert [f.batch_end for f in frames] == [False] * (len(frames) - 1) + [True]
    assert len(frames) == 1 or 4 + 4 * len(records) + sum(map(len, records)) > limit


def test_wal_append_batch_refuses_what_no_frame_can_hold() -> None:
    """WAL-14: an empty run, or one record larger than a frame, is a clear error."""
    with pytest.raises(BadArgument):
        wal.encode_append_batch(1, 1, 0, None, None, [], batch_end=True, durable=False)
    with pytest.raises(BadArgument, match="does not fit"):
        wal.encode_append_batch(
            1, 1, 0, None, None, [b"x" * 100, b"y"], batch_end=True, durable=False, limit=60
        )
    with pytest.raises(BadArgument, match="does not fit"):  # the caller's sum: the same check
        wal.encode_append_batch(
            1, 1, 0, None, None, [b"x" * 100, b"y"], batch_end=True, durable=False, limit=60,
            sizes=[100, 1], total=101,
        )  # fmt: skip


@pytest.mark.parametrize(
    "data",
    [
        pytest.param(b"", id="empty"),
        pytest.param(struct.pack("<I", 0) + b"xxxx", id="count-0"),
        pytest.param(struct.pack("<II", 5, 1) + b"x", id="count-overruns"),
        pytest.param(struct.pack("<III", 2, 1, 1) + b"x", id="lengths-short"),
        pytest.param(struct.pack("<III", 2, 1, 1) + b"xyz", id="lengths-long"),
    ],
)
def test_wal_append_batch_bad_lengths_are_corrupt(data: bytes) -> None:
    """WAL-14: a checksum-valid APPEND_BATCH whose count or lengths disagree with data_len is a
    writer bug: Corrupt naming WAL-14, never a silently shortened run."""
    frame = reference_frame(16, wal.BATCH_END, 1, 1, 0, b"", b"", data)
    (got,) = wal.scan(frame, 0).frames
    with pytest.raises(FormatCorrupt) as exc:
        wal.split_append_batch(got.data, "frame")
    assert exc.value.rule == "WAL-14"


def test_wal_append_batch_torn_anywhere_is_never_returned() -> None:
    """WAL-5, WAL-14: cutting a batch frame at any byte or flipping any bit of it leaves no
    frame: the whole run is gone, never part of it (TOP-6)."""
    frame = wal.encode_append_batch(
        1, 1, TS, None, None, [bytes([i]) * 37 for i in range(9)], batch_end=True, durable=True
    )
    image = wal_image([frame], pad=0)
    for cut in range(wal.HEADER_SIZE, len(image)):
        assert wal.scan(image[:cut] + bytes(len(image) - cut)).frames == []
    for at in range(wal.HEADER_SIZE, len(image), 7):
        assert wal.scan(flip(image, at)).frames == []


def test_wal_control_body_not_json_is_corrupt() -> None:
    """WAL-9: a checksum-valid control frame whose body is not a JSON object: Corrupt on .body."""
    frame = reference_frame(wal.FrameType.EVICT, wal.BATCH_END, 1, 2, 0, b"", b"", b"not json")
    (got,) = wal.scan(frame, 0).frames
    with pytest.raises(FormatCorrupt) as exc:
        got.body  # noqa: B018
    assert exc.value.rule == "WAL-9"


def wal_image(frames: list[bytes], pad: int = 256) -> bytes:
    return wal.encode_header(1, 0, 1, TS, STORE_ID) + b"".join(frames) + bytes(pad)


SAMPLE_FRAMES = [
    wal.encode_control(
        wal.FrameType.TOPIC_CREATE, 1, {"name": "a", "incarnation": 1, "config": {}}
    ),
    wal.encode_append(1, 1, TS, "t", None, b"one", batch_end=False, durable=True),
    wal.encode_append(1, 2, TS, None, "n", b"", batch_end=False, durable=True),
    wal.encode_append(1, 3, TS, "ü", "ñ", b"three", batch_end=True, durable=True),
    wal.encode_control(wal.FrameType.EVICT, 1, {"reason": "cap"}, seq=1),
]


def test_scan_clean_end_at_zero_frame_len() -> None:
    """WAL-4: the preallocated zeros end the log cleanly; end is just after the last frame."""
    image = wal_image(SAMPLE_FRAMES)
    result = wal.scan(image)
    assert result.status == "clean" and result.detail == "zero frame_len"
    assert [f.offset for f in result.frames] == [
        64 + sum(len(f) for f in SAMPLE_FRAMES[:i]) for i in range(len(SAMPLE_FRAMES))
    ]
    assert result.end == 64 + sum(map(len, SAMPLE_FRAMES))
    assert wal.first_nonzero(image, result.end) is None
    assert result.unknown == []


@pytest.mark.parametrize("pad", [0, 1, 2, 3])
def test_scan_clean_end_at_end_of_buffer(pad: int) -> None:
    """WAL-4: exactly the end of the file, or fewer than 4 zero bytes, is a clean end."""
    result = wal.scan(wal_image(SAMPLE_FRAMES, pad))
    assert result.status == "clean" and len(result.frames) == len(SAMPLE_FRAMES)


def test_scan_partial_frame_len_is_torn() -> None:
    """WAL-5: 1-3 non-zero bytes where a frame_len should be is a torn write."""
    image = wal_image(SAMPLE_FRAMES, 0) + b"\x01\x00"
    result = wal.scan(image)
    assert result.status == "torn" and len(result.frames) == len(SAMPLE_FRAMES)
    assert result.end == len(image) - 2


def test_first_nonzero_finds_stale_bytes_after_the_end() -> None:
    """WAL-4: leftovers after a clean end are found (verify warns, recovery zeroes them)."""
    image = bytearray(wal_image(SAMPLE_FRAMES, 3 << 20))
    end = wal.scan(image).end
    assert wal.first_nonzero(image, end) is None
    image[end + (2 << 20) + 5] = 1
    assert wal.first_nonzero(image, end) == end + (2 << 20) + 5
    assert wal.first_nonzero(image, len(image)) is None


def torn_case(name: str) -> tuple[bytes, int]:
    """A WAL image whose third frame is damaged in the way ``name`` says, and its offset."""
    good = SAMPLE_FRAMES[:2]
    at = 64 + sum(map(len, good))
    third = bytearray(SAMPLE_FRAMES[2])
    if name == "checksum":
        third[-1] ^= 0x80
    elif name == "payload-bit":
        third[wal.FRAME_HEADER_SIZE] ^= 0x01  # first node byte
    elif name == "frame_len-small":
        struct.pack_into("<I", third, 0, 41)
    elif name == "frame_len-overrun":
        struct.pack_into("<I", third, 0, 10_000_000)
    elif name == "lengths-inconsistent":
        struct.pack_into("<H", third, 30, 5)  # node_len 5: 42 + 5 + ... != frame_len
    elif name == "truncated":
        return wal.encode_header(1, 0, 1, TS, STORE_ID) + b"".join(good) + bytes(third[:-3]), at
    return wal_image([*good, bytes(third), *SAMPLE_FRAMES[3:]]), at


@pytest.mark.parametrize(
    "name",
    [
        "checksum",
        "payload-bit",
        "frame_len-small",
        "frame_len-overrun",
        "lengths-inconsistent",
        "truncated",
    ],
)
def test_scan_stops_at_torn_frame(name: str) -> None:
    """WAL-5: overrun, short frame_len, inconsistent lengths or a bad checksum end the log at
    that frame: the frames before it are returned, nothing at or after it."""
    image, at = torn_case(name)
    result = wal.scan(image)
    assert result.status == "torn", result
    assert result.end == at
    assert [f.offset for f in result.frames] == [64, 64 + len(SAMPLE_FRAMES[0])]
    assert result.detail


def test_scan_rejects_invalid_utf8_and_flag_mismatch() -> None:
    """WAL-6: checksum-valid frames with non-UTF-8 tag/node, or tag/node bytes without their
    flag, are not trusted (torn)."""
    cases = [
        reference_frame(1, wal.HAS_TAG, 1, 1, 0, b"", b"\xff", b"x"),
        reference_frame(1, wal.HAS_NODE, 1, 1, 0, b"\xc3", b"", b"x"),
        reference_frame(1, 0, 1, 1, 0, b"", b"tag", b"x"),
        reference_frame(1, 0, 1, 1, 0, b"node", b"", b"x"),
    ]
    for frame in cases:
        result = wal.scan(wal_image([SAMPLE_FRAMES[1], frame]))
        assert result.status == "torn" and len(result.frames) == 1, result.detail
    ok = wal.scan(reference_frame(1, wal.HAS_TAG, 1, 1, 0, b"", b"", b"x"), 0).frames[0]
    assert ok.tag == "" and ok.node is None  # "" differs from None


def test_scan_skips_and_reports_unknown_types() -> None:
    """WAL-8: a checksum-valid frame of an unknown type is skipped by length and reported."""
    unknown = reference_frame(200, wal.BATCH_END, 1, 0, 0, b"", b"", b"future")
    image = wal_image([SAMPLE_FRAMES[0], unknown, SAMPLE_FRAMES[4]])
    result = wal.scan(image)
    assert result.status == "clean"
    assert [f.type for f in result.frames] == [2, 200, 7]
    assert result.unknown == [64 + len(SAMPLE_FRAMES[0])]


def test_scan_start_past_end_and_iterator_form() -> None:
    """WAL-4, WAL-5: the iterator form yields the same frames lazily; a start past the end is
    torn."""
    image = wal_image(SAMPLE_FRAMES)
    scanner = wal.WalScanner(image)
    it = iter(scanner)
    first = next(it)
    assert first.offset == 64 and scanner.status == ""
    rest = list(it)
    assert [first, *rest] == wal.scan(image).frames
    assert scanner.status == "clean" and scanner.end == wal.scan(image).end
    assert wal.scan(b"abc", 10).status == "torn"
    assert wal.scan(memoryview(image)).frames == wal.scan(image).frames
    assert wal.scan(bytearray(image)).frames == wal.scan(image).frames


def test_split_batches_keeps_torn_tail_apart() -> None:
    """WAL-7: batches end at BATCH_END; trailing frames without one are a torn op."""
    frames = wal.scan(wal_image(SAMPLE_FRAMES)).frames
    batches, tail = wal.split_batches(frames)
    assert [[f.offset for f in b] for b in batches] == [
        [frames[0].offset],
        [frames[1].offset, frames[2].offset, frames[3].offset],
        [frames[4].offset],
    ]
    assert tail == []
    batches, tail = wal.split_batches(frames[:3])
    assert len(batches) == 1 and tail == frames[1:3]


# Hypothesis: the scanner never raises, never invents a frame, and stops at damage.


def valid_frame_at(buf: bytes, frame: wal.Frame) -> bool:
    raw = buf[frame.offset : frame.offset + frame.length]
    return struct.unpack_from("<Q", raw, len(raw) - 8)[0] == xxhash.xxh3_64_intdigest(raw[4:-8])


@settings(max_examples=300)
@given(garbage=st.binary(max_size=600), start=st.integers(0, 700))
def test_scan_never_raises_on_garbage(garbage: bytes, start: int) -> None:
    """WAL-5: any bytes, any start: no exception, and every frame returned is checksum-valid."""
    result = wal.scan(garbage, start)
    assert result.status in ("clean", "torn")
    for frame in result.frames:
        assert valid_frame_at(garbage, frame)


frame_specs = st.lists(
    st.tuples(st.integers(1, 2**20), texts, texts, st.binary(max_size=80), st.booleans()),
    min_size=1,
    max_size=6,
)


def build_image(
    specs: list[tuple[int, str | None, str | None, bytes, bool]],
) -> tuple[bytes, list[int]]:
    frames = [
        wal.encode_append(5, seq, TS, tag, node, data, batch_end=end, durable=True)
        for seq, tag, node, data, end in specs
    ]
    offsets = [64 + sum(map(len, frames[:i])) for i in range(len(frames) + 1)]
    return wal_image(frames, pad=64), offsets


@settings(max_examples=200)
@given(specs=frame_specs, data=st.data())
def test_scan_truncation_returns_exactly_the_complete_frames(
    specs: list[tuple[int, str | None, str | None, bytes, bool]], data: st.DataObject
) -> None:
    """WAL-4, WAL-5: cut anywhere: exactly the frames wholly before the cut come back."""
    image, offsets = build_image(specs)
    cut = data.draw(st.integers(64, len(image)))
    result = wal.scan(image[:cut])
    complete = [o for o, nxt in pairwise(offsets) if nxt <= cut]
    assert [f.offset for f in result.frames] == complete
    full = wal.scan(image).frames
    assert result.frames == full[: len(complete)]


@settings(max_examples=300)
@given(specs=frame_specs, data=st.data())
def test_scan_bit_flip_excludes_that_frame_and_everything_after(
    specs: list[tuple[int, str | None, str | None, bytes, bool]], data: st.DataObject
) -> None:
    """WAL-3, WAL-5: a flipped bit inside frame k: frames before k are returned unchanged; k and
    everything after it are not."""
    image, offsets = build_image(specs)
    at = data.draw(st.integers(64, offsets[-1] - 1))
    bit = data.draw(st.integers(0, 7))
    k = max(i for i, o in enumerate(offsets[:-1]) if o <= at)
    result = wal.scan(flip(image, at, bit))
    assert result.frames == wal.scan(image).frames[:k]
    assert result.end == offsets[k]


def frame_by_frame(buf: bytes, start: int = wal.HEADER_SIZE) -> wal.ScanResult:
    """What scan must return, from the plain one-frame-at-a-time scanner."""
    scanner = wal.WalScanner(buf, start)
    frames = list(scanner)
    return wal.ScanResult(frames, scanner.end, scanner.status, scanner.detail, scanner.unknown)


@settings(max_examples=300)
@given(specs=frame_specs, data=st.data())
def test_scan_inlined_run_agrees_with_frame_by_frame_scanning(
    specs: list[tuple[int, str | None, str | None, bytes, bool]], data: st.DataObject
) -> None:
    """WAL-4, WAL-5, WAL-8: scan's inlined loop for unlabelled frames (replay's hot path) gives
    exactly what the frame-by-frame scanner gives, on intact, cut, flipped and garbage-tailed
    images mixing labelled, unlabelled, batch and unknown-type frames."""
    image, offsets = build_image(specs)
    extra = [
        wal.encode_append_batch(5, 9, TS, None, None, [b"a", b"b"], batch_end=True, durable=False),
        reference_frame(99, wal.BATCH_END, 5, 0, 0, b"", b"", b"future"),
    ]
    image = image[: offsets[-1]] + b"".join(extra) + bytes(64)
    variant = data.draw(st.sampled_from(["intact", "cut", "flip", "garbage"]))
    if variant == "cut":
        image = image[: data.draw(st.integers(64, len(image)))]
    elif variant == "flip":
        at, bit = data.draw(st.integers(64, len(image) - 1)), data.draw(st.integers(0, 7))
        image = flip(image, at, bit)
    elif variant == "garbage":
        image = image[: len(image) - 64] + data.draw(st.binary(min_size=1, max_size=64))
    assert wal.scan(image) == frame_by_frame(image)


# --- segments -------------------------------------------------------------------------------------

GOLDEN_DATA = (
    "54444c5345474431"  # magic "TDLSEGD1"
    "0100"
    "2000"
    "00000000"  # version 1, header_size 32, reserved
    "0100000000000000"  # topic_id 1
    "0100000000000000"  # first_seq 1
    # record seq 1 at offset 32: frame_len 35 = 33 + tag 1 + data 1
    "23000000"
    "01"  # frame_len, flags HAS_TAG
    "0100000000000000"
    "e803000000000000"  # seq 1, ts 1000
    "0000"
    "0100"
    "01000000"  # node_len 0, tag_len 1, data_len 1
    "74"
    "61"  # tag "t", payload "a"
    "fd67c468bd8d8ebe"  # xxh3-64
    # record seq 2 at offset 71: frame_len 34 = 33 + node 1, empty payload
    "22000000"
    "02"  # frame_len, flags HAS_NODE
    "0200000000000000"
    "e903000000000000"  # seq 2, ts 1001
    "0100"
    "0000"
    "00000000"  # node_len 1, tag_len 0, data_len 0
    "6e"  # node "n"
    "dab62ea1d2ee7ef3"  # xxh3-64
)
GOLDEN_IDX = (
    "54444c5345474931"  # magic "TDLSEGI1"
    "0100"
    "2000"
    "02000000"  # version 1, header_size 32, count 2
    "0100000000000000"
    "0100000000000000"  # topic_id 1, first_seq 1
    "20000000"
    "27000000"
    "e803000000000000"
    "01"
    "000000"  # offset 32, length 39, ts, flags, pad
    "47000000"
    "26000000"
    "e903000000000000"
    "02"
    "000000"  # offset 71, length 38, ts, flags, pad
    "0fcb397dbb6616b8"  # xxh3-64 footer over bytes [0, 72)
)
# The same two records' index in version 2 (spec/FORMATS-seg2.md worked example).
GOLDEN_IDX_V2 = (
    "54444c5345474931"  # magic "TDLSEGI1"
    "0200"
    "3800"
    "02000000"  # version 2, header_size 56, count 2
    "0100000000000000"
    "0100000000000000"  # topic_id 1, first_seq 1
    "6d00000000000000"  # data_size 109
    "01000000"
    "02000000"
    "02000000"
    "02000000"  # 1 block, 2 runs, 2 strings, 2 bytes of string text
    "20000000"
    "27000000"
    "e803000000000000"
    "01"
    "000000"  # entry 0: offset 32, length 39, ts 1000, HAS_TAG, pad
    "47000000"
    "26000000"
    "e903000000000000"
    "02"
    "000000"  # entry 1: offset 71, length 38, ts 1001, HAS_NODE, pad
    "00000000"
    "20000000"
    "7a1dab822cabd69d"  # block 0: first slot 0, offset 32, XXH3-64 of .data [32, 109)
    "00000000"
    "00000000"
    "ffffffff"  # run 0: slot 0.., tag string 0, no node
    "01000000"
    "ffffffff"
    "01000000"  # run 1: slot 1.., no tag, node string 1
    "01000000"
    "02000000"  # string ends
    "746e"  # "t", "n"
    "cac08ceb8cec5e0d"  # xxh3-64 footer over bytes [0, 146)
)
SEG_RECORDS: list[tuple[int, int, str | None, str | None, bytes]] = [
    (1, 1000, "t", None, b"a"),
    (2, 1001, None, "n", b""),
]


def refooter(idx: bytes) -> bytes:
    """``idx`` with its footer recomputed (damage that the footer alone would not catch)."""
    return idx[:-8] + struct.pack("<Q", xxhash.xxh3_64_intdigest(idx[:-8]))


def test_segment_golden_bytes() -> None:
    """SEG-1, SEG-2, SEG-9, SEG-10, SEG-11: the .data/.idx pair of two records, byte for byte;
    the block and footer checksums are the XXH3-64 of exactly the bytes the rules name."""
    data, idx = seg.build_segment(1, 1, SEG_RECORDS)
    assert data.hex() == GOLDEN_DATA
    assert idx.hex() == GOLDEN_IDX_V2
    assert len(idx) == seg.IDX_HEADER_SIZE + 2 * seg.ENTRY_SIZE + 16 + 2 * 12 + 2 * 4 + 2 + 8
    block_at = seg.IDX_HEADER_SIZE + 2 * seg.ENTRY_SIZE
    assert struct.unpack_from("<IIQ", idx, block_at) == (0, 32, xxhash.xxh3_64_intdigest(data[32:]))
    assert idx[-8:] == struct.pack("<Q", xxhash.xxh3_64_intdigest(idx[:-8]))


def test_version_1_index_still_reads() -> None:
    """SEG-9: a version-1 .idx (written by an earlier tidelog) decodes: no blocks, no runs."""
    index = seg.read_index(bytes.fromhex(GOLDEN_IDX), topic_id=1, first_seq=1)
    v2 = seg.read_index(bytes.fromhex(GOLDEN_IDX_V2), topic_id=1, first_seq=1)
    assert (index.version, v2.version) == (1, 2)
    assert index.runs is None and not index.block_slots
    for name in ("offsets", "lengths", "tss", "flags"):
        assert getattr(index, name) == getattr(v2, name)
    assert v2.runs == seg.LabelRuns([0, 1], ["t", None], [None, "n"])
    assert list(v2.block_slots) == [0] and list(v2.block_offsets) == [32]
    assert v2.block_end(0) == (2, 109)


def test_blocks_are_cut_at_64_kib() -> None:
    """SEG-10: tidelog ends a block at the first frame boundary 64 KiB past its start; a
    larger frame is a block of its own; the blocks tile the .data after its header."""
    payload = b"p" * (30 << 10)
    records = [(i, 0, None, None, payload) for i in range(1, 8)]
    records[3] = (4, 0, None, None, b"q" * (100 << 10))
    data, idx = seg.build_segment(1, 1, records)
    index = seg.read_index(idx)
    assert list(index.block_slots) == [0, 3, 4]  # 3 frames reach 64 KiB; the big one alone
    assert list(index.block_offsets) == [index.offsets[k] for k in index.block_slots]
    for k in range(len(index.block_slots)):
        start, (_, end) = index.block_offsets[k], index.block_end(k)
        assert index.block_hashes[k] == xxhash.xxh3_64_intdigest(data[start:end])
    assert index.block_end(2) == (7, len(data))


def _v2_field(at: int, fmt: str, value: int) -> object:
    """Damage: overwrite one field of GOLDEN_IDX_V2 and recompute the footer."""

    def damage(b: bytes) -> bytes:
        raw = bytearray(b)
        struct.pack_into(fmt, raw, at, value)
        return refooter(bytes(raw))

    return damage


_BLOCKS_AT = 56 + 40
_RUNS_AT = _BLOCKS_AT + 16
_ENDS_AT = _RUNS_AT + 24


@pytest.mark.parametrize(
    ("damage", "rule"),
    [
        pytest.param(lambda b: b[:-1], "SEG-9", id="truncated"),
        pytest.param(lambda b: b[:50], "SEG-9", id="short-header"),
        pytest.param(lambda b: b[:10] + b"\x20\x00" + b[12:], "SEG-4", id="v1-header-size"),
        pytest.param(lambda b: b[:8] + b"\x04\x00" + b[10:], "SEG-4", id="version-4"),
        pytest.param(lambda b: flip(b, 100), "SEG-9", id="block-flip"),
        pytest.param(_v2_field(32, "<Q", 110), "SEG-9", id="data-size"),
        pytest.param(_v2_field(40, "<I", 0), "SEG-9", id="no-blocks"),
        pytest.param(_v2_field(_BLOCKS_AT, "<I", 1), "SEG-10", id="block-not-from-0"),
        pytest.param(_v2_field(_BLOCKS_AT + 4, "<I", 33), "SEG-10", id="block-offset"),
        pytest.param(_v2_field(_RUNS_AT + 12, "<I", 0), "SEG-11", id="runs-not-ascending"),
        pytest.param(_v2_field(_RUNS_AT + 4, "<I", 2), "SEG-11", id="string-ref-range"),
        pytest.param(_v2_field(_RUNS_AT + 4, "<I", 0xFFFFFFFF), "SEG-11", id="flags-vs-run"),
        pytest.param(_v2_field(_ENDS_AT, "<I", 3), "SEG-11", id="string-ends"),
        pytest.param(_v2_field(_ENDS_AT + 8, "<B", 0xFF), "SEG-11", id="string-not-utf8"),
    ],
)
def test_read_index_v2_rejects_damage(damage: object, rule: str) -> None:
    """SEG-9, SEG-10, SEG-11: a version-2 index whose tables break the rules is Corrupt naming
    the rule, even when its footer was recomputed over the damage."""
    idx = bytes.fromhex(GOLDEN_IDX_V2)
    with pytest.raises(Corrupt) as exc:
        seg.read_index(damage(idx))  # type: ignore[operator]
    assert corrupt_rule(exc) == rule


seg_records = st.lists(st.tuples(st.integers(0, 2**64 - 1), texts, texts, payloads), max_size=20)


@given(first=st.integers(1, 2**40), tid=st.integers(0, 2**64 - 1), recs=seg_records)
def test_segment_round_trip(
    first: int, tid: int, recs: list[tuple[int, str | None, str | None, bytes]]
) -> None:
    """SEG-2, SEG-3, SEG-5: every record reads back through its index entry, checksum-verified."""
    records = [(first + i, ts, tag, node, p) for i, (ts, tag, node, p) in enumerate(recs)]
    data, idx = seg.build_segment(tid, first, records)
    index = seg.read_index(idx, topic_id=tid, first_seq=first)
    assert (index.topic_id, index.first_seq, index.count) == (tid, first, len(records))
    assert index.last_seq == first + len(records) - 1
    assert index.data_size == len(data)
    for i, (seq, ts, tag, node, payload) in enumerate(records):
        got = seg.read_record(data, index.offsets[i], index.lengths[i], seq)
        assert got[:4] == (seq, ts, tag, node) and bytes(got[4]) == payload
        assert index.tss[i] == ts
        assert index.flags[i] == (tag is not None) | (node is not None) << 1
    scanned = seg.scan_data(data)
    assert scanned.problem is None
    assert [r.offset for r in scanned.frames] == list(index.offsets)
    assert [(r.tag, r.node) for r in scanned.frames] == [(r[2], r[3]) for r in records]
    assert seg.decode_data_header(data) == seg.SegmentHeader(tid, first)
    # SEG-11: the runs give every record's labels; SEG-10: the blocks tile the frames
    runs = index.runs
    assert runs == seg.label_runs([r[2] for r in records], [r[3] for r in records])
    assert runs is not None
    for i, (_, _, tag, node, _) in enumerate(records):
        assert (runs.tags[runs.run_of(i)], runs.nodes[runs.run_of(i)]) == (tag, node)
    starts = [*index.block_offsets, len(data)]
    assert starts[0] == (32 if records else len(data))
    for k, (a, b) in enumerate(pairwise(starts)):
        assert index.block_hashes[k] == xxhash.xxh3_64_intdigest(data[a:b])


@settings(max_examples=30)
@given(first=st.integers(1, 2**40), tid=st.integers(0, 2**64 - 1), recs=seg_records)
def test_read_index_of_a_mapped_idx_equals_read_index_of_its_bytes(
    first: int, tid: int, recs: list[tuple[int, str | None, str | None, bytes]]
) -> None:
    """SEG-4..SEG-11: recovery maps each .idx and keeps a view of its entries (no copy); the
    index it gets is the one the file's bytes give, also after the handle is closed."""
    import tempfile

    from tidelog.fsio import OsFS

    records = [(first + i, ts, tag, node, p) for i, (ts, tag, node, p) in enumerate(recs)]
    _, idx = seg.build_segment(tid, first, records)
    want = seg.read_index(idx, topic_id=tid, first_seq=first)
    with tempfile.TemporaryDirectory() as d:
        path = str(Path(d) / "seg.idx")
        Path(path).write_bytes(idx)
        h = OsFS().open_read(path)
        got = seg.read_index(h.map(), topic_id=tid, first_seq=first)
        h.close()  # the entries view outlives the handle (fsio Handle.map)
        assert (got.count, got.data_size, got.version) == (want.count, want.data_size, want.version)
        assert got.flags == want.flags and got.runs == want.runs
        assert (got.offsets, got.lengths, got.tss) == (want.offsets, want.lengths, want.tss)
        assert (got.block_slots, got.block_offsets, got.block_hashes) == (
            want.block_slots, want.block_offsets, want.block_hashes)  # fmt: skip


def test_segment_builder_requires_consecutive_seqs() -> None:
    """SEG-3: a segment is a gapless run from first_seq."""
    with pytest.raises(BadArgument, match="consecutive"):
        seg.build_segment(1, 5, [(6, 0, None, None, b"")])
    with pytest.raises(BadArgument):
        seg.SegmentBuilder(1, 0)


def test_segment_builder_refuses_oversized_data() -> None:
    """SEG-8: .idx offsets are u32, so the builder refuses to grow .data past 4 GiB; a tag
    longer than u16 is refused too."""
    builder = seg.SegmentBuilder(1, 1)
    builder.size = seg.MAX_DATA_SIZE - 40
    with pytest.raises(TooLarge):
        builder.add(1, 0, None, None, b"x" * 10)
    with pytest.raises(BadArgument):
        seg.encode_record(1, 0, "t" * 65536, None, b"")


def test_segment_large_payload_matches_reference() -> None:
    """SEG-2: the streaming-hash path gives the close-variant record frame."""
    payload = b"z" * 100_000
    frame = seg.encode_record(3, 4, "tag", None, payload)
    body = struct.pack("<BQQHHI", seg.HAS_TAG, 3, 4, 0, 3, len(payload)) + b"tag" + payload
    want = (
        struct.pack("<I", len(body) + 8) + body + struct.pack("<Q", xxhash.xxh3_64_intdigest(body))
    )
    assert frame == want


def test_read_record_flags_corruption_with_offset() -> None:
    """SEG-2: a flipped byte in a sealed record is Corrupt naming its offset (never truncated)."""
    data, idx = seg.build_segment(1, 1, SEG_RECORDS)
    index = seg.read_index(idx)
    off, length = index.offsets[1], index.lengths[1]
    for at in (off + 4, off + 20, off + length - 9, off + length - 1):
        with pytest.raises(Corrupt, match=f"offset {off}") as exc:
            seg.read_record(flip(data, at), off, length, 2)
        assert corrupt_rule(exc) == "SEG-2"
    with pytest.raises(Corrupt) as exc:
        seg.read_record(data, off, length + 1, 2)  # length disagrees with frame_len
    assert corrupt_rule(exc) == "SEG-2"
    with pytest.raises(Corrupt, match="do not fit"):
        seg.read_record(data[:-1], off, length, 2)  # runs past the end of the file
    with pytest.raises(Corrupt):
        seg.read_record(data, 0, length, 1)  # inside the header


def test_read_record_wrong_seq() -> None:
    """SEG-3: the record at an index entry must carry that entry's seq."""
    data, idx = seg.build_segment(1, 1, SEG_RECORDS)
    index = seg.read_index(idx)
    with pytest.raises(Corrupt, match="seq 1, expected 7") as exc:
        seg.read_record(data, index.offsets[0], index.lengths[0], 7)
    assert corrupt_rule(exc) == "SEG-3"


def test_read_record_bad_utf8_is_corrupt() -> None:
    """SEG-2: a checksum-valid record whose tag is not UTF-8 is still Corrupt."""
    body = struct.pack("<BQQHHI", seg.HAS_TAG, 1, 0, 0, 1, 0) + b"\xff"
    frame = (
        struct.pack("<I", len(body) + 8) + body + struct.pack("<Q", xxhash.xxh3_64_intdigest(body))
    )
    data = bytes.fromhex(GOLDEN_DATA)[:32] + frame
    with pytest.raises(Corrupt, match="UTF-8"):
        seg.read_record(data, 32, len(frame), 1)


@pytest.mark.parametrize(
    ("damage", "rule"),
    [
        pytest.param(lambda b: b[:20], "SEG-4", id="short-header"),
        pytest.param(lambda b: b[:-1], "SEG-6", id="truncated"),
        pytest.param(lambda b: b + b"\0", "SEG-6", id="trailing"),
        pytest.param(lambda b: b"TDLSEGD1" + b[8:], "SEG-4", id="data-magic"),
        pytest.param(lambda b: b[:8] + b"\x02\x00" + b[10:], "SEG-4", id="bad-version"),
        pytest.param(lambda b: b[:10] + b"\x40\x00" + b[12:], "SEG-4", id="bad-header-size"),
        pytest.param(
            lambda b: b[:12] + struct.pack("<I", 2**32 - 1) + b[16:], "SEG-6", id="count-overflow"
        ),
        pytest.param(lambda b: flip(b, 40), "SEG-6", id="entry-flip"),
        pytest.param(lambda b: flip(b, len(b) - 1), "SEG-6", id="footer-flip"),
    ],
)
def test_read_index_rejects_damage(damage: object, rule: str) -> None:
    """SEG-4, SEG-6: header, size and footer checks name the rule."""
    idx = bytes.fromhex(GOLDEN_IDX)
    with pytest.raises(Corrupt) as exc:
        seg.read_index(damage(idx))  # type: ignore[operator]
    assert corrupt_rule(exc) == rule


def test_read_index_checks_pairing() -> None:
    """SEG-4: an .idx belongs to one topic and first seq."""
    idx = bytes.fromhex(GOLDEN_IDX)
    with pytest.raises(Corrupt, match="topic_id") as exc:
        seg.read_index(idx, topic_id=2)
    assert corrupt_rule(exc) == "SEG-4"
    with pytest.raises(Corrupt, match="first_seq"):
        seg.read_index(idx, first_seq=3)


def interleave_entries(count: int) -> bytes:
    """``count`` index entries built column-wise (fast for a million)."""
    offsets = array("I", range(32, 32 + 40 * count, 40))
    lengths = array("I", [40]) * count
    tss = array("Q", range(10**12, 10**12 + count))
    region = bytearray(20 * count)
    for column, at, size in ((offsets, 0, 4), (lengths, 4, 4), (tss, 8, 8)):
        raw = column.tobytes()
        for k in range(size):
            region[at + k :: 20] = raw[k::size]
    region[16::20] = bytes([1, 2, 3]) * (count // 3) + bytes([1, 2, 3][: count % 3])
    return bytes(region)


def test_read_index_large_count() -> None:
    """SEG-5, SEG-6: a million-entry index decodes into columns without a per-entry loop."""
    count = 1_000_000
    head = struct.pack("<8sHHIQQ", seg.IDX_MAGIC, 1, 32, count, 9, 500)
    body = head + interleave_entries(count)
    idx = body + struct.pack("<Q", xxhash.xxh3_64_intdigest(body))
    index = seg.read_index(idx, topic_id=9, first_seq=500)
    assert index.count == count == len(index.offsets) == len(index.tss) == len(index.flags)
    assert index.last_seq == 500 + count - 1
    for i in (0, 1, 2, 12345, count - 1):
        assert index.offsets[i] == 32 + 40 * i
        assert index.lengths[i] == 40
        assert index.tss[i] == 10**12 + i
        assert index.flags[i] == i % 3 + 1
    assert index.data_size == 32 + 40 * count


def test_read_index_empty_segment() -> None:
    """SEG-6: count 0 is a 40-byte index."""
    data, idx = seg.build_segment(4, 10, [])
    index = seg.read_index(idx)
    assert index.count == 0 and index.last_seq == 9 and index.data_size == len(data) == 32


def test_scan_data_reports_damage() -> None:
    """SEG-1, SEG-2, SEG-3: bad header raises; a bad frame, wrong seq or trailing bytes are
    reported with their offset and rule."""
    data = bytes.fromhex(GOLDEN_DATA)
    with pytest.raises(Corrupt) as exc:
        seg.scan_data(b"TDLSEGI1" + data[8:])
    assert corrupt_rule(exc) == "SEG-1"
    with pytest.raises(Corrupt):
        seg.scan_data(data[:31])
    with pytest.raises(Corrupt):
        seg.decode_data_header(data[:24] + bytes(8))  # first_seq 0
    bad = seg.scan_data(flip(data, 75))
    assert bad.problem is not None and (bad.problem.offset, bad.problem.rule) == (71, "SEG-2")
    assert len(bad.frames) == 1
    tail = seg.scan_data(data + b"\x01\x02")
    assert tail.problem is not None and (tail.problem.offset, tail.problem.rule) == (
        len(data),
        "SEG-3",
    )
    over = seg.scan_data(data + b"\x40\x00\x00\x00")
    assert over.problem is not None and over.problem.rule == "SEG-2"
    skipped = data[:32] + data[71:]  # seq 2 right after the header of a segment starting at 1
    wrong = seg.scan_data(skipped)
    assert wrong.problem is not None and (wrong.problem.offset, wrong.problem.rule) == (32, "SEG-3")


# --- progress files -------------------------------------------------------------------------------


def progress_golden(head: str, ext: str, entries: list[tuple[int, str]], crc: str) -> str:
    body = "".join(
        struct.pack("<QIH", block, 4096, 64).hex() + low + "00" * (512 - len(low) // 2)
        for block, low in entries
    )
    return head + ext + body + crc


GOLDEN_PROGRESS = progress_golden(
    "5155495653554200"  # magic "QUIVSUB\0"
    "0100"
    "3800"
    "0000"  # version 1, header_size 56, flags 0
    "0000000000000000"  # oldest_incomplete_seg 0 (block of seq hwm+1 = 3)
    "01000000"  # entry_count 1
    "000000000000",  # reserved
    "000000000000000000000000000000000000000000000000",  # base 0, no gap
    [(0, "0b")],  # block 0: bits 0, 1 (seqs 1, 2 <= hwm) and 3 (outcome seq 4) = 0b1011
    "6c4f36b6",  # crc32c
)
GOLDEN_PROGRESS_GAP = progress_golden(
    "5155495653554200"
    "0100"
    "3800"
    "0000"
    "0100000000000000"  # oldest_incomplete_seg 1: seq 4098 = hwm + 1 is in block 1
    "01000000"
    "000000000000",
    "03000000000000000a000000000000000c00000000000000",  # base 3, gap 10..12
    [(1, "01")],  # block 1: bit 0 = seq 4097 <= hwm
    "4af0484a",
)
GOLDEN_PROGRESS_GAPS = progress_golden(
    "5155495653554200"
    "0200"
    "6000"
    "0000"  # version 2, header_size 96 = 64 + 16 * 2 (PRG-10)
    "0000000000000000"
    "01000000"
    "000000000000",
    "0000000000000000"  # base 0
    "0a000000000000000c00000000000000"  # first gap 10..12
    "0200000000000000"  # more_gaps 2
    "14000000000000001400000000000000"  # gap 20..20
    "1e000000000000002300000000000000",  # gap 30..35
    [(0, "0b")],
    "906df6a6",
)


def test_progress_golden_bytes() -> None:
    """PRG-1, PRG-4, PRG-5, PRG-6: Quiver v1 header + tidelog extension, 4096-seq blocks,
    hwm as the run of set bits from the oldest incomplete block, CRC32C footer."""
    got = prg.encode_progress(2, [4], 0, [])
    assert got.hex() == GOLDEN_PROGRESS
    assert len(got) == 56 + 526 + 4
    assert prg.decode_progress(got) == prg.Progress(2, {4}, 0, [])
    got = prg.encode_progress(4097, [], 3, [(10, 12)])
    assert got.hex() == GOLDEN_PROGRESS_GAP
    assert prg.decode_progress(got) == prg.Progress(4097, set(), 3, [(10, 12)])


def test_PRG_10_SUB_7_three_gaps_make_a_version_2_file() -> None:
    """PRG-10, SUB-7: with more than one gap the file is version 2, the first gap where version 1
    has it and the others after more_gaps; with at most one it is version 1, byte for byte
    (the goldens above)."""
    gaps = [(10, 12), (20, 20), (30, 35)]
    got = prg.encode_progress(2, [4], 0, gaps)
    assert got.hex() == GOLDEN_PROGRESS_GAPS
    assert len(got) == 96 + 526 + 4
    assert prg.decode_progress(got) == prg.Progress(2, {4}, 0, gaps)
    (version,) = struct.unpack_from("<H", prg.encode_progress(2, [4], 0, gaps[:1]), 8)
    assert version == 1


def test_progress_block_mapping() -> None:
    """PRG-4: seq q is bit (q-1) % 4096 of block (q-1) // 4096."""
    assert prg.block_of(1) == (0, 0)
    assert prg.block_of(4096) == (0, 4095)
    assert prg.block_of(4097) == (1, 0)
    assert prg.file_name("exporter-1") == "quiver.sub.exporter-1"
    assert prg.parse_file_name("quiver.sub.exporter-1") == "exporter-1"
    assert prg.parse_file_name("quiver.sub.bad name") is None
    assert prg.parse_file_name("quiver.sub." + "x" * 65) is None


def normalised(hwm: int, outcomes: set[int]) -> tuple[int, set[int]]:
    while hwm + 1 in outcomes:
        hwm += 1
    return hwm, {q for q in outcomes if q > hwm}


def as_gaps(steps: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """Disjoint ascending gaps from (distance from the previous gap, length - 1) steps."""
    gaps: list[tuple[int, int]] = []
    hi = 0
    for skip, extra in steps:
        lo = hi + 1 + skip
        hi = lo + extra
        gaps.append((lo, hi))
    return gaps


@given(
    hwm=st.integers(0, 3 * 4096),
    offsets=st.sets(st.integers(1, 3 * 4096), max_size=40),
    base=st.integers(0, 2**64 - 1),
    steps=st.lists(st.tuples(st.integers(0, 2**40), st.integers(0, 2**20)), max_size=5),
)
def test_PRG_10_progress_round_trip(
    hwm: int, offsets: set[int], base: int, steps: list[tuple[int, int]]
) -> None:
    """PRG-5, PRG-6, PRG-10: decode(encode) gives SUB-2's hwm, the outcomes above it, base and
    every gap (none, one: version 1; more: version 2)."""
    gaps = as_gaps(steps)
    outcomes = {hwm + d for d in offsets} | {max(1, hwm - 3)}  # some at/below hwm: implied
    data = prg.encode_progress(hwm, outcomes, base, gaps)
    got = prg.decode_progress(data)
    assert (got.hwm, got.outcomes) == normalised(hwm, outcomes)
    assert (got.base, got.gaps, got.warnings) == (base, gaps, [])
    assert struct.unpack_from("<H", data, 8)[0] == (2 if len(gaps) > 1 else 1)


@pytest.mark.parametrize("n", [0, 1, 3])
def test_PRG_10_SUB_7_progress_file_round_trip(tmp_path: Path, n: int) -> None:
    """PRG-10, SUB-7: a subscriber's 0, 1 or 3 gaps survive write_progress / read_progress."""
    gaps = as_gaps([(1, 2)] * n)
    s = SubState(base=0, hwm=0, cursor=0, outcomes={9: "acked"}, gaps=gaps)
    write_progress(OsFS(), str(tmp_path), 1, "s", s)
    got = read_progress(OsFS(), str(tmp_path), 1, "s")
    assert got is not None and (got.hwm, got.outcomes, got.gaps) == (0, {9}, gaps)


def test_PRG_10_more_gaps_than_fit_merge_the_last(tmp_path: Path) -> None:
    """PRG-10: a subscriber with more gaps than a u16 header_size holds is written with its last
    gaps merged into one (at-least-once: the tombstone covers more, nothing is skipped); the
    encoder itself refuses the excess."""
    gaps = [(3 * i + 1, 3 * i + 1) for i in range(prg.MAX_GAPS + 2)]
    with pytest.raises(BadArgument):
        prg.encode_progress(0, [], 0, gaps)
    fs, root = OsFS(), str(tmp_path)
    write_progress(fs, root, 1, "s", SubState(0, 0, 0, gaps=gaps))
    got = read_progress(fs, root, 1, "s")
    assert got is not None and len(got.gaps) == prg.MAX_GAPS
    assert got.gaps[:-1] == gaps[: prg.MAX_GAPS - 1]
    assert got.gaps[-1] == (gaps[prg.MAX_GAPS - 1][0], gaps[-1][1])


def test_progress_hwm_crosses_full_blocks() -> None:
    """PRG-5: outcomes contiguous to the hwm across a block boundary move oldest_incomplete_seg."""
    data = prg.encode_progress(4000, range(4001, 4200), 0, [])
    (oldest,) = struct.unpack_from("<Q", data, 14)
    assert oldest == 1  # block of seq 4200
    assert prg.decode_progress(data).hwm == 4199


def raw_progress(
    *,
    header_size: int = 32,
    flags: int = 0,
    oldest: int = 0,
    entries: list[tuple[int, int, int, bytes]] | None = None,
    extension: bytes = b"",
    trailing: bytes = b"",
    version: int = 1,
    magic: bytes = prg.MAGIC,
    crc: object = None,
) -> bytes:
    """A progress file assembled field by field (to make plain-Quiver and damaged files)."""
    entries = entries or []
    head = struct.pack("<8sHHHQI6x", magic, version, header_size, flags, oldest, len(entries))
    head += extension.ljust(header_size - 32, b"\0")
    body = head + b"".join(struct.pack("<QIH", b, n, w) + bits for b, n, w, bits in entries)
    body += trailing
    check = crc(body) if callable(crc) else crc32c.crc32c(body)
    return body + struct.pack("<I", check)


def bitmap(*bits: int) -> bytes:
    return sum(1 << b for b in bits).to_bytes(512, "little")


def test_progress_plain_quiver_header() -> None:
    """PRG-2, PRG-6: a 32-byte Quiver header reads as base = hwm, no gap; a missing entry for
    the oldest block means none of its seqs is resolved (PRG-5)."""
    got = prg.decode_progress(raw_progress(oldest=2, entries=[(2, 4096, 64, bitmap(0, 1, 5))]))
    assert got == prg.Progress(2 * 4096 + 2, {2 * 4096 + 6}, 2 * 4096 + 2, [])
    bare = prg.decode_progress(raw_progress(oldest=3))
    assert (bare.hwm, bare.outcomes, bare.base) == (3 * 4096, set(), 3 * 4096)
    later = prg.decode_progress(raw_progress(oldest=0, entries=[(1, 4096, 64, bitmap(0))]))
    assert (later.hwm, later.outcomes) == (0, {4097})


def test_progress_skips_unknown_header_bytes_and_warns() -> None:
    """PRG-2: readers skip header bytes they do not know; unknown flags and trailing bytes are
    accepted with a warning."""
    ext = struct.pack("<QQQ", 7, 0, 0) + b"future!!"
    got = prg.decode_progress(
        raw_progress(header_size=64, extension=ext, entries=[(0, 4096, 64, bitmap(0))], flags=4)
    )
    assert (got.hwm, got.base, got.gaps) == (1, 7, [])
    assert any("flags" in w for w in got.warnings)
    extra = prg.decode_progress(raw_progress(trailing=b"xyz"))
    assert any("trailing" in w for w in extra.warnings)
    middle = prg.decode_progress(raw_progress(header_size=40, extension=b"12345678"))
    assert middle.base == middle.hwm and middle.gaps == []


@pytest.mark.parametrize(
    ("make", "rule"),
    [
        pytest.param(lambda: raw_progress()[:35], "PRG-1", id="short"),
        pytest.param(lambda: b"", "PRG-1", id="empty"),
        pytest.param(lambda: raw_progress(magic=b"QUIVSEG\0"), "PRG-1", id="bad-magic"),
        pytest.param(lambda: raw_progress(version=0), "PRG-1", id="version-0"),
        pytest.param(lambda: raw_progress(version=3), "PRG-1", id="version-3"),
        pytest.param(lambda: flip(prg.encode_progress(5, [9], 0, []), 100), "PRG-1", id="bad-crc"),
        pytest.param(
            lambda: raw_progress(crc=lambda b: zlib.crc32(b)), "PRG-1", id="ieee-crc-not-crc32c"
        ),
        pytest.param(lambda: raw_progress(header_size=31), "PRG-2", id="header-size-small"),
        pytest.param(lambda: raw_progress(header_size=32)[:32] + b"\0" * 4, "PRG-1", id="no-crc"),
        pytest.param(
            lambda: raw_progress(entries=[(0, 100, 2, bytes(16))]), "PRG-3", id="bundle-count"
        ),
        pytest.param(
            lambda: raw_progress(entries=[(1, 4096, 64, bitmap()), (0, 4096, 64, bitmap())]),
            "PRG-3",
            id="out-of-order",
        ),
        pytest.param(
            lambda: raw_progress(oldest=2, entries=[(1, 4096, 64, bitmap())]),
            "PRG-3",
            id="below-oldest",
        ),
        pytest.param(
            lambda: raw_progress(entries=[(0, 4096, 64, bitmap())])[:-300], "PRG-1", id="truncated"
        ),
        pytest.param(lambda: overflowing_entry_count(), "PRG-3", id="entry-count-overflow"),
        pytest.param(
            lambda: raw_progress(header_size=56, extension=struct.pack("<QQQ", 0, 5, 4)),
            "PRG-6",
            id="bad-gap",
        ),
        pytest.param(
            lambda: raw_progress(header_size=56, extension=struct.pack("<QQQ", 0, 0, 4)),
            "PRG-6",
            id="gap-from-zero",
        ),
        pytest.param(lambda: raw_progress(version=2), "PRG-10", id="v2-plain-quiver-header"),
        pytest.param(lambda: v2([(1, 2), (5, 6)], size=56), "PRG-10", id="v2-header-56"),
        pytest.param(lambda: v2([(1, 2), (5, 6)], more=0), "PRG-10", id="v2-more-gaps-0"),
        pytest.param(lambda: v2([(1, 2), (5, 6)], more=2), "PRG-10", id="v2-more-than-fit"),
        pytest.param(lambda: v2([(1, 2), (5, 6)], more=2**64 - 1), "PRG-10", id="v2-huge-count"),
        pytest.param(lambda: v2([(0, 0), (5, 6)]), "PRG-10", id="v2-first-gap-none"),
        pytest.param(lambda: v2([(1, 2), (6, 5)]), "PRG-10", id="v2-gap-reversed"),
        pytest.param(lambda: v2([(5, 6), (1, 2)]), "PRG-10", id="v2-out-of-order"),
        pytest.param(lambda: v2([(1, 5), (5, 6)]), "PRG-10", id="v2-overlapping"),
        pytest.param(lambda: v2([(1, 2), (4, 6), (6, 9)]), "PRG-10", id="v2-third-overlaps"),
    ],
)
def test_progress_rejects_damage(make: object, rule: str) -> None:
    """PRG-1, PRG-2, PRG-3, PRG-6, PRG-10: Corrupt naming the first problem (Quiver: v1 readers
    reject v0 and unknown versions; short files are corrupt; the CRC is CRC32C, not IEEE; a
    version 2 file's gap count must fit its header and its gaps be disjoint and ascending)."""
    with pytest.raises(Corrupt) as exc:
        prg.decode_progress(make())  # type: ignore[operator]
    assert corrupt_rule(exc) == rule


def v2(gaps: list[tuple[int, int]], *, more: int | None = None, size: int | None = None) -> bytes:
    """A version 2 header (PRG-10) with ``gaps`` as they are, ``more_gaps`` and header_size
    overridable."""
    (a, b), rest = gaps[0], gaps[1:]
    ext = struct.pack("<QQQQ", 0, a, b, len(rest) if more is None else more)
    ext += b"".join(struct.pack("<QQ", lo, hi) for lo, hi in rest)
    size = 32 + len(ext) if size is None else size
    return raw_progress(version=2, header_size=size, extension=ext[: size - 32])


def test_PRG_10_damaged_file_is_corrupt_naming_it(tmp_path: Path) -> None:
    """PRG-10: a damaged version 2 progress file is ``corrupt`` naming the file and the rule."""
    fs = OsFS()
    write_progress(fs, str(tmp_path), 1, "s", SubState(0, 0, 0, gaps=[(1, 2), (5, 6)]))
    path = tmp_path / "topics" / f"{1:016x}" / "quiver.sub.s"
    data = bytearray(path.read_bytes()[:-4])
    struct.pack_into("<Q", data, 56, 7)  # more_gaps 7: the header holds 1
    path.write_bytes(bytes(data) + struct.pack("<I", crc32c.crc32c(bytes(data))))
    with pytest.raises(Corrupt) as exc:
        read_progress(fs, str(tmp_path), 1, "s")
    assert str(path) in exc.value.message and "PRG-10" in exc.value.message
    assert "more_gaps 7" in exc.value.message


def overflowing_entry_count() -> bytes:
    body = bytearray(raw_progress(entries=[(0, 4096, 64, bitmap(0))])[:-4])
    struct.pack_into("<I", body, 22, 1000)
    return bytes(body) + struct.pack("<I", crc32c.crc32c(bytes(body)))


def test_progress_encode_rejects_bad_arguments() -> None:
    """PRG-6, PRG-10: a gap needs 1 <= gap_from <= gap_to, gaps are disjoint and ascending;
    hwm and base are non-negative."""
    with pytest.raises(BadArgument):
        prg.encode_progress(-1, [], 0, [])
    with pytest.raises(BadArgument):
        prg.encode_progress(0, [], 0, [(5, 4)])
    with pytest.raises(BadArgument):
        prg.encode_progress(0, [], 0, [(1, 4), (4, 6)])
    with pytest.raises(BadArgument):
        prg.encode_progress(0, [], 0, [(7, 9), (1, 2)])
    with pytest.raises(BadArgument):
        prg.encode_progress(0, [0], 0, [])


# --- snapshots ------------------------------------------------------------------------------------

GOLDEN_SNAPSHOT = (
    "54444c534e415031"  # magic "TDLSNAP1"
    "01000000"
    "20000000"  # version 1, header_size 32
    "0100000000000000"  # n 1
    "0d00000000000000"  # body_len 13
    "7b2276657273696f6e223a317d"  # {"version":1}
    "7026d7579ab7fb62"  # xxh3-64 over header + body
)


def test_snapshot_golden_bytes() -> None:
    """SNAP-1, SNAP-2, SNAP-3: header, compact JSON body, XXH3-64 footer."""
    got = snap.encode_snapshot(1, {"version": 1})
    assert got.hex() == GOLDEN_SNAPSHOT
    assert snap.decode_snapshot(got) == (1, {"version": 1})


@given(
    n=st.integers(0, 2**64 - 1),
    extra=st.dictionaries(st.text(max_size=8), st.integers() | st.text(max_size=8), max_size=5),
)
def test_snapshot_round_trip(n: int, extra: dict[str, object]) -> None:
    """SNAP-3: any JSON object with an int version survives; the codec checks nothing else."""
    body = {**extra, "version": 1, "topics": [{"id": 1, "name": "é"}]}
    assert snap.decode_snapshot(snap.encode_snapshot(n, body)) == (n, body)


def snapshot_with_body(raw: bytes) -> bytes:
    framed = struct.pack("<8sIIQQ", snap.MAGIC, 1, 32, 1, len(raw)) + raw
    return framed + struct.pack("<Q", xxhash.xxh3_64_intdigest(framed))


@pytest.mark.parametrize(
    ("make", "rule"),
    [
        pytest.param(lambda g: g[:39], "SNAP-2", id="short"),
        pytest.param(lambda g: b"TDLSNAP2" + g[8:], "SNAP-1", id="bad-magic"),
        pytest.param(lambda g: g[:8] + struct.pack("<I", 9) + g[12:], "SNAP-1", id="bad-version"),
        pytest.param(lambda g: g[:12] + struct.pack("<I", 64) + g[16:], "SNAP-1", id="header-size"),
        pytest.param(lambda g: g[:-1], "SNAP-2", id="truncated"),
        pytest.param(lambda g: g + b"\0", "SNAP-2", id="trailing"),
        pytest.param(
            lambda g: g[:24] + struct.pack("<Q", 2**63) + g[32:], "SNAP-2", id="body-len-overflow"
        ),
        pytest.param(lambda g: flip(g, 40), "SNAP-2", id="body-flip"),
        pytest.param(lambda g: flip(g, len(g) - 2), "SNAP-2", id="checksum-flip"),
        pytest.param(lambda g: snapshot_with_body(b"[1,2]"), "SNAP-3", id="not-an-object"),
        pytest.param(lambda g: snapshot_with_body(b"\xff\xfe"), "SNAP-3", id="not-utf8"),
        pytest.param(lambda g: snapshot_with_body(b'{"a":1}'), "SNAP-3", id="no-version"),
        pytest.param(
            lambda g: snapshot_with_body(b'{"version":true}'), "SNAP-3", id="bool-version"
        ),
        pytest.param(lambda g: snapshot_with_body(b'{"version":"1"}'), "SNAP-3", id="str-version"),
    ],
)
def test_snapshot_rejects_damage(make: object, rule: str) -> None:
    """SNAP-1, SNAP-2, SNAP-3: Corrupt naming the rule."""
    with pytest.raises(Corrupt) as exc:
        snap.decode_snapshot(make(bytes.fromhex(GOLDEN_SNAPSHOT)))  # type: ignore[operator]
    assert corrupt_rule(exc) == rule


def test_snapshot_encode_requires_int_version() -> None:
    """SNAP-3: the writer refuses a body the reader would reject."""
    for body in ({}, {"version": True}, {"version": "1"}):
        with pytest.raises(BadArgument):
            snap.encode_snapshot(1, body)
    with pytest.raises(BadArgument):
        snap.encode_snapshot(-1, {"version": 1})


# --- every decoder: garbage in, Corrupt out ------------------------------------------------------

VALID_FILES = {
    "wal-header": (bytes.fromhex(GOLDEN_WAL_HEADER), wal.decode_header),
    "segment-data": (bytes.fromhex(GOLDEN_DATA), seg.scan_data),
    "segment-idx": (bytes.fromhex(GOLDEN_IDX), seg.read_index),
    "segment-idx-v2": (bytes.fromhex(GOLDEN_IDX_V2), seg.read_index),
    "progress": (bytes.fromhex(GOLDEN_PROGRESS_GAP), prg.decode_progress),
    "snapshot": (bytes.fromhex(GOLDEN_SNAPSHOT), snap.decode_snapshot),
}


@settings(max_examples=300)
@given(
    kind=st.sampled_from(sorted(VALID_FILES)),
    cut=st.integers(0, 700),
    flips=st.lists(st.tuples(st.integers(0, 700), st.integers(0, 7)), max_size=3),
    tail=st.binary(max_size=40),
)
def test_decoders_raise_only_corrupt(
    kind: str, cut: int, flips: list[tuple[int, int]], tail: bytes
) -> None:
    """WAL-1, SEG-1, SEG-6, PRG-1, SNAP-2: truncated, bit-flipped or extended files make every
    decoder either succeed or raise Corrupt naming a rule, never anything else."""
    valid, decode = VALID_FILES[kind]
    buf = valid[:cut] + tail
    for at, bit in flips:
        if at < len(buf):
            buf = flip(buf, at, bit)
    try:
        decode(buf)  # type: ignore[operator]
    except FormatCorrupt as exc:
        assert re.fullmatch(r"[A-Z]+-\d+", exc.rule)


def test_deeply_nested_json_body_is_corrupt() -> None:
    """SNAP-3, WAL-9: a body nested past the parser's limit is Corrupt, not RecursionError."""
    with pytest.raises(FormatCorrupt):
        snap.decode_snapshot(snapshot_with_body(b"[" * 100_000 + b"]" * 100_000))


# --- the spec and the tests agree -----------------------------------------------------------------


def test_golden_examples_in_formats_md_match() -> None:
    """WAL-1, WAL-3, WAL-14, SNAP-1: the worked examples printed in FORMATS.md are the golden
    bytes."""
    text = (REPO / "spec" / "FORMATS.md").read_text(encoding="utf-8")
    blocks = re.findall(r"```\n([0-9a-f \n]+)```", text)
    flat = {"".join(b.split()) for b in blocks}
    assert {GOLDEN_WAL_HEADER, GOLDEN_APPEND, GOLDEN_APPEND_BATCH, GOLDEN_SNAPSHOT} <= flat
    assert json.loads(bytes.fromhex(GOLDEN_SNAPSHOT)[32:-8]) == {"version": 1}


# --- .data version 2 (run frames) and .idx version 3: spec/FORMATS-seg3.md ----------------------

GOLDEN_RUN_DATA = (
    "54444c5345474431020020000000000001000000000000000100000000000000"  # header, version 2
    "27000000010100000000000000010000000000010074"  # frame 0: len 39, HAS_TAG, seq 1, 1, "t"
    "e803000000000000"
    "01000000"
    "61"
    "f67b583aaa6e11dc"  # ts 1000, length 1, "a", XXH3-64
    "2600000002020000000000000001000000010000006e"  # frame 1: len 38, HAS_NODE, seq 2, 1, "n"
    "e903000000000000"
    "00000000"
    "fe4508ae37d904c1"  # ts 1001, length 0, XXH3-64
)
GOLDEN_RUN_IDX = (
    "54444c53454749310300380002000000"  # magic, version 3, header_size 56, count 2
    "0100000000000000"
    "0100000000000000"
    "7500000000000000"  # topic 1, first_seq 1, size 117
    "02000000"
    "02000000"
    "02000000"
    "02000000"  # 2 blocks, 2 runs, 2 strings, 2 text bytes
    "42000000"
    "01000000"
    "e803000000000000"
    "01000000"  # entry 0: payload at 66, 1 byte
    "6d000000"
    "00000000"
    "e903000000000000"
    "02000000"  # entry 1: payload at 109, 0 bytes
    "00000000"
    "20000000"
    "3eb4ecb66c065491"  # block 0 = frame 0 at 32
    "01000000"
    "4b000000"
    "a240120f3091c04c"  # block 1 = frame 1 at 75
    "00000000"
    "00000000"
    "ffffffff"
    "01000000"
    "ffffffff"
    "01000000"  # runs
    "01000000"
    "02000000"
    "746e"  # string ends, "t" "n"
    "c792b0d775dacb6e"  # XXH3-64 footer
)


def test_SEG_14_SEG_17_golden_run_segment() -> None:
    """SEG-14..SEG-17: FORMATS-seg3.md's worked example, byte for byte (the column encoder's
    output), and it decodes back to the two records."""
    from tidelog.backends.file.format.seal import build_columns

    data, idx = build_columns(1, 1, [b"a", b""], [1000, 1001], ["t", None], [None, "n"])
    assert data.hex() == GOLDEN_RUN_DATA and idx.hex() == GOLDEN_RUN_IDX
    scan = seg.scan_data(data)
    assert scan.problem is None and scan.runs == [(0, 32), (1, 75)]
    assert [(f.seq, f.ts, f.tag, f.node, data[f.offset : f.offset + f.length]) for f in
            scan.frames] == [(1, 1000, "t", None, b"a"), (2, 1001, None, "n", b"")]  # fmt: skip
    run = seg.read_run(data, 32, 1)
    assert (len(run.tss), run.seq, run.tag, run.payload_at, run.length) == (1, 1, "t", 66, 43)
    index = seg.read_index(idx, topic_id=1, first_seq=1)
    assert (index.version, list(index.offsets), list(index.lengths)) == (3, [66, 109], [1, 0])


@pytest.mark.parametrize(
    ("at", "rule"),
    [(66, "SEG-15"), (36, "SEG-15"), (45, "SEG-15"), (5, "SEG-16"), (80, "SEG-15")],
    ids=["payload-byte", "flags", "count", "seq", "second-frame"],
)
def test_SEG_15_SEG_16_damaged_run_frames_are_reported_with_their_offset(
    at: int, rule: str
) -> None:
    """SEG-15, SEG-16: a damaged run frame stops the scan at the frame's offset with its rule;
    with the checksum recomputed over a wrong seq, SEG-16 names the gap."""
    data = bytearray.fromhex(GOLDEN_RUN_DATA)
    frame = 32 if at < 75 else 75
    if rule == "SEG-16":  # a valid frame with the wrong first seq
        data[frame + at] ^= 0x01
        body = bytes(data[frame + 4 : frame + 43 - 8])
        data[frame + 43 - 8 : frame + 43] = xxhash.xxh3_64_intdigest(body).to_bytes(8, "little")
    else:
        data[at] ^= 0x01
    scan = seg.scan_data(bytes(data))
    assert scan.problem is not None and (scan.problem.offset, scan.problem.rule) == (frame, rule)
    assert len(scan.frames) == (0 if frame == 32 else 1)
    assert seg.scan_data(bytes.fromhex(GOLDEN_RUN_DATA) + b"\x00").problem.rule == "SEG-16"  # type: ignore[union-attr]
