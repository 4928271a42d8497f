"""Flash ring page numbering and head detection (spec RING-1..RING-6).

A ring of ``n`` pages is written in order 0..n-1 and then wraps; each pass is a "lap". Every page
carries a u16 sequence number (RING-1) so that, after a restart, the head (the last page written)
can be found from the pages alone, without a metadata write per page.

Everything here is pure: pages are read through a ``read_seq(index)`` callback that returns the
page's number when its checksum is valid and ``None`` otherwise (never written, zeroed, torn or
garbage). The binary search (:func:`find_head`) and the linear scan (:func:`find_head_linear`, the
reference definition used as the test oracle) agree on every image the write discipline can leave
(pages written in ring order, each synced before the next: BDEV-6), torn last page included. On
other images (a valid page after an invalid one in the same lap) they may disagree: such an image
is corruption, not a crash state, and the tests generate only images a device can hold.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from tidelog.errors import BadArgument, Corrupt

__all__ = [
    "MAX_PAGES",
    "ReadSeq",
    "RingHead",
    "find_head",
    "find_head_linear",
    "page_seq",
    "retained_pages",
    "usable_page_count",
]

#: Largest usable page count: page numbers are u16 and go up to ``n``, and ``n`` must be even.
MAX_PAGES = 65534

#: ``read_seq(index)``: the page's u16 number if its checksum is valid, else ``None``.
ReadSeq = Callable[[int], int | None]


@dataclass(frozen=True, slots=True)
class RingHead:
    """The last page written (``index``) and the parity of the lap it belongs to (RING-3)."""

    index: int
    parity: int  # 0: even lap (numbers count up), 1: odd lap (numbers count down)


def usable_page_count(raw_pages: int) -> int:
    """Pages a ring may use on a device with ``raw_pages`` pages (RING-2).

    Odd ``n`` is ambiguous: for ``n = 3``, lap 2 after one page and after two pages both leave
    ``[1, 2, 1]``, because the middle page gets the same number in every lap. So round down to
    even, and cap at the largest even u16.

    raises: BadArgument
    post: __return__ % 2 == 0
    post: 2 <= __return__ <= min(raw_pages, MAX_PAGES)
    post: __return__ >= min(raw_pages, MAX_PAGES) - 1
    """
    n = min(raw_pages, MAX_PAGES)
    n -= n % 2
    if n < 2:
        raise BadArgument(f"a ring needs at least 2 pages, got {raw_pages}")
    return n


def page_seq(lap: int, index: int, n: int) -> int:
    """The number page ``index`` gets in lap ``lap`` (RING-1). Only the lap's parity matters.

    pre: lap >= 0
    pre: 2 <= n <= MAX_PAGES
    pre: 0 <= index < n
    post: 1 <= __return__ <= n
    post: __return__ == (index + 1 if lap % 2 == 0 else n - index)
    """
    return index + 1 if lap % 2 == 0 else n - index


def _is_current(read_seq: ReadSeq, index: int, parity: int, n: int) -> bool:
    """A page is current iff it is valid and numbered by the head lap's formula (RING-3)."""
    return read_seq(index) == page_seq(parity, index, n)


def _lap_start(n: int, read_seq: ReadSeq) -> tuple[int, int] | None:
    """``(parity, first current page)`` of the head's lap, or ``None`` for an empty ring.

    Page 0 gives the parity (1: even lap, n: odd lap). If page 0 is invalid, either the ring is
    fresh (page 1 invalid too, RING-5) or the write of page 0 of a new lap was torn; then the
    previous lap was complete and page 1 gives its parity (RING-4).
    """
    first = read_seq(0)
    if first is not None:
        return (_parity_of(first, 0, n), 0)
    second = read_seq(1)
    if second is None:
        return None
    return (_parity_of(second, 1, n), 1)


def _parity_of(value: int, index: int, n: int) -> int:
    """Which lap formula numbers page ``index`` as ``value``; Corrupt if neither does."""
    for parity in (0, 1):
        if value == page_seq(parity, index, n):
            return parity
    raise Corrupt(
        f"ring page {index} holds number {value}, expected {page_seq(0, index, n)} "
        f"or {page_seq(1, index, n)}: not a ring of {n} pages written by this scheme"
    )


def _unfinished_lap() -> Corrupt:
    # Only a torn first write of a lap leaves page 0 invalid, and that lap's predecessor is full.
    return Corrupt("ring page 0 is invalid but the previous lap did not end at the last page")


def _check_n(n: int) -> None:
    if n < 2 or n > MAX_PAGES or n % 2:
        raise BadArgument(f"ring page count must be even and in 2..{MAX_PAGES}, got {n}")


def find_head(n: int, read_seq: ReadSeq) -> RingHead | None:
    """The ring's head by binary search over the current-page prefix (RING-3, RING-4, RING-5).

    Reads at most ``ceil(log2 n) + 3`` pages. ``None`` means the ring is empty.

    pre: 2 <= n <= MAX_PAGES and n % 2 == 0
    raises: Corrupt
    post: __return__ is None or (0 <= __return__.index < n and __return__.parity in (0, 1))
    """
    _check_n(n)
    start = _lap_start(n, read_seq)
    if start is None:
        return None
    parity, first = start
    if first == 1:
        # Torn page 0 of a new lap: the previous lap ended at page n-1 (RING-4).
        if not _is_current(read_seq, n - 1, parity, n):
            raise _unfinished_lap()
        return RingHead(n - 1, parity)
    # Invariant: page lo is current, page hi is not (hi == n is a virtual sentinel).
    lo, hi = 0, n
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if _is_current(read_seq, mid, parity, n):
            lo = mid
        else:
            hi = mid
    return RingHead(lo, parity)


def find_head_linear(n: int, read_seq: ReadSeq) -> RingHead | None:
    """Reference definition: the last page of the maximal prefix of current pages (RING-3..5).

    pre: 2 <= n <= MAX_PAGES and n % 2 == 0
    raises: Corrupt
    post: __return__ is None or (0 <= __return__.index < n and __return__.parity in (0, 1))
    """
    _check_n(n)
    start = _lap_start(n, read_seq)
    if start is None:
        return None
    parity, head = start
    while head + 1 < n and _is_current(read_seq, head + 1, parity, n):
        head += 1
    if start[1] == 1 and head != n - 1:
        raise _unfinished_lap()
    return RingHead(head, parity)


def retained_pages(n: int, head: RingHead | None, read_seq: ReadSeq) -> list[int]:
    """Page indexes holding data, oldest first (RING-6).

    The pages after the head that hold valid previous-lap numbers, in page order, then the valid
    pages ``0..head``. Both parts are filters, not runs: the page right after the head may be the
    torn write (RING-4) while the previous lap's pages beyond it are intact, and a skipped index
    lets the caller report a gap instead of losing it silently.

    pre: 2 <= n <= MAX_PAGES and n % 2 == 0
    pre: head is None or (0 <= head.index < n and head.parity in (0, 1))
    post: __return__ == sorted(set(__return__), key=lambda i: (i <= head.index, i))
    post: all(0 <= i < n for i in __return__)
    """
    _check_n(n)
    if head is None:
        return []
    older = [i for i in range(head.index + 1, n) if _is_current(read_seq, i, 1 - head.parity, n)]
    newer = [i for i in range(head.index + 1) if _is_current(read_seq, i, head.parity, n)]
    return older + newer
