"""The benchmark run: every case, side by side, in interleaved rounds (so drift on a shared
machine hits every case alike), then medians with min–max, ratios, targets, JSON, a table and a
plot (``report``). ``tidelog bench`` and ``nox -s bench`` call ``main``.

Durability tiers (for "best peer of equal durability"):
  durable   an acknowledged put survives power loss (fdatasync before returning)
  buffered  it does not: it survives at best a process crash, or only until the next
            periodic commit / close (each row's guarantee says which)
"""

from __future__ import annotations

import os
import platform
import shutil
import sys
import tempfile
import time
import traceback
from dataclasses import dataclass, field
from typing import Any

from . import cases, isolated
from .catalog import CASES, SIZES, Case
from .measure import Ctx, Metrics, device_of

__all__ = ["Case", "CASES", "Settings", "run", "main"]


def _bd_page_payload() -> int:
    from tidelog.backends.blockdev.format import max_payload

    return int(max_payload(4096))


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
                 "xxhash", "questdb"):  # fmt: skip
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
        du = sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(root) for f in fs)
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
    ap.add_argument(
        "--only",
        action="append",
        default=[],
        help="case id prefix (repeatable); 'recovery' for the isolated part",
    )
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
