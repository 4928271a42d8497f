"""One SparkSession per test process (each pytest-xdist worker gets its own), shared by every
Spark test: a session costs 10-20 s to start on a small machine.

local[2], two shuffle partitions, no UI, quiet logs; Python workers run this interpreter so they
import the tidelog under test. Tests keep stores, checkpoints and outputs under ``tmp_path``.
``spark_cluster``: a standalone cluster (cluster.py) per test module that asks for it.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from typing import Any

import pytest

# The long cluster runs (more SIGKILL points, the driver killed) belong to their own nox session
# (`python3 run.py spark_cluster`, which sets TIDELOG_SPARK_CLUSTER_LONG=1), never to the default
# suite, and are not collected there at all (so never counted as skipped passes).
collect_ignore_glob = (
    []
    if os.environ.get("TIDELOG_SPARK_CLUSTER_LONG") == "1"
    else ["test_cluster_long.py", "test_cluster_stale.py"]
)


def _skip_reason() -> str | None:
    try:
        import pyspark  # noqa: F401
    except ImportError:
        return "PySpark is not installed (the `spark` extra)"
    if not (shutil.which("java") or os.environ.get("JAVA_HOME")):
        return "no Java runtime (java on PATH or JAVA_HOME)"
    return None


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    reason = _skip_reason()
    if reason:
        pytest.skip(reason)
    from tidelog.adapters.spark.demo import spark_session

    session = spark_session(
        "local[2]",
        app="tidelog-tests",
        **{
            "spark.default.parallelism": "2",
            "spark.sql.streaming.noDataMicroBatches.enabled": "false",
            "spark.driver.memory": "1g",
        },
    )
    try:
        yield session
    finally:
        for query in session.streams.active:
            query.stop()
        session.stop()


@pytest.fixture(scope="module")
def spark_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """A Spark standalone cluster on 127.0.0.1 (a master and two one-core workers from
    pyspark's spark-class, cluster.py), killed by PID with every descendant at the end."""
    reason = _skip_reason()
    if reason:
        pytest.skip(reason)
    from cluster import standalone_cluster

    with standalone_cluster(tmp_path_factory.mktemp("cluster")) as cluster:
        yield cluster
