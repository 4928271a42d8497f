"""Read-only views of a ring (spec/FORMATS-blockdev.md BDEV-28) and the commands that use them
(spec/CLI.md CLI-3): no lock, not a byte written, recovery in memory only, refresh reads the
ring again when the writer changed it. `tidelog inspect` and `tidelog tail --follow` beside a
writer process are in test_cli_process.py (parametrized over file:// and blockdev://)."""

from __future__ import annotations

import hashlib
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

import tidelog
from tidelog.backends.blockdev import open_store
from tidelog.backends.blockdev import store as store_module
from tidelog.backends.blockdev.store import BlockdevBackend
from tidelog.cli import main
from tidelog.clock import FakeClock
from tidelog.errors import BadOption, Corrupt, ReadOnly, StorageError
from tidelog.fsio import OsFS
from tidelog.hooks import Abandon, hooks
from tidelog.records import Record, Tombstone

PAGE = 512
WAIT = 20.0  # seconds any single expectation may take on a loaded machine


def ring_uri(path: Path, pages: int = 16, **query: object) -> str:
    extra = "".join(f"&{k}={v}" for k, v in query.items())
    return f"blockdev://{path}?size={4096 + pages * PAGE}&page_size={PAGE}&topic=events{extra}"


def view(path: Path) -> tidelog.Store:
    return tidelog.open(f"blockdev://{path}?readonly=true")


def digest(path: Path) -> tuple[int, str]:
    return path.stat().st_mtime_ns, hashlib.sha256(path.read_bytes()).hexdigest()


def payloads(items: list[Record | Tombstone]) -> list[bytes]:
    return [r.payload for r in items if isinstance(r, Record)]


# -- in process ------------------------------------------------------------------------------
def test_BDEV_28_a_view_beside_the_writer(tmp_path: Path) -> None:
    """BDEV-28, XPR-1: a view opens while a writer holds the ring (no lock), shows what is on
    the device, catches up on refresh (also across a wrap), refuses every op that would write
    (read_only), and its flush and close write nothing."""
    path = tmp_path / "r.img"
    writer = tidelog.open(ring_uri(path, pages=8))
    events = writer.topic("events", durability="fsync")
    events.append_many([b"a", b"b"])
    store = view(path)
    shown = store.topic("events", create=False)
    assert payloads(shown.read()) == [b"a", b"b"]
    events.append(b"c")
    assert payloads(shown.read()) == [b"a", b"b"]  # a view moves only on refresh
    store.refresh()
    assert payloads(shown.read()) == [b"a", b"b", b"c"]
    for k in range(40):  # one page each: the 8-page ring wraps several times
        events.append(b"x%d" % k)
    store.refresh()
    items = shown.read(0, 100)
    assert isinstance(items[0], Tombstone) and payloads(items)[-1] == b"x39"
    assert shown.state() == events.state()
    assert store.describe()["readonly"] is True
    for op in (
        lambda: shown.append(b"no"),
        lambda: shown.subscribe("s"),
        lambda: store.topic("other"),
        lambda: store.drop_topic("events"),
    ):
        with pytest.raises((ReadOnly, tidelog.NotAvailable)):
            op()
    final = events.state()
    writer.close()
    before = digest(path)
    store.refresh()
    store.flush()
    store.close()
    with view(path) as again:
        assert again.topic("events", create=False).state() == final
    assert digest(path) == before


def test_BDEV_28_recovery_in_memory_only(tmp_path: Path) -> None:
    """BDEV-28, BDEV-17: a crash image whose slot records progress past the recovered head (a
    writer's recovery would clamp it and write the slot) opens as a view with the same state a
    writer recovers, and the image stays byte-identical (a writer's open changes it)."""
    path = tmp_path / "r.img"
    store = tidelog.open(ring_uri(path), clock=FakeClock(1000))
    t = store.topic("events", durability="memory")
    sub = t.subscribe("s")
    t.append_many([b"m%d" % k for k in range(3)])
    sub.commit(3)
    sub.flush()  # the slot's hwm covers seqs still only in the open page
    hooks(store, Abandon).abandon()
    before = digest(path)
    with view(path) as seen:
        topic = seen.topic("events", create=False)
        state, items = topic.state(), topic.read()
    assert digest(path) == before
    with tidelog.open(f"blockdev://{path}") as writer:
        assert writer.topic("events").state() == state
        assert writer.topic("events").read() == items
    assert digest(path) != before  # the writer did write: the view's check is not vacuous


def test_BDEV_28_refusals_create_nothing(tmp_path: Path) -> None:
    """BDEV-28, BDEV-13: readonly=true never formats: format=true is bad_option, a missing
    image is io_error (nothing created, even with size=), an all-zero image io_error "holds no
    ring yet" (left as it was), a damaged ring corrupt naming the offset (after its re-reads)."""
    missing = tmp_path / "missing.img"
    with pytest.raises(BadOption, match="format=true"):
        tidelog.open(f"blockdev://{missing}?readonly=true&format=true&size=64KiB")
    with pytest.raises(StorageError, match="does not exist") as exc:
        tidelog.open(f"blockdev://{missing}?readonly=true&size=64KiB")
    assert exc.value.errno == 2
    zeros = tmp_path / "zeros.img"
    zeros.write_bytes(bytes(64 << 10))
    with pytest.raises(StorageError, match="holds no ring yet"):
        view(zeros)
    assert zeros.read_bytes() == bytes(64 << 10)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["zeros.img"]
    damaged = tmp_path / "d.img"
    with tidelog.open(ring_uri(damaged)) as store:
        store.topic("events").append_many([b"x" * 100] * 6)
    image = bytearray(damaged.read_bytes())
    image[4096 + 7] ^= 1  # page 0, proven written by the pages after it
    damaged.write_bytes(bytes(image))
    with pytest.raises(Corrupt, match="byte offset 4096:"):
        view(damaged)


def test_BDEV_28_refresh_reads_the_ring_only_when_it_changed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """BDEV-28: a refresh that finds the metadata block and the next page unchanged does not
    read the ring again; a page write or a slot write (a subscriber's flush) makes it."""
    path = tmp_path / "r.img"
    writer = tidelog.open(ring_uri(path))
    events = writer.topic("events", durability="fsync")
    sub = events.subscribe("s", start="earliest")
    events.append(b"a")
    store = view(path)
    reads = []
    real = BlockdevBackend._open_view

    def counted(self: BlockdevBackend) -> None:
        reads.append(1)
        real(self)

    monkeypatch.setattr(BlockdevBackend, "_open_view", counted)
    for _ in range(3):
        store.refresh()
    assert reads == []
    events.append(b"b")
    store.refresh()
    assert len(reads) == 1 and payloads(store.topic("events").read()) == [b"a", b"b"]
    sub.commit(2)
    sub.flush()  # a slot write only
    store.refresh()
    assert len(reads) == 2
    store.close()
    writer.close()


def test_BDEV_28_a_page_the_scan_read_unwritten_is_looked_at_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """BDEV-28: the writer finishes a page just after a view's scan read it still unwritten.
    The view remembers the page as its scan saw it, so the next refresh finds it changed and
    reads the ring again. It used to remember the page as it was after the scan, found no
    change at the next refreshes and stalled there until the writer's next slot write (a
    `tail --follow` of a ring showed the first records and then nothing)."""
    path = tmp_path / "r.img"
    writer = tidelog.open(ring_uri(path))
    events = writer.topic("events", durability="fsync")
    for i in range(12):  # about four records a page: three pages, the slot not told of all
        events.append(bytes([65 + i]) * 100)
    last = hooks(writer, BlockdevBackend).ring.next_index - 1  # the page written last
    real = BlockdevBackend._plan

    def scan_before_the_write(self: BlockdevBackend, slot: Any) -> Any:
        pages = store_module.read_pages

        def unwritten(handle: Any, where: str, geometry: Any) -> Any:
            read = pages(handle, where, geometry)
            return lambda i: bytes(geometry.page_size) if i == last else read(i)

        monkeypatch.setattr(store_module, "read_pages", unwritten)
        try:
            return real(self, slot)
        finally:
            monkeypatch.setattr(store_module, "read_pages", pages)

    monkeypatch.setattr(BlockdevBackend, "_plan", scan_before_the_write)
    store = view(path)
    behind = store.topic("events").state().head_seq
    assert 0 < behind < 12  # the last page read as not yet written
    monkeypatch.setattr(BlockdevBackend, "_plan", real)
    store.refresh()
    assert payloads(store.topic("events").read()) == [bytes([65 + i]) * 100 for i in range(12)]
    store.close()
    writer.close()


def test_BDEV_28_a_view_never_fails_on_a_ring_being_written(tmp_path: Path) -> None:
    """BDEV-28: refreshes racing a writer thread that keeps appending (pages written while the
    view reads them) never raise corrupt and always show a run of what was appended,
    byte-identical."""
    path = tmp_path / "r.img"
    writer = tidelog.open(ring_uri(path, pages=64))
    events = writer.topic("events", durability="fsync")
    events.append(b"p0")
    done = threading.Event()

    def write() -> None:
        k = 1
        while not done.is_set() and k < 3000:
            events.append(b"p%d" % k)
            k += 1

    thread = threading.Thread(target=write, daemon=True)
    thread.start()
    try:
        with view(path) as store:
            shown = store.topic("events", create=False)
            end = time.monotonic() + 3.0
            refreshes = 0
            while time.monotonic() < end and thread.is_alive():
                store.refresh()
                items = shown.read(0, 10_000)
                got = [r for r in items if isinstance(r, Record)]
                assert all(r.payload == b"p%d" % (r.seq - 1) for r in got)
                assert [r.seq for r in got] == list(range(got[0].seq, got[0].seq + len(got)))
                refreshes += 1
    finally:
        done.set()
        thread.join(timeout=WAIT)
        writer.close()
    assert refreshes > 5


class _FirstReadsTorn:
    """An FS whose read-only handles return the ring's pages from ``torn`` for their first
    ``times`` reads of the pages: what a view may read while a writer is mid-write."""

    def __init__(self, torn: bytes, times: int) -> None:
        self.fs = OsFS()
        self.torn = torn
        self.left = times

    def __getattr__(self, name: str) -> Any:
        return getattr(self.fs, name)

    def open_read(self, path: str) -> Any:
        handle = self.fs.open_read(path)
        outer = self

        class Handle:
            def __getattr__(self, name: str) -> Any:
                return getattr(handle, name)

            def pread(self, size: int, offset: int) -> bytes:
                if offset >= 4096 and outer.left > 0:
                    outer.left -= 1
                    return outer.torn[offset : offset + size]
                return handle.pread(size, offset)

        return Handle()


def test_BDEV_28_a_ring_read_mid_write_is_read_again(tmp_path: Path) -> None:
    """BDEV-28: a view whose first reads catch pages out of order (a later page written, an
    earlier one not yet: what BDEV-22 (a) calls damage) reads the ring again and opens; if the
    damage is still there after its re-reads, it raises corrupt naming the offset."""
    path = tmp_path / "r.img"
    with tidelog.open(ring_uri(path)) as store:
        store.topic("events").append_many([b"x" * 100] * 6)
    image = path.read_bytes()
    torn = bytearray(image)
    torn[4096 + PAGE : 4096 + 2 * PAGE] = bytes(PAGE)  # page 1 "not yet written", 2.. written
    seen = open_store(_FirstReadsTorn(bytes(torn), 2), str(path), readonly=True)  # type: ignore[arg-type]
    try:
        assert seen.topic("events", create=False).state().head_seq == 6
    finally:
        seen.close()
    with pytest.raises(Corrupt, match=f"byte offset {4096 + PAGE}:"):
        open_store(_FirstReadsTorn(bytes(torn), 100), str(path), readonly=True)  # type: ignore[arg-type]
    assert path.read_bytes() == image


# -- the commands (beside a live writer process: tests/unit/test_cli_process.py) ----------------
def test_CLI_3_inspect_and_tail_leave_a_ring_byte_identical(tmp_path: Path) -> None:
    """CLI-3, BDEV-28: `inspect` and `tail` of a ring a killed writer left (a crash image
    whose recovery, for a writer, rewrites the slot) change no byte and no mtime, and inspect
    says it read through a read-only view."""
    path = tmp_path / "r.img"
    store = tidelog.open(ring_uri(path), clock=FakeClock(1000))
    t = store.topic("events", durability="memory")
    sub = t.subscribe("s")
    t.append_many([b"a", b"b", b"c"])
    sub.commit(3)
    sub.flush()  # progress past what the device holds
    hooks(store, Abandon).abandon()
    before = digest(path)
    uri = f"blockdev://{path}"
    runner = CliRunner()
    result = runner.invoke(main, ["inspect", uri])
    assert result.exit_code == 0, result.output
    assert "(read-only view)" in result.stdout
    result = runner.invoke(main, ["tail", uri, "events"])
    assert result.exit_code == 0, result.output
    assert digest(path) == before
