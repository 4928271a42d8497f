"""The crash simulator itself (spec/CRASH.md, CRASH-1..CRASH-7), on toy protocols.

No tidelog backend is involved: these tests pin what ``RecordingFS`` records and which disk
states ``crash_states`` produces, so backend crash tests can trust a passing run.
"""

from __future__ import annotations

import copy
import struct
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tidelog.conformance.crashfs import (
    DEFAULT_LIMIT,
    SECTOR,
    Data,
    DirOps,
    Link,
    RecordingFS,
    RecordingHandle,
    Size,
    StateSpaceTooLarge,
    Sync,
    Torn,
)
from tidelog.errors import BadArgument, Locked

pytestmark = pytest.mark.crash

OLD, NEW = b"\xaa" * 1024, b"\xbb" * 1024


def _synced_file(content: bytes = OLD) -> tuple[RecordingFS, RecordingHandle]:
    """/d/f durable (entry and data) with ``content``; returns the fs and an open handle."""
    fs = RecordingFS(dirs=["/d"])
    h = fs.open("/d/f")
    fs.fsync_dir("/d")
    h.pwrite(content, 0)
    h.fsync()
    return fs, h


def _contents(
    fs: RecordingFS,
    path: str = "/d/f",
    *,
    at: int | None = None,
    torn: Torn = "garbage",
    dirops: DirOps = "prefix",
) -> list[bytes | None]:
    """The content of ``path`` (None: missing) in every crash state."""
    return [s.tree().get(path) for s in fs.crash_states(at=at, torn=torn, dirops=dirops)]


def _data(fs: RecordingFS, *, torn: Torn = "garbage") -> list[bytes]:
    """Like ``_contents`` for /d/f, which must exist in every state."""
    out = _contents(fs, torn=torn)
    assert all(c is not None for c in out)
    return [c or b"" for c in out]


# ------------------------------------------------------------------------------- CRASH-2
def test_synced_write_is_in_every_state() -> None:
    """CRASH-2: write + fdatasync makes data durable; no crash state lacks it."""
    fs = RecordingFS(dirs=["/d"])
    h = fs.open("/d/f")
    fs.fsync_dir("/d")
    h.pwrite(b"hello", 0)
    h.fdatasync()
    h.pwrite(b"later", 100)  # pending again, but beyond the synced bytes
    synced = fs.checkpoints()[-2]
    for k in range(synced, len(fs.history) + 1):
        assert all(c is not None and c[:5] == b"hello" for c in _contents(fs, at=k))
    assert b"" in _contents(fs, at=synced - 1)  # before the barrier it may be lost


def test_fdatasync_and_fsync_are_the_same_barrier() -> None:
    """CRASH-2: fdatasync == fsync in this model, both cover size changes too."""
    for sync in ("fdatasync", "fsync"):
        fs, h = _synced_file()
        h.truncate(10)
        h.pwrite(b"x", 20)
        getattr(h, sync)()
        assert _contents(fs) == [OLD[:10] + b"\0" * 10 + b"x"]


def test_unsynced_writes_to_other_files_are_independent() -> None:
    """CRASH-2: syncing one file does nothing for another file's pending writes."""
    fs = RecordingFS(dirs=["/d"])
    a, b = fs.open("/d/a"), fs.open("/d/b")
    fs.fsync_dir("/d")
    a.pwrite(b"A" * SECTOR, 0)
    b.pwrite(b"B" * SECTOR, 0)
    a.fdatasync()
    trees = [s.tree() for s in fs.crash_states(torn="off")]
    assert all(t["/d/a"] == b"A" * SECTOR for t in trees)
    assert sorted(t["/d/b"] or b"" for t in trees) == [b"", b"\0" * SECTOR, b"B" * SECTOR]


# ------------------------------------------------------------------------------- CRASH-1
def test_unsynced_write_may_persist_or_not_and_tears() -> None:
    """CRASH-1: each pending sector is old, new, zero or garbage; only its own range changes."""
    fs, h = _synced_file()
    h.pwrite(NEW, 0)
    seen = {(c[:SECTOR], c[SECTOR:]) for c in _contents(fs) if c is not None}
    firsts = {a for a, _ in seen}
    assert OLD[:SECTOR] in firsts and NEW[:SECTOR] in firsts and b"\0" * SECTOR in firsts
    garbage = firsts - {OLD[:SECTOR], NEW[:SECTOR], b"\0" * SECTOR}
    assert len(garbage) == 1  # a garbage sector (seeded, so stable)
    assert len(seen) == 16  # sectors tear independently: 4 x 4


def test_torn_variants_selectable() -> None:
    """CRASH-1: torn="off" gives old/new, "linear" adds a half-new/half-old sector."""
    fs, h = _synced_file()
    h.pwrite(NEW[:SECTOR], 0)
    assert sorted(c[:SECTOR] for c in _data(fs, torn="off")) == [OLD[:SECTOR], NEW[:SECTOR]]
    linear = {c[:SECTOR] for c in _data(fs, torn="linear")}
    assert NEW[:256] + OLD[256:SECTOR] in linear and len(linear) == 3
    assert len(_contents(fs, torn="all")) == 5
    with pytest.raises(BadArgument):
        fs.crash_states(torn="sometimes")  # type: ignore[arg-type]


def test_later_write_to_a_sector_implies_the_earlier_one() -> None:
    """CRASH-1: a sector holds one of its versions in order: B (appended after A in the same
    sector) never persists without A, and bytes outside a write never change (PSOW)."""
    fs, h = _synced_file(b"H" * 10)
    h.pwrite(b"A" * 100, 10)
    h.pwrite(b"B" * 100, 110)
    states = _data(fs)
    for c in states:
        assert c[:10] == b"H" * 10
        if c[110:210] == b"B" * 100:
            assert c[10:110] == b"A" * 100
    assert any(len(c) == 210 and c[10:110] == b"A" * 100 for c in states)


# ------------------------------------------------------------------------------- CRASH-3
def test_size_changes_persist_in_order_and_extensions_read_zeros() -> None:
    """CRASH-3: pending truncates persist as an in-order prefix; an extension with no
    persisted write reads zeros; a persisted shrink never resurrects the old bytes."""
    fs, h = _synced_file(b"0123456789")
    h.truncate(4)
    h.allocate(8)
    assert set(_contents(fs)) == {b"0123456789", b"0123", b"0123\0\0\0\0"}
    h.fsync()
    assert _contents(fs) == [b"0123\0\0\0\0"]


def test_extending_write_size_and_data_are_separate() -> None:
    """CRASH-3: an appending write grows the file first; data beyond the persisted size is
    invisible and a persisted size with lost data reads zeros."""
    fs, h = _synced_file(b"")
    h.pwrite(b"xyz", 0)
    assert isinstance(fs.history[-2], Size) and isinstance(fs.history[-1], Data)
    assert set(_contents(fs, torn="off")) == {b"", b"\0\0\0", b"xyz"}


# ------------------------------------------------------------------------------- CRASH-4
def test_created_file_without_dir_fsync_may_vanish_even_if_synced() -> None:
    """CRASH-4: fsync(2) on a file does not persist its directory entry."""
    fs = RecordingFS(dirs=["/d"])
    h = fs.open("/d/new")
    h.pwrite(b"data", 0)
    h.fsync()
    assert sorted(_contents(fs, "/d/new"), key=repr) == [None, b"data"]
    fs.fsync_dir("/d")
    assert _contents(fs, "/d/new") == [b"data"]


def test_mkdir_needs_parent_fsync() -> None:
    """CRASH-4: a new directory's own entry needs its parent's fsync; its files go with it."""
    fs = RecordingFS(dirs=["/d"])
    fs.mkdir("/d/sub")
    h = fs.open("/d/sub/f")
    h.pwrite(b"x", 0)
    h.fsync()
    fs.fsync_dir("/d/sub")
    assert sorted(_contents(fs, "/d/sub/f"), key=repr) == [None, b"x"]
    fs.fsync_dir("/d")
    assert _contents(fs, "/d/sub/f") == [b"x"]


def test_unlink_durable_only_after_dir_fsync() -> None:
    """CRASH-4: an unlink may be undone by a crash until the directory is fsynced."""
    fs, _ = _synced_file()
    fs.unlink("/d/f")
    assert sorted(_contents(fs), key=repr) == [None, OLD]
    fs.fsync_dir("/d")
    assert _contents(fs) == [None]


def test_dirops_prefix_versus_weak() -> None:
    """CRASH-4: "prefix" keeps per-directory program order, "weak" only per-name order."""
    fs = RecordingFS(dirs=["/d"])
    fs.open("/d/a").close()
    fs.open("/d/b").close()

    def names(dirops: DirOps) -> set[tuple[str, ...]]:
        return {
            tuple(sorted(p for p in s.tree() if p != "/d")) for s in fs.crash_states(dirops=dirops)
        }

    assert names("prefix") == {(), ("/d/a",), ("/d/a", "/d/b")}
    assert names("weak") == names("prefix") | {("/d/b",)}  # b's entry without a's
    fs.unlink("/d/a")  # same name as the first create: ordered after it in both modes
    assert fs.state_space(dirops="prefix") == 4
    assert fs.state_space(dirops="weak") == 6
    assert ("/d/b",) in names("prefix")  # now reachable in order: create a, b, unlink a


# ------------------------------------------------------------------------------- CRASH-5
def _atomic_replace(fs: RecordingFS, content: bytes, *, sync_data: bool = True) -> None:
    h = fs.open("/d/meta.tmp")
    h.pwrite(content, 0)
    if sync_data:
        h.fdatasync()
    h.close()
    fs.rename("/d/meta.tmp", "/d/meta")
    fs.fsync_dir("/d")


def test_atomic_replace_gives_old_or_new_never_a_mix() -> None:
    """CRASH-5: write tmp, fdatasync, rename, fsync_dir: after any crash point the file is
    wholly old or wholly new, never missing and never mixed."""
    fs = RecordingFS(dirs=["/d"])
    _atomic_replace(fs, OLD)
    fs.settle()
    _atomic_replace(fs, NEW)
    seen = set()
    for k in range(len(fs.history) + 1):
        for c in _contents(fs, "/d/meta", at=k, dirops="weak", torn="all"):
            assert c in (OLD, NEW), k
            seen.add(c)
    assert seen == {OLD, NEW}


def test_atomic_replace_without_fdatasync_is_caught() -> None:
    """CRASH-5: the classic bug (rename before the data is synced) shows up as a crash state
    with a new name over missing or torn data."""
    fs = RecordingFS(dirs=["/d"])
    _atomic_replace(fs, OLD)
    fs.settle()
    _atomic_replace(fs, NEW, sync_data=False)
    bad = {c for c in _contents(fs, "/d/meta") if c not in (OLD, NEW)}
    assert b"" in bad and len(bad) > 3


def test_cross_directory_rename_is_one_op_of_both_directories() -> None:
    """CRASH-5: fsync of the destination directory persists the rename, and with it the
    source directory's earlier ops (the create), so the file is never lost."""
    fs = RecordingFS(dirs=["/d/x", "/d/y"])
    h = fs.open("/d/x/t")
    h.pwrite(b"payload", 0)
    h.fsync()
    fs.rename("/d/x/t", "/d/y/u")
    assert {tuple(sorted(s.tree())) for s in fs.crash_states()} == {
        ("/d", "/d/x", "/d/y"),
        ("/d", "/d/x", "/d/x/t", "/d/y"),
        ("/d", "/d/x", "/d/y", "/d/y/u"),
    }
    fs.fsync_dir("/d/y")
    assert [s.tree() for s in fs.crash_states()] == [
        {"/d": None, "/d/x": None, "/d/y": None, "/d/y/u": b"payload"}
    ]


def test_directory_renames_persisting_out_of_order() -> None:
    """CRASH-5: in "weak" mode the second of two dependent directory renames may persist
    alone; the moved subtree is then unreachable (gone), never a cycle or an invented path."""
    fs = RecordingFS(dirs=["/r/a/b"])
    fs.rename("/r/a/b", "/r/c")
    fs.rename("/r/a", "/r/c/a")
    trees = {tuple(sorted(s.tree())) for s in fs.crash_states(dirops="weak")}
    assert trees == {
        ("/r", "/r/a", "/r/a/b"),
        ("/r", "/r/a", "/r/c"),
        ("/r", "/r/c", "/r/c/a"),
        ("/r",),
    }


# ------------------------------------------------------------------------------- CRASH-6
@pytest.mark.parametrize(
    ("torn", "per_sector"), [("off", 2), ("linear", 3), ("garbage", 4), ("all", 5)]
)
def test_exhaustive_counts_match_the_model(torn: Torn, per_sector: int) -> None:
    """CRASH-6: one pending 1024-byte overwrite = 2 sectors x variants, all distinct."""
    fs, h = _synced_file()
    h.pwrite(NEW, 0)
    assert fs.state_space(torn=torn) == per_sector**2
    assert len(list(fs.crash_states(torn=torn))) == per_sector**2


def test_two_writes_to_one_sector_count() -> None:
    """CRASH-6: a sector with m pending writes has 1 + m x (variants - 1) versions."""
    fs, h = _synced_file(OLD[:SECTOR])
    h.pwrite(b"1" * SECTOR, 0)
    h.pwrite(b"2" * SECTOR, 0)
    assert fs.state_space() == 1 + 2 * 3
    assert len(list(fs.crash_states())) == 6  # the two zero variants are one image


def test_dedup_by_fingerprint() -> None:
    """CRASH-6: states are deduplicated by the durable image's fingerprint."""
    fs, h = _synced_file(b"\0" * 1024)
    h.pwrite(NEW, 0)
    states = list(fs.crash_states())
    assert fs.state_space() == 16 and len(states) == 9  # zero == old: 3 x 3
    prints = [s.fingerprint() for s in states]
    assert len(set(prints)) == len(prints)
    again, _ = _synced_file(b"\0" * 1024)
    assert again.fingerprint() == states[0].fingerprint()  # same image, same print
    assert fs.fingerprint() == again.fingerprint()  # the durable image ignores pending ops


def test_exhaustive_guard_raises_before_yielding() -> None:
    """CRASH-6: exhaustive mode refuses a state space over the limit, with a clear error."""
    fs, h = _synced_file(b"")
    h.pwrite(b"x" * (SECTOR * 4), 0)
    assert fs.state_space() == 2 * 4**4  # the size op x four sectors
    with pytest.raises(StateSpaceTooLarge, match="mode='sample'"):
        fs.crash_states(limit=2 * 4**4 - 1)
    assert len(list(fs.crash_states(limit=2 * 4**4))) == 1 + 3**4  # dedup: no size, no data
    h.pwrite(b"y" * (SECTOR * 4), SECTOR * 4)
    assert fs.state_space() > DEFAULT_LIMIT
    with pytest.raises(StateSpaceTooLarge):
        fs.crash_states()


def test_sampled_mode_is_reproducible_by_seed() -> None:
    """CRASH-6: sample mode draws from random.Random(seed): same seed, same states; the first
    two are nothing-persisted and everything-persisted."""
    fs, h = _synced_file(b"")
    for i in range(8):
        h.pwrite(bytes([65 + i]) * SECTOR, i * SECTOR)
        fs.open(f"/d/g{i}").close()

    def run(seed: int) -> list[tuple[str, str]]:
        return [
            (s.fingerprint(), s.description)
            for s in fs.crash_states(mode="sample", seed=seed, limit=40)
        ]

    first = run(7)
    assert first == run(7) and first != run(8)
    assert 30 < len(first) <= 40
    states = list(fs.crash_states(mode="sample", seed=7, limit=2))
    assert states[0].tree() == {"/d": None, "/d/f": b""}
    assert len(states[1].tree()["/d/f"] or b"") == 8 * SECTOR and len(states[1].tree()) == 10
    with pytest.raises(BadArgument, match="seed"):
        fs.crash_states(mode="sample")


def test_crash_at_earlier_points_and_checkpoints() -> None:
    """CRASH-6: crash_states(at=k) replays the history up to op k; checkpoints() lists 0, the
    point after every barrier, and now."""
    fs = RecordingFS(dirs=["/d"])
    h = fs.open("/d/f")  # 0: Link
    fs.fsync_dir("/d")  # 1
    h.pwrite(b"a", 0)  # 2: Size, 3: Data
    h.fdatasync()  # 4
    h.pwrite(b"b", 1)  # 5, 6
    assert isinstance(fs.history[0], Link) and isinstance(fs.history[4], Sync)
    assert len(fs.history) == 7
    assert fs.checkpoints() == [0, 2, 5, 7]
    assert _contents(fs, at=0) == [None]
    assert set(_contents(fs, at=2)) == {b""}
    assert _contents(fs, at=5) == [b"a"]
    assert set(_contents(fs, at=7, torn="off")) == {b"a", b"a\0", b"ab"}
    assert _contents(fs, at=7) == _contents(fs)
    assert [i for i, _ in fs.pending(at=7)] == [5, 6]
    assert all(s.crash_at == 5 for s in fs.crash_states(at=5))
    with pytest.raises(BadArgument):
        fs.crash_states(at=8)


def test_description_names_persisted_lost_and_torn_ops() -> None:
    """CRASH-6: every state says which ops persisted, which were lost and which tore."""
    fs, h = _synced_file()
    h.pwrite(NEW[:SECTOR], SECTOR)
    n = len(fs.history)
    texts = [s.description for s in fs.crash_states()]
    assert f"crash after op {n}: persisted none; lost #{n - 1}" in texts
    assert any(f"torn #{n - 1} write /d/f[512:1024]=garbage" in t for t in texts)


# ------------------------------------------------------------------------------- CRASH-7
@dataclass
class ToyLog:
    """A minimal framed WAL: [len u32][crc u32][payload], fdatasync per append."""

    fs: RecordingFS
    dir_sync: bool = True
    checksum: bool = True
    acked: list[tuple[int, bytes]] = field(default_factory=list, init=False)  # (at, payload)

    def __post_init__(self) -> None:
        self.h = self.fs.open("/d/wal")
        if self.dir_sync:
            self.fs.fsync_dir("/d")
        self.end = 0

    def append(self, payload: bytes) -> None:
        crc = zlib.crc32(payload) if self.checksum else 0
        frame = struct.pack("<II", len(payload), crc) + payload
        self.h.pwrite(frame, self.end)
        self.end += len(frame)
        self.h.fdatasync()
        self.acked.append((len(self.fs.history), payload))

    def recover(self, fs: RecordingFS) -> list[bytes]:
        if not fs.exists("/d/wal"):
            return []
        data = fs.open_read("/d/wal").pread(1 << 20, 0)
        out, pos = [], 0
        while pos + 8 <= len(data):
            n, crc = struct.unpack_from("<II", data, pos)
            body = data[pos + 8 : pos + 8 + n]
            if n == 0 or len(body) < n or (self.checksum and zlib.crc32(body) != crc):
                break  # a torn or never-written tail
            out.append(body)
            pos += 8 + n
        return out


def _violations(log: ToyLog, appended: list[bytes]) -> list[str]:
    """The CRASH-7 checks over every crash point and state of the toy log."""
    bad = []
    for k in range(len(log.fs.history) + 1):
        must = [p for at, p in log.acked if at <= k]
        for state in log.fs.crash_states(at=k):
            got = log.recover(state)
            if got[: len(must)] != must:
                bad.append(f"acked record missing: {state.description}")
            if got != appended[: len(got)]:
                bad.append(f"phantom or corrupted record: {state.description}")
    return bad


def _toy(**kw: bool) -> tuple[ToyLog, list[bytes]]:
    log = ToyLog(RecordingFS(dirs=["/d"]), **kw)
    appended = [b"first", b"x" * 600, b"third"]
    for p in appended:
        log.append(p)
    return log, appended


def test_checks_pass_for_a_correct_protocol() -> None:
    """CRASH-7: a correct toy WAL survives every state at every crash point."""
    assert _violations(*_toy()) == []


@pytest.mark.parametrize(
    ("bug", "expect"),
    [({"dir_sync": False}, "acked record missing"), ({"checksum": False}, "corrupted")],
)
def test_checks_catch_a_buggy_protocol(bug: dict[str, bool], expect: str) -> None:
    """CRASH-7: the same checks catch a WAL that never fsyncs its directory (an acked record
    vanishes) and one without checksums (a torn frame is returned as a record)."""
    found = _violations(*_toy(**bug))
    assert any(expect in v for v in found)


# ------------------------------------------------------------------------------- the FS itself
def test_lock_conflict_and_release() -> None:
    """CRASH-6 (harness): lock() is exclusive per inode across handles, released on close; a
    crash state starts unlocked (the process died)."""
    fs = RecordingFS(dirs=["/d"])
    a, b = fs.open("/d/.lock"), fs.open("/d/.lock")
    a.lock()
    a.lock()  # re-locking through the same handle is fine
    with pytest.raises(Locked):
        b.lock()
    fs.fsync_dir("/d")
    next(iter(fs.crash_states())).open("/d/.lock").lock()
    a.close()
    b.lock()


def test_map_and_handle_basics() -> None:
    """CRASH-6 (harness): map() is a read-only snapshot of the current bytes; errors match os."""
    fs = RecordingFS(dirs=["/d"])
    h = fs.open("/d/f")
    h.pwrite(b"sealed", 0)
    view = h.map()
    assert view.readonly and bytes(view) == b"sealed"
    h.pwrite(b"S", 0)
    assert bytes(view) == b"sealed" and bytes(h.map()) == b"Sealed"
    assert h.pread(3, 1) == b"eal" and h.pread(10, 4) == b"ed" and h.size() == 6
    assert fs.file_size("/d/f") == 6 and fs.listdir("/d") == ["f"] and fs.is_dir("/d")
    r = fs.open_read("/d/f")
    with pytest.raises(OSError):
        r.pwrite(b"x", 0)
    h.close()
    with pytest.raises(OSError):
        h.pread(1, 0)
    with pytest.raises(FileNotFoundError):
        fs.open("/d/missing", create=False)
    with pytest.raises(FileNotFoundError):
        fs.open("/nope/f")
    with pytest.raises(FileNotFoundError):
        fs.listdir("/nope")
    with pytest.raises(FileNotFoundError):
        fs.unlink("/d/missing")
    with pytest.raises(IsADirectoryError):
        fs.open("/d")
    with pytest.raises(OSError):
        fs.rmdir("/")
    fs.mkdir("/d/e/f")
    fs.mkdir("/d/e")
    with pytest.raises(FileExistsError):
        fs.mkdir("/d/f")
    assert fs.stats.writes == 2 and fs.stats.bytes_written == 7 and fs.stats.creates == 3


def test_from_and_to_directory_round_trip(tmp_path: Path) -> None:
    """CRASH-6 (reproduction): an image exports to a real directory and imports back."""
    src = tmp_path / "src"
    (src / "sub").mkdir(parents=True)
    (src / "a.bin").write_bytes(b"\x00\x01" * 700)
    (src / "sub" / "b").write_bytes(b"")
    fs = RecordingFS.from_directory(str(src), at="/store")
    assert fs.history == [] and fs.tree() == fs.tree(durable=True)
    assert fs.tree()["/store/a.bin"] == b"\x00\x01" * 700
    state = next(iter(fs.crash_states()))
    state.to_directory(str(tmp_path / "out"), at="/store")
    assert (tmp_path / "out" / "a.bin").read_bytes() == b"\x00\x01" * 700
    assert (tmp_path / "out" / "sub" / "b").read_bytes() == b""
    back = RecordingFS.from_directory(str(tmp_path / "out"), at="/store")
    assert back.fingerprint() == fs.fingerprint()
    with pytest.raises(OSError):
        state.to_directory(str(tmp_path / "out"), at="/store")  # not empty
    with pytest.raises(FileNotFoundError):
        RecordingFS.from_directory(str(tmp_path / "missing"))


# ------------------------------------------------------------------------------- property
NAMES = ("a", "b", "c")
Op = tuple[Any, ...]  # ("write", name, offset, length, byte), ("fsync_dir",), ...
OPS = st.one_of(
    st.tuples(st.just("create"), st.sampled_from(NAMES)),
    st.tuples(
        st.just("write"),
        st.sampled_from(NAMES),
        st.integers(0, 1100),
        st.integers(1, 700),
        st.integers(1, 255),
    ),
    st.tuples(st.just("truncate"), st.sampled_from(NAMES), st.integers(0, 1500)),
    st.tuples(st.just("sync"), st.sampled_from(NAMES)),
    st.tuples(st.just("rename"), st.sampled_from(NAMES), st.sampled_from(NAMES)),
    st.tuples(st.just("unlink"), st.sampled_from(NAMES)),
    st.tuples(st.just("fsync_dir")),
)


@dataclass
class Oracle:
    """What must be on disk, derived directly from the rules: durable names and contents, and
    what pending ops may still change."""

    vnames: dict[str, int] = field(default_factory=dict)
    dnames: dict[str, int] = field(default_factory=dict)
    dirty: set[str] = field(default_factory=set)  # names touched since the last fsync_dir
    vdata: dict[int, bytearray] = field(default_factory=dict)
    ddata: dict[int, bytes] = field(default_factory=dict)
    ranges: dict[int, list[tuple[int, int]]] = field(default_factory=dict)  # pending writes
    sizes: dict[int, list[int]] = field(default_factory=dict)  # pending sizes

    def check(self, tree: dict[str, bytes | None], where: str) -> None:
        for name in NAMES:
            got = tree.get(f"/d/{name}")
            if name in self.dirty:
                continue
            if name not in self.dnames:
                assert got is None, where
                continue
            fid = self.dnames[name]
            durable = self.ddata[fid]
            assert got is not None, where
            allowed = {len(durable), *self.sizes[fid]}
            assert len(got) in allowed, where
            low = min(allowed)
            for i in range(low):
                if not any(lo <= i < hi for lo, hi in self.ranges[fid]):
                    assert got[i] == durable[i], where


def _run(fs: RecordingFS, o: Oracle, handles: dict[int, RecordingHandle], op: Op) -> None:
    kind, *args = op
    if kind in ("write", "truncate", "sync") and args[0] not in o.vnames:
        _run(fs, o, handles, ("create", args[0]))  # richer histories than skipping the op
    if kind == "create" and args[0] not in o.vnames:
        fid = len(handles)
        handles[fid] = fs.open(f"/d/{args[0]}")
        o.vnames[args[0]] = fid
        o.dirty.add(args[0])
        o.vdata[fid], o.ddata[fid], o.ranges[fid], o.sizes[fid] = bytearray(), b"", [], []
    elif kind in ("write", "truncate", "sync", "unlink") and args[0] in o.vnames:
        fid = o.vnames[args[0]]
        h, buf = handles[fid], o.vdata[fid]
        if kind == "write":
            off, n, byte = args[1:]
            if off + n > len(buf):
                buf.extend(bytes(off + n - len(buf)))
                o.sizes[fid].append(off + n)
            buf[off : off + n] = bytes([byte]) * n
            o.ranges[fid].append((off, off + n))
            h.pwrite(bytes([byte]) * n, off)
        elif kind == "truncate":
            del buf[args[1] :]
            buf.extend(bytes(args[1] - len(buf)))
            o.sizes[fid].append(args[1])
            h.truncate(args[1])
        elif kind == "sync":
            o.ddata[fid], o.ranges[fid], o.sizes[fid] = bytes(buf), [], []
            h.fdatasync()
        else:
            del o.vnames[args[0]]
            o.dirty.add(args[0])
            fs.unlink(f"/d/{args[0]}")
    elif kind == "rename" and args[0] in o.vnames and args[0] != args[1]:
        o.vnames[args[1]] = o.vnames.pop(args[0])
        o.dirty |= {args[0], args[1]}
        fs.rename(f"/d/{args[0]}", f"/d/{args[1]}")
    elif kind == "fsync_dir":
        o.dnames, o.dirty = dict(o.vnames), set()
        fs.fsync_dir("/d")


@settings(
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(st.lists(OPS, max_size=14), st.sampled_from(["prefix", "weak"]))
def test_property_synced_state_survives_every_crash(ops: list[Op], dirops: DirOps) -> None:
    """CRASH-2, CRASH-4: for random op sequences, every crash state at every crash point holds
    every durable name with its synced bytes (except bytes a pending op may change) and no
    name that was never durable."""
    fs = RecordingFS(dirs=["/d"])
    o, handles = Oracle(), dict[int, RecordingHandle]()
    points = [(0, copy.deepcopy(o))]
    for op in ops:
        _run(fs, o, handles, op)
        points.append((len(fs.history), copy.deepcopy(o)))
    for k, oracle in points:
        if fs.state_space(at=k, dirops=dirops) <= 64:
            states = fs.crash_states(at=k, dirops=dirops)
        else:
            states = fs.crash_states(at=k, dirops=dirops, mode="sample", seed=k, limit=16)
        for s in states:
            oracle.check(s.tree(), f"{ops} -> {s.description}")


BIG = st.integers(0, 3 * 65536 + 100)  # across the 64 KiB chunks files are stored in


@settings(deadline=None)
@given(
    st.lists(
        st.one_of(
            st.tuples(st.just("write"), BIG, st.integers(1, 70_000)),
            st.tuples(st.just("truncate"), BIG, st.just(0)),
            st.tuples(st.just("allocate"), BIG, st.just(0)),
            st.tuples(st.just("sync"), st.just(0), st.just(0)),
        ),
        max_size=8,
    )
)
def test_property_large_files_match_a_bytearray(ops: list[tuple[str, int, int]]) -> None:
    """CRASH-6: contents (volatile, and the nothing- and everything-persisted crash states)
    match a plain bytearray model, for files spanning several storage chunks."""
    fs = RecordingFS(dirs=["/d"])
    h = fs.open("/d/f")
    fs.fsync_dir("/d")
    model, durable = bytearray(), b""
    for i, (kind, a, n) in enumerate(ops):
        if kind == "write":
            data = bytes([i % 251 + 1]) * n
            h.pwrite(data, a)
            model.extend(bytes(max(0, a + n - len(model))))
            model[a : a + n] = data
        elif kind == "truncate":
            h.truncate(a)
            del model[a:]
            model.extend(bytes(a - len(model)))
        elif kind == "allocate":
            h.allocate(a)
            model.extend(bytes(max(0, a - len(model))))
        else:
            h.fsync()
            durable = bytes(model)
        assert h.size() == len(model) and h.pread(len(model) + 5, 0) == model
        assert h.pread(70_000, a) == model[a : a + 70_000]
    assert bytes(h.map()) == model and fs.tree(durable=True)["/d/f"] == durable
    states = list(fs.crash_states(mode="sample", seed=0, limit=2))  # one if they are equal
    assert states[0].tree()["/d/f"] == durable and states[-1].tree()["/d/f"] == bytes(model)
