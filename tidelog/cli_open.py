"""How the CLI opens what it reads (spec/CLI.md CLI-3): existing stores only, read-only where
the backend has a read-only view, and verify's files.

Not a command module: tidelog.cli imports it.
"""

from __future__ import annotations

import errno
import os

import tidelog
from tidelog.api import Store
from tidelog.errors import BadArgument, BadURI, StorageError
from tidelog.uri import URI

__all__ = ["open_existing", "open_read_only", "has_read_only_view", "file_location"]

# Schemes whose location is a path on this machine, and what the path must be.
_PATH_KINDS = {"file": "store directory", "blockdev": "ring image or device", "sf": "SF slot"}


def _missing(uri: URI) -> StorageError | None:
    """The error for a path-based store whose path does not exist, else None."""
    kind = _PATH_KINDS[uri.scheme]
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
    if parsed.scheme in _PATH_KINDS:
        _must_exist(parsed)
    if parsed.scheme == "file":
        return tidelog.open(parsed, create=False)
    if parsed.scheme == "blockdev":
        return tidelog.open(parsed, format=False)
    return tidelog.open(parsed)


# Schemes with a read-only view: no lock, nothing written (FORMATS XPR-1, FORMATS-blockdev
# BDEV-28, FORWARD SF-21).
_VIEWS = ("file", "blockdev", "sf")


def has_read_only_view(uri: str) -> bool:
    """Whether ``open_read_only`` opens ``uri`` as a view that never writes."""
    return tidelog.parse_uri(uri).scheme in _VIEWS


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
    if parsed.scheme not in _PATH_KINDS:
        raise BadArgument(
            f"{parsed.scheme}:// keeps no files to verify; give a path, or a file://, "
            "blockdev:// or sf:// URI"
        )
    if not parsed.location:
        raise BadURI(f"{target!r}: {parsed.scheme}:// needs a path")
    return os.path.abspath(parsed.location)
