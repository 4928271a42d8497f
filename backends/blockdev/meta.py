"""The metadata slot's JSON body (BDEV-4): what the ring cannot say about itself.

Pages carry records; the slot carries the topic binding and config, subscriber progress and the
*durable facts* (floor, voluntarily removed ranges, head) as of the last moment every appended
record had been sealed into a page (BDEV-14). Facts from such a moment describe a state the
records on the device reach, so a recovery that applies them never mixes a later state into an
earlier prefix of records (DUR-4, DUR-6).

The body must fit 1992 bytes. Subscribers are capped (``MAX_SUBSCRIBERS``) so the progress of
every subscriber always fits; outcomes acked out of order and trimmed ranges are dropped when
they do not fit, which only causes redelivery (at-least-once: ``exact_progress=False``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from tidelog.errors import StorageError

from .format import SLOT_BODY_MAX, dumps_body

if TYPE_CHECKING:
    from tidelog.backends.common.engine import EngineTopic

__all__ = [
    "MAX_SUBSCRIBERS",
    "IO_RESERVE",
    "empty_facts",
    "facts_of",
    "build_body",
    "dead_ranges",
    "gap_json",
    "gaps_of",
]

#: Subscribers per ring: the worst case (64-character names, 20-digit seqs, a 200-character
#: topic name, every config field set) still fits the slot with room for some outcomes.
MAX_SUBSCRIBERS = 6

#: Room kept in every body for the write counters the store adds (BDEV-19): seven u64s.
IO_RESERVE = len(dumps_body({"io": [2**64 - 1] * 7})) - 1


def empty_facts() -> dict[str, Any]:
    return {"head": 0, "floor": 1, "last_ts": None, "trimmed": []}


def dead_ranges(t: EngineTopic) -> list[list[int]]:
    """Seqs at or above the floor that are neither live nor lost, as [lo, hi] runs. With no
    deletes on this backend they were all trimmed (voluntary): involuntary removal always moves
    the floor, and the seqs of LOSS pages (BDEV-25) are loss ranges, never trims (recovery
    reads a trim silently, TMB-4)."""
    log = t.log
    out: list[list[int]] = []
    nxt = log.evict_floor
    for q in [*log.live_between(log.evict_floor, log.head), log.head + 1]:
        lo = nxt
        nxt = q + 1
        if lo == q:
            continue
        for a, z in log.losses:  # ascending, disjoint
            if lo <= z and a < q:
                if a > lo:
                    out.append([lo, a - 1])
                lo = z + 1
        if lo < q:
            out.append([lo, q - 1])
    return out


def facts_of(t: EngineTopic) -> dict[str, Any]:
    """The topic's durable facts right now (call only when every record is sealed)."""
    log = t.log
    return {
        "head": log.head,
        "floor": log.evict_floor,
        "last_ts": log.last_ts,
        "trimmed": dead_ranges(t),
    }


def gap_json(gaps: Sequence[tuple[int, int]]) -> Any:
    """A subscriber's gaps as the slot's ``"gap"`` (BDEV-29): null, ``[lo, hi]`` for one (as
    every earlier version wrote), ``[[lo, hi], ...]`` for more (an earlier reader refuses the
    body rather than read one gap)."""
    if not gaps:
        return None
    if len(gaps) == 1:
        return [gaps[0][0], gaps[0][1]]
    return [[lo, hi] for lo, hi in gaps]


def gaps_of(value: Any) -> list[tuple[int, int]]:
    """The gaps a slot's ``"gap"`` holds (BDEV-29); ValueError if it is none of its forms."""
    if value is None:
        return []
    if isinstance(value, list) and len(value) == 2 and all(map(_is_int, value)):
        pairs = [value]  # one gap, as every version wrote it
    elif isinstance(value, list) and len(value) >= 2 and all(isinstance(p, list) for p in value):
        pairs = value
    else:
        raise ValueError(f"gap is {value!r}: not [lo, hi], nor a list of two or more of them")
    out: list[tuple[int, int]] = []
    for pair in pairs:
        if len(pair) != 2 or not all(map(_is_int, pair)):
            raise ValueError(f"gap {pair!r} is not [lo, hi]")
        lo, hi = pair
        if not 1 <= lo <= hi or (out and lo <= out[-1][1]):
            raise ValueError(f"gaps {value!r} are not disjoint ascending ranges of seqs")
        out.append((lo, hi))
    return out


def _is_int(v: object) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _subs(t: EngineTopic, without: set[str], coarse: bool) -> dict[str, Any]:
    """Every subscriber's progress; the out-of-order outcomes of those in ``without`` left out;
    ``coarse``: each subscriber's gaps merged into one (BDEV-29's last resort)."""
    out: dict[str, Any] = {}
    for name, s in sorted(t.progress.subs.items()):
        gaps = [(s.gaps[0][0], s.gaps[-1][1])] if coarse and s.gaps else s.gaps
        entry: dict[str, Any] = {"base": s.base, "hwm": s.hwm, "gap": gap_json(gaps)}
        if name not in without:
            entry["acked"] = sorted(q for q, o in s.outcomes.items() if o == "acked")
            entry["rejected"] = sorted(q for q, o in s.outcomes.items() if o == "rejected")
        out[name] = entry
    return out


def build_body(
    bound: str,
    incarnations: int,
    t: EngineTopic | None,
    facts: dict[str, Any],
    lap: int,
    next_index: int,
) -> dict[str, Any]:
    """The slot body, degraded until it fits (BDEV-4): the out-of-order outcomes of the
    subscribers holding the most are left out first, one subscriber at a time, then the trimmed
    ranges, then each subscriber's gaps are merged into one (BDEV-29) (all only cost redelivery
    or rereading after a restart, never a loss). ``lap`` and
    ``next_index`` are the ring position of the next page: every page before it was queued
    before this slot, so a valid slot proves them durable (BDEV-22)."""
    base: dict[str, Any] = {
        "topic": bound,
        "incarnations": incarnations,
        "tid": t.tid if t is not None else 0,
        "config": t.config.to_dict() if t is not None else None,
        "lap": lap,
        "next": next_index,
    }
    subs = t.progress.subs if t is not None else {}
    by_size = sorted(subs, key=lambda n: (-len(subs[n].outcomes), n))
    steps = [(set(by_size[:k]), True, False) for k in range(len(by_size) + 1)]
    steps += [(set(by_size), False, False), (set(by_size), False, True)]
    for without, trimmed, coarse in steps:
        body = dict(base)
        body["state"] = facts if trimmed else {**facts, "trimmed": []}
        body["subs"] = _subs(t, without, coarse) if t is not None else {}
        if len(dumps_body(body)) + IO_RESERVE <= SLOT_BODY_MAX:
            return body
    raise StorageError(f"ring metadata does not fit its {SLOT_BODY_MAX}-byte slot")
