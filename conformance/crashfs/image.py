"""Disk images: file contents as shared immutable chunks, directories as inode maps.

A crash state, the durable image and the volatile files are all built from these, so
unchanged chunks are shared rather than copied.
"""

from __future__ import annotations

import posixpath
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TypeAlias

import xxhash

ROOT = 0


_CHUNK = 1 << 16
_ZEROS = bytes(_CHUNK)
Chunks: TypeAlias = tuple[bytes, ...]


class Blocks:
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
class Image:
    files: dict[int, Chunks]  # inode -> content (immutable chunks: images share them)
    dirs: dict[int, dict[str, int]]  # inode -> name -> inode; ROOT is always present

    def copy(self) -> Image:
        return Image(dict(self.files), {d: dict(e) for d, e in self.dirs.items()})


def walk(
    dirs: dict[int, dict[str, int]], ino: int, prefix: str, above: frozenset[int] = frozenset()
) -> Iterator[tuple[str, int]]:
    """(path, inode) of everything below directory ``ino``, parents first, sorted. A "weak"
    crash image can hold a directory cycle (renames persisted out of order): not followed."""
    for name in sorted(dirs[ino]):
        child = dirs[ino][name]
        path = posixpath.join(prefix, name)
        yield path, child
        if child in dirs and child not in above and child != ino:
            yield from walk(dirs, child, path, above | {ino})


def collect(img: Image) -> Image:
    """Drop inodes no durable name reaches (CRASH-4: such files do not exist after a crash)."""
    keep = {ino for _, ino in walk(img.dirs, ROOT, "/")} | {ROOT}
    return Image(
        {i: b for i, b in img.files.items() if i in keep},
        {i: dict(e) for i, e in img.dirs.items() if i in keep},
    )


def fingerprint_image(img: Image) -> str:
    # XXH3-128 (a core dependency): fast enough for images holding preallocated files.
    h = xxhash.xxh3_128()
    for path, ino in walk(img.dirs, ROOT, "/"):
        if ino in img.dirs:
            h.update(b"D\0" + path.encode() + b"\0")
        else:
            content = Blocks(img.files[ino])
            h.update(b"F\0" + path.encode() + b"\0" + content.size.to_bytes(8, "little"))
            for chunk in content.chunks:  # a streaming hash: chunk boundaries do not matter
                h.update(chunk)
    return str(h.hexdigest())
