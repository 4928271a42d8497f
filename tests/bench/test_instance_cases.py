"""The bench's instances cases (bench/instance_cases.py): a tiny run through `tidelog bench`
(every row measured, the table's section and targets present), and a direct run whose
writers' records are all in the store afterwards."""

from __future__ import annotations

import json
import os
from pathlib import Path

from click.testing import CliRunner

import tidelog
from tidelog.backends.instances import merged
from tidelog.bench.instance_cases import run_writers
from tidelog.cli import main


def test_INST_3_bench_writers_each_take_a_slot_and_every_append_lands(tmp_path: Path) -> None:
    """INST-3, INST-8: the bench's writer processes run side by side in their own slots; the
    records they counted (plus one warm-up each) are exactly what the merged read finds."""
    root = tmp_path / "s"
    reports = run_writers(str(root), 2, 100, 10, 0.2)
    assert len(reports) == 2 and all(r["n"] > 0 and r["rss"] > 0 for r in reports)
    with tidelog.open(f"file://{root}?instances=2", readonly=True) as view:
        m = merged(view.topic("bench", create=False))
        total, cursor = 0, None
        while True:
            items, cursor = m.read(cursor, 5000)
            if not items:
                break
            total += len(items)
    assert total == sum(r["n"] for r in reports) + 2


def test_bench_instances_ceiling_writers_sync_their_own_files(tmp_path: Path) -> None:
    """The ceiling's writers (raw pwrite + fdatasync, one file each) run side by side, report
    the records they synced, their CPU and the bytes they passed to write calls (exactly the
    payloads: 100 per record), and remove their files."""
    root = tmp_path / "raw"
    reports = run_writers(str(root), 2, 100, 1, 0.2, raw=True)
    assert len(reports) == 2 and all(r["n"] > 0 and r["cpu_s"] >= 0 for r in reports)
    assert all(r["wchar"] >= 100 * r["n"] for r in reports)
    joined = run_writers(str(root), 1, 100, 1000, 0.2, raw=True)
    assert joined[0]["n"] % 1000 == 0 and joined[0]["wchar"] >= 100 * joined[0]["n"]
    assert os.listdir(root) == []


def test_bench_instances_steady_writers_start_from_a_recycled_wal_file(tmp_path: Path) -> None:
    """A steady writer's instance reaches a recycled WAL file (WAL-15) before its window; a
    new store's writer has none and zeroes ahead of its new file. Both report the WAL's own
    counters over the window. Small WAL files keep the warm-up short."""
    small = "wal_file_bytes=1MiB"
    fresh = run_writers(str(tmp_path / "f"), 1, 100, 1000, 0.2, options=small)[0]
    steady = run_writers(str(tmp_path / "s"), 1, 100, 1000, 0.2, steady=True, options=small)[0]
    assert fresh["recycled_before"] == 0 and fresh["wal"]["zeroed_bytes"] > 0
    assert steady["recycled_before"] >= 1
    for r in (fresh, steady):
        assert r["wal"]["fdatasyncs"] >= r["n"] // 1000  # one sync per batch at least
        assert r["wal"]["submitted_bytes"] >= 100 * r["n"]


def test_bench_instances_rows_section_and_targets(tmp_path: Path) -> None:
    """`tidelog bench --only tl_inst_fsync_p --only raw_inst_fsync_p`: every instances row has
    a rate and memory per instance, each is compared with its ceiling (the raw row of the same
    processes); the table has their section and the two-process target names the ceiling's
    ratio."""
    out = tmp_path / "out"
    only = ["tl_inst_fsync_p1", "tl_inst_fsync_p2", "raw_inst_fsync_p1", "raw_inst_fsync_p2"]
    args = ["bench", "--seconds", "0.05", "--repeats", "1", "--no-plot", "--no-isolated",
            "--dir", str(tmp_path), "--out", str(out), "--sizes", "100"]  # fmt: skip
    for cid in only:
        args += ["--only", cid]
    result = CliRunner().invoke(main, args, catch_exceptions=False)
    assert result.exit_code == 0, result.output
    data = json.loads((out / "results.json").read_text())
    rows = {r["id"]: r for r in data["rows"]}
    assert set(rows) == set(only)
    for cid in only[:2]:
        m = rows[cid]["metrics"]
        assert m["rec_per_s"]["median"] > 0 and m["rss_mib_per_instance"]["median"] > 1
        assert m["cpu_us_per_rec"]["median"] > 0 and m["bytes_per_rec"]["median"] >= 100
        assert rows[cid]["limit"] == cid.replace("tl_", "raw_") and "x_limit" in rows[cid]
        assert m["fdatasync_per_rec"]["median"] >= 1 and m["wal_bytes_per_rec"]["median"] > 100
    assert rows["tl_inst_fsync_p2"]["metrics"]["procs"]["median"] == 2
    table = (out / "table.md").read_text()
    assert "## several writer processes" in table and "its ceiling" in table
    target = next(t for t in data["targets"] if t["id"] == "instances_p2")
    assert target["value"] is not None and target["met"] is not None
    assert "raw ceiling" in target["detail"]
