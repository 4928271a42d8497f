"""WAL zero-ahead (backends/file/wal.py): small durable writes into a fallocated WAL file also
zero the next stretch of it, so later appends overwrite initialised blocks instead of converting
unwritten extents (bench/README.md's durable single-append target). It never changes what a
file holds: the bytes past the log's end stay zero (WAL-4), only large batches skip it, everything
reads back after a reopen, and the crash-simulation FS never sees it."""

from __future__ import annotations

import os
from pathlib import Path

import tidelog
from tidelog.backends.file import FileBackend, open_store
from tidelog.backends.file.format import wal as walfmt
from tidelog.backends.file.wal import ZERO_AHEAD
from tidelog.conformance.crashfs import RecordingFS
from tidelog.hooks import hooks


def _backend(store: tidelog.Store) -> FileBackend:
    """The file backend itself: these tests look at its own internals (by its class, REG-5)."""
    return hooks(store, FileBackend)


def _wal_file(root: Path) -> Path:
    (name,) = sorted(n for n in os.listdir(root / "wal") if walfmt.parse_file_name(n) is not None)
    return root / "wal" / name


def test_WAL_4_small_durable_writes_zero_ahead_and_keep_the_tail_zero(tmp_path: Path) -> None:
    root = tmp_path / "s"
    with tidelog.open(f"file://{root}?background=false&wal_file_bytes=4MiB") as store:
        t = store.topic("t", durability="fsync")
        shard = _backend(store).shards[0]
        for i in range(50):
            t.append(b"r%03d" % i * 25)
        zeroed = shard.stats["zeroed"]
        assert ZERO_AHEAD // 2 <= zeroed <= 2 * ZERO_AHEAD
        assert shard.stats["fdatasyncs"] >= 50  # still one fdatasync per durable append
        image = _wal_file(root).read_bytes()
        scanned = walfmt.scan_file(image)
        assert scanned.status == "clean"
        assert walfmt.first_nonzero(image, scanned.end) is None
        assert len(image) == 4 << 20  # preallocated once, never grown by the zeros
    with tidelog.open(f"file://{root}") as store:
        items = store.topic("t").read(0, 100)
        assert [r.payload for r in items] == [b"r%03d" % i * 25 for i in range(50)]


def test_large_batches_do_not_zero_ahead(tmp_path: Path) -> None:
    with tidelog.open(f"file://{tmp_path / 's'}?background=false") as store:
        t = store.topic("t", durability="fsync")
        shard = _backend(store).shards[0]
        before = shard.stats["zeroed"]
        for _ in range(5):
            t.append_many([b"x" * 4096] * 100)  # ~410 KB per write: bandwidth-bound
        assert shard.stats["zeroed"] == before


def test_small_batches_zero_ahead_once_per_window(tmp_path: Path) -> None:
    """append_many(1000) of 100-byte records (~104 KB per write) zeroes ahead too, but only
    once per ZERO_AHEAD of log, so at most about as many bytes as the frames themselves."""
    with tidelog.open(f"file://{tmp_path / 's'}?background=false") as store:
        t = store.topic("t", durability="fsync")
        shard = _backend(store).shards[0]
        before, written = shard.stats["zeroed"], shard.stats["bytes"]
        for _ in range(30):
            t.append_many([b"x" * 100] * 1000)
        zeroed = shard.stats["zeroed"] - before
        assert 0 < zeroed <= shard.stats["bytes"] - written + ZERO_AHEAD
        assert shard.stats["writes"] <= 32  # one write per batch: zeros ride along


def test_prealloc_zero_and_the_crash_simulation_fs_never_zero_ahead(tmp_path: Path) -> None:
    with tidelog.open(f"file://{tmp_path / 'z'}?background=false&prealloc=zero") as store:
        store.topic("t", durability="fsync").append(b"x")
        assert _backend(store).shards[0].stats["zeroed"] == 0
    fs = RecordingFS()
    store = open_store(fs, "/s", background=False)
    try:
        store.topic("t", durability="fsync").append(b"x")
        assert _backend(store).shards[0].stats["zeroed"] == 0
    finally:
        store.close()


def test_WAL_4_zero_after_reads_only_data_regions(tmp_path: Path) -> None:
    """WAL-4: ``zero_after`` is true for a file whose bytes past an offset are zeros (written
    zeros, or preallocated extents never written) and false as soon as one byte is not, deep
    in a preallocated tail too."""
    from tidelog.fsio import OsFS, zero_after

    path = str(tmp_path / "f")
    h = OsFS().open(path)
    try:
        h.allocate(8 << 20)
        h.pwrite(b"x" * 1000 + bytes(3000), 0)
        assert zero_after(h, 1000) and not zero_after(h, 999)
        h.pwrite(b"\x01", (6 << 20) + 5)
        assert not zero_after(h, 1000) and zero_after(h, (6 << 20) + 6)
    finally:
        h.close()


def test_WAL_15_crash_recovery_closes_the_recovered_file_with_FILE_END_and_never_cuts_it(
    tmp_path: Path,
) -> None:
    """WAL-15 (WAL-4 for version 3): after a crash, recovery neither truncates the newest WAL
    file nor needs its tail to be zero: it writes FILE_END at the log's end, so a stale complete
    frame far past the end (what a lost sector before it leaves) is never read, and the file
    keeps its size (no truncation, no journal commit). Every acknowledged record is back and
    verify is clean, with the stale frame still in the file."""
    from tidelog.backends.file.verify import verify_store
    from tidelog.fsio import OsFS

    for stale in (False, True):
        root = tmp_path / f"s{int(stale)}"
        uri = f"file://{root}?background=false&wal_file_bytes=8MiB"
        store = tidelog.open(uri)
        t = store.topic("t", durability="fsync")
        seqs = [t.append(b"rec-%d" % i) for i in range(20)]
        _backend(store).abandon()  # power loss: nothing else written
        wal_file = _wal_file(root)
        size = wal_file.stat().st_size
        image = wal_file.read_bytes()
        end = walfmt.scan_file(image).end
        frame = image[walfmt.HEADER_SIZE : walfmt.HEADER_SIZE + 64]  # a complete frame
        if stale:
            with open(wal_file, "r+b") as f:
                f.seek(6 << 20)
                f.write(frame)
        with tidelog.open(uri) as again:
            assert wal_file.stat().st_size == size  # recovered, before a checkpoint retires it
            after = walfmt.scan_file(wal_file.read_bytes())
            assert after.sealed and after.end == end + walfmt.FILE_END_SIZE
            assert (wal_file.read_bytes()[6 << 20 : (6 << 20) + 64] == frame) is stale
            assert verify_store(OsFS(), str(root)).problems == []
            got = again.topic("t").read(0, 100)
            assert [r.seq for r in got] == seqs
