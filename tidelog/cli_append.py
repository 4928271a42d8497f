"""``tidelog append`` in batches (spec/CLI.md CLI-6): stdin lines grouped into bounded
``append_many`` calls, with per-line results.

Not a command module: tidelog.cli's ``append`` uses it.
"""

from __future__ import annotations

import os
import select
import sys
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from typing import BinaryIO

from rich.console import Console
from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

from tidelog.api import Topic
from tidelog.errors import Backpressure, StoreFull, TooLarge, TopicFull

__all__ = [
    "MAX_BATCH_RECORDS",
    "MAX_BATCH_BYTES",
    "line_batches",
    "chunked",
    "append_batches",
    "batch_bounds",
    "show_progress",
    "progress",
]

MAX_BATCH_RECORDS = 1000
MAX_BATCH_BYTES = 1 << 20
_READ_BYTES = 1 << 16
# Refusals that leave the topic unchanged (ERR-2) and may not hold for fewer records at once.
_ROOM = (TooLarge, TopicFull, StoreFull, Backpressure)


class _Input:
    """Reads what a stream has; ``ready()`` says whether more is there without waiting."""

    def __init__(self, stream: BinaryIO) -> None:
        self.stream = stream
        try:
            self.fd: int | None = stream.fileno()
        except (AttributeError, OSError, ValueError):  # in memory (tests): all of it is there
            self.fd = None

    def read(self) -> bytes:
        if self.fd is None:
            read1 = getattr(self.stream, "read1", self.stream.read)
            return bytes(read1(_READ_BYTES))
        return os.read(self.fd, _READ_BYTES)  # what a pipe or terminal has, up to the size

    def ready(self) -> bool:
        if self.fd is None:
            return True
        return bool(select.select([self.fd], [], [], 0)[0])


def _take(lines: deque[bytes], max_records: int, max_bytes: int) -> list[bytes]:
    batch: list[bytes] = []
    size = 0
    while lines and len(batch) < max_records:
        if batch and size + len(lines[0]) > max_bytes:
            break
        size += len(lines[0])
        batch.append(lines.popleft())
    return batch


def line_batches(
    stream: BinaryIO, max_records: int, max_bytes: int, max_line: int
) -> Iterator[list[bytes]]:
    """Lines of ``stream`` (without ``\\n``) in batches of at most ``max_records`` records and
    ``max_bytes`` bytes (a longer line goes alone); a batch also ends where the input has
    nothing more ready, so slow input is appended as it comes (CLI-6). A line over
    ``max_line`` bytes (the store's ``max_record_bytes``) is ``too_large`` once the lines
    before it were given out; it is never held in memory whole."""
    source = _Input(stream)
    lines: deque[bytes] = deque()
    pending = 0  # bytes in ``lines``
    partial = bytearray()
    number = 0
    while True:
        chunk = source.read()
        if chunk:
            partial += chunk
            cut = partial.rfind(b"\n")
            if cut >= 0:
                new = bytes(partial[:cut]).split(b"\n")
                del partial[: cut + 1]
                lines.extend(new)
                pending += sum(len(x) for x in new)
                number += len(new)
        elif partial:
            lines.append(bytes(partial))
            pending += len(partial)
            partial.clear()
        too_long = len(partial) > max_line
        while len(lines) >= max_records or pending >= max_bytes:
            batch = _take(lines, max_records, max_bytes)
            pending -= sum(len(x) for x in batch)
            yield batch
        if lines and (not chunk or too_long or not source.ready()):
            while lines:
                batch = _take(lines, max_records, max_bytes)
                pending -= sum(len(x) for x in batch)
                yield batch
        if too_long:
            raise TooLarge(
                f"stdin line {number + 1} is longer than max_record_bytes={max_line}; "
                "the lines before it were appended"
            )
        if not chunk:
            return


def chunked(payloads: Iterable[bytes], max_records: int, max_bytes: int) -> Iterator[list[bytes]]:
    """PAYLOAD arguments in the same bounded batches as stdin lines."""
    lines = deque(payloads)
    while lines:
        yield _take(lines, max_records, max_bytes)


def append_batches(
    topic: Topic,
    batches: Iterable[list[bytes]],
    tag: str | None,
    node: str | None,
    acknowledged: Callable[[list[int], int], None],
) -> None:
    """Append each batch with one ``append_many``; ``acknowledged(seqs, payload_bytes)`` runs
    once they returned. A batch refused for room or size is retried one record at a time, so
    what is appended and what is raised are those of one append per record (CLI-6)."""
    for batch in batches:
        try:
            seqs = topic.append_many(batch, tag=tag, node=node)
        except _ROOM:
            for payload in batch:
                acknowledged([topic.append(payload, tag=tag, node=node)], len(payload))
            continue
        acknowledged(seqs, sum(len(p) for p in batch))


def batch_bounds(topic: Topic) -> tuple[int, int]:
    """Records and bytes per batch: the CLI's bounds, and never more than the topic's caps
    (an ``append_many`` above a cap is ``too_large`` whatever one record at a time would do,
    RET-5)."""
    cfg = topic.config
    records = min(MAX_BATCH_RECORDS, cfg.cap_records or MAX_BATCH_RECORDS)
    size = min(MAX_BATCH_BYTES, cfg.cap_bytes or MAX_BATCH_BYTES)
    return records, size


def show_progress() -> bool:
    """A progress line only where a person watches stderr and stdout is not the same screen."""
    return sys.stderr.isatty() and not sys.stdout.isatty()


def progress() -> Progress:
    return Progress(
        SpinnerColumn(),
        TextColumn("appended {task.completed:,} records, {task.fields[bytes]:,} bytes"),
        TimeElapsedColumn(),
        console=Console(stderr=True),
        transient=False,
    )
