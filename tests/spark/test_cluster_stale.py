"""A worker whose view of the store is stale, on the standalone cluster (tests/spark/cluster.py):
its process and its executors run in a mount namespace of their own where a copy of the store
taken before the last appends is bind-mounted over the store's path, as a network filesystem's
cache or a lagging replica would show it to that host. Needs root (``unshare -m``, ``mount``).
Not in the default suite: ``python3 run.py spark_cluster`` (TIDELOG_SPARK_CLUSTER_LONG=1;
tests/spark/conftest.py leaves this file out otherwise)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
from cluster import Driver, StandaloneCluster
from cluster_driver import PER_TRIGGER, TOPIC_IN, TOPIC_OUT
from test_cluster import DRIVER_TIMEOUT_S, payloads

import tidelog
from tidelog.records import Record

pytestmark = [pytest.mark.spark, pytest.mark.slow]

SEEN = 4 * PER_TRIGGER  # what the stale copy holds: four micro-batches
ROWS = 8 * PER_TRIGGER


def test_SPK_14_SPK_15_a_worker_whose_view_is_stale(tmp_path: Path) -> None:
    """SPK-14, SPK-15 on a real cluster: the only worker sees a copy of the store holding seqs
    1..SEEN of ROWS. A streaming query in -> out (trim `acked`, SPK-10) delivers the micro-batches
    that copy holds, then its tasks wait `freshnessTimeoutMs` and fail with `stale_view`: the
    query fails, no record the sink has not committed is trimmed, none is delivered short.
    With a worker that sees the store in its place, the query restarted from its checkpoint
    delivers the rest: every record exactly once."""
    if os.geteuid() != 0:
        pytest.skip("needs root: a mount namespace (unshare -m) and a bind mount")
    root, stale = tmp_path / "s", tmp_path / "stale-copy"
    want = [b"r%d" % i for i in range(ROWS)]
    with tidelog.open(f"file://{root}?progress_flush_ms=10") as store:
        source = store.topic(TOPIC_IN, trim="acked")
        source.append_many(want[:SEEN])
        store.flush()
        shutil.copytree(root, stale)  # the view that host keeps
        source.append_many(want[SEEN:])
        store.flush()

        cluster = StandaloneCluster(tmp_path / "cluster", workers=1)
        try:
            cluster.start(workers=False)
            cluster.start_worker(0, binds=[(stale, root)])
            cluster.wait_workers(1)
            extra = "freshnessTimeoutMs=2000"
            code, steps = Driver(cluster, root, tmp_path, f"stream:{ROWS}", extra).result(
                DRIVER_TIMEOUT_S
            )
            assert code == 3, steps  # the query failed ...
            failure = steps[0]["failed"]
            assert "stale_view" in failure or "StaleView" in failure, failure
            assert f"{root}" in failure, failure  # ... naming the store
            delivered = payloads(store, TOPIC_OUT)
            assert delivered == sorted(want[:SEEN])  # what the stale copy held, exactly once
            left = source.read(limit=1_000_000)
            kept = {r.payload for r in left if isinstance(r, Record)}
            assert set(want) - set(delivered) <= kept  # nothing undelivered was trimmed

            cluster.kill_worker(0)
            cluster.start_worker(1)  # a host that sees the store
            code, steps = Driver(cluster, root, tmp_path, "drain", extra).result(DRIVER_TIMEOUT_S)
            assert code == 0, steps
            assert payloads(store, TOPIC_OUT) == sorted(want)  # every record exactly once
        finally:
            cluster.stop()
