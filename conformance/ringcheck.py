"""The ``ring`` level's pure part: head detection from page numbers (spec RING-1..RING-5).

Ring images are generated the way a device gets them: ``laps`` full passes, then ``k`` pages of
the next lap (RING-1 numbering), optionally the last write torn (RING-4), optionally a fresh ring
(RING-5) or random numbers (corruption). The implementation's answer to ``ring_head`` must equal
the reference definition, ``tidelog.model.ring.find_head_linear`` (same head and lap parity, or
both ``corrupt``).
"""

from __future__ import annotations

from typing import Any

from hypothesis import assume
from hypothesis import strategies as st

from tidelog.errors import Corrupt
from tidelog.model.ring import find_head_linear, page_seq

from .machine import fail

__all__ = ["ring_images", "check_ring_head"]


@st.composite
def ring_images(draw: Any) -> tuple[int, list[int | None], str]:
    """(pages, page numbers with None for invalid pages, description)."""
    n = draw(st.sampled_from([2, 4, 6, 8, 10, 16]))
    kind = draw(st.sampled_from(["written", "written", "written", "torn", "fresh", "random"]))
    if kind == "fresh":
        return n, [None] * n, "fresh ring"
    if kind == "random":
        page = st.one_of(st.none(), st.integers(1, n))
        drawn: list[int | None] = draw(st.lists(page, min_size=n, max_size=n))
        # RING-3 defines the head only for images a ring can hold: pages are written in order,
        # each synced before the next, so the current lap's pages are a prefix (a valid page
        # after an invalid one in the same lap cannot happen; RING-4 covers page 0).
        assume(_prefix_shaped(n, drawn))
        return n, drawn, "random page numbers"
    laps = draw(st.integers(0, 4))
    k = draw(st.integers(1 if laps == 0 else 0, n - 1 if laps else n))
    seqs: list[int | None] = [
        page_seq(laps, i, n) if i < k else (page_seq(laps - 1, i, n) if laps else None)
        for i in range(n)
    ]
    what = f"{laps} full laps then {k} pages"
    if kind == "torn" and k:
        seqs[k - 1] = None  # the last write never completed (RING-4)
        what += ", the last write torn"
    return n, seqs, what


def _prefix_shaped(n: int, seqs: list[int | None]) -> bool:
    start = 0 if seqs[0] is not None else 1
    value = seqs[start]
    if value is None:
        return True  # a fresh ring (RING-5)
    parities = [p for p in (0, 1) if value == page_seq(p, start, n)]
    if not parities:
        return True  # page numbered by neither formula: corruption (RING-4), defined
    current = [seqs[i] == page_seq(parities[0], i, n) for i in range(start, n)]
    return current == sorted(current, reverse=True)  # every current page before any other


def _reference(n: int, seqs: list[int | None]) -> tuple[int, int] | str | None:
    try:
        head = find_head_linear(n, lambda i: seqs[i])
    except Corrupt:
        return "corrupt"
    return None if head is None else (head.index, head.parity)


def check_ring_head(
    answer: Any, n: int, seqs: list[int | None], what: str
) -> None:
    """Compare ``answer(n, seqs)`` (the implementation) with the reference definition."""
    want = _reference(n, seqs)
    try:
        got: tuple[int, int] | str | None = answer(n, seqs)
    except Corrupt:
        got = "corrupt"
    if got != want:
        fail(
            f"RING-3/RING-4: ring of {n} pages ({what}) reading {seqs}: head {got}, "
            f"expected {want} (index, lap parity)"
        )
