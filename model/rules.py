"""Pure arithmetic rules of the topic log, with contracts CrossHair checks (``nox -s crosshair``).

Each function is one rule of spec/SPEC.md, small enough to verify symbolically. The model
(``tidelog.model.log``) is built from them; backends are tested against the model.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

__all__ = [
    "floors_ok",
    "clamp_ts",
    "eviction_count",
    "read_tombstone",
    "advance_hwm",
    "trim_bounds",
    "held_trim_bounds",
    "insert_gap",
]


def floors_ok(evict_floor: int, earliest_seq: int, head_seq: int) -> bool:
    """TOP-2: ``1 <= evict_floor <= earliest_seq <= head_seq + 1``.

    post: __return__ == (1 <= evict_floor <= earliest_seq <= head_seq + 1)
    """
    return 1 <= evict_floor <= earliest_seq <= head_seq + 1


def clamp_ts(now: int, last_ts: int | None) -> int:
    """TOP-5: a record's ts is the clock, never below the previous record's ts.

    post: __return__ >= now
    post: last_ts is None or __return__ >= last_ts
    post: __return__ == now or __return__ == last_ts
    """
    if last_ts is not None and last_ts > now:
        return last_ts
    return now


def _fits(
    kept: list[int], n: int, nbytes: int, cap_records: int | None, cap_bytes: int | None
) -> bool:
    """Whether keeping ``kept`` and adding n records / nbytes respects both caps."""
    return (cap_records is None or len(kept) + n <= cap_records) and (
        cap_bytes is None or sum(kept) + nbytes <= cap_bytes
    )


def eviction_count(
    sizes: list[int], n: int, nbytes: int, cap_records: int | None, cap_bytes: int | None
) -> int:
    """RET-1, RET-2: how many of the oldest live records (``sizes``, oldest first) an append of
    ``n`` records / ``nbytes`` bytes must evict so the caps hold afterwards; as few as possible.

    pre: all(s >= 0 for s in sizes)
    pre: n >= 0 and nbytes >= 0
    pre: cap_records is None or n <= cap_records
    pre: cap_bytes is None or nbytes <= cap_bytes
    post: 0 <= __return__ <= len(sizes)
    post: cap_records is None or len(sizes) - __return__ + n <= cap_records
    post: cap_bytes is None or sum(sizes[__return__:]) + nbytes <= cap_bytes
    post: __return__ == 0 or not _fits(sizes[__return__ - 1:], n, nbytes, cap_records, cap_bytes)
    """
    count = len(sizes)
    total = sum(sizes)
    evict = 0
    while evict < count and (
        (cap_records is not None and count - evict + n > cap_records)
        or (cap_bytes is not None and total + nbytes > cap_bytes)
    ):
        total -= sizes[evict]
        evict += 1
    return evict


def read_tombstone(after: int, evict_floor: int) -> tuple[int, int] | None:
    """TMB-1: the prefix tombstone a read with cursor ``after`` must start with, if any.

    pre: after >= 0 and evict_floor >= 1
    post: (__return__ is None) == (after + 1 >= evict_floor)
    post: __return__ is None or __return__ == (after + 1, evict_floor - 1)
    """
    if after + 1 < evict_floor:
        return (after + 1, evict_floor - 1)
    return None


def advance_hwm(hwm: int, head: int, resolved: set[int]) -> int:
    """SUB-2: advance across the contiguous run of resolved seqs above ``hwm``.

    pre: 0 <= hwm <= head
    post: hwm <= __return__ <= head
    post: all(q in resolved for q in range(hwm + 1, __return__ + 1))
    post: __return__ == head or (__return__ + 1) not in resolved
    """
    h = hwm
    while h < head and (h + 1) in resolved:
        h += 1
    return h


def trim_bounds(bases: list[int], hwms: list[int]) -> tuple[int, int] | None:
    """SUB-5: the seq range ``(lo, hi]`` that ack-trimming removes, or None.

    Every subscriber is done with a seq at or below ``min(hwm)``; at least one consumed it only
    if it lies above ``min(base)``.

    pre: len(bases) == len(hwms)
    pre: all(b <= h for b, h in zip(bases, hwms))
    post: __return__ is None or __return__[0] < __return__[1]
    post: __return__ is None or all(__return__[1] <= h for h in hwms)
    post: (__return__ is None) == (not bases or min(bases) >= min(hwms))
    """
    if not bases:
        return None
    lo, hi = min(bases), min(hwms)
    if lo >= hi:
        return None
    return (lo, hi)


def held_trim_bounds(
    bounds: tuple[int, int] | None, holds: Sequence[int]
) -> tuple[int, int] | None:
    """SUB-5 with RTR-7: ack-trimming's range ``(lo, hi]`` cut at every router's cursor.

    pre: bounds is None or bounds[0] < bounds[1]
    post: __return__ is None or __return__[0] < __return__[1]
    post: __return__ is None or all(__return__[1] <= h for h in holds)
    post: __return__ is None or (bounds is not None and __return__[1] <= bounds[1])
    """
    if bounds is None:
        return None
    lo, hi = bounds[0], min([bounds[1], *holds])
    if lo >= hi:
        return None
    return (lo, hi)


def insert_gap(
    gaps: Sequence[tuple[int, int]], lo: int, hi: int, live_between: Callable[[int, int], bool]
) -> list[tuple[int, int]]:
    """SUB-7: a subscriber's pending gaps (disjoint, ascending) with the new range ``[lo, hi]``
    entered: it absorbs every gap it overlaps, then merges with the gap just below and the gap
    just above it unless ``live_between(a, b)`` (some live seq ``q`` with ``a < q < b``).

    pre: 1 <= lo <= hi
    pre: all(1 <= a <= b for a, b in gaps)
    pre: all(gaps[i][1] < gaps[i + 1][0] for i in range(len(gaps) - 1))
    post: all(1 <= a <= b for a, b in __return__)
    post: all(__return__[i][1] < __return__[i + 1][0] for i in range(len(__return__) - 1))
    post: any(a <= lo and hi <= b for a, b in __return__)
    post: all(any(c <= a and b <= d for c, d in __return__) for a, b in gaps)
    post: all(g in gaps or (g[0] <= lo and hi <= g[1]) for g in __return__)
    post: len(__return__) <= len(gaps) + 1
    """
    below = [g for g in gaps if g[1] < lo]
    above = [g for g in gaps if g[0] > hi]
    over = [g for g in gaps if lo <= g[1] and g[0] <= hi]
    lo, hi = min([lo, *(g[0] for g in over)]), max([hi, *(g[1] for g in over)])
    if below and not live_between(below[-1][1], lo):
        lo = below.pop()[0]
    if above and not live_between(hi, above[0][0]):
        hi = above.pop(0)[1]
    return [*below, (lo, hi), *above]
