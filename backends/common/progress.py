"""Durable-subscriber progress of one topic: hwm, out-of-order outcomes, gaps, trim (spec SUB).

A seq is *resolved* for a subscriber iff it is at/below the hwm, has an outcome, or is not live
(voluntarily removed seqs are silently resolved; involuntarily removed ones also get a gap, see
``note_involuntary``). So no per-seq "dropped" outcome has to be stored for evicted records.
"""

from __future__ import annotations

from collections.abc import Callable, Container, Sequence
from dataclasses import dataclass, field

from tidelog.model.rules import insert_gap

from .index import TopicLog

__all__ = ["SubState", "Progress", "add_gap", "live_between", "offline_live_between"]

Gap = tuple[int, int]


@dataclass
class SubState:
    base: int
    hwm: int
    cursor: int
    outcomes: dict[int, str] = field(default_factory=dict)
    gaps: list[Gap] = field(default_factory=list)  # SUB-7: disjoint, ascending
    flushed_hwm: int = 0


def add_gap(s: SubState, lo: int, hi: int, live_between: Callable[[int, int], bool]) -> None:
    """SUB-7: the range ``lo..hi`` enters ``s.gaps``; ``live_between(a, b)`` says whether a live
    seq lies strictly between ``a`` and ``b`` once the removal is done."""
    s.gaps = insert_gap(s.gaps, lo, hi, live_between)


def live_between(log: TopicLog, skip: Container[int] = ()) -> Callable[[int, int], bool]:
    """``add_gap``'s question answered by the log: a live seq strictly between ``a`` and ``b``
    that is not in ``skip`` (seqs being removed by the same event)."""
    return lambda a, b: log.any_live(a + 1, b - 1, skip)


def offline_live_between(floor: int, dead: Sequence[Gap]) -> Callable[[int, int], bool]:
    """SUB-7 for repair, which does not replay the log: a seq counts as live unless it is below
    ``floor`` or inside one of the ``dead`` ranges (any order, may overlap). Counting a removed
    seq as live only keeps two gaps apart (two tombstones where one would do), never hides a
    record behind a tombstone."""
    ranges = sorted(dead)

    def live_between(a: int, b: int) -> bool:
        q = max(a + 1, floor)  # the lowest candidate
        for lo, hi in ranges:
            if lo > q:
                break
            q = max(q, hi + 1)
        return q < b

    return live_between


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
        """SUB-7: before ``seqs`` (live, ascending) are evicted or lost, give every subscriber
        for which some of them were unresolved a gap over them (the seqs count as removed)."""
        if not seqs or not self.subs:
            return
        gone: set[int] = set()

        def between(a: int, b: int) -> bool:  # asked only when the subscriber has gaps
            if not gone:
                gone.update(seqs)
            return log.any_live(a + 1, b - 1, gone)

        for s in self.subs.values():
            lo = next((q for q in seqs if q > s.hwm and q not in s.outcomes), None)
            if lo is None:
                continue
            hi = next(q for q in reversed(seqs) if q > s.hwm and q not in s.outcomes)
            add_gap(s, lo, hi, between)

    def note_loss(self, log: TopicLog, lo: int, hi: int) -> None:
        """SUB-7: seqs ``lo..hi`` above the head that never became live (a crash lost them,
        DUR-3; or a router's loss range, RTR-5) are a gap for every subscriber whose hwm is
        below ``hi`` (they were unresolved for it)."""
        between = live_between(log)
        for s in self.subs.values():
            if s.hwm < hi:
                add_gap(s, max(lo, s.hwm + 1), hi, between)

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
