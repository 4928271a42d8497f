"""Crash simulation for the ``FS`` seam (spec/CRASH.md, rules CRASH-1..CRASH-7).

``RecordingFS`` is an in-memory ``tidelog.fsio.FS``. Reads see the *volatile* image; every
mutation is also recorded, in program order, as a micro-op in ``history`` and, until a barrier
covers it, in a pending list next to the *durable* image. ``crash_states()`` enumerates the
disk images a power loss may leave at the current instant (or right after any earlier op ``at``),
each as a fresh ``RecordingFS`` whose volatile and durable images are that disk state, ready for
a backend's recovery to open.

What a crash may do (the persistence model) is normative in spec/CRASH.md; the comments below
cite its rules. Single process only: handles of a crashed-from file system are not carried over.
"""

from __future__ import annotations

import errno
import itertools
import os
import posixpath
import random
import threading
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal, TypeAlias

import xxhash

from ..errors import BadArgument, Locked

if TYPE_CHECKING:
    from ..fsio import FS

__all__ = [
    "RecordingFS", "RecordingHandle", "FSStats", "StateSpaceTooLarge", "SECTOR", "DEFAULT_LIMIT",
    "Data", "Size", "Link", "Unlink", "Rename", "Sync", "SyncDir", "Drop", "Op", "Torn", "DirOps",
    "Mode",
]  # fmt: skip

SECTOR = 512  # CRASH-1: the unit a device writes atomically-or-torn
DEFAULT_LIMIT = 10_000  # exhaustive mode refuses larger state spaces unless told otherwise
_ROOT = 0
_IDEAL_CAP = 100_000  # counting directory-op subsets stops here (state_space is then a bound)

Torn = Literal["off", "linear", "garbage", "all"]
DirOps = Literal["prefix", "weak"]
Mode = Literal["exhaustive", "sample"]
# CRASH-1: what the last persisted version of a sector may look like ("new" = intact).
_VARIANTS: dict[str, tuple[str, ...]] = {
    "off": ("new",),
    "linear": ("new", "linear"),
    "garbage": ("new", "zero", "garbage"),
    "all": ("new", "linear", "zero", "garbage"),
}


# ----------------------------------------------------------------------------------- micro-ops
# ``path`` fields are for people reading a failure; the semantics use inode numbers only.
@dataclass(frozen=True, slots=True)
class Data:
    """Bytes written inside one sector: ``offset // SECTOR`` is the same for every byte."""

    ino: int
    offset: int
    data: bytes
    path: str = field(default="", compare=False)

    def __str__(self) -> str:
        return f"write {self.path}[{self.offset}:{self.offset + len(self.data)}]"


@dataclass(frozen=True, slots=True)
class Size:
    ino: int
    size: int
    path: str = field(default="", compare=False)

    def __str__(self) -> str:
        return f"size {self.path}={self.size}"


@dataclass(frozen=True, slots=True)
class Link:
    dir: int
    name: str
    ino: int
    is_dir: bool
    path: str = field(default="", compare=False)

    def __str__(self) -> str:
        return f"{'mkdir' if self.is_dir else 'create'} {self.path}"


@dataclass(frozen=True, slots=True)
class Unlink:
    dir: int
    name: str
    path: str = field(default="", compare=False)

    def __str__(self) -> str:
        return f"unlink {self.path}"


@dataclass(frozen=True, slots=True)
class Rename:
    src_dir: int
    src_name: str
    dst_dir: int
    dst_name: str
    ino: int
    path: str = field(default="", compare=False)

    def __str__(self) -> str:
        return f"rename {self.path}"


@dataclass(frozen=True, slots=True)
class Sync:
    """fdatasync or fsync of a file (the same barrier here: CRASH-2)."""

    ino: int
    kind: str
    path: str = field(default="", compare=False)

    def __str__(self) -> str:
        return f"{self.kind} {self.path}"


@dataclass(frozen=True, slots=True)
class SyncDir:
    dir: int
    path: str = field(default="", compare=False)

    def __str__(self) -> str:
        return f"fsync_dir {self.path}"


@dataclass(frozen=True, slots=True)
class Drop:
    """A failed sync after which the kernel dropped the file's unsynced pages (Linux marks them
    clean after a writeback error): its pending writes never reach the disk, and reads see its
    durable bytes again (``RecordingHandle.drop_unsynced``; the fault-injecting FS uses it)."""

    ino: int
    path: str = field(default="", compare=False)

    def __str__(self) -> str:
        return f"drop unsynced {self.path}"


FileOp: TypeAlias = Data | Size
EntryOp: TypeAlias = Link | Unlink | Rename
Op: TypeAlias = Data | Size | Link | Unlink | Rename | Sync | SyncDir | Drop


@dataclass
class FSStats:
    """Operation counters (for write-amplification and benchmark reports)."""

    writes: int = 0  # pwrite calls with at least one byte
    bytes_written: int = 0
    sectors_written: int = 0  # 512-byte sector pieces those writes touched
    fdatasyncs: int = 0
    fsyncs: int = 0
    dir_fsyncs: int = 0
    truncates: int = 0  # truncate and allocate calls that changed the size
    creates: int = 0  # files and directories
    renames: int = 0
    unlinks: int = 0  # files and directories


class StateSpaceTooLarge(BadArgument):
    """Exhaustive enumeration would exceed ``limit``: raise the limit or use mode="sample"."""


# ------------------------------------------------------------------------------ disk images
_CHUNK = 1 << 16
_ZEROS = bytes(_CHUNK)
Chunks: TypeAlias = tuple[bytes, ...]


class _Blocks:
    """File content as immutable 64 KiB chunks (all full but the last). Images, crash states
    and volatile files share unchanged chunks, so a preallocated 64 MiB file costs a list of
    pointers per state and per sync, not a 64 MiB copy."""

    __slots__ = ("chunks", "size")

    def __init__(self, chunks: Chunks = ()) -> None:
        self.chunks = list(chunks)
        self.size = (len(chunks) - 1) * _CHUNK + len(chunks[-1]) if chunks else 0

    def read(self, offset: int, n: int) -> bytes:
        out, end = [], min(offset + n, self.size)
        while offset < end:
            i, j = divmod(offset, _CHUNK)
            take = min(_CHUNK - j, end - offset)
            out.append(self.chunks[i][j : j + take])
            offset += take
        return b"".join(out)

    def write(self, offset: int, data: bytes) -> None:
        self.resize(max(self.size, offset + len(data)))
        pos = 0
        while pos < len(data):
            i, j = divmod(offset + pos, _CHUNK)
            take = min(_CHUNK - j, len(data) - pos)
            c = self.chunks[i]
            self.chunks[i] = c[:j] + data[pos : pos + take] + c[j + take :]
            pos += take

    def resize(self, n: int) -> None:
        """Shrink (the bytes are gone) or extend with zeros."""
        if n < self.size:
            i, j = divmod(n, _CHUNK)
            del self.chunks[i + (j > 0) :]
            if j:
                self.chunks[i] = self.chunks[i][:j]
        while self.size < n:
            last = self.chunks[-1] if self.chunks and len(self.chunks[-1]) < _CHUNK else None
            take = min(_CHUNK - len(last or b""), n - self.size)
            if last is not None:
                self.chunks[-1] = last + bytes(take)
            else:
                self.chunks.append(_ZEROS if take == _CHUNK else bytes(take))
            self.size += take
        self.size = n

    def freeze(self) -> Chunks:
        return tuple(self.chunks)


@dataclass
class _Image:
    files: dict[int, Chunks]  # inode -> content (immutable chunks: images share them)
    dirs: dict[int, dict[str, int]]  # inode -> name -> inode; _ROOT is always present

    def copy(self) -> _Image:
        return _Image(dict(self.files), {d: dict(e) for d, e in self.dirs.items()})


def _walk(
    dirs: dict[int, dict[str, int]], ino: int, prefix: str, above: frozenset[int] = frozenset()
) -> Iterator[tuple[str, int]]:
    """(path, inode) of everything below directory ``ino``, parents first, sorted. A "weak"
    crash image can hold a directory cycle (renames persisted out of order): not followed."""
    for name in sorted(dirs[ino]):
        child = dirs[ino][name]
        path = posixpath.join(prefix, name)
        yield path, child
        if child in dirs and child not in above and child != ino:
            yield from _walk(dirs, child, path, above | {ino})


def _gc(img: _Image) -> _Image:
    """Drop inodes no durable name reaches (CRASH-4: such files do not exist after a crash)."""
    keep = {ino for _, ino in _walk(img.dirs, _ROOT, "/")} | {_ROOT}
    return _Image(
        {i: b for i, b in img.files.items() if i in keep},
        {i: dict(e) for i, e in img.dirs.items() if i in keep},
    )


def _fingerprint(img: _Image) -> str:
    # XXH3-128 (a core dependency): fast enough for images holding preallocated files.
    h = xxhash.xxh3_128()
    for path, ino in _walk(img.dirs, _ROOT, "/"):
        if ino in img.dirs:
            h.update(b"D\0" + path.encode() + b"\0")
        else:
            content = _Blocks(img.files[ino])
            h.update(b"F\0" + path.encode() + b"\0" + content.size.to_bytes(8, "little"))
            for chunk in content.chunks:  # a streaming hash: chunk boundaries do not matter
                h.update(chunk)
    return str(h.hexdigest())


def _torn(op: Data, variant: str, idx: int, buf: _Blocks) -> bytes:
    """CRASH-1: a torn version of ``op`` over the bytes before it. Only the written range
    changes (powersafe overwrite); garbage is seeded by the op index so images are stable."""
    n = len(op.data)
    if variant == "new":
        return op.data
    if variant == "zero":
        return bytes(n)
    if variant == "garbage":
        return random.Random(f"garbage:{idx}").randbytes(n)
    old = buf.read(op.offset, n).ljust(n, b"\0")
    return op.data[: n // 2] + old[n // 2 :]  # linear: first half new, rest as before


def _build_file(
    base: Chunks,
    ops: Sequence[tuple[int, FileOp]],
    n_sizes: int | None = None,
    sectors: dict[int, tuple[int, str]] | None = None,
    fates: dict[int, str] | None = None,
) -> Chunks:
    """Replay one inode's pending ops over its durable bytes, in program order.

    ``n_sizes``: how many of the Size ops persisted (an in-order prefix, CRASH-3); ``sectors``:
    per sector, how many of its writes persisted (an in-order prefix, CRASH-1) and the variant
    of the last one. ``None`` means everything persisted intact (a sync folding ops in).
    """
    buf = _Blocks(base)
    size, seen_sizes = buf.size, 0
    seen: dict[int, int] = {}
    for idx, op in ops:
        if isinstance(op, Size):
            seen_sizes += 1
            kept = n_sizes is None or seen_sizes <= n_sizes
            if kept:
                if op.size < buf.size:  # freed blocks: a later extension reads zeros
                    buf.resize(op.size)
                size = op.size
            if fates is not None:
                fates[idx] = "kept" if kept else "lost"
            continue
        s = op.offset // SECTOR
        n = seen[s] = seen.get(s, 0) + 1
        k, variant = (n, "new") if sectors is None else sectors[s]
        if n > k:
            if fates is not None:
                fates[idx] = "lost"
            continue
        data = op.data if n < k else _torn(op, variant, idx, buf)
        if fates is not None:
            fates[idx] = "kept" if n < k or variant == "new" else variant
        buf.write(op.offset, data)  # beyond the persisted size it stays invisible
    buf.resize(size)
    return buf.freeze()


def _entry_dirs(op: EntryOp) -> set[int]:
    return {op.src_dir, op.dst_dir} if isinstance(op, Rename) else {op.dir}


def _entry_names(op: EntryOp) -> set[tuple[int, str]]:
    if isinstance(op, Rename):
        return {(op.src_dir, op.src_name), (op.dst_dir, op.dst_name)}
    return {(op.dir, op.name)}


def _apply_entry(dirs: dict[int, dict[str, int]], op: EntryOp) -> None:
    if isinstance(op, Link):
        dirs.setdefault(op.dir, {})[op.name] = op.ino
    elif isinstance(op, Unlink):
        dirs.setdefault(op.dir, {}).pop(op.name, None)
    else:  # CRASH-5: atomic, by inode, so a persisted rename never leaves both names missing
        src = dirs.setdefault(op.src_dir, {})
        if src.get(op.src_name) == op.ino:
            del src[op.src_name]
        dirs.setdefault(op.dst_dir, {})[op.dst_name] = op.ino


class _Disk:
    """The durable image plus the ops no barrier covers yet, as (history index, op)."""

    def __init__(self, image: _Image, pending: list[tuple[int, Op]] | None = None) -> None:
        self.image = image
        self.pending = pending or []

    def copy(self) -> _Disk:
        return _Disk(self.image.copy(), list(self.pending))

    def apply(self, idx: int, op: Op) -> None:
        if isinstance(op, Sync):
            self._fold_file(op.ino)
        elif isinstance(op, SyncDir):
            self._fold_dir(op.dir)
        elif isinstance(op, Drop):
            self.pending = [
                (i, p)
                for i, p in self.pending
                if not (isinstance(p, Data | Size) and p.ino == op.ino)
            ]
        else:
            if isinstance(op, Link):  # a new inode's durable content starts empty
                if op.is_dir:
                    self.image.dirs.setdefault(op.ino, {})
                else:
                    self.image.files.setdefault(op.ino, ())
            self.pending.append((idx, op))

    def _fold_file(self, ino: int) -> None:
        """CRASH-2: a file sync makes every earlier Data/Size op of the inode durable."""
        mine: list[tuple[int, FileOp]] = []
        rest: list[tuple[int, Op]] = []
        for i, op in self.pending:
            if isinstance(op, Data | Size) and op.ino == ino:
                mine.append((i, op))
            else:
                rest.append((i, op))
        if mine:
            self.image.files[ino] = _build_file(self.image.files[ino], mine)
            self.pending = rest

    def _fold_dir(self, d: int) -> None:
        """CRASH-4/5: a directory fsync makes that directory's earlier entry ops durable. A
        rename belongs to both its directories; making it durable also makes durable the other
        directory's ops before it, so each directory's pending ops stay a program-order tail."""
        upto: dict[int, int] = {}
        work = [(d, len(self.pending))]
        while work:
            dd, end = work.pop()
            if upto.get(dd, -1) >= end:
                continue
            upto[dd] = end
            for pos in range(end):
                op = self.pending[pos][1]
                if isinstance(op, Rename) and dd in _entry_dirs(op):
                    work.extend((other, pos) for other in _entry_dirs(op) - {dd})
        fold: set[int] = set()
        for pos, (_, op) in enumerate(self.pending):
            if isinstance(op, Link | Unlink | Rename) and any(
                pos < upto.get(x, -1) for x in _entry_dirs(op)
            ):
                fold.add(pos)
                _apply_entry(self.image.dirs, op)
        self.pending = [p for pos, p in enumerate(self.pending) if pos not in fold]


Choice: TypeAlias = tuple[int, str]  # (how many persisted, variant of the last one)


class _Space:
    """The choice dimensions of one crash point: per inode a Size prefix, per (inode, sector)
    a version, and one downward-closed set of pending entry ops."""

    def __init__(self, disk: _Disk, variants: tuple[str, ...], weak: bool) -> None:
        self.image = disk.image
        self.file_ops: dict[int, list[tuple[int, FileOp]]] = {}
        self.entry_ops: list[tuple[int, EntryOp]] = []
        for i, op in disk.pending:
            if isinstance(op, Data | Size):
                self.file_ops.setdefault(op.ino, []).append((i, op))
            elif isinstance(op, Link | Unlink | Rename):
                self.entry_ops.append((i, op))
        self.dims: list[tuple[int, int | None, list[Choice]]] = []
        for ino, ops in self.file_ops.items():
            n_sizes = sum(isinstance(op, Size) for _, op in ops)
            if n_sizes:
                self.dims.append((ino, None, [(j, "") for j in range(n_sizes + 1)]))
            per_sector: dict[int, int] = {}
            for _, op in ops:
                if isinstance(op, Data):
                    s = op.offset // SECTOR
                    per_sector[s] = per_sector.get(s, 0) + 1
            for s, m in per_sector.items():
                opts = [(0, "")] + [(k, v) for k in range(1, m + 1) for v in variants]
                self.dims.append((ino, s, opts))
        # CRASH-4: an entry op may persist only with every earlier op it is ordered after:
        # same directory ("prefix") or same name ("weak").
        key = _entry_names if weak else _entry_dirs
        keys = [key(op) for _, op in self.entry_ops]
        self.deps = [[q for q in range(p) if keys[q] & keys[p]] for p in range(len(self.entry_ops))]

    def file_combinations(self) -> int:
        n = 1
        for _, _, opts in self.dims:
            n *= len(opts)
        return n

    def ideals(self, cap: int) -> list[frozenset[int]]:
        """Every allowed subset of pending entry ops; raises OverflowError past ``cap``."""
        out: list[frozenset[int]] = [frozenset()]
        for p, deps in enumerate(self.deps):
            out += [s | {p} for s in out if all(q in s for q in deps)]
            if len(out) > cap:
                raise OverflowError(len(out))
        return out

    def random_ideal(self, rng: random.Random) -> frozenset[int]:
        chosen: set[int] = set()
        for p, deps in enumerate(self.deps):
            if all(q in chosen for q in deps) and rng.random() < 0.5:
                chosen.add(p)
        return frozenset(chosen)

    def everything(self) -> tuple[list[Choice], frozenset[int]]:
        full = [max(o for o in opts if o[1] in ("", "new")) for _, _, opts in self.dims]
        return full, frozenset(range(len(self.entry_ops)))

    def build(
        self, choice: Sequence[Choice], ideal: frozenset[int]
    ) -> tuple[_Image, dict[int, str]]:
        sizes: dict[int, int] = {}
        sectors: dict[int, dict[int, Choice]] = {}
        for (ino, sector, _), ch in zip(self.dims, choice):
            if sector is None:
                sizes[ino] = ch[0]
            else:
                sectors.setdefault(ino, {})[sector] = ch
        fates: dict[int, str] = {}
        files = dict(self.image.files)
        for ino, ops in self.file_ops.items():
            files[ino] = _build_file(
                self.image.files[ino], ops, sizes.get(ino, 0), sectors.get(ino, {}), fates
            )
        dirs = {d: dict(e) for d, e in self.image.dirs.items()}
        for p, (idx, op) in enumerate(self.entry_ops):
            if p in ideal:
                _apply_entry(dirs, op)
            fates[idx] = "kept" if p in ideal else "lost"
        return _gc(_Image(files, dirs)), fates


def _ranges(ix: list[int]) -> str:
    parts: list[str] = []
    for _, group in itertools.groupby(enumerate(ix), lambda t: t[1] - t[0]):
        g = [v for _, v in group]
        parts.append(f"#{g[0]}" if len(g) == 1 else f"#{g[0]}-{g[-1]}")
    return ",".join(parts) or "none"


# ------------------------------------------------------------------------------- the FS
def _oserror(code: int, path: str) -> OSError:
    return OSError(code, os.strerror(code), path)  # OSError() picks FileNotFoundError etc.


def _parts(path: str) -> list[str]:
    # Paths live under a virtual root "/"; a relative path is taken relative to it.
    return [p for p in posixpath.normpath("/" + path).split("/") if p]


class RecordingHandle:
    """An open file of a ``RecordingFS`` (implements ``tidelog.fsio.Handle``)."""

    __slots__ = ("path", "_fs", "_ino", "_writable", "_closed")
    path: str

    def __init__(self, fs: RecordingFS, ino: int, path: str, writable: bool) -> None:
        self.path, self._fs, self._ino, self._writable = path, fs, ino, writable
        self._closed = False

    def _check(self, write: bool = False) -> None:
        if self._closed or (write and not self._writable):
            raise _oserror(errno.EBADF, self.path)

    def pwrite(self, data: bytes | bytearray | memoryview, offset: int) -> None:
        self._check(write=True)
        self._fs._write(self._ino, self.path, bytes(data), offset)

    def pread(self, size: int, offset: int) -> bytes:
        self._check()
        if size < 0 or offset < 0:
            raise _oserror(errno.EINVAL, self.path)
        with self._fs._mutex:
            return self._fs._vfiles[self._ino].read(offset, size)

    def size(self) -> int:
        self._check()
        with self._fs._mutex:
            return self._fs._vfiles[self._ino].size

    def truncate(self, size: int) -> None:
        self._check(write=True)
        self._fs._resize(self._ino, self.path, size)

    def allocate(self, size: int) -> None:
        # Zero-filled extension recorded as a Size op: durable only after a sync (CRASH-3).
        self._check(write=True)
        if size > self.size():
            self._fs._resize(self._ino, self.path, size)

    def fdatasync(self) -> None:
        self._check()
        self._fs._sync(self._ino, self.path, "fdatasync")

    def fsync(self) -> None:
        self._check()
        self._fs._sync(self._ino, self.path, "fsync")

    def drop_unsynced(self) -> None:
        """What a failed sync may do on Linux: the file's writes since its last sync never
        reach the disk and reads see its durable bytes again (a ``Drop`` op)."""
        self._check()
        self._fs._drop(self._ino, self.path)

    def map(self) -> memoryview:
        """A read-only snapshot of the current bytes: unlike an mmap it never sees later
        writes. The backend maps only sealed (immutable) files, where the two agree."""
        self._check()
        with self._fs._mutex:
            return memoryview(b"".join(self._fs._vfiles[self._ino].chunks))

    def lock(self) -> None:
        """Exclusive per-inode lock within this RecordingFS (flock-like: re-locking through
        the same handle is fine, another open handle gets ``Locked``); released on close."""
        self._check()
        with self._fs._mutex:
            holder = self._fs._locks.get(self._ino)
            if holder is not None and holder is not self:
                raise Locked(f"{self.path} is locked by another process")
            self._fs._locks[self._ino] = self

    def close(self) -> None:
        with self._fs._mutex:
            if self._fs._locks.get(self._ino) is self:
                del self._fs._locks[self._ino]
            self._closed = True


class RecordingFS:
    """An in-memory ``FS`` that records every mutation and enumerates crash states.

    ``dirs`` are created as already-durable directories (the place a test puts its store).
    Thread-safe: one lock serialises every call, so ``history`` is a total order.
    """

    def __init__(self, dirs: Iterable[str] = ()) -> None:
        self._mutex = threading.RLock()
        self._locks: dict[int, RecordingHandle] = {}
        self.description = "initial image"  # for crash states: which ops persisted or tore
        self.crash_at: int | None = None  # for crash states: the crash point in the parent
        self._load(_Image({}, {_ROOT: {}}))
        for d in dirs:
            self.mkdir(d)
        self.settle()

    # --- images and history -----------------------------------------------------------------
    def settle(self) -> None:
        """Declare the current volatile image durable and start a fresh history and stats (as
        if everything had been synced): for building a starting image."""
        with self._mutex:
            img = _Image({i: b.freeze() for i, b in self._vfiles.items()}, {})
            img.dirs = {d: dict(e) for d, e in self._vdirs.items()}
            self._load(img)

    def _load(self, img: _Image) -> None:
        self._vfiles = {i: _Blocks(c) for i, c in img.files.items()}
        self._vdirs = {d: dict(e) for d, e in img.dirs.items()}
        self._next_ino = max([*self._vfiles, *self._vdirs]) + 1
        self._base = img.copy()  # where replays for crash_states(at=k) start
        self._replay: tuple[int, _Disk] = (0, _Disk(self._base))
        self._disk = _Disk(img.copy())
        self.history: list[Op] = []
        self.stats = FSStats()

    def _record(self, op: Op) -> None:
        self.history.append(op)
        self._disk.apply(len(self.history) - 1, op)

    def checkpoints(self) -> list[int]:
        """Crash points worth trying first: 0, right after every sync barrier, and now."""
        with self._mutex:
            n = len(self.history)
            after = [i + 1 for i, op in enumerate(self.history) if isinstance(op, Sync | SyncDir)]
            return sorted({0, n, *after})

    def pending(self, at: int | None = None) -> list[tuple[int, Op]]:
        """The (history index, op) pairs no barrier covered at crash point ``at``."""
        return list(self._disk_at(at)[1].pending)

    def fingerprint(self) -> str:
        """A hash of the durable image (paths, kinds, contents): equal images, equal prints."""
        with self._mutex:
            return _fingerprint(self._disk.image)

    def tree(self, durable: bool = False) -> dict[str, bytes | None]:
        """Every path -> file content, or None for a directory (volatile or durable image)."""
        with self._mutex:
            if durable:
                files, dirs = self._disk.image.files, self._disk.image.dirs
            else:
                files, dirs = {i: b.freeze() for i, b in self._vfiles.items()}, self._vdirs
            return {
                p: (None if i in dirs else b"".join(files[i])) for p, i in _walk(dirs, _ROOT, "/")
            }

    @classmethod
    def from_directory(cls, path: str, *, at: str = "/") -> RecordingFS:
        """A durable image of real directory ``path``, mounted at virtual path ``at``."""
        if not os.path.isdir(path):
            raise _oserror(errno.ENOENT if not os.path.exists(path) else errno.ENOTDIR, path)
        fs = cls()
        for dirpath, dirnames, filenames in os.walk(path):
            dirnames.sort()
            rel = os.path.relpath(dirpath, path)
            vdir = at if rel == "." else posixpath.join(at, rel)
            fs.mkdir(vdir)
            for name in sorted(filenames):
                with open(os.path.join(dirpath, name), "rb") as f:
                    h = fs.open(posixpath.join(vdir, name))
                    h.pwrite(f.read(), 0)
                    h.close()
        fs.settle()
        return fs

    def to_directory(self, path: str, *, at: str = "/") -> None:
        """Write the volatile image under virtual ``at`` into real directory ``path`` (created
        if missing, must be empty), e.g. to open a failing crash state with OsFS or the CLI."""
        os.makedirs(path, exist_ok=True)
        if os.listdir(path):
            raise _oserror(errno.ENOTEMPTY, path)
        with self._mutex:
            top = self._lookup(at)
            if top is None or top not in self._vdirs:
                raise _oserror(errno.ENOENT, at)
            for rel, ino in _walk(self._vdirs, top, ""):
                real = os.path.join(path, rel)
                if ino in self._vdirs:
                    os.mkdir(real)
                else:
                    with open(real, "wb") as f:
                        f.writelines(self._vfiles[ino].chunks)

    # --- crash states -----------------------------------------------------------------------
    def _disk_at(self, at: int | None) -> tuple[int, _Disk]:
        with self._mutex:
            if at is None or at == len(self.history):
                return len(self.history), self._disk.copy()
            if not 0 <= at <= len(self.history):
                raise BadArgument(f"crash point at={at} outside 0..{len(self.history)}")
            # Replay from the base image, or from the last replay when the caller walks crash
            # points upwards (the usual loop), so that loop costs one replay, not one per point.
            start, disk = self._replay if self._replay[0] <= at else (0, _Disk(self._base))
            disk = disk.copy()
            for i in range(start, at):
                disk.apply(i, self.history[i])
            self._replay = (at, disk.copy())
            return at, disk

    def state_space(
        self, *, at: int | None = None, torn: Torn = "garbage", dirops: DirOps = "prefix"
    ) -> int:
        """How many combinations exhaustive mode would try (before deduplication); a lower
        bound once the directory-op subsets exceed 100 000."""
        space = _Space(self._disk_at(at)[1], _variants(torn), _weak(dirops))
        try:
            n_ideals = len(space.ideals(_IDEAL_CAP))
        except OverflowError:
            n_ideals = _IDEAL_CAP + 1
        return space.file_combinations() * n_ideals

    def crash_states(
        self,
        *,
        at: int | None = None,
        mode: Mode = "exhaustive",
        seed: int | None = None,
        limit: int | None = None,
        torn: Torn = "garbage",
        dirops: DirOps = "prefix",
    ) -> Iterator[RecordingFS]:
        """The distinct disk states a power loss right after op ``at`` (default: now) may
        leave, each a fresh RecordingFS with ``.description`` and ``.crash_at`` (CRASH-6).

        ``exhaustive``: every combination, deduplicated by fingerprint; raises
        ``StateSpaceTooLarge`` (before yielding anything) if there are more than ``limit``
        (default ``DEFAULT_LIMIT``). ``sample``: ``limit`` (default 100) combinations drawn from
        ``random.Random(seed)`` (the first two: nothing persisted, everything persisted),
        deduplicated, so at most ``limit`` states; the same seed gives the same states.
        """
        point, disk = self._disk_at(at)
        space = _Space(disk, _variants(torn), _weak(dirops))
        if mode == "exhaustive":
            cap = DEFAULT_LIMIT if limit is None else limit
            files = space.file_combinations()
            try:
                if files > cap:
                    raise OverflowError(files)
                ideals = space.ideals(cap // files)
            except OverflowError:
                raise StateSpaceTooLarge(
                    f"crash point {point}: more than {cap} crash states "
                    f"({len(space.dims)} sector/size choices, {len(space.entry_ops)} pending "
                    f"directory ops); pass a larger limit or use mode='sample' with a seed"
                ) from None
            combos: Iterable[tuple[Sequence[Choice], frozenset[int]]] = (
                (choice, ideal)
                for ideal in ideals
                for choice in itertools.product(*(opts for _, _, opts in space.dims))
            )
        elif mode == "sample":
            if seed is None:
                raise BadArgument("mode='sample' needs a seed (print it so a failure reproduces)")
            combos = _samples(space, random.Random(seed), 100 if limit is None else limit)
        else:
            raise BadArgument(f"mode must be 'exhaustive' or 'sample', not {mode!r}")
        return self._states(space, combos, point)

    def _states(
        self,
        space: _Space,
        combos: Iterable[tuple[Sequence[Choice], frozenset[int]]],
        point: int,
    ) -> Iterator[RecordingFS]:
        seen: set[str] = set()
        for choice, ideal in combos:
            img, fates = space.build(choice, ideal)
            fp = _fingerprint(img)
            if fp in seen:
                continue
            seen.add(fp)
            state = RecordingFS()
            state._load(img)
            state.crash_at = point
            state.description = self._describe(point, fates)
            yield state

    def _describe(self, point: int, fates: dict[int, str]) -> str:
        kept = sorted(i for i, f in fates.items() if f == "kept")
        lost = sorted(i for i, f in fates.items() if f == "lost")
        torn = [
            f"#{i} {self.history[i]}={f}"
            for i, f in sorted(fates.items())
            if f not in ("kept", "lost")
        ]
        text = f"crash after op {point}: persisted {_ranges(kept)}; lost {_ranges(lost)}"
        return text + (f"; torn {', '.join(torn)}" if torn else "")

    # --- volatile namespace -----------------------------------------------------------------
    def _lookup(self, path: str) -> int | None:
        ino = _ROOT
        for part in _parts(path):
            entries = self._vdirs.get(ino)
            if entries is None or part not in entries:
                return None
            ino = entries[part]
        return ino

    def _parent(self, path: str) -> tuple[int, str]:
        parts = _parts(path)
        if not parts:
            raise _oserror(errno.EBUSY, path)  # the root has no entry to change
        d = self._lookup("/".join(parts[:-1]))
        if d is None:
            raise _oserror(errno.ENOENT, path)
        if d not in self._vdirs:
            raise _oserror(errno.ENOTDIR, path)
        return d, parts[-1]

    def _new_entry(self, path: str, is_dir: bool) -> int:
        d, name = self._parent(path)
        ino, self._next_ino = self._next_ino, self._next_ino + 1
        if is_dir:
            self._vdirs[ino] = {}
        else:
            self._vfiles[ino] = _Blocks()
        self._vdirs[d][name] = ino
        self.stats.creates += 1
        self._record(Link(d, name, ino, is_dir, path))
        return ino

    def open(self, path: str, *, create: bool = True) -> RecordingHandle:
        with self._mutex:
            ino = self._lookup(path)
            if ino is None:
                if not create:
                    raise _oserror(errno.ENOENT, path)
                ino = self._new_entry(path, is_dir=False)
            elif ino in self._vdirs:
                raise _oserror(errno.EISDIR, path)
            return RecordingHandle(self, ino, path, writable=True)

    def open_read(self, path: str) -> RecordingHandle:
        with self._mutex:
            ino = self._lookup(path)
            if ino is None:
                raise _oserror(errno.ENOENT, path)
            if ino in self._vdirs:
                raise _oserror(errno.EISDIR, path)
            return RecordingHandle(self, ino, path, writable=False)

    def exists(self, path: str) -> bool:
        with self._mutex:
            return self._lookup(path) is not None

    def is_dir(self, path: str) -> bool:
        with self._mutex:
            return self._lookup(path) in self._vdirs

    def listdir(self, path: str) -> list[str]:
        with self._mutex:
            ino = self._lookup(path)
            if ino is None:
                raise _oserror(errno.ENOENT, path)
            if ino not in self._vdirs:
                raise _oserror(errno.ENOTDIR, path)
            return sorted(self._vdirs[ino])

    def mkdir(self, path: str) -> None:
        with self._mutex:
            parts = _parts(path)
            for i in range(1, len(parts) + 1):
                sub = "/" + "/".join(parts[:i])
                ino = self._lookup(sub)
                if ino is None:
                    self._new_entry(sub, is_dir=True)
                elif ino not in self._vdirs:
                    raise _oserror(errno.EEXIST if i == len(parts) else errno.ENOTDIR, path)

    def rename(self, src: str, dst: str) -> None:
        with self._mutex:
            sd, sn = self._parent(src)
            ino = self._vdirs[sd].get(sn)
            if ino is None:
                raise _oserror(errno.ENOENT, src)
            dd, dn = self._parent(dst)
            old = self._vdirs[dd].get(dn)
            if old == ino:
                return  # same file: rename(2) does nothing
            if ino in self._vdirs and _parts(dst)[: len(_parts(src))] == _parts(src):
                raise _oserror(errno.EINVAL, dst)  # a directory into itself
            if old is not None:
                if (ino in self._vdirs) != (old in self._vdirs):
                    raise _oserror(errno.EISDIR if old in self._vdirs else errno.ENOTDIR, dst)
                if self._vdirs.get(old):
                    raise _oserror(errno.ENOTEMPTY, dst)
            del self._vdirs[sd][sn]
            self._vdirs[dd][dn] = ino
            self.stats.renames += 1
            self._record(Rename(sd, sn, dd, dn, ino, f"{src} -> {dst}"))

    def _remove(self, path: str, want_dir: bool) -> None:
        with self._mutex:
            d, name = self._parent(path)
            ino = self._vdirs[d].get(name)
            if ino is None:
                raise _oserror(errno.ENOENT, path)
            if (ino in self._vdirs) != want_dir:
                raise _oserror(errno.ENOTDIR if want_dir else errno.EISDIR, path)
            if want_dir and self._vdirs[ino]:
                raise _oserror(errno.ENOTEMPTY, path)
            del self._vdirs[d][name]
            self.stats.unlinks += 1
            self._record(Unlink(d, name, path))

    def unlink(self, path: str) -> None:
        self._remove(path, want_dir=False)

    def rmdir(self, path: str) -> None:
        self._remove(path, want_dir=True)

    def fsync_dir(self, path: str) -> None:
        with self._mutex:
            ino = self._lookup(path)
            if ino is None:
                raise _oserror(errno.ENOENT, path)
            if ino not in self._vdirs:
                raise _oserror(errno.ENOTDIR, path)
            self.stats.dir_fsyncs += 1
            self._record(SyncDir(ino, path))

    def file_size(self, path: str) -> int:
        with self._mutex:
            ino = self._lookup(path)
            if ino is None:
                raise _oserror(errno.ENOENT, path)
            return self._vfiles[ino].size if ino in self._vfiles else 0

    def chmod(self, path: str, mode: int) -> None:
        """Permission bits are not part of an image (no reader relies on them; a crash may
        leave a file writable again), so only the path is checked."""
        with self._mutex:
            if self._lookup(path) is None:
                raise _oserror(errno.ENOENT, path)

    # --- file data (called by handles) -----------------------------------------------------
    def _write(self, ino: int, path: str, data: bytes, offset: int) -> None:
        if offset < 0:
            raise _oserror(errno.EINVAL, path)
        if not data:
            return
        with self._mutex:
            buf, end = self._vfiles[ino], offset + len(data)
            self.stats.writes += 1
            self.stats.bytes_written += len(data)
            if end > buf.size:  # an extending write grows the file first (ALICE's order)
                self._record(Size(ino, end, path))
            buf.write(offset, data)
            pos = offset
            while pos < end:  # CRASH-1: one op per sector touched
                stop = min(end, (pos // SECTOR + 1) * SECTOR)
                self._record(Data(ino, pos, data[pos - offset : stop - offset], path))
                self.stats.sectors_written += 1
                pos = stop

    def _resize(self, ino: int, path: str, size: int) -> None:
        if size < 0:
            raise _oserror(errno.EINVAL, path)
        with self._mutex:
            buf = self._vfiles[ino]
            if size == buf.size:
                return
            buf.resize(size)
            self.stats.truncates += 1
            self._record(Size(ino, size, path))

    def _drop(self, ino: int, path: str) -> None:
        with self._mutex:
            self._vfiles[ino] = _Blocks(self._disk.image.files.get(ino, ()))
            self._record(Drop(ino, path))

    def _sync(self, ino: int, path: str, kind: str) -> None:
        with self._mutex:
            if kind == "fsync":
                self.stats.fsyncs += 1
            else:
                self.stats.fdatasyncs += 1
            self._record(Sync(ino, kind, path))


def _variants(torn: str) -> tuple[str, ...]:
    if torn not in _VARIANTS:
        raise BadArgument(f"torn must be one of {sorted(_VARIANTS)}, not {torn!r}")
    return _VARIANTS[torn]


def _weak(dirops: str) -> bool:
    if dirops not in ("prefix", "weak"):
        raise BadArgument(f"dirops must be 'prefix' or 'weak', not {dirops!r}")
    return dirops == "weak"


def _samples(
    space: _Space, rng: random.Random, n: int
) -> Iterator[tuple[Sequence[Choice], frozenset[int]]]:
    """The two extremes first (cheap, and the ones a small budget must not miss), then random
    combinations. Every draw comes from ``rng``, so a seed reproduces the sequence."""
    for i in range(n):
        if i == 0:
            yield [opts[0] for _, _, opts in space.dims], frozenset()
        elif i == 1:
            yield space.everything()
        else:
            yield [rng.choice(opts) for _, _, opts in space.dims], space.random_ideal(rng)


if TYPE_CHECKING:

    def _conforms(fs: RecordingFS) -> FS:  # mypy proves RecordingFS implements the seam
        return fs
