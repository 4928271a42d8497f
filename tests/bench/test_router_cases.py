"""The router cases of the benchmark (bench/router_cases.py) run in a tiny mode, side by side
with their baselines, and produce sane, well-formed figures: rates, WAL counters per source
append, latency percentiles in order, ratios to the baseline, the table's routers section.
Nothing here checks a speed."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from click.testing import CliRunner

import tidelog
from tidelog.bench import catalog, router_cases
from tidelog.bench.measure import Ctx
from tidelog.cli import main

RATE_IDS = ["rt_plain_disk", "rt_1_disk", "rt_4_disk", "rt_plain_fsync", "rt_1_fsync", "rt_4_fsync"]
LATENCY_IDS = ["rt_lat_plain_disk", "rt_lat_1_disk", "rt_lat_plain_fsync", "rt_lat_1_fsync"]


def _med(row: dict, key: str) -> float:
    return float(row["metrics"][key]["median"])


@pytest.fixture(scope="module")
def bench(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict, str, Path]:
    tmp = tmp_path_factory.mktemp("rtbench")
    out = tmp / "out"
    args = ["bench", "--only", "rt_", "--seconds", "0.01", "--repeats", "2", "--sizes", "100",
            "--no-plot", "--no-isolated", "--dir", str(tmp), "--out", str(out)]  # fmt: skip
    result = CliRunner().invoke(main, args, catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return json.loads((out / "results.json").read_text()), (out / "table.md").read_text(), tmp


def test_router_cases_all_run_beside_their_baselines(bench: tuple[dict, str, Path]) -> None:
    """Every rt_ case ran twice at 100 B (latency cases only at 100 B), each routed row carries
    the ratio of its median to its baseline's, and the run left no file behind."""
    data, _, tmp = bench
    assert not data["unavailable"], data["unavailable"]
    rows = {r["id"]: r for r in data["rows"]}
    assert set(rows) == set(RATE_IDS + LATENCY_IDS)
    assert all(r["size"] == 100 and r["runs"] == 2 for r in rows.values())
    for cid in ("rt_1_disk", "rt_4_disk", "rt_1_fsync", "rt_4_fsync"):
        row, base = rows[cid], rows[rows[cid]["baseline"]]
        assert base["id"].startswith("rt_plain_") and base["tier"] == row["tier"]
        assert row["x_baseline"] == _med(row, "rec_per_s") / _med(base, "rec_per_s")
    for cid in ("rt_lat_1_disk", "rt_lat_1_fsync"):
        row, base = rows[cid], rows[rows[cid]["baseline"]]
        for q in ("p50", "p99"):
            assert row[f"x_baseline_{q}"] == _med(row, f"{q}_us") / _med(base, f"{q}_us")
    assert all("x_baseline" not in rows[c] for c in ("rt_plain_disk", "rt_plain_fsync"))
    assert sorted(p.name for p in tmp.iterdir()) == ["out"]  # every store removed


def test_router_rate_rows_count_source_appends_and_wal_work(
    bench: tuple[dict, str, Path],
) -> None:
    """Rate rows: at least three appends per round, a positive rate, the router count, and
    the WAL's work per source append. An fsync source append is at least one WAL write and
    fdatasync of its own (one thread: no group commit) and, whatever the fan-out, not two
    (RTR-10, WAL-7: the copies join the append's batch); the bound leaves room for a few
    writes of the store's own beside a short run's appends."""
    data, _, _ = bench
    rows = {r["id"]: r for r in data["rows"]}
    for cid in RATE_IDS:
        m = rows[cid]["metrics"]
        assert m["records"]["min"] >= 3
        assert 0 < m["rec_per_s"]["min"] <= m["rec_per_s"]["median"] <= m["rec_per_s"]["max"]
        assert m["routers"]["median"] == (0 if "plain" in cid else int(cid.split("_")[1]))
        assert m["wal_bytes_per_rec"]["min"] > 0
    for cid in ("rt_plain_fsync", "rt_1_fsync", "rt_4_fsync"):
        m = rows[cid]["metrics"]
        for key in ("wal_writes_per_rec", "fdatasync_per_rec"):
            assert 1.0 <= m[key]["min"] <= m[key]["max"] < 2.0, (cid, key, m[key])


def test_router_latency_rows_are_ordered_percentiles_at_the_fixed_rate(
    bench: tuple[dict, str, Path],
) -> None:
    """Latency rows: at least MIN_SAMPLES appends, paced (never above RATE), and
    0 < min <= p50 <= p99 <= max of append -> readable, beside the append call's own time."""
    data, _, _ = bench
    rows = {r["id"]: r for r in data["rows"]}
    for cid in LATENCY_IDS:
        m = {k: v["median"] for k, v in rows[cid]["metrics"].items()}
        assert m["records"] >= router_cases.MIN_SAMPLES
        assert 0 < m["rec_per_s"] <= router_cases.RATE * 1.02  # n appends, 1/RATE apart
        assert 0 < m["min_us"] <= m["p50_us"] <= m["p99_us"] <= m["max_us"], (cid, m)
        assert 0 < m["append_p50_us"] <= m["append_p99_us"]


def test_router_section_of_the_table(bench: tuple[dict, str, Path]) -> None:
    """The table lists every routed row beside its baseline, with its ratio."""
    _, table, _ = bench
    assert "## routers (file://" in table
    for cid in ("rt_1_disk", "rt_4_disk", "rt_1_fsync", "rt_4_fsync"):
        base = cid.split("_")[2]
        assert f"- {cid} @ 100: " in table and f"rec/s vs rt_plain_{base} " in table
    for cid in ("rt_lat_1_disk", "rt_lat_1_fsync"):
        assert f"- {cid} @ 100: append -> copy readable in dest p50 " in table
    assert "**tl_" not in table  # only what was selected


def test_router_without_its_baseline_says_so(tmp_path: Path) -> None:
    """A routed case run without its baseline has no ratio and the table says why."""
    out = tmp_path / "out"
    args = ["bench", "--only", "rt_1_disk", "--seconds", "0.01", "--repeats", "1",
            "--sizes", "100", "--no-plot", "--no-isolated", "--dir", str(tmp_path),
            "--out", str(out)]  # fmt: skip
    result = CliRunner().invoke(main, args, catch_exceptions=False)
    assert result.exit_code == 0, result.output
    (row,) = json.loads((out / "results.json").read_text())["rows"]
    assert "x_baseline" not in row
    assert "- rt_1_disk @ 100: " in result.output
    assert "no rt_plain_disk row to compare with" in result.output


def test_a_router_that_falls_behind_fails_the_case(tmp_path: Path) -> None:
    """The copy check is real: a dest that refuses copies (RTR-6) makes the case an error,
    not a fast row."""
    with tidelog.open(f"file://{tmp_path / 's'}") as store:
        src = store.topic("src")
        dest = store.topic("dest-0", cap_records=1, discard="reject")
        store.router("r-0", "src", "dest-0")
        src.append_many([b"a", b"b"])
        with pytest.raises(RuntimeError, match="dest-0 holds 1 copies of 2 source records"):
            router_cases._check_copies(store, src, [dest])
        with pytest.raises(RuntimeError, match=re.escape("routers lag after the run: {'r-0': 1}")):
            router_cases._check_copies(store, src, [])


def test_every_baseline_is_a_case_of_the_same_tier_and_sizes() -> None:
    ids = {c.id: c for c in catalog.CASES}
    for case in catalog.CASES:
        if case.baseline is None:
            continue
        base = ids[case.baseline]
        assert base.baseline is None and base.tier == case.tier, case.id
        assert base.sizes == case.sizes and base.mode == case.mode, case.id


def test_latency_case_bounds_its_samples(tmp_path: Path) -> None:
    """route_latency appends max(MIN_SAMPLES, seconds * RATE) records, each copied once."""
    ctx = Ctx(str(tmp_path), 0.0, 100, True)
    m = router_cases.route_latency(ctx, "disk", 1)
    assert m["records"] == router_cases.MIN_SAMPLES and m["routers"] == 1
