"""The ring on the device: where the next page goes, and reading the ring back after a restart.

Head detection is ``tidelog.model.ring`` (RING-3..RING-6, proven there for every ring size and
wrap count); this module only feeds it the pages, validated with the ring id (RING-5), and turns
the retained pages into one run of records (BDEV-10):

* pages come oldest first; their records must continue each other's seqs;
* a page whose ``first_seq`` is at or below what came before supersedes the tail it overlaps:
  that tail was an op that never completed (no BATCH_END) and whose seqs were reused after a
  crash (memory class, DUR-4); if the overlapped tail holds a completed op it is corruption;
* a page whose ``first_seq`` skips seqs: records are missing between two pages, which per-page
  syncs never leave (a damaged page, BDEV-22): ``FormatCorrupt``, never a shorter log;
* records after the last BATCH_END are an op whose last page never reached the device: dropped;
* a LOSS page (written by repair in place of a damaged one, BDEV-25) continues the run with its
  seqs as a loss range and ends any op before it (those records were on the device).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from tidelog.errors import Corrupt
from tidelog.model.ring import RingHead, find_head, page_seq, retained_pages

from .device import Geometry
from .format import (
    Entry,
    FormatCorrupt,
    MarkOut,
    PageHeader,
    RecordOut,
    decode_entries,
    decode_trailer,
    unchecked_trailer,
)

__all__ = [
    "RingState",
    "ScannedPage",
    "RingScan",
    "scan_ring",
    "page_reader",
    "Assembled",
    "LossOut",
    "assemble",
]

_CHUNK_PAGES = 64  # pages fetched per device read while scanning


@dataclass
class RingState:
    """Write position of the ring and what each page currently holds (in memory only)."""

    geometry: Geometry
    ring_id: int
    next_index: int = 0
    lap: int = 0  # lap of the next page written (its parity numbers the page: RING-1)
    num_pages: int = 0  # BDEV-1: 0..3, pages written since format, saturating
    looped: bool = False  # the ring wrapped at least once since format
    slots: list[tuple[int, int] | None] = field(default_factory=list)  # page -> (first, last) seq
    # TOP-11: producer id -> (its current sequence, the page holding the newest copy of that mark)
    marks: dict[str, tuple[int, int]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.slots:
            self.slots = [None] * self.geometry.page_count

    def reset(self, ring_id: int) -> None:
        """A new ring on the same device (format, drop_topic): nothing written yet."""
        self.ring_id = ring_id
        self.next_index = self.lap = self.num_pages = 0
        self.looped = False
        self.slots = [None] * self.geometry.page_count
        self.marks = {}

    def marks_to_carry(self, index: int) -> dict[str, int]:
        """Producer marks whose newest copy is in page ``index`` (which the page written there
        replaces) or in the page after it (which the next write replaces): the page written at
        ``index`` carries them forward (BDEV-9). Carrying a page's marks one write before it is
        replaced keeps a copy on the device when that write is torn (RING-4); each mark is
        still carried once per lap."""
        after = (index + 1) % self.geometry.page_count
        return {pid: n for pid, (n, where) in self.marks.items() if where in (index, after)}

    def next_page_seq(self) -> int:
        return page_seq(self.lap, self.next_index, self.geometry.page_count)

    def advance(self) -> bool:
        """Move past the page just written; True when that completed a lap."""
        self.next_index += 1
        if self.next_index < self.geometry.page_count:
            return False
        self.next_index = 0
        self.lap += 1
        return True


@dataclass(frozen=True)
class ScannedPage:
    index: int
    header: PageHeader
    entries: list[Entry]


@dataclass
class RingScan:
    head: RingHead | None
    pages: list[ScannedPage]  # retained, oldest first
    headers: dict[int, PageHeader]  # every page that validates, by index (BDEV-22's proofs)
    seqs: list[int | None]  # every page's number (RING-1), None where it does not validate
    after_head: PageHeader | None = None  # what the invalid page after the head was meant to be

    @property
    def valid(self) -> int:
        """Pages that validated at all (for verify and describe)."""
        return len(self.headers)

    @property
    def next_index(self) -> int:
        """The page after the head: the only one a power loss may have left torn (RING-4)."""
        return 0 if self.head is None else (self.head.index + 1) % len(self.seqs)


def page_reader(pread: Callable[[int, int], bytes], geometry: Geometry) -> Callable[[int], bytes]:
    """``read_page(i)`` over ``pread(size, offset)`` that fetches ``_CHUNK_PAGES`` pages per read
    (the scan visits every page once, in order); short reads past the end read as zeros."""
    cache: dict[int, bytes] = {}
    size = geometry.page_size

    def read_page(i: int) -> bytes:
        if i not in cache:
            cache.clear()
            start = i - i % _CHUNK_PAGES
            n = min(_CHUNK_PAGES, geometry.page_count - start)
            data = pread(n * size, geometry.offset(start)).ljust(n * size, b"\0")
            for k in range(n):
                cache[start + k] = data[k * size : (k + 1) * size]
        return cache[i]

    return read_page


def scan_ring(read_page: Callable[[int], bytes], geometry: Geometry, ring_id: int) -> RingScan:
    """Find the head (binary search, RING-3) and decode the retained pages (RING-6).

    Every page is read once (in chunks). Raises ``FormatCorrupt`` naming the page for rings no
    crash can leave (RING-4) and for a page whose checksum matches but whose records do not parse
    (BDEV-8).
    """
    n = geometry.page_count
    seen: dict[int, tuple[PageHeader, bytes] | None] = {}
    headers: dict[int, PageHeader] = {}

    def load(i: int) -> tuple[PageHeader, bytes] | None:
        if i not in seen:
            raw = read_page(i)
            h = decode_trailer(raw, ring_id)
            seen[i] = None if h is None else (h, raw)
            if h is not None:
                headers[i] = h
        return seen[i]

    def read_seq(i: int) -> int | None:
        got = load(i)
        return None if got is None else got[0].page_seq

    try:
        head = find_head(n, read_seq)
    except Corrupt as exc:
        raise FormatCorrupt("RING-4", exc.message, page=0) from None
    order = retained_pages(n, head, read_seq)
    seqs = [read_seq(i) for i in range(n)]  # BDEV-22 looks at every page, retained or not
    pages = []
    for i in order:
        got = load(i)
        assert got is not None
        h, raw = got
        try:
            entries = decode_entries(raw, h)
        except FormatCorrupt as exc:
            raise FormatCorrupt(exc.rule, f"page {i}: {exc.detail}", page=i) from None
        pages.append(ScannedPage(i, h, entries))
        seen[i] = (h, b"")  # the raw bytes are no longer needed
    scan = RingScan(head, pages, headers, seqs)
    if scan.next_index not in headers:
        scan.after_head = unchecked_trailer(read_page(scan.next_index))
    return scan


@dataclass(frozen=True, slots=True)
class LossOut:
    """The seqs of a LOSS page (BDEV-25): lost, read as a loss range (TMB-2)."""

    lo: int
    hi: int


_Item = Entry | LossOut


@dataclass
class Assembled:
    """The retained records as one run, and the producer marks (BDEV-9, BDEV-10)."""

    records: list[RecordOut]
    head_seq: int  # last seq of the run (0: nothing was ever kept)
    newest: PageHeader | None  # trailer of the head page: the freshest facts (BDEV-7)
    ranges: dict[int, tuple[int, int]]  # page -> (first, last) seq it still holds
    marks: dict[str, tuple[int, int]]  # producer -> (sequence, page of its newest copy)
    abandoned: int = 0  # records of an op that never completed
    notes: list[str] = field(default_factory=list)
    losses: list[tuple[int, int]] = field(default_factory=list)  # LOSS pages' seqs (BDEV-25)


def _ends_op(e: _Item) -> bool:
    """An op's last entry; a LOSS page ends whatever op came before it (BDEV-25)."""
    if isinstance(e, LossOut):
        return True
    return e.batch_end and not (isinstance(e, MarkOut) and e.carried)


def _reaches(e: _Item, seq: int) -> bool:
    """Whether ``e`` holds ``seq`` or a later seq (a mark holds none)."""
    if isinstance(e, RecordOut):
        return e.seq >= seq
    return isinstance(e, LossOut) and e.hi >= seq


def assemble(scan: RingScan) -> Assembled:
    kept: list[tuple[int, _Item]] = []  # (page index, entry), oldest first
    facts: list[tuple[int, MarkOut]] = []  # carried marks removed from ``kept``: still facts
    next_seq: int | None = None
    notes: list[str] = []
    for page in scan.pages:
        first = page.header.first_seq
        if next_seq is not None and first < next_seq:
            cut = next((k for k, (_, e) in enumerate(kept) if _reaches(e, first)), len(kept))
            done = next((e for _, e in kept[cut:] if _ends_op(e)), None)
            if done is not None:
                raise FormatCorrupt(
                    "BDEV-10",
                    f"page {page.index} starts at seq {first}, but a completed op already wrote "
                    "records from that seq on: two different records with one seq",
                    page=page.index,
                )
            facts += [(i, e) for i, e in kept[cut:] if isinstance(e, MarkOut)]
            del kept[cut:]
        elif next_seq is not None and first > next_seq:
            raise FormatCorrupt(
                "BDEV-10",
                f"page {page.index} starts at seq {first}, but the page before it ends at seq "
                f"{next_seq - 1}: seqs {next_seq}..{first - 1} are in no page (BDEV-22)",
                page=page.index,
            )
        if page.header.loss and page.header.count:
            kept.append((page.index, LossOut(first, page.header.last_seq)))
        kept += [(page.index, e) for e in page.entries]
        next_seq = first + page.header.count
    last_end = max((k for k, (_, e) in enumerate(kept) if _ends_op(e)), default=-1)
    tail = kept[last_end + 1 :]
    abandoned = sum(1 for _, e in tail if isinstance(e, RecordOut))
    if abandoned:
        notes.append(f"{abandoned} records of an op whose last page was never written: dropped")
    facts += [(i, e) for i, e in tail if isinstance(e, MarkOut) and e.carried]
    kept = kept[: last_end + 1]
    records = [e for _, e in kept if isinstance(e, RecordOut)]
    losses = [(e.lo, e.hi) for _, e in kept if isinstance(e, LossOut)]
    last = next((e for _, e in reversed(kept) if isinstance(e, (RecordOut, LossOut))), None)
    if last is not None:
        head_seq = last.seq if isinstance(last, RecordOut) else last.hi
    elif tail or next_seq is not None:
        first_tail = next((e.seq for _, e in tail if isinstance(e, RecordOut)), None)
        head_seq = (first_tail if first_tail is not None else next_seq or 1) - 1
    else:
        head_seq = 0
    ranges: dict[int, tuple[int, int]] = {}
    for i, e in kept:
        if isinstance(e, RecordOut):
            ranges[i] = (ranges.get(i, (e.seq, e.seq))[0], e.seq)
        elif isinstance(e, LossOut):
            ranges[i] = (e.lo, e.hi)
    marks: dict[str, tuple[int, int]] = {}
    for i, m in [*facts, *((i, e) for i, e in kept if isinstance(e, MarkOut))]:
        have = marks.get(m.pid)
        if have is None or m.n >= have[0]:
            marks[m.pid] = (m.n, i) if have is None or m.n > have[0] else (m.n, have[1])
    _newest_copies(marks, scan)
    newest = scan.pages[-1].header if scan.pages else None
    return Assembled(records, head_seq, newest, ranges, marks, abandoned, notes, losses)


def _newest_copies(marks: dict[str, tuple[int, int]], scan: RingScan) -> None:
    """Point every mark at the newest page (in ring order) that holds that exact mark: the page
    that will be overwritten last, so carrying forward happens as late as possible."""
    for page in scan.pages:  # oldest first: later pages win
        for e in page.entries:
            if isinstance(e, MarkOut) and marks.get(e.pid, (0, 0))[0] == e.n:
                marks[e.pid] = (e.n, page.index)
