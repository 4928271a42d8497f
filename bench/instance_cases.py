"""Several writer processes on one store (spec/INSTANCES.md): ``procs`` processes, each in its
own instance slot of ``file://dir?instances=procs``, append fsync records for the same window
(single appends, or ``append_many`` batches); the rate is every process's records over the
window. One process (``instances=1``) is the measurement the others are compared with. Each
process reports its resident memory, so the table shows memory per instance.

The ceiling beside each: ``procs`` processes released the same way, each doing raw
``os.pwrite`` + ``os.fdatasync`` of the same records (one per call, or 1000 joined) into its own
zero-filled, synced file: what this device and these cores give ``procs`` concurrently syncing
Python processes, so a ratio is read against the ratio the device allows. Every child also
reports its CPU seconds and the bytes it passed to write calls (``wchar`` of ``/proc/self/io``: WAL,
segments, checkpoints; its ``write_bytes`` counts 1 MiB per synced page on this VM's kernel, so
it is not used) over the window, and the device's sectors written and flushes over the window
are read around it: CPU and bytes per record say whether the store or the device bounds a
rate."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from typing import Any

from .measure import Ctx, Io, Metrics, percentile

__all__ = ["instances_append", "run_writers"]

#: argv: mode (``tidelog`` or ``raw``), target (a store URI, or a file path for ``raw``), size,
#: batch, seconds, go-file. Prints READY, waits for the go file, appends for ``seconds``, prints
#: one JSON line of its counts, latencies, CPU seconds, bytes written and memory.
CHILD = textwrap.dedent(
    """
    import json, os, random, sys, time

    def rss():
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
        return 0

    def written():
        try:
            with open("/proc/self/io") as f:
                for line in f:
                    if line.startswith("wchar:"):
                        return int(line.split()[1])
        except OSError:
            pass
        return 0

    cpu = time.process_time  # every thread of the process, user + system

    mode, target, size, batch, seconds, go = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(
        sys.argv[4]), float(sys.argv[5]), sys.argv[6]
    data = random.Random(size).randbytes(size)
    many = [data] * batch
    before = rss()
    if mode != "raw":
        import tidelog
        from tidelog.backends.instances import InstancesBackend
        from tidelog.hooks import hooks
        store = tidelog.open(target)
        own = hooks(store, InstancesBackend).own  # this process's instance (INST-3)

        def wal():
            return dict(own.describe()["wal"])

        if mode == "steady":
            # as cases._steady (bounded): until a recycled WAL file (WAL-15) takes the frames, then
            # checkpoint and sync, so the window pays neither new files nor the warm-up
            from tidelog.bench.cases import warm_to_steady

            warm_to_steady(store.topic("warm-up", durability="disk").append_many, wal)
            own.checkpoint()
            os.sync()
        recycled = wal()["recycled_files"]  # before the window: 1 or more once steady
        topic = store.topic("bench", durability="fsync")
        topic.append(data)  # warm: topic created in this instance, first file touched

        def step():
            if batch == 1:
                topic.append(data)
                return 1
            return len(topic.append_many(many))
    else:
        # the ceiling: a zero-filled, synced file overwritten cyclically (no metadata change)
        from tidelog.bench.limits import _prealloc_zero as prealloc_zero
        fd = os.open(target, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
        chunk = size * batch
        prealloc = max(4 << 20, chunk * 64)
        prealloc_zero(fd, prealloc)
        off = [0]

        def step():
            o = off[0]
            if o + chunk > prealloc:
                o = 0
            os.pwrite(fd, data if batch == 1 else b"".join(many), o)
            os.fdatasync(fd)
            off[0] = o + chunk
            return batch
    print("READY", flush=True)
    deadline = time.monotonic() + 120
    while not os.path.exists(go) and time.monotonic() < deadline:
        time.sleep(0.001)
    n, lat = 0, []
    cpu0, io0 = cpu(), written()
    wal0 = wal() if mode != "raw" else {}
    t0 = time.perf_counter()
    end = t0 + seconds
    now = t0
    while now < end:
        n += step()
        t = time.perf_counter()
        lat.append(t - now)
        now = t
    elapsed = now - t0
    cpu_s, wbytes = cpu() - cpu0, written() - io0
    # the WAL's own counters over the window: syncs, frame bytes, bytes zeroed ahead
    walw = {k: v - wal0[k] for k, v in wal().items() if k in wal0} if mode != "raw" else {}
    peak = rss()
    if mode != "raw":
        store.close()
    else:
        os.close(fd)
        os.unlink(target)
    print(json.dumps({"n": n, "elapsed": elapsed, "lat": lat, "rss": peak,
                      "rss_store": peak - before, "cpu_s": cpu_s, "wchar": wbytes,
                      "wal": walw, "recycled_before": recycled if mode != "raw" else 0}),
          flush=True)
    """
)


def run_writers(
    root: str,
    procs: int,
    size: int,
    batch: int,
    seconds: float,
    raw: bool = False,
    device: str | None = None,
    steady: bool = False,
    options: str = "",
) -> list[dict[str, Any]]:
    """Start ``procs`` writers on ``root`` (the store of ``procs`` instances, or with ``raw``
    a directory of one file per writer), release them at once, and return their reports;
    ``steady``: each writer first brings its instance to its steady state (a recycled WAL
    file, WAL-15), as ``cases._steady`` does; ``options``: more ``file://`` options of the
    store (``k=v&...``).
    With ``device``, the first report also has the device's ``dev`` counters from the release
    to the last report (``measure.Io``). Every process is killed by PID if it outlives its
    time."""
    if raw:
        os.makedirs(root, exist_ok=True)
        targets = [("raw", os.path.join(root, f"w{i}")) for i in range(procs)]
    else:
        mode = "steady" if steady else "tidelog"
        extra = f"&{options}" if options else ""
        targets = [(mode, f"file://{root}?instances={procs}{extra}")] * procs
    go = os.path.join(os.path.dirname(root), f"go-{os.path.basename(root)}")
    children = [
        subprocess.Popen(
            [sys.executable, "-c", CHILD, mode, target, str(size), str(batch), str(seconds), go],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for mode, target in targets
    ]
    try:
        for child in children:
            assert child.stdout is not None
            line = child.stdout.readline()
            if line.strip() != "READY":
                raise RuntimeError(f"writer failed to start: {child.communicate()[1][-2000:]}")
        io = Io(device)
        with open(go, "w"):
            pass
        reports = []
        for child in children:
            out, err = child.communicate(timeout=seconds + 120)
            if child.returncode != 0:
                raise RuntimeError(f"writer failed: {err[-2000:]}")
            reports.append(json.loads(out.strip().splitlines()[-1]))
        n = sum(r["n"] for r in reports)
        reports[0]["dev"] = io.stop(n, n * size)
        return reports
    finally:
        for child in children:
            if child.poll() is None:
                child.kill()
                child.wait(timeout=30)
        if os.path.exists(go):
            os.unlink(go)


def instances_append(
    ctx: Ctx, procs: int, batch: int = 1, raw: bool = False, steady: bool = False
) -> Metrics:
    """``procs`` processes of fsync appends (``batch`` 1) or ``append_many(batch)`` on one
    store of ``procs`` instances, side by side in one window; with ``raw``, the ceiling: the
    same processes' raw pwrite + fdatasync of the same records, each into its own file."""
    kind = "raw" if raw else "steady" if steady else "inst"
    root = os.path.join(ctx.base, f"{kind}-{procs}-{batch}")
    t0 = time.perf_counter()
    reports = run_writers(
        root, procs, ctx.size, batch, ctx.seconds, raw=raw, device=ctx.device, steady=steady
    )
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
        # what bounds the rate: CPU per record (all of a process's threads) and bytes the
        # processes wrote per record (WAL, segments, checkpoints)
        "cpu_us_per_rec": sum(r["cpu_s"] for r in reports) / max(n, 1) * 1e6,
        "cpu_share": sum(r["cpu_s"] for r in reports) / window / (os.cpu_count() or 1),
        "bytes_per_rec": sum(r["wchar"] for r in reports) / max(n, 1),
        "wall_s": wall,
    }
    out.update(
        {k: v for k, v in reports[0]["dev"].items() if k.startswith("dev_") and "payload" not in k}
    )
    if not raw:  # the WAL's share of the bytes and syncs (describe()["wal"], per instance)
        wal = {k: sum(r["wal"].get(k, 0) for r in reports) for k in reports[0]["wal"]}
        out["wal_bytes_per_rec"] = wal.get("submitted_bytes", 0) / max(n, 1)
        out["wal_zeroed_per_rec"] = wal.get("zeroed_bytes", 0) / max(n, 1)
        out["fdatasync_per_rec"] = wal.get("fdatasyncs", 0) / max(n, 1)
    key = "p50_us" if batch == 1 else "p50_us_per_batch"
    out[key] = percentile(lat, 0.5) * 1e6
    if batch == 1:
        out["p99_us"] = percentile(lat, 0.99) * 1e6
    return out


# --- the report's part -------------------------------------------------------------------------

#: (case id, processes, batch, kind): the cases ``catalog`` lists, one process first; kind
#: "tidelog" (a new store), "steady" (each instance first in its steady state, WAL-15) or "raw"
#: (the ceiling); each tidelog case ``tl_inst_..._pN`` has its ceiling (``ceiling``)
CASES = (
    ("tl_inst_fsync_p1", 1, 1, "tidelog"),
    ("tl_inst_fsync_p2", 2, 1, "tidelog"),
    ("tl_inst_fsync_p8", 8, 1, "tidelog"),
    ("tl_inst_fsync_many_p1", 1, 1000, "tidelog"),
    ("tl_inst_fsync_many_p2", 2, 1000, "tidelog"),
    ("tl_inst_fsync_many_steady_p1", 1, 1000, "steady"),
    ("tl_inst_fsync_many_steady_p2", 2, 1000, "steady"),
    ("raw_inst_fsync_p1", 1, 1, "raw"),
    ("raw_inst_fsync_p2", 2, 1, "raw"),
    ("raw_inst_fsync_p8", 8, 1, "raw"),
    ("raw_inst_fsync_many_p1", 1, 1000, "raw"),
    ("raw_inst_fsync_many_p2", 2, 1000, "raw"),
)


def ceiling(cid: str) -> str:
    """The raw case of the same processes and batch as tidelog case ``cid``."""
    return "raw_" + cid.removeprefix("tl_").replace("_steady", "")


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


def _ratio(rows: list[dict[str, Any]], cid: str, base: str) -> float | None:
    a, b = _med(rows, cid), _med(rows, base)
    return None if a is None or not b else a / b


def targets(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The instances targets in ``report``'s form (value, goal, met, detail); the detail
    names the ceiling's ratio for the same processes (what the device allows)."""
    text = dict(TARGETS)
    out: list[dict[str, Any]] = []
    for key, cid, base in (
        ("instances_p2", "tl_inst_fsync_p2", "tl_inst_fsync_p1"),
        ("instances_many_p2", "tl_inst_fsync_many_p2", "tl_inst_fsync_many_p1"),
        ("instances_p8", "tl_inst_fsync_p8", "tl_inst_fsync_p1"),
    ):
        value = _ratio(rows, cid, base)
        allowed = _ratio(rows, ceiling(cid), ceiling(base))
        goal = 4.0 if key == "instances_p8" else 1.8
        met = None if value is None else value >= goal
        detail = f"x {base}"
        if allowed is not None:
            detail += f"; raw ceiling {allowed:.2f}x"
        out.append(
            {"id": key, "target": text[key], "value": value, "goal": goal, "met": met,
             "detail": detail}
        )  # fmt: skip
    return out


def section(rows: list[dict[str, Any]]) -> list[str]:
    """Each instances row and its ceiling: the rate against one process, CPU and bytes
    written per record, and memory per instance."""
    out: list[str] = []
    for r in rows:
        if not r["id"].startswith(("tl_inst_", "raw_inst_")) or r["size"] != 100:
            continue
        if not out:
            out = ["", "## several writer processes (file://?instances=N, spec/INSTANCES.md)", ""]
        raw = r["id"].startswith("raw_")
        steady = "_steady" if "_steady_" in r["id"] else ""
        base = ("raw_" if raw else "tl_") + (
            f"inst_fsync_many{steady}_p1" if "_many_" in r["id"] else "inst_fsync_p1"
        )
        ratio = _ratio(rows, r["id"], base)
        m = r["metrics"]
        line = f"- {r['id']}: {m['rec_per_s']['median']:,.0f} rec/s"
        line += f" ({ratio:.2f}x {base})" if ratio is not None else ""
        if not raw:
            of = _ratio(rows, r["id"], ceiling(r["id"]))
            line += f", {of:.2f}x its ceiling" if of is not None else ""
        if "cpu_us_per_rec" in m:
            line += (
                f"; CPU {m['cpu_us_per_rec']['median']:.1f} µs/rec, write calls "
                f"{m['bytes_per_rec']['median']:.0f} B/rec"
            )
        if "wal_bytes_per_rec" in m:
            line += (
                f" (WAL frames {m['wal_bytes_per_rec']['median']:.0f}, zeroed ahead "
                f"{m['wal_zeroed_per_rec']['median']:.0f}; "
                f"{m['fdatasync_per_rec']['median']:.3f} fdatasyncs/rec)"
            )
        if "dev_wbytes_per_rec" in m:
            line += f" (device: {m['dev_wbytes_per_rec']['median']:.0f} B/rec"
            if "dev_flushes_per_rec" in m:
                line += f", {m['dev_flushes_per_rec']['median']:.2f} flushes/rec"
            line += ")"
        if not raw:
            line += (
                f"; RSS per instance {m['rss_mib_per_instance']['median']:.1f} MiB, of which "
                f"the open store and its appends {m['store_rss_mib_per_instance']['median']:.1f}"
                " MiB"
            )
        out.append(line)
    return out
