"""Longer runs on the standalone cluster (tests/spark/cluster.py): more SIGKILL points for the
workers, and the driver killed. Not in the default suite: ``python3 run.py spark_cluster``
(TIDELOG_SPARK_CLUSTER_LONG=1; tests/spark/conftest.py leaves this file out otherwise)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from cluster import Driver
from cluster_driver import PER_TRIGGER, TOPIC_IN, TOPIC_OUT
from test_cluster import DRIVER_TIMEOUT_S, payloads, wait_for

import tidelog
from tidelog.records import Record

pytestmark = [pytest.mark.spark, pytest.mark.slow]

ROWS = 60_000


def staged(root: Path) -> list[Path]:
    """Files tasks are staging right now (SPK-6)."""
    return list(root.parent.glob(f".{root.name}.spark-staging/*/part-*.arrow"))


def owner(root: Path) -> tidelog.Store:
    store = tidelog.open(f"file://{root}?progress_flush_ms=10")
    store.topic(TOPIC_IN, trim="none")  # kept whole for the checks
    return store


@pytest.mark.parametrize("point", ["write", "first-batch", "half", "both-workers"])
def test_SPK_7_SPK_12_workers_killed_at(point: str, spark_cluster: Any, tmp_path: Path) -> None:
    """SPK-7, SPK-11, SPK-12: a worker SIGKILLed while tasks stage a batch write, after the
    first micro-batch, half-way, or both workers at once (and restarted): the write appends
    every row once, the query delivers every record once."""
    root = tmp_path / "s"
    want = sorted(b"r%d" % i for i in range(ROWS))
    with owner(root) as store:
        driver = Driver(spark_cluster, root, tmp_path, f"batch:{ROWS}", f"stream:{ROWS}")
        out = store.topic(TOPIC_OUT)
        if point == "write":
            wait_for(lambda: bool(staged(root)), "a staged file", driver)
        else:
            at = PER_TRIGGER if point != "half" else ROWS // 2
            wait_for(lambda: out.state().head_seq >= at, f"seq {at} in out", driver)
        victims = [0, 1] if point == "both-workers" else [0]
        for i in victims:
            spark_cluster.kill_worker(i)
        for i in victims:
            spark_cluster.start_worker(i)
        code, results = driver.result(DRIVER_TIMEOUT_S)
        assert code == 0, results
        assert payloads(store, TOPIC_IN) == want
        assert payloads(store, TOPIC_OUT) == want
    spark_cluster.wait_workers(2)


def test_SPK_11_SPK_12_driver_killed_mid_stream(spark_cluster: Any, tmp_path: Path) -> None:
    """SPK-11, SPK-12: the driver (its JVM, source runner and Python workers) SIGKILLed while
    the query runs; a new driver restarts it from the checkpoint: every record exactly once,
    and its commits sweep what the dead driver staged."""
    root = tmp_path / "s"
    want = sorted(b"r%d" % i for i in range(ROWS))
    with owner(root) as store:
        first = Driver(spark_cluster, root, tmp_path, f"batch:{ROWS}", f"stream:{ROWS}")
        out = store.topic(TOPIC_OUT)
        wait_for(lambda: out.state().head_seq >= 2 * PER_TRIGGER, "two micro-batches", first)
        first.kill()
        assert out.state().head_seq < ROWS  # killed mid-run
        code, results = Driver(spark_cluster, root, tmp_path, "drain").result(DRIVER_TIMEOUT_S)
        assert code == 0, results
        assert payloads(store, TOPIC_OUT) == want
    assert not root.parent.joinpath(f".{root.name}.spark-staging").exists()


def test_SPK_7_driver_killed_during_a_batch_write(spark_cluster: Any, tmp_path: Path) -> None:
    """SPK-7: a driver SIGKILLed while its tasks stage a write leaves all of the job's rows
    or none (one atomic ingest at commit), never a part; a second write then appends once."""
    root = tmp_path / "s"
    with owner(root) as store:
        first = Driver(spark_cluster, root, tmp_path, f"batch:{ROWS}")
        wait_for(lambda: bool(staged(root)), "a staged file", first)
        first.kill()
        before = len(payloads(store, TOPIC_IN))
        assert before in (0, ROWS)
        code, results = Driver(spark_cluster, root, tmp_path, f"batch:{ROWS}").result(
            DRIVER_TIMEOUT_S
        )
        assert code == 0, results
        got = store.topic(TOPIC_IN, create=False).read(after=before, limit=1_000_000)
        assert [r.seq for r in got] == list(range(before + 1, before + ROWS + 1))
        assert sorted(r.payload for r in got if isinstance(r, Record)) == sorted(
            b"r%d" % i for i in range(ROWS)
        )


def test_SPK_30_the_demo_on_a_standalone_cluster_with_a_cold_tier(
    spark_cluster: Any, tmp_path: Path
) -> None:
    """SPK-2, SPK-9..SPK-12, SPK-30: `tidelog demo --master spark://... --cold DIR`, the user's
    command, on the standalone cluster (executors in the workers' JVMs and Python workers):
    every row in the Parquet output exactly once, the store trimmed, the cold tier reported."""
    import subprocess
    import sys

    args = ["--records", "300", "--rows", "20", "--producers", "2", "--max-per-trigger", "100"]
    result = subprocess.run(
        [sys.executable, "-m", "tidelog.cli", "demo", "--master", spark_cluster.master_url,
         *args, "--cold", "cold"],
        cwd=tmp_path, env=dict(spark_cluster.env(), PYTHONSAFEPATH="1"),
        capture_output=True, text=True, timeout=DRIVER_TIMEOUT_S,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr[-3000:]
    assert "OK: 300 bundles (6,000 rows) produced" in result.stdout, result.stdout
    assert str(tmp_path / "cold") in result.stdout
    spark_cluster.wait_workers(2)
