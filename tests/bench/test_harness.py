"""The benchmark harness (bench/ -> tidelog.bench) runs end to end with tiny sizes and
produces well-formed results: JSON with every selected case, the Markdown table, the speed
targets, and the isolated recovery/RSS measurements. Nothing here checks a speed (no timed
assertions): the figures themselves are only for `tidelog bench`."""

from __future__ import annotations

import json
from pathlib import Path

from click.testing import CliRunner

from tidelog.bench import harness, report
from tidelog.cli import main

TINY = [
    "--seconds", "0.01", "--repeats", "2", "--sizes", "100", "--no-plot",
    "--recovery-bytes", "300000", "--rss-records", "3000",
    "--only", "raw_overwrite", "--only", "raw_joined", "--only", "loop_floor",
    "--only", "mmap_read", "--only", "tl_memory", "--only", "tl_file_fsync",
    "--only", "tl_file_disk", "--only", "tl_read_tail", "--only", "tl_sub_ack",
    "--only", "sqlite_full_1", "--only", "sqlite_normal_1", "--only", "recovery",
]  # fmt: skip


def test_bench_command_writes_json_table_and_targets(tmp_path: Path) -> None:
    out = tmp_path / "out"
    result = CliRunner().invoke(
        main, ["bench", *TINY, "--dir", str(tmp_path), "--out", str(out)], catch_exceptions=False
    )
    assert result.exit_code == 0, result.output
    data = json.loads((out / "results.json").read_text())
    assert not data["unavailable"], data["unavailable"]
    rows = {(r["id"], r["size"]): r for r in data["rows"]}
    for cid in ("raw_overwrite", "tl_file_fsync", "tl_file_disk", "tl_read_tail", "tl_sub_ack",
                "sqlite_full_1", "sqlite_full_1:read", "sqlite_normal_1:get"):  # fmt: skip
        row = rows[(cid, 100)]
        rate = row["metrics"]["rec_per_s"]
        assert rate["min"] <= rate["median"] <= rate["max"] and rate["median"] > 0
    fsync = rows[("tl_file_fsync", 100)]
    assert fsync["runs"] == 2
    assert fsync["limit"] == "raw_overwrite" and fsync["x_limit"] > 0
    assert fsync["best_peer"] == "sqlite_full_1"  # the only durable single-put peer selected
    assert 0 < fsync["metrics"]["fdatasync_per_rec"]["median"] <= 1.5
    assert rows[("tl_file_disk", 100)]["best_peer"] == "sqlite_normal_1"  # equal tier only
    targets = {t["id"]: t for t in data["targets"]}
    assert set(targets) == {k for k, _ in report.TARGETS}
    assert targets["fsync_single"]["value"] > 0 and targets["fsync_single"]["met"] in (True, False)
    assert targets["blockdev_wa"]["met"] is None  # not selected: reported as not measured
    iso = data["isolated"]
    for kind in ("clean", "tagged", "crash"):
        assert iso[kind]["payload_bytes"] >= 300000 and iso[kind]["open_s"]["median"] > 0
    assert iso["rss_file"]["peak_rss_mib"] > 0
    table = (out / "table.md").read_text()
    assert "## records of 100 bytes" in table and "**tl_file_fsync**" in table
    assert "## speed targets" in table and "recovery after SIGKILL" in table
    assert "every record tagged" in table
    assert table.strip() in result.output


def test_every_case_is_labelled_with_a_tier_and_a_known_limit() -> None:
    ids = {c.id for c in harness.CASES}
    for case in harness.CASES:
        assert case.tier in ("durable", "buffered", "-"), case.id
        assert case.limit is None or case.limit in ids, case.id
        if case.group == "peer":
            assert case.tier != "-" and case.guarantee, case.id
