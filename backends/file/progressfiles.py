"""Subscriber progress files (PRG, Quiver format): one per subscriber in its topic's directory,
replaced atomically (write tmp, fsync, rename, fsync dir). Progress is at-least-once (DUR-9): a
crash may lose acks made since the last write, never invent one."""

from __future__ import annotations

import os

from tidelog.errors import Corrupt
from tidelog.fsio import FS, make_dirs, replace_file

from ..common.progress import SubState
from .format import progress as prgfmt

__all__ = ["topic_dir", "write_progress", "read_progress", "remove_progress"]


def topic_dir(root: str, tid: int) -> str:
    return os.path.join(root, "topics", f"{tid:016x}")


def _path(root: str, tid: int, name: str) -> str:
    return os.path.join(topic_dir(root, tid), prgfmt.file_name(name))


def write_progress(fs: FS, root: str, tid: int, name: str, s: SubState) -> None:
    directory = topic_dir(root, tid)
    make_dirs(fs, directory)
    gaps = s.gaps
    if len(gaps) > prgfmt.MAX_GAPS:  # PRG-10: the last ones merged (at-least-once)
        keep = prgfmt.MAX_GAPS - 1
        gaps = [*gaps[:keep], (gaps[keep][0], gaps[-1][1])]
    data = prgfmt.encode_progress(s.hwm, [q for q in s.outcomes if q > s.hwm], s.base, gaps)
    replace_file(fs, _path(root, tid, name), data)


def read_progress(fs: FS, root: str, tid: int, name: str) -> prgfmt.Progress | None:
    """The subscriber's last written progress, None if it has none. A damaged file is reported
    as corruption: progress is never guessed."""
    path = _path(root, tid, name)
    if not fs.exists(path):
        return None
    h = fs.open_read(path)
    try:
        data = h.pread(h.size(), 0)
    finally:
        h.close()
    try:
        return prgfmt.decode_progress(data)
    except Corrupt as exc:
        raise Corrupt(f"{path}: {exc.message} (PRG)") from None


def remove_progress(fs: FS, root: str, tid: int, name: str) -> None:
    path = _path(root, tid, name)
    if fs.exists(path):
        fs.unlink(path)
        fs.fsync_dir(topic_dir(root, tid))
