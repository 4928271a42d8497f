"""Measuring helpers shared by every case: timed loops, latency percentiles, and the two
sources of "bytes written" (``/proc/self/io`` for this process, ``/proc/diskstats`` for the
device under the bench directory, which also sees other processes' writes)."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field

__all__ = ["Ctx", "Cpu", "Io", "device_of", "percentile", "timed", "timed_latency", "timed_puts"]

Metrics = dict[str, float]


@dataclass
class Ctx:
    """What one measurement gets: where to write, for how long, and the record size."""

    base: str  # a fresh directory on the disk under test, removed after the case
    seconds: float
    size: int  # payload bytes per record
    quick: bool
    device: str | None = None
    run_dir: str = ""  # lives for the whole run (fixtures shared by every round)
    round: int = 0
    rounds: int = 1
    notes: dict[str, str] = field(default_factory=dict)

    @property
    def payload(self) -> bytes:
        return payload(self.size)


_PAYLOADS: dict[int, bytes] = {}


def payload(size: int) -> bytes:
    """A deterministic, incompressible-looking payload of ``size`` bytes."""
    p = _PAYLOADS.get(size)
    if p is None:
        import random

        p = random.Random(size).randbytes(size)
        _PAYLOADS[size] = p
    return p


def percentile(sorted_values: list[float], q: float) -> float:
    if not sorted_values:
        return float("nan")
    k = min(len(sorted_values) - 1, max(0, round(q * (len(sorted_values) - 1))))
    return sorted_values[k]


def timed(step: Callable[[], int], seconds: float, min_calls: int = 3) -> tuple[int, float]:
    """Call ``step`` (which returns how many records it handled) until ``seconds`` pass and at
    least ``min_calls`` calls were made; returns (records, elapsed seconds)."""
    n = 0
    calls = 0
    clock = time.perf_counter
    start = clock()
    end = start + seconds
    while True:
        k = step()
        if k == 0:  # nothing left to consume
            break
        n += k
        calls += 1
        if calls >= min_calls and clock() >= end:
            break
    return n, clock() - start


def timed_latency(
    step: Callable[[], int], seconds: float, min_calls: int = 3, max_records: int | None = None
) -> tuple[int, float, list[float]]:
    """As ``timed``, also recording each call's latency (µs); with ``max_records``, it also
    stops once that many records were handled (bounds what a fast machine writes)."""
    lat: list[float] = []
    n = 0
    clock = time.perf_counter
    start = clock()
    end = start + seconds
    t0 = start
    while True:
        n += step()
        t1 = clock()
        lat.append((t1 - t0) * 1e6)
        t0 = t1
        if len(lat) >= min_calls and (t1 >= end or (max_records is not None and n >= max_records)):
            break
    return n, t0 - start, lat


def timed_puts(
    step: Callable[[], int], seconds: float, max_records: int | None = None, min_calls: int = 3
) -> tuple[int, float, list[float], int]:
    """Single puts measured as ``loop_floor`` is: the rate from calls made back to back, the
    clock read once per stride of calls (doubled while a stride is under 1 ms, up to 256), so
    no per-call instrumentation is in it; then the per-call latencies in a pass of their own
    (a quarter of ``seconds``, at most 0.5 s). ``timed_latency``'s per-call clock, lambda and
    list append cost ~0.4 µs a call on this VM, a quarter of a buffered append. Returns
    (records, elapsed, latencies of the second pass in µs, records of the second pass: counters
    of bytes written cover both passes)."""
    n = calls = 0
    stride = 1
    clock = time.perf_counter
    start = t0 = clock()
    end = start + seconds
    while True:
        for _ in range(stride):
            n += step()
        calls += stride
        t1 = clock()
        if calls >= min_calls and (t1 >= end or (max_records is not None and n >= max_records)):
            break
        if stride < 256 and t1 - t0 < 1e-3:
            stride *= 2
        t0 = t1
    elapsed = t1 - start
    rest = None if max_records is None else max(1, max_records // 4)
    k, _, lat = timed_latency(step, min(seconds / 4, 0.5), max_records=rest)
    return n, elapsed, lat, k


def rate_metrics(n: int, elapsed: float, size: int, lat: list[float] | None = None) -> Metrics:
    out: Metrics = {
        "records": float(n),
        "rec_per_s": n / elapsed if elapsed > 0 else 0.0,
        "mb_per_s": n * size / elapsed / 1e6 if elapsed > 0 else 0.0,
    }
    if lat:
        lat.sort()
        out["p50_us"] = percentile(lat, 0.5)
        out["p99_us"] = percentile(lat, 0.99)
    return out


# --- bytes written ----------------------------------------------------------------------------


def device_of(path: str) -> str | None:
    """The /proc/diskstats name of the block device holding ``path`` (a partition's parent
    disk is not substituted: diskstats counts partitions too), or None if unknown."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    major, minor = os.major(st.st_dev), os.minor(st.st_dev)
    try:
        with open("/proc/diskstats", encoding="ascii") as f:
            for line in f:
                parts = line.split()
                if int(parts[0]) == major and int(parts[1]) == minor:
                    return parts[2]
    except OSError:
        return None
    return None


class Io:
    """Counters before/after a measured section: this process's ``write_bytes`` from
    /proc/self/io (bytes it caused to be sent to storage: page-granular, no filesystem
    journal) and the device's sectors written and flush requests from /proc/diskstats (all
    processes: noisy on a shared machine, so reported beside the per-process figure)."""

    def __init__(self, device: str | None) -> None:
        self.device = device
        self.start = self._read()

    def _read(self) -> tuple[int, int, int]:
        wbytes = -1
        try:
            with open("/proc/self/io", encoding="ascii") as f:
                for line in f:
                    if line.startswith("write_bytes:"):
                        wbytes = int(line.split()[1])
        except OSError:
            pass
        sectors = flushes = -1
        if self.device is not None:
            try:
                with open("/proc/diskstats", encoding="ascii") as f:
                    for line in f:
                        parts = line.split()
                        if parts[2] == self.device:
                            sectors = int(parts[9])
                            flushes = int(parts[17]) if len(parts) > 17 else -1
                            break
            except OSError:
                pass
        return wbytes, sectors, flushes

    def stop(self, records: int, payload_bytes: int) -> Metrics:
        """Per-record and per-payload-byte figures since construction."""
        end = self._read()
        out: Metrics = {}
        if records <= 0:
            return out
        if self.start[0] >= 0 and end[0] >= 0:
            proc = end[0] - self.start[0]
            out["proc_wbytes_per_rec"] = proc / records
            out["proc_wbytes_per_payload_byte"] = proc / max(payload_bytes, 1)
        if self.start[1] >= 0 and end[1] >= 0:
            dev = (end[1] - self.start[1]) * 512
            out["dev_wbytes_per_rec"] = dev / records
            out["dev_wbytes_per_payload_byte"] = dev / max(payload_bytes, 1)
        if self.start[2] >= 0 and end[2] >= 0:
            out["dev_flushes_per_rec"] = (end[2] - self.start[2]) / records
        return out


def _pid_cpu_s(pid: int) -> float | None:
    """User + system CPU seconds of process ``pid`` so far, from /proc (None: not readable)."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class Cpu:
    """CPU time spent in a measured section, per record: the calling thread's
    (``cpu_us_per_rec``: the appender's own work, Python and system calls), this whole
    process's (``proc_cpu_us_per_rec``: with its committer and maintenance threads) and a
    helper process's (``worker_cpu_us_per_rec``: the file backend's seal worker, named by
    ``worker()``, which may start during the section). Beside the rate, they tell a case
    bounded by CPU from one waiting on the device, on any CPU."""

    def __init__(self, worker: Callable[[], int | None] = lambda: None) -> None:
        self.worker = worker
        pid = worker()
        # (pid, its CPU seconds now): a worker started later counts from 0
        self.start_worker = (pid, (_pid_cpu_s(pid) or 0.0) if pid is not None else 0.0)
        self.start = (time.thread_time(), time.process_time())

    def stop(self, records: int, *, thread: bool = True) -> Metrics:
        """``thread`` False: the section's records were not all appended by this thread."""
        own, proc = time.thread_time() - self.start[0], time.process_time() - self.start[1]
        out: Metrics = {}
        if records <= 0:
            return out
        if thread:
            out["cpu_us_per_rec"] = own / records * 1e6
        out["proc_cpu_us_per_rec"] = proc / records * 1e6
        pid = self.worker()
        now = _pid_cpu_s(pid) if pid is not None else None
        if now is not None:
            before = self.start_worker[1] if self.start_worker[0] == pid else 0.0
            out["worker_cpu_us_per_rec"] = (now - before) / records * 1e6
        return out
