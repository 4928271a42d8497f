"""Several writer processes on one store (spec/INSTANCES.md): ``procs`` processes, each in its
own instance slot of ``file://dir?instances=procs``, append fsync records for the same window
(single appends, or ``append_many`` batches); the rate is every process's records over the
window. One process (``instances=1``) is the measurement the others are compared with. Each
process reports its resident memory, so the table shows memory per instance."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from typing import Any

from .measure import Ctx, Metrics, percentile

__all__ = ["instances_append", "run_writers"]

#: argv: uri, size, batch, seconds, go-file. Prints READY, waits for the go file, appends for
#: ``seconds``, prints one JSON line of its counts, latencies and memory.
CHILD = textwrap.dedent(
    """
    import json, os, random, sys, time

    def rss():
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
        return 0

    uri, size, batch, seconds, go = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), float(
        sys.argv[4]), sys.argv[5]
    import tidelog
    before = rss()
    store = tidelog.open(uri)
    topic = store.topic("bench", durability="fsync")
    data = random.Random(size).randbytes(size)
    many = [data] * batch
    topic.append(data)  # warm: topic created in this instance, first file touched
    print("READY", flush=True)
    deadline = time.monotonic() + 120
    while not os.path.exists(go) and time.monotonic() < deadline:
        time.sleep(0.001)
    n, lat = 0, []
    t0 = time.perf_counter()
    end = t0 + seconds
    now = t0
    while now < end:
        if batch == 1:
            topic.append(data)
            n += 1
        else:
            n += len(topic.append_many(many))
        t = time.perf_counter()
        lat.append(t - now)
        now = t
    elapsed = now - t0
    peak = rss()
    store.close()
    print(json.dumps({"n": n, "elapsed": elapsed, "lat": lat, "rss": peak,
                      "rss_store": peak - before}), flush=True)
    """
)


def run_writers(
    root: str, procs: int, size: int, batch: int, seconds: float
) -> list[dict[str, Any]]:
    """Start ``procs`` writers on ``root``, release them at once, and return their reports.
    Every process is killed by PID if it outlives its time."""
    uri = f"file://{root}?instances={procs}"
    go = os.path.join(os.path.dirname(root), f"go-{os.path.basename(root)}")
    children = [
        subprocess.Popen(
            [sys.executable, "-c", CHILD, uri, str(size), str(batch), str(seconds), go],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(procs)
    ]
    try:
        for child in children:
            assert child.stdout is not None
            line = child.stdout.readline()
            if line.strip() != "READY":
                raise RuntimeError(f"writer failed to start: {child.communicate()[1][-2000:]}")
        with open(go, "w"):
            pass
        reports = []
        for child in children:
            out, err = child.communicate(timeout=seconds + 120)
            if child.returncode != 0:
                raise RuntimeError(f"writer failed: {err[-2000:]}")
            reports.append(json.loads(out.strip().splitlines()[-1]))
        return reports
    finally:
        for child in children:
            if child.poll() is None:
                child.kill()
                child.wait(timeout=30)
        if os.path.exists(go):
            os.unlink(go)


def instances_append(ctx: Ctx, procs: int, batch: int = 1) -> Metrics:
    """``procs`` processes of fsync appends (``batch`` 1) or ``append_many(batch)`` on one
    store of ``procs`` instances, side by side in one window."""
    root = os.path.join(ctx.base, f"inst-{procs}-{batch}")
    t0 = time.perf_counter()
    reports = run_writers(root, procs, ctx.size, batch, ctx.seconds)
    wall = time.perf_counter() - t0
    n = sum(r["n"] for r in reports)
    window = max(r["elapsed"] for r in reports)
    lat = sorted(x for r in reports for x in r["lat"])
    out: Metrics = {
        "rec_per_s": n / window,
        "mb_per_s": n * ctx.size / window / 1e6,
        "procs": procs,
        "rss_mib_per_instance": max(r["rss"] for r in reports) / (1 << 20),
        "store_rss_mib_per_instance": max(r["rss_store"] for r in reports) / (1 << 20),
        "wall_s": wall,
    }
    key = "p50_us" if batch == 1 else "p50_us_per_batch"
    out[key] = percentile(lat, 0.5) * 1e6
    if batch == 1:
        out["p99_us"] = percentile(lat, 0.99) * 1e6
    return out


# --- the report's part -------------------------------------------------------------------------

#: (case id, processes, batch): the cases ``catalog`` lists, one process first
CASES = (
    ("tl_inst_fsync_p1", 1, 1),
    ("tl_inst_fsync_p2", 2, 1),
    ("tl_inst_fsync_p8", 8, 1),
    ("tl_inst_fsync_many_p1", 1, 1000),
    ("tl_inst_fsync_many_p2", 2, 1000),
)

TARGETS = [
    ("instances_p2", "2 processes of fsync appends (instances=2) >= 1.8x one process"),
    ("instances_many_p2", "2 processes of fsync append_many(1000) >= 1.8x one process"),
    ("instances_p8", "8 processes of fsync appends (instances=8) >= 4x one process"),
]


def _med(rows: list[dict[str, Any]], cid: str, metric: str = "rec_per_s") -> float | None:
    for r in rows:
        if r["id"] == cid and r["size"] == 100 and metric in r["metrics"]:
            return float(r["metrics"][metric]["median"])
    return None


def targets(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The instances targets in ``report``'s form (value, goal, met, detail)."""
    text = dict(TARGETS)
    out: list[dict[str, Any]] = []
    for key, cid, base in (
        ("instances_p2", "tl_inst_fsync_p2", "tl_inst_fsync_p1"),
        ("instances_many_p2", "tl_inst_fsync_many_p2", "tl_inst_fsync_many_p1"),
        ("instances_p8", "tl_inst_fsync_p8", "tl_inst_fsync_p1"),
    ):
        a, b = _med(rows, cid), _med(rows, base)
        value = None if a is None or not b else a / b
        goal = 4.0 if key == "instances_p8" else 1.8
        met = None if value is None else value >= goal
        out.append(
            {"id": key, "target": text[key], "value": value, "goal": goal, "met": met,
             "detail": f"x {base}"}
        )  # fmt: skip
    return out


def section(rows: list[dict[str, Any]]) -> list[str]:
    """Each instances row: its rate against one process, and memory per instance."""
    out: list[str] = []
    for r in rows:
        if not r["id"].startswith("tl_inst_"):
            continue
        if not out:
            out = ["", "## several writer processes (file://?instances=N, spec/INSTANCES.md)", ""]
        base = "tl_inst_fsync_many_p1" if "_many_" in r["id"] else "tl_inst_fsync_p1"
        mine, one = _med(rows, r["id"]), _med(rows, base)
        m = r["metrics"]
        ratio = f"{mine / one:.2f}x {base}" if mine and one and r["size"] == 100 else "-"
        out.append(
            f"- {r['id']} @ {r['size']}: {m['rec_per_s']['median']:,.0f} rec/s ({ratio}); "
            f"RSS per instance {m['rss_mib_per_instance']['median']:.1f} MiB, of which the "
            f"open store and its appends {m['store_rss_mib_per_instance']['median']:.1f} MiB"
        )
    return out
