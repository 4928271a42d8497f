"""Staged writes and requests to the store's owner (spec/FORMATS.md XPR-2..XPR-4; SPK-6..SPK-8).

Executors never open the store for writing (it has one writer, LOCK-1): each task writes its
rows to a staged Arrow IPC file and reports the path in its commit message; the driver-side
commit hands every file to the owner in ONE ingest request carrying a producer id and sequence,
which the owner applies as one atomic, idempotent append (TOP-6, TOP-11).
"""

from __future__ import annotations

import contextlib
import os
import uuid
from collections.abc import Iterable, Iterator
from typing import Any

import pyarrow as pa
import pyarrow.ipc as ipc

from tidelog.backends.file import requests
from tidelog.errors import ERROR_CODES, TidelogError

from .columns import staged_table
from .options import SourceOptions

__all__ = ["stage", "ingest", "request", "discard", "discard_dir"]


def stage(directory: str, batches: Iterator[pa.RecordBatch], slot: int | None) -> tuple[str, int]:
    """Write a task's batches to a new staged file under ``directory``; returns (path, rows).
    The file is fsynced: the owner may apply the request after this machine rebooted."""
    os.makedirs(directory, exist_ok=True)
    path = os.path.join(directory, f"part-{uuid.uuid4().hex}.arrow")
    rows = 0
    writer: ipc.RecordBatchStreamWriter | None = None
    with open(path, "wb") as f:
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
    if not rows:  # nothing to ingest: no file to hand over
        os.unlink(path)
        return "", 0
    return path, rows


def request(opts: SourceOptions, body: dict[str, Any], *, create: bool = False) -> dict[str, Any]:
    """Submit a request to the store's owner and wait; a refusal raises the owner's error."""
    opener = None
    if create:  # ingest may be the first write to a new store: the hand-off creates it (XPR-3)
        import tidelog

        def opener(root: str) -> Any:
            return tidelog.open(f"file://{root}")

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


def discard(paths: Iterable[str]) -> None:
    for path in paths:
        if path:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)


def discard_dir(directory: str) -> None:
    """Remove a job's staging directory with every file in it (abort: nothing staged survives,
    including files of tasks that failed and so sent no commit message)."""
    if not os.path.isdir(directory):
        return
    for name in os.listdir(directory):
        with contextlib.suppress(FileNotFoundError):
            os.unlink(os.path.join(directory, name))
    with contextlib.suppress(OSError):
        os.rmdir(directory)
    with contextlib.suppress(OSError):  # the shared parent, once no job uses it
        os.rmdir(os.path.dirname(directory))
