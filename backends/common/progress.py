"""Durable-subscriber progress of one topic: hwm, out-of-order outcomes, gaps, trim (spec SUB).

A seq is *resolved* for a subscriber iff it is at/below the hwm, has an outcome, or is not live
(voluntarily removed seqs are silently resolved; involuntarily removed ones also get a gap, see
``note_involuntary``). So no per-seq "dropped" outcome has to be stored for evicted records.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from .index import TopicLog

__all__ = ["SubState", "Progress"]


@dataclass
class SubState:
    base: int
    hwm: int
    cursor: int
    outcomes: dict[int, str] = field(default_factory=dict)
    gap: tuple[int, int] | None = None
    flushed_hwm: int = 0


class Progress:
    """All subscribers of one topic."""

    def __init__(self) -> None:
        self.subs: dict[str, SubState] = {}
        self._trim_mark: tuple[int, int] = (-1, -1)  # (lo, done_through) of the last trim

    def resolved(self, log: TopicLog, s: SubState, seq: int) -> bool:
        return seq <= s.hwm or seq in s.outcomes or not log.is_live(seq)

    def add(self, name: str, base: int) -> SubState:
        """SUB-1: a new subscriber starting at ``base`` (its hwm and cursor start there too)."""
        s = self.subs[name] = SubState(base=base, hwm=base, cursor=base, flushed_hwm=base)
        return s

    def note_involuntary(self, log: TopicLog, seqs: Sequence[int]) -> None:
        """SUB-7: before ``seqs`` (live, ascending) are evicted or lost, extend the gap of every
        subscriber for which some of them were unresolved."""
        if not seqs:
            return
        for s in self.subs.values():
            lo = next((q for q in seqs if q > s.hwm and q not in s.outcomes), None)
            if lo is None:
                continue
            hi = next(q for q in reversed(seqs) if q > s.hwm and q not in s.outcomes)
            s.gap = (lo, hi) if s.gap is None else (min(s.gap[0], lo), max(s.gap[1], hi))

    def settle(self, log: TopicLog, holds: Sequence[int] = ()) -> list[int]:
        """Advance every hwm (SUB-2); return the seqs that ack-trimming must remove (SUB-5),
        none above a hold (RTR-7: the cursor of a router out of the topic)."""
        head, earliest = log.head, log.earliest
        for s in self.subs.values():
            h = s.hwm
            out = s.outcomes
            while h < head:
                nxt = h + 1
                if nxt < earliest:  # everything below earliest is not live: resolved
                    h = earliest - 1
                elif nxt in out or not log.is_live(nxt):
                    h = nxt
                else:
                    break
            if h != s.hwm:
                s.hwm = h
                if out:
                    for q in [q for q in out if q <= h]:
                        del out[q]
        return self._trim_targets(log, holds)

    def _trim_targets(self, log: TopicLog, holds: Sequence[int]) -> list[int]:
        if log.config.trim != "acked" or not self.subs:
            return []
        lo = min(s.base for s in self.subs.values())
        hi = min(s.hwm for s in self.subs.values())
        if holds:
            hi = min(hi, *holds)
        if lo >= hi:
            return []
        mark_lo, done = self._trim_mark
        start = max(lo, done) + 1 if mark_lo == lo else lo + 1
        self._trim_mark = (lo, max(hi, done if mark_lo == lo else hi))
        return log.live_between(start, hi)

    def unresolved(self, log: TopicLog, seqs: Sequence[int]) -> tuple[str, int] | None:
        """SUB-6: the first (subscriber, seq) among ``seqs`` someone has not resolved."""
        for name in sorted(self.subs):
            s = self.subs[name]
            for q in seqs:
                if q > s.hwm and q not in s.outcomes:
                    return name, q
        return None
