"""``file://`` URI options (spec URI-2, URI-3, ranges URI-6): parsed and checked before anything
is created."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from tidelog.backend import COMMON_OPTIONS, StoreOptions
from tidelog.errors import BadOption
from tidelog.fsio import WRITE_OUT_BYTES
from tidelog.options import (
    MAX_WAIT_MS,
    parse_bool,
    parse_choice,
    parse_int,
    parse_size,
    validate_options,
)
from tidelog.storedir import parse_create

__all__ = ["FileOptions", "parse_file_options"]


@dataclass(frozen=True)
class FileOptions:
    wal_shards: int = 1
    wal_file_bytes: int = 64 << 20
    wal_recycle: int = 2  # retired WAL files kept per shard for reuse (WAL-15)
    prealloc: str = "fallocate"
    commit_interval_ms: int = 10
    head_reserve: int = 1 << 16  # a durable HEAD_RESERVE per this many seqs at most (WAL-12)
    checkpoint_bytes: int = 32 << 20
    segment_max_records: int = 100_000
    segment_max_bytes: int = 64 << 20
    # WTAIL-6: seal the tails in memory from the WAL (in the seal worker on the OS's files),
    # for checkpoints after at least this much WAL
    seal_worker: bool = True
    seal_worker_bytes: int = 4 << 20
    write_out_bytes: int = WRITE_OUT_BYTES  # SEG-20: segment writeback paced in such pieces
    progress_flush_ms: int = 100
    create: str = "true"  # URI-8: one of storedir.CREATE_CHOICES
    background: bool = True  # false: no maintenance thread (deterministic I/O for crash tests)
    readonly: bool = False  # a read-only view: no lock, never writes (XPR-1)
    mmap: bool = True  # false: files are read by pread, never mapped (FLT-9)
    # the cold tier (spec/TIERING.md TIER-1): None = none, nothing relocates
    cold: str | None = None
    hot_retain_segments: int = 4
    hot_retain_bytes: int = 0
    cold_grace_ms: int = 600_000
    cold_cache_segments: int = 4


# The ranges and why: spec/SPEC.md URI-6.
_FILE_OPTIONS = {
    "wal_shards": lambda k, v: parse_int(k, v, minimum=1, maximum=64),
    "wal_file_bytes": lambda k, v: parse_size(k, v, minimum=64 << 10, maximum=1 << 30),
    "wal_recycle": lambda k, v: parse_int(k, v, minimum=0, maximum=64),
    "prealloc": lambda k, v: parse_choice(k, v, ("fallocate", "zero", "none")),
    "commit_interval_ms": lambda k, v: parse_int(k, v, minimum=1, maximum=60_000),
    "head_reserve": lambda k, v: parse_int(k, v, minimum=1, maximum=1 << 32),
    "checkpoint_bytes": lambda k, v: parse_size(k, v, minimum=4 << 10, maximum=64 << 30),
    "segment_max_records": lambda k, v: parse_int(k, v, minimum=1, maximum=(1 << 32) - 1),
    "segment_max_bytes": lambda k, v: parse_size(k, v, minimum=4 << 10, maximum=(1 << 32) - 1),
    "seal_worker": parse_bool,
    "seal_worker_bytes": lambda k, v: parse_size(k, v, minimum=0, maximum=64 << 30),
    "write_out_bytes": lambda k, v: parse_size(k, v, minimum=0, maximum=1 << 30),
    "progress_flush_ms": lambda k, v: parse_int(k, v, minimum=1, maximum=MAX_WAIT_MS),
    "create": parse_create,
    "background": parse_bool,
    "readonly": parse_bool,
    "mmap": parse_bool,
    "cold": lambda k, v: _parse_cold(k, v),
    "hot_retain_segments": lambda k, v: parse_int(k, v, minimum=0, maximum=(1 << 63) - 1),
    "hot_retain_bytes": lambda k, v: parse_size(k, v, minimum=0, maximum=(1 << 63) - 1),
    "cold_grace_ms": lambda k, v: parse_int(k, v, minimum=0, maximum=1 << 62),
    "cold_cache_segments": lambda k, v: parse_int(k, v, minimum=1, maximum=1024),
}


def _parse_cold(key: str, value: object) -> str:
    """TIER-1: a path or URL; whether it opens is checked when the store opens it."""
    if not isinstance(value, str) or not value:
        raise BadOption(f"{key}={value!r}: a local directory or a URL pyarrow.fs opens (TIER-1)")
    return value


def parse_file_options(options: Mapping[str, object]) -> tuple[StoreOptions, FileOptions]:
    parsed = validate_options(options, {**COMMON_OPTIONS, **_FILE_OPTIONS}, where="file://")
    common = {k: parsed.pop(k) for k in list(parsed) if k in COMMON_OPTIONS}
    return StoreOptions(**common), FileOptions(**parsed)
