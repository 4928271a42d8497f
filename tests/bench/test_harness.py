"""The benchmark harness (bench/ -> tidelog.bench) runs end to end with tiny sizes and
produces well-formed results: JSON with every selected case, the Markdown table, the speed
targets, and the isolated recovery/RSS measurements. Nothing here checks a speed (no timed
assertions): the figures themselves are only for `tidelog bench`."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
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


FORWARD = ["fwd_tidelog", "fwd_tidelog_durable", "fwd_questdb", "fwd_questdb_durable"]


def _bench(tmp_path: Path, *only: str) -> tuple[dict, str, str]:
    out = tmp_path / "out"
    args = ["bench", "--seconds", "0.02", "--repeats", "2", "--no-plot", "--no-isolated",
            "--dir", str(tmp_path), "--out", str(out)]  # fmt: skip
    for cid in only:
        args += ["--only", cid]
    result = CliRunner().invoke(main, args, catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return (
        json.loads((out / "results.json").read_text()),
        (out / "table.md").read_text(),
        result.output,
    )


def test_forwarding_cases_real_client_beside_the_forwarder(tmp_path: Path) -> None:
    """The real QuestDB client (questdb 6.0.0, required by the test extra: a missing client
    fails here, it is not skipped) and tidelog's forwarder, each into its own `tidelog serve`,
    plain and with durable acks, in the same run at both record sizes: every row has a rate,
    the receiver stored exactly the frames sent, the client's rows are sized so the stored
    records are the bench's sizes (the forwarder's payloads are), each forwarder row carries
    its ratio to the client row of the same ack mode, and the table says so."""
    data, table, output = _bench(tmp_path, *FORWARD)
    assert not data["unavailable"], data["unavailable"]
    assert data["versions"]["questdb"] == "6.0.0"
    rows = {(r["id"], r["size"]): r for r in data["rows"]}
    assert set(rows) == {(cid, size) for cid in FORWARD for size in (100, 4096)}
    for (cid, size), row in rows.items():
        m = row["metrics"]
        assert row["runs"] == 2 and row["mode"] == "forward"
        assert 0 < m["rec_per_s"]["min"] <= m["rec_per_s"]["median"] <= m["rec_per_s"]["max"]
        assert m["records"]["min"] >= 3  # timed(): at least three frames per round
        assert m["send_s"]["min"] > 0 and m["drain_s"]["min"] >= 0
        assert m["stored_b_min"]["min"] == m["stored_b_max"]["max"] == size, (cid, size, m)
    for size in (100, 4096):
        for mine, theirs in (("fwd_tidelog", "fwd_questdb"),
                             ("fwd_tidelog_durable", "fwd_questdb_durable")):  # fmt: skip
            row = rows[(mine, size)]
            assert row["best_peer"] == theirs
            ratio = row["metrics"]["rec_per_s"]["median"] / rows[(theirs, size)]["metrics"][
                "rec_per_s"]["median"]  # fmt: skip
            assert row["x_best_peer"] == ratio
            assert f"- {mine} @ {size}: " in table and f"vs {theirs} " in table
    assert "## forwarding into tidelog serve" in table and table.strip() in output


def test_forwarding_case_without_the_client_is_unavailable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without questdb importable the client's cases are reported as not measured, with the
    reason, and the run goes on (no receiver is started for them); the forwarder's row stays,
    without a ratio."""
    monkeypatch.setitem(sys.modules, "questdb", None)  # `import questdb` raises ImportError
    data, table, _ = _bench(tmp_path, "fwd_questdb", "fwd_tidelog")
    assert data["unavailable"] == {
        f"{cid}@{size}": "not installed: questdb"
        for cid in ("fwd_questdb", "fwd_questdb_durable")
        for size in (100, 4096)
    }
    ids = {r["id"] for r in data["rows"]}
    assert ids == {"fwd_tidelog", "fwd_tidelog_durable"}
    assert all("x_best_peer" not in r for r in data["rows"])
    assert "- fwd_questdb@100: not installed: questdb" in table
    assert "no client row to compare with" in table


def test_sealed_ceiling_writes_each_record_twice(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """raw_joined_sealed (the device ceiling of a WAL + segments log) really writes the
    segment copy: with a checkpoint every 256 KiB, the second thread's synced segment bytes per
    record are the payload plus what a segment holds per record (less what
    follows the last whole checkpoint), and its files are gone after."""
    from tidelog.bench import limits
    from tidelog.bench.measure import Ctx

    monkeypatch.setattr(limits, "_CHECKPOINT_BYTES", 256 << 10)
    out = limits.raw_joined_sealed(Ctx(base=str(tmp_path), seconds=0.3, size=100, quick=True))
    assert out["records"] >= 3000
    per_rec = out["sealed_bytes_per_rec"]
    # the WAL after the last whole checkpoint is unsealed; the sealer's counter of WAL bytes
    # is rough (it may miss a batch per checkpoint): 10 % slack
    whole = 1 - (256 << 10) / (out["records"] * 100)
    assert per_rec >= 0.9 * (100 + limits._SEALED_PER_RECORD) * whole
    assert per_rec <= 100 + limits._SEALED_PER_RECORD
    assert sorted(p.name for p in tmp_path.iterdir()) == ["raw"]


def test_timed_puts_reads_the_clock_per_stride_and_times_latency_apart(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Single puts are timed as loop_floor is: the rate pass reads the clock once per stride
    of calls, not per call (a per-call clock costs a quarter of a buffered append), and the
    latencies come from a second pass; every call is counted in one of the two, and a
    max_records bound holds in both."""
    import time as _time

    from tidelog.bench import measure

    calls = [0]
    reads = [0]
    real = _time.perf_counter

    def clock() -> float:
        reads[0] += 1
        return real()

    def step() -> int:
        calls[0] += 1
        return 1

    monkeypatch.setattr(measure.time, "perf_counter", clock)
    n, elapsed, lat, more = measure.timed_puts(step, 0.2)
    assert elapsed >= 0.2 and n > 1000 and more == len(lat) > 0
    assert calls[0] == n + more
    rate_reads = reads[0] - (len(lat) + 1)  # the latency pass reads the clock once per call
    assert rate_reads < n / 50  # strides of up to 256 calls
    calls[0] = 0
    n, _, lat, more = measure.timed_puts(step, 10.0, max_records=4000)
    assert 4000 <= n < 4000 + 256 and more <= 1000 + 1 and calls[0] == n + more


def test_steady_warm_up_is_bounded(tmp_path: Path) -> None:
    """The steady-state warm-up appends until a recycled WAL file takes the frames; on a store
    that never checkpoints none ever does, so it stops at its byte bound with an error instead
    of filling the disk. A checkpointing store gets there within the bound."""
    import time

    import tidelog
    from tidelog.bench.cases import warm_to_steady

    with tidelog.open(f"file://{tmp_path}/off?checkpoint_bytes=64GiB&wal_file_bytes=1MiB") as s:
        t = s.topic("w", durability="memory")
        with pytest.raises(RuntimeError, match="no WAL file recycled after 8 MiB"):
            warm_to_steady(t.append_many, lambda: s.describe()["wal"], limit=8 << 20)
        assert s.describe()["topics"]["w"]["state"]["count"] == 8 * 256
    # seal_worker=false: the first checkpoint would wait for the worker process's start, which
    # on a loaded machine took longer than the paced appends below need to pass the bound
    on = "on?checkpoint_bytes=1MiB&wal_file_bytes=1MiB&seal_worker=false"
    with tidelog.open(f"file://{tmp_path}/{on}") as s:
        t = s.topic("w", durability="memory")

        def paced(batch: list[bytes]) -> None:  # let the maintenance thread's ticks come
            t.append_many(batch)
            time.sleep(0.01)

        warm_to_steady(paced, lambda: s.describe()["wal"], limit=64 << 20)
        assert s.describe()["wal"]["recycled_files"] >= 1
