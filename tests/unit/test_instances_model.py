"""The pure parts of the instances model (tidelog.model.instances) and the backend's heap
merge against the model's literal one (spec/INSTANCES.md INST-7..INST-9)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tidelog import FakeClock
from tidelog.backend import StoreOptions
from tidelog.backends.instances.merge import merge
from tidelog.config import TopicConfig
from tidelog.errors import BadOption, Locked
from tidelog.model.instances import (
    Entry,
    InstancesModel,
    cursor_text,
    merge_key,
    parse_cursor,
    share_config,
    share_options,
)
from tidelog.records import Item, Record, Tombstone


@st.composite
def streams(draw: st.DrawFn) -> list[list[Item]]:
    """Per instance: seqs rising, ts non-decreasing (TOP-5), tombstones between records."""
    out: list[list[Item]] = []
    for _ in range(draw(st.integers(1, 4))):
        items: list[Item] = []
        seq, ts = 0, draw(st.integers(0, 3))
        for _ in range(draw(st.integers(0, 6))):
            if draw(st.integers(0, 4)) == 0:
                width = draw(st.integers(1, 3))
                items.append(Tombstone(seq + 1, seq + width))
                seq += width
            else:
                seq += 1
                ts += draw(st.integers(0, 2))
                items.append(Record(seq, ts, None, None, b""))
        out.append(items)
    return out


def _literal(streams: list[list[Item]], limit: int) -> list[Entry]:
    """INST-7 word for word: take the smallest head key until limit or empty."""
    heads = [list(s) for s in streams]
    out: list[Entry] = []
    while len(out) < limit and any(heads):
        _, i = min((merge_key(i, s[0]), i) for i, s in enumerate(heads) if s)
        out.append(Entry(i, heads[i].pop(0)))
    return out


@given(streams(), st.integers(1, 30))
def test_INST_7_the_heap_merge_is_the_rules_merge(data: list[list[Item]], limit: int) -> None:
    """INST-7: the backend's heap merge takes exactly what the rule takes, in its order, and
    INST-8's positions end at the last item taken of each instance."""
    positions = [0] * len(data)
    got = merge(data, positions, limit)
    assert got == _literal(data, limit)
    for i in range(len(data)):
        mine = [e.item for e in got if e.instance == i]
        last = mine[-1] if mine else None
        want = 0 if last is None else (last.gap_to if isinstance(last, Tombstone) else last.seq)
        assert positions[i] == want
        assert mine == data[i][: len(mine)]  # one instance's items keep their order


@given(st.lists(st.integers(0, 2**63), min_size=1, max_size=8))
def test_INST_8_cursor_text_round_trips(positions: list[int]) -> None:
    """INST-8: the text is the positions in decimal joined by '.', and parses back."""
    text = cursor_text(positions)
    assert parse_cursor(text, len(positions)) == positions
    assert parse_cursor(None, 3) == parse_cursor("", 3) == [0, 0, 0]


def test_INST_9_shares_are_floor_divisions() -> None:
    """INST-9: cap // N per instance; below N is bad_option; max_bytes likewise."""
    cfg = share_config("t", TopicConfig(cap_records=10, cap_bytes=1001), 3)
    assert (cfg.cap_records, cfg.cap_bytes) == (3, 333)
    assert share_config("t", TopicConfig(), 3) == TopicConfig()
    with pytest.raises(BadOption, match="cap_bytes=2"):
        share_config("t", TopicConfig(cap_bytes=2), 3)
    assert share_options(StoreOptions(max_bytes=100), 3).max_bytes == 33
    with pytest.raises(BadOption):
        share_options(StoreOptions(max_bytes=2), 3)


def test_INST_3_the_model_hands_out_the_lowest_free_slot() -> None:
    """INST-3 in the model: slots in order, locked when all are held, freed ones reused."""
    clock = FakeClock()
    m = InstancesModel(2, clock)
    assert [m.take(), m.take()] == [0, 1]
    with pytest.raises(Locked):
        m.take()
    m.topic(0, "t", {})
    m.append(0, "t", [b"x"])
    m.release(0, clock)
    assert m.take() == 0
    assert [r.payload for _, r in m.records("t")] == [b"x"]
