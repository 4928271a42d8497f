"""Quiver ``.qseg`` segment files (tidelog.backends.file.format.qseg; spec/BUNDLES.md QSEG-*).

The golden vector ``golden/qseg-v1.qseg`` was written by ``build_qseg(*golden_input())``
(regenerate with ``python tests/unit/test_qseg.py``, only after a deliberate format change).
"""

from __future__ import annotations

import hashlib
import struct
import sys
import zlib
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.ipc as ipc
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tidelog.backends.file.format import qseg
from tidelog.backends.file.format.qseg import (
    ArrowError,
    ChecksumMismatch,
    InvalidFormat,
    QsegError,
    SlotNotInBundle,
    StreamNotFound,
    Truncated,
    build_qseg,
    open_qseg,
    open_qseg_file,
    parse_qseg_name,
    qseg_name,
)
from tidelog.bundle import BundleRecord, RecordBundle, encode_bundle, schema_fingerprint
from tidelog.errors import BadArgument, Corrupt

GOLDEN = Path(__file__).parent / "golden" / "qseg-v1.qseg"
GOLDEN_PYARROW_MAJOR = 26  # the writer that produced the vector (IPC bytes are per-version)


def dict_col(indices: list[int | None], index_type: pa.DataType, values: list[str]) -> pa.Array:
    return pa.DictionaryArray.from_arrays(pa.array(indices, index_type), pa.array(values))


def golden_input() -> tuple[list[RecordBundle | None], int, dict[str, list[Any]]]:
    b0 = RecordBundle(
        {
            0: pa.record_batch({"v": pa.array([1, 2], pa.int32())}),
            1: pa.record_batch({"k": dict_col([0, 1], pa.int8(), ["a", "b"])}),
        }
    )
    b1 = RecordBundle({0: pa.record_batch({"v": pa.array([3], pa.int32())})}, payload_types={0: 9})
    labels = {"tss": [1000, None, 1002], "tags": ["t", None, None], "nodes": [None, None, "n"]}
    return [b0, None, b1], 7, labels


# -- golden vector ---------------------------------------------------------------------------------
def test_QSEG_golden_vector_reads_back_exactly() -> None:
    """QSEG-1..QSEG-8: the checked-in file opens and gives back every bundle and label."""
    bundles, _, _ = golden_input()
    data = GOLDEN.read_bytes()
    r = open_qseg(data)
    assert (r.first_seq, r.last_seq, len(r)) == (7, 9, 3)
    assert [r.bundle(i) for i in range(3)] == bundles
    assert r.record(0) == BundleRecord(7, 1000, "t", None, bundles[0])  # type: ignore[arg-type]
    assert r.record(1) is None and not r.has_bundle(1)
    assert r.labels(2) == (1002, None, "n")
    # trailer and footer, byte by byte (QSEG-7, QSEG-8)
    footer_size, magic, crc = struct.unpack_from("<I8sI", data, len(data) - 16)
    assert (footer_size, magic) == (34, b"QUIVER\x00S")
    assert crc == zlib.crc32(data[:-4])
    foot = struct.unpack_from("<HIIQIQI", data, len(data) - 16 - 34)
    version, streams, n_bundles, dir_off, dir_len, man_off, man_len = foot
    # streams: (slot 0, fp A, type 0), (slot 1, fp B), (slot 0, fp A, type 9): three keys
    assert (version, streams, n_bundles) == (1, 3, 3)
    assert dir_off % 64 == 0 and man_off % 64 == 0
    assert dir_off + dir_len <= man_off and man_off + man_len == len(data) - 16 - 34


def test_QSEG_golden_vector_builds_byte_identical() -> None:
    """The writer is deterministic: the same input gives the same bytes, and with the Arrow
    major version that wrote the checked-in vector, exactly those bytes. Another Arrow release
    may legitimately encode IPC bodies differently; then the file it builds must still decode
    to exactly what the golden vector decodes to (the compatibility that matters)."""
    bundles, first_seq, labels = golden_input()
    built = build_qseg(bundles, first_seq, **labels)
    assert build_qseg(bundles, first_seq, **labels) == built
    golden = GOLDEN.read_bytes()
    if int(pa.__version__.split(".")[0]) == GOLDEN_PYARROW_MAJOR:
        assert built == golden
    assert _decoded(built) == _decoded(golden)


def _decoded(data: bytes) -> list[Any]:
    """Every record of a .qseg: (seq, labels, bundle or None)."""
    r = open_qseg(data)
    return [(r.first_seq + i, r.labels(i), r.bundle(i)) for i in range(len(r))]


# -- round trips -----------------------------------------------------------------------------------
_index_types = st.sampled_from([pa.int8(), pa.uint8(), pa.int16(), pa.uint16(), pa.int32()])


@st.composite
def bundles(draw: st.DrawFn) -> list[RecordBundle | None]:
    out: list[RecordBundle | None] = []
    for _ in range(draw(st.integers(1, 6))):
        if draw(st.integers(0, 9)) == 0:
            out.append(None)
            continue
        slots: dict[int, pa.RecordBatch] = {}
        for slot in draw(st.sets(st.integers(0, 3), max_size=3)):
            n = draw(st.integers(0, 4))
            cols: dict[str, pa.Array] = {"x": pa.array(range(n), pa.int64())}
            if draw(st.booleans()):  # drift: an optional column
                cols["y"] = pa.array([draw(st.sampled_from(["a", None]))] * n)
            vocab = draw(st.sampled_from([["a", "b"], ["b", "c", "d"]]))  # dictionary changes
            cols["d"] = dict_col([i % len(vocab) for i in range(n)], draw(_index_types), vocab)
            slots[slot] = pa.record_batch(cols)
        out.append(RecordBundle(slots))
    return out


@settings(max_examples=40, deadline=None)
@given(items=bundles(), first_seq=st.integers(1, 2**40))
def test_QSEG_round_trip_property(items: list[RecordBundle | None], first_seq: int) -> None:
    """QSEG-4, QSEG-6, QSEG-9: any mix of slots, schema drift, dictionary key types and
    dictionary changes: every bundle comes back exactly, and its payload byte-identical."""
    data = build_qseg(items, first_seq)
    r = open_qseg(data)
    assert r.first_seq == first_seq and len(r) == len(items)
    for i, b in enumerate(items):
        assert r.bundle(i) == b
        assert r.payload(i) == (None if b is None else encode_bundle(b))
    # payloads (what the store holds) seal the same as the bundles they encode
    payloads = [None if b is None else encode_bundle(b) for b in items]
    assert build_qseg(payloads, first_seq) == data


def test_QSEG_4_one_stream_per_slot_schema_and_dictionary() -> None:
    """QSEG-4: chunks of one (slot, payload type, fingerprint) share a stream while their
    dictionaries are equal; drift or new dictionary values open a new stream; key types stay."""
    a = pa.record_batch({"k": dict_col([0, 1], pa.int8(), ["a", "b"])})
    a2 = pa.record_batch({"k": dict_col([1, 1], pa.int8(), ["a", "b"])})  # same dictionary
    b = pa.record_batch({"k": dict_col([0], pa.int8(), ["z"])})  # same schema, new values
    c = pa.record_batch({"k": dict_col([0], pa.uint16(), ["a"])})  # drift: key type
    items = [RecordBundle([x]) for x in (a, a2, b, a, c)]
    r = open_qseg(build_qseg(items, 1))
    keys = [(s.slot, s.schema_fingerprint, s.chunk_count, s.row_count) for s in r.streams]
    fa, fc = schema_fingerprint(a.schema), schema_fingerprint(c.schema)
    assert keys == [(0, fa, 2, 4), (0, fa, 1, 1), (0, fa, 1, 2), (0, fc, 1, 1)]
    assert [r.bundle(i) for i in range(5)] == items
    assert r.slot_batches(0)[4].schema.field("k").type == pa.dictionary(pa.uint16(), pa.string())


def test_QSEG_2_3_5_streams_are_aligned_standalone_arrow_files() -> None:
    """QSEG-2: each stream is a complete Arrow IPC file; QSEG-3: at a 64-byte boundary, zero
    padding between; QSEG-5: the directory describes it."""
    items, first_seq, labels = golden_input()
    data = build_qseg(items, first_seq, **labels)
    r = open_qseg(data)
    end = 0
    for s in r.streams:
        assert s.byte_offset % 64 == 0
        assert data[end : s.byte_offset] == b"\0" * (s.byte_offset - end)
        f = ipc.open_file(pa.py_buffer(data[s.byte_offset : s.byte_offset + s.byte_length]))
        assert f.num_record_batches == s.chunk_count
        assert schema_fingerprint(f.schema) == s.schema_fingerprint
        end = s.byte_offset + s.byte_length
    foot = struct.unpack_from("<HIIQIQI", data, len(data) - 50)
    directory = ipc.open_stream(pa.py_buffer(data[foot[3] : foot[3] + foot[4]])).read_all()
    manifest = ipc.open_stream(pa.py_buffer(data[foot[5] : foot[5] + foot[6]])).read_all()
    assert directory.schema.equals(qseg.DIRECTORY_SCHEMA)
    assert manifest.schema.equals(qseg.MANIFEST_SCHEMA)
    assert directory.column("stream_id").to_pylist() == [0, 1, 2]
    assert directory.column("payload_type_id").to_pylist() == [0, 1, 9]
    assert manifest.column("seq").to_pylist() == [7, 8, 9]
    assert manifest.column("slot_refs").to_pylist() == [
        [
            {"slot_id": 0, "stream_id": 0, "chunk_index": 0},
            {"slot_id": 1, "stream_id": 1, "chunk_index": 0},
        ],
        None,
        [{"slot_id": 0, "stream_id": 2, "chunk_index": 0}],
    ]


def test_QSEG_6_slot_access_and_SlotNotInBundle() -> None:
    items, first_seq, labels = golden_input()
    r = open_qseg(build_qseg(items, first_seq, **labels))
    assert [b.num_rows for b in r.slot_batches(0)] == [2, 1]
    assert [i for i, _ in r.iter_slot(1)] == [0]
    assert r.slot_chunk(0, 1).equals(items[0][1])  # type: ignore[index]
    with pytest.raises(SlotNotInBundle, match="bundle 2 has no slot 1"):
        r.slot_chunk(2, 1)
    with pytest.raises(BadArgument):
        r.bundle(3)
    assert [s.stream_id for s, _ in r.slot_streams(0)] == [0, 2]


def test_QSEG_11_mmap_reads_are_zero_copy(tmp_path: Path) -> None:
    big = pa.record_batch({"x": pa.array(range(50_000), pa.int64())})
    path = tmp_path / qseg_name(1)
    path.write_bytes(build_qseg([RecordBundle([big]), RecordBundle([big])], 1))
    r = open_qseg_file(str(path))
    lo, hi = r.buffer.address, r.buffer.address + r.buffer.size
    for batch in r.slot_batches(0):
        assert lo <= batch.column(0).buffers()[1].address < hi
        assert batch.equals(big)


def test_QSEG_10_file_names() -> None:
    assert qseg_name(42) == "seg-00000000000000000042.qseg"
    assert parse_qseg_name("seg-00000000000000000042.qseg") == 42
    assert parse_qseg_name("seg-42.qseg") is None
    assert parse_qseg_name("seg-00000000000000000042.data") is None


def test_QSEG_9_a_payload_that_does_not_re_encode_identically_is_refused() -> None:
    """Sealing must not change a payload's bytes (TOP-5): one written with the pre-1.0 IPC
    framing decodes fine but re-encodes differently, so build_qseg refuses it."""
    batch = pa.record_batch({"x": [1, 2]})
    sink = pa.BufferOutputStream()
    legacy = ipc.IpcWriteOptions(use_legacy_format=True)
    with ipc.new_stream(sink, batch.schema, options=legacy) as w:
        w.write_batch(batch)
    stream = sink.getvalue().to_pybytes()
    (length,) = struct.unpack_from("<i", stream, 0)
    fp = hashlib.sha256(stream[: 4 + length]).digest()
    payload = (
        b"TDLB" + struct.pack("<HHQ", 1, 16, 1) + struct.pack("<H32sII", 0, fp, 2, len(stream))
    ) + stream
    from tidelog.bundle import decode_bundle

    assert decode_bundle(payload)[0] == batch
    with pytest.raises(BadArgument, match="QSEG-9"):
        build_qseg([payload], 1)


def test_QSEG_build_rejects_bad_arguments() -> None:
    b = RecordBundle([pa.record_batch({"x": [1]})])
    with pytest.raises(BadArgument, match="first_seq"):
        build_qseg([b], 0)
    with pytest.raises(BadArgument, match="at least one"):
        build_qseg([], 1)
    with pytest.raises(BadArgument, match="tss"):
        build_qseg([b], 1, tss=[1, 2])
    with pytest.raises(BadArgument, match="expected a RecordBundle"):
        build_qseg([42], 1)  # type: ignore[list-item]


# -- damaged files: the error table (QSEG-7, QSEG-8) ----------------------------------------------
def reseal(body: bytes) -> bytes:
    """``body`` = everything before the crc: append a correct CRC32."""
    return body + struct.pack("<I", zlib.crc32(body))


def assemble(
    data: bytes, *, manifest: pa.RecordBatch | None = None, version: int = 1, extra: bytes = b""
) -> bytes:
    """Rebuild a valid-CRC file from ``data`` with a replaced manifest / footer version /
    footer extension: a test-side writer following QSEG-1 and QSEG-8 independently."""
    foot = list(struct.unpack_from("<HIIQIQI", data, len(data) - 50))
    body = bytearray(data[: len(data) - 50])
    if manifest is not None:
        sink = pa.BufferOutputStream()
        with ipc.new_stream(sink, manifest.schema) as w:
            w.write_batch(manifest)
        man = sink.getvalue().to_pybytes()
        del body[foot[5] :]
        body += b"\0" * (-len(body) % 64)
        foot[5], foot[6] = len(body), len(man)
        body += man
    foot[0] = version
    footer = struct.pack("<HIIQIQI", *foot) + extra
    return reseal(bytes(body) + footer + struct.pack("<I", len(footer)) + qseg.MAGIC)


def golden_bytes() -> bytes:
    items, first_seq, labels = golden_input()
    return build_qseg(items, first_seq, **labels)


def manifest_of(data: bytes) -> pa.RecordBatch:
    return open_qseg(data)._man  # the decoded manifest batch


@pytest.mark.parametrize("size", [0, 1, 15])
def test_QSEG_7_shorter_than_the_trailer_is_Truncated(size: int) -> None:
    with pytest.raises(Truncated, match="QSEG-7"):
        open_qseg(golden_bytes()[:size])


def test_QSEG_7_bad_magic_is_InvalidFormat() -> None:
    data = bytearray(golden_bytes())
    data[-12:-4] = b"QUIVER\x00X"
    with pytest.raises(InvalidFormat, match="magic"):
        open_qseg(bytes(data))
    with pytest.raises(InvalidFormat, match="magic"):  # cut anywhere: no trailer at the end
        open_qseg(golden_bytes()[:-100])


@pytest.mark.parametrize("where", [0, 100, -40, -14])
def test_QSEG_7_any_flipped_byte_is_ChecksumMismatch(where: int) -> None:
    data = bytearray(golden_bytes())
    data[where] ^= 0x40
    with pytest.raises(ChecksumMismatch, match="QSEG-7"):
        open_qseg(bytes(data))


def test_QSEG_7_bad_ipc_with_a_valid_crc_is_ArrowError() -> None:
    data = bytearray(golden_bytes())
    s = open_qseg(bytes(data)).streams[1]
    data[s.byte_offset : s.byte_offset + 6] = b"NOTARR"  # stream 1's "ARROW1" magic
    with pytest.raises(ArrowError, match="QSEG-2"):
        open_qseg(reseal(bytes(data[:-4])))
    data = bytearray(golden_bytes())
    foot = struct.unpack_from("<HIIQIQI", data, len(data) - 50)
    data[foot[3] + 8 : foot[3] + 40] = b"\xee" * 32  # the directory's IPC metadata
    with pytest.raises(ArrowError, match="QSEG-5"):
        open_qseg(reseal(bytes(data[:-4])))


def test_QSEG_6_unknown_stream_is_StreamNotFound() -> None:
    data = golden_bytes()
    man = manifest_of(data).to_pydict()
    man["slot_refs"][2] = [{"slot_id": 0, "stream_id": 99, "chunk_index": 0}]
    bad = assemble(data, manifest=pa.record_batch(man, schema=qseg.MANIFEST_SCHEMA))
    with pytest.raises(StreamNotFound, match="stream 99"):
        open_qseg(bad)


@pytest.mark.parametrize(
    "change",
    ["wrong_slot", "chunk_out_of_range", "chunk_twice", "seq_gap", "orphan_chunk"],
)
def test_QSEG_6_inconsistent_manifest_is_InvalidFormat(change: str) -> None:
    data = golden_bytes()
    man = manifest_of(data).to_pydict()
    refs = man["slot_refs"]
    if change == "wrong_slot":
        refs[0][0]["slot_id"] = 5
    elif change == "chunk_out_of_range":
        refs[0][0]["chunk_index"] = 3
    elif change == "chunk_twice":
        refs[2] = [{"slot_id": 0, "stream_id": 0, "chunk_index": 0}]
    elif change == "seq_gap":
        man["seq"][2] = 99
    else:
        refs[2] = None
    bad = assemble(data, manifest=pa.record_batch(man, schema=qseg.MANIFEST_SCHEMA))
    with pytest.raises(InvalidFormat, match="QSEG-6"):
        open_qseg(bad)


def test_QSEG_8_footer_versions() -> None:
    """An unknown footer version is refused; a v1 footer with extension bytes is read (the
    trailer's footer_size skips them)."""
    data = golden_bytes()
    with pytest.raises(InvalidFormat, match="version 2"):
        open_qseg(assemble(data, version=2))
    extended = assemble(data, extra=b"future!")
    r = open_qseg(extended)
    assert r.bundle(0) == golden_input()[0][0]
    assert struct.unpack_from("<I", extended, len(extended) - 16)[0] == 34 + 7


def test_QSEG_errors_are_corrupt_for_callers_that_skip_files() -> None:
    for cls in (Truncated, InvalidFormat, ChecksumMismatch, ArrowError, StreamNotFound):
        assert issubclass(cls, QsegError) and issubclass(cls, Corrupt)
    assert issubclass(SlotNotInBundle, BadArgument) and issubclass(SlotNotInBundle, LookupError)
    with pytest.raises(BadArgument):
        open_qseg(12345)


if __name__ == "__main__":  # regenerate the golden vector (deliberate format changes only)
    GOLDEN.parent.mkdir(exist_ok=True)
    GOLDEN.write_bytes(golden_bytes())
    print(f"wrote {GOLDEN} ({GOLDEN.stat().st_size} bytes)", file=sys.stderr)
