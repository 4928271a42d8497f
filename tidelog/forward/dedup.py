"""The receiver's per-sender FSN high-water marks (FWD-19..FWD-21).

De-duplication state lives *in the data itself*, so it is exactly as durable as the records:
every batch of frames from one sender is appended with one ``append_many`` (atomic, consecutive
seqs) whose ``node`` is the sender's client id and whose ``tag`` is ``fsn=<first>..<last>``. The
high-water mark of a client is the largest ``<last>`` among its records; a frame whose FSN is at
or below it is a replay and is acknowledged without being stored again.

Scanning a whole topic at every start would be slow, so the receiver also appends a checkpoint
``{"through_seq": S, "clients": {id: fsn}}`` to a small side topic ``<topic>.fwd-index`` once the
data through seq ``S`` is durable. Start-up reads the last checkpoint and scans only the data
records above ``S``. A checkpoint never claims more than the durable data holds, so it can only
make the marks lower (more duplicates accepted), never higher (a frame dropped as a duplicate it
is not). The checkpoint also keeps, per client, the FSN of the newest frame the receiver refused
with an error frame (``"refused"``): a sender may drop that frame (FWD-9), so a connection that
starts right after it is not an FSN jump (FWD-26).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any, Final

from tidelog.api import Store, Topic
from tidelog.records import Record

__all__ = ["INDEX_SUFFIX", "batch_tag", "parse_tag", "forwarded", "DedupIndex"]

INDEX_SUFFIX: Final = ".fwd-index"
_TAG: Final = re.compile(r"fsn=(\d+)\.\.(\d+)")
_INDEX_CAP: Final = 16
_INDEX_CONFIG: Final[dict[str, Any]] = {
    "cap_records": _INDEX_CAP,
    "discard": "old",
    "durability": "disk",
}


def batch_tag(first_fsn: int, last_fsn: int) -> str:
    return f"fsn={first_fsn}..{last_fsn}"


def parse_tag(tag: str | None) -> tuple[int, int] | None:
    m = _TAG.fullmatch(tag) if tag else None
    return (int(m.group(1)), int(m.group(2))) if m else None


def forwarded(topic: Topic, after: int = 0) -> Iterator[tuple[str, int, Record]]:
    """``(client_id, fsn, record)`` for every forwarded record with seq above ``after``.

    A batch occupies consecutive seqs with one tag; the FSN of a record is counted back from
    the batch's last record (trimming removes the oldest records, never a batch's tail).
    """
    group: list[Record] = []

    def flush() -> Iterator[tuple[str, int, Record]]:
        if not group:
            return
        rng = parse_tag(group[0].tag)
        assert rng is not None and group[0].node is not None
        last_seq = group[-1].seq
        for rec in group:
            yield group[0].node, rng[1] - (last_seq - rec.seq), rec
        group.clear()

    for item in topic.iter(after=after):
        if not isinstance(item, Record) or item.node is None or parse_tag(item.tag) is None:
            yield from flush()
            continue
        if group and (
            item.tag != group[-1].tag
            or item.node != group[-1].node
            or item.seq != group[-1].seq + 1
        ):
            yield from flush()
        group.append(item)
    yield from flush()


class DedupIndex:
    """Client id -> highest stored FSN, recovered from the checkpoint plus a bounded scan."""

    def __init__(self, store: Store, topic: Topic) -> None:
        self.topic = topic
        self.index = store.topic(topic.name + INDEX_SUFFIX, **_INDEX_CONFIG)
        self.marks: dict[str, int] = {}
        # Clients whose mark equals the topic's producer mark (their last append in this
        # process was applied). Nobody is exact after a start: marks recovered from the
        # checkpoint and the scan are only lower bounds (records may have been trimmed).
        self._exact: set[str] = set()
        self.through_seq = 0
        self.refused: dict[str, int] = {}  # client -> newest FSN refused with an error frame
        # what the newest checkpoint written (or loaded) holds
        self._saved_marks: dict[str, int] = {}
        self._saved_refused: dict[str, int] = {}
        self.scanned = 0  # records examined at load (observability; tests assert on it)
        self._load()

    def _load(self) -> None:
        head = self.index.state().head_seq
        if head:
            for item in self.index.read(after=max(0, head - _INDEX_CAP)):
                if isinstance(item, Record):
                    try:
                        doc = json.loads(item.payload)
                        through = int(doc["through_seq"])
                        marks = {str(k): int(v) for k, v in doc["clients"].items()}
                        refused = {str(k): int(v) for k, v in doc.get("refused", {}).items()}
                    except (ValueError, KeyError, TypeError, AttributeError):
                        continue  # a damaged checkpoint: keep the previous one
                    self.through_seq, self.marks, self.refused = through, marks, refused
                    self._saved_marks, self._saved_refused = dict(marks), dict(refused)
        for client, fsn, _ in forwarded(self.topic, after=self.through_seq):
            self.scanned += 1
            if fsn > self.marks.get(client, -1):
                self.marks[client] = fsn

    def mark(self, client: str) -> int:
        """A lower bound of the client's highest stored FSN (-1: nothing known)."""
        return self.marks.get(client, -1)

    def next_allowed(self, client: str) -> int:
        """The highest ``X-Tidelog-Fsn-At-Zero`` a connection of a known client may start at
        (FWD-26): right after its mark, or after the refused frame that follows the mark."""
        mark = self.mark(client)
        return mark + 2 if self.refused.get(client) == mark + 1 else mark + 1

    def note_refused(self, client: str, fsn: int) -> None:
        """The receiver answered the frame with FSN ``fsn`` with an error frame (FWD-21)."""
        if fsn > self.refused.get(client, -1):
            self.refused[client] = fsn

    def is_exact(self, client: str) -> bool:
        return client in self._exact

    def note(self, client: str, last_fsn: int, *, applied: bool) -> None:
        """After an append of frames up to ``last_fsn``: applied, the topic's mark is now
        exactly ``last_fsn + 1``; refused as already applied, it is at least that."""
        self.marks[client] = max(self.mark(client), last_fsn)
        if applied:
            self._exact.add(client)
        else:
            self._exact.discard(client)

    def refused_unsaved(self, refused: dict[str, int]) -> bool:
        """``refused`` (a copy of ``self.refused``) differs from the newest checkpoint's."""
        return refused != self._saved_refused

    def checkpoint(
        self, through_seq: int, marks: dict[str, int], refused: dict[str, int] | None = None
    ) -> None:
        """Record marks valid for data through ``through_seq``; call only once that data is
        durable (``Store.flush`` returned). ``refused`` is a copy of ``self.refused`` taken with
        the marks: when it changed, it is recorded even with nothing new durable, next to the
        marks already recorded (never newer marks, whose data may not be durable)."""
        refused = self._saved_refused if refused is None else refused
        if through_seq <= self.through_seq:
            if not self.refused_unsaved(refused):
                return
            through_seq, marks = self.through_seq, self._saved_marks
        doc = {"through_seq": through_seq, "clients": marks, "refused": refused}
        self.index.append(json.dumps(doc, sort_keys=True, separators=(",", ":")).encode())
        self.through_seq = through_seq
        self._saved_marks, self._saved_refused = dict(marks), dict(refused)
