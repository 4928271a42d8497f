"""Crash-state enumeration (spec/CRASH.md CRASH-6): the choice space of one crash point.

``Space`` lays out the independent choices a power loss makes at one instant (per inode a
size prefix, per sector a version, a downward-closed set of directory ops), counts them,
draws samples from them and builds the image one combination leaves.
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Iterator, Sequence
from typing import Literal, TypeAlias

from ...errors import BadArgument
from .image import Image, collect
from .ops import SECTOR, Data, EntryOp, FileOp, Link, Rename, Size, Unlink
from .persist import Disk, apply_entry, build_file, entry_dirs, entry_names

DEFAULT_LIMIT = 10_000  # exhaustive mode refuses larger state spaces unless told otherwise
IDEAL_CAP = 100_000  # counting directory-op subsets stops here (state_space is then a bound)

Torn = Literal["off", "linear", "garbage", "all"]
DirOps = Literal["prefix", "weak"]
Mode = Literal["exhaustive", "sample"]
# CRASH-1: what the last persisted version of a sector may look like ("new" = intact).
VARIANTS: dict[str, tuple[str, ...]] = {
    "off": ("new",),
    "linear": ("new", "linear"),
    "garbage": ("new", "zero", "garbage"),
    "all": ("new", "linear", "zero", "garbage"),
}


class StateSpaceTooLarge(BadArgument):
    """Exhaustive enumeration would exceed ``limit``: raise the limit or use mode="sample"."""


Choice: TypeAlias = tuple[int, str]  # (how many persisted, variant of the last one)


class Space:
    """The choice dimensions of one crash point: per inode a Size prefix, per (inode, sector)
    a version, and one downward-closed set of pending entry ops."""

    def __init__(self, disk: Disk, variants: tuple[str, ...], weak: bool) -> None:
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
        key = entry_names if weak else entry_dirs
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
    ) -> tuple[Image, dict[int, str]]:
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
            files[ino] = build_file(
                self.image.files[ino], ops, sizes.get(ino, 0), sectors.get(ino, {}), fates
            )
        dirs = {d: dict(e) for d, e in self.image.dirs.items()}
        for p, (idx, op) in enumerate(self.entry_ops):
            if p in ideal:
                apply_entry(dirs, op)
            fates[idx] = "kept" if p in ideal else "lost"
        return collect(Image(files, dirs)), fates


def ranges(ix: list[int]) -> str:
    parts: list[str] = []
    for _, group in itertools.groupby(enumerate(ix), lambda t: t[1] - t[0]):
        g = [v for _, v in group]
        parts.append(f"#{g[0]}" if len(g) == 1 else f"#{g[0]}-{g[-1]}")
    return ",".join(parts) or "none"


def torn_variants(torn: str) -> tuple[str, ...]:
    if torn not in VARIANTS:
        raise BadArgument(f"torn must be one of {sorted(VARIANTS)}, not {torn!r}")
    return VARIANTS[torn]


def weak_dirops(dirops: str) -> bool:
    if dirops not in ("prefix", "weak"):
        raise BadArgument(f"dirops must be 'prefix' or 'weak', not {dirops!r}")
    return dirops == "weak"


def samples(
    space: Space, rng: random.Random, n: int
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
