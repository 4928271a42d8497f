"""Append rates of the file backend per durability class, beside the raw disk limits, measured
side by side in one run (issue 3's numbers; the full harness is issue 8's bench/).

    python bench/append_rates.py [--seconds 2] [--dir /path/on/the/disk/to/test]

Prints records/s and fdatasyncs per record. Not a test: nothing here asserts a speed.
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import threading
import time

import tidelog

PAYLOAD = b"x" * 100


def raw_loop(path: str, seconds: float, preallocated: bool) -> float:
    """os.write/pwrite + os.fdatasync per 100-byte record: the physical floor for durable single
    appends (appending grows the file; overwriting a zero-filled file does not)."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        if preallocated:
            os.write(fd, b"\0" * (64 << 20))
            os.fsync(fd)
        n, off, end = 0, 0, time.perf_counter() + seconds
        while time.perf_counter() < end:
            if preallocated:
                os.pwrite(fd, PAYLOAD, off)
            else:
                os.write(fd, PAYLOAD)
            os.fdatasync(fd)
            off += len(PAYLOAD)
            n += 1
        return n / seconds
    finally:
        os.close(fd)
        os.unlink(path)


def tidelog_rate(
    root: str, durability: str, seconds: float, threads: int = 1, batch: int = 1
) -> tuple[float, float]:
    shutil.rmtree(root, ignore_errors=True)
    with tidelog.open(f"file://{root}?prealloc=zero&checkpoint_bytes=1GiB") as store:
        t = store.topic("bench", durability=durability)
        shard = store._backend.shards[0]  # type: ignore[attr-defined]
        t.append(b"warm")
        syncs0 = shard.stats["fdatasyncs"]
        counts = [0] * threads
        stop = time.perf_counter() + seconds

        def worker(i: int) -> None:
            batch_payloads = [PAYLOAD] * batch
            while time.perf_counter() < stop:
                if batch == 1:
                    t.append(PAYLOAD)
                else:
                    t.append_many(batch_payloads)
                counts[i] += batch

        ths = [threading.Thread(target=worker, args=(i,)) for i in range(threads)]
        for th in ths:
            th.start()
        for th in ths:
            th.join()
        store.flush()
        n = sum(counts)
        return n / seconds, (shard.stats["fdatasyncs"] - syncs0) / max(n, 1)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--seconds", type=float, default=2.0)
    ap.add_argument("--dir", default=None)
    args = ap.parse_args()
    base = tempfile.mkdtemp(prefix="tidelog-bench-", dir=args.dir)
    try:
        rows: list[tuple[str, float, float | None]] = []
        raw_append = raw_loop(os.path.join(base, "raw-a"), args.seconds, preallocated=False)
        raw_over = raw_loop(os.path.join(base, "raw-o"), args.seconds, preallocated=True)
        rows.append(("raw write+fdatasync, appending", raw_append, 1.0))
        rows.append(("raw pwrite+fdatasync, overwriting preallocated", raw_over, 1.0))
        for cls in ("fsync", "disk", "memory", "ephemeral"):
            rate, syncs = tidelog_rate(os.path.join(base, cls), cls, args.seconds)
            rows.append((f"tidelog file:// {cls}, single appends, 1 thread", rate, syncs))
        rate, syncs = tidelog_rate(os.path.join(base, "t8"), "fsync", args.seconds, threads=8)
        rows.append(("tidelog file:// fsync, single appends, 8 threads", rate, syncs))
        rate, syncs = tidelog_rate(os.path.join(base, "b"), "fsync", args.seconds, batch=1000)
        rows.append(("tidelog file:// fsync, append_many(1000), 1 thread", rate, syncs))
        width = max(len(r[0]) for r in rows)
        print(f"{'what':<{width}}  {'records/s':>12}  {'x raw overwrite':>15}  fdatasync/rec")
        for name, rate, syncs in rows:
            s = "-" if syncs is None else f"{syncs:.4f}"
            print(f"{name:<{width}}  {rate:>12,.0f}  {rate / raw_over:>15.2f}  {s}")
    finally:
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
