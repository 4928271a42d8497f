"""``listing``: what a refusal must leave unchanged (spec URI-2, URI-8: nothing created)."""

from __future__ import annotations

import os
from pathlib import Path


def listing(root: Path) -> list[tuple[str, bool, int]]:
    """Every entry under ``root`` (links not followed): relative path, is-a-link, size."""
    out = []
    for d, dirs, files in os.walk(root):
        for name in dirs + files:
            p = Path(d) / name
            out.append((str(p.relative_to(root)), p.is_symlink(), p.lstat().st_size))
    return sorted(out)
