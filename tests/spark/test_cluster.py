"""The ``tidelog`` data source on a real Spark standalone cluster (a master and two workers on
127.0.0.1, tests/spark/cluster.py): executors in their own JVMs and Python workers, the driver
in its own process (cluster_driver.py), this process owning the store (SPK-2). Bounded: every
wait has a timeout, every process started is killed by PID."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest
from cluster import Driver
from cluster_driver import PER_TRIGGER, TOPIC_IN, TOPIC_OUT

import tidelog
from tidelog.records import Record

pytestmark = [pytest.mark.spark, pytest.mark.slow]

ROWS = 30_000  # 20 micro-batches of PER_TRIGGER: a worker dies while most are still to come
MORE = 500
DRIVER_TIMEOUT_S = 600.0


def payloads(store: tidelog.Store, topic: str) -> list[bytes]:
    got = store.topic(topic, create=False).read(limit=1_000_000)
    return sorted(r.payload for r in got if isinstance(r, Record))


def wait_for(check: Any, what: str, driver: Driver, timeout: float = 300.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if driver.proc.poll() is not None:
            raise AssertionError(f"the driver exited before {what}:\n{driver.log()}")
        if time.monotonic() > deadline:
            driver.kill()
            raise AssertionError(f"no {what} within {timeout:g} s:\n{driver.log()}")
        time.sleep(0.1)


def test_SPK_2_SPK_7_SPK_12_on_a_standalone_cluster_with_a_worker_killed(
    spark_cluster: Any, tmp_path: Path
) -> None:
    """SPK-6/7 a batch write from executors in other JVMs, SPK-3 a batch read back: every row
    exactly once. SPK-11/12 a streaming query in -> out through the exactly-once sink keeps
    going while a worker (its executor and Python workers) is SIGKILLed mid-run and comes
    back; a restart of the query from its checkpoint then delivers what came since: every
    record exactly once."""
    root = tmp_path / "s"
    want = sorted(b"r%d" % i for i in range(ROWS))
    more = [b"m%d" % i for i in range(MORE)]
    with tidelog.open(f"file://{root}?progress_flush_ms=10") as store:
        store.topic(TOPIC_IN, trim="none")  # kept whole for the checks (SPK-10 would trim it)
        steps = (f"batch:{ROWS}", f"stream:{ROWS}", f"await:{ROWS + MORE}", "drain")
        driver = Driver(spark_cluster, root, tmp_path, *steps)
        out = store.topic(TOPIC_OUT)
        wait_for(lambda: out.state().head_seq >= PER_TRIGGER, "first micro-batch in out", driver)
        assert out.state().head_seq < ROWS  # the kill below is mid-run
        spark_cluster.kill_worker(0)
        spark_cluster.start_worker(0)
        wait_for(lambda: out.state().head_seq >= ROWS, "every record in out", driver)
        store.topic(TOPIC_IN).append_many(more)  # the driver restarts the query once they are in
        code, results = driver.result(DRIVER_TIMEOUT_S)
        assert code == 0, results

        written = store.topic(TOPIC_IN, create=False).read(limit=1_000_000)
        assert [r.seq for r in written] == list(range(1, ROWS + MORE + 1))
        batch = [r for r in written if isinstance(r, Record) and r.seq <= ROWS]
        assert sorted(r.payload for r in batch) == want  # one atomic ingest of every row
        back = pq.read_table(tmp_path / "pq").sort_by("seq")
        assert back["seq"].to_pylist() == [r.seq for r in batch]  # read back: exactly once
        assert back["payload"].to_pylist() == [r.payload for r in batch]
        assert payloads(store, TOPIC_OUT) == sorted(want + more)  # nothing lost, nothing twice
