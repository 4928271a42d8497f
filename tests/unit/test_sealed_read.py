"""The sequential read of sealed segments (SegChunk.records_into, the bulk path behind
``read()``) returns exactly what the per-record path returns, and still checks every record
against its checksum (SEG-2) and seq (SEG-3) on every read, raising ``Corrupt``."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

import tidelog
from tidelog.errors import Corrupt
from tidelog.records import Record


def _fill(root: Path) -> None:
    with tidelog.open(f"file://{root}") as store:
        t = store.topic("t", durability="disk")
        t.append_many([b"plain-%d" % i for i in range(300)])
        t.append_many([b"tagged-%d" % i for i in range(50)], tag="a", node="n1")
        t.append_records([(b"mixed-%d" % i, None if i % 2 else "b", "n2") for i in range(50)])
        t.delete(tag="a")  # dead slots inside a sealed segment
        t.append_many([b"late-%d" % i for i in range(100)])


def test_SEG_2_bulk_sealed_read_matches_per_record_reads(tmp_path: Path) -> None:
    root = tmp_path / "s"
    _fill(root)
    with tidelog.open(f"file://{root}") as store:  # closed and reopened: all sealed
        t = store.topic("t")
        backend = store._backend
        log = backend.topics["t"].log  # type: ignore[attr-defined]
        assert log.chunks, "expected sealed segments"
        expected = [log.record(q) for q in log.live_between(1, t.state().head_seq)]
        for limit in (1, 7, 100, 10_000):
            got: list[object] = []
            cursor = 0
            while items := t.read(cursor, limit):
                got += items
                cursor = items[-1].seq  # type: ignore[union-attr]
            assert got == expected
        assert all(type(r) is Record for r in got)
        assert [r.seq for r in t.read(0, 1000, exclude_node="n2")] == [
            r.seq for r in expected if r.node != "n2"
        ]


def test_SEG_2_a_flipped_payload_byte_in_a_sealed_segment_raises_corrupt(tmp_path: Path) -> None:
    root = tmp_path / "s"
    _fill(root)
    (topic_dir,) = [d for d in (root / "topics").iterdir() if d.is_dir()]
    (data,) = sorted(topic_dir.glob("seg-*.data"))[:1]
    raw = bytearray(data.read_bytes())
    at = raw.find(b"plain-150")
    assert at > 0
    raw[at] ^= 0xFF
    data.write_bytes(bytes(raw))
    os.sync()
    with tidelog.open(f"file://{root}") as store:
        t = store.topic("t")
        assert [r.payload for r in t.read(0, 100)][:3] == [b"plain-0", b"plain-1", b"plain-2"]
        with pytest.raises(Corrupt, match=r"seg-.*\.data.*XXH3"):
            t.read(0, 1000)
