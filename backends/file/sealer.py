"""Sealing the records in memory from their WAL frames (spec/FORMATS-wal-tail.md WTAIL-6..9).

``seal_wal`` is the work (WTAIL-7): it scans a job's WAL files, takes the records of the captured
seq ranges as located records, as replay does after a crash (WTAIL-1), and writes them with the
checkpoint's own segment writer (``checkpoint.write_located``). ``SealWorker`` runs it in a
worker process (WTAIL-8) whose loop is ``main``; the writer runs it itself on a test FS, or
when the worker cannot answer (WTAIL-9).
"""

from __future__ import annotations

import contextlib
import os
import pickle
import subprocess
import sys
import threading
from bisect import bisect_left
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from tidelog import errors
from tidelog.errors import Corrupt, TidelogError
from tidelog.fsio import FS, WRITE_OUT_BYTES, OsFS

from .checkpoint import SealAnswer, SealRange, write_located
from .format import wal as walfmt
from .format.wal import FrameType
from .walchunk import WalChunk, WalFile, frame_run

__all__ = ["SealJob", "SealWorker", "seal_wal", "main"]

_RECORDS = (int(FrameType.APPEND), int(FrameType.APPEND_BATCH))
_STOP_S = 10.0  # WTAIL-8: how long close waits for the worker before killing it
_TRIES = 3  # WTAIL-9: jobs in a row without an answer before a store stops trying
WORKER = [sys.executable, "-P", "-m", "tidelog.backends.file.sealmain"]  # WTAIL-8's command


@dataclass(frozen=True)
class SealJob:
    """One checkpoint's sealing: the WAL files to scan, in order, each as (path, from offset,
    to offset; None: to its FILE_END), and the ranges to seal (WTAIL-7)."""

    root: str
    wal: tuple[tuple[str, int, int | None], ...]
    ranges: tuple[SealRange, ...]
    segment_max: tuple[int, int]
    mmap: bool = True  # FLT-9: the store's ``mmap`` option, for the worker's own FS
    write_out_bytes: int = WRITE_OUT_BYTES  # SEG-20: the store's ``write_out_bytes`` option


class _Orphaned(Exception):
    """The worker's parent is gone: stop before the next segment (WTAIL-8)."""


class _Port:
    """``checkpoint.SegmentPort`` for sealing outside the store: warnings are collected."""

    def __init__(self, fs: FS, root: str, write_out_bytes: int) -> None:
        self.fs = fs
        self.root = root
        self.write_out_bytes = write_out_bytes
        self.warnings: list[str] = []

    def warn(self, message: str) -> None:
        self.warnings.append(message)


def seal_wal(fs: FS, job: SealJob, alive: Callable[[], bool] = lambda: True) -> SealAnswer:
    """WTAIL-7: the records of ``job.ranges`` sealed from the frames of ``job.wal``. Raises
    ``Corrupt`` when a range is not found whole, OSError as the FS raised it."""
    ranges = {r.tid: r for r in job.ranges}
    found: dict[int, list[WalChunk]] = {tid: [] for tid in ranges}
    expect = {tid: r.first for tid, r in ranges.items()}  # the next seq each range needs
    files: list[WalFile] = []
    port = _Port(fs, job.root, job.write_out_bytes)
    try:
        for path, start, end in job.wal:
            wal = _open(fs, path)
            files.append(wal)
            problem = _scan(wal, start, end, ranges, found, expect)
            if problem is not None:  # raised here: no frame (a view of the map) in the traceback
                raise Corrupt(problem)
        for tid, r in ranges.items():
            if expect[tid] != r.last + 1:
                raise Corrupt(
                    f"topic {tid:016x}: seqs {expect[tid]}..{r.last} to seal are not in the WAL "
                    f"from {job.wal[0][0] if job.wal else '(no file)'} on (WTAIL-7)"
                )
        segments: dict[int, list[tuple[int, int]]] = {}
        for tid, r in ranges.items():
            out: list[tuple[int, int]] = []
            for chunk in found[tid]:
                if not alive():
                    raise _Orphaned
                lo = chunk.first_seq - r.first
                dead = bytearray(chunk.count)
                # r.dead ascends: only this chunk's slice of it, found by bisection
                for i in r.dead[bisect_left(r.dead, lo) : bisect_left(r.dead, lo + chunk.count)]:
                    dead[i - lo] = 1
                out += write_located(port, chunk, tid, r.bundles, bytes(dead), job.segment_max)
            segments[tid] = out
        return SealAnswer(segments, tuple(port.warnings))
    finally:
        for chunks in found.values():
            for chunk in chunks:
                chunk.close()
        for wal in files:
            wal.release()  # the scan's own use (``_open``)


def _open(fs: FS, path: str) -> WalFile:
    """A WAL file mapped as replay maps it, with one use held by the scan."""
    h = fs.open_read(path)
    data = h.map()
    try:
        seed = walfmt.frame_seed(walfmt.decode_header(data))
    except BaseException:
        data.release()
        h.close()
        raise
    wal = WalFile(path, h, data, seed)
    wal.refs += 1
    return wal


def _scan(
    wal: WalFile,
    start: int,
    end: int | None,
    ranges: dict[int, SealRange],
    found: dict[int, list[WalChunk]],
    expect: dict[int, int],
) -> str | None:
    """The records of ``ranges`` in ``wal``'s frames from ``start`` (to ``end``) added to
    ``found``; what is wrong with them (WTAIL-7), if anything. The frames are views of the
    map, which closes once none is left: they go when this returns."""
    data = wal.data if end is None else wal.data[:end]
    for f in walfmt.scan(data, start, copy=False, seed=wal.seed).frames:
        if f.type in _RECORDS and f.topic_id in ranges:
            problem = _take(found[f.topic_id], expect, ranges[f.topic_id], wal, f)
            if problem is not None:
                return problem
    return None


def _take(
    chunks: list[WalChunk], expect: dict[int, int], r: SealRange, wal: WalFile, f: Any
) -> str | None:
    """The records of frame ``f`` within ``r`` as the next run of the range (as replay's
    ``_locate`` takes a frame's records above a snapshot's head); what is wrong, if anything."""
    nxt = expect[r.tid]
    run = frame_run(wal, f, nxt)
    if run is None:
        return None  # below the range: sealed by an earlier checkpoint, or a dead prefix
    first, n = run.first, run.n
    if first != nxt or first + n - 1 > r.last:  # a gap, or seqs past the capture's head
        return (
            f"topic {r.tid:016x}: a WAL frame holds seqs {first}..{first + n - 1} where "
            f"{nxt} is next of {r.first}..{r.last} to seal ({wal.path}, frame at offset "
            f"{f.offset}; WTAIL-7)"
        )
    chunk = chunks[-1] if chunks and chunks[-1].wal is wal else None
    if chunk is None:
        chunk = WalChunk(wal, first)
        chunks.append(chunk)
    chunk.add_run(f, run)
    expect[r.tid] = first + n
    return None


class SealWorker:
    """The writer's end of the seal worker (WTAIL-8): started at the first job, kept until
    ``close``. ``run`` returns the job's answer, raises the worker's OSError or tidelog error
    as the job's failure, and returns None when the worker gave no answer (WTAIL-9: it died,
    could not start, or said something else), having stopped it: the next job starts a new
    one."""

    def __init__(self, lock_fd: int | None) -> None:
        self._lock_fd = lock_fd  # LOCK-1: the worker holds the store lock while it lives
        self._proc: subprocess.Popen[bytes] | None = None
        self._mutex = threading.Lock()
        self.why = ""  # why the last job got no answer
        self.unstartable = False  # no job is tried again (WTAIL-9)
        self._failed = 0  # jobs in a row without an answer

    @property
    def pid(self) -> int | None:
        return None if self._proc is None else self._proc.pid

    def run(self, job: SealJob) -> SealAnswer | None:
        with self._mutex:
            if self.unstartable:
                return None
            try:
                proc = self._start()
            except OSError as exc:  # no such interpreter here (an embedded Python, say)
                self.why, self.unstartable = f"cannot start {WORKER[0]}: {exc}", True
                return None
            try:
                assert proc.stdin is not None and proc.stdout is not None
                pickle.dump(job, proc.stdin, pickle.HIGHEST_PROTOCOL)
                proc.stdin.flush()
                answer = pickle.load(proc.stdout)
            except Exception as exc:  # no answer: the pipe broke, EOF, garbage, no process
                self.why = f"{type(exc).__name__}: {exc}"
                self._stop(0.0)
                self._failed += 1
                if self._failed >= _TRIES:  # one that cannot import tidelog, say
                    self.why += f" ({_TRIES} jobs in a row: not tried again)"
                    self.unstartable = True
                return None
            self._failed = 0
        return _answer(answer, self)

    def close(self) -> None:
        """End the worker and wait for it; killed by PID if it has not exited in 10 s."""
        with self._mutex:
            self._stop(_STOP_S)

    def _start(self) -> subprocess.Popen[bytes]:
        if self._proc is not None and self._proc.poll() is None:
            return self._proc
        self._stop(0.0)
        fds = () if self._lock_fd is None else (self._lock_fd,)
        # the writer's own import path: tidelog imports there as it does here (a checkout
        # run from its directory, a path added at run time)
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
        self._proc = subprocess.Popen(
            WORKER, stdin=subprocess.PIPE, stdout=subprocess.PIPE, pass_fds=fds, env=env
        )
        return self._proc

    def _stop(self, wait_s: float) -> None:
        proc, self._proc = self._proc, None
        if proc is None:
            return
        for pipe in (proc.stdin, proc.stdout):
            if pipe is not None:
                with contextlib.suppress(OSError):  # a broken pipe: the worker is gone
                    pipe.close()
        try:
            proc.wait(timeout=wait_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _answer(answer: Any, worker: SealWorker) -> SealAnswer | None:
    """The worker's answer as the job's result or failure (WTAIL-9)."""
    if isinstance(answer, tuple) and answer:
        kind = answer[0]
        if kind == "ok" and isinstance(answer[1], SealAnswer):
            return answer[1]
        if kind == "oserror" and len(answer) == 4:
            _, code, message, filename = answer
            raise OSError(code, message, filename)
        if kind == "error" and len(answer) == 3:
            error = getattr(errors, answer[1], None)
            if isinstance(error, type) and issubclass(error, TidelogError):
                try:
                    failure = error(answer[2])
                except TypeError:  # a class with other arguments: its base
                    failure = TidelogError(answer[2])
                raise failure
    worker.why = f"not an answer: {answer!r:.200}"
    worker.close()
    return None


def main() -> None:
    """The worker's loop (WTAIL-8): a job per pickle on stdin, its answer on stdout, until
    stdin closes. Its parent's death ends a job between segments."""
    jobs, answers = sys.stdin.buffer, sys.stdout.buffer
    sys.stdout = sys.stderr  # nothing but answers goes to the writer's pipe
    parent = os.getppid()

    def alive() -> bool:
        return os.getppid() == parent

    while True:
        try:
            job = pickle.load(jobs)
        except EOFError:
            return
        answer: tuple[Any, ...]
        try:
            answer = ("ok", seal_wal(OsFS(mmap=job.mmap), job, alive))
        except _Orphaned:
            return
        except OSError as exc:
            answer = ("oserror", exc.errno, exc.strerror, exc.filename)
        except TidelogError as exc:
            kind = Corrupt if isinstance(exc, Corrupt) else type(exc)  # format errors: Corrupt
            answer = ("error", kind.__name__, exc.message)
        pickle.dump(answer, answers, pickle.HIGHEST_PROTOCOL)
        answers.flush()
