"""The benchmark run: every case, side by side, in interleaved rounds (so drift on a shared
machine hits every case alike), then medians with min–max, ratios, targets, JSON, a table and a
plot (``report``). ``tidelog bench`` and ``nox -s bench`` call ``main``.

Durability tiers (for "best peer of equal durability"):
  durable   an acknowledged put survives power loss (fdatasync before returning)
  buffered  it does not: it survives at best a process crash, or only until the next
            periodic commit / close (each row's guarantee says which)
"""

from __future__ import annotations

import functools
import os
import platform
import shutil
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from . import cases, isolated, limits, peers
from .measure import Ctx, Metrics, device_of

__all__ = ["Case", "CASES", "Settings", "run", "main"]

SIZES = (100, 4096)


@dataclass(frozen=True)
class Case:
    id: str
    label: str
    group: str  # "limit" | "tidelog" | "peer"
    fn: Callable[[Ctx], Metrics]
    tier: str = "-"  # "durable" | "buffered" | "-" (limits, reads)
    mode: str = "single"  # single | batch | read | consume | other
    limit: str | None = None  # the physical limit this case is compared with
    guarantee: str = ""
    sizes: tuple[int, ...] = SIZES
    quick: bool = True


def _bd_page_payload() -> int:
    from tidelog.backends.blockdev.format import max_payload

    return int(max_payload(4096))


P = functools.partial
_DUR = "acknowledged put survives power loss"
CASES: list[Case] = [
    # -- physical limits ------------------------------------------------------------------------
    Case("raw_append", "os.write+fdatasync per record, appending", "limit", limits.raw_append,
         "durable", guarantee=_DUR),
    Case("raw_overwrite", "os.pwrite+fdatasync per record, overwriting a preallocated file",
         "limit", limits.raw_overwrite, "durable", guarantee=_DUR),
    Case("raw_joined", "1000 records joined: one os.pwrite + one fdatasync", "limit",
         limits.raw_joined, "durable", "batch", guarantee=_DUR),
    Case("seq_write", "1 MiB sequential os.write, fdatasync at end", "limit", limits.seq_write,
         mode="other", sizes=(1 << 20,)),
    Case("mmap_read", "mmap read of a page-cached file (record-sized slices -> bytes)", "limit",
         limits.mmap_read, mode="read"),
    Case("loop_floor", "Python per-record floor: pack header + copy + XXH3 (no I/O)", "limit",
         limits.loop_floor, mode="other"),
    # -- tidelog ---------------------------------------------------------------------------------
    Case("tl_memory", "tidelog memory:// append, 1 thread", "tidelog", cases.memory_single,
         "buffered", limit="loop_floor", guarantee="process memory only"),
    Case("tl_file_fsync", "tidelog file:// fsync append, 1 thread", "tidelog",
         P(cases.file_single, durability="fsync"), "durable", limit="raw_overwrite",
         guarantee=_DUR),
    Case("tl_file_fsync_steady", "tidelog file:// fsync append, 1 thread, steady state "
         "(recycled WAL file, WAL-15)", "tidelog",
         P(cases.file_single, durability="fsync", steady=True), "durable",
         limit="raw_overwrite", guarantee=_DUR),
    Case("tl_file_disk", "tidelog file:// disk append, 1 thread", "tidelog",
         P(cases.file_single, durability="disk"), "buffered", limit="loop_floor",
         guarantee="synced within commit_interval_ms (10 ms); crash loses a suffix, seqs kept"),
    Case("tl_file_memory", "tidelog file:// memory append, 1 thread", "tidelog",
         P(cases.file_single, durability="memory"), "buffered", limit="loop_floor",
         guarantee="as disk, but head may regress after a crash (DUR-4)"),
    Case("tl_file_ephemeral", "tidelog file:// ephemeral append, 1 thread", "tidelog",
         P(cases.file_single, durability="ephemeral"), "buffered", limit="loop_floor",
         guarantee="records end with the process (DUR-5)"),
    Case("tl_file_fsync_many", "tidelog file:// fsync append_many(1000), 1 thread", "tidelog",
         P(cases.file_many, durability="fsync"), "durable", "batch", limit="raw_joined",
         guarantee=_DUR),
    Case("tl_file_fsync_many_steady", "tidelog file:// fsync append_many(1000), 1 thread, "
         "steady state (recycled WAL file, WAL-15)", "tidelog",
         P(cases.file_many, durability="fsync", steady=True), "durable", "batch",
         limit="raw_joined", guarantee=_DUR),
    Case("tl_file_disk_many", "tidelog file:// disk append_many(1000), 1 thread", "tidelog",
         P(cases.file_many, durability="disk"), "buffered", "batch", limit="loop_floor",
         guarantee="synced within commit_interval_ms (10 ms)"),
    Case("tl_file_fsync_t8", "tidelog file:// fsync append, 8 threads (group commit)", "tidelog",
         P(cases.file_threads, durability="fsync"), "durable", limit="raw_overwrite",
         guarantee=_DUR),
    Case("tl_blockdev_fsync", "tidelog blockdev:// image fsync append, 1 thread", "tidelog",
         P(cases.blockdev_single, durability="fsync"), "durable", limit="raw_overwrite",
         guarantee=_DUR, sizes=(100, -1)),
    Case("tl_blockdev_fsync_many", "tidelog blockdev:// image fsync append_many(1000)",
         "tidelog", P(cases.blockdev_many, durability="fsync"), "durable", "batch",
         limit="raw_joined", guarantee=_DUR, sizes=(100, -1)),
    Case("tl_read_sealed", "tidelog file:// read(after, limit=10000), sealed segments",
         "tidelog", cases.read_sealed, mode="read", limit="mmap_read"),
    Case("tl_read_tail", "tidelog file:// read(after, limit=10000), unsealed tail", "tidelog",
         cases.read_tail, mode="read", limit="mmap_read"),
    Case("tl_sub_commit", "tidelog subscriber poll(1000) + commit(last)", "tidelog",
         cases.subscriber_commit, "buffered", "consume", limit="mmap_read",
         guarantee="progress file at least once (DUR-9)"),
    Case("tl_sub_ack", "tidelog subscriber poll(1000) + ack(seq) per record", "tidelog",
         cases.subscriber_ack, "buffered", "consume", limit="mmap_read",
         guarantee="progress file at least once (DUR-9)"),
    # -- peers -------------------------------------------------------------------------------------
    Case("sqlite_full_1", "sqlite3 WAL synchronous=FULL, 1 row/txn", "peer",
         P(peers.sqlite, synchronous="FULL", per_txn=1), "durable", guarantee=_DUR),
    Case("sqlite_full_1000", "sqlite3 WAL synchronous=FULL, 1000 rows/txn", "peer",
         P(peers.sqlite, synchronous="FULL", per_txn=1000), "durable", "batch", guarantee=_DUR),
    Case("sqlite_normal_1", "sqlite3 WAL synchronous=NORMAL, 1 row/txn", "peer",
         P(peers.sqlite, synchronous="NORMAL", per_txn=1), "buffered",
         guarantee="survives a process crash, not power loss"),
    Case("sqlite_normal_1000", "sqlite3 WAL synchronous=NORMAL, 1000 rows/txn", "peer",
         P(peers.sqlite, synchronous="NORMAL", per_txn=1000), "buffered", "batch",
         guarantee="survives a process crash, not power loss"),
    Case("pq_sqlite", "persist-queue SQLiteQueue (WAL, FULL)", "peer", peers.persist_queue,
         "durable", guarantee=_DUR),
    Case("pq_sqlite_ack", "persist-queue SQLiteAckQueue (WAL, FULL)", "peer",
         P(peers.persist_queue, ack=True), "durable", guarantee=_DUR),
    Case("dc_sync2", "diskcache Deque sqlite_synchronous=2 (FULL)", "peer",
         P(peers.diskcache_deque, sqlite_synchronous=2), "durable", guarantee=_DUR),
    Case("dc_default", "diskcache Deque default (synchronous=1 NORMAL)", "peer",
         P(peers.diskcache_deque, sqlite_synchronous=None), "buffered",
         guarantee="survives a process crash, not power loss"),
    Case("queuelib_fifo", "queuelib FifoDiskQueue (never fsyncs)", "peer", peers.queuelib_fifo,
         "buffered", guarantee="head/tail info written only at close: a crash loses the queue"),
    Case("litequeue", "litequeue default (WAL, NORMAL hard-coded)", "peer",
         P(peers.litequeue_queue, full=False), "buffered",
         guarantee="survives a process crash, not power loss"),
    Case("litequeue_full", "litequeue + PRAGMA synchronous=FULL", "peer",
         P(peers.litequeue_queue, full=True), "durable", guarantee=_DUR),
    Case("lmdb_sync_1", "lmdb sync=True, 1 put/txn", "peer",
         P(peers.lmdb_env, sync=True, per_txn=1), "durable", guarantee=_DUR),
    Case("lmdb_sync_1000", "lmdb sync=True, 1000 puts/txn", "peer",
         P(peers.lmdb_env, sync=True, per_txn=1000), "durable", "batch", guarantee=_DUR),
    Case("lmdb_nosync_1", "lmdb sync=False, 1 put/txn", "peer",
         P(peers.lmdb_env, sync=False, per_txn=1), "buffered",
         guarantee="survives a process crash, not power loss"),
    Case("lmdb_nosync_1000", "lmdb sync=False, 1000 puts/txn", "peer",
         P(peers.lmdb_env, sync=False, per_txn=1000), "buffered", "batch",
         guarantee="survives a process crash, not power loss"),
]  # fmt: skip


@dataclass
class Settings:
    quick: bool = False
    repeats: int = 5
    seconds: float = 1.0
    directory: str | None = None
    out: str = "bench-results"
    only: list[str] = field(default_factory=list)
    sizes: tuple[int, ...] = SIZES
    recovery_bytes: int = 1 << 30
    rss_records: int = 2_000_000
    isolated: bool = True
    plot: bool = True

    @classmethod
    def for_mode(cls, quick: bool, **overrides: Any) -> Settings:
        if quick:
            base = cls(quick=True, repeats=3, seconds=0.12, recovery_bytes=32 << 20,
                       rss_records=200_000)  # fmt: skip
        else:
            base = cls()
        for k, v in overrides.items():
            if v is not None:
                setattr(base, k, v)
        return base


def _versions() -> dict[str, str]:
    import sqlite3
    from importlib import metadata

    out = {"python": sys.version.split()[0], "sqlite": sqlite3.sqlite_version}
    for dist in ("tidelog", "persist-queue", "diskcache", "queuelib", "litequeue", "lmdb",
                 "xxhash"):  # fmt: skip
        try:
            out[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            out[dist] = "missing"
    return out


def _machine(directory: str) -> dict[str, Any]:
    out: dict[str, Any] = {
        "platform": platform.platform(),
        "cpus": os.cpu_count(),
        "directory": directory,
        "device": device_of(directory),
        "loadavg_start": os.getloadavg(),
    }
    try:
        with open("/proc/cpuinfo", encoding="ascii", errors="replace") as f:
            for line in f:
                if line.startswith("model name"):
                    out["cpu"] = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return out


def _selected(settings: Settings) -> list[Case]:
    chosen = []
    for c in CASES:
        if settings.only and not any(c.id.startswith(p) for p in settings.only):
            continue
        chosen.append(c)
    return chosen


def _sizes(case: Case, settings: Settings) -> list[int]:
    out = []
    for s in case.sizes:
        if s == -1:
            s = _bd_page_payload()
            if 4096 not in settings.sizes:
                continue
        elif s not in settings.sizes and s != 1 << 20:
            continue
        out.append(s)
    return out


def _progress(msg: str) -> None:
    sys.stderr.write(msg + "\n")
    sys.stderr.flush()


def run(settings: Settings) -> dict[str, Any]:
    """Run every selected case ``settings.repeats`` times, interleaved; then the isolated
    measurements. Returns the raw results (``report`` summarises them)."""
    start = time.time()
    run_dir = tempfile.mkdtemp(prefix="tidelog-bench-", dir=settings.directory)
    device = device_of(run_dir)
    chosen = _selected(settings)
    unavailable: dict[str, str] = {}
    samples: dict[str, list[Metrics]] = {}
    try:
        for r in range(settings.repeats):
            for case in chosen:
                for size in _sizes(case, settings):
                    key = f"{case.id}@{size}"
                    if key in unavailable:
                        continue
                    base = tempfile.mkdtemp(prefix=case.id + "-", dir=run_dir)
                    ctx = Ctx(base, settings.seconds, size, settings.quick, device, run_dir, r,
                              settings.repeats)  # fmt: skip
                    try:
                        m = case.fn(ctx)
                    except ImportError as exc:  # a peer not installed: say so, keep going
                        unavailable[key] = f"not installed: {exc.name or exc}"
                        continue
                    except Exception as exc:
                        unavailable[key] = f"failed: {type(exc).__name__}: {exc}"
                        traceback.print_exc()
                        continue
                    finally:
                        shutil.rmtree(base, ignore_errors=True)
                    samples.setdefault(key, []).append(m)
                    headline = m.get("rec_per_s", m.get("mb_per_s", 0.0))
                    _progress(f"[{r + 1}/{settings.repeats}] {key:<28} {headline:>14,.0f}")
        cases.close_fixtures()
        recovery: dict[str, Any] = {}
        if settings.isolated and (not settings.only or "recovery" in settings.only):
            recovery = _recovery(settings, run_dir)
    finally:
        cases.close_fixtures()
        shutil.rmtree(run_dir, ignore_errors=True)
    return {
        "settings": {k: v for k, v in settings.__dict__.items()},
        "machine": _machine(settings.directory or tempfile.gettempdir()),
        "versions": _versions(),
        "samples": samples,
        "unavailable": unavailable,
        "isolated": recovery,
        "elapsed_s": time.time() - start,
    }


def _recovery(settings: Settings, run_dir: str) -> dict[str, Any]:
    """Recovery time after a clean close and after SIGKILL, and peak RSS, each in a fresh
    interpreter; the open is repeated ``repeats`` times (page cache warm, as after a restart
    of the process but not of the machine)."""
    out: dict[str, Any] = {}
    size = 100
    for kind in ("clean", "tagged", "crash"):  # tagged: clean close, every record tagged
        root = os.path.join(run_dir, f"recovery-{kind}")
        _progress(f"recovery: building a {settings.recovery_bytes >> 20} MiB store ({kind})")
        built = isolated.run_child("build", root=root, total_bytes=settings.recovery_bytes,
                                   size=size, crash=kind == "crash",
                                   tag="sensor-7" if kind == "tagged" else None)  # fmt: skip
        opens = []
        for _ in range(settings.repeats):
            opens.append(isolated.run_child("open", root=root))
        du = sum(
            os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(root) for f in fs
        )
        out[kind] = {"build": built, "opens": opens, "disk_bytes": du}
        _progress(f"recovery ({kind}): open {sorted(o['open_s'] for o in opens)} s")
        shutil.rmtree(root, ignore_errors=True)
    for backend in ("file", "memory"):
        root = os.path.join(run_dir, f"rss-{backend}")
        rss = [isolated.run_child("rss", root=root, records=settings.rss_records, size=size,
                                  backend=backend)]  # fmt: skip
        out[f"rss_{backend}"] = rss
        shutil.rmtree(root, ignore_errors=True)
    return out


def main(argv: list[str] | None = None) -> int:
    import argparse

    from . import report

    ap = argparse.ArgumentParser(prog="tidelog bench", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    ap.add_argument("--quick", action="store_true", help="short run (under two minutes)")
    ap.add_argument("--repeats", type=int, help="rounds per case (median over them)")
    ap.add_argument("--seconds", type=float, help="seconds per timed measurement")
    ap.add_argument("--dir", help="directory on the disk to test [default: the temp dir]")
    ap.add_argument("--out", help="where to write results.json, table.md, plot.png")
    ap.add_argument("--only", action="append", default=[],
                    help="case id prefix (repeatable); 'recovery' for the isolated part")
    ap.add_argument("--sizes", help="record sizes, comma-separated [default: 100,4096]")
    ap.add_argument("--recovery-bytes", type=int, help="payload bytes of the recovery store")
    ap.add_argument("--rss-records", type=int, help="records appended in the RSS run")
    ap.add_argument("--no-isolated", action="store_true", help="skip recovery and RSS")
    ap.add_argument("--no-plot", action="store_true", help="skip the PNG plot")
    a = ap.parse_args(argv)
    settings = Settings.for_mode(
        a.quick, repeats=a.repeats, seconds=a.seconds, directory=a.dir, out=a.out,
        only=a.only or None, recovery_bytes=a.recovery_bytes, rss_records=a.rss_records,
        sizes=tuple(int(s) for s in a.sizes.split(",")) if a.sizes else None,
    )  # fmt: skip
    if a.no_isolated:
        settings.isolated = False
    if a.no_plot:
        settings.plot = False
    raw = run(settings)
    summary = report.summarise(raw)
    os.makedirs(settings.out, exist_ok=True)
    paths = report.write(summary, settings.out, plot_png=settings.plot)
    print(report.table(summary))
    print("\n".join(f"wrote {p}" for p in paths))
    return 0


if __name__ == "__main__":
    sys.exit(main())
