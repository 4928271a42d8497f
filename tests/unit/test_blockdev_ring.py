"""The blockdev ring at work (spec/FORMATS-blockdev.md; SPEC RING-1..RING-6, CAP): head detection
on real images the backend wrote, ring overwrite, producer marks, assembly, write policy, group
commit, one topic per device, write amplification, direct I/O, verify and the CLI."""

from __future__ import annotations

import contextlib
import fcntl
import mmap
import os
import tempfile
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

import tidelog
from tidelog.backends.blockdev import BlockdevBackend, verify_image
from tidelog.backends.blockdev.device import DeviceHandle
from tidelog.backends.blockdev.format import (
    SLOT_BYTES,
    FormatCorrupt,
    PageHeader,
    decode_slot,
    decode_trailer,
    encode_mark,
    encode_page,
    encode_record,
)
from tidelog.backends.blockdev.ring import RingScan, ScannedPage, assemble
from tidelog.cli import main
from tidelog.clock import FakeClock
from tidelog.errors import BadArgument, BadOption, Corrupt, NoSuchTopic, NotAvailable
from tidelog.fsio import OsFS
from tidelog.hooks import Abandon, IoCounters, RingEvictions, hooks
from tidelog.model.ring import RingHead, find_head, find_head_linear, page_seq, retained_pages
from tidelog.records import Record, Tombstone

PAGE = 512


def uri(path: Path, **options: object) -> str:
    query = "&".join(f"{k}={v}" for k, v in options.items())
    return f"blockdev://{path}" + (f"?{query}" if query else "")


def new_ring(path: Path, pages: int, page_size: int = PAGE, **options: object) -> tidelog.Store:
    size = 4096 + pages * page_size
    return tidelog.open(
        uri(path, size=size, page_size=page_size, topic="t", **options), clock=FakeClock(1000)
    )


def ring_id_of(image: bytes) -> int:
    slots = []
    for i in (0, 1):
        with contextlib.suppress(FormatCorrupt):
            slots.append(decode_slot(image[i * SLOT_BYTES : (i + 1) * SLOT_BYTES], i))
    return max(slots, key=lambda s: s.generation).ring_id


def page_of(image: bytes, i: int, page_size: int = PAGE) -> bytes:
    return image[4096 + i * page_size : 4096 + (i + 1) * page_size]


# -- head detection on real images (RING-1..RING-6) --------------------------------------------
def _snapshots(tmp: Path, n: int, writes: int) -> list[bytes]:
    """Images after 0..writes single fsync appends (one page each); record w holds seq w+1."""
    path = tmp / f"ring-{n}.img"
    shots = []
    with new_ring(path, n) as store:
        t = store.topic("t", durability="fsync")
        shots.append(path.read_bytes())
        for w in range(writes):
            t.append((w + 1).to_bytes(8, "little"))
            shots.append(path.read_bytes())
    return shots


def _reader(image: bytes, ring_id: int) -> Callable[[int], int | None]:
    def read_seq(i: int) -> int | None:
        h = decode_trailer(page_of(image, i), ring_id)
        return None if h is None else h.page_seq

    return read_seq


def _expected(n: int, k: int, torn: bool) -> tuple[RingHead | None, list[int]]:
    """Head and retained pages (oldest first) after k page writes, the last one torn or not."""
    lap, pos = divmod(k - 1, n)  # the k-th write went to page pos of lap `lap`
    if not torn:
        return RingHead(pos, lap % 2), ([] if lap == 0 else list(range(pos + 1, n))) + list(
            range(pos + 1)
        )
    if pos >= 1:
        older = [] if lap == 0 else list(range(pos + 1, n))
        return RingHead(pos - 1, lap % 2), older + list(range(pos))
    if lap == 0:
        return None, []
    return RingHead(n - 1, (lap - 1) % 2), list(range(1, n))


def _seqs_on(n: int, k: int, pages: list[int], torn: bool) -> list[int]:
    """The seq each retained page holds: page i last written by the write w with w % n == i."""
    last = k - 1 if not torn else k - 2  # index of the last intact write
    out = []
    for i in pages:
        w = last - ((last - i) % n)
        out.append(w + 1)
    return out


def _tear(before: bytes, after: bytes, pos: int, how: str) -> bytes:
    """The image a crash during the last page write leaves: the metadata and every other page as
    before that write, page ``pos`` zeroed, garbage, or half new and half old."""
    old, new = page_of(before, pos), page_of(after, pos)
    torn = {
        "zero": bytes(PAGE),
        "garbage": os.urandom(PAGE),
        "half": new[: PAGE // 2] + old[PAGE // 2 :],
    }[how]
    start = 4096 + pos * PAGE
    return before[:start] + torn + before[start + PAGE :]


def _check_store(tmp: Path, image: bytes, seqs: list[int], head: int) -> None:
    path = tmp / "check.img"
    path.write_bytes(image)
    with tidelog.open(uri(path)) as store:
        t = store.topic("t")
        assert t.state().head_seq == head
        want: list[object] = [Tombstone(1, seqs[0] - 1)] if seqs and seqs[0] > 1 else []
        want += [s for s in seqs]
        got = [i if isinstance(i, Tombstone) else i.seq for i in t.read(0, 10**6)]
        assert got == want
        for item in t.read(0, 10**6):
            if isinstance(item, Record):
                assert item.payload == item.seq.to_bytes(8, "little")
    path.unlink()


@pytest.mark.parametrize("n", range(2, 17, 2))
def test_RING_3_RING_4_head_on_real_images(tmp_path: Path, n: int) -> None:
    """RING-1, RING-3, RING-4, RING-6, BDEV-6, BDEV-17: for every ring size up to 16 and every
    wrap count up to 4 laps, on images the backend wrote: the page numbers follow RING-1, binary
    search == linear scan == truth, and reopening recovers exactly the retained records; the
    same with the last page write torn (zeroed, garbage, half-written): the head is the page
    before it, that page's old records are gone below the floor, nothing else is lost."""
    writes = 4 * n
    shots = _snapshots(tmp_path, n, writes)
    ring_id = ring_id_of(shots[-1])
    for k in range(1, writes + 1):
        lap, pos = divmod(k - 1, n)
        image = shots[k]
        h = decode_trailer(page_of(image, pos), ring_id)
        assert h is not None and h.page_seq == page_seq(lap, pos, n) and h.lap == lap  # RING-1
        head, order = _expected(n, k, torn=False)
        read = _reader(image, ring_id)
        assert find_head(n, read) == find_head_linear(n, read) == head
        assert retained_pages(n, head, read) == order
        seqs = _seqs_on(n, k, order, torn=False)
        assert seqs == list(range(max(1, k - n + 1), k + 1))
        _check_store(tmp_path, image, seqs, k)
        for how in ("zero", "garbage", "half"):
            torn = _tear(shots[k - 1], image, pos, how)
            head, order = _expected(n, k, torn=True)
            read = _reader(torn, ring_id)
            assert find_head(n, read) == find_head_linear(n, read) == head, (k, how)
            assert retained_pages(n, head, read) == order
            seqs = _seqs_on(n, k, order, torn=True)
            _check_store(tmp_path, torn, seqs, k - 1)


@pytest.mark.parametrize("n", [2, 4, 6, 16])
def test_RING_5_fresh_device_with_zeroed_first_pages(tmp_path: Path, n: int) -> None:
    """RING-5, BDEV-11: a fresh device (first two pages zeroed by format, the rest holding an
    older ring's pages and garbage) is an empty ring; so is one where only those two pages are
    zero and the old ring's id is kept (RING-5 alone, without the ring id)."""
    path = tmp_path / "dev.img"
    with new_ring(path, n) as store:
        t = store.topic("t", durability="fsync")
        for i in range(3 * n):
            t.append(bytes([i]) * 10)
    old = path.read_bytes()
    with tidelog.open(uri(path, format="true")) as store:
        assert store.topics() == [] and store.describe()["page_count"] == n
    fresh = path.read_bytes()
    assert page_of(fresh, 0) == page_of(fresh, 1) == bytes(PAGE)
    assert fresh[4096 + 2 * PAGE :] == old[4096 + 2 * PAGE :]  # only the two pages were written
    read = _reader(fresh, ring_id_of(fresh))
    assert find_head(n, read) is None and retained_pages(n, None, read) == []
    # RING-5 alone: same ring id, first two pages zeroed -> empty
    zeroed = old[:4096] + bytes(2 * PAGE) + old[4096 + 2 * PAGE :]
    assert find_head(n, _reader(zeroed, ring_id_of(old))) is None


# -- ring overwrite (BDEV-16) -------------------------------------------------------------------
def test_BDEV_16_ring_overwrite_is_involuntary_eviction(tmp_path: Path) -> None:
    """BDEV-16, TMB-1, SUB-7: overwriting live records evicts them: floor, tombstone, a gap for
    the subscriber that had not resolved them; reported with head - through >= page_count; also
    on a discard="reject" topic with retention="backpressure" (the device is full)."""
    n = 4
    with new_ring(tmp_path / "r.img", n) as store:
        t = store.topic("t", durability="fsync", discard="reject", retention="backpressure")
        sub = t.subscribe("s", start="earliest")
        for i in range(6):
            t.append(bytes([i]) * 300)  # one page each
        b: Any = hooks(store, RingEvictions)
        assert [(e.through, e.head) for e in b.ring_evictions] == [(1, 5), (2, 6)]
        assert all(e.head - e.through >= n for e in b.ring_evictions)
        assert t.state().evict_floor == 3
        assert t.read(0, 1) == [Tombstone(1, 2)]
        assert sub.poll(1) == [Tombstone(1, 2)]
        assert [r.seq for r in sub.poll(10)] == [3, 4, 5, 6]
        assert store.describe()["ring_evictions"] == 2
    with tidelog.open(uri(tmp_path / "r.img")) as store:
        assert store.topic("t").read(0, 1) == [Tombstone(1, 2)]


def test_BDEV_16_dead_pages_are_reused_silently(tmp_path: Path) -> None:
    """BDEV-16: a cap that keeps live records well inside the ring: pages are reused without
    any ring eviction (the cap already evicted, the model knows)."""
    with new_ring(tmp_path / "r.img", 4) as store:
        t = store.topic("t", durability="fsync", cap_records=2)
        for i in range(20):
            t.append(bytes([i]) * 300)
        assert hooks(store, RingEvictions).ring_evictions == []
        assert store.describe()["looped"] is True
        assert [r.seq for r in t.read() if isinstance(r, Record)] == [19, 20]


# -- producer marks (BDEV-9) --------------------------------------------------------------------
def test_BDEV_9_producer_marks_survive_wraps_and_restarts(tmp_path: Path) -> None:
    """BDEV-9, TOP-11: a producer's mark lives in the page of its batch; when the ring wraps over
    it, the replacing page carries it forward, so duplicates are refused after many laps and a
    reopen; marks of all producers must fit half a page."""
    path = tmp_path / "r.img"
    with new_ring(path, 4) as store:
        t = store.topic("t", durability="fsync", cap_records=2)
        assert t.append_many([b"a"], producer=("p0", 1)) == [1]
        assert t.append_many([b"b"], producer=("q1", 5)) == [2]
        for i in range(12):  # three laps: the marks' pages are overwritten again and again
            t.append(bytes([i]) * 300)
        assert t.append_many([b"dup"], producer=("p0", 1)) == []
    with tidelog.open(uri(path)) as store:
        t = store.topic("t")
        assert t.append_many([b"dup"], producer=("q1", 5)) == []
        assert t.append_many([b"dup"], producer=("p0", 1)) == []
        assert t.append_many([b"c"], producer=("p0", 2)) != []
        with pytest.raises(NotAvailable, match="producer ids"):
            for i in range(40):
                t.append_many([b"x"], producer=(f"producer-{i:03d}-" + "x" * 20, 1))


# -- assembly (BDEV-10) -------------------------------------------------------------------------
def _scanned(index: int, first: int, entries: list[bytes], count: int) -> ScannedPage:
    from tidelog.backends.blockdev.format import decode_entries

    body = b"".join(entries)
    h = PageHeader(first, 1, 0, 1, count, len(body), 1, 0, 0)
    return ScannedPage(index, h, decode_entries(encode_page(512, 1, body, h), h))


def rec(payload: bytes, end: bool = False) -> bytes:
    return encode_record(0, None, None, payload, end)


def _ring(head: RingHead, pages: list[ScannedPage]) -> RingScan:
    return RingScan(head, pages, {p.index: p.header for p in pages}, [1] * 4)


def test_BDEV_10_assembly_rules() -> None:
    """BDEV-10: (a) continuation, (b) a page at a lower seq supersedes an unfinished op's tail,
    (c) seqs missing between pages are corrupt (BDEV-22: never a shorter log), (d) records after
    the last BATCH_END are dropped; carried marks stay facts; superseding a completed op is
    corrupt."""
    a = _scanned(0, 1, [rec(b"1"), rec(b"2", True)], 2)
    b = _scanned(1, 3, [rec(b"3"), rec(b"4")], 2)  # op 3..5 unfinished: 5 never written
    c = _scanned(2, 3, [encode_mark(b"p", 9, carried=True), rec(b"3'", True)], 1)
    asm = assemble(_ring(RingHead(2, 0), [a, b, c]))
    assert [(r.seq, r.payload) for r in asm.records] == [(1, b"1"), (2, b"2"), (3, b"3'")]
    assert asm.head_seq == 3 and asm.marks == {"p": (9, 2)}
    assert asm.ranges == {0: (1, 2), 2: (3, 3)}
    tail = assemble(_ring(RingHead(1, 0), [a, b]))
    assert tail.head_seq == 2 and tail.abandoned == 2  # (d)
    with pytest.raises(FormatCorrupt, match=r"seqs 3\.\.6 are in no page") as gap:
        assemble(_ring(RingHead(1, 0), [a, _scanned(1, 7, [rec(b"7", True)], 1)]))  # (c)
    assert gap.value.page == 1
    done = _scanned(1, 3, [rec(b"3", True)], 1)
    with pytest.raises(FormatCorrupt, match="two different records"):
        assemble(_ring(RingHead(2, 0), [a, done, _scanned(2, 3, [rec(b"x", True)], 1)]))


# -- write policy (BDEV-1, BDEV-14, BDEV-15), counted at the FS seam ---------------------------
class _SeamHandle:
    def __init__(self, inner: Any, log: list[tuple[str, int, int]]) -> None:
        self._inner, self._log = inner, log

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def pwrite(self, data: bytes | bytearray | memoryview, offset: int) -> None:
        self._log.append(("write", offset, len(data)))
        self._inner.pwrite(data, offset)

    def fdatasync(self) -> None:
        self._log.append(("sync", 0, 0))
        self._inner.fdatasync()


class _SeamFS(OsFS):
    """OsFS that logs every write and sync the backend issues through the FS seam."""

    def __init__(self) -> None:
        self.log: list[tuple[str, int, int]] = []

    def open(self, path: str, *, create: bool = True) -> Any:
        return _SeamHandle(super().open(path, create=create), self.log)


def _writes(fs: _SeamFS, since: int = 0) -> list[str]:
    """The writes after log entry ``since``, as "meta" or "page <i>", after checking BDEV-1 and
    BDEV-14: each one whole slot (2 KiB at 0 or 2048) or one whole page at its aligned offset,
    and each followed by a sync before the next write."""
    out = []
    log = fs.log[since:]
    for k, (op, off, n) in enumerate(log):
        if op != "write":
            continue
        assert k + 1 < len(log) and log[k + 1][0] == "sync", f"write {k} not synced before more"
        if off < 4096:
            assert (off, n) in ((0, SLOT_BYTES), (SLOT_BYTES, SLOT_BYTES)), (off, n)
            out.append("meta")
        else:
            assert n == PAGE and (off - 4096) % PAGE == 0, (off, n)
            out.append(f"page {(off - 4096) // PAGE}")
    return out


@pytest.mark.parametrize("cls", ["fsync", "memory"])
def test_BDEV_14_metadata_only_at_init_num_pages_first_wrap_and_close(
    tmp_path: Path, cls: str
) -> None:
    """BDEV-1, BDEV-14: counted at the FS seam, every device write is one whole slot or
    one whole aligned page, synced before the next; on its own the ring writes its metadata only
    at init (format, binding the topic), on the num_pages transitions 0->1->2->3, at the first
    wrap and at clean close: five laps of appends, reads, polls, acks, commits, rejects, cap and
    TTL evictions and trims write pages only. Reopening and closing untouched writes nothing."""
    from tidelog.backends.blockdev import open_store

    fs, path, clock = _SeamFS(), str(tmp_path / "r.img"), FakeClock(1000)
    n = 8
    store = open_store(fs, path, clock, size=4096 + n * PAGE, page_size=PAGE, topic="t")
    assert _writes(fs) == ["meta"]  # format (a new image: its pages are already zero)
    t = store.topic("t", durability=cls, cap_records=6, ttl_ms=50, retention="drop_oldest")
    sub = t.subscribe("s", start="earliest")
    mark = len(fs.log)
    assert _writes(fs) == ["meta", "meta", "meta"]  # + init (topic bound), registration
    reader = t.subscribe("r", start="earliest")  # registration: the last explicit write here
    mark = len(fs.log)
    payload = b"p" * 140  # three records fill a 512-byte page
    for i in range(3 * 5 * n):
        t.append(payload)
        clock.advance(7)
        got = [r for r in sub.poll(2) if isinstance(r, Record)]
        for r in got[:1]:
            sub.ack(r.seq)
        for r in got[1:]:
            sub.reject(r.seq)
        if i % 12 == 0:  # the reader lags: the cap and the TTL evict before it commits
            reader.commit(t.state().head_seq)
        t.read(after=max(0, t.state().head_seq - 3))
    writes = _writes(fs, mark)
    pages = [w for w in writes if w != "meta"]
    # fsync: one page per commit; memory: full pages only (the 40th is still open)
    assert len(pages) == (3 * 5 * n if cls == "fsync" else 5 * n - 1)
    assert [int(p.split()[1]) for p in pages] == [k % n for k in range(len(pages))]  # in order
    metas = [k for k, w in enumerate(writes) if w == "meta"]
    # after the 1st, 2nd and 3rd page (num_pages) and after page n-1 (the first wrap)
    assert metas == [1, 3, 5, n + 3], writes[: n + 5]
    assert t.state().evict_floor > 1  # TTL and cap evictions happened, with no write of their own
    mark = len(fs.log)
    store.close()
    tail = _writes(fs, mark)
    assert tail[-1] == "meta" and tail.count("meta") == 1  # clean close
    assert tail[:-1] == ([] if cls == "fsync" else [f"page {n - 1}"])  # memory: the open page
    mark = len(fs.log)
    open_store(fs, path, FakeClock(clock.now_ms())).close()
    assert _writes(fs, mark) == []


def test_BDEV_14_explicit_requests_and_cadence(tmp_path: Path) -> None:
    """BDEV-14: beyond init, num_pages, first wrap and close, the metadata is written only when
    asked: a subscriber registering or unregistering, Subscriber.flush() and Store.flush()
    (each skipped when nothing it records changed), and every meta_every pages if set."""
    from tidelog.backends.blockdev import open_store

    fs, path = _SeamFS(), str(tmp_path / "r.img")
    store = open_store(fs, path, FakeClock(1), size=4096 + 4 * PAGE, page_size=PAGE, topic="t")
    t = store.topic("t", durability="fsync", cap_records=1, retention="drop_oldest")
    for i in range(4):
        t.append(bytes([i]) * 300)
    mark = len(fs.log)
    sub = t.subscribe("s")
    assert _writes(fs, mark) == ["meta"]
    mark = len(fs.log)
    sub.flush()
    store.flush()
    assert _writes(fs, mark) == []  # nothing changed
    t.append(b"y")
    sub.commit(t.state().head_seq)
    mark = len(fs.log)
    sub.flush()
    assert _writes(fs, mark) == ["meta"]
    mark = len(fs.log)
    sub.unregister()
    assert _writes(fs, mark) == ["meta"]
    store.close()
    store = open_store(fs, path, FakeClock(2), meta_every=2)
    t = store.topic("t")
    mark = len(fs.log)
    for i in range(4):
        t.append(bytes([i]) * 300)
    assert _writes(fs, mark) == ["page 1", "page 2", "meta", "page 3", "page 0", "meta"]
    store.close()


def _tail_after_crash(path: Path, every: int) -> tuple[int, int, int]:
    """(persisted, recovered, final) hwm of a fast subscriber when the process dies."""
    store = new_ring(path, 16, meta_every=every)
    t = store.topic("t", durability="fsync", trim="none")
    fast, slow = t.subscribe("fast", start="earliest"), t.subscribe("slow", start="earliest")
    persisted, gen = 0, store.describe()["meta_generation"]
    for i in range(12):
        t.append(bytes([i]) * 300)  # one page each
        if store.describe()["meta_generation"] != gen:  # a slot went with this append
            gen, persisted = store.describe()["meta_generation"], fast.hwm
        fast.commit(i + 1)
        if i == 4:
            slow.commit(5)
    final = fast.hwm
    hooks(store, Abandon).abandon()  # the process dies: no close
    with tidelog.open(uri(path)) as store:
        t = store.topic("t")
        got = t.subscriber("fast")
        recovered = got.hwm
        redelivered = [r.seq for r in got.poll(100)]
        assert redelivered == list(range(recovered + 1, 13)), redelivered  # none skipped
        assert t.subscriber("slow").hwm == 5  # the page trailers carry the lowest hwm
    return persisted, recovered, final


def test_BDEV_14_BDEV_17_consumer_tail_after_a_crash(tmp_path: Path) -> None:
    """BDEV-14, BDEV-17, DUR-9, SUB-9: the consumer tail is persisted at registration, flushes,
    clean close, every meta_every pages (the optional cadence) and, for the slowest subscriber,
    in every page trailer. After the process dies, redelivery starts at or before the last
    persisted tail, never after an unacked record; the cadence moves that point forward."""
    never = _tail_after_crash(tmp_path / "never.img", 0)
    often = _tail_after_crash(tmp_path / "often.img", 2)
    for persisted, recovered, final in (never, often):
        assert persisted <= recovered <= final == 12
    assert never == (2, 5, 12)  # last slot: num_pages 3; then the trailers' lowest hwm (slow's)
    assert often == (10, 10, 12)  # meta_every=2: a slot with the 11th page, when fast had 10


def test_BDEV_17_BDEV_16_writing_resumes_after_the_last_page_written(tmp_path: Path) -> None:
    """BDEV-17, BDEV-16, BDEV-10 (d), TOP-6 (seed 4032979157): a power loss inside a multi-page
    op discards its written pages (its BATCH_END never reached the device), yet the ring resumes
    after the last page written, never over those pages: the older record goes early, visibly
    (tombstone, subscriber gap), when only 3 pages hold records the topic counts."""
    from tidelog.backends.blockdev import open_store

    fs, path, clock = _SeamFS(), str(tmp_path / "r.img"), FakeClock(1000)
    store = open_store(fs, path, clock, size=4096 + 6 * PAGE, page_size=PAGE, topic="t")
    t = store.topic("t", durability="memory")
    t.subscribe("s", start="earliest")
    t.append_many([b"a" * 60])  # seq 1, page 0
    t.append_many([b"b" * 400] * 4)  # seqs 2-5: pages 0-3 written, seq 5 still in memory
    hooks(store, Abandon).abandon()
    store = open_store(fs, path, clock)
    t = store.topic("t")
    assert t.state().head_seq == 1 and store.describe()["next_page"] == 4
    assert any("never written: dropped" in w for w in store.describe()["warnings"])  # type: ignore[union-attr]
    mark = len(fs.log)
    t.append_many([b"c" * 400] * 2)
    t.append_many([b"d" * 400] * 2)  # seqs 2-5 again; sealing seq 4's page reuses page 0
    assert _writes(fs, mark) == ["page 4", "page 5", "meta", "page 0"]  # meta: the first wrap
    b: Any = hooks(store, BlockdevBackend)  # its own eviction records name the page
    assert [(e.through, e.head, e.page) for e in b.ring_evictions] == [(1, 5, 0)]
    assert t.read(0, 1) == [Tombstone(1, 1)]
    assert store.topic("t").subscriber("s").poll(1) == [Tombstone(1, 1)]
    store.close()


def test_BDEV_17_progress_past_the_recovered_head_is_rewritten(tmp_path: Path) -> None:
    """BDEV-17, SUB-7, DUR-9 (seed 4032979157): a subscriber registered at head 3 of a memory
    topic (the slot says hwm 3); a crash loses seq 3, recovery clamps the hwm to 2 and writes
    the slot at once (one slot write at open, nothing else), so the new record that gets seq 3
    is delivered after a second crash, never skipped. A torn rewrite leaves the older slot, and
    the next open clamps and writes again; an open with nothing to clamp writes nothing."""
    from tidelog.backends.blockdev import open_store

    fs, path, clock = _SeamFS(), str(tmp_path / "r.img"), FakeClock(1000)
    store = open_store(fs, path, clock, size=4096 + 6 * PAGE, page_size=PAGE, topic="t")
    t = store.topic("t", durability="memory")
    t.append(b"a" * 400)
    t.append(b"a" * 400)  # page 0 (seq 1) written; seq 2 in memory
    t.append(b"x")  # seq 3, in the open page
    assert t.subscribe("s1", start="resume").hwm == 3  # registration: slot with hwm 3
    hooks(store, Abandon).abandon()
    mark = len(fs.log)
    store = open_store(fs, path, clock)
    assert _writes(fs, mark) == ["meta"]  # progress past head 1 rewritten before any op
    gen = store.describe()["meta_generation"]
    assert isinstance(gen, int)
    hooks(store, Abandon).abandon()
    with open(path, "r+b") as f:  # that slot write torn: the slot before it is kept
        f.seek((gen - 1) % 2 * SLOT_BYTES + 100)
        f.write(bytes(SLOT_BYTES - 100))
    mark = len(fs.log)
    store = open_store(fs, path, clock)
    assert _writes(fs, mark) == ["meta"]  # clamped and written again
    t = store.topic("t")
    assert t.state().head_seq == 1 and t.subscriber("s1").hwm == 1
    t.append_many([b"b" * 400, b"c" * 400])  # seqs 2 and 3 again; seq 2's page is written
    t.append_many([b"d" * 400])  # seq 4: seq 3's page is written
    hooks(store, Abandon).abandon()
    mark = len(fs.log)
    store = open_store(fs, path, clock)
    assert _writes(fs, mark) == []  # nothing past the head: nothing to rewrite
    t = store.topic("t")
    assert t.state().head_seq == 3
    got = t.subscriber("s1").poll(10)
    assert [(r.seq, r.payload) for r in got if isinstance(r, Record)] == [
        (2, b"b" * 400),
        (3, b"c" * 400),
    ]
    store.close()


def test_BDEV_15_memory_class_writes_full_pages_and_close_writes_the_rest(tmp_path: Path) -> None:
    """BDEV-15, DUR-1, DUR-7: memory appends reach the device only in full pages; flush and
    close write the partial page (padded, PARTIAL); a clean reopen has everything."""
    path = tmp_path / "r.img"
    with new_ring(path, 8) as store:
        t = store.topic("t", durability="memory")
        io: Any = hooks(store, BlockdevBackend).io  # the writer's own queue
        for i in range(30):
            t.append(bytes([i]) * 40)  # ~43 bytes each: 10 per 448-byte page
        assert io.stats.page_writes == 2 and io.stats.records == 20
        store.flush()
        assert io.stats.page_writes == 3 and io.stats.records == 30
        t.append(b"last")
    image = path.read_bytes()
    rid = ring_id_of(image)
    headers = [decode_trailer(page_of(image, i), rid) for i in range(4)]
    assert [h.flags if h else None for h in headers] == [0, 0, 1, 1]  # PARTIAL at flush, close
    with tidelog.open(uri(path)) as store:
        assert store.topic("t").state().head_seq == 31


def test_BDEV_15_fsync_reads_only_what_is_on_the_device(tmp_path: Path) -> None:
    """BDEV-15, DUR-2: an fsync append returns with its page written and synced; every fsync
    commit is one page write."""
    with new_ring(tmp_path / "r.img", 8) as store:
        t = store.topic("t", durability="fsync")
        io: Any = hooks(store, BlockdevBackend).io  # the writer's own queue
        for i in range(5):
            t.append(bytes([i]))
            assert io.records_durable == i + 1
        assert io.stats.page_writes == 5


class _GatedHandle:
    def __init__(self, inner: Any, fs: _GateFS) -> None:
        self._inner, self._fs = inner, fs

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def fdatasync(self) -> None:
        if self._fs.armed:
            self._fs.armed = False
            self._fs.entered.set()
            self._fs.release.wait(10)
        self._inner.fdatasync()


class _GateFS(OsFS):
    """OsFS whose handles block in the first fdatasync after ``armed`` until released."""

    def __init__(self) -> None:
        self.armed = False
        self.entered = threading.Event()
        self.release = threading.Event()

    def open(self, path: str, *, create: bool = True) -> Any:
        return _GatedHandle(super().open(path, create=create), self)


def test_BDEV_15_group_commit(tmp_path: Path) -> None:
    """BDEV-15: while one fsync append's page is being synced, other threads append; the next
    leader writes one page holding all of their records (one write, one sync for all)."""
    from tidelog.backends.blockdev import open_store

    fs = _GateFS()
    store = open_store(fs, str(tmp_path / "r.img"), FakeClock(1), size=4096 + 8 * 4096)
    t = store.topic("default", durability="fsync")
    io: Any = hooks(store, BlockdevBackend).io  # the writer's own queue
    fs.armed = True
    first = threading.Thread(target=t.append, args=(b"first",))
    first.start()
    assert fs.entered.wait(10)
    others = [threading.Thread(target=t.append, args=(bytes([65 + i]),)) for i in range(5)]
    for th in others:
        th.start()
    deadline = 200
    while hooks(store, BlockdevBackend).journal.records_added < 6 and deadline:
        threading.Event().wait(0.01)
        deadline -= 1
    fs.release.set()
    for th in [first, *others]:
        th.join(10)
    assert io.records_durable == 6
    assert io.stats.page_writes == 2  # "first", then one page with the five others
    assert sorted(r.payload for r in t.read() if isinstance(r, Record)) == sorted(
        [b"first", *[bytes([65 + i]) for i in range(5)]]
    )
    store.close()


# -- one topic per device, capabilities (BDEV-18) ------------------------------------------------
def test_BDEV_18_one_topic_per_device(tmp_path: Path) -> None:
    """BDEV-18, CAP-1: the bound topic only; other names, deletes, queue mode, a seventh
    subscriber and classes the ring does not offer are refused with clear errors."""
    with new_ring(tmp_path / "r.img", 8) as store:
        caps = store.capabilities
        assert (caps.multi_topic, caps.deletes, caps.queue, caps.exact_progress) == (
            False, False, False, False,
        )  # fmt: skip
        assert caps.persistent and caps.crash_safe and caps.subscribers
        assert caps.durability == frozenset({"memory", "fsync"})
        assert store.topics() == []
        with pytest.raises(NotAvailable, match="holds one topic, 't'"):
            store.topic("other")
        with pytest.raises(NoSuchTopic, match="only topic 't'"):
            store.topic("other", create=False)
        with pytest.raises(BadOption, match="durability 'disk'"):
            store.topic("t", durability="disk")
        with pytest.raises(NotAvailable, match="queue"):
            store.topic("t", max_deliveries=2, dead_letter="dlq")
        t = store.topic("t")
        assert store.topics() == ["t"]
        t.append(b"x")
        with pytest.raises(NotAvailable, match="deletes"):
            t.delete(2)
        with pytest.raises(NotAvailable, match="queue"):
            t.claim("n")
        for i in range(6):
            t.subscribe(f"s{i}")
        with pytest.raises(NotAvailable, match="at most 6"):
            t.subscribe("s6")
        store.drop_topic("t")
        assert store.topics() == []
        assert store.topic("t").state().head_seq == 0


def test_BDEV_4_full_slot_degrades_to_at_least_once(tmp_path: Path) -> None:
    """BDEV-4, BDEV-18 (exact_progress False), SUB-9: out-of-order acks that fit the 2 KiB slot
    survive a clean reopen exactly; too many are left out of it, and after the reopen those
    records are delivered again (at-least-once): the hwm is kept, nothing is lost."""
    path = tmp_path / "r.img"
    with new_ring(path, 64, page_size=4096) as store:
        t = store.topic("t", durability="memory", trim="none")
        t.append_many([bytes([i % 251]) * 20 for i in range(800)])
        few, many = t.subscribe("few", start="earliest"), t.subscribe("many", start="earliest")
        for q in range(2, 21, 2):
            few.ack(q)
        for q in range(2, 801, 2):
            many.ack(q)
    with tidelog.open(uri(path)) as store:
        t = store.topic("t")
        few, many = t.subscriber("few"), t.subscriber("many")
        assert few.hwm == many.hwm == 0
        assert [r.seq for r in few.poll(15)] == [1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 22, 23,
                                                 24, 25]  # fmt: skip
        got = [r.seq for r in many.poll(1000)]
        assert got == list(range(1, 801))  # the acked ones again, in order, none missing
        many.commit(800)
        assert many.hwm == 800


# -- write amplification (BDEV-19) ------------------------------------------------------------
def _amplification(
    tmp: Path, cls: str, size: int, count: int = 300, batch: int = 1
) -> dict[str, Any]:
    path = tmp / f"wa-{cls}-{size}-{batch}.img"
    with new_ring(path, 2048, page_size=4096) as store:
        t = store.topic("t", durability=cls)
        before = dict(hooks(store, IoCounters).io_stats())  # type: ignore[attr-defined]
        for i in range(0, count, batch):
            t.append_many([bytes([i % 256]) * size] * batch)
        store.flush()
        after = hooks(store, IoCounters).io_stats()
    dev = after["device_bytes_written"] - before["device_bytes_written"]
    payload = after["payload_bytes_written"] - before["payload_bytes_written"]
    pages = after["page_writes"] - before["page_writes"]
    metas = after["meta_writes"] - before["meta_writes"]
    assert dev == pages * 4096 + metas * SLOT_BYTES and payload == count * size
    return {"wa": dev / payload, "wa_pages": pages * 4096 / payload,
            "pages_per_1000": pages * 1000 / count}  # fmt: skip


def test_BDEV_19_write_amplification_measured(tmp_path: Path) -> None:
    """BDEV-15, BDEV-19: device bytes per payload byte and page writes per 1000 records, 100 B
    and 1 KiB records on 4 KiB pages (bench/blockdev_wa.py prints the same for the notes):
    memory packs full pages (39 or 3 records each); fsync writes one page per commit, so single
    appends cost a page each and append_many(10) one page per 10 (100 B) or four (1 KiB)."""
    got = {}
    for cls, batch in (("memory", 1), ("fsync", 1), ("fsync", 10)):
        for size in (100, 1024):
            m = _amplification(tmp_path, cls, size, batch=batch)
            got[cls, batch, size] = m
            print(
                f"{cls:6s} x{batch:<3d} {size:5d} B records: write amplification "
                f"{m['wa']:7.3f}, page writes per 1000 records {m['pages_per_1000']:7.1f}"
            )
    per_page = {100: 39, 1024: 3}  # (4096 - 64) // encoded size (103 and 1028 bytes)
    for size, n in per_page.items():
        pages = -(-300 // n)  # full pages, then the partial one the flush writes
        assert got["memory", 1, size]["pages_per_1000"] == pages * 1000 / 300
        assert got["fsync", 1, size]["pages_per_1000"] == 1000
    assert got["fsync", 10, 100]["pages_per_1000"] == 100
    assert got["fsync", 10, 1024]["pages_per_1000"] == 400
    # pages alone (the slots written meanwhile: num_pages 1..3 and the flush's)
    assert 1.0 < got["memory", 1, 100]["wa_pages"] < 1.1  # 4096 / (39 * 100)
    assert 1.33 < got["memory", 1, 1024]["wa_pages"] < 1.34  # 4096 / (3 * 1024)
    assert got["fsync", 1, 100]["wa_pages"] == 40.96 and got["fsync", 1, 1024]["wa_pages"] == 4


def test_BDEV_19_describe_and_inspect_show_it(tmp_path: Path) -> None:
    """BDEV-19: io_stats(store) (a snapshot with a write_amplification property),
    store.describe() and `tidelog inspect` (text and JSON) report the same counts; another
    backend's store has none (not_available)."""
    from tidelog.backends.blockdev import io_stats

    path = tmp_path / "r.img"
    with new_ring(path, 8) as store:
        store.topic("t", durability="memory").append_many([b"x" * 100] * 10)
        store.flush()
        stats = io_stats(store)
        facts = store.describe()
        # 1030+ bytes of records: two full 512-byte pages and the flushed partial third
        assert (stats.page_writes, stats.records, stats.payload_bytes) == (3, 10, 1000)
        assert stats.device_bytes == 3 * PAGE + stats.meta_writes * SLOT_BYTES
        assert stats.write_amplification == stats.device_bytes / 1000
        assert facts["write_amplification"] == stats.write_amplification
        assert facts["io"]["device_bytes_written"] == stats.device_bytes  # type: ignore[index]
        store.topic("t").append(b"more")
        store.flush()
        assert io_stats(store).records == 11
        assert stats.records == 10  # a snapshot: later writes do not change it
    session = io_stats(store)  # the close wrote the last page and the slot
    with tidelog.open(uri(path)) as store:
        assert io_stats(store).device_bytes == 0  # nothing written since this open
        assert io_stats(store, since="format") == session  # the slot counted all of it
        assert store.describe()["write_amplification_since_format"] == (
            session.device_bytes / session.payload_bytes
        )
        with pytest.raises(BadArgument):
            io_stats(store, since="boot")
    result = CliRunner().invoke(main, ["inspect", uri(path), "--json"])
    assert result.exit_code == 0, result.output
    assert '"page_count": 8' in result.output
    assert f'"write_amplification_since_format": {session.write_amplification}' in result.output
    text = CliRunner().invoke(main, ["inspect", uri(path)])
    assert text.exit_code == 0 and "write_amplification" in text.output, text.output
    with tidelog.open("memory://") as other, pytest.raises(NotAvailable, match="blockdev"):
        io_stats(other)


# -- direct I/O and the raw-device path (BDEV-11, BDEV-12, BDEV-20) ----------------------------
# A real block device needs root and losetup: tests/device/ (the `blockdev_device` nox session).
# Here the same code paths run on image files: O_DIRECT on an image (direct=on), and an image
# posing as a raw device (``is_block_device`` says yes), which takes the device path: size from
# lseek, direct=auto, never formatted without format=true, not even when it reads as zeros.


def _accepts_odirect(directory: Path) -> bool:
    probe = directory / f".tidelog-odirect-{os.getpid()}"
    try:
        fd = os.open(probe, os.O_RDWR | os.O_CREAT | getattr(os, "O_DIRECT", 0), 0o600)
    except OSError:
        return False
    try:
        buf = mmap.mmap(-1, 4096)  # page-aligned memory, as O_DIRECT needs
        try:
            return hasattr(os, "O_DIRECT") and os.pwrite(fd, buf, 0) == 4096
        except OSError:
            return False
        finally:
            buf.close()
    finally:
        os.close(fd)
        probe.unlink()


@pytest.fixture
def direct_dir(tmp_path: Path) -> Iterator[Path | None]:
    """A directory on a file system that accepts O_DIRECT (tmp_path, else /var/tmp, else
    /dev/shm), or None if none here does (then the tests check the refusal instead)."""
    if _accepts_odirect(tmp_path):
        yield tmp_path
        return
    for other in (Path("/var/tmp"), Path("/dev/shm")):
        if other.is_dir() and os.access(other, os.W_OK) and _accepts_odirect(other):
            with tempfile.TemporaryDirectory(dir=other, prefix="tidelog-direct-") as d:
                yield Path(d)
            return
    print("no file system here accepts O_DIRECT: checking that direct=on is refused")
    yield None


def _fd_is_direct(store: tidelog.Store) -> bool:
    handle: Any = hooks(store, BlockdevBackend).dev.handle
    return bool(fcntl.fcntl(handle.fd, fcntl.F_GETFL) & getattr(os, "O_DIRECT", 0))


def test_BDEV_20_direct_io_on_an_image(direct_dir: Path | None, tmp_path: Path) -> None:
    """BDEV-20: direct=on opens with O_DIRECT (checked on the open file descriptor); every
    transfer is aligned through a bounce buffer and survives a reopen; an unaligned write is
    refused like the kernel would; pages not aligned to the sectors make direct=on an error and
    direct=auto a warning; where the file system refuses O_DIRECT, direct=on is bad_option."""
    if direct_dir is None:
        path = tmp_path / "r.img"
        new_ring(path, 32, page_size=4096).close()
        with pytest.raises(BadOption, match="direct=on"):
            tidelog.open(uri(path, direct="on"))
        return
    path = direct_dir / "r.img"
    new_ring(path, 32, page_size=4096).close()
    with tidelog.open(uri(path, direct="on"), clock=FakeClock(1)) as store:
        assert store.describe()["direct_io"] is True and _fd_is_direct(store)
        t = store.topic("t", durability="fsync", trim="none")
        for i in range(20):
            t.append(bytes([i]) * 1000)
        sub = t.subscribe("s", start="earliest")
        sub.commit(7)
        sub.flush()  # a metadata write through the bounce buffer (whole block if sectors > 2 KiB)
    with tidelog.open(uri(path)) as store:
        t = store.topic("t")
        assert [r.payload for r in t.read() if isinstance(r, Record)] == [
            bytes([i]) * 1000 for i in range(20)
        ]
        assert t.subscriber("s").hwm == 7
    assert verify_image(OsFS(), str(path)).problems == []
    h = DeviceHandle(str(path), direct=True)
    try:
        assert h.direct
        with pytest.raises(OSError):
            h.pwrite(b"x" * 100, 4096)  # not a whole aligned block
        assert h.pread(10, 4096 + 5) == path.read_bytes()[4096 + 5 : 4096 + 15]
        align = h.align
    finally:
        h.close()
    small = direct_dir / "small.img"
    new_ring(small, 8).close()  # 512-byte pages
    if align > PAGE:
        with pytest.raises(BadOption, match="not a multiple"):
            tidelog.open(uri(small, direct="on"))
        with tidelog.open(uri(small, direct="auto")) as store:
            assert store.describe()["direct_io"] is False  # auto on an image: buffered
    else:
        with tidelog.open(uri(small, direct="on")) as store:
            assert store.describe()["direct_io"] is True


@pytest.fixture
def fake_device(monkeypatch: pytest.MonkeyPatch) -> Callable[[Path], None]:
    """Make the blockdev backend (and verify) take ``path`` for a raw block device."""
    from tidelog.backends.blockdev import device as device_mod
    from tidelog.backends.blockdev import verify as verify_mod

    devices: set[str] = set()
    real = device_mod.is_block_device

    def is_block_device(fs: Any, path: str) -> bool:
        return os.path.abspath(path) in devices or real(fs, path)

    monkeypatch.setattr(device_mod, "is_block_device", is_block_device)
    monkeypatch.setattr(verify_mod, "is_block_device", is_block_device)
    return lambda path: devices.add(str(path.resolve()))


def test_BDEV_11_BDEV_12_BDEV_20_raw_device_path(
    fake_device: Callable[[Path], None], direct_dir: Path | None, tmp_path: Path
) -> None:
    """BDEV-11, BDEV-12, BDEV-13, BDEV-20 on the device path: a device that reads as zeros is
    still never formatted without format=true (nothing written); size= is refused (the size is
    the device's); foreign data is Corrupt and untouched; format=true sizes the ring from the
    device (lseek) and uses O_DIRECT under direct=auto where the kernel allows; the ring then
    reopens, verifies, and refuses a page-size mismatch; a device too small is bad_option."""
    dev = (direct_dir or tmp_path) / "dev"
    dev.write_bytes(bytes(1 << 20))
    fake_device(dev)
    with pytest.raises(Corrupt, match="format=true"):
        tidelog.open(f"blockdev://{dev}")
    assert dev.read_bytes() == bytes(1 << 20)  # an all-zero device is not formatted unasked
    with pytest.raises(BadOption, match="comes from the device"):
        tidelog.open(f"blockdev://{dev}?size=64KiB&format=true")
    foreign = os.urandom(8192)
    dev.write_bytes(foreign + bytes((1 << 20) - 8192))
    with pytest.raises(Corrupt, match="not a tidelog ring"):
        tidelog.open(f"blockdev://{dev}?topic=t")
    assert dev.read_bytes()[:8192] == foreign
    with tidelog.open(f"blockdev://{dev}?format=true&topic=t", clock=FakeClock(1)) as store:
        facts = store.describe()
        assert facts["device"] == "device" and facts["formatted"] is True
        assert facts["page_count"] == 254  # (1 MiB - 4 KiB) // 4 KiB = 255, rounded to even
        assert facts["direct_io"] is (direct_dir is not None) and _fd_is_direct(store) is (
            direct_dir is not None
        )
        store.topic("t").append_many([b"x" * 100] * 100)
    with tidelog.open(f"blockdev://{dev}") as store:
        assert store.topic("t").state().head_seq == 100
        assert store.describe()["formatted"] is False
    assert verify_image(OsFS(), str(dev)).problems == []
    before = dev.read_bytes()
    with pytest.raises(BadOption, match="4096-byte pages"):
        tidelog.open(f"blockdev://{dev}?page_size=8192")
    assert dev.read_bytes() == before
    tiny = tmp_path / "tiny"
    tiny.write_bytes(bytes(4096 + 512))
    fake_device(tiny)
    with pytest.raises(BadOption, match="too small"):
        tidelog.open(f"blockdev://{tiny}?format=true&page_size=512")
    assert tiny.read_bytes() == bytes(4096 + 512)


# -- verify (BDEV-21) ---------------------------------------------------------------------------
def test_BDEV_21_verify(tmp_path: Path) -> None:
    """BDEV-21: a clean ring verifies; a torn slot and a torn page after the head are warnings;
    a corrupt page (valid CRC, bad entries) and a foreign file are errors; nothing is written."""
    path = tmp_path / "r.img"
    with new_ring(path, 4) as store:
        t = store.topic("t", durability="fsync")
        for i in range(6):
            t.append(bytes([i]) * 300)
    assert verify_image(OsFS(), str(path)).problems == []
    image = bytearray(path.read_bytes())
    slots = [decode_slot(bytes(image[i * SLOT_BYTES : (i + 1) * SLOT_BYTES]), i) for i in (0, 1)]
    newest = max(slots, key=lambda s: s.generation)
    off = ((newest.generation - 1) % 2) * SLOT_BYTES
    torn = bytearray(image)
    torn[off + 100 : off + 200] = os.urandom(100)
    torn[4096 + 2 * PAGE : 4096 + 3 * PAGE] = bytes(PAGE)  # the page after the head (page 1)
    path.write_bytes(bytes(torn))
    report = verify_image(OsFS(), str(path))
    # BDEV-22: neither can be told from a torn last write (nothing was written after them)
    assert report.ok and {(p.rule, p.offset) for p in report.warnings} == {
        ("BDEV-22", off),
        ("BDEV-22", 4096 + 2 * PAGE),
    }
    assert path.read_bytes() == bytes(torn)
    bad = bytearray(image)
    body = b"\x40\x00\x01x"
    h = PageHeader(6, 1, 0, newest.generation, 1, len(body), page_seq(1, 1, 4), 0, 1)
    bad[4096 + PAGE : 4096 + 2 * PAGE] = encode_page(PAGE, newest.ring_id, body, h)
    path.write_bytes(bytes(bad))
    report = verify_image(OsFS(), str(path))
    assert not report.ok and report.errors[0].rule == "BDEV-8"
    foreign = tmp_path / "foreign.bin"
    foreign.write_bytes(os.urandom(9000))
    report = verify_image(OsFS(), str(foreign))
    assert not report.ok and "not a tidelog ring" in str(report.errors[-1])
    result = CliRunner().invoke(main, ["blockdev", "verify", str(foreign)])
    assert result.exit_code == 1


def test_BDEV_11_cli_format(tmp_path: Path) -> None:
    """BDEV-11, BDEV-13: `tidelog blockdev format` creates or reformats (with --force only)."""
    path = tmp_path / "r.img"
    run = CliRunner()
    result = run.invoke(main, ["blockdev", "format", str(path), "--size", "64KiB", "--page-size",
                               "1024", "--topic", "events"])  # fmt: skip
    assert result.exit_code == 0, result.output
    assert "60 pages of 1024 bytes" in result.output
    result = run.invoke(main, ["blockdev", "format", str(path)])
    # a refusal is an error line on stderr, exit 2 (spec/CLI.md CLI-1, CLI-2)
    assert result.exit_code == 2 and "already holds a ring" in result.stderr
    assert "tidelog: error: bad_argument:" in result.stderr and not result.stdout
    result = run.invoke(main, ["blockdev", "format", str(path), "--force"])
    assert result.exit_code == 0 and "1024 bytes" in result.output
    assert run.invoke(main, ["blockdev", "verify", str(path)]).exit_code == 0


def test_BDEV_14_a_slot_never_names_seqs_of_an_op_whose_end_is_still_in_memory(
    tmp_path: Path,
) -> None:
    """BDEV-14, BDEV-10 (d), TOP-6, TOP-11 (stateful campaign seed 994787792): an
    ``append_many`` with a producer mark fills a page with its records, the mark (its
    BATCH_END) goes to the next, open page, and sealing the full page queues a metadata slot
    (BDEV-14: num_pages for the first pages). That slot must not record the op's seqs as
    written: after a power loss recovery discards the op (its end never reached the device),
    and a slot naming them made the ring refuse to open ("the metadata records seq 6 as
    written, but the ring ends at seq 4")."""
    uri = f"blockdev://{tmp_path / 'r.img'}?size={4096 + 6 * PAGE}&page_size={PAGE}&topic=t"
    clock = FakeClock()  # its default epoch: the ts widths that make page 1 fill as below
    store = tidelog.open(uri, clock=clock)
    t = store.topic("t", durability="memory")
    t.append_many([b"\x01" * 60])  # seq 1, page 0
    t.append_many([b"\x01" * 400])  # seq 2: page 0 is full and written, page 1 opens
    t.append(b"\x00")
    t.append(b"\x00", node="n0")  # seqs 3, 4 in page 1
    assert t.append_many([bytes(4), bytes(11)], node="n0", producer=("p0", 1)) == [5, 6]
    b: Any = hooks(store, BlockdevBackend)  # the ring's own slots
    assert b.ring.slots[1] == (2, 6)  # page 1 holds seqs 2-6 and was queued; the mark was not
    b.abandon()
    store = tidelog.open(uri, clock=clock)  # opens: the slot names no seq beyond the ring
    t = store.topic("t")
    assert t.state().head_seq == 4  # the op of seqs 5-6 never ended on the device: discarded
    written = [b"\x01" * 60, b"\x01" * 400, b"\x00", b"\x00"]
    assert [r.payload for r in t.read(0, 10)] == written  # type: ignore[union-attr]
    assert t.append_many([b"again"], producer=("p0", 1)) == [5]  # the mark went with its op
    store.close()
