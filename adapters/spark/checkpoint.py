"""Closing the one-batch commit lag from a Spark checkpoint (SPK-10).

Spark acknowledges a source's micro-batch N only while planning batch N+1, so the last batch of
every run (and every batch of a one-shot availableNow run) stays unacknowledged: the
subscriber's hwm trails the sink and the store keeps those records. They are safe to trim once
the sink committed them, and the checkpoint says exactly that: ``commits/<id>`` exists for a
batch the sink completed, and ``offsets/<id>`` holds that batch's end offset per source.
"""

from __future__ import annotations

import json
import os
from typing import Any

__all__ = ["committed_offset", "acknowledge_checkpoint"]


def _batch_ids(directory: str) -> list[int]:
    if not os.path.isdir(directory):
        return []
    return sorted(int(n) for n in os.listdir(directory) if n.isdigit())


def committed_offset(checkpoint_dir: str, source_index: int = 0) -> int | None:
    """The end seq of the newest micro-batch the sink committed, from a local checkpoint
    directory (``offsets/<id>``: ``v1``, the batch metadata, then one offset line per source),
    or None when no batch completed."""
    committed = _batch_ids(os.path.join(checkpoint_dir, "commits"))
    if not committed:
        return None
    path = os.path.join(checkpoint_dir, "offsets", str(committed[-1]))
    with open(path, encoding="utf-8") as f:
        lines = [line.strip() for line in f if line.strip()]
    offset: Any = json.loads(lines[2 + source_index])
    if not isinstance(offset, dict) or "seq" not in offset:
        raise ValueError(f"{path}: source {source_index} has no tidelog offset: {offset!r}")
    return int(offset["seq"])


def acknowledge_checkpoint(
    store: Any, topic: str, subscriber: str, checkpoint_dir: str, source_index: int = 0
) -> int:
    """Commit ``subscriber`` of ``topic`` up to what the checkpoint shows the sink committed,
    through an open (owning) ``tidelog.Store``; returns the subscriber's hwm. Idempotent."""
    sub = store.topic(topic, create=False).subscribe(subscriber, start="earliest")
    end = committed_offset(checkpoint_dir, source_index)
    if end is not None:
        sub.commit(min(end, store.topic(topic, create=False).state().head_seq))
        sub.flush()
    return int(sub.hwm)
