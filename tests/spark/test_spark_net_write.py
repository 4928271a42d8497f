"""Spark writes to a served store (spec/BUNDLES.md SPK-44; spec/SERVICE.md SVC-65..SVC-68):
local[2] executors stage their rows on a real ``tidelog serve`` process on 127.0.0.1 and the
driver's commit appends them once. The serve process has tokens (``w``: every right; ``r``:
read only) and a 64 KiB request limit, so tasks send many chunks; it is killed by PID at the
end."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import tidelog
from tidelog.records import Record
from tidelog.service.auth import hash_token

pytestmark = pytest.mark.spark

WRITER, READER = "w-secret", "r-secret"
WAIT = 60.0


class Served:
    def __init__(self, url: str, root: Path) -> None:
        self.url = url
        self.root = root
        self.staged = root.parent / f".{root.name}.spark-staging" / "served"

    def records(self, topic: str) -> list[Record]:
        store = tidelog.open(self.url, token=WRITER)
        try:
            t = store.topic(topic, create=False)
            out: list[Record] = []
            while True:
                items = t.read(out[-1].seq if out else 0, 10_000)
                if not items:
                    return out
                out += [r for r in items if isinstance(r, Record)]
        finally:
            store.close()

    def leftover_chunks(self) -> list[str]:
        return sorted(str(p) for p in self.staged.glob("*/*.arrow"))


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    tmp = tmp_path_factory.mktemp("serve")
    tokens = tmp / "tokens.json"
    grants = {"w": ["read", "write", "admin"], "r": ["read"]}
    doc = [
        {"name": n, "sha256": hash_token(f"{n}-secret"), "grants": [{"topics": "*", "rights": r}]}
        for n, r in grants.items()
    ]
    tokens.write_text(json.dumps({"tokens": doc}))
    root = tmp / "store"
    argv = [
        sys.executable, "-m", "tidelog", "serve", "--port", "0",
        "--uri", f"file://{root}?progress_flush_ms=10", "--tokens", str(tokens),
        "--max-request-bytes", "64KiB",
    ]  # fmt: skip
    # cwd: never the checkout, whose ./tidelog folder `-m` would import instead of the package
    proc = subprocess.Popen(argv, cwd=tmp, text=True, stdout=subprocess.PIPE)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline().strip()
        assert line.startswith("listening on http://127.0.0.1:"), line
        yield Served(line.split(" ")[2].removesuffix("/v0"), root)
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=WAIT)


def _write(df: Any, url: str, topic: str, token: str = WRITER, **options: str) -> None:
    writer = df.write.format("tidelog").mode("append").option("topic", topic)
    for key, value in {"token": token, **options}.items():
        writer = writer.option(key, value)
    writer.save(url)


def test_SPK_44_SVC_65_SVC_66_batch_write_through_the_owner_exactly_once(
    spark: Any, served: Served
) -> None:
    """SVC-66: Four tasks stage many chunks each (64 KiB requests); the commit appends every
    row once with consecutive seqs, creating the topic with its topic.* config; nothing stays
    staged; a second job appends after it; Spark reads it all back over the network."""
    rows = [(b"p%05d-" % i + b"z" * (i % 200), f"t{i % 3}") for i in range(6000)]
    df = spark.createDataFrame(rows, "payload binary, tag string").repartition(4)
    _write(df, served.url, "bw", **{"topic.durability": "disk"})
    got = served.records("bw")
    assert sorted((r.payload, r.tag) for r in got) == sorted(rows)
    assert [r.seq for r in got] == list(range(1, 6001))
    assert served.leftover_chunks() == []
    store = tidelog.open(served.url, token=WRITER)
    assert store.topic("bw", create=False).config.durability == "disk"
    store.close()
    _write(spark.createDataFrame([(b"more",)], "payload binary"), served.url, "bw")
    assert [r.seq for r in served.records("bw")][-1] == 6001
    back = spark.read.format("tidelog").option("topic", "bw").option("token", WRITER)
    assert back.load(served.url).count() == 6001


def test_SPK_44_SPK_11_streaming_write_with_a_replay_after_restart_exactly_once(
    spark: Any, served: Served, tmp_path: Path
) -> None:
    """served -> served: micro-batches staged and committed through the owner; the checkpoint
    loses its record of the last committed batch (a crash after the sink's commit), so the
    restarted query replays it: the producer mark refuses the duplicate; new rows follow."""
    ck = tmp_path / "ck"
    owner = tidelog.open(served.url, token=WRITER)
    owner.topic("sin").append_many([b"m%d" % i for i in range(40)], tag="x")

    def run() -> Any:
        query = (
            spark.readStream.format("tidelog")
            .option("topic", "sin")
            .option("subscriber", "cp")
            .option("token", WRITER)
            .option("maxRecordsPerTrigger", 20)
            .load(served.url)
            .select("payload", "tag")
            .writeStream.format("tidelog")
            .option("topic", "sout")
            .option("token", WRITER)
            .option("checkpointLocation", str(ck))
            .trigger(availableNow=True)
            .start(served.url)
        )
        query.awaitTermination(120)
        assert query.exception() is None
        return query

    first = run()
    assert len(served.records("sout")) == 40
    os.unlink(ck / "commits" / "1")  # the crash: batch 1 applied, its commit not recorded
    for crc in (ck / "commits").glob(".1.crc"):
        crc.unlink()
    replay = run()
    assert replay.id == first.id
    assert [p["batchId"] for p in replay.recentProgress if p["numInputRows"]] == [1]
    out = served.records("sout")
    assert sorted(r.payload for r in out) == sorted(b"m%d" % i for i in range(40))
    owner.topic("sin").append_many([b"n%d" % i for i in range(5)])
    run()
    out = served.records("sout")
    assert sorted(r.payload for r in out)[-5:] == sorted(b"n%d" % i for i in range(5))
    assert len(out) == 45 and [r.seq for r in out] == list(range(1, 46))
    assert {r.tag for r in out} == {"x", None}
    assert served.leftover_chunks() == []
    owner.close()


def test_SPK_44_a_token_without_write_fails_the_task_with_forbidden(
    spark: Any, served: Served
) -> None:
    df = spark.createDataFrame([(b"a",), (b"b",)], "payload binary")
    with pytest.raises(Exception, match=r"Forbidden: token 'r' has no write right on topic 'nw'"):
        _write(df, served.url, "nw", token=READER)
    store = tidelog.open(served.url, token=WRITER)
    assert "nw" not in store.topics()
    store.close()


def test_SPK_44_SVC_51_a_row_over_the_request_limit_is_too_large(
    spark: Any, served: Served
) -> None:
    """A row larger than --max-request-bytes (64 KiB) cannot be cut: the task fails with
    too_large naming the chunk, and the job appends nothing (its abort drops what was
    staged)."""
    rows = [(b"small",)] * 10 + [(b"x" * 70_000,)]
    df = spark.createDataFrame(rows, "payload binary").coalesce(1)
    with pytest.raises(Exception, match=r"(?s)TooLarge.*max-request-bytes"):
        _write(df, served.url, "big")
    store = tidelog.open(served.url, token=WRITER)
    assert "big" not in store.topics()
    store.close()
    assert served.leftover_chunks() == []


def test_SPK_44_a_task_that_fails_after_staging_is_retried_without_duplicates(
    spark: Any, served: Served, tmp_path: Path
) -> None:
    """A driver on local[2,2] (net_retry_driver.py): attempt 0 of partition 0 fails after its
    chunks reached the owner; attempt 1 stages them again; the commit names attempt 1, so every
    row is in the topic exactly once, and the failed attempt's chunks are dropped."""
    del spark  # not used: asked for so that the test is skipped where Spark cannot run
    driver = Path(__file__).with_name("net_retry_driver.py")
    argv = [sys.executable, str(driver), served.url, WRITER, "retry", str(served.staged)]
    proc = subprocess.Popen(
        argv, cwd=tmp_path, text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    try:
        out, err = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(timeout=WAIT)
    assert proc.returncode == 0 and out.strip().endswith("ok"), err[-3000:]
    assert "injected failure of attempt 0" in err
    got = served.records("retry")
    assert sorted(int(r.tag or "-1") for r in got) == list(range(800))
    assert all(r.payload == b"x" * 1000 + (r.tag or "").encode() for r in got)
    assert served.leftover_chunks() == []
