"""The blockdev ring's bytes (spec/FORMATS-blockdev.md): codecs and golden vectors, and what
opening does with devices and images that are torn, foreign, too small or of another geometry:
always a typed error (Corrupt / BadOption), and never a byte overwritten without format=true."""

from __future__ import annotations

import os
import re
from pathlib import Path

import crc32c
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import tidelog
from tidelog.backends.blockdev.device import Geometry, geometry_for
from tidelog.backends.blockdev.format import (
    BATCH_END,
    CARRIED,
    MARK,
    META_BYTES,
    PAGE_PARTIAL,
    SLOT_BYTES,
    TRAILER_BYTES,
    FormatCorrupt,
    MarkOut,
    PageHeader,
    RecordOut,
    Slot,
    checksum,
    decode_entries,
    decode_slot,
    decode_trailer,
    encode_mark,
    encode_page,
    encode_record,
    encode_slot,
    max_payload,
    slot_index,
)
from tidelog.backends.blockdev.options import parse_blockdev_options
from tidelog.clock import FakeClock
from tidelog.errors import BadName, BadOption, Corrupt, Locked, TooLarge

RING_ID = 0x0123456789ABCDEF


def ring_uri(path: Path, **options: object) -> str:
    query = "&".join(f"{k}={v}" for k, v in options.items())
    return f"blockdev://{path}" + (f"?{query}" if query else "")


def make_ring(path: Path, pages: int = 8, page_size: int = 512, **extra: object) -> None:
    """A formatted ring with three records in it."""
    uri = ring_uri(path, size=4096 + pages * page_size, page_size=page_size, topic="t", **extra)
    with tidelog.open(uri, clock=FakeClock(1000)) as store:
        store.topic("t").append_many([b"one", b"two", b"three"])


# -- golden bytes ------------------------------------------------------------------------------
def test_BDEV_1_crc32c_check_value() -> None:
    """BDEV-1: every checksum is CRC32C (Castagnoli)."""
    assert checksum(b"123456789") == 0xE3069283 == crc32c.crc32c(b"123456789")
    assert checksum(b"1234", b"56789") == checksum(b"123456789")


def test_BDEV_8_BDEV_9_golden_entries() -> None:
    """BDEV-8: record = flags, zigzag ts delta, length, [tag], [node], payload; BDEV-9: mark."""
    rec = encode_record(1700000000123, b"t", None, b"hi", True)
    assert rec.hex() == "05f6a1abfef962" + "02" + "0174" + "6869"
    assert encode_record(0, None, None, b"x", False).hex() == "00000178"
    assert encode_record(-1, None, b"n", b"", False).hex() == "020100016e"
    assert encode_mark(b"p0", 7, carried=False).hex() == "0802703007"
    assert encode_mark(b"p0", 7, carried=True)[0] == MARK | CARRIED


def test_BDEV_7_golden_trailer() -> None:
    """BDEV-7: the 64-byte trailer and its CRC over ring id + entries + trailer."""
    body = encode_record(0, None, None, b"x", False) + encode_record(
        1700000000123, b"t", None, b"hi", True
    )
    h = PageHeader(5, 3, 4, 2, 2, len(body), 1, PAGE_PARTIAL, 0)
    page = encode_page(512, RING_ID, body, h)
    assert len(page) == 512 and page[len(body) : 512 - TRAILER_BYTES] == bytes(512 - 64 - 16)
    assert page[-64:].hex() == (
        "0500000000000000" "0300000000000000" "0400000000000000" "0200000000000000"
        "02000000" "10000000" "0100" "0100" "00000000" "0000000000000000" "54444c50" "55513444"
    )  # fmt: skip
    assert decode_trailer(page, RING_ID) == h
    got = decode_entries(page, h)
    assert got == [
        RecordOut(5, 0, None, None, b"x", False),
        RecordOut(6, 1700000000123, "t", None, b"hi", True),
    ]


def test_BDEV_3_golden_slot() -> None:
    """BDEV-3: slot header, JSON body, zero padding, CRC32C at 2044."""
    raw = encode_slot(Slot(1, RING_ID, 512, 8, 0, False, {"topic": "t"}))
    assert len(raw) == SLOT_BYTES
    assert raw[:52].hex() == (
        "54444c52494e4731" "0100" "0000" "00" "000000" "0100000000000000" "efcdab8967452301"
        "00020000" "08000000" "0000000000000000" "0d000000"
    )  # fmt: skip
    assert raw[52:65] == b'{"topic":"t"}' and raw[65:2044] == bytes(2044 - 65)
    assert raw[-4:].hex() == "93e06f56"
    assert decode_slot(raw, 0).body == {"topic": "t"}


# -- codecs ------------------------------------------------------------------------------------
records = st.lists(
    st.tuples(
        st.integers(-(10**6), 10**13),
        st.none() | st.text(min_size=1, max_size=5),
        st.none() | st.text(min_size=1, max_size=5),
        st.binary(max_size=40),
    ),
    min_size=1,
    max_size=8,
)


@settings(max_examples=200, deadline=None)
@given(records, st.booleans())
def test_BDEV_8_entries_round_trip(recs: list[tuple[int, str | None, str | None, bytes]], mark: bool) -> None:  # noqa: E501
    """BDEV-8, BDEV-9: records (ts deltas from the previous record of the page) and marks decode
    back to what was encoded; seqs are first_seq + position among records."""
    parts, prev = [], 0
    for ts, tag, node, payload in recs:
        tb = tag.encode() if tag else None
        nb = node.encode() if node else None
        parts.append(encode_record(ts - prev, tb, nb, payload, False))
        prev = ts
    if mark:
        parts.append(encode_mark(b"prod", 3, carried=False))
    parts[-1] = bytes([parts[-1][0] | BATCH_END]) + parts[-1][1:]
    body = b"".join(parts)
    h = PageHeader(10, 1, 0, 1, len(recs), len(body), 2, 0, 0)
    page = encode_page(4096, RING_ID, body, h)
    got = decode_entries(page, decode_trailer(page, RING_ID) or h)
    want: list[object] = [
        RecordOut(10 + i, ts, tag or None, node or None, p, False)
        for i, (ts, tag, node, p) in enumerate(recs)
    ]
    if mark:
        want.append(MarkOut("prod", 3, True, False))
    else:
        last = want[-1]
        assert isinstance(last, RecordOut)
        want[-1] = RecordOut(last.seq, last.ts, last.tag, last.node, last.payload, True)
    assert got == want


def _page() -> tuple[bytes, PageHeader]:
    body = encode_record(5, None, None, b"payload" * 10, True)
    h = PageHeader(1, 1, 0, 1, 1, len(body), 1, 0, 0)
    return encode_page(1024, RING_ID, body, h), h


@pytest.mark.parametrize("damage", ["zero", "garbage", "half", "trailer", "one_bit"])
def test_BDEV_7_torn_pages_are_invalid(damage: str) -> None:
    """BDEV-7, RING-4: a page torn at any sector, zeroed or garbage never validates."""
    page, _ = _page()
    b = bytearray(page)
    if damage == "zero":
        b[:] = bytes(len(b))
    elif damage == "garbage":
        b[:] = os.urandom(len(b))
    elif damage == "half":  # the first sector new, the second (with the trailer) old zeros
        b[512:] = bytes(512)
    elif damage == "trailer":
        b[1024 - 64 : 1024 - 56] = os.urandom(8)
    else:
        b[3] ^= 0x10
    assert decode_trailer(bytes(b), RING_ID) is None


def test_BDEV_7_RING_5_ring_id_and_padding() -> None:
    """BDEV-7, RING-5: a page of another format (ring id) is invalid; the padding is not
    covered (old bytes left there by a torn write change nothing)."""
    page, h = _page()
    assert decode_trailer(page, RING_ID ^ 1) is None
    b = bytearray(page)
    b[h.used : h.used + 100] = os.urandom(100)
    assert decode_trailer(bytes(b), RING_ID) == h


def test_BDEV_8_checksummed_garbage_entries_are_corrupt() -> None:
    """BDEV-8, BDEV-9: entries under a matching CRC that do not parse are corruption."""
    for body, count in [
        (b"\x40\x00\x01x", 1),  # unknown record flag bit
        (b"\x00\x00\x09x", 1),  # payload longer than the page's used bytes
        (encode_record(0, None, None, b"x", True), 2),  # trailer counts 2 records, 1 present
        (b"\x1c\x02p0\x01", 0),  # a carried mark with BATCH_END
        (b"\x08\x02p0\x00", 0),  # a mark with sequence 0
    ]:
        h = PageHeader(1, 1, 0, 1, count, len(body), 1, 0, 0)
        page = encode_page(512, RING_ID, body, h)
        trailer = decode_trailer(page, RING_ID)
        assert trailer is not None
        with pytest.raises(FormatCorrupt) as exc:
            decode_entries(page, trailer)
        assert exc.value.rule in ("BDEV-8", "BDEV-9")


def test_BDEV_3_BDEV_4_slot_rejections() -> None:
    """BDEV-3 (zeros, magic, version before CRC, CRC), BDEV-4 (generation in its slot),
    BDEV-5 (geometry)."""
    good = encode_slot(Slot(3, RING_ID, 512, 8, 2, True, {"topic": "t"}))
    assert slot_index(3) == 0 and decode_slot(good, 0).looped
    cases: list[tuple[bytes, int, str]] = [
        (bytes(SLOT_BYTES), 0, "all zeros"),
        (b"NOTARING" + good[8:], 0, "magic"),
        (good[:8] + b"\x02\x00" + good[10:], 0, "unsupported ring format version 2"),
        (good[:100] + b"\xff" + good[101:], 0, "checksum"),
        (good, 1, "does not belong in slot 1"),
        (encode_slot(Slot(1, RING_ID, 500, 8, 0, False, {})), 0, "page_size"),
        (encode_slot(Slot(1, RING_ID, 512, 7, 0, False, {})), 0, "page_count"),
    ]
    for raw, index, message in cases:
        with pytest.raises(FormatCorrupt, match=message):
            decode_slot(raw, index)


def test_BDEV_5_BDEV_12_RING_2_geometry() -> None:
    """BDEV-5, BDEV-12, RING-2: pages after the 4 KiB block, rounded down to even, capped."""
    assert geometry_for(4096 + 9 * 512, 512, "x") == Geometry(512, 8)
    assert geometry_for(4096 + 8 * 512 + 100, 512, "x") == Geometry(512, 8)
    assert geometry_for(64 << 20, 4096, "x").page_count == 16382
    assert geometry_for(1 << 40, 4096, "x").page_count == 65534
    assert Geometry(512, 8).offset(3) == META_BYTES + 3 * 512
    for small in (0, 4096, 4096 + 512, 4096 + 1023):
        with pytest.raises(BadOption, match="too small"):
            geometry_for(small, 512, "x")
    assert max_payload(512) == 432 and max_payload(4096) == 4016


def test_BDEV_13_options() -> None:
    """BDEV-13, URI-2: options are validated before anything is opened."""
    common, o = parse_blockdev_options(
        {"size": "64MiB", "page_size": "1KiB", "topic": "ev", "format": "yes", "direct": "off"}
    )
    assert (o.size, o.page_size, o.topic, o.format, o.direct) == (64 << 20, 1024, "ev", True, "off")
    assert common.max_record_bytes == 64 << 20
    for bad in ({"page_size": "1000"}, {"page_size": "256"}, {"direct": "maybe"}, {"nope": 1}):
        with pytest.raises(BadOption):
            parse_blockdev_options(bad)
    with pytest.raises(BadName):
        parse_blockdev_options({"topic": "../x"})


# -- opening devices and images (BDEV-11, BDEV-12, BDEV-13) -------------------------------------
def test_BDEV_11_missing_image_needs_size(tmp_path: Path) -> None:
    """BDEV-11: a missing image without size is bad_option, and nothing is created."""
    with pytest.raises(BadOption, match="size="):
        tidelog.open(ring_uri(tmp_path / "r.img"))
    assert not os.listdir(tmp_path)


def test_BDEV_11_new_image_is_created_atomically(tmp_path: Path) -> None:
    """BDEV-11: created under a temporary name, formatted, renamed: no .tmp is left."""
    path = tmp_path / "r.img"
    make_ring(path)
    assert sorted(os.listdir(tmp_path)) == ["r.img"]
    assert path.stat().st_size == 4096 + 8 * 512
    with tidelog.open(ring_uri(path)) as store:
        assert store.topics() == ["t"]
        assert [r.payload for r in store.topic("t").read()] == [b"one", b"two", b"three"]


def test_BDEV_11_BDEV_12_uri_creates_an_image(tmp_path: Path) -> None:
    """BDEV-11, BDEV-12, URI-1: the issue's URI creates a sparse 64 MiB image holding
    (64 MiB - 4 KiB) // 4 KiB = 16383 pages, rounded to even; only the metadata slot is written;
    the default topic binding is "default"; reopening needs no size."""
    path = tmp_path / "img"
    with tidelog.open(f"blockdev://{path}?size=64MiB&page_size=4096") as store:
        facts = store.describe()
        assert (facts["page_count"], facts["page_size"], facts["device"]) == (16382, 4096, "image")
        assert facts["topic_binding"] == "default" and facts["formatted"] is True
        assert facts["io"]["device_bytes_written"] == SLOT_BYTES  # type: ignore[index]
    assert path.stat().st_size == 64 << 20
    with tidelog.open(f"blockdev://{path}") as store:
        assert store.describe()["formatted"] is False
        assert store.topic("default").append(b"x") == 1


def test_BDEV_3_BDEV_11_wrong_magic_is_refused_untouched(tmp_path: Path) -> None:
    """BDEV-3, BDEV-11: a ring whose metadata magic is wrong in both slots (another format, or a
    damaged block) is Corrupt naming the magic, and is left byte-identical."""
    path = tmp_path / "r.img"
    make_ring(path)
    data = bytearray(path.read_bytes())
    for off in (0, SLOT_BYTES):
        if data[off : off + 8] == b"TDLRING1":
            data[off : off + 8] = b"TDLRING9"
    path.write_bytes(bytes(data))
    with pytest.raises(Corrupt, match=r"bad magic b'TDLRING9'.*format=true"):
        tidelog.open(ring_uri(path))
    assert path.read_bytes() == bytes(data)


@pytest.mark.parametrize("content", ["random", "text"])
def test_BDEV_11_foreign_data_is_never_overwritten(tmp_path: Path, content: str) -> None:
    """BDEV-11: a file that is not a ring is Corrupt with a hint, and stays byte-identical;
    format=true formats it."""
    path = tmp_path / "data.bin"
    data = os.urandom(64 << 10) if content == "random" else b"precious\n" * 8000
    path.write_bytes(data)
    for options in ({}, {"size": len(data)}, {"page_size": 512}):
        with pytest.raises(Corrupt, match="format=true"):
            tidelog.open(ring_uri(path, **options))
        assert path.read_bytes() == data
    with tidelog.open(ring_uri(path, format="true", page_size=512, topic="t")) as store:
        assert store.describe()["formatted"] is True
        store.topic("t").append(b"x")
    with tidelog.open(ring_uri(path)) as store:
        assert store.topic("t").state().head_seq == 1


def test_BDEV_11_empty_and_zero_images_are_formatted(tmp_path: Path) -> None:
    """BDEV-11: an empty file needs size (then it is formatted); an all-zero file is formatted."""
    empty = tmp_path / "empty.img"
    empty.write_bytes(b"")
    with pytest.raises(BadOption, match="empty"):
        tidelog.open(ring_uri(empty))
    with tidelog.open(ring_uri(empty, size=16384, page_size=512)) as store:
        assert store.describe()["page_count"] == 24
    zero = tmp_path / "zero.img"
    zero.write_bytes(bytes(20000))
    with tidelog.open(ring_uri(zero, page_size=512)) as store:
        assert store.describe()["formatted"] is True


def test_BDEV_11_RING_5_format_zeroes_first_pages_and_old_rings_vanish(tmp_path: Path) -> None:
    """BDEV-11, RING-5: format=true on a device full of an old ring's pages (and garbage):
    pages 0 and 1 are zeroed, the new ring id invalidates every old page: the ring is empty."""
    path = tmp_path / "dev.img"
    make_ring(path, pages=8)
    with tidelog.open(ring_uri(path), clock=FakeClock(1)) as store:
        t = store.topic("t")
        for i in range(20):
            t.append(bytes([i]) * 100)
    data = bytearray(path.read_bytes())
    data[4096 + 5 * 512 : 4096 + 6 * 512] = os.urandom(512)
    path.write_bytes(bytes(data))
    with tidelog.open(ring_uri(path, format="true", topic="t")) as store:
        assert store.topics() == []
        store.topic("t")
        assert store.topic("t").state().head_seq == 0
    after = path.read_bytes()
    assert after[4096 : 4096 + 2 * 512] == bytes(1024)
    assert after[4096 + 2 * 512 :] == bytes(data[4096 + 2 * 512 :])  # nothing else written
    with tidelog.open(ring_uri(path)) as store:
        assert store.topic("t").read() == []


def test_BDEV_12_BDEV_13_mismatches_are_bad_option_and_change_nothing(tmp_path: Path) -> None:
    """BDEV-12, BDEV-13: page size, size or topic other than the stored ones: bad_option; a
    device too small for any ring: bad_option; nothing is written."""
    path = tmp_path / "r.img"
    make_ring(path)
    before = path.read_bytes()
    for options, message in [
        ({"page_size": 1024}, "512-byte pages"),
        ({"size": 1 << 20}, "bytes; size="),
        ({"topic": "other"}, "bound to topic 't'"),
    ]:
        with pytest.raises(BadOption, match=message):
            tidelog.open(ring_uri(path, **options))
        assert path.read_bytes() == before
    small = tmp_path / "small.img"
    with pytest.raises(BadOption, match="too small"):
        tidelog.open(ring_uri(small, size=4096 + 1024, page_size=1024))


def test_BDEV_12_truncated_ring_is_corrupt(tmp_path: Path) -> None:
    """BDEV-12: a ring whose pages do not fit the image any more (truncated) is Corrupt."""
    path = tmp_path / "r.img"
    make_ring(path)
    os.truncate(path, 4096 + 4 * 512)
    before = path.read_bytes()
    with pytest.raises(Corrupt, match="truncated"):
        tidelog.open(ring_uri(path))
    assert path.read_bytes() == before


def test_BDEV_3_newer_version_is_refused_untouched(tmp_path: Path) -> None:
    """BDEV-3: a ring written by a newer format version is refused (version named), untouched."""
    path = tmp_path / "r.img"
    make_ring(path)
    data = bytearray(path.read_bytes())
    for off in (0, SLOT_BYTES):
        if data[off : off + 8] == b"TDLRING1":
            data[off + 8] = 2
    path.write_bytes(bytes(data))
    with pytest.raises(Corrupt, match="unsupported ring format version 2"):
        tidelog.open(ring_uri(path))
    assert path.read_bytes() == bytes(data)


def test_BDEV_2_BDEV_4_torn_newest_slot_falls_back(tmp_path: Path) -> None:
    """BDEV-2, BDEV-4: slots alternate; a torn newest slot leaves the previous one in force."""
    path = tmp_path / "r.img"
    make_ring(path)
    data = bytearray(path.read_bytes())
    slots = [decode_slot(bytes(data[i * SLOT_BYTES : (i + 1) * SLOT_BYTES]), i) for i in (0, 1)]
    newest = max(slots, key=lambda s: s.generation)
    older = min(slots, key=lambda s: s.generation)
    assert newest.generation == older.generation + 1
    i = slot_index(newest.generation)
    data[i * SLOT_BYTES + 600 : i * SLOT_BYTES + 700] = os.urandom(100)  # torn
    path.write_bytes(bytes(data))
    with tidelog.open(ring_uri(path)) as store:
        assert any("torn" in w for w in store.describe()["warnings"])  # type: ignore[union-attr]
        assert store.topic("t").state().head_seq == 3  # the records are in the pages


def test_BDEV_8_records_never_span_pages(tmp_path: Path) -> None:
    """BDEV-8, RET-5: max_record_bytes is page_size - 80; a tag or node can make a record too
    large; a batch that would overwrite itself is too_large; nothing is assigned."""
    path = tmp_path / "r.img"
    make_ring(path, pages=4)
    with tidelog.open(ring_uri(path)) as store:
        t = store.topic("t")
        assert store.describe()["max_record_bytes"] == 432
        t.append(b"x" * 432)
        with pytest.raises(TooLarge):
            t.append(b"x" * 433)
        with pytest.raises(TooLarge, match="tag"):
            t.append(b"x" * 420, tag="t" * 20)
        with pytest.raises(TooLarge, match="overwrite itself"):
            t.append_many([b"y" * 400] * 4)
        assert t.state().head_seq == 4
        t.append_many([b"y" * 400] * 3)
        assert t.state().head_seq == 7


def test_BDEV_11_locked(tmp_path: Path) -> None:
    """BDEV-11: one store per device or image: a second opener gets Locked."""
    path = tmp_path / "r.img"
    make_ring(path)
    with tidelog.open(ring_uri(path)), pytest.raises(Locked):
        tidelog.open(ring_uri(path))


# -- the spec and the tests agree ------------------------------------------------------------
REPO = Path(__file__).resolve().parent.parent.parent
SPEC = REPO / "spec" / "FORMATS-blockdev.md"


def test_BDEV_3_BDEV_7_golden_examples_in_the_spec() -> None:
    """BDEV-3, BDEV-7, BDEV-8, BDEV-9: the worked examples printed in the spec are the bytes
    the codecs produce."""
    text = SPEC.read_text("utf-8")
    blocks = {"".join(b.split()) for b in re.findall(r"```\n([0-9a-f \n]+)```", text)}
    body = encode_record(0, None, None, b"x", False) + encode_record(
        1700000000123, b"t", None, b"hi", True
    )
    page = encode_page(512, RING_ID, body, PageHeader(5, 3, 4, 2, 2, 16, 1, PAGE_PARTIAL, 0))
    slot = encode_slot(Slot(1, RING_ID, 512, 8, 0, False, {"topic": "t"}))
    assert {page[-64:].hex(), slot[:52].hex()} <= blocks
    inline = "".join(re.findall(r"`([0-9a-f ]+)`", text)).replace(" ", "")
    for golden in (encode_record(1700000000123, b"t", None, b"hi", True), encode_mark(b"p0", 7,
                   carried=False), encode_record(0, None, None, b"x", False)):  # fmt: skip
        assert golden.hex() in inline
    assert slot[-4:].hex() in text


def test_BDEV_4_BDEV_18_worst_case_metadata_fits_the_slot() -> None:
    """BDEV-4, BDEV-18, BDEV-19: the longest topic name, every config field at its widest,
    MAX_SUBSCRIBERS subscribers with 64-character names, 20-digit seqs and gaps, and the write
    counters at u64 max still fit one slot; outcomes and trimmed ranges that do not fit are left
    out (largest first), never the progress itself."""
    from tidelog.backends.blockdev.format import SLOT_BODY_MAX, dumps_body
    from tidelog.backends.blockdev.meta import IO_RESERVE, MAX_SUBSCRIBERS, build_body
    from tidelog.backends.common.engine import EngineTopic
    from tidelog.config import TopicConfig

    big = 2**64 - 1
    name = "t" * 200
    config = TopicConfig(
        durability="memory", cap_records=big, cap_bytes=big, ttl_ms=big, discard="reject",
        retention="drop_oldest", trim="acked", lease_ms=big, max_deliveries=None,
        dead_letter=None, backpressure_wait_ms=big,
    )  # fmt: skip
    t = EngineTopic(name, config, big)
    for i in range(MAX_SUBSCRIBERS):
        s = t.progress.add(f"{i}" + "s" * 63, big - 10**6)
        s.hwm, s.gaps = big - 10**6, [(big - 10, big - 1)]
        s.outcomes = {big - 10**6 + 2 * k: "acked" for k in range(1, 30 + 10 * i)}
    facts = {"head": big, "floor": big, "last_ts": big,
             "trimmed": [[big - 100 * k, big - 100 * k + 50] for k in range(40)]}  # fmt: skip
    body = build_body(name, big, t, facts, big, 65533)
    full = dumps_body({**body, "io": [big] * 7})
    assert len(full) <= SLOT_BODY_MAX and len(dumps_body(body)) + IO_RESERVE <= SLOT_BODY_MAX
    assert len(body["subs"]) == MAX_SUBSCRIBERS
    assert all(s["hwm"] == big - 10**6 and s["gap"] for s in body["subs"].values())
    assert body["state"]["trimmed"] == []  # left out last, after every subscriber's outcomes
    assert not any("acked" in s for s in body["subs"].values())
    few = {k: v for k, v in list(t.progress.subs.items())[:1]}
    t.progress.subs = few
    kept = build_body(name, big, t, {**facts, "trimmed": facts["trimmed"][:5]}, big, 65533)
    assert len(kept["state"]["trimmed"]) == 5 and all("acked" in s for s in kept["subs"].values())


@pytest.mark.parametrize(
    ("gaps", "stored"),
    [([], None), ([(3, 4)], [3, 4]), ([(3, 4), (7, 7), (9, 12)], [[3, 4], [7, 7], [9, 12]])],
)
def test_BDEV_29_SUB_7_slot_gap_forms_round_trip(
    gaps: list[tuple[int, int]], stored: object
) -> None:
    """BDEV-29, SUB-7: none, one or three gaps are stored as null, [lo, hi] (what every earlier
    version wrote) and a list of pairs, and read back as the same gaps."""
    from tidelog.backends.blockdev.meta import gap_json, gaps_of

    assert gap_json(gaps) == stored
    assert gaps_of(stored) == gaps


@pytest.mark.parametrize(
    "bad",
    [
        [[3, 4]],  # a list of fewer than two pairs
        [0, 4],
        [5, 4],
        [[3, 4], [4, 6]],  # overlapping
        [[7, 9], [3, 4]],  # out of order
        [[3, 4], [6]],
        [[3, 4], 6],
        [3, True],
        "3..4",
        [3, 4, 5],
    ],
)
def test_BDEV_29_a_bad_slot_gap_makes_the_body_unusable(bad: object) -> None:
    """BDEV-29, BDEV-4: a "gap" in none of BDEV-29's forms makes the slot body unusable
    (recovery refuses it as damage), never read as some other gap."""
    from tidelog.backends.blockdev.damage import body_problem

    body = {"topic": "t", "subs": {"s": {"base": 0, "hwm": 0, "gap": bad}}}
    problem = body_problem(body)
    assert problem is not None and "gap" in problem
    assert body_problem({**body, "subs": {"s": {"base": 0, "hwm": 0, "gap": [3, 4]}}}) is None


def test_BDEV_29_gaps_that_do_not_fit_the_slot_are_merged() -> None:
    """BDEV-29, BDEV-4: a subscriber whose gaps do not fit the slot even without outcomes and
    trimmed ranges is written with them merged into one (at-least-once), never refused."""
    from tidelog.backends.blockdev.format import SLOT_BODY_MAX, dumps_body
    from tidelog.backends.blockdev.meta import IO_RESERVE, build_body
    from tidelog.backends.common.engine import EngineTopic
    from tidelog.config import TopicConfig

    t = EngineTopic("t", TopicConfig(), 1)
    s = t.progress.add("s", 0)
    s.gaps = [(10**9 + 3 * k, 10**9 + 3 * k + 1) for k in range(200)]
    few = t.progress.add("f", 0)
    few.gaps = [(1, 2), (5, 6)]
    body = build_body("t", 1, t, {"head": 2 * 10**9, "floor": 1, "last_ts": None,
                                  "trimmed": []}, 0, 0)  # fmt: skip
    assert len(dumps_body(body)) + IO_RESERVE <= SLOT_BODY_MAX
    assert body["subs"]["s"]["gap"] == [10**9, 10**9 + 3 * 199 + 1]
    assert body["subs"]["f"]["gap"] == [1, 6]
    few.gaps = few.gaps[:1]
    s.gaps = s.gaps[:3]
    body = build_body("t", 1, t, {"head": 2 * 10**9, "floor": 1, "last_ts": None,
                                  "trimmed": []}, 0, 0)  # fmt: skip
    assert body["subs"]["s"]["gap"] == [[a, b] for a, b in s.gaps]
    assert body["subs"]["f"]["gap"] == [1, 2]
