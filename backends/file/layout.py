"""The store root's layout (spec/FORMATS.md LAY-1, LAY-2) as ``tidelog.storedir`` checks it
before a store is opened or created there (spec/SPEC.md URI-8)."""

from __future__ import annotations

import os

from tidelog.fsio import FS
from tidelog.storedir import Layout

from .format import LOCK_FILE, LOCK_PID_FILE, META_DIR, TOPICS_DIR, WAL_DIR
from .format.snapshot import parse_file_name, parse_mirror_name
from .requests import REQUESTS_DIR

__all__ = ["LAYOUT", "ROOT_ENTRIES"]

#: every name tidelog creates in a store root (LOCK-1, LOCK-2, LAY, XPR-2; REP-1's quarantine)
ROOT_ENTRIES = frozenset(
    {LOCK_FILE, LOCK_PID_FILE, META_DIR, WAL_DIR, TOPICS_DIR, REQUESTS_DIR, "quarantine"}
)


def _is_store(fs: FS, root: str, names: list[str]) -> bool:
    """LAY-1: ``meta/`` with at least one snapshot file or its mirror (SNAP-5); a ``meta/``
    alone proves nothing."""
    meta = os.path.join(root, META_DIR)
    return (
        META_DIR in names
        and fs.is_dir(meta)
        and any(
            parse_file_name(n) is not None or parse_mirror_name(n) is not None
            for n in fs.listdir(meta)
        )
    )


LAYOUT = Layout("a tidelog store", _is_store, ROOT_ENTRIES.__contains__)
