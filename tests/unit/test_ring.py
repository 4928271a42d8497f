"""Flash ring numbering and head detection (spec RING-1..RING-6).

A simulator writes laps into a list of page numbers (``None``: never written, zeroed or torn) and
the tests compare the binary search, the linear reference scan and the simulator's own truth.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tidelog.errors import BadArgument, Corrupt
from tidelog.model.ring import (
    MAX_PAGES,
    RingHead,
    find_head,
    find_head_linear,
    page_seq,
    retained_pages,
    usable_page_count,
)

Image = list[int | None]
EVEN_NS = range(2, 65, 2)
LAPS = range(6)


# --- simulator ----------------------------------------------------------------------------------


def write_image(n: int, lap: int, k: int) -> Image:
    """Pages after ``lap`` full laps and ``k`` pages of the next one (``k`` in 1..n)."""
    current = [page_seq(lap, i, n) for i in range(k)]
    if lap == 0:
        return [*current, *([None] * (n - k))]
    return [*current, *(page_seq(lap - 1, i, n) for i in range(k, n))]


def true_head(n: int, lap: int, k: int) -> RingHead:
    return RingHead(k - 1, lap % 2)


def true_order(n: int, lap: int, k: int) -> list[int]:
    """Oldest to newest: the previous lap's surviving pages, then this lap's."""
    older = [] if lap == 0 else list(range(k, n))
    return older + list(range(k))


def torn_image(n: int, lap: int, k: int) -> Image:
    """The same write, but the last page written was interrupted (RING-4)."""
    pages = write_image(n, lap, k)
    pages[k - 1] = None
    return pages


def torn_truth(n: int, lap: int, k: int) -> tuple[RingHead | None, list[int]]:
    """Head and retained order once the last page written is torn."""
    if k >= 2:
        older = [] if lap == 0 else list(range(k, n))
        return RingHead(k - 2, lap % 2), older + list(range(k - 1))
    if lap == 0:
        return None, []
    # Page 0 of lap L torn: lap L-1 was complete and its page 0 is gone.
    return RingHead(n - 1, (lap - 1) % 2), list(range(1, n))


def reader(pages: Image) -> Callable[[int], int | None]:
    def read_seq(index: int) -> int | None:
        assert 0 <= index < len(pages), f"read outside the ring: {index}"
        return pages[index]

    return read_seq


class CountingReader:
    def __init__(self, pages: Image) -> None:
        self.pages = pages
        self.calls = 0

    def __call__(self, index: int) -> int | None:
        self.calls += 1
        return self.pages[index]


def check_image(n: int, pages: Image, head: RingHead | None, order: list[int]) -> None:
    read = reader(pages)
    assert find_head(n, read) == head
    assert find_head_linear(n, read) == head
    assert retained_pages(n, head, read) == order


# --- RING-1 -------------------------------------------------------------------------------------


def test_ring_1_numbering_counts_up_then_down() -> None:
    """RING-1: even laps number pages 1..n, odd laps n..1."""
    assert [page_seq(0, i, 4) for i in range(4)] == [1, 2, 3, 4]
    assert [page_seq(1, i, 4) for i in range(4)] == [4, 3, 2, 1]
    assert [page_seq(2, i, 4) for i in range(4)] == [1, 2, 3, 4]
    assert [page_seq(7, i, 6) for i in range(6)] == [6, 5, 4, 3, 2, 1]


def test_ring_1_ring_3_simulator_images() -> None:
    """RING-1, RING-3: lap 1 with one page written is ``[n, 2, 3, ...]``: a scan for
    the extreme value would run into the old data; the prefix rule finds page 0."""
    assert write_image(4, 1, 1) == [4, 2, 3, 4]
    assert find_head(4, reader([4, 2, 3, 4])) == RingHead(0, 1)
    assert write_image(4, 0, 2) == [1, 2, None, None]
    assert write_image(4, 2, 3) == [1, 2, 3, 1]


# --- RING-3, RING-6 exhaustive ------------------------------------------------------------------


@pytest.mark.parametrize("n", EVEN_NS)
def test_ring_3_ring_6_exhaustive(n: int) -> None:
    """RING-3, RING-6: every even n <= 64, lap 0..5, pages written 1..n: binary search ==
    linear scan == truth, and the retained pages come out oldest first."""
    for lap in LAPS:
        for k in range(1, n + 1):
            pages = write_image(n, lap, k)
            check_image(n, pages, true_head(n, lap, k), true_order(n, lap, k))


@pytest.mark.parametrize("n", EVEN_NS)
def test_ring_4_torn_last_page_exhaustive(n: int) -> None:
    """RING-4, RING-6: the same grid with the last page written torn: the head is the page
    before it (or the end of the previous lap) and the torn page is not retained."""
    for lap in LAPS:
        for k in range(1, n + 1):
            head, order = torn_truth(n, lap, k)
            check_image(n, torn_image(n, lap, k), head, order)


def test_ring_4_torn_page_zero_reads_parity_from_page_one() -> None:
    """RING-4: page 0 of lap 2 torn: page 1 reads n-1, so lap 1 (odd) ended at page n-1."""
    pages: Image = [None, 5, 4, 3, 2, 1]
    assert find_head(6, reader(pages)) == RingHead(5, 1)
    assert retained_pages(6, RingHead(5, 1), reader(pages)) == [1, 2, 3, 4, 5]


# --- RING-5 -------------------------------------------------------------------------------------


def test_ring_5_fresh_ring_is_empty() -> None:
    """RING-5: pages 0 and 1 invalid -> empty, whatever lies beyond them."""
    for n in (2, 4, 10):
        blank: Image = [None] * n
        assert find_head(n, reader(blank)) is None
        assert find_head_linear(n, reader(blank)) is None
        assert retained_pages(n, None, reader(blank)) == []
    stale: Image = [None, None, 3, 4, 5, 6]
    assert find_head(6, reader(stale)) is None


def test_ring_5_only_page_zero_written() -> None:
    """RING-5, RING-3: a ring where only page 0 was written has head 0."""
    pages: Image = [1, None, None, None]
    assert find_head(4, reader(pages)) == RingHead(0, 0)
    assert find_head_linear(4, reader(pages)) == RingHead(0, 0)
    assert retained_pages(4, RingHead(0, 0), reader(pages)) == [0]


# --- RING-3: O(log n) -----------------------------------------------------------------------


@pytest.mark.parametrize("n", [2, 4, 6, 64, 1000, 4096, MAX_PAGES])
def test_ring_3_binary_search_reads_log_n_pages(n: int) -> None:
    """RING-3: the head is found in O(log n) page reads, torn or not."""
    bound = 2 * math.ceil(math.log2(n)) + 4
    for lap in (0, 1, 2):
        for k in sorted({1, 2, n // 3 or 1, n // 2, n - 1 or 1, n}):
            for pages in (write_image(n, lap, k), torn_image(n, lap, k)):
                counting = CountingReader(pages)
                find_head(n, counting)
                assert counting.calls <= bound
                assert counting.calls <= math.ceil(math.log2(n)) + 3


# --- RING-2 -------------------------------------------------------------------------------------


def _images(n: int) -> dict[tuple[int | None, ...], set[int | None]]:
    """Every image from laps 0..3 (clean and torn) -> the set of true heads that produce it."""
    seen: dict[tuple[int | None, ...], set[int | None]] = {}
    for lap in range(4):
        for k in range(1, n + 1):
            seen.setdefault(tuple(write_image(n, lap, k)), set()).add(k - 1)
            head, _ = torn_truth(n, lap, k)
            index = None if head is None else head.index
            seen.setdefault(tuple(torn_image(n, lap, k)), set()).add(index)
    return seen


@pytest.mark.parametrize("n", [3, 5, 7, 9])
def test_ring_2_odd_n_is_ambiguous(n: int) -> None:
    """RING-2: with odd n two different writes leave the same pages with different heads."""
    assert any(len(heads) > 1 for heads in _images(n).values())
    if n == 3:
        assert write_image(3, 2, 1) == write_image(3, 2, 2) == [1, 2, 1]


@pytest.mark.parametrize("n", range(2, 17, 2))
def test_ring_2_even_n_is_unambiguous(n: int) -> None:
    """RING-2: with even n every image determines its head."""
    assert all(len(heads) == 1 for heads in _images(n).values())


def test_ring_2_usable_page_count() -> None:
    """RING-2: round down to even, cap at 65534, reject fewer than 2 pages."""
    assert usable_page_count(2) == 2
    assert usable_page_count(3) == 2
    assert usable_page_count(4) == 4
    assert usable_page_count(1001) == 1000
    assert usable_page_count(65534) == 65534
    assert usable_page_count(65535) == 65534
    assert usable_page_count(10**9) == 65534
    for bad in (-5, 0, 1):
        with pytest.raises(BadArgument):
            usable_page_count(bad)


@pytest.mark.parametrize("n", [0, 1, 3, 7, MAX_PAGES + 2])
def test_ring_2_head_search_rejects_bad_n(n: int) -> None:
    """RING-2: head detection refuses odd or out-of-range page counts."""
    with pytest.raises(BadArgument):
        find_head(n, lambda _i: None)
    with pytest.raises(BadArgument):
        find_head_linear(n, lambda _i: None)


# --- Corrupt ------------------------------------------------------------------------------------


def test_ring_3_page_zero_neither_1_nor_n_is_corrupt() -> None:
    """RING-3: page 0 must read 1 or n; anything else is not a ring written by this scheme."""
    for value in (0, 2, 5, 7, 9, 65535):
        pages: Image = [value, 2, 3, 4, 5, 6, 7, 8]
        with pytest.raises(Corrupt):
            find_head(8, reader(pages))
        with pytest.raises(Corrupt):
            find_head_linear(8, reader(pages))


def test_ring_4_torn_page_zero_with_bad_page_one_is_corrupt() -> None:
    """RING-4: page 0 invalid and page 1 neither 2 nor n-1 -> Corrupt."""
    with pytest.raises(Corrupt):
        find_head(8, reader([None, 4, 3, 4, 5, 6, 7, 8]))


def test_ring_4_invalid_page_zero_mid_lap_is_corrupt() -> None:
    """RING-4: page 0 invalid but the lap page 1 belongs to did not end at page n-1: page 0 was
    not a torn first write of a lap (bit rot), so refuse rather than guess."""
    pages: Image = [None, 2, 3, 5, 4, 3, 2, 1]  # lap 2, four pages written, page 0 rotten
    with pytest.raises(Corrupt):
        find_head(8, reader(pages))
    with pytest.raises(Corrupt):
        find_head_linear(8, reader(pages))


# --- property -----------------------------------------------------------------------------------


@st.composite
def ring_writes(draw: st.DrawFn) -> tuple[int, int, int, bool]:
    n = 2 * draw(st.integers(1, 1000))
    lap = draw(st.integers(0, 9))
    k = draw(st.integers(1, n))
    return n, lap, k, draw(st.booleans())


@settings(max_examples=300, deadline=None)
@given(ring_writes())
def test_ring_3_ring_4_ring_6_property(case: tuple[int, int, int, bool]) -> None:
    """RING-3, RING-4, RING-6: random even n <= 2000, lap, pages written, optional torn last
    page: binary search == linear scan == truth, retained order == truth."""
    n, lap, k, torn = case
    if torn:
        head, order = torn_truth(n, lap, k)
        pages = torn_image(n, lap, k)
    else:
        head, order = true_head(n, lap, k), true_order(n, lap, k)
        pages = write_image(n, lap, k)
    check_image(n, pages, head, order)
