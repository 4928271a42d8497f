"""A fault-injecting file system for the ``tidelog.fsio`` seam (spec/SPEC.md FLT-3..FLT-5).

``FaultFS`` wraps any ``FS`` (normally a ``RecordingFS``, which also keeps the durable image a
power loss would leave) and counts every I/O call by kind, in one global order shared by all
threads. A plan of ``Fault`` s fails chosen calls:

* ``eio``, ``enospc``: the call raises ``OSError`` (EIO / ENOSPC) and changes nothing;
* ``short`` (``pwrite``): a prefix of the data is written, then ENOSPC is raised (a short write
  that the next write could not continue);
* ``drop`` (``fdatasync``, ``fsync``, ``write_out``): the call raises EIO after the file's writes
  since its last sync are dropped: they never reach the disk and reads see its durable bytes
  again (Linux marks the pages clean after a writeback error, so a second sync "succeeds"
  with the data gone). It needs a wrapped FS whose handles can do that
  (``RecordingHandle.drop_unsynced``); elsewhere the sync only raises, as ``eio`` does.

A fault names one call by its global index (``Fault(fault, at=i)``), or every call of a kind from
its n-th on (``Fault(fault, kind=k, nth=n, repeat=True)``), optionally only calls whose path
contains ``path``. ``FaultFS.random(inner, seed, rate)`` fails each call with probability
``rate``; every random choice (which calls, which fault, a short write's length) comes from the
seed, so a run whose I/O calls come in the same order fails the same way again.

Reads of a ``map`` are not calls (nothing can fail them here); ``map`` itself is, as when it
copies by ``pread`` (``OsFS(mmap=False)``, FLT-9). Calls that only look (``exists``, ``is_dir``,
``listdir``, ``file_size``, ``size``), ``chmod``, ``lock`` and ``close`` are not counted.
"""

from __future__ import annotations

import errno
import os
import random
import threading
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from ..errors import BadArgument
from ..fsio import FS, Handle, write_out

__all__ = ["FaultFS", "FaultHandle", "Fault", "Injected", "KINDS", "FAULTS", "APPLICABLE"]

#: every counted call kind, in the order reports list them
KINDS = (
    "open", "pwrite", "pread", "truncate", "allocate", "fdatasync", "fsync", "write_out",
    "fsync_dir", "rename", "unlink", "rmdir", "mkdir", "map",
)  # fmt: skip
FAULTS = ("eio", "enospc", "short", "drop")
#: which faults make sense for which kind of call
APPLICABLE: dict[str, tuple[str, ...]] = {
    "open": ("eio", "enospc"),
    "pwrite": ("eio", "enospc", "short"),
    "pread": ("eio",),
    "truncate": ("eio", "enospc"),
    "allocate": ("eio", "enospc"),
    "fdatasync": ("eio", "drop"),
    "fsync": ("eio", "drop"),
    "write_out": ("eio", "drop"),  # a writeback error: the pages may be dropped as by a sync's
    "fsync_dir": ("eio",),
    "rename": ("eio", "enospc"),
    "unlink": ("eio",),
    "rmdir": ("eio",),
    "mkdir": ("eio", "enospc"),
    "map": ("eio",),
}
_ERRNO = {"eio": errno.EIO, "enospc": errno.ENOSPC, "short": errno.ENOSPC, "drop": errno.EIO}


@dataclass(frozen=True)
class Fault:
    """Fail the call with global index ``at``; or (``at`` None) calls of ``kind``: its
    ``nth`` call, and with ``repeat`` every later one too. ``path``: only calls whose path
    contains it count for ``nth`` and can fail."""

    fault: str
    at: int | None = None
    kind: str | None = None
    nth: int = 0
    repeat: bool = False
    path: str | None = None

    def __post_init__(self) -> None:
        if self.fault not in FAULTS:
            raise BadArgument(f"fault must be one of {FAULTS}, not {self.fault!r}")
        if (self.at is None) == (self.kind is None):
            raise BadArgument("a Fault names a call index (at) or a kind, not both or neither")
        if self.kind is not None and self.fault not in APPLICABLE.get(self.kind, ()):
            raise BadArgument(f"fault {self.fault!r} does not apply to {self.kind!r} calls")


@dataclass(frozen=True)
class Injected:
    """One fault that fired: the call's global index, kind and path, and the fault."""

    index: int
    kind: str
    path: str
    fault: str

    def __str__(self) -> str:
        return f"#{self.index} {self.kind} {self.path}: {self.fault}"


def _error(fault: str, path: str) -> OSError:
    code = _ERRNO[fault]
    return OSError(code, os.strerror(code), path)  # OSError() picks the subclass


class FaultFS:
    """An ``FS`` that passes every call to ``inner`` and fails the ones its plan names."""

    def __init__(
        self,
        inner: FS,
        faults: Iterable[Fault] = (),
        *,
        seed: int = 0,
        rate: float = 0.0,
        kinds: Sequence[str] = KINDS,
    ) -> None:
        self.inner = inner
        self.faults = list(faults)
        self.seed = seed
        self.rate = rate
        self.random_kinds = frozenset(kinds)
        self._rng = random.Random(seed)
        self._mutex = threading.Lock()
        self.armed = True  # False: count, never fail
        self.calls = 0
        self.counts: Counter[str] = Counter()
        self.log: list[tuple[str, str]] | None = None  # (kind, path) per call, if keep_log()
        self.injected: list[Injected] = []
        self._nth: Counter[int] = Counter()  # per fault of the plan: matching calls so far

    @classmethod
    def random(cls, inner: FS, seed: int, rate: float, kinds: Sequence[str] = KINDS) -> FaultFS:
        """Fail each call of ``kinds`` with probability ``rate``, with a fault that applies to
        it, all drawn from ``seed``."""
        return cls(inner, seed=seed, rate=rate, kinds=kinds)

    def keep_log(self) -> FaultFS:
        """Also record (kind, path) of every call (``log``), e.g. to enumerate a workload's."""
        self.log = []
        return self

    def summary(self) -> str:
        counts = ", ".join(f"{k} {self.counts[k]}" for k in KINDS if self.counts[k])
        fired = "; ".join(map(str, self.injected)) or "none"
        return f"{self.calls} I/O calls ({counts}); faults injected: {fired}"

    # -- deciding ----------------------------------------------------------------------------
    def _hit(self, kind: str, path: str) -> tuple[str, int] | None:
        """Count one call; the fault to inject into it (and the call's index), if any."""
        with self._mutex:
            index = self.calls
            self.calls += 1
            self.counts[kind] += 1
            if self.log is not None:
                self.log.append((kind, path))
            if not self.armed:
                return None
            chosen = None
            for k, f in enumerate(self.faults):
                if f.at is not None:
                    if f.at == index and f.fault in APPLICABLE[kind]:
                        chosen = chosen or f.fault
                    continue
                if f.kind != kind or (f.path is not None and f.path not in path):
                    continue
                n = self._nth[k]
                self._nth[k] += 1
                if n == f.nth or (f.repeat and n > f.nth):
                    chosen = chosen or f.fault
            random_kind = chosen is None and self.rate and kind in self.random_kinds
            if random_kind and self._rng.random() < self.rate:
                chosen = self._rng.choice(APPLICABLE[kind])
            if chosen is None:
                return None
            self.injected.append(Injected(index, kind, path, chosen))
            return chosen, index

    def _call(self, kind: str, path: str) -> None:
        hit = self._hit(kind, path)
        if hit is not None:
            raise _error(hit[0], path)

    def _prefix(self, index: int, n: int) -> int:
        """A short write's length (fewer than ``n`` bytes), drawn from the seed and the call."""
        return random.Random(f"{self.seed}:{index}").randrange(n) if n else 0

    # -- FS ------------------------------------------------------------------------------------
    def open(self, path: str, *, create: bool = True) -> Handle:
        self._call("open", path)
        return FaultHandle(self, self.inner.open(path, create=create))

    def open_read(self, path: str) -> Handle:
        self._call("open", path)
        return FaultHandle(self, self.inner.open_read(path))

    def exists(self, path: str) -> bool:
        return self.inner.exists(path)

    def is_dir(self, path: str) -> bool:
        return self.inner.is_dir(path)

    def listdir(self, path: str) -> list[str]:
        return self.inner.listdir(path)

    def mkdir(self, path: str) -> bool:
        self._call("mkdir", path)
        return self.inner.mkdir(path)

    def rename(self, src: str, dst: str) -> None:
        self._call("rename", f"{src} -> {dst}")
        self.inner.rename(src, dst)

    def unlink(self, path: str) -> None:
        self._call("unlink", path)
        self.inner.unlink(path)

    def rmdir(self, path: str) -> None:
        self._call("rmdir", path)
        self.inner.rmdir(path)

    def fsync_dir(self, path: str) -> None:
        self._call("fsync_dir", path)
        self.inner.fsync_dir(path)

    def file_size(self, path: str) -> int:
        return self.inner.file_size(path)

    def chmod(self, path: str, mode: int) -> None:
        self.inner.chmod(path, mode)


class FaultHandle:
    """A handle of a ``FaultFS``: counts its calls, fails the planned ones."""

    __slots__ = ("path", "_fs", "_h")

    def __init__(self, fs: FaultFS, inner: Handle) -> None:
        self.path = inner.path
        self._fs = fs
        self._h = inner

    def __getattr__(self, name: str) -> Any:
        # optional extras of the wrapped handle (``data_regions``): present only if it has them
        if name == "_h":
            raise AttributeError(name)
        return getattr(self._h, name)

    def pwrite(self, data: bytes | bytearray | memoryview, offset: int) -> None:
        hit = self._fs._hit("pwrite", self.path)
        if hit is not None:
            fault, index = hit
            if fault == "short":
                n = self._fs._prefix(index, len(data))
                if n:
                    self._h.pwrite(memoryview(data)[:n], offset)
            raise _error(fault, self.path)
        self._h.pwrite(data, offset)

    def pread(self, size: int, offset: int) -> bytes:
        self._fs._call("pread", self.path)
        return self._h.pread(size, offset)

    def size(self) -> int:
        return self._h.size()

    def truncate(self, size: int) -> None:
        self._fs._call("truncate", self.path)
        self._h.truncate(size)

    def allocate(self, size: int) -> None:
        self._fs._call("allocate", self.path)
        self._h.allocate(size)

    def _sync(self, kind: str) -> None:
        hit = self._fs._hit(kind, self.path)
        if hit is not None:
            drop = getattr(self._h, "drop_unsynced", None)
            if hit[0] == "drop" and drop is not None:
                drop()
            raise _error(hit[0], self.path)

    def fdatasync(self) -> None:
        self._sync("fdatasync")
        self._h.fdatasync()

    def fsync(self) -> None:
        self._sync("fsync")
        self._h.fsync()

    def write_out(self, offset: int, size: int, wait: bool = True) -> None:
        self._sync("write_out")
        write_out(self._h, offset, size, wait=wait)

    def map(self) -> memoryview:
        self._fs._call("map", self.path)
        return self._h.map()

    def lock(self) -> None:
        self._h.lock()

    def close(self) -> None:
        self._h.close()
