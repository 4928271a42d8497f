"""A sealed Quiver segment (``.qseg``, spec/BUNDLES.md QSEG) as a ``SealedChunk`` of a bundle
topic's log: the file is mapped once, validated whole at open (QSEG-7: CRC, footer, directory,
manifest, every stream), and records are served from the mapping.

``record(i)`` hands back the exact payload that was appended (QSEG-9): it is reassembled from
the stored Arrow IPC messages, without decoding or re-encoding Arrow data. ``bundle(i)`` and
``reader`` give zero-copy Arrow batches whose buffers point into the mapping (QSEG-11).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from tidelog.bundle import RecordBundle
from tidelog.errors import Corrupt
from tidelog.fsio import Handle
from tidelog.records import Record

from .chunk import DeadSlots
from .format import qseg as qsegfmt

__all__ = ["QsegChunk"]


class QsegChunk(DeadSlots):
    def __init__(self, path: str, handle: Handle, first_seq: int) -> None:
        self.path = path
        self.handle = handle
        self.data = handle.map()
        try:
            self.reader = qsegfmt.open_qseg(self.data)
        except qsegfmt.QsegError as exc:  # QSEG-7's typed error, naming the file
            self.close()
            raise type(exc)(exc.rule, f"{path}: {exc.detail}") from None
        if self.reader.first_seq != first_seq:
            seq = self.reader.first_seq
            self.close()
            raise Corrupt(f"{path}: holds seqs from {seq}, its name says {first_seq} (QSEG-10)")
        self.first_seq = first_seq
        self.count = len(self.reader)
        self._init_dead()
        self._sizes = [self.reader.payload_len(i) or 0 for i in range(self.count)]
        self.nbytes = sum(self._sizes)
        for i in range(self.count):
            if not self.reader.has_bundle(i):  # no live record when it was sealed
                self.kill(i)

    # -- SealedChunk -------------------------------------------------------------------------
    def ts(self, i: int) -> int:
        return self.reader.labels(i)[0] or 0

    def size(self, i: int) -> int:
        return self._sizes[i]

    def node(self, i: int) -> str | None:
        return self.reader.labels(i)[2]

    def tag(self, i: int) -> str | None:
        return self.reader.labels(i)[1]

    def tagged(self) -> Iterator[tuple[int, str]]:
        """(slot, tag) of every live record that has a tag (recovery's tag index)."""
        for i in range(self.count):
            tag = self.reader.labels(i)[1]
            if tag is not None and self.is_live(i):
                yield i, tag

    def files(self) -> list[str]:
        return [self.path]

    def record(self, i: int) -> Record:
        ts, tag, node = self.reader.labels(i)
        payload = self.reader.payload(i)
        if payload is None:  # the engine never asks for a slot that was dead when sealed
            raise Corrupt(f"{self.path}: seq {self.first_seq + i} has no record (QSEG-6)")
        return Record(self.first_seq + i, ts or 0, tag, node, payload)

    def bundle(self, i: int) -> RecordBundle | None:
        """Bundle ``i`` as Arrow batches over the mapping (zero-copy, QSEG-11)."""
        return self.reader.bundle(i)

    def close(self) -> None:
        self.reader = None  # type: ignore[assignment]  # drop Arrow's references first
        with contextlib.suppress(BufferError):  # batches handed out still map it: freed with them
            self.data.release()
        self.handle.close()
