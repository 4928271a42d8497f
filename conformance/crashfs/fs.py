"""``RecordingFS``: an in-memory ``tidelog.fsio.FS`` that records every mutation.

Reads see the volatile image; each mutation is recorded as micro-ops (``ops``) in
``history`` and applied to the durable side (``persist.Disk``); ``crash_states`` asks
``states.Space`` for the disk images a power loss may leave.
"""

from __future__ import annotations

import errno
import itertools
import os
import posixpath
import random
import threading
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ...errors import BadArgument, Locked
from .image import ROOT, Blocks, Image, fingerprint_image, walk
from .ops import SECTOR, Data, Drop, Link, Op, Rename, Size, Sync, SyncDir, Unlink
from .persist import Disk
from .states import (
    DEFAULT_LIMIT,
    IDEAL_CAP,
    Choice,
    DirOps,
    Mode,
    Space,
    StateSpaceTooLarge,
    Torn,
    ranges,
    samples,
    torn_variants,
    weak_dirops,
)

if TYPE_CHECKING:
    from ...fsio import FS


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

    def write_out(self, offset: int, size: int, wait: bool = True) -> None:
        # Pacing only (fsio.write_out): not a barrier, the model does nothing (CRASH-2).
        self._check()

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
        self._load(Image({}, {ROOT: {}}))
        for d in dirs:
            self.mkdir(d)
        self.settle()

    # --- images and history -----------------------------------------------------------------
    def settle(self) -> None:
        """Declare the current volatile image durable and start a fresh history and stats (as
        if everything had been synced): for building a starting image."""
        with self._mutex:
            img = Image({i: b.freeze() for i, b in self._vfiles.items()}, {})
            img.dirs = {d: dict(e) for d, e in self._vdirs.items()}
            self._load(img)

    def _load(self, img: Image) -> None:
        self._vfiles = {i: Blocks(c) for i, c in img.files.items()}
        self._vdirs = {d: dict(e) for d, e in img.dirs.items()}
        self._next_ino = max([*self._vfiles, *self._vdirs]) + 1
        self._base = img.copy()  # where replays for crash_states(at=k) start
        self._replay: tuple[int, Disk] = (0, Disk(self._base))
        self._disk = Disk(img.copy())
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
            return fingerprint_image(self._disk.image)

    def tree(self, durable: bool = False) -> dict[str, bytes | None]:
        """Every path -> file content, or None for a directory (volatile or durable image)."""
        with self._mutex:
            if durable:
                files, dirs = self._disk.image.files, self._disk.image.dirs
            else:
                files, dirs = {i: b.freeze() for i, b in self._vfiles.items()}, self._vdirs
            return {
                p: (None if i in dirs else b"".join(files[i])) for p, i in walk(dirs, ROOT, "/")
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
            for rel, ino in walk(self._vdirs, top, ""):
                real = os.path.join(path, rel)
                if ino in self._vdirs:
                    os.mkdir(real)
                else:
                    with open(real, "wb") as f:
                        f.writelines(self._vfiles[ino].chunks)

    # --- crash states -----------------------------------------------------------------------
    def _disk_at(self, at: int | None) -> tuple[int, Disk]:
        with self._mutex:
            if at is None or at == len(self.history):
                return len(self.history), self._disk.copy()
            if not 0 <= at <= len(self.history):
                raise BadArgument(f"crash point at={at} outside 0..{len(self.history)}")
            # Replay from the base image, or from the last replay when the caller walks crash
            # points upwards (the usual loop), so that loop costs one replay, not one per point.
            start, disk = self._replay if self._replay[0] <= at else (0, Disk(self._base))
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
        space = Space(self._disk_at(at)[1], torn_variants(torn), weak_dirops(dirops))
        try:
            n_ideals = len(space.ideals(IDEAL_CAP))
        except OverflowError:
            n_ideals = IDEAL_CAP + 1
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
        space = Space(disk, torn_variants(torn), weak_dirops(dirops))
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
            combos = samples(space, random.Random(seed), 100 if limit is None else limit)
        else:
            raise BadArgument(f"mode must be 'exhaustive' or 'sample', not {mode!r}")
        return self._states(space, combos, point)

    def _states(
        self,
        space: Space,
        combos: Iterable[tuple[Sequence[Choice], frozenset[int]]],
        point: int,
    ) -> Iterator[RecordingFS]:
        seen: set[str] = set()
        for choice, ideal in combos:
            img, fates = space.build(choice, ideal)
            fp = fingerprint_image(img)
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
        text = f"crash after op {point}: persisted {ranges(kept)}; lost {ranges(lost)}"
        return text + (f"; torn {', '.join(torn)}" if torn else "")

    # --- volatile namespace -----------------------------------------------------------------
    def _lookup(self, path: str) -> int | None:
        ino = ROOT
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
            self._vfiles[ino] = Blocks()
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

    def mkdir(self, path: str) -> bool:
        with self._mutex:
            parts = _parts(path)
            made = False
            for i in range(1, len(parts) + 1):
                sub = "/" + "/".join(parts[:i])
                ino = self._lookup(sub)
                made = ino is None
                if made:
                    self._new_entry(sub, is_dir=True)
                elif ino not in self._vdirs:
                    raise _oserror(errno.EEXIST if i == len(parts) else errno.ENOTDIR, path)
            return made

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
            self._vfiles[ino] = Blocks(self._disk.image.files.get(ino, ()))
            self._record(Drop(ino, path))

    def _sync(self, ino: int, path: str, kind: str) -> None:
        with self._mutex:
            if kind == "fsync":
                self.stats.fsyncs += 1
            else:
                self.stats.fdatasyncs += 1
            self._record(Sync(ino, kind, path))


if TYPE_CHECKING:

    def _conforms(fs: RecordingFS) -> FS:  # mypy proves RecordingFS implements the seam
        return fs
