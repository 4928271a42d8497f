"""Tiered storage of the file backend (spec/TIERING.md): options, the SegmentStore interface,
the cold layout, relocation and its interruptions, reclaim, cold reads off the store lock, the
manifest, its collection and the cold-only reader."""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import Any

import pyarrow.fs as pafs
import pytest

import tidelog
from tidelog.backends.file import coldread, segstore
from tidelog.backends.file.coldchunk import ColdChunk
from tidelog.backends.file.format import segment as segfmt
from tidelog.backends.file.format import snapshot as snapfmt
from tidelog.clock import FakeClock
from tidelog.errors import Corrupt, NotFound, StorageError
from tidelog.fsio import OsFS
from tidelog.hooks import Checkpoint, hooks
from tidelog.records import Record, Tombstone

SMALL = dict(segment_max_records=10, background=False, commit_interval_ms=1)


def _open(root: Path, cold: Any = None, clock: Any = None, **options: Any) -> tidelog.Store:
    opts: dict[str, Any] = {**SMALL, **options}
    if cold is not None:
        opts["cold"] = str(cold)
    return tidelog.open(f"file://{root}", clock=clock, **opts)


def _tick(store: tidelog.Store) -> None:
    """A checkpoint, then a tiering pass (what the maintenance thread does)."""
    hooks(store, Checkpoint).checkpoint()


def _backend(store: tidelog.Store) -> Any:
    return store._backend  # type: ignore[attr-defined]


def _fill(store: tidelog.Store, n: int, name: str = "t", **config: Any) -> tidelog.Topic:
    t = store.topic(name, **config)
    for lo in range(0, n, 5):
        t.append_many([b"p%05d" % i for i in range(lo, min(n, lo + 5))])
    return t


def _files(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file())


def _chunks(store: tidelog.Store, name: str = "t") -> list[Any]:
    return list(_backend(store).topics[name].log.chunks)


def _payloads(items: list[Any]) -> list[bytes]:
    return [i.payload for i in items if isinstance(i, Record)]


# -- TIER-1 options ------------------------------------------------------------------------------


def test_TIER_1_without_cold_nothing_relocates_and_the_snapshot_keeps_its_version(
    tmp_path: Path,
) -> None:
    """TIER-1: the retention options alone change nothing: every segment stays hot, no cold
    key enters the snapshot, whose schema version stays 1."""
    s = _open(tmp_path / "s", hot_retain_segments=0)
    _fill(s, 50)
    _tick(s)
    assert not any(isinstance(c, ColdChunk) for c in _chunks(s))
    s.close()
    meta = tmp_path / "s" / "meta"
    (snap,) = [p for p in meta.iterdir() if p.suffix == ".bin"]
    _, body = snapfmt.decode_snapshot(snap.read_bytes())
    assert body["version"] == 1 and "cold" not in body["topics"][0]


@pytest.mark.parametrize("cold", ["", "relative/dir", "nosuchscheme://x/y", "file://host/x"])
def test_TIER_1_a_cold_tier_that_cannot_be_opened_is_bad_option(tmp_path: Path, cold: str) -> None:
    """TIER-1: an empty or relative path, a URL pyarrow cannot open, a file:// URL with a host:
    bad_option naming the value, before the store exists."""
    with pytest.raises(tidelog.BadOption, match="TIER-1"):
        tidelog.open(f"file://{tmp_path}/s", cold=cold)
    assert not (tmp_path / "s").exists()


# -- TIER-2 the interface ------------------------------------------------------------------------


def _stores(tmp_path: Path) -> list[segstore.SegmentStore]:
    local = segstore.LocalSegmentStore(OsFS(), str(tmp_path / "local"))
    (tmp_path / "arrow").mkdir()
    arrow = segstore.ArrowSegmentStore(
        pafs.LocalFileSystem(), str(tmp_path / "arrow"), f"file://{tmp_path}/arrow"
    )
    sub = pafs.SubTreeFileSystem(str(tmp_path / "arrow"), pafs.LocalFileSystem())
    objects = segstore.ArrowSegmentStore(pafs.PyFileSystem(_Handler(sub)), "b", "py://b")
    return [local, arrow, objects]


@pytest.mark.parametrize("kind", [0, 1, 2])
def test_TIER_2_put_read_range_delete_list_exists_size(tmp_path: Path, kind: int) -> None:
    """TIER-2, for the local directory and pyarrow (a directory filesystem and an object-like
    one): a put is whole, ranges are exact, delete is idempotent, list is sorted and never shows
    a leftover .tmp."""
    store = _stores(tmp_path)[kind]
    store.put("a/x/2.data", b"0123456789")
    store.put("a/x/1.data", b"abc")
    store.put("a/y.idx", memoryview(b"zz"))
    assert store.read_range("a/x/2.data", 3, 4) == b"3456"
    assert store.read_range("a/x/2.data", 0, 0) == b""
    assert bytes(store.read_view("a/x/2.data", 3, 4)) == b"3456"
    assert store.read_view("a/x/2.data", 0, 10).readonly
    assert bytes(store.read_view("a/x/2.data", 0, 0)) == b""
    assert store.list("a/") == ["a/x/1.data", "a/x/2.data", "a/y.idx"]
    assert store.list("a/x/") == ["a/x/1.data", "a/x/2.data"]
    assert store.list("nothing/") == []
    assert store.exists("a/x/1.data") and not store.exists("a/x/3.data")
    assert store.size("a/x/2.data") == 10
    store.delete("a/x/1.data")
    store.delete("a/x/1.data")  # idempotent
    assert store.list("a/") == ["a/x/2.data", "a/y.idx"]


@pytest.mark.parametrize("kind", [0, 1, 2])
def test_TIER_2_a_short_or_failed_read_is_io_error_naming_url_and_key(
    tmp_path: Path, kind: int
) -> None:
    """TIER-2: reading past an object's end or a missing object is io_error naming the cold URL
    and the key, never fewer bytes."""
    store = _stores(tmp_path)[kind]
    store.put("k/obj", b"12345")
    with pytest.raises(StorageError, match=r"k/obj.*TIER-2") as exc:
        store.read_range("k/obj", 2, 10)
    assert exc.value.code == "io_error"
    with pytest.raises(StorageError, match="k/missing") as exc:
        store.read_range("k/missing", 0, 1)
    assert segstore.redact(store.url) in str(exc.value)
    for offset, length in ((2, 10), (6, 1)):
        with pytest.raises(StorageError, match=r"k/obj.*TIER-2") as exc:
            store.read_view("k/obj", offset, length)
        assert exc.value.code == "io_error"
    with pytest.raises(StorageError, match="k/missing") as exc:
        store.read_view("k/missing", 0, 1)


def test_TIER_2_secrets_in_a_cold_url_never_reach_a_message() -> None:
    """TIER-2: messages name the URL with its access keys and tokens masked."""
    url = "s3://b/p?access_key=AK&secret_key=SEKRET&endpoint_override=127.0.0.1:9"
    assert "SEKRET" not in segstore.redact(url) and "AK" not in segstore.redact(url)
    assert "endpoint_override=127.0.0.1" in segstore.redact(url)


# -- TIER-3 layout, TIER-4 eligibility, TIER-5 the steps -----------------------------------------


def test_TIER_3_TIER_5_a_relocated_segment_keeps_its_name_and_bytes(tmp_path: Path) -> None:
    """TIER-3, TIER-5: after a pass the oldest segments are under <cold>/<store_id>/topics/
    with the same names and bytes the hot tier had, the hot files are gone, a TIER frame and
    the snapshot record the flip (snapshot version 3), and every record reads back."""
    root, cold = tmp_path / "s", tmp_path / "cold"
    s = _open(root, cold, hot_retain_segments=2)
    _fill(s, 55)
    hooks(s, Checkpoint).checkpoint()
    # the first checkpoint sealed and relocated in one go; the bytes were sealed hot first
    sid = _backend(s).store_id.hex()
    tdir = root / "topics" / f"{1:016x}"
    hot = sorted(p.name for p in tdir.iterdir())
    assert hot == [segfmt.data_name(41), segfmt.idx_name(41), segfmt.data_name(51),
                   segfmt.idx_name(51)]  # fmt: skip
    cdir = cold / sid / "topics" / f"{1:016x}"
    assert sorted(p.name for p in cdir.iterdir()) == sorted(
        n for f in (1, 11, 21, 31) for n in (segfmt.data_name(f), segfmt.idx_name(f))
    )
    data = (cdir / segfmt.data_name(11)).read_bytes()
    header = segfmt.decode_data_header(data)
    assert (header.topic_id, header.first_seq) == (1, 11)
    assert _payloads(s.topic("t").read(after=0, limit=100)) == [b"p%05d" % i for i in range(55)]
    s.close()
    body = _snapshot_body(root)
    assert body["version"] == 3 and body["topics"][0]["cold"] == [1, 11, 21, 31]
    r = _open(root, cold)
    assert _payloads(r.topic("t").read(after=0, limit=100)) == [b"p%05d" % i for i in range(55)]
    r.close()


def _snapshot_body(root: Path) -> dict[str, Any]:
    meta = root / "meta"
    newest = max(p for p in meta.iterdir() if p.suffix == ".bin")
    return snapfmt.decode_snapshot(newest.read_bytes())[1]


def test_TIER_4_subscribers_routers_and_bytes_bound_what_relocates(tmp_path: Path) -> None:
    """TIER-4: a subscriber's hwm holds back every segment above it (and every newer one);
    hot_retain_bytes relocates beyond the byte bound; a topic's cold segments are its oldest."""
    s = _open(tmp_path / "s", tmp_path / "cold", hot_retain_segments=1)
    t = _fill(s, 60, trim="none")
    sub = t.subscribe("reader", start="earliest")
    sub.commit(25)  # segments 1..10 and 11..20 are done, 21..30 is not
    _tick(s)
    kinds = [type(c).__name__ for c in _chunks(s)]
    assert kinds == ["ColdChunk", "ColdChunk", "SegChunk", "SegChunk", "SegChunk", "SegChunk"]
    sub.commit(60)
    _tick(s)
    assert [type(c).__name__ for c in _chunks(s)] == ["ColdChunk"] * 5 + ["SegChunk"]
    size = _chunks(s)[-1].index.data_size  # every segment of 10 equal records has this size
    bound = 2 * size + 1
    b = _open(tmp_path / "b", tmp_path / "cold", hot_retain_segments=100, hot_retain_bytes=bound)
    _fill(b, 60)
    _tick(b)
    assert [type(c).__name__ for c in _chunks(b)] == ["ColdChunk"] * 4 + ["SegChunk"] * 2
    b.close()
    s.close()


def test_TIER_4_jobs_handed_out_hold_their_segments_hot(tmp_path: Path) -> None:
    """TIER-4: a queue's leased job keeps its segment (and every newer one) hot, while a topic
    without jobs in the same store relocates."""
    s = _open(tmp_path / "s", tmp_path / "cold", hot_retain_segments=0)
    t = _fill(s, 30)
    _fill(s, 30, name="plain")
    leases = t.claim("n", max=15)  # jobs 1..15 leased
    for lease in leases:
        if lease.seq != 10:
            t.complete(lease.seq, lease.lease_id)
    _tick(s)  # job 10 is still leased: nothing of t may go
    assert not any(isinstance(c, ColdChunk) for c in _chunks(s))
    assert [type(c).__name__ for c in _chunks(s, "plain")] == ["ColdChunk"] * 3
    s.close()


# -- TIER-6 interruptions ------------------------------------------------------------------------


class _Boom(Exception):
    pass


def test_TIER_6_interrupted_between_copy_and_flip_the_hot_copy_wins(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """TIER-6: a pass interrupted after the cold copy, before the flip: the reopened store
    reads everything from hot, and the next pass relocates over the orphan copy."""
    from tidelog.backends.file import journal

    root, cold = tmp_path / "s", tmp_path / "cold"
    s = _open(root, cold, hot_retain_segments=1)
    _fill(s, 30)
    _backend(s)._checkpoint()  # seal only, no pass yet

    def boom(*a: Any) -> None:
        raise _Boom

    monkeypatch.setattr(journal.WalJournal, "tiered", boom)
    with pytest.raises(_Boom):
        _tick(s)
    _backend(s).abandon()
    monkeypatch.undo()
    r = _open(root, cold, hot_retain_segments=1)
    assert not any(isinstance(c, ColdChunk) for c in _chunks(r))
    assert len(_payloads(r.topic("t").read(after=0, limit=100))) == 30
    _tick(r)
    assert [type(c).__name__ for c in _chunks(r)] == ["ColdChunk", "ColdChunk", "SegChunk"]
    assert len(_payloads(r.topic("t").read(after=0, limit=100))) == 30
    r.close()


def test_TIER_6_interrupted_between_flip_and_delete_hot_is_preferred_then_finished(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """TIER-6: a crash after the durable flip, before the hot files went: the reopened store
    opens the segment hot (hot preferred) but knows it is cold; the next pass only swaps and
    deletes (no second copy), and nothing is lost."""
    from tidelog.backends.file import relocate as rel

    root, cold = tmp_path / "s", tmp_path / "cold"
    s = _open(root, cold, hot_retain_segments=1)
    _fill(s, 30)
    real = rel.ColdChunk

    class Boom(real):  # type: ignore[misc,valid-type]
        def __init__(self, *a: Any, **k: Any) -> None:
            raise _Boom

    monkeypatch.setattr(rel, "ColdChunk", Boom)
    with pytest.raises(_Boom):
        _tick(s)
    _backend(s).abandon()
    monkeypatch.setattr(rel, "ColdChunk", real)
    r = _open(root, cold, hot_retain_segments=1)
    tiers = _backend(r).tiers
    assert tiers.cold[1] == {1, 11}  # replayed TIER frame
    assert not any(isinstance(c, ColdChunk) for c in _chunks(r))
    puts: list[str] = []
    orig_put = tiers.store.put
    monkeypatch.setattr(tiers.store, "put", lambda k, d: (puts.append(k), orig_put(k, d)))
    _tick(r)
    assert not [k for k in puts if "/topics/" in k]  # finished without copying again
    assert [type(c).__name__ for c in _chunks(r)] == ["ColdChunk", "ColdChunk", "SegChunk"]
    assert len(_payloads(r.topic("t").read(after=0, limit=100))) == 30
    r.close()


def test_TIER_6_without_the_cold_option_a_cold_segment_is_refused_with_a_hint(
    tmp_path: Path,
) -> None:
    """TIER-6: a store whose segments are cold refuses to open without cold= (corrupt naming
    the missing segment and asking for cold=), never opens with records missing."""
    root, cold = tmp_path / "s", tmp_path / "cold"
    s = _open(root, cold, hot_retain_segments=1)
    _fill(s, 30)
    _tick(s)
    s.close()
    with pytest.raises(tidelog.TidelogError, match="cold="):
        _open(root)


# -- TIER-7 reclaim -------------------------------------------------------------------------------


def test_TIER_7_reclaim_drops_whole_cold_segments_and_dropped_topics(tmp_path: Path) -> None:
    """TIER-7, TIER-10: a cap evicting the oldest cold segment and a topic drop remove their
    objects (grace 0), never rewrite one; the rest still reads."""
    clock = FakeClock(1_000)
    root, cold = tmp_path / "s", tmp_path / "cold"
    s = _open(root, cold, clock, hot_retain_segments=1, cold_grace_ms=0)
    t = _fill(s, 40, cap_records=40)
    _fill(s, 30, name="gone")
    _tick(s)
    sid = _backend(s).store_id.hex()
    tdir = cold / sid / "topics" / f"{1:016x}"
    assert segfmt.data_name(1) in os.listdir(tdir)
    t.append_many([b"more"] * 15)  # evicts seqs 1..15: segment 1..10 is all dead
    _tick(s)
    clock.advance(1)
    _tick(s)
    names = os.listdir(tdir)
    assert segfmt.data_name(1) not in names and segfmt.data_name(11) in names
    items = t.read(after=0, limit=100)
    assert items[0] == Tombstone(1, 15) and len(_payloads(items)) == 40
    gone = cold / sid / "topics" / f"{2:016x}"
    assert os.listdir(gone)
    s.drop_topic("gone")
    _tick(s)
    clock.advance(1)
    _tick(s)
    assert not gone.exists() or not os.listdir(gone)
    s.close()


# -- TIER-8 cold reads -------------------------------------------------------------------------


class _Stall:
    """A SegmentStore wrapper whose reads of .data objects wait until released."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.url = inner.url
        self.entered = threading.Event()
        self.release = threading.Event()

    def _wait(self, key: str) -> None:
        if key.endswith(".data"):
            self.entered.set()
            assert self.release.wait(30)

    def read_range(self, key: str, offset: int, length: int) -> bytes:
        self._wait(key)
        return self.inner.read_range(key, offset, length)

    def read_view(self, key: str, offset: int, length: int) -> memoryview:
        self._wait(key)
        return self.inner.read_view(key, offset, length)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


def test_TIER_8_a_stalled_cold_read_never_blocks_appends_or_the_live_tail(tmp_path: Path) -> None:
    """TIER-8: while a historical read is stuck fetching a cold segment, appends, a read of
    the hot tail, a live subscriber's poll and the state all complete; the stuck read then
    returns every record."""
    root, cold = tmp_path / "s", tmp_path / "cold"
    s = _open(root, cold, hot_retain_segments=1, cold_cache_segments=1)
    t = _fill(s, 40)
    live = t.subscribe("live", start="latest")
    _tick(s)
    b = _backend(s)
    stall = _Stall(b.tiers.store)
    b.tiers.store = stall
    for c in _chunks(s):
        if isinstance(c, ColdChunk):
            c.unload()
            c.store = stall
    got: list[Any] = []
    reader = threading.Thread(target=lambda: got.extend(t.read(after=0, limit=100)))
    reader.start()
    assert stall.entered.wait(10)
    seqs = [t.append(b"new%d" % i) for i in range(5)]  # would hang if the lock were held
    assert _payloads(t.read(after=40, limit=10)) == [b"new%d" % i for i in range(5)]
    assert [r.seq for r in live.poll(10)] == seqs
    assert t.state().head_seq == 45
    assert reader.is_alive()
    stall.release.set()
    reader.join(10)
    assert _payloads(got) == [b"p%05d" % i for i in range(40)] + [b"new%d" % i for i in range(5)]
    s.close()


def test_TIER_8_a_damaged_cold_object_is_corrupt_never_fewer_records(tmp_path: Path) -> None:
    """TIER-8: a cold .data whose bytes changed fails its check on the read (corrupt naming
    the object); a truncated one is io_error (TIER-2); neither returns fewer records."""
    root, cold = tmp_path / "s", tmp_path / "cold"
    s = _open(root, cold, hot_retain_segments=1)
    t = _fill(s, 30)
    _tick(s)
    sid = _backend(s).store_id.hex()
    path = cold / sid / "topics" / f"{1:016x}" / segfmt.data_name(11)
    raw = bytearray(path.read_bytes())
    raw[-20] ^= 0xFF
    path.write_bytes(bytes(raw))
    with pytest.raises(Corrupt, match=segfmt.data_name(11)):
        t.read(after=10, limit=5)
    path.write_bytes(bytes(raw[:-30]))
    for c in _chunks(s):
        if isinstance(c, ColdChunk):
            c.unload()
    with pytest.raises(StorageError, match="TIER-2"):
        t.read(after=10, limit=5)
    assert _payloads(t.read(after=0, limit=10)) == [b"p%05d" % i for i in range(10)]
    s.close()


def test_TIER_8_a_read_only_view_reads_cold_segments_with_the_cold_option(tmp_path: Path) -> None:
    """TIER-8, XPR-1: a read-only view opened with the same cold= reads the cold history."""
    root, cold = tmp_path / "s", tmp_path / "cold"
    s = _open(root, cold, hot_retain_segments=1)
    _fill(s, 35)
    _tick(s)
    v = _open(root, cold, readonly=True)
    assert len(_payloads(v.topic("t").read(after=0, limit=100))) == 35
    v.close()
    s.close()


# -- TIER-9..11 the manifest, its collection, the cold-only reader --------------------------------


def test_TIER_9_TIER_11_the_cold_only_reader_reads_history_with_tombstones(tmp_path: Path) -> None:
    """TIER-9, TIER-11: with only the cold URL, a reader sees what the store's own read shows
    for the cold seqs: the eviction tombstone below the floor, deleted seqs silent; the
    manifest names the store, the topic, its segment ranges, floor and dead ranges."""
    root, cold = tmp_path / "s", tmp_path / "cold"
    s = _open(root, cold, hot_retain_segments=1)
    t = _fill(s, 40, cap_records=40)
    _tick(s)  # 1..30 cold, 31..40 hot
    t.append_many([b"x"] * 5)  # evicts 1..5: floor 6
    t.delete(before_seq=14)  # 6..13 deleted: silent
    _tick(s)  # 41..45 sealed: 31..40 goes cold too
    own = [i for i in t.read(after=0, limit=1000) if not isinstance(i, Record) or i.seq <= 40]
    with coldread.open_cold(str(cold)) as view:
        assert view.topics() == ["t"]
        assert view.head("t") == 40
        got = view.read("t", after=0, limit=1000)
        assert got == own and got[0] == Tombstone(1, 5) and got[1].seq == 14
        assert view.read("t", after=20, limit=3) == own[8:11]
        assert [g["first_seq"] for g in view.segments("t")] == [11, 21, 31]
        assert _payloads(view.read_segment("t", 11)) == [b"p%05d" % i for i in range(13, 20)]
        manifest = view.manifest
    assert manifest["store_id"] == _backend(s).store_id.hex()
    entry = manifest["topics"][0]
    assert (entry["name"], entry["evict_floor"], entry["segments"]) == (
        "t",
        6,
        [[11, 20], [21, 30], [31, 40]],
    )
    assert entry["dead"] == [[11, 13]]
    s.close()


def test_TIER_10_a_pinned_version_stays_readable_for_the_grace_then_not_found(
    tmp_path: Path,
) -> None:
    """TIER-10: a reader that pinned a version reads all of it while the grace runs, though
    newer versions dropped its first segment; after the grace the version is gone: not_found,
    never fewer rows."""
    clock = FakeClock(1_000_000)
    root, cold = tmp_path / "s", tmp_path / "cold"
    s = _open(root, cold, clock, hot_retain_segments=1, cold_grace_ms=60_000)
    t = _fill(s, 40, cap_records=100)
    _tick(s)
    pinned = coldread.open_cold(str(cold)).version
    t.delete(before_seq=11)  # segment 1..10 all dead: reclaimed
    _tick(s)
    _tick(s)
    view = coldread.open_cold(str(cold), manifest=pinned)
    assert view.version < coldread.open_cold(str(cold)).version
    clock.advance(59_000)
    _tick(s)
    assert len(_payloads(view.read("t", after=0, limit=100))) == 30  # its first segment
    view.close()
    clock.advance(2_000)
    _tick(s)
    with pytest.raises(NotFound, match=f"manifest version {pinned}"):
        coldread.open_cold(str(cold), manifest=pinned)
    assert len(_payloads(coldread.open_cold(str(cold)).read("t", after=0, limit=100))) == 20
    s.close()


def test_TIER_10_an_orphan_copy_is_collected(tmp_path: Path) -> None:
    """TIER-10, TIER-6: an object no manifest version and not the state names (a copy whose
    flip never happened) is deleted by the next collection."""
    root, cold = tmp_path / "s", tmp_path / "cold"
    s = _open(root, cold, hot_retain_segments=1, cold_grace_ms=0)
    _fill(s, 30)
    _tick(s)
    sid = _backend(s).store_id.hex()
    orphan = cold / sid / "topics" / f"{1:016x}" / segfmt.data_name(999)
    orphan.write_bytes(b"left over")
    _tick(s)
    assert not orphan.exists()
    assert len(_payloads(s.topic("t").read(after=0, limit=100))) == 30
    s.close()


def test_TIER_11_several_stores_need_a_store_id(tmp_path: Path) -> None:
    """TIER-11, TIER-3: two stores share one cold URL under their own ids; the reader asks
    which one."""
    cold = tmp_path / "cold"
    for name in ("a", "b"):
        s = _open(tmp_path / name, cold, hot_retain_segments=0)
        _fill(s, 12)
        _tick(s)
        s.close()
    with pytest.raises(tidelog.BadArgument, match="store_id"):
        coldread.open_cold(str(cold))
    ids = sorted(os.listdir(cold))
    view = coldread.open_cold(str(cold), store_id=ids[0])
    assert len(_payloads(view.read("t"))) == 12


# -- a pyarrow filesystem failing at step k --------------------------------------------------


class _Handler(pafs.FileSystemHandler):
    """A pyarrow filesystem over ``inner`` whose mutating calls fail from the ``fail_at``-th
    on (an object store cut off mid-relocation)."""

    def __init__(self, inner: Any, fail_at: int | None = None) -> None:
        self.inner = inner
        self.fail_at = fail_at
        self.calls = 0

    def _step(self) -> None:
        self.calls += 1
        if self.fail_at is not None and self.calls >= self.fail_at:
            raise OSError(f"injected failure at step {self.calls}")

    def get_type_name(self) -> str:
        return "py-test"

    def get_file_info(self, paths: Any) -> Any:
        return self.inner.get_file_info(paths)

    def get_file_info_selector(self, selector: Any) -> Any:
        return self.inner.get_file_info(selector)

    def create_dir(self, path: str, recursive: bool) -> None:
        self.inner.create_dir(path, recursive=recursive)

    def delete_dir(self, path: str) -> None:
        self.inner.delete_dir(path)

    def delete_dir_contents(self, path: str, missing_dir_ok: bool = False) -> None:
        self.inner.delete_dir_contents(path, missing_dir_ok=missing_dir_ok)

    def delete_root_dir_contents(self) -> None:
        self.inner.delete_dir_contents("", accept_root_dir=True)

    def delete_file(self, path: str) -> None:
        self._step()
        self.inner.delete_file(path)

    def move(self, src: str, dest: str) -> None:
        self._step()
        self.inner.move(src, dest)

    def copy_file(self, src: str, dest: str) -> None:
        self.inner.copy_file(src, dest)

    def open_input_stream(self, path: str) -> Any:
        return self.inner.open_input_stream(path)

    def open_input_file(self, path: str) -> Any:
        return self.inner.open_input_file(path)

    def open_output_stream(self, path: str, metadata: Any) -> Any:
        self._step()
        parent = path.rsplit("/", 1)[0]
        self.inner.create_dir(parent, recursive=True)
        return self.inner.open_output_stream(path)

    def open_append_stream(self, path: str, metadata: Any) -> Any:
        raise OSError("not supported")

    def normalize_path(self, path: str) -> str:
        return path


def test_TIER_6_a_pyarrow_tier_failing_at_every_step_loses_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """TIER-6, TIER-2: a pyarrow tier whose k-th mutating call fails, for every k of a pass
    (copies, manifest, collection): the pass fails with io_error, the store reopens with every
    acknowledged record, and a healthy pass then relocates them all."""
    from tidelog.backends.file import store as storemod

    handler = _Handler(None)

    def open_tier(url: str, fs: Any) -> Any:
        (tmp_path / "objects").mkdir(exist_ok=True)
        handler.inner = pafs.SubTreeFileSystem(str(tmp_path / "objects"), pafs.LocalFileSystem())
        return segstore.ArrowSegmentStore(pafs.PyFileSystem(handler), "bucket", url)

    monkeypatch.setattr(storemod, "open_segment_store", open_tier)
    # a healthy run counts the steps of one pass
    s = _open(tmp_path / "count", "py://bucket", hot_retain_segments=1, cold_grace_ms=0)
    _fill(s, 40)
    handler.calls = 0
    _tick(s)
    steps = handler.calls
    s.close()
    assert steps >= 7  # 3 segments x 2 objects + a manifest
    for k in range(1, steps + 1):
        root = tmp_path / f"s{k}"
        handler.fail_at = None
        s = _open(root, "py://bucket", hot_retain_segments=1, cold_grace_ms=0)
        t = _fill(s, 40)
        _backend(s)._checkpoint()  # sealed, nothing moved yet
        handler.calls, handler.fail_at = 0, k
        with pytest.raises(StorageError, match=f"injected failure at step {k}"):
            _tick(s)
        with pytest.raises(StorageError):  # FLT-6: poisoned until reopened
            t.append(b"x")
        _backend(s).abandon()
        handler.fail_at = None
        r = _open(root, "py://bucket", hot_retain_segments=1, cold_grace_ms=0)
        want = [b"p%05d" % i for i in range(40)]
        assert _payloads(r.topic("t").read(after=0, limit=100)) == want, k
        _tick(r)
        assert _payloads(r.topic("t").read(after=0, limit=100)) == want, k
        assert [type(c).__name__ for c in _chunks(r)] == ["ColdChunk"] * 3 + ["SegChunk"], k
        r.close()
