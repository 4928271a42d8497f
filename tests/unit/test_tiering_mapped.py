"""TIER-8, TIER-11: a local directory's cold ``.data`` objects are mapped when read (no copy
of the segment), unless ``mmap=false`` (FLT-9), and a map outlives the object's deletion."""

from __future__ import annotations

import mmap
import os
from pathlib import Path

import pytest

import tidelog
from tidelog.backends.file import coldread, segstore
from tidelog.fsio import OsFS
from tidelog.hooks import Checkpoint, EngineTopics, hooks
from tidelog.records import Record

SMALL = dict(segment_max_records=10, background=False, commit_interval_ms=1)


def _relocated(root: Path, cold: Path, n: int = 30) -> list[bytes]:
    """A closed store whose sealed segments are all in the cold tier ``cold``."""
    s = tidelog.open(f"file://{root}", cold=str(cold), hot_retain_segments=0, **SMALL)
    t = s.topic("t", durability="disk")
    payloads = [b"p%03d" % i * 7 for i in range(n)]
    for p in payloads:
        t.append(p)
    for _ in range(2):  # the first seals, the second relocates what it sealed
        hooks(s, Checkpoint).checkpoint()
    s.close()
    return payloads


def test_TIER_2_a_local_read_view_is_a_map_that_outlives_the_object(tmp_path: Path) -> None:
    """TIER-2, TIER-8: ``read_view`` of a local directory maps the object (no copy): the bytes
    stay readable after the object is deleted; under ``mmap=false`` it is a private copy."""
    mapped = segstore.LocalSegmentStore(OsFS(), str(tmp_path / "m"))
    mapped.put("a/1.data", b"0123456789")
    view = mapped.read_view("a/1.data", 2, 5)
    assert isinstance(view.obj, mmap.mmap)
    assert str(tmp_path / "m" / "a" / "1.data") in _mapped_files()
    mapped.delete("a/1.data")
    assert not os.path.exists(tmp_path / "m" / "a" / "1.data")
    assert bytes(view) == b"23456"
    copied = segstore.LocalSegmentStore(OsFS(mmap=False), str(tmp_path / "c"))
    copied.put("a/1.data", b"0123456789")
    view = copied.read_view("a/1.data", 2, 5)
    (tmp_path / "c" / "a" / "1.data").write_bytes(b"x" * 10)  # (never done to an object)
    assert bytes(view) == b"23456"


@pytest.mark.parametrize("mapped", [True, False])
def test_TIER_11_the_cold_only_reader_maps_local_segments_unless_mmap_false(
    tmp_path: Path, mapped: bool
) -> None:
    """TIER-8, TIER-11: ``open_cold`` maps a local directory's ``.data`` objects (the chunk's
    bytes are the map, not a copy) unless ``mmap=False``; either way the reads are the same."""
    payloads = _relocated(tmp_path / "s", tmp_path / "cold")
    with coldread.open_cold(str(tmp_path / "cold"), mmap=mapped) as view:
        got = view.read("t", after=0, limit=100)
        assert [r.payload for r in got if isinstance(r, Record)] == payloads
        loaded = [c for c in view.log("t").chunks if c.loaded]
        assert loaded
        assert all(isinstance(c.data.obj, mmap.mmap) for c in loaded)  # FLT-9's copy is one too
        files = _mapped_files()
        for c in loaded:
            assert (str(tmp_path / "cold" / c.key) in files) is mapped


def _mapped_files() -> set[str]:
    """The files this process maps (Linux)."""
    with open("/proc/self/maps") as f:
        return {line.split(maxsplit=5)[5].strip() for line in f if len(line.split()) > 5}


def test_TIER_8_a_store_with_a_local_cold_tier_maps_its_cold_segments(tmp_path: Path) -> None:
    """TIER-8: a store (and a read-only view) opened with a local ``cold`` maps the segments it
    fetches (its FS maps files, FLT-9's default), and reads every record."""
    payloads = _relocated(tmp_path / "s", tmp_path / "cold")
    with tidelog.open(
        f"file://{tmp_path / 's'}", cold=str(tmp_path / "cold"), readonly=True
    ) as view:
        got = view.topic("t").read(after=0, limit=100)
        assert [r.payload for r in got if isinstance(r, Record)] == payloads
        chunks = hooks(view, EngineTopics).topics["t"].log.chunks
        cold = [c for c in chunks if type(c).__name__ == "ColdChunk" and c.loaded]
        assert cold
        files = _mapped_files()
        assert all(str(tmp_path / "cold" / c.key) in files for c in cold)
