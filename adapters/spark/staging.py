"""Staged writes and requests to the store's owner (spec/FORMATS.md XPR-2..XPR-4; SPK-6, SPK-7,
SPK-11).

Executors never open the store for writing (it has one writer, LOCK-1): each task writes its
rows to a staged Arrow IPC file and reports the path in its commit message; the driver-side
commit hands every file to the owner in ONE ingest request carrying a producer id and sequence,
which the owner applies as one atomic, idempotent append (TOP-6, TOP-11).

Staged files live in an *attempt directory* (SPK-7) that the driver side creates before any task
runs; tasks only ever create files inside it, never directories. Removing an attempt therefore
first renames its directory away: from that instant no task can create a file under the old
path (it fails loudly instead), and every file created before is in the renamed directory, where
it is unlinked, even while a straggling task still writes to it (POSIX keeps the open inode; its
space is freed when the task closes it). So after ``remove_attempt`` returns nothing of the
attempt is visible or staged, whatever its tasks are still doing.
"""

from __future__ import annotations

import contextlib
import os
import uuid
from collections.abc import Iterator
from typing import Any

import pyarrow as pa
import pyarrow.ipc as ipc

from tidelog.backends.file import requests
from tidelog.errors import ERROR_CODES, BadOption, TidelogError

from . import netread
from .columns import staged_table
from .guard import StagingGone, missing_attempt
from .options import SourceOptions

__all__ = [
    "new_attempt",
    "stage",
    "remove_attempt",
    "sweep",
    "ingest",
    "request",
    "stream_producer",
    "StagingGone",
]

_DEAD = ".dead-"  # prefix of an attempt directory being removed


def new_attempt(parent: str, prefix: str) -> str:
    """Create and return a fresh attempt directory ``parent/<prefix>-<uuid>`` (driver side)."""
    path = os.path.join(parent, f"{prefix}-{uuid.uuid4().hex}")
    for _ in range(10):  # a concurrent remove_attempt may rmdir an emptied parent meanwhile
        try:
            os.makedirs(path)
            return path
        except FileNotFoundError:
            continue
    os.makedirs(path)  # pragma: no cover - ten lost races in a row
    return path


def stage(
    directory: str,
    batches: Iterator[pa.RecordBatch],
    slot: int | None,
    origin: tuple[str, str | None] | None = None,
) -> tuple[str, int]:
    """Write a task's batches to a new staged file in the attempt ``directory``; returns
    (path, rows), or ("", 0) when the task had no rows. The file is fsynced: the owner may apply
    the request after this machine rebooted. A task never creates the directory: if it is gone
    the attempt was aborted (``StagingGone``), or this host does not see it (``StoreNotVisible``,
    SPK-16; ``origin``: the staging directory's parent and the host of the driver that created
    the attempt)."""
    path = os.path.join(directory, f"part-{uuid.uuid4().hex}.arrow")
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    except FileNotFoundError:
        anchor, driver_host = origin or (os.path.dirname(os.path.dirname(directory)), None)
        raise missing_attempt(directory, anchor, driver_host) from None
    rows = 0
    try:
        with open(fd, "wb") as f:
            writer: ipc.RecordBatchStreamWriter | None = None
            try:
                for batch in batches:
                    staged = staged_table(batch, slot)
                    if writer is None:
                        writer = ipc.new_stream(f, staged.schema)
                    if staged.num_rows:
                        writer.write_batch(staged)
                        rows += staged.num_rows
            finally:
                if writer is not None:
                    writer.close()
            f.flush()
            os.fsync(f.fileno())
    except BaseException:
        with contextlib.suppress(OSError):  # a failed task leaves no partial file behind
            os.unlink(path)
        raise
    if not rows:  # nothing to ingest: no file to hand over
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
        return "", 0
    return path, rows


def remove_attempt(directory: str) -> None:
    """Remove an attempt directory and every file in it, atomically as far as tasks can tell
    (see the module docstring); then its parent, once empty. Idempotent."""
    parent = os.path.dirname(directory)
    dead = os.path.join(parent, _DEAD + uuid.uuid4().hex)
    try:
        os.rename(directory, dead)
    except FileNotFoundError:
        return
    _delete_tree(dead)
    with contextlib.suppress(OSError):  # the shared parent, once no attempt uses it
        os.rmdir(parent)


def _delete_tree(directory: str) -> None:
    for name in os.listdir(directory):
        with contextlib.suppress(FileNotFoundError):
            os.unlink(os.path.join(directory, name))
    with contextlib.suppress(OSError):
        os.rmdir(directory)


def sweep(parent: str) -> None:
    """Remove every attempt directory under ``parent`` (a streaming query's staging directory
    after one of its micro-batches committed or aborted: micro-batches of a query run one after
    another, so every attempt there is finished or failed), and ``parent`` once empty."""
    if not os.path.isdir(parent):
        return
    for name in os.listdir(parent):
        path = os.path.join(parent, name)
        if name.startswith(_DEAD):
            _delete_tree(path)  # a removal interrupted half-way
        else:
            remove_attempt(path)
    for directory in (parent, os.path.dirname(parent)):  # each once empty
        with contextlib.suppress(OSError):
            os.rmdir(directory)


def request(opts: SourceOptions, body: dict[str, Any], *, create: bool = False) -> dict[str, Any]:
    """Submit a request to the store's owner and wait; a refusal raises the owner's error."""
    if netread.is_served(opts.root):  # the owner's subscriber endpoints (SPK-40)
        return netread.request(opts, body)
    opener = None
    owner = opts.owner_options()
    # ingest may be the first write to a new store: the hand-off creates it (XPR-3); a store
    # with a cold tier only opens with it (TIER-6, SPK-30)
    if create or owner:
        import tidelog

        def opener(root: str) -> Any:
            return tidelog.open(f"file://{root}", **owner)

    result = requests.call(opts.root, body, timeout=opts.request_timeout, open_store=opener)
    if not result.get("ok"):
        cls = ERROR_CODES.get(str(result.get("code")), TidelogError)
        raise cls(f"{body.get('op')} request to {opts.root}: {result.get('message')}")
    return result


def ingest(opts: SourceOptions, files: list[str], producer: tuple[str, int]) -> list[int]:
    """Append every staged row of ``files`` atomically, at most once for ``producer`` (XPR-4,
    TOP-11). Returns [first seq, last seq], or [] when this producer sequence was applied
    before (a replayed commit)."""
    body: dict[str, Any] = {
        "op": "ingest",
        "topic": opts.topic,
        "files": files,
        "producer": [producer[0], producer[1]],
    }
    if opts.topic_config:
        body["config"] = dict(opts.topic_config)
    seqs: list[int] = request(opts, body, create=True)["seqs"]
    return seqs


def stream_producer(opts: SourceOptions, query_ids: set[str], batch_id: int) -> tuple[str, int]:
    """SPK-11: micro-batch ``batch_id``'s producer, ``(spark-<queryId>, batch_id + 1)``, the
    query id being option producerId or the one its tasks saw."""
    if opts.producer_id:
        return opts.producer_id, batch_id + 1
    if len(query_ids) != 1:
        raise BadOption("cannot tell which streaming query wrote this batch; set option producerId")
    return f"spark-{next(iter(query_ids))}", batch_id + 1
