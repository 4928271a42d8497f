"""Checks of spec invariants on a store's *observable* behaviour, with no model needed.

Each function takes public-API objects, raises AssertionError naming the spec id on violation,
and is usable against any backend (the stateful suites call them after every step).
"""

from __future__ import annotations

from tidelog.api import Topic
from tidelog.records import Item, Record, Tombstone, TopicState

__all__ = ["check_topic", "full_read"]


def full_read(topic: Topic, after: int = 0, batch: int = 1_000_000) -> list[Item]:
    return list(topic.read(after=after, limit=batch))


def check_topic(
    topic: Topic, state: TopicState | None = None, items: list[Item] | None = None
) -> None:
    """TOP-2, TOP-3, TMB-1, TMB-5, TOP-7, RET-1 on one topic's current observable state
    (``state`` and ``items``, a full read, when the caller already has them)."""
    st = state if state is not None else topic.state()
    assert 1 <= st.evict_floor <= st.earliest_seq <= st.head_seq + 1, f"TOP-2 violated: {st}"
    items = items if items is not None else full_read(topic)
    records = [i for i in items if isinstance(i, Record)]
    tombs = [i for i in items if isinstance(i, Tombstone)]
    assert len(records) == st.count, f"TOP-3: count {st.count} but {len(records)} live records"
    assert sum(len(r.payload) for r in records) == st.bytes, "TOP-3: bytes mismatch"
    expected_earliest = records[0].seq if records else st.head_seq + 1
    assert st.earliest_seq == expected_earliest, (
        f"TOP-3: earliest_seq {st.earliest_seq}, first live record {expected_earliest}"
    )
    if st.evict_floor > 1:
        assert items and items[0] == Tombstone(1, st.evict_floor - 1), (
            f"TMB-1: read(after=0) must start with Tombstone(1, {st.evict_floor - 1}), "
            f"got {items[:1]}"
        )
    last = 0
    for item in items:
        lo = item.gap_from if isinstance(item, Tombstone) else item.seq
        hi = item.gap_to if isinstance(item, Tombstone) else item.seq
        assert lo > last and hi >= lo, f"TOP-7/TMB-5: items out of order at {item}"
        last = hi
    assert last <= st.head_seq, "TOP-7: item beyond head_seq"
    for t in tombs:
        assert t.gap_from >= 1 and t.gap_to <= st.head_seq, f"TMB: bad tombstone {t}"
    ts = [r.ts for r in records]
    assert ts == sorted(ts), "TOP-5: ts decreases along seq"
    cfg = topic.config
    assert cfg.cap_records is None or st.count <= cfg.cap_records, "RET-1: over cap_records"
    assert cfg.cap_bytes is None or st.bytes <= cfg.cap_bytes, "RET-1: over cap_bytes"
