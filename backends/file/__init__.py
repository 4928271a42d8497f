"""tidelog.backends.file: the ``file://`` backend (WAL + group commit + segments + snapshots).

``file:///abs/dir`` or ``file://./rel/dir`` (see tidelog.uri). Byte layouts: spec/FORMATS.md.
Crash behaviour: spec/SPEC.md §7 and spec/CRASH.md.
"""

from __future__ import annotations

import shutil
from collections.abc import Mapping

from tidelog.api import Store
from tidelog.backend import Backend
from tidelog.backends.instances.shared import refuse_plain_open
from tidelog.clock import Clock, SystemClock
from tidelog.fsio import FS, OsFS
from tidelog.uri import URI, store_path

from .options import FileOptions, parse_file_options
from .store import CAPABILITIES, FileBackend

__all__ = ["FileBackend", "FileOptions", "open_backend", "open_store", "dispose", "CAPABILITIES"]


def open_backend(uri: URI, options: Mapping[str, object], clock: Clock) -> Backend:
    root = store_path(uri, "file:///var/lib/app/buf or file://./buf")  # URI-7
    if "instances" in options:  # several writer processes (spec/INSTANCES.md)
        from tidelog.backends.instances import open_instances

        return open_instances(None, root, clock, options)
    store_options, file_options = parse_file_options(options)
    fs = OsFS(mmap=file_options.mmap)
    refuse_plain_open(fs, root)  # INST-1: never one instance read as the whole store
    return FileBackend(fs, root, clock, store_options, file_options)


def dispose(uri: URI) -> None:
    """Delete the store directory a ``file://`` URI names (the descriptor's ``dispose``, REG-5:
    the conformance kit, between examples)."""
    shutil.rmtree(uri.location, ignore_errors=True)


def open_store(fs: FS, root: str, clock: Clock | None = None, **options: object) -> Store:
    """Open a file store through an explicit FS (crash tests pass a RecordingFS)."""
    store_options, file_options = parse_file_options(options)
    backend = FileBackend(fs, root, clock or SystemClock(), store_options, file_options)
    return Store(backend, f"file://{root}")
