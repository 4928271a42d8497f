"""Metadata snapshots ``meta/snapshot-<n:016x>.bin`` (SNAP-1..): a checksummed JSON object.

The codec frames and checksums the body and checks only that it is a JSON object with an int
``version``; the schema (spec/FORMATS.md) belongs to the backend that writes it.
"""

from __future__ import annotations

import re
import struct
from typing import Any

import xxhash

from tidelog.errors import BadArgument

from . import FormatCorrupt, dumps_body, loads_body

__all__ = [
    "MAGIC",
    "VERSION",
    "HEADER_SIZE",
    "FOOTER_SIZE",
    "encode_snapshot",
    "decode_snapshot",
    "file_name",
    "parse_file_name",
    "mirror_name",
    "parse_mirror_name",
    "copies",
]

MAGIC = b"TDLSNAP1"
VERSION = 1
HEADER_SIZE = 32
FOOTER_SIZE = 8

_HEADER = struct.Struct("<8sIIQQ")  # magic | version u32 | header_size u32 | n u64 | body_len u64
_U64 = struct.Struct("<Q")
_NAME = re.compile(r"snapshot-([0-9a-f]{16})\.bin")
_MIRROR = re.compile(r"snapshot-([0-9a-f]{16})\.mirror")


def _has_int_version(body: dict[str, Any]) -> bool:
    version = body.get("version")
    # bool is an int subclass, but true/false is not a schema version.
    return isinstance(version, int) and not isinstance(version, bool)


def encode_snapshot(n: int, body: dict[str, Any]) -> bytes:
    """Snapshot number ``n`` holding ``body`` (SNAP-1..SNAP-3)."""
    if not _has_int_version(body):
        raise BadArgument('snapshot body needs an integer "version"')
    data = dumps_body(body)
    try:
        head = _HEADER.pack(MAGIC, VERSION, HEADER_SIZE, n, len(data))
    except struct.error as exc:
        raise BadArgument(f"snapshot number out of range ({exc})") from None
    framed = head + data
    return framed + _U64.pack(xxhash.xxh3_64_intdigest(framed))


def decode_snapshot(buf: bytes | bytearray | memoryview) -> tuple[int, dict[str, Any]]:
    """(n, body) of a snapshot file; Corrupt naming the first problem (SNAP-1..SNAP-3)."""
    what = "snapshot"
    if len(buf) < HEADER_SIZE + FOOTER_SIZE:
        raise FormatCorrupt("SNAP-2", f"{what}: {len(buf)} bytes, shorter than header + footer")
    magic, version, header_size, n, body_len = _HEADER.unpack_from(buf)
    if magic != MAGIC:
        raise FormatCorrupt("SNAP-1", f"{what}: bad magic {bytes(magic)!r}, expected {MAGIC!r}")
    if version != VERSION:
        raise FormatCorrupt(
            "SNAP-1", f"{what}: unsupported version {version} (this reader knows {VERSION})"
        )
    if header_size != HEADER_SIZE:
        raise FormatCorrupt("SNAP-1", f"{what}: header_size {header_size}, expected {HEADER_SIZE}")
    if HEADER_SIZE + body_len + FOOTER_SIZE != len(buf):
        raise FormatCorrupt(
            "SNAP-2", f"{what}: body_len {body_len} does not match the {len(buf)}-byte file"
        )
    mv = memoryview(buf)
    end = HEADER_SIZE + body_len
    (stored,) = _U64.unpack_from(mv, end)
    if xxhash.xxh3_64_intdigest(mv[:end]) != stored:
        raise FormatCorrupt("SNAP-2", f"{what}: XXH3-64 checksum mismatch")
    body = loads_body(mv[HEADER_SIZE:end], what, "SNAP-3")
    if not _has_int_version(body):
        raise FormatCorrupt("SNAP-3", f'{what}: body has no integer "version"')
    return n, body


def file_name(n: int) -> str:
    """``snapshot-<n:016x>.bin`` (SNAP-4)."""
    return f"snapshot-{n:016x}.bin"


def parse_file_name(name: str) -> int | None:
    m = _NAME.fullmatch(name)
    return int(m.group(1), 16) if m else None


def mirror_name(n: int) -> str:
    """``snapshot-<n:016x>.mirror``: the second copy of snapshot ``n`` (SNAP-5)."""
    return f"snapshot-{n:016x}.mirror"


def parse_mirror_name(name: str) -> int | None:
    m = _MIRROR.fullmatch(name)
    return int(m.group(1), 16) if m else None


def copies(names: list[str]) -> dict[int, list[str]]:
    """Snapshot number -> the names of its copies among ``names`` (the file first, then the
    mirror, SNAP-5)."""
    out: dict[int, list[str]] = {}
    for name in sorted(names, key=lambda x: x.endswith(".mirror")):
        n = parse_file_name(name)
        if n is None:
            n = parse_mirror_name(name)
        if n is not None:
            out.setdefault(n, []).append(name)
    return out
