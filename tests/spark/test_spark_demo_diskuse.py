"""The Spark demo's disk report (adapters/spark/diskuse.py), without Spark: spare WAL files are
counted as spares, not as the active WAL file, and the trim's effect on disk is what happened."""

from __future__ import annotations

from pathlib import Path

import tidelog
from tidelog.adapters.spark.diskuse import Footprint, footprint, trim_report
from tidelog.hooks import Checkpoint, hooks

MIB = 1 << 20


def test_demo_footprint_counts_spare_wal_files_apart_from_active_ones(tmp_path: Path) -> None:
    """A real store whose trimmed WAL files were retired as spares (WAL-15): the footprint puts
    them under spare, so "WAL files" holds only wal-*.log; the kinds add up to what du counts."""
    root = tmp_path / "s"
    with tidelog.open(f"file://{root}?wal_file_bytes=64KiB&prealloc=none") as store:
        t = store.topic("ev", trim="acked")
        sub = t.subscribe("s", start="earliest")
        for _ in range(12):
            t.append_many([b"x" * 1000] * 16)  # ~16 KiB a call: a new WAL file every ~4 calls
        sub.commit(t.state().head_seq)
        sub.flush()
        hooks(store, Checkpoint).checkpoint()
        hooks(store, Checkpoint).checkpoint()
        f = footprint(str(root))
    wal = sorted((root / "wal").glob("wal-*.log"))
    spares = sorted((root / "wal").glob("spare-*.log"))
    assert spares, "no WAL file was retired as a spare: the test needs one"
    assert (f.spare_files, f.wal_files) == (len(spares), len(wal))
    assert f.spare == sum(p.stat().st_blocks * 512 for p in spares)
    assert f.wal == sum(p.stat().st_blocks * 512 for p in wal)
    every = sum(p.stat().st_blocks * 512 for p in root.rglob("*") if p.is_file())
    assert f.total == every


def test_demo_trim_report_says_what_the_trim_freed_and_why_not() -> None:
    """Nothing freed: the report says so, why (the trimmed records are in a WAL file not yet
    retired), and that spares hold retired files' bytes; something freed: how much and how."""
    spares = Footprint(wal=1 * MIB, wal_files=1, spare=8 * MIB, spare_files=2, other=4096)
    rows = dict(trim_report(spares, spares, 500, 4 * MIB))
    assert rows["bytes on disk"] == (
        "9.0 MiB before the final ack -> 9.0 MiB after: 1.0 MiB in 1 WAL file, 8.0 MiB in 2 "
        "spare WAL files (retired, kept for reuse), 0 B in 0 segments, 4.0 KiB other"
    )
    assert rows["trim freed"].startswith("nothing on disk: the 500 records the final ack")
    assert "2 full WAL files retired during the run stay as spares (8.0 MiB)" in rows["trim freed"]
    small = Footprint(wal=300 << 10, wal_files=1, other=4096)
    assert "spare" not in dict(trim_report(small, small, 3, 4 * MIB))["trim freed"]
    before = Footprint(wal=2 * MIB, wal_files=2, segments=3 * MIB, segment_files=3)
    after = Footprint(wal=1 * MIB, wal_files=1, segments=MIB, segment_files=1)
    freed = dict(trim_report(before, after, 900, 4 * MIB))["trim freed"]
    assert freed == "3.0 MiB on disk (2 sealed segments dropped, 1.0 MiB of WAL files deleted)"
