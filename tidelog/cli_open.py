"""How the CLI opens what it reads (spec/CLI.md CLI-3): existing stores only, read-only where
the backend has a read-only view, and verify's files.

Not a command module: tidelog.cli imports it.
"""

from __future__ import annotations

import errno
import os
from typing import Any

import tidelog
from tidelog import registry
from tidelog.api import Store
from tidelog.errors import BadArgument, BadURI, StorageError
from tidelog.uri import URI

__all__ = ["open_existing", "open_read_only", "has_read_only_view", "file_location"]


def _path_kind(scheme: str) -> str | None:
    """What a path location of ``scheme`` names (a "store directory"), or None when the
    location is not a path on this machine (its descriptor says, REG-2)."""
    described = registry.find(scheme)
    return described.names if described is not None and described.location == "path" else None


def _missing(uri: URI) -> StorageError | None:
    """The error for a path-based store whose path does not exist, else None."""
    kind = _path_kind(uri.scheme)
    if not uri.location:
        raise BadURI(f"{uri.scheme}:// needs the path of a {kind}")
    path = os.path.abspath(uri.location)
    if os.path.lexists(path):
        return None
    err = StorageError(f"no {kind} at {path}: it does not exist (nothing was created)")
    err.errno = errno.ENOENT
    return err


def _must_exist(uri: URI) -> None:
    err = _missing(uri)
    if err is not None:
        raise err


def open_existing(uri: str) -> Store:
    """Open a store that must already exist, for writing (``forward --from``): a path-based
    store is never created by a typo."""
    parsed = tidelog.parse_uri(uri)
    described = registry.find(parsed.scheme)
    if described is None:
        return tidelog.open(parsed)  # unknown_scheme, naming the known ones
    if described.location == "path":
        _must_exist(parsed)
    options: dict[str, Any] = dict(described.open_existing)
    return tidelog.open(parsed, **options)


def has_read_only_view(uri: str) -> bool:
    """Whether ``open_read_only`` opens ``uri`` as a view that never writes (its descriptor
    says: file://, FORMATS XPR-1; blockdev://, BDEV-28; sf://, SF-21)."""
    described = registry.find(tidelog.parse_uri(uri).scheme)
    return described is not None and described.read_only_view


def open_read_only(uri: str) -> Store:
    """Open a store to read it (``inspect``, ``tail``; CLI-3): never created, never written
    where the backend has a read-only view (file://, XPR-1; blockdev://, BDEV-28; sf://,
    SF-21; the keyword wins over a ``readonly=false`` in the URI, URI-2). Any other scheme is
    opened as ``open_existing`` does."""
    if not has_read_only_view(uri):
        return open_existing(uri)
    parsed = tidelog.parse_uri(uri)
    try:  # the view validates the options first and creates nothing either way
        return tidelog.open(parsed, readonly=True)
    except StorageError:
        err = _missing(parsed)
        if err is None:
            raise
        raise err from None


def file_location(target: str) -> str:
    """The absolute path ``verify`` checks: a path as given, or the location of a URI whose
    scheme keeps its data in files (CLI-3); anything else is ``bad_argument``."""
    if "://" not in target:
        return os.path.abspath(target)
    parsed = tidelog.parse_uri(target)
    if _path_kind(parsed.scheme) is None:
        schemes = [f"{d.scheme}://" for d in registry.descriptors() if d.location == "path"]
        raise BadArgument(
            f"{parsed.scheme}:// keeps no files to verify; give a path, or a "
            f"{', '.join(schemes[:-1])} or {schemes[-1]} URI"
        )
    if not parsed.location:
        raise BadURI(f"{target!r}: {parsed.scheme}:// needs a path")
    return os.path.abspath(parsed.location)
