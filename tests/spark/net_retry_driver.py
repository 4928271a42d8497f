"""A Spark driver on ``local[2,2]`` (a failed task is retried once) for test_spark_net_write.py,
run as its own process, since the tests' shared session (``local[2]``) never retries:

    python net_retry_driver.py URL TOKEN TOPIC STAGED_DIR

Writes 800 rows (ids 0..799, payload 1000 bytes + the id, tag the id) in two partitions to
TOPIC of the served store at URL. Attempt 0 of partition 0 fails at its last row, once at least
one of its chunks is staged on the owner (a file ``p0-a0-c*.arrow`` under STAGED_DIR): the
failure comes after sending (SPK-44). Prints ``ok`` when the write succeeded.
"""

from __future__ import annotations

import glob
import os
import sys
import time


def main() -> None:
    url, token, topic, staged = sys.argv[1:5]
    from pyspark import TaskContext
    from pyspark.sql.functions import col, udf

    from tidelog.adapters.spark.demo import spark_session

    conf = {
        "spark.driver.memory": "512m",
        # the writer gets its rows 50 at a time, so it stages chunks before the failure
        "spark.sql.execution.arrow.maxRecordsPerBatch": "50",
    }
    spark = spark_session("local[2,2]", app="tidelog-net-retry", **conf)

    @udf("binary")  # type: ignore[misc]
    def payload(i: int) -> bytes:
        ctx = TaskContext.get()
        if ctx is not None and ctx.partitionId() == 0 and ctx.attemptNumber() == 0 and i == 399:
            deadline = time.monotonic() + 60
            pattern = os.path.join(staged, "*", "p0-a0-c*.arrow")
            while not glob.glob(pattern):
                if time.monotonic() > deadline:
                    raise RuntimeError("attempt 0 of partition 0 staged nothing in 60 s")
                time.sleep(0.05)
            raise RuntimeError("injected failure of attempt 0 after it staged chunks")
        return b"x" * 1000 + str(i).encode()

    df = spark.range(0, 800, numPartitions=2).select(
        payload(col("id")).alias("payload"), col("id").cast("string").alias("tag")
    )
    df.write.format("tidelog").mode("append").option("topic", topic).option("token", token).save(
        url
    )
    spark.stop()
    print("ok", flush=True)


if __name__ == "__main__":
    main()
