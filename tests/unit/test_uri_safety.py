"""Where a path-based URI may put a store, and what it may write there: paths used as spelled
(spec URI-7), store directories checked before anything is created (URI-8), no writing through
symbolic links (FORMATS.md LOCK-4), and typed errors at these edges (ERR-1).

Every refusal is checked to leave the file system as it found it: ``listing`` walks the whole
temporary tree before and after.
"""

from __future__ import annotations

import errno
import os
from pathlib import Path
from typing import Any

import pytest
from tree_listing import listing

import tidelog
from tidelog.fsio import OsFS

SCHEMES = ("file", "sf")


def _uri(scheme: str, path: str) -> str:
    """A store URI at ``path``: for sf://, the slot ``path`` (its last segment the sender)."""
    return f"{scheme}://{path}"


# -- URI-7: paths are used as spelled ---------------------------------------------------------


@pytest.mark.parametrize("scheme", ("file", "sf", "blockdev"))
@pytest.mark.parametrize(
    "path",
    [
        "par/x/../y",
        "par/x/%2e%2e/y",
        "par/x/%2E%2E/y",
        "par/x%2F..%2Fy",
        "par/./y",
        "par/x/..",
        "../y",
        "./par/../y",
    ],
)
def test_URI_7_dot_segments_are_refused_before_anything_is_created(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, scheme: str, path: str
) -> None:
    """URI-7: '.' and '..' segments (also percent-encoded) are bad_uri, never resolved: before,
    file://par/x/%2e%2e/y made a store in par/y and sf://dir/.. made the parent the slot."""
    work = tmp_path / "work"
    (work / "par" / "x").mkdir(parents=True)
    monkeypatch.chdir(work)
    before = listing(tmp_path)
    query = "?size=64KiB" if scheme == "blockdev" else ""  # what would create an image
    with pytest.raises(tidelog.BadURI, match=r"segments.*not allowed.*URI-7") as exc:
        tidelog.open(f"{scheme}://{path}{query}")
    assert exc.value.code == "bad_uri"
    assert listing(tmp_path) == before


@pytest.mark.parametrize("scheme", SCHEMES)
def test_URI_7_tilde_is_not_expanded_nor_created(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, scheme: str
) -> None:
    """URI-7: file://~/x is bad_uri naming the path (before: a directory named '~' appeared in
    the working directory)."""
    monkeypatch.chdir(tmp_path)
    with pytest.raises(tidelog.BadURI, match=r"'~/x/s'.*not expanded.*URI-7"):
        tidelog.open(f"{scheme}://~/x/s")
    assert listing(tmp_path) == []


@pytest.mark.parametrize("scheme", ("file", "sf", "blockdev"))
@pytest.mark.parametrize("escape", ["%00", "%0a", "%1b", "%7f"])
def test_URI_7_control_characters_are_bad_uri(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, scheme: str, escape: str
) -> None:
    """URI-7, ERR-1: a NUL (before: a bare ValueError 'embedded null byte') or another control
    character in a path is bad_uri, and nothing is created."""
    monkeypatch.chdir(tmp_path)
    query = "?size=64KiB" if scheme == "blockdev" else ""
    with pytest.raises(tidelog.BadURI, match="control characters"):
        tidelog.open(f"{scheme}://./d/a{escape}b{query}")
    assert listing(tmp_path) == []


def test_URI_2_a_percent_escape_that_is_not_utf8_is_bad_uri(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """URI-2: %ff is not UTF-8; it used to become U+FFFD silently and name another directory."""
    monkeypatch.chdir(tmp_path)
    with pytest.raises(tidelog.BadURI, match="not UTF-8"):
        tidelog.open("file://./a%ffb")
    assert listing(tmp_path) == []


@pytest.mark.parametrize("path", ["./s", "s", "%2e/s", "d/s/"])
def test_URI_7_a_leading_dot_marks_a_relative_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, path: str
) -> None:
    """URI-7: file://./dir and file://dir are relative to the working directory, as before."""
    monkeypatch.chdir(tmp_path)
    with tidelog.open(f"file://{path}?prealloc=none") as store:
        store.topic("t").append(b"x")
    want = tmp_path / path.replace("%2e", ".")
    assert (want / "meta").is_dir()


def test_URI_7_an_overlong_path_is_bad_uri(tmp_path: Path) -> None:
    """URI-7: a segment over NAME_MAX is refused as bad_uri rather than an OSError midway."""
    with pytest.raises(tidelog.BadURI, match="longer than"):
        tidelog.open(f"file://{tmp_path}/{'a' * 256}")
    assert listing(tmp_path) == []


# -- URI-8: the store directory ----------------------------------------------------------------


@pytest.mark.parametrize("scheme", SCHEMES)
def test_URI_8_a_file_is_not_a_store_directory(tmp_path: Path, scheme: str) -> None:
    """URI-8, ERR-1: a URI naming a file (file:///etc/passwd) is bad_uri, the file untouched
    (before: a bare FileExistsError)."""
    victim = tmp_path / "passwd"
    victim.write_text("root:x:0:0\n")
    before = listing(tmp_path)
    with pytest.raises(tidelog.BadURI, match=r"not a directory.*URI-8"):
        tidelog.open(_uri(scheme, str(victim)))
    assert listing(tmp_path) == before and victim.read_text() == "root:x:0:0\n"


def test_URI_8_a_file_on_the_path_is_bad_uri(tmp_path: Path) -> None:
    """URI-8: a store under a file (file:///etc/passwd/x) cannot be created: bad_uri."""
    (tmp_path / "f").write_text("x")
    before = listing(tmp_path)
    with pytest.raises(tidelog.BadURI, match="not a directory"):
        tidelog.open(f"file://{tmp_path}/f/s/t")
    assert listing(tmp_path) == before


@pytest.mark.parametrize("scheme", SCHEMES)
def test_URI_8_a_foreign_non_empty_directory_is_refused(tmp_path: Path, scheme: str) -> None:
    """URI-8: a non-empty directory that is not a store is bad_uri naming some of its entries
    and create=nonempty (before: any directory became a store; file:/// made one in /)."""
    d = tmp_path / "home"
    d.mkdir()
    (d / "notes.txt").write_text("mine")
    before = listing(tmp_path)
    with pytest.raises(tidelog.BadURI, match=r"notes\.txt.*create=nonempty.*URI-8") as exc:
        tidelog.open(_uri(scheme, str(d)))
    assert exc.value.code == "bad_uri"
    assert listing(tmp_path) == before


@pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="needs /proc")
def test_URI_8_proc_self_and_the_root_directory_are_bad_uri() -> None:
    """URI-8, ERR-1: file:///proc/self (before: FileNotFoundError on .lock) and file:/// (before:
    a store in /) are bad_uri, before anything is created."""
    for uri in ("file:///proc/self", "file:///", "sf:///proc/self"):
        with pytest.raises(tidelog.BadURI, match=r"not a tidelog store|not an SF slot"):
            tidelog.open(uri)
    assert not os.path.exists("/.lock") or os.path.getsize("/.lock") == 0


@pytest.mark.parametrize("scheme", SCHEMES)
def test_URI_8_create_nonempty_keeps_the_entries_it_finds(tmp_path: Path, scheme: str) -> None:
    """URI-8: create=nonempty makes the store next to what is there, deleting nothing; reopening
    it later needs no option (it is a store now)."""
    d = tmp_path / "home"
    d.mkdir()
    (d / "notes.txt").write_text("mine")
    with tidelog.open(_uri(scheme, str(d)) + "?create=nonempty") as store:
        store.topic("frames" if scheme == "sf" else "t").append(b"x")
    with tidelog.open(_uri(scheme, str(d))) as store:
        assert [r.payload for r in store.topic("frames" if scheme == "sf" else "t").read()] == [
            b"x"
        ]
    assert (d / "notes.txt").read_text() == "mine"


@pytest.mark.parametrize("scheme", SCHEMES)
def test_URI_8_create_false_opens_only_an_existing_store(tmp_path: Path, scheme: str) -> None:
    """URI-8: create=false refuses a missing or empty directory with io_error and creates
    nothing (before: an empty directory became a store), and opens an existing store."""
    (tmp_path / "empty").mkdir()
    before = listing(tmp_path)
    for name in ("missing", "empty"):
        with pytest.raises(tidelog.StorageError, match="create=false"):
            tidelog.open(_uri(scheme, str(tmp_path / name)) + "?create=false")
    assert listing(tmp_path) == before
    tidelog.open(_uri(scheme, str(tmp_path / "s"))).close()
    tidelog.open(_uri(scheme, str(tmp_path / "s")) + "?create=false").close()


def test_URI_8_an_interrupted_creation_is_reopened(tmp_path: Path) -> None:
    """URI-8: a directory holding only entries of the store layout (a creation that stopped
    before its first snapshot) is not refused: opening it finishes the creation."""
    root = tmp_path / "s"
    (root / "meta").mkdir(parents=True)
    (root / "wal").mkdir()
    (root / ".lock").write_bytes(b"")
    with tidelog.open(f"file://{root}?prealloc=none") as store:
        store.topic("t").append(b"x")


def test_URI_8_a_meta_directory_alone_does_not_make_a_store(tmp_path: Path) -> None:
    """URI-8, LAY-1: a project that happens to have meta/ (no snapshot in it) and other entries
    is not a store, so it is refused rather than adopted."""
    d = tmp_path / "project"
    (d / "meta").mkdir(parents=True)
    (d / "meta" / "README").write_text("x")
    (d / "src").mkdir()
    before = listing(tmp_path)
    with pytest.raises(tidelog.BadURI, match="not a tidelog store"):
        tidelog.open(f"file://{d}")
    assert listing(tmp_path) == before


@pytest.mark.parametrize("option", ["create=maybe", "create=2"])
def test_URI_8_create_values(tmp_path: Path, option: str) -> None:
    """URI-8, ERR-3: create takes true, false or nonempty, and says so."""
    with pytest.raises(tidelog.BadOption, match="true, false, nonempty"):
        tidelog.open(f"file://{tmp_path}/s?{option}")
    assert listing(tmp_path) == []


class _FailingWalFS(OsFS):
    """Fails creating a WAL file, as a full disk does."""

    def open(self, path: str, *, create: bool = True) -> Any:
        if f"{os.sep}wal{os.sep}" in path and create:
            raise OSError(errno.ENOSPC, "No space left on device", path)
        return super().open(path, create=create)


def test_URI_8_a_failed_creation_leaves_nothing_behind(tmp_path: Path) -> None:
    """URI-8: when the first open of a new store fails (here: no space for the WAL file), the
    directories and files it created are removed (before: a half-made store stayed)."""
    from tidelog.backends.file import open_store

    root = tmp_path / "new" / "s"
    with pytest.raises(OSError):
        open_store(_FailingWalFS(), str(root), prealloc="none")
    assert listing(tmp_path) == []


def test_URI_8_a_failed_open_of_an_existing_store_removes_nothing(tmp_path: Path) -> None:
    """URI-8: only a creation is undone; an existing store is left exactly as it was."""
    from tidelog.backends.file import open_store

    root = tmp_path / "s"
    with tidelog.open(f"file://{root}?prealloc=none") as store:
        store.topic("t").append(b"x")
    before = listing(tmp_path)
    with pytest.raises(OSError):  # every open starts a new WAL file
        open_store(_FailingWalFS(), str(root), prealloc="none")
    assert listing(tmp_path) == before


# -- LOCK-4: no writing through links ----------------------------------------------------------


@pytest.mark.parametrize("scheme", SCHEMES)
@pytest.mark.parametrize("name", [".lock.pid", ".lock"])
def test_LOCK_4_a_link_in_place_of_a_lock_file_is_refused(
    tmp_path: Path, scheme: str, name: str
) -> None:
    """LOCK-4: a symbolic link planted as .lock.pid (or .lock) is refused with io_error (ELOOP)
    naming it, nothing is created and the file it points to keeps its bytes (before: the open
    truncated the target and wrote its PID there)."""
    victim = tmp_path / "victim"
    victim.write_text("precious\n")
    d = tmp_path / "s"
    d.mkdir()
    (d / name).symlink_to(victim)
    before = listing(tmp_path)
    with pytest.raises(tidelog.StorageError, match=rf"{name}.*symbolic link.*LOCK-4") as exc:
        tidelog.open(_uri(scheme, str(d)))
    assert exc.value.errno == errno.ELOOP and exc.value.code == "io_error"
    assert victim.read_text() == "precious\n"
    assert listing(tmp_path) == before


def test_LOCK_4_osfs_never_writes_through_a_link(tmp_path: Path) -> None:
    """LOCK-4: OsFS.open, through which every file tidelog writes is opened (WAL, segments,
    snapshots, progress, requests, temporary files), refuses a link at the last component;
    directories on the path are followed, and reads go through links."""
    victim = tmp_path / "victim"
    victim.write_bytes(b"precious")
    (tmp_path / "link").symlink_to(victim)
    for create in (True, False):
        with pytest.raises(OSError) as exc:
            OsFS().open(str(tmp_path / "link"), create=create)
        assert exc.value.errno == errno.ELOOP
    (tmp_path / "dangling").symlink_to(tmp_path / "nowhere")
    with pytest.raises(OSError):
        OsFS().open(str(tmp_path / "dangling"))
    assert not (tmp_path / "nowhere").exists() and victim.read_bytes() == b"precious"
    (tmp_path / "real").mkdir()
    (tmp_path / "dirlink").symlink_to(tmp_path / "real")
    OsFS().open(str(tmp_path / "dirlink" / "f")).close()  # a linked directory is followed
    h = OsFS().open_read(str(tmp_path / "link"))
    assert h.pread(8, 0) == b"precious"
    h.close()


def test_LOCK_4_a_store_root_that_is_a_link_still_opens(tmp_path: Path) -> None:
    """LOCK-4: only the last component is not followed: a store root may be a link."""
    (tmp_path / "disk2").mkdir()
    (tmp_path / "s").symlink_to(tmp_path / "disk2")
    with tidelog.open(f"file://{tmp_path / 's'}?prealloc=none") as store:
        store.topic("t").append(b"x")
    assert (tmp_path / "disk2" / "meta").is_dir()


class _FailingWrites:
    """A handle whose writes fail with EIO."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner

    def pwrite(self, data: Any, offset: int) -> None:
        raise OSError(errno.EIO, "Input/output error", self.inner.path)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


class _PidWriteFails(OsFS):
    """Writing .lock.pid fails."""

    def open(self, path: str, *, create: bool = True) -> Any:
        h = super().open(path, create=create)
        return _FailingWrites(h) if path.endswith(".lock.pid") else h


def test_LOCK_4_a_failed_pid_write_releases_the_lock(tmp_path: Path) -> None:
    """LOCK-4, FLT-3: when writing .lock.pid fails, the open raises io_error and the lock is
    released (before: a bare OSError, and the directory stayed locked by this process)."""
    from tidelog.backends.file import open_store

    root = tmp_path / "s"
    tidelog.open(f"file://{root}?prealloc=none").close()
    with pytest.raises(tidelog.StorageError, match=r"\.lock\.pid") as exc:
        open_store(_PidWriteFails(), str(root), prealloc="none")
    assert exc.value.errno == errno.EIO
    tidelog.open(f"file://{root}?prealloc=none").close()  # not Locked


# -- ERR-1 at the edges: a read-only view of a short WAL file ----------------------------------


@pytest.mark.parametrize("size", [1, 10, 63])
def test_ERR_1_readonly_view_of_a_wal_file_shorter_than_its_header(
    tmp_path: Path, size: int
) -> None:
    """ERR-1, XPR-1, WAL-1: a read-only open of a store whose WAL file is shorter than the
    64-byte header reads it as the writer does (before: BufferError from the scan's buffer)."""
    root = tmp_path / "s"
    with tidelog.open(f"file://{root}?prealloc=none&wal_recycle=0") as store:
        store.topic("t").append(b"x")
    (wal,) = (root / "wal").iterdir()
    with open(wal, "r+b") as f:
        f.truncate(size)
    with tidelog.open(f"file://{root}?readonly=true") as view:
        assert [r.payload for r in view.topic("t", create=False).read()] == [b"x"]
    with tidelog.open(f"file://{root}") as store:  # and the writer agrees
        assert [r.payload for r in store.topic("t", create=False).read()] == [b"x"]


class _RacedFS(OsFS):
    """Another process makes ``path`` between this open's check and its mkdir: the check says
    it is missing, the mkdir finds it made."""

    def __init__(self, path: str) -> None:
        super().__init__()
        self.path = os.path.normpath(path)
        self.raced = False

    def is_dir(self, path: str) -> bool:
        if os.path.normpath(path) == self.path and not self.raced:
            return False
        return super().is_dir(path)

    def exists(self, path: str) -> bool:
        if os.path.normpath(path) == self.path and not self.raced:
            return False
        return super().exists(path)

    def mkdir(self, path: str) -> bool:
        if os.path.normpath(path) == self.path and not self.raced:
            self.raced = True
            super().mkdir(path)  # the other process's
        return super().mkdir(path)


def test_URI_8_two_processes_creating_one_store_at_once(tmp_path: Path) -> None:
    """URI-8: a store directory another process created between this open's check and its
    mkdir is taken as it is and is not this open's to undo (before: it was recorded as made
    here, so a failed open, `locked` say, removed the other's directory while it was still
    empty, under the other's creation); the store opens. An SF slot's directory is prepared by
    the same code."""
    from tidelog import storedir
    from tidelog.backends.file import open_store
    from tidelog.backends.sf.backend import SLOT_LAYOUT

    root = tmp_path / "new" / "s"
    fs = _RacedFS(str(root))
    store = open_store(fs, str(root), prealloc="none")
    try:
        assert fs.raced
        store.topic("t").append(b"x")
    finally:
        store.close()
    slot = tmp_path / "sf" / "sender-1"
    fs = _RacedFS(str(slot))
    creation = storedir.prepare(fs, str(slot), SLOT_LAYOUT, "true")
    assert fs.raced and creation.created == [str(tmp_path / "sf")]  # the raced one is not its
    with tidelog.open(f"sf://{slot}") as sf:
        sf.topic("frames").append(b"x")
