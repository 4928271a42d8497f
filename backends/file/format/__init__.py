"""Byte formats of the file backend (spec/FORMATS.md): WAL, segments, progress files, snapshots.

Every codec here is pure (bytes in, bytes out, no I/O) so the backend, ``verify`` and the golden
vectors share one definition of each format. Decoders raise ``tidelog.errors.Corrupt`` with a
message naming the problem; the WAL scanner never raises (a torn tail is expected there).

This module holds what the formats share: the JSON body convention and the directory layout's
names (LAY-*), so the backend and ``verify`` build and recognise paths the same way.
"""

from __future__ import annotations

import json
import re
from typing import Any

from tidelog.errors import Corrupt

__all__ = [
    "FormatCorrupt",
    "dumps_body",
    "loads_body",
    "META_DIR",
    "WAL_DIR",
    "TOPICS_DIR",
    "LOCK_FILE",
    "LOCK_PID_FILE",
    "TMP_SUFFIX",
    "shard_dir_name",
    "parse_shard_dir_name",
    "topic_dir_name",
    "parse_topic_dir_name",
    "qseg_name",
    "parse_qseg_name",
]

META_DIR = "meta"
WAL_DIR = "wal"
TOPICS_DIR = "topics"
LOCK_FILE = ".lock"
LOCK_PID_FILE = ".lock.pid"
#: Suffix of a file being written atomically (write, fsync, rename, fsync dir): LAY-3.
TMP_SUFFIX = ".tmp"


class FormatCorrupt(Corrupt):
    """A ``Corrupt`` raised by a codec: ``rule`` names the spec/FORMATS.md rule the bytes break
    (``verify`` reports it), ``detail`` is the message without the rule suffix."""

    def __init__(self, rule: str, detail: str) -> None:
        super().__init__(f"{detail} ({rule})")
        self.rule = rule
        self.detail = detail


_SHARD_DIR = re.compile(r"shard-([0-9]{2})")
_TOPIC_DIR = re.compile(r"[0-9a-f]{16}")
_QSEG = re.compile(r"seg-([0-9]{20})\.qseg")


def dumps_body(obj: dict[str, Any]) -> bytes:
    """Compact, canonical UTF-8 JSON (WAL-9, SNAP-3): the same object always gives the same bytes,
    so golden vectors and checksums are stable."""
    text = json.dumps(obj, separators=(",", ":"), sort_keys=True, ensure_ascii=False)
    return text.encode("utf-8")


def loads_body(data: bytes | bytearray | memoryview, what: str, rule: str) -> dict[str, Any]:
    """Parse a JSON object body; anything else (bad UTF-8, bad JSON, not an object) is Corrupt."""
    try:
        obj = json.loads(bytes(data).decode("utf-8"))
    except (ValueError, RecursionError) as exc:  # UnicodeDecodeError is a ValueError
        raise FormatCorrupt(rule, f"{what}: body is not valid UTF-8 JSON ({exc})") from None
    if not isinstance(obj, dict):
        raise FormatCorrupt(rule, f"{what}: body is JSON {type(obj).__name__}, not an object")
    return obj


def shard_dir_name(shard: int) -> str:
    """``shard-NN`` (two decimal digits): the WAL directory of one shard when wal_shards > 1."""
    return f"shard-{shard:02d}"


def parse_shard_dir_name(name: str) -> int | None:
    m = _SHARD_DIR.fullmatch(name)
    return int(m.group(1)) if m else None


def topic_dir_name(topic_id: int) -> str:
    """A topic's directory under ``topics/``: its interned id as 16 lowercase hex digits."""
    return f"{topic_id:016x}"


def parse_topic_dir_name(name: str) -> int | None:
    return int(name, 16) if _TOPIC_DIR.fullmatch(name) else None


def qseg_name(first_seq: int) -> str:
    """``seg-<first_seq:020d>.qseg``: a bundle topic's sealed Quiver segment (BUNDLES QSEG-10;
    here, not in format.qseg, so that naming files does not import pyarrow)."""
    return f"seg-{first_seq:020d}.qseg"


def parse_qseg_name(name: str) -> int | None:
    m = _QSEG.fullmatch(name)
    return int(m.group(1)) if m else None
