"""May this directory hold a store? Checked before anything is created in it (spec URI-8).

A store directory must be absent, empty, a store, or hold only entries of the store's layout (a
creation that was interrupted); a file or a foreign non-empty directory (``file:///``,
``/proc/self``) is refused unless ``create=nonempty``. A first open that fails after creating the
directory removes what it created (``Creation.undo``), so a failed creation leaves nothing.
Used by ``file://`` stores and ``sf://`` slots; all access goes through the ``FS`` seam.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable
from dataclasses import dataclass, field

from .errors import BadOption, BadURI, StorageError, TidelogError
from .fsio import FS, storage_error
from .options import parse_bool

__all__ = ["CREATE_CHOICES", "Layout", "Creation", "parse_create", "prepare"]

#: ``true``: create what is missing; ``false``: open only an existing store; ``nonempty``: also
#: make a store in a non-empty directory that is not one
CREATE_CHOICES = ("true", "false", "nonempty")


def parse_create(key: str, value: object) -> str:
    """The ``create`` option: a boolean or ``nonempty`` (URI-8)."""
    if isinstance(value, str) and value.strip().lower() == "nonempty":
        return "nonempty"
    try:
        return "true" if parse_bool(key, value) else "false"
    except BadOption:
        raise BadOption(
            f"option {key}={value!r}: expected one of {', '.join(CREATE_CHOICES)} (URI-8)"
        ) from None


@dataclass(frozen=True)
class Layout:
    """What a store of one kind looks like at its root."""

    what: str  # with its article: "a tidelog store", "an SF slot"
    is_store: Callable[[FS, str, list[str]], bool]  # (fs, path, its entries)
    known: Callable[[str], bool]  # a name the layout may hold at the root


@dataclass
class Creation:
    """What ``prepare`` found and created, so a failed first open can undo it."""

    fs: FS
    path: str
    was_store: bool
    created: list[str] = field(default_factory=list)  # directories made, outermost first
    #: set by the opener once it holds the lock and found nothing but its own lock files: only
    #: then is everything in the directory this open's to remove
    owned: bool = False

    def undo(self, *, clear: bool = True) -> None:
        """Remove what this open created: everything in the directory if it is ``owned`` (and
        ``clear``), then the directories it made, each only if empty. Best effort: the caller
        raises the error that made it fail."""
        if self.was_store:
            return
        if clear and self.owned:
            with contextlib.suppress(OSError):
                _clear(self.fs, self.path)
        for d in reversed(self.created):
            with contextlib.suppress(OSError):
                self.fs.rmdir(d)


def _clear(fs: FS, path: str) -> None:
    """Remove everything in ``path``. Each entry is unlinked first and only listed when that
    fails (a directory): a symbolic link is removed itself, never followed."""
    for name in fs.listdir(path):
        entry = os.path.join(path, name)
        try:
            fs.unlink(entry)
        except OSError:
            _clear(fs, entry)
            fs.rmdir(entry)


def _sample(names: list[str]) -> str:
    shown = ", ".join(names[:5])
    return shown + (f", ... ({len(names)} entries)" if len(names) > 5 else "")


def prepare(fs: FS, path: str, layout: Layout, create: str) -> Creation:
    """Check ``path`` (URI-8) and create it (with missing parents, durably) when allowed.
    Raises ``BadURI`` for a file or a foreign non-empty directory, ``StorageError`` when
    ``create=false`` and there is no store, or when the file system refuses."""
    try:
        return _prepare(fs, path, layout, create)
    except TidelogError:
        raise
    except OSError as exc:
        raise storage_error(exc, f"opening {path} as {layout.what}") from None


def _prepare(fs: FS, path: str, layout: Layout, create: str) -> Creation:
    if fs.is_dir(path):
        names = fs.listdir(path)
        if names and layout.is_store(fs, path, names):
            return Creation(fs, path, was_store=True)
        if create == "false":
            raise StorageError(f"{path} is not {layout.what} (create=false, URI-8)")
        if names and create != "nonempty" and not all(layout.known(n) for n in names):
            raise BadURI(
                f"{path} is a non-empty directory that is not {layout.what} (it holds "
                f"{_sample(names)}); choose a new or empty directory, or pass create=nonempty "
                "to make one in it anyway (URI-8)"
            )
        return Creation(fs, path, was_store=False)
    if fs.exists(path):
        raise BadURI(f"{path} exists and is not a directory, so it cannot be {layout.what} (URI-8)")
    if create == "false":
        raise StorageError(f"{path} does not exist (create=false, URI-8)")
    creation = Creation(fs, path, was_store=False)
    missing: list[str] = []
    d = os.path.normpath(path)
    while not fs.is_dir(d):
        if fs.exists(d):
            raise BadURI(f"{d} exists and is not a directory, so {path} cannot be created (URI-8)")
        missing.append(d)
        parent = os.path.dirname(d)
        if parent == d:
            break
        d = parent
    try:
        for d in reversed(missing):  # outermost first; an entry is durable once its parent is
            if fs.mkdir(d):  # synced (spec/CRASH.md CRASH-4)
                creation.created.append(d)
            # else another process made it since the check (both opening a new store at once):
            # not this open's to undo, and the store's lock decides which of them writes
            fs.fsync_dir(os.path.dirname(d) or ".")
    except OSError:
        creation.undo()
        raise
    return creation
