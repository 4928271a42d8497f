"""A Spark driver for the standalone-cluster tests (test_cluster.py), run as its own process:

    python cluster_driver.py MASTER STORE WORK STEP... [key=value ...]

Steps, in order: ``batch:N`` writes N rows (payload ``r<id>``) into topic ``in`` with the
tidelog sink, then reads topic ``in`` back with the tidelog source and writes ``seq, payload``
to WORK/pq; ``stream:S`` runs the query ``in`` -> ``out`` (the exactly-once sink, SPK-11) with
the checkpoint WORK/ck on a processing-time trigger until its source has offered seq S, then
stops it; ``await:S`` waits until topic ``in`` reaches seq S (this process's read-only view);
``drain`` restarts the query from the checkpoint once (availableNow). Trailing ``key=value``
arguments are tidelog options of the reads (e.g. ``cold=...``). The store's owner is the test's
process; this one reaches it only through Spark's processes (SPK-2). Prints one JSON line per
step; exit status 3 when a query failed.
"""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Any

TOPIC_IN, TOPIC_OUT, SUBSCRIBER = "in", "out", "cluster"
PER_TRIGGER = 1500
TIMEOUT_S = 600
CONF = {
    "spark.executor.memory": "512m",
    "spark.executor.cores": "1",
    "spark.cores.max": "2",
    "spark.driver.memory": "512m",
    "spark.driver.host": "127.0.0.1",
    "spark.driver.bindAddress": "127.0.0.1",
    "spark.default.parallelism": "2",
    "spark.sql.streaming.noDataMicroBatches.enabled": "false",
}


def batch(spark: Any, store: str, work: str, rows: int, extra: dict[str, str]) -> dict[str, Any]:
    df = spark.range(0, rows, numPartitions=4).selectExpr(
        "cast(concat('r', cast(id as string)) as binary) as payload"
    )
    df.write.format("tidelog").mode("append").option("topic", TOPIC_IN).save(store)
    back = spark.read.format("tidelog").option("topic", TOPIC_IN).options(**extra).load(store)
    back.select("seq", "payload").write.mode("overwrite").parquet(os.path.join(work, "pq"))
    return {"tasks": back.rdd.getNumPartitions()}


def _end(progress: Any) -> int:
    end = progress and progress["sources"][0].get("endOffset")
    if not end:
        return 0
    return int(json.loads(end)["seq"] if isinstance(end, str) else end["seq"])


def stream(
    spark: Any, store: str, work: str, until: int | None, extra: dict[str, str]
) -> dict[str, Any]:
    """``until`` None: once over what is there (availableNow)."""
    writer = (
        spark.readStream.format("tidelog")
        .option("topic", TOPIC_IN)
        .option("subscriber", SUBSCRIBER)
        .option("startingOffsets", "earliest")
        .option("maxRecordsPerTrigger", PER_TRIGGER)
        .options(**extra)
        .load(store)
        .select("payload", "tag")
        .writeStream.format("tidelog")
        .option("topic", TOPIC_OUT)
        .option("checkpointLocation", os.path.join(work, "ck"))
    )
    if until is None:
        query = writer.trigger(availableNow=True).start(store)
        query.awaitTermination(TIMEOUT_S)
    else:
        query = writer.trigger(processingTime="300 milliseconds").start(store)
        deadline = time.monotonic() + TIMEOUT_S
        while query.exception() is None and _end(query.lastProgress) < until:
            if time.monotonic() > deadline:
                query.stop()
                return {"failed": f"seq {until} not reached within {TIMEOUT_S} s"}
            time.sleep(0.2)
    failure = query.exception()
    query.stop()
    if failure is not None:
        return {"failed": str(failure)[:2000]}
    return {"batches": len([p for p in query.recentProgress if p["numInputRows"]])}


def await_head(store: str, head: int, extra: dict[str, str]) -> dict[str, Any]:
    import tidelog

    deadline = time.monotonic() + TIMEOUT_S
    cold = {k: v for k, v in extra.items() if k == "cold"}  # the view needs the cold tier
    with tidelog.open(f"file://{store}", readonly=True, **cold) as view:
        while view.topic(TOPIC_IN, create=False).state().head_seq < head:
            if time.monotonic() > deadline:
                return {"failed": f"topic {TOPIC_IN} did not reach {head}"}
            time.sleep(0.1)
            view.refresh()
    return {"head": head}


def main(argv: list[str]) -> int:
    master, store, work, *args = argv
    extra = dict(a.split("=", 1) for a in args if "=" in a)
    steps = [a for a in args if "=" not in a]
    from tidelog.adapters.spark.demo import spark_session

    spark = spark_session(master, app="tidelog-cluster", **CONF)
    try:
        for step in steps:
            kind, _, arg = step.partition(":")
            if kind == "batch":
                result = batch(spark, store, work, int(arg), extra)
            elif kind == "stream":
                result = stream(spark, store, work, int(arg), extra)
            elif kind == "await":
                result = await_head(store, int(arg), extra)
            else:
                result = stream(spark, store, work, None, extra)
            print(json.dumps({"step": step, **result}), flush=True)
            if "failed" in result:
                return 3
    finally:
        spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
