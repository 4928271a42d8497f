"""Bundle topics in the file backend: sealed segments are Quiver ``.qseg`` files (spec/BUNDLES.md
BND-9, QSEG-1, QSEG-7, QSEG-9..QSEG-11): written read-only, read back through mmap with exact
payloads and Arrow schemas, damaged files refused with QSEG-7's typed errors, and `verify`
checks them."""

from __future__ import annotations

import os
import stat
import struct
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.ipc as ipc
import pytest

import tidelog
from tidelog.backends.file.format.qseg import (
    ArrowError,
    ChecksumMismatch,
    InvalidFormat,
    QsegError,
    Truncated,
)
from tidelog.backends.file.verify import verify_store
from tidelog.bundle import RecordBundle, encode_bundle
from tidelog.conformance.crashcheck import CrashRun, Op
from tidelog.conformance.crashfs import RecordingFS
from tidelog.errors import BadArgument, Corrupt
from tidelog.hooks import Checkpoint, EngineTopics, hooks

OPTS = "background=false&segment_max_records=4"


def dict_col(values: list[str], index_type: pa.DataType) -> pa.DictionaryArray:
    keys = sorted(set(values))
    return pa.DictionaryArray.from_arrays(
        pa.array([keys.index(v) for v in values], index_type), pa.array(keys)
    )


def bundle(i: int) -> RecordBundle:
    """Slot 0 drifts (a column appears from i = 3; the dictionary key type changes at i = 5);
    slot 2 is present on even i only."""
    cols: dict[str, pa.Array] = {
        "n": pa.array([i, i + 1], pa.uint32()),
        "level": dict_col(["a", "b" if i % 2 else "a"], pa.int8() if i < 5 else pa.uint16()),
    }
    if i >= 3:
        cols["extra"] = pa.array([float(i), None])
    slots = {0: pa.record_batch(cols, metadata={b"i": str(i).encode()})}
    if i % 2 == 0:
        slots[2] = pa.record_batch({"attr": [f"k{i}"]})
    return RecordBundle(slots, payload_types={2: 77} if i % 2 == 0 else None)


def segment_files(root: Path) -> list[str]:
    return sorted(p.name for p in root.glob("topics/*/seg-*"))


def test_QSEG_12_bundle_topic_seals_read_only_qseg_read_back_exactly(tmp_path: Path) -> None:
    """BND-9, QSEG-1, QSEG-10, QSEG-11, QSEG-12: a payload="bundles" topic seals into .qseg
    files only (mode 0440), its records come back byte-identical (TOP-5) before and after
    reopening, the bundles with their exact schemas (dictionary key types, metadata: BND-7),
    and the batches of a sealed segment are served zero-copy from the mapped file."""
    root = tmp_path / "s"
    bundles = [bundle(i) for i in range(10)]
    with tidelog.open(f"file://{root}?{OPTS}") as store:
        t = store.topic("b", payload="bundles")
        for i, b in enumerate(bundles):
            t.append_bundle(b, tag=f"t{i % 3}", node="n" if i % 4 == 0 else None)
        t.delete(before_seq=2)  # seq 1: dead inside the first segment
        before = t.read(limit=100)
        state = t.state()
        hooks(store, Checkpoint).checkpoint()
        assert t.read(limit=100) == before  # served by the sealed chunks now
        assert t.state() == state
    files = segment_files(root)
    assert files and all(name.endswith(".qseg") for name in files)
    for path in root.glob("topics/*/seg-*.qseg"):
        assert stat.S_IMODE(path.stat().st_mode) == 0o440
    with tidelog.open(f"file://{root}?{OPTS}") as store:
        t = store.topic("b", create=False)
        assert t.read(limit=100) == before
        assert t.state() == state
        got = t.read_bundles(limit=100)
        assert [r.bundle for r in got] == bundles[1:]  # type: ignore[union-attr]
        level = got[4].bundle[0].schema.field("level")  # type: ignore[union-attr]
        assert level.type.index_type == pa.uint16()
        tagged = [r.seq for r in t.read(after=0, limit=100) if r[2] == "t1"]  # type: ignore[index]
        assert tagged == [2, 5, 8]
        assert t.delete(tag="t1") == 3  # the tag index was rebuilt from the manifests
        chunk = hooks(store, EngineTopics).topics["b"].log.chunks[0]
        mapped = chunk.data
        batch = chunk.bundle(1)[0]
        lo = pa.py_buffer(mapped).address
        for buf in batch.column(0).buffers():
            if buf is not None:
                assert lo <= buf.address < lo + len(mapped)  # QSEG-11: inside the mapping
    with tidelog.open(f"file://{root}?{OPTS}") as store:
        assert [r.seq for r in store.topic("b").read(limit=100)] == [3, 4, 6, 7, 9, 10]


def test_BND_9_bundle_topics_refuse_other_payloads_before_assigning_a_seq(tmp_path: Path) -> None:
    """BND-9: append, append_many and append_records on a bundle topic take only bundle
    payloads; a bad one is bad_argument and nothing of the op is appended (TOP-6)."""
    with tidelog.open("memory://") as store:
        t = store.topic("b", payload="bundles")
        good = encode_bundle(bundle(0))
        for op in (
            lambda: t.append(b"not a bundle"),
            lambda: t.append_many([good, b"TDLB"]),
            lambda: t.append_records([(good, None, None), (b"x", "t", None)]),
        ):
            with pytest.raises(BadArgument, match="holds bundles"):
                op()
        assert t.state().head_seq == 0
        assert t.append(good) == 1 and t.append_many([good, good]) == [2, 3]
        assert store.topic("plain").append(b"anything") == 1  # other topics: any bytes
        with pytest.raises(tidelog.BadOption, match="payload"):
            store.topic("x", payload="arrow")
        with pytest.raises(tidelog.ConfigMismatch):
            store.topic("b", payload="bytes")


def test_QSEG_9_a_payload_arrow_would_encode_differently_is_sealed_plain(tmp_path: Path) -> None:
    """QSEG-9: a valid bundle written by another encoder (pre-1.0 IPC framing) cannot be
    reassembled byte-exactly from a .qseg, so its segment is sealed in the plain format, with
    a warning; it still reads back byte-identical."""
    batch = pa.record_batch({"x": [1, 2]})
    sink = pa.BufferOutputStream()
    legacy_ipc = ipc.IpcWriteOptions(use_legacy_format=True)
    with ipc.new_stream(sink, batch.schema, options=legacy_ipc) as w:
        w.write_batch(batch)
    stream = sink.getvalue().to_pybytes()
    import hashlib

    (length,) = struct.unpack_from("<i", stream, 0)
    fp = hashlib.sha256(stream[: 4 + length]).digest()
    legacy = b"TDLB" + struct.pack("<HHQ", 1, 16, 1) + struct.pack("<H32sII", 0, fp, 2, len(stream))
    legacy += stream
    root = tmp_path / "s"
    with tidelog.open(f"file://{root}?{OPTS}") as store:
        t = store.topic("b", payload="bundles")
        t.append_many([encode_bundle(bundle(i)) for i in range(4)])  # seqs 1..4: a .qseg
        t.append(legacy)  # seq 5: plain
        hooks(store, Checkpoint).checkpoint()
        warnings = store.describe()["warnings"]
        assert any("sealed plain" in w for w in warnings)  # type: ignore[union-attr]
    assert segment_files(root) == [
        "seg-00000000000000000001.qseg",
        "seg-00000000000000000005.data",
        "seg-00000000000000000005.idx",
    ]
    with tidelog.open(f"file://{root}?{OPTS}") as store:
        assert store.topic("b").read(after=4)[0].payload == legacy  # type: ignore[union-attr]
    assert verify_store(tidelog.fsio.OsFS(), str(root)).ok


def _damaged(tmp_path: Path, change: Any) -> tuple[Path, Path]:
    root = tmp_path / "s"
    with tidelog.open(f"file://{root}?{OPTS}") as store:
        payloads = [encode_bundle(bundle(i)) for i in range(3)]
        store.topic("b", payload="bundles").append_many(payloads)
    (path,) = root.glob("topics/*/seg-*.qseg")
    raw = bytearray(path.read_bytes())
    os.chmod(path, 0o640)
    path.write_bytes(change(raw))
    return root, path


def _patch_crc(raw: bytearray) -> bytes:
    import zlib

    raw[-4:] = struct.pack("<I", zlib.crc32(bytes(raw[:-4])))
    return bytes(raw)


@pytest.mark.parametrize(
    ("case", "error", "rule"),
    [
        ("truncated", Truncated, "QSEG-7"),
        ("cut", InvalidFormat, "QSEG-7"),
        ("magic", InvalidFormat, "QSEG-7"),
        ("crc", ChecksumMismatch, "QSEG-7"),
        ("ipc", ArrowError, "QSEG-2"),
    ],
)
def test_QSEG_7_damaged_segments_are_typed_errors_at_open_and_in_verify(
    tmp_path: Path, case: str, error: type[QsegError], rule: str
) -> None:
    """QSEG-7 through the store: a truncated, cut, bad-magic, bad-CRC or bad-IPC segment that
    the snapshot names refuses to open with QSEG-7's typed error (a Corrupt naming the file;
    the records it held were acknowledged: never skipped silently), and `verify` reports the
    file with the rule."""

    def change(raw: bytearray) -> bytes:
        if case == "truncated":
            return bytes(raw[:10])
        if case == "cut":
            return bytes(raw[:-100])
        if case == "magic":
            raw[-12] ^= 0xFF
            return bytes(raw)
        if case == "crc":
            raw[100] ^= 0x01
            return bytes(raw)
        at = raw.index(b"ARROW1") + 8  # stream 0's schema message: garbage, CRC recomputed
        raw[at : at + 8] = b"\x00\x00\x00\x00\xff\xff\xff\x7f"
        return _patch_crc(raw)

    root, path = _damaged(tmp_path, change)
    with pytest.raises(error) as info:
        tidelog.open(f"file://{root}?{OPTS}")
    assert isinstance(info.value, Corrupt) and str(path) in info.value.message
    assert info.value.kind == error.kind
    report = verify_store(tidelog.fsio.OsFS(), str(root))
    assert [(p.path, p.rule) for p in report.errors] == [(str(path), rule)]


def test_QSEG_1_a_crashed_checkpoint_leaves_nothing_that_hides_records() -> None:
    """QSEG-1 under power loss at every point of two checkpoints of a bundle topic (tmp file,
    chmod, fsync, rename, directory fsync, snapshot): recovery loses no acknowledged bundle and
    returns no damaged one (CRASH-7)."""
    payloads = [encode_bundle(bundle(i)) for i in range(6)]
    ops: list[Op] = [
        ("create", "b", {"durability": "fsync", "payload": "bundles"}),
        ("append_many", "b", payloads[:3]),
        ("checkpoint",),
        ("append", "b", payloads[3], "x"),
        ("delete", "b", 2),
        ("append_many", "b", payloads[4:]),
        ("checkpoint",),
    ]

    def opener(fs: RecordingFS, clock: Any) -> object:
        from tidelog.backends.file import open_store

        return open_store(
            fs, "/data/store", clock, background=False, prealloc="none", segment_max_records=3
        )

    run = CrashRun(opener, ops)
    points = [at for at in run.fs.checkpoints()]
    n = run.check(points, torn="linear")
    assert n > 20
