"""The SegmentStore interface of the tiers (spec/TIERING.md TIER-2): objects named by relative
keys, put durably and atomically, read by byte range, deleted idempotently, listed.

``LocalSegmentStore`` is a directory through ``tidelog.fsio`` (so the crash simulator records
every write); ``ArrowSegmentStore`` is any ``pyarrow.fs.FileSystem`` (S3, GCS, HDFS, local).
Every failure leaves as ``io_error`` naming the store's URL and the key; a read never returns
fewer bytes than asked.
"""

from __future__ import annotations

import builtins
import os
import posixpath
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, Protocol
from urllib.parse import urlsplit

from tidelog.errors import BadOption, StorageError, TidelogError
from tidelog.fsio import FS, make_dirs, write_whole
from tidelog.uri import redact_text
from tidelog.uri import redact_url as redact

__all__ = [
    "SegmentStore",
    "LocalSegmentStore",
    "ArrowSegmentStore",
    "open_segment_store",
    "redact",
]


class SegmentStore(Protocol):
    """TIER-2. Keys are relative, ``/``-separated."""

    url: str

    def put(self, key: str, data: bytes | memoryview) -> None:
        """Durable and atomic: once this returns the whole object survives a crash, and no
        reader ever sees part of it."""

    def read_range(self, key: str, offset: int, length: int) -> bytes:
        """Exactly ``length`` bytes from ``offset``, or ``io_error``."""

    def read_view(self, key: str, offset: int, length: int) -> memoryview:
        """``read_range`` as a read-only buffer, without a copy where the tier allows one
        (TIER-2: a local directory maps the object when its FS maps files, FLT-9)."""

    def delete(self, key: str) -> None:
        """Idempotent: a missing object is not an error."""

    def list(self, prefix: str) -> list[str]:
        """Keys under ``prefix`` (a directory-like prefix ending in ``/`` or empty),
        ascending."""

    def exists(self, key: str) -> bool: ...

    def size(self, key: str) -> int: ...


@contextmanager
def _failing(store: SegmentStore, what: str, key: str) -> Iterator[None]:
    """TIER-2: any failure of a cold operation is io_error naming the URL and the key."""
    try:
        yield
    except TidelogError:
        raise
    except (OSError, ValueError, RuntimeError) as exc:  # pyarrow raises OSError subclasses
        why = redact_text(str(exc), store.url)  # a library's message may quote the URL
        err = StorageError(f"cold tier {redact(store.url)}: {what} {key}: {why} (TIER-2)")
        err.errno = getattr(exc, "errno", None)
        raise err from None


def _short(store: SegmentStore, key: str, offset: int, length: int, got: int) -> StorageError:
    return StorageError(
        f"cold tier {redact(store.url)}: reading {key}: {got} of {length} bytes at offset "
        f"{offset} (TIER-2: never a short read)"
    )


class LocalSegmentStore:
    """A cold tier in a local directory, through the store's FS (TIER-2: tmp, fdatasync,
    rename, directory fsync)."""

    def __init__(self, fs: FS, root: str, url: str | None = None) -> None:
        self.fs = fs
        self.root = root
        self.url = url or root

    def _path(self, key: str) -> str:
        return os.path.join(self.root, *key.split("/"))

    def put(self, key: str, data: bytes | memoryview) -> None:
        path = self._path(key)
        with _failing(self, "writing", key):
            make_dirs(self.fs, os.path.dirname(path))
            write_whole(self.fs, path + ".tmp", bytes(data), data_only=True)
            self.fs.rename(path + ".tmp", path)
            self.fs.fsync_dir(os.path.dirname(path))

    def read_range(self, key: str, offset: int, length: int) -> bytes:
        with _failing(self, "reading", key):
            h = self.fs.open_read(self._path(key))
            try:
                got = h.pread(length, offset) if length else b""
            finally:
                h.close()
        if len(got) != length:
            raise _short(self, key, offset, length, len(got))
        return got

    def read_view(self, key: str, offset: int, length: int) -> memoryview:
        """The object mapped (a copy under ``mmap=false``, FLT-9): its objects are immutable
        once put, and a map outlives its handle and the object's unlinking (fsio.Handle.map)."""
        if not length:
            return memoryview(b"")
        with _failing(self, "reading", key):
            h = self.fs.open_read(self._path(key))
            try:
                whole = h.map()
            finally:
                h.close()  # the map stays while the view is held
        if len(whole) < offset + length:
            raise _short(self, key, offset, length, max(0, len(whole) - offset))
        return whole[offset : offset + length]

    def delete(self, key: str) -> None:
        path = self._path(key)
        with _failing(self, "deleting", key):
            if self.fs.exists(path):
                self.fs.unlink(path)
                self.fs.fsync_dir(os.path.dirname(path))

    def list(self, prefix: str) -> list[str]:
        out: list[str] = []
        with _failing(self, "listing", prefix):
            self._walk(prefix.rstrip("/"), out)
        return sorted(out)

    def _walk(self, key: str, out: builtins.list[str]) -> None:
        path = self._path(key) if key else self.root
        if not self.fs.is_dir(path):
            return
        for name in self.fs.listdir(path):
            sub = f"{key}/{name}" if key else name
            if self.fs.is_dir(self._path(sub)):
                self._walk(sub, out)
            elif not name.endswith(".tmp"):  # an interrupted put (LAY-3): not an object
                out.append(sub)

    def exists(self, key: str) -> bool:
        with _failing(self, "probing", key):
            return self.fs.exists(self._path(key))

    def size(self, key: str) -> int:
        with _failing(self, "sizing", key):
            return self.fs.file_size(self._path(key))


class ArrowSegmentStore:
    """A cold tier on any ``pyarrow.fs.FileSystem`` under ``base`` (a bucket/prefix or a
    directory). An object store's put is atomic by itself; on a filesystem with directories
    (local, HDFS) the object is written to ``<key>.tmp`` and moved into place."""

    def __init__(self, filesystem: Any, base: str, url: str) -> None:
        self.afs = filesystem
        self.base = base.rstrip("/")
        self.url = url
        self._renames = filesystem.type_name in ("local", "hdfs")

    def _path(self, key: str) -> str:
        return f"{self.base}/{key}" if self.base else key

    def put(self, key: str, data: bytes | memoryview) -> None:
        path = self._path(key)
        with _failing(self, "writing", key):
            if self._renames:
                self.afs.create_dir(posixpath.dirname(path), recursive=True)
                with self.afs.open_output_stream(path + ".tmp") as out:
                    out.write(data)
                self.afs.move(path + ".tmp", path)
            else:
                with self.afs.open_output_stream(path) as out:
                    out.write(data)

    def read_range(self, key: str, offset: int, length: int) -> bytes:
        with _failing(self, "reading", key), self.afs.open_input_file(self._path(key)) as f:
            got = f.read_at(length, offset) if length else b""
        got = bytes(got)
        if len(got) != length:
            raise _short(self, key, offset, length, len(got))
        return got

    def read_view(self, key: str, offset: int, length: int) -> memoryview:
        """pyarrow's buffer itself (no copy into ``bytes``)."""
        with _failing(self, "reading", key), self.afs.open_input_file(self._path(key)) as f:
            got = memoryview(f.read_at(length, offset)) if length else memoryview(b"")
        if len(got) != length:
            raise _short(self, key, offset, length, len(got))
        return got.toreadonly()

    def delete(self, key: str) -> None:
        import pyarrow.fs as pafs

        with _failing(self, "deleting", key):
            info = self.afs.get_file_info(self._path(key))
            if info.type != pafs.FileType.NotFound:
                self.afs.delete_file(self._path(key))

    def list(self, prefix: str) -> list[str]:
        import pyarrow.fs as pafs

        where = self._path(prefix.rstrip("/")) if prefix else self.base
        with _failing(self, "listing", prefix):
            selector = pafs.FileSelector(where, recursive=True, allow_not_found=True)
            infos = self.afs.get_file_info(selector)
        start = len(self.base) + 1 if self.base else 0
        return sorted(
            i.path[start:]
            for i in infos
            if i.type == pafs.FileType.File and not i.path.endswith(".tmp")
        )

    def exists(self, key: str) -> bool:
        import pyarrow.fs as pafs

        with _failing(self, "probing", key):
            return bool(self.afs.get_file_info(self._path(key)).type == pafs.FileType.File)

    def size(self, key: str) -> int:
        import pyarrow.fs as pafs

        with _failing(self, "sizing", key):
            info = self.afs.get_file_info(self._path(key))
            if info.type != pafs.FileType.File:
                raise FileNotFoundError(f"no object {key}")
            return int(info.size)


def open_segment_store(url: str, fs: FS) -> SegmentStore:
    """TIER-1: an absolute path or ``file://`` URL is a local directory through ``fs``; any
    other URL is opened by ``pyarrow.fs.FileSystem.from_uri``. ``bad_option`` if it cannot
    be."""
    if url.startswith("/"):
        return LocalSegmentStore(fs, os.path.normpath(url), url)
    parts = urlsplit(url)
    if parts.scheme == "file" and not parts.query:
        if not parts.path.startswith("/") or parts.netloc not in ("", "localhost"):
            raise BadOption(
                f"cold={redact(url)!r}: a file:// cold tier needs an absolute path (TIER-1)"
            )
        return LocalSegmentStore(fs, os.path.normpath(parts.path), url)
    if not parts.scheme:
        raise BadOption(
            f"cold={redact(url)!r}: an absolute path or a URL pyarrow.fs opens (TIER-1)"
        )
    try:
        import pyarrow.fs as pafs

        filesystem, base = pafs.FileSystem.from_uri(url)
    except ImportError:  # pragma: no cover - pyarrow is a dependency
        raise BadOption(f"cold={redact(url)!r}: pyarrow is not installed (TIER-1)") from None
    except (OSError, ValueError, TypeError) as exc:
        raise BadOption(
            f"cold={redact(url)!r}: pyarrow.fs cannot open it: {redact_text(str(exc), url)} "
            "(TIER-1)"
        ) from None
    return ArrowSegmentStore(filesystem, base, url)
