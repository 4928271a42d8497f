"""The crash checker's own rules (tidelog.conformance.crashcheck): the states it allows after a
power loss are the ones the spec allows, no fewer and no more."""

from __future__ import annotations

import dataclasses

from tidelog.conformance.crashcheck import TopicView, _matches


def test_DUR_5_ephemeral_state_equal_to_the_models_is_allowed() -> None:
    """DUR-5: a recovered ephemeral topic equal to the model's allowed state matches it, also
    when its floor is not head + 1 (nothing live was lost: the seqs below head were trimmed
    before the crash). Found by the conformance crash level (seed 88: the checker required
    floor = head + 1 and refused the model's own state). A lost prefix below the floor still
    matches; a surviving record, a regressed head or a hole does not."""
    want = TopicView(head=2, earliest=3, floor=1, count=0, nbytes=0, records=(),
                     tombstones=(), subs=(("s1", 2),))
    assert _matches(want, want, "ephemeral")
    lost = dataclasses.replace(want, head=4, floor=5, earliest=5, tombstones=((1, 4),))
    assert _matches(lost, want, "ephemeral")  # DUR-5: head not below, all lost below floor
    assert not _matches(dataclasses.replace(want, head=1, earliest=2), want, "ephemeral")
    assert not _matches(dataclasses.replace(want, head=3, earliest=4), want, "ephemeral")
    kept = dataclasses.replace(want, count=1, nbytes=1, records=(object(),))
    assert not _matches(kept, kept, "ephemeral")  # DUR-5: no records after a restart
