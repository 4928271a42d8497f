"""The persistence model (spec/CRASH.md CRASH-1..CRASH-5): what a pending op may leave on disk.

``Disk`` is the durable image plus the ops no barrier covers yet; a sync folds a file's
pending ops in (CRASH-2), a directory fsync its entry ops (CRASH-4, CRASH-5). ``build_file``
replays a file's pending ops with a chosen prefix of sizes and per-sector versions, torn as
``torn_bytes`` says (CRASH-1, CRASH-3).
"""

from __future__ import annotations

import random
from collections.abc import Sequence

from .image import Blocks, Chunks, Image
from .ops import SECTOR, Data, Drop, EntryOp, FileOp, Link, Op, Rename, Size, Sync, SyncDir, Unlink


def torn_bytes(op: Data, variant: str, idx: int, buf: Blocks) -> bytes:
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


def build_file(
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
    buf = Blocks(base)
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
        data = op.data if n < k else torn_bytes(op, variant, idx, buf)
        if fates is not None:
            fates[idx] = "kept" if n < k or variant == "new" else variant
        buf.write(op.offset, data)  # beyond the persisted size it stays invisible
    buf.resize(size)
    return buf.freeze()


def entry_dirs(op: EntryOp) -> set[int]:
    return {op.src_dir, op.dst_dir} if isinstance(op, Rename) else {op.dir}


def entry_names(op: EntryOp) -> set[tuple[int, str]]:
    if isinstance(op, Rename):
        return {(op.src_dir, op.src_name), (op.dst_dir, op.dst_name)}
    return {(op.dir, op.name)}


def apply_entry(dirs: dict[int, dict[str, int]], op: EntryOp) -> None:
    if isinstance(op, Link):
        dirs.setdefault(op.dir, {})[op.name] = op.ino
    elif isinstance(op, Unlink):
        dirs.setdefault(op.dir, {}).pop(op.name, None)
    else:  # CRASH-5: atomic, by inode, so a persisted rename never leaves both names missing
        src = dirs.setdefault(op.src_dir, {})
        if src.get(op.src_name) == op.ino:
            del src[op.src_name]
        dirs.setdefault(op.dst_dir, {})[op.dst_name] = op.ino


class Disk:
    """The durable image plus the ops no barrier covers yet, as (history index, op)."""

    def __init__(self, image: Image, pending: list[tuple[int, Op]] | None = None) -> None:
        self.image = image
        self.pending = pending or []

    def copy(self) -> Disk:
        return Disk(self.image.copy(), list(self.pending))

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
            self.image.files[ino] = build_file(self.image.files[ino], mine)
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
                if isinstance(op, Rename) and dd in entry_dirs(op):
                    work.extend((other, pos) for other in entry_dirs(op) - {dd})
        fold: set[int] = set()
        for pos, (_, op) in enumerate(self.pending):
            if isinstance(op, Link | Unlink | Rename) and any(
                pos < upto.get(x, -1) for x in entry_dirs(op)
            ):
                fold.add(pos)
                apply_entry(self.image.dirs, op)
        self.pending = [p for pos, p in enumerate(self.pending) if pos not in fold]
