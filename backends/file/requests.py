"""Cross-process requests to the process that owns a file store (spec/FORMATS.md XPR-2..XPR-4).

A store has one writer (the ``.lock`` holder). Another process that needs a change — Spark's
streaming source committing a subscriber, Spark's writers making staged rows visible — drops a
request file in ``requests/``; the owner applies it (at open, and on every maintenance tick),
makes the effect durable, then writes ``<id>.done`` with the outcome and removes the request.
If nobody owns the store, the requester becomes the owner for a moment: opening the store
applies pending requests.

Requests are idempotent where it matters: ingest carries a producer id and sequence (TOP-11), so
a request applied twice (owner crashed after the effect but before ``.done``) appends once.
"""

from __future__ import annotations

import json
import os
import time
import uuid
from collections.abc import Callable
from typing import Any

from tidelog.backends.instances.shared import refuse_plain_open
from tidelog.errors import Locked, StorageError
from tidelog.fsio import FS, OsFS, make_dirs, replace_file

__all__ = ["submit", "pending", "finish", "outcome", "call", "REQUESTS_DIR", "read_staged"]

REQUESTS_DIR = "requests"


def _dir(root: str) -> str:
    return os.path.join(root, REQUESTS_DIR)


def submit(fs: FS, root: str, body: dict[str, Any]) -> str:
    """Write a request durably; returns its id (ids sort in submission order, XPR-2)."""
    rid = f"{time.time_ns():020d}-{uuid.uuid4().hex[:8]}"
    make_dirs(fs, _dir(root))
    replace_file(
        fs, os.path.join(_dir(root), rid + ".req"), json.dumps(body, sort_keys=True).encode()
    )
    return rid


def pending(fs: FS, root: str) -> list[tuple[str, dict[str, Any] | None]]:
    """(id, body) of every request not yet finished, oldest first; body None if unreadable."""
    directory = _dir(root)
    if not fs.is_dir(directory):
        return []
    out: list[tuple[str, dict[str, Any] | None]] = []
    for name in fs.listdir(directory):
        if not name.endswith(".req"):
            continue
        h = fs.open_read(os.path.join(directory, name))
        try:
            raw = h.pread(h.size(), 0)
        finally:
            h.close()
        try:
            body = json.loads(raw)
            out.append((name[:-4], body if isinstance(body, dict) else None))
        except ValueError:
            out.append((name[:-4], None))
    return out


def finish(fs: FS, root: str, rid: str, result: dict[str, Any]) -> None:
    """Record the outcome (``.done`` first, then drop the ``.req``: never both missing)."""
    directory = _dir(root)
    replace_file(fs, os.path.join(directory, rid + ".done"), json.dumps(result).encode())
    req = os.path.join(directory, rid + ".req")
    if fs.exists(req):
        fs.unlink(req)
        fs.fsync_dir(directory)


def outcome(fs: FS, root: str, rid: str) -> dict[str, Any] | None:
    """The outcome of a finished request (and forget it), or None while pending."""
    path = os.path.join(_dir(root), rid + ".done")
    if not fs.exists(path):
        return None
    h = fs.open_read(path)
    try:
        result: dict[str, Any] = json.loads(h.pread(h.size(), 0))
    finally:
        h.close()
    fs.unlink(path)
    return result


def call(
    root: str,
    body: dict[str, Any],
    *,
    timeout: float = 60.0,
    open_store: Callable[[str], Any] | None = None,
) -> dict[str, Any]:
    """Submit a request and wait for its outcome. If no process owns the store, become the
    owner briefly: opening it applies pending requests (XPR-3)."""
    fs = OsFS()
    refuse_plain_open(fs, root)  # INST-12: never a request into a store of several instances
    rid = submit(fs, root, body)
    deadline = time.monotonic() + timeout
    delay = 0.005
    while True:
        result = outcome(fs, root, rid)
        if result is not None:
            return result
        try:
            store = (open_store or _open)(root)
        except Locked:
            pass  # another process owns it: its maintenance tick applies the request
        else:
            store.close()
            continue
        if time.monotonic() > deadline:
            raise StorageError(
                f"request {rid} to {root} not applied within {timeout:g}s: is the "
                "owning process stuck? (its maintenance thread applies requests)"
            )
        time.sleep(delay)
        delay = min(delay * 2, 0.1)


def _open(root: str) -> Any:
    import tidelog

    return tidelog.open(f"file://{root}")  # URI-8: submit made it, holding only requests/


def read_staged(fs: FS, path: str) -> list[tuple[bytes, str | None, str | None]]:
    """Records of a staged file (XPR-4): an Arrow IPC stream with columns payload (binary),
    tag (string), node (string)."""
    import pyarrow as pa
    import pyarrow.ipc as ipc

    h = fs.open_read(path)
    try:
        data = h.pread(h.size(), 0)
    finally:
        h.close()
    table = ipc.open_stream(pa.py_buffer(data)).read_all()
    payloads = table.column("payload").to_pylist()
    tags = table.column("tag").to_pylist() if "tag" in table.column_names else [None] * len(table)
    nodes = (
        table.column("node").to_pylist() if "node" in table.column_names else [None] * len(table)
    )
    return list(zip(payloads, tags, nodes))
