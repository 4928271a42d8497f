"""The recovered WAL tail served from the mapped WAL files (spec/FORMATS-wal-tail.md WTAIL):
after a crash the writer's replay locates records in the WAL instead of copying them, reads and
deletes work on them as on any record, the next checkpoint seals them, and a read-only view
still reads with copies (XPR-1)."""

from __future__ import annotations

import mmap
import os
from pathlib import Path
from typing import Any

import pytest

import tidelog
from tidelog.backends.file import FileBackend
from tidelog.backends.file import checkpoint as ckpt
from tidelog.backends.file.format import snapshot as snapfmt
from tidelog.backends.file.walchunk import WalChunk
from tidelog.hooks import hooks

OPTS = "background=false&prealloc=none"


def _backend(store: tidelog.Store) -> FileBackend:
    """The file backend itself: these tests look at its own internals (by its class, REG-5)."""
    return hooks(store, FileBackend)


def _all(t: Any, exclude_node: str | None = None) -> list[tuple[Any, ...]]:
    return [
        (r.seq, r.ts, r.tag, r.node, r.payload)
        for r in t.read(0, limit=10**6, exclude_node=exclude_node)
        if hasattr(r, "payload")
    ]


def _crashed_store(root: Path) -> tuple[str, list[tuple[Any, ...]], list[tuple[Any, ...]]]:
    """A store with an unsealed WAL tail of every record shape (APPEND_BATCH runs with and
    without labels, single APPEND frames, an empty payload), abandoned like a SIGKILL. Returns
    its URI and the records of topics "a" and "b" as they were read before the crash."""
    uri = f"file://{root}?{OPTS}"
    store = tidelog.open(uri)
    a = store.topic("a", durability="fsync")
    b = store.topic("b", durability="fsync")
    a.append_many([b"p%d" % i for i in range(300)])
    a.append(b"single-1")
    a.append_many([b"t%d" % i * (i % 7) for i in range(50)], tag="x")
    b.append_records([(b"r1", None, "n1"), (b"r2", None, "n1"), (b"r3", "y", None)])
    a.append(b"")
    a.append_many([b"z" * 5000, b"q"], tag="y")
    b.append_many([b"b%d" % i for i in range(10)])
    want_a, want_b = _all(a), _all(b)
    _backend(store).abandon()
    return uri, want_a, want_b


def test_WTAIL_1_recovered_tail_is_served_from_the_wal_map(tmp_path: Path) -> None:
    """WTAIL-1: after a crash every replayed record is located in a mapped WAL file (no
    payload object held per record); reads return exactly what was written, labels, ts and
    node filters included."""
    uri, want_a, want_b = _crashed_store(tmp_path / "s")
    store = tidelog.open(uri)
    try:
        b = _backend(store)
        for name in ("a", "b"):
            log = b.topics[name].log
            assert log.payloads == [] and log.chunks
            assert all(isinstance(c, WalChunk) for c in log.chunks)
        assert _all(store.topic("a")) == want_a
        assert _all(store.topic("b")) == want_b
        assert _all(store.topic("b"), exclude_node="n1") == [r for r in want_b if r[3] != "n1"]
        for limit in (1, 7, 300, 301):  # reads stopping inside and at the end of runs
            got = store.topic("a").read(0, limit=limit)
            assert (
                [(r.seq, r.payload) for r in got]
                == [  # type: ignore[union-attr]
                    (r[0], r[4]) for r in want_a[:limit]
                ]
            )
        state = store.topic("a").state()
        assert state.count == len(want_a) and state.bytes == sum(len(r[4]) for r in want_a)
        assert store.topic("a").append(b"after") == want_a[-1][0] + 1  # appends go on in memory
        assert _all(store.topic("a"))[-1][4] == b"after"
    finally:
        store.close()


def test_WTAIL_4_checkpoint_seals_the_recovered_tail(tmp_path: Path) -> None:
    """WTAIL-4, WTAIL-2: deletes work on located records; the next checkpoint seals them into
    segments (no WalChunk left), retires the replayed WAL files, and a reopen gives the same
    records."""
    uri, want_a, _ = _crashed_store(tmp_path / "s")
    store = tidelog.open(uri)
    a = store.topic("a")
    assert a.delete(tag="x") == 50
    assert a.delete(before_seq=11) == 10
    want = [r for r in want_a if r[2] != "x" and r[0] >= 11]
    assert _all(a) == want
    replayed = sorted((tmp_path / "s" / "wal").glob("wal-*.log"))
    _backend(store).checkpoint()
    log = _backend(store).topics["a"].log
    assert log.chunks and not any(isinstance(c, WalChunk) for c in log.chunks)
    assert not any(p.exists() for p in replayed[:-1])  # retired once sealed
    assert _all(a) == want
    store.close()
    with tidelog.open(uri) as store:
        assert _all(store.topic("a")) == want


def test_WTAIL_4_records_removed_while_sealing_stay_removed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """WTAIL-4: slots that die between the checkpoint's capture and the swap are killed in the
    new segments (the live state in memory stays authoritative), and stay dead after reopen."""
    uri, want_a, _ = _crashed_store(tmp_path / "s")
    store = tidelog.open(uri)
    write = ckpt._write_segments
    deleted: list[int] = []

    def racing(b: FileBackend, tail: Any) -> None:
        if tail.source is not None and not deleted:
            deleted.append(store.topic("a").delete(before_seq=101))
        write(b, tail)

    monkeypatch.setattr(ckpt, "_write_segments", racing)
    _backend(store).checkpoint()
    assert deleted == [100]
    want = [r for r in want_a if r[0] >= 101]
    assert _all(store.topic("a")) == want
    assert store.topic("a").state().count == len(want)
    store.close()
    with tidelog.open(uri) as store:
        assert _all(store.topic("a")) == want


def test_WTAIL_3_a_wal_frame_changed_after_replay_fails_the_seal(tmp_path: Path) -> None:
    """WTAIL-3: sealing re-checks every frame it reads from the map, so bytes that changed
    after replay never get a segment checksum of their own: the checkpoint fails with Corrupt
    and the old snapshot (with its WAL) stays the store's state."""
    uri, _, _ = _crashed_store(tmp_path / "s")
    store = tidelog.open(uri)
    b = _backend(store)
    snapshot = b.snapshot_n
    chunk = b.topics["a"].log.chunks[0]
    assert isinstance(chunk, WalChunk)
    fd = os.open(chunk.wal.path, os.O_WRONLY)
    try:
        os.pwrite(fd, b"\xff", chunk.data_at[0])  # the first payload byte of the first run
    finally:
        os.close(fd)
    with pytest.raises(tidelog.Corrupt, match="WTAIL-3"):
        _backend(store).checkpoint()
    assert b.snapshot_n == snapshot
    b.abandon()


def test_WTAIL_2_read_only_view_never_maps_the_wal(tmp_path: Path) -> None:
    """WTAIL-2, XPR-1: a read-only view of a crashed store replays into memory (pread, no
    map), so a writer truncating a WAL file can never fault it; it reads the same records."""
    uri, want_a, want_b = _crashed_store(tmp_path / "s")
    with tidelog.open(f"file://{tmp_path / 's'}?readonly=true") as view:
        b = _backend(view)
        assert not any(isinstance(c, WalChunk) for t in b.topics.values() for c in t.log.chunks)
        assert _all(view.topic("a")) == want_a and _all(view.topic("b")) == want_b
    with tidelog.open(uri) as store:
        assert _all(store.topic("a")) == want_a


def test_WTAIL_1_a_run_partly_in_the_snapshot_is_located_from_the_right_record(
    tmp_path: Path,
) -> None:
    """WTAIL-1: records a snapshot already holds are skipped inside a run: the located part
    starts at the right payload (the same records a read-only view's copying replay gives)."""
    root = tmp_path / "s"
    uri = f"file://{root}?{OPTS}"
    store = tidelog.open(uri)
    t = store.topic("t", durability="fsync")
    t.append(b"sealed")
    _backend(store).checkpoint()
    t.append_many([b"r%d-" % i + b"x" * (i % 5) for i in range(100)])  # one frame, seqs 2..101
    want = _all(t)
    _backend(store).abandon()
    meta = root / "meta"
    path = max(meta.glob("snapshot-*.bin"))
    n, body = snapfmt.decode_snapshot(path.read_bytes())
    (topic,) = body["topics"]
    topic["head"] = 41  # as if seqs 2..41 were sealed: they are not (read as gone), 42.. replay
    path.write_bytes(snapfmt.encode_snapshot(n, body))
    with tidelog.open(f"file://{root}?readonly=true") as view:
        copied = _all(view.topic("t"))
    store = tidelog.open(uri)
    try:
        got = _all(store.topic("t"))
        assert got == copied == [want[0]] + [r for r in want if r[0] >= 42]
        assert isinstance(_backend(store).topics["t"].log.chunks[-1], WalChunk)
    finally:
        _backend(store).abandon()


def test_WTAIL_1_caps_evict_located_records(tmp_path: Path) -> None:
    """WTAIL-1, RET-1: a capped topic evicts its oldest located records like any others
    (sizes and deaths per record come from the run's length table)."""
    root = tmp_path / "s"
    uri = f"file://{root}?{OPTS}"
    store = tidelog.open(uri)
    t = store.topic("t", durability="fsync", cap_records=500, cap_bytes=4000)
    t.append_many([b"%03d" % i for i in range(400)])
    _backend(store).abandon()
    with tidelog.open(uri) as store:
        t = store.topic("t")
        t.append_many([b"new-%d" % i for i in range(300)])
        state = t.state()
        assert state.count <= 500 and state.bytes <= 4000
        items = t.read(0, limit=10**6)
        assert not hasattr(items[0], "payload")  # the evicted prefix reads as a tombstone
        records = [r for r in items if hasattr(r, "payload")]
        assert len(records) == state.count and records[-1].payload == b"new-299"
        assert sum(len(r.payload) for r in records) == state.bytes


def _mapped_rss_kib(path: str) -> int:
    """Resident kB of this process's mappings of ``path`` (/proc/self/smaps)."""
    total, inside = 0, False
    with open("/proc/self/smaps", encoding="utf-8") as f:
        for line in f:
            first = line.split(None, 1)[0]
            if "-" in first and not first.endswith(":"):  # a mapping's header line
                inside = line.rstrip("\n").endswith(" " + path)
            elif inside and first == "Rss:":
                total += int(line.split()[1])
    return total


def _resident_pages(path: str) -> set[int]:
    """Which pages of file ``path`` this process's mappings hold resident (/proc/self/maps,
    then the present bit of /proc/self/pagemap), as page numbers within the file."""
    page = mmap.PAGESIZE
    out: set[int] = set()
    with open("/proc/self/maps", encoding="utf-8") as maps, open("/proc/self/pagemap", "rb") as pm:
        for line in maps:
            if not line.rstrip("\n").endswith(" " + path):
                continue
            span, _, offset = line.split()[:3]
            lo, hi = (int(x, 16) for x in span.split("-"))
            pm.seek(lo // page * 8)
            entries = pm.read((hi - lo) // page * 8)
            first = int(offset, 16) // page
            for i in range(len(entries) // 8):
                if entries[i * 8 + 7] & 0x80:  # bit 63: present
                    out.add(first + i)
    return out


def _largest_folio_pages() -> int:
    """Pages in the largest page-cache folio the kernel may map at one fault (a PMD, 2 MiB
    on x86-64; one page where the kernel says nothing of it)."""
    try:
        with open("/sys/kernel/mm/transparent_hugepage/hpage_pmd_size", encoding="ascii") as f:
            return int(f.read()) // mmap.PAGESIZE
    except OSError:
        return 1


def _cache_in_large_folios(path: str) -> None:
    """Put ``path`` in the page cache again in the largest folios the kernel makes (a mapping
    asking for huge pages reads ahead in them), as a loaded machine's page cache may hold it;
    the mapping goes before this returns, so the process's resident set is as it was."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        with mmap.mmap(fd, 0, prot=mmap.PROT_READ) as m:
            if hasattr(mmap, "MADV_HUGEPAGE"):
                m.madvise(mmap.MADV_HUGEPAGE)
            for offset in range(0, len(m), mmap.PAGESIZE):
                m[offset]
    finally:
        os.close(fd)


def test_WTAIL_5_replayed_pages_leave_the_resident_set(tmp_path: Path) -> None:
    """WTAIL-5: after replay none of a WAL file's scanned pages stay resident in the process
    (they are in the page cache); a read faults back in only the pages it touches (the run's
    length table, the record's payload) and what the kernel maps with them: a page-cache folio
    is mapped whole, up to 2 MiB on Linux 6.x, so every resident page lies in an aligned 2 MiB
    window holding a touched page (a fixed bound of half the WAL failed on a loaded machine,
    where one read mapped a 1 MiB folio)."""
    root = tmp_path / "s"
    uri = f"file://{root}?{OPTS}"
    n, size = 16_000, 1000  # a 16 MB WAL: eight windows of 2 MiB, a read may map two
    store = tidelog.open(uri)
    store.topic("t", durability="fsync").append_many([os.urandom(size) for _ in range(n)])
    _backend(store).abandon()
    store = tidelog.open(uri)
    try:
        chunk = _backend(store).topics["t"].log.chunks[-1]
        assert isinstance(chunk, WalChunk) and len(chunk.starts) == 1  # one APPEND_BATCH run
        path = chunk.wal.path
        assert _mapped_rss_kib(path) == 0 and not _resident_pages(path)
        _cache_in_large_folios(path)
        assert not _resident_pages(path)
        (record,) = store.topic("t").read(n // 2, limit=1)
        assert record.seq == n // 2 + 1  # type: ignore[union-attr]
        page, folio = mmap.PAGESIZE, _largest_folio_pages()
        lens = range(chunk.lens_at[0] // page, (chunk.lens_at[0] + 4 * n - 1) // page + 1)
        start = chunk.data_at[0] + n // 2 * size
        payload = range(start // page, (start + size - 1) // page + 1)
        windows = {p // folio for p in (*lens, *payload)}
        resident = _resident_pages(path)
        assert resident & set(payload)
        assert {p // folio for p in resident} <= windows, sorted(resident)
        assert _mapped_rss_kib(path) <= len(windows) * folio * page // 1024
    finally:
        store.close()
