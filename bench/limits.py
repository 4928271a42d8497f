"""The physical limits of this machine and disk, measured like tidelog's cases (same record
sizes, same directory, same run): what no log written in Python can beat."""

from __future__ import annotations

import mmap
import os
import struct
import threading
from collections.abc import Callable

import xxhash

from tidelog.fsio import WRITE_OUT_BYTES, OsFS, Pacer

from .measure import Ctx, Io, Metrics, rate_metrics, timed, timed_latency, timed_puts

__all__ = [
    "raw_append",
    "raw_overwrite",
    "raw_joined",
    "raw_joined_sealed",
    "seq_write",
    "mmap_read",
    "loop_floor",
]

_PREALLOC = 16 << 20
_HDR = struct.Struct("<IBBQQQHHI")  # the WAL frame header tidelog packs per record


def _prealloc_zero(fd: int, size: int) -> None:
    """Zero-filled and synced: later pwrites overwrite written blocks (no metadata change)."""
    zero = bytes(1 << 20)
    for off in range(0, size, len(zero)):
        os.pwrite(fd, zero, off)
    os.fsync(fd)


def _single(ctx: Ctx, overwrite: bool) -> Metrics:
    path = os.path.join(ctx.base, "raw")
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        data = ctx.payload
        prealloc = _PREALLOC if not ctx.quick else 4 << 20  # overwritten cyclically
        if overwrite:
            _prealloc_zero(fd, prealloc)
        off = [0]

        def step() -> int:
            o = off[0]
            if overwrite:
                if o + len(data) > prealloc:
                    o = 0
                os.pwrite(fd, data, o)
            else:
                os.write(fd, data)
            os.fdatasync(fd)
            off[0] = o + len(data)
            return 1

        io = Io(ctx.device)
        n, elapsed, lat, more = timed_puts(step, ctx.seconds)
        out = rate_metrics(n, elapsed, ctx.size, lat)
        out.update(io.stop(n + more, (n + more) * ctx.size))
        out["fdatasync_per_rec"] = 1.0
        return out
    finally:
        os.close(fd)


def raw_append(ctx: Ctx) -> Metrics:
    """os.write + os.fdatasync per record, growing the file."""
    return _single(ctx, overwrite=False)


def raw_overwrite(ctx: Ctx) -> Metrics:
    """os.pwrite + os.fdatasync per record into a zero-filled, synced file."""
    return _single(ctx, overwrite=True)


def raw_joined(ctx: Ctx) -> Metrics:
    """1000 records joined into one os.pwrite + one fdatasync, into a preallocated file."""
    return _joined(ctx)


def _joined(ctx: Ctx, after: Callable[[int], None] | None = None) -> Metrics:
    """``raw_joined``'s loop; ``after(n)`` is called with each batch's bytes once synced."""
    path = os.path.join(ctx.base, "raw")
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
    size = 64 << 20 if not ctx.quick else 8 << 20
    try:
        _prealloc_zero(fd, size)
        batch = [ctx.payload] * 1000
        chunk = len(ctx.payload) * 1000
        off = [0]

        def step() -> int:
            o = off[0]
            if o + chunk > size:
                o = 0
            os.pwrite(fd, b"".join(batch), o)
            os.fdatasync(fd)
            off[0] = o + chunk
            if after is not None:
                after(chunk)
            return 1000

        io = Io(ctx.device)
        n, elapsed, lat = timed_latency(step, ctx.seconds)
        out = rate_metrics(n, elapsed, ctx.size)
        out["p50_us_per_batch"] = sorted(lat)[len(lat) // 2]
        out.update(io.stop(n, n * ctx.size))
        out["fdatasync_per_rec"] = 0.001
        return out
    finally:
        os.close(fd)


# What a sealed segment holds per record beyond its payload (spec/FORMATS-seg3.md: the run
# frame's u64 ts and u32 length columns, SEG-15; the .idx version-3 entry of 20 bytes, SEG-17).
# Run-frame headers and block entries are per ~64 KiB and left out: the ceiling stays generous.
_SEALED_PER_RECORD = 8 + 4 + 20
_CHECKPOINT_BYTES = 32 << 20  # the file backend's default checkpoint_bytes


def raw_joined_sealed(ctx: Ctx) -> Metrics:
    """The device ceiling of a log kept as a WAL plus sealed segments (the file backend's
    design): ``raw_joined``'s loop, and beside it a second thread that, every 32 MiB of WAL
    (the default ``checkpoint_bytes``), writes those records again as a segment (payload plus
    what a segment holds per record, in 1 MiB pieces, written out to the device every 1 MiB as
    the checkpoint does: spec/FORMATS-seg3.md SEG-20), fdatasyncs it and overwrites it next
    time. No encoding, no checksums, no Python per record: only the bytes every WAL + segments
    log must write twice, so no such log can beat it on this disk."""
    segment = memoryview(bytes(1 << 20))
    per_batch = len(ctx.payload) * 1000
    per_sealed = (len(ctx.payload) + _SEALED_PER_RECORD) * 1000
    pending = [0]  # WAL bytes synced since the last seal (rough: a lost update costs a batch)
    sealed = [0]  # segment bytes written and synced
    stop, wake = threading.Event(), threading.Event()
    failed: list[BaseException] = []

    def seal(n: int) -> None:
        batches = pending[0] // per_batch
        pending[0] = 0
        h = OsFS().open(os.path.join(ctx.base, f"seg{n % 2}"))
        try:
            h.truncate(0)
            pace = Pacer(h, WRITE_OUT_BYTES)  # as the checkpoint writes a segment (SEG-20)
            total = batches * per_sealed
            for off in range(0, total, len(segment)):
                piece = segment[: min(len(segment), total - off)]
                h.pwrite(piece, off)
                pace.wrote(off + len(piece))
            h.fdatasync()
            sealed[0] += total
        finally:
            h.close()

    def sealer() -> None:
        n = 0
        try:
            while not stop.is_set():
                wake.wait(0.05)
                wake.clear()
                if pending[0] >= _CHECKPOINT_BYTES:
                    seal(n)
                    n += 1
            if pending[0] >= _CHECKPOINT_BYTES:  # after the timed window: the count is whole
                seal(n)
        except BaseException as exc:  # reported by the timed loop, never lost
            failed.append(exc)

    def after(nbytes: int) -> None:
        pending[0] += nbytes
        if pending[0] >= _CHECKPOINT_BYTES:
            wake.set()
        if failed:
            raise failed[0]

    thread = threading.Thread(target=sealer, name="raw-sealer", daemon=True)
    thread.start()
    try:
        out = _joined(ctx, after)
        stop.set()
        wake.set()
        thread.join(timeout=60)
        if failed:
            raise failed[0]
        out["sealed_bytes_per_rec"] = sealed[0] / out["records"] if out["records"] else 0.0
        return out
    finally:
        stop.set()
        wake.set()
        thread.join(timeout=60)
        for k in range(2):
            seg = os.path.join(ctx.base, f"seg{k}")
            if os.path.exists(seg):
                os.unlink(seg)


def seq_write(ctx: Ctx) -> Metrics:
    """1 MiB os.write calls to a new file, one fdatasync at the end (sequential bandwidth)."""
    import time

    path = os.path.join(ctx.base, "seq")
    total = (32 << 20) if ctx.quick else (512 << 20)
    block = os.urandom(1 << 20)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        io = Io(ctx.device)
        t0 = time.perf_counter()
        for _ in range(total >> 20):
            os.write(fd, block)
        os.fdatasync(fd)
        elapsed = time.perf_counter() - t0
        out: Metrics = {"mb_per_s": total / elapsed / 1e6, "bytes": float(total)}
        out.update(io.stop(total >> 20, total))
        return out
    finally:
        os.close(fd)
        os.unlink(path)


def mmap_read(ctx: Ctx) -> Metrics:
    """Reading a page-cached file through mmap: 1 MiB slices (MB/s) and record-sized slices
    copied to bytes (records/s): the ceiling for serving records from sealed segments."""
    import time

    path = os.path.join(ctx.base, "cached")
    total = 64 << 20 if not ctx.quick else 16 << 20
    with open(path, "wb") as w:
        w.write(os.urandom(1 << 20) * (total >> 20))
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as m:
        mv = memoryview(m)
        _ = bytes(mv[: 1 << 20])
        for lo in range(0, total, 1 << 20):  # fault every page in (page cache -> mapping)
            mv[lo : lo + 1]
        t0 = time.perf_counter()
        for lo in range(0, total, 1 << 20):
            bytes(mv[lo : lo + (1 << 20)])
        mb = total / (time.perf_counter() - t0) / 1e6
        size = ctx.size
        limit = total - size

        def step() -> int:
            off = 0
            for _ in range(10_000):
                bytes(mv[off : off + size])
                off += size
                if off > limit:
                    off = 0
            return 10_000

        n, elapsed = timed(step, ctx.seconds)
        out = rate_metrics(n, elapsed, size)
        out["mb_per_s_1mib_slices"] = mb
        mv.release()
    os.unlink(path)
    return out


def loop_floor(ctx: Ctx) -> Metrics:
    """The per-record Python loop floor: pack a frame header, concatenate header + payload and
    checksum it with XXH3-64 (what any Python log must do per record), no I/O."""
    data = ctx.payload
    pack = _HDR.pack
    digest = xxhash.xxh3_64_intdigest
    size = len(data)

    def step() -> int:
        out = []
        for seq in range(1000):
            body = pack(42 + size, 1, 0, 1, seq, 0, 0, 0, size) + data
            out.append(body + digest(body).to_bytes(8, "little"))
        b"".join(out)
        return 1000

    n, elapsed = timed(step, ctx.seconds)
    return rate_metrics(n, elapsed, size)
