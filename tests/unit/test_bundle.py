"""Arrow RecordBundles (tidelog.bundle) and the bundle record payload (spec/BUNDLES.md BND-*)."""

from __future__ import annotations

import hashlib
import struct
from pathlib import Path

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import tidelog
from tidelog.bundle import (
    HEADER_SIZE,
    MAGIC,
    SLOT_META_SIZE,
    BundleRecord,
    RecordBundle,
    decode_bundle,
    encode_bundle,
    is_bundle,
    read_slot_metas,
    schema_fingerprint,
)
from tidelog.errors import BadArgument, Corrupt
from tidelog.records import Tombstone


def dict_col(values: list[str], index_type: pa.DataType) -> pa.DictionaryArray:
    keys = sorted(set(values))
    indices = pa.array([keys.index(v) for v in values], index_type)
    return pa.DictionaryArray.from_arrays(indices, pa.array(keys))


def sample() -> RecordBundle:
    logs = pa.record_batch(
        {
            "body": pa.array(["a", None, "c"]),
            "level": dict_col(["info", "warn", "info"], pa.int8()),
            "n": pa.array([1, 2, 3], pa.uint64()),
        },
        metadata={b"origin": b"test"},
    )
    attrs = pa.record_batch({"key": dict_col(["k1", "k2"], pa.uint16()), "v": [1.5, None]})
    return RecordBundle({0: logs, 5: attrs}, payload_types={5: 1234})


# -- BND-1..BND-5: the byte layout -----------------------------------------------------------------
def test_BND_1_to_5_layout_byte_by_byte() -> None:
    """BND-1 header, BND-2 bitmap, BND-3 metadata blocks + IPC streams in ascending slot order,
    BND-4 fingerprints, BND-5 nothing after the last slot."""
    b = sample()
    payload = encode_bundle(b)
    magic, version, header_size, bitmap = struct.unpack_from("<4sHHQ", payload, 0)
    assert (magic, version, header_size) == (b"TDLB", 1, 16)
    assert bitmap == (1 << 0) | (1 << 5)
    off = HEADER_SIZE
    for slot, type_id in ((0, 0), (5, 1234)):
        t, fp, rows, length = struct.unpack_from("<H32sII", payload, off)
        off += SLOT_META_SIZE
        stream = payload[off : off + length]
        batch = b[slot]
        assert batch is not None
        assert (t, rows) == (type_id, batch.num_rows)
        assert (
            fp
            == hashlib.sha256(batch.schema.serialize()).digest()
            == schema_fingerprint(batch.schema)
        )
        assert stream[: len(batch.schema.serialize())] == batch.schema.serialize().to_pybytes()
        assert pa.ipc.open_stream(stream).read_all().to_batches()[0].equals(batch)
        off += length
    assert off == len(payload)
    metas = read_slot_metas(payload)
    assert [(m.slot, m.payload_type_id, m.row_count) for m in metas] == [(0, 0, 3), (5, 1234, 2)]


def test_BND_5_empty_bundle_is_the_bare_header() -> None:
    payload = encode_bundle(RecordBundle())
    assert payload == MAGIC + struct.pack("<HHQ", 1, 16, 0)
    assert decode_bundle(payload) == RecordBundle()
    assert is_bundle(payload) and not is_bundle(b"TDLX" + payload[4:]) and not is_bundle(b"")


# -- BND-7: fidelity, drift ------------------------------------------------------------------------
def test_BND_7_round_trip_keeps_dictionary_key_types_and_metadata() -> None:
    b = sample()
    back = decode_bundle(encode_bundle(b))
    assert back == b
    logs, attrs = back[0], back[5]
    assert logs is not None and attrs is not None
    assert logs.schema.field("level").type == pa.dictionary(pa.int8(), pa.string())
    assert attrs.schema.field("key").type == pa.dictionary(pa.uint16(), pa.string())
    assert logs.schema.metadata == {b"origin": b"test"}
    assert logs.schema.field("n").type == pa.uint64()
    assert back.payload_type(5) == 1234 and back.payload_type(0) == 0
    assert back[1] is None and back.present() == [0, 5] and back.num_rows == 5


def test_BND_7_zero_copy_decode_references_the_payload() -> None:
    big = pa.record_batch({"x": pa.array(range(10_000), pa.int64())})
    buf = pa.py_buffer(encode_bundle(RecordBundle([big])))
    back = decode_bundle(buf)[0]
    assert back is not None
    data = back.column(0).buffers()[1]
    assert buf.address <= data.address < buf.address + buf.size


def test_BND_7_schema_drift_between_bundles_in_one_topic(tmp_path: Path) -> None:
    """A slot's schema may change from one bundle to the next; each reads back as written."""
    v1 = pa.record_batch({"a": pa.array([1], pa.int32())})
    v2 = pa.record_batch({"a": pa.array([2], pa.int64()), "b": ["new"]})
    v3 = pa.record_batch({"a": dict_col(["x", "y"], pa.int16())})
    with tidelog.open(f"file://{tmp_path / 's'}") as store:
        t = store.topic("t")
        for batch in (v1, v2, v3):
            t.append_bundle(RecordBundle([batch]))
    with tidelog.open(f"file://{tmp_path / 's'}") as store:
        got = store.topic("t").read_bundles()
    assert [type(g) for g in got] == [BundleRecord] * 3
    assert [g.bundle[0] for g in got] == [v1, v2, v3]  # type: ignore[union-attr]
    assert [g.bundle[0].schema for g in got] == [v1.schema, v2.schema, v3.schema]  # type: ignore[union-attr]


_types = st.sampled_from(
    [pa.int8(), pa.uint8(), pa.int16(), pa.uint16(), pa.int32(), pa.uint32(), pa.int64()]
)


@settings(max_examples=40, deadline=None)
@given(
    slots=st.dictionaries(
        st.integers(0, 63),
        st.tuples(_types, st.lists(st.sampled_from(["p", "q", "r", None]), max_size=8)),
        max_size=4,
    ),
    payload_type=st.integers(0, 0xFFFF),
)
def test_BND_7_round_trip_property(
    slots: dict[int, tuple[pa.DataType, list[str | None]]], payload_type: int
) -> None:
    """Any slots, any dictionary key type, nulls, empty batches: decode(encode(b)) == b and
    re-encoding is byte-stable (QSEG-9 relies on it)."""
    batches = {}
    for slot, (index_type, values) in slots.items():
        keys = sorted({v for v in values if v is not None})
        indices = pa.array([None if v is None else keys.index(v) for v in values], index_type)
        batches[slot] = pa.record_batch(
            {
                "d": pa.DictionaryArray.from_arrays(indices, pa.array(keys, pa.string())),
                "s": pa.array(values, pa.string()),
            }
        )
    types = {s: payload_type for s in list(batches)[:1]}
    b = RecordBundle(batches, payload_types=types)
    payload = encode_bundle(b)
    back = decode_bundle(payload)
    assert back == b
    assert encode_bundle(back) == payload


# -- BND-1, BND-3..BND-6: typed errors for garbage -------------------------------------------------
def corrupt_cases() -> dict[str, tuple[bytes, str]]:
    good = encode_bundle(sample())
    metas = read_slot_metas(good)
    first = metas[0]
    meta_at = first.payload_offset - SLOT_META_SIZE
    cases: dict[str, tuple[bytes, str]] = {
        "short": (good[:10], "BND-1"),
        "magic": (b"XXXX" + good[4:], "BND-1"),
        "version": (good[:4] + struct.pack("<H", 2) + good[6:], "BND-1"),
        "header_size": (good[:6] + struct.pack("<H", 8) + good[8:], "BND-1"),
        "meta_cut": (good[: HEADER_SIZE + 10], "BND-3"),
        "payload_len": (
            good[: meta_at + 38] + struct.pack("<I", 1 << 30) + good[meta_at + 42 :],
            "BND-3",
        ),
        "trailing": (good + b"\0", "BND-5"),
        "fingerprint": (
            good[: meta_at + 2] + b"\0" * 32 + good[meta_at + 34 :],
            "BND-4",
        ),
        "row_count": (
            good[: meta_at + 34] + struct.pack("<I", 99) + good[meta_at + 38 :],
            "BND-3",
        ),
    }
    # bad IPC body: keep the schema message (so the fingerprint still matches), break the rest
    schema_len = len(sample()[0].schema.serialize())  # type: ignore[union-attr]
    body_at = first.payload_offset + schema_len
    cases["ipc"] = (good[:body_at] + b"\x07" * 16 + good[body_at + 16 :], "BND-6")
    # two batches in one slot stream
    batch = pa.record_batch({"x": [1]})
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, batch.schema) as w:
        w.write_batch(batch)
        w.write_batch(batch)
    stream = sink.getvalue().to_pybytes()
    fp = hashlib.sha256(batch.schema.serialize()).digest()
    two = struct.pack("<4sHHQ", MAGIC, 1, 16, 1) + struct.pack("<H32sII", 0, fp, 1, len(stream))
    cases["two_batches"] = (two + stream, "BND-6")
    return cases


@pytest.mark.parametrize("case", sorted(corrupt_cases()))
def test_BND_6_garbage_raises_corrupt_naming_the_rule(case: str) -> None:
    payload, rule = corrupt_cases()[case]
    with pytest.raises(Corrupt, match=rule):
        decode_bundle(payload)


def test_BND_8_bad_arguments_are_bad_argument() -> None:
    batch = pa.record_batch({"x": [1]})
    with pytest.raises(BadArgument, match=r"0\.\.63"):
        RecordBundle({64: batch})
    with pytest.raises(BadArgument, match=r"0\.\.63"):
        RecordBundle({-1: batch})
    with pytest.raises(BadArgument, match="RecordBatch"):
        RecordBundle({0: pa.table({"x": [1]})})  # type: ignore[dict-item]
    with pytest.raises(BadArgument, match="u16"):
        RecordBundle({0: batch}, payload_types={0: 70_000})
    with pytest.raises(BadArgument, match="no batch"):
        RecordBundle({0: batch}, payload_types={1: 3})
    with pytest.raises(BadArgument, match="RecordBundle"):
        encode_bundle({0: batch})  # type: ignore[arg-type]
    with pytest.raises(BadArgument, match="bytes-like"):
        decode_bundle(12)


# -- BND-8: the Topic API --------------------------------------------------------------------------
def test_BND_8_append_bundle_and_read_bundles(tmp_path: Path) -> None:
    """append_bundle returns a seq; with a producer it has append_many semantics (TOP-11);
    read_bundles decodes records and passes tombstones through (TMB-1)."""
    b = sample()
    with tidelog.open(f"file://{tmp_path / 's'}") as store:
        t = store.topic("b", cap_records=2)  # no subscriber: the cap evicts (RET-2)
        assert t.append_bundle(b, tag="x") == 1
        assert t.append_bundle(b, producer=("job", 1)) == [2]
        assert t.append_bundle(b, producer=("job", 1)) == []  # a retry: applied once
        assert t.append_bundle(RecordBundle(), node="n") == 3
        items = t.read_bundles(after=0)
    assert items[0] == Tombstone(1, 1)
    assert isinstance(items[1], BundleRecord) and items[1].seq == 2 and items[1].bundle == b
    assert isinstance(items[2], BundleRecord) and items[2].node == "n"
    assert items[2].bundle == RecordBundle()


def test_BND_8_read_bundles_names_the_seq_of_a_non_bundle_payload() -> None:
    with tidelog.open("memory://") as store:
        t = store.topic("b")
        t.append_bundle(sample())
        t.append(b"plain bytes")
        with pytest.raises(Corrupt, match=r"seq 2.*BND-1"):
            t.read_bundles()
        assert len(t.read_bundles(limit=1)) == 1


# -- the spec itself -------------------------------------------------------------------------------
REPO = Path(__file__).resolve().parent.parent.parent


def test_BND_worked_example_in_the_spec_matches() -> None:
    """BND-1..BND-4: the worked example printed in spec/BUNDLES.md is what encode_bundle
    writes for slot 0 = {x: int8 [7]}."""
    payload = encode_bundle(RecordBundle({0: pa.record_batch({"x": pa.array([7], pa.int8())})}))
    text = (REPO / "spec" / "BUNDLES.md").read_text(encoding="utf-8")
    assert "(346 bytes in all)" in text and len(payload) == 346
    example = text[text.index("54444c42 0100 1000") :]
    lines = [line.split("   ")[0].strip() for line in example.splitlines()[:2]]
    assert bytes.fromhex("".join(lines[0].split())) == payload[:16]
    assert bytes.fromhex("".join(lines[1].split())) == payload[16:58]
