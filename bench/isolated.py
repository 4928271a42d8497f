"""Measurements that need a clean process: recovery time (after a clean close and after a
SIGKILL) and peak RSS. The harness runs ``python -m tidelog.bench.isolated ACTION JSON``; the
child prints one JSON line of results. Timings are taken inside the child, around
``tidelog.open`` only (interpreter start-up and imports excluded)."""

from __future__ import annotations

import json
import os
import resource
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

__all__ = ["run_child", "build_store", "open_store", "append_rss"]


def _maxrss_bytes() -> int:
    """Peak RSS of this process image: VmHWM (ru_maxrss survives exec on Linux, so a child
    would report its parent's peak)."""
    kib = _status_kib("VmHWM")
    return kib * 1024 if kib else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def _status_kib(field: str) -> int:
    """A ``kB`` line of /proc/self/status (0 where there is none)."""
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def _rss_bytes() -> int:
    with open("/proc/self/statm", encoding="ascii") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def build_store(
    root: str, total_bytes: int, size: int, crash: bool, tag: str | None = None
) -> dict[str, Any]:
    """Fill a file store with ``total_bytes`` of ``size``-byte payloads (disk class,
    append_many of 10000, every record tagged ``tag``). Then close it cleanly, or flush and
    SIGKILL this process (the WAL written since the last checkpoint is left for recovery to
    replay)."""
    import tidelog

    from .measure import payload

    data = payload(size)
    batch = [data] * max(1, min(10_000, (8 << 20) // size))
    store = tidelog.open(f"file://{root}")
    t = store.topic("bench", durability="disk")
    n = 0
    t0 = time.perf_counter()
    while n * size < total_bytes:
        t.append_many(batch, tag=tag)
        n += len(batch)
    store.flush()
    elapsed = time.perf_counter() - t0
    from tidelog.backends.file import FileBackend  # its own counters (REG-5: by its class)
    from tidelog.hooks import hooks

    backend: Any = hooks(store, FileBackend)
    unflushed = sum(s.submitted for s in backend.shards) - getattr(backend, "_wal_at_checkpoint", 0)
    out = {
        "records": n,
        "payload_bytes": n * size,
        "build_s": elapsed,
        "build_rec_per_s": n / elapsed,
        "wal_since_checkpoint_bytes": unflushed,
    }
    if crash:
        print(json.dumps(out), flush=True)
        os.kill(os.getpid(), signal.SIGKILL)
    store.close()
    return out


def open_store(root: str) -> dict[str, Any]:
    """Time ``tidelog.open`` of an existing store; then leave without closing (os._exit), so a
    crashed store stays crashed for the next repeat and a clean one stays clean (nothing is
    written between open and exit)."""
    import tidelog

    base = _rss_bytes()
    t0 = time.perf_counter()
    store = tidelog.open(f"file://{root}")
    elapsed = time.perf_counter() - t0
    from tidelog.backends.file import FileBackend  # imported after the timed open
    from tidelog.hooks import hooks

    b: Any = hooks(store, FileBackend)  # the file backend's own counters (REG-5)
    out = {
        "open_s": elapsed,
        "replayed_batches": getattr(b, "replayed_batches", 0),
        "clean": bool(getattr(b, "clean_open", False)),
        "head_seq": store.topic("bench").state().head_seq,
        "peak_rss_bytes": _maxrss_bytes(),
        "rss_anon_bytes": _status_kib("RssAnon") * 1024,  # after the open: process-private
        "rss_file_bytes": _status_kib("RssFile") * 1024,  # mapped files (page cache, shared)
        "rss_before_open_bytes": base,
    }
    print(json.dumps(out), flush=True)
    os._exit(0)


def append_rss(root: str, records: int, size: int, backend: str) -> dict[str, Any]:
    """Peak RSS of a process that appends ``records`` records (append_many of 1000, disk class
    on file://, memory class on memory://), beside its RSS before the first append."""
    import tidelog

    from .measure import payload

    data = payload(size)
    uri = f"file://{root}" if backend == "file" else "memory://"
    with tidelog.open(uri) as store:
        t = store.topic("bench", durability="disk" if backend == "file" else "memory")
        base = _rss_bytes()
        batch = [data] * 1000
        for _ in range(0, records, 1000):
            t.append_many(batch)
        peak = _maxrss_bytes()
    return {"peak_rss_bytes": peak, "rss_before_bytes": base, "records": records}


def run_child(action: str, timeout: float = 900, **kwargs: Any) -> dict[str, Any]:
    """Run one action in a fresh interpreter; the last JSON line it printed is the result."""
    proc = subprocess.run(
        [sys.executable, "-m", "tidelog.bench.isolated", action, json.dumps(kwargs)],
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    if not lines:
        raise RuntimeError(
            f"bench child {action} exited {proc.returncode} without a result: "
            f"{proc.stderr.strip()[-2000:]}"
        )
    return json.loads(lines[-1])  # type: ignore[no-any-return,unused-ignore]


_ACTIONS: dict[str, Callable[..., dict[str, Any]]] = {
    "build": build_store,
    "open": open_store,
    "rss": append_rss,
}

if __name__ == "__main__":
    result = _ACTIONS[sys.argv[1]](**json.loads(sys.argv[2]))
    print(json.dumps(result), flush=True)
