"""Offline checker for a blockdev ring image or device (spec/FORMATS-blockdev.md, BDEV-*).

``verify_image`` reads the metadata block and every page through an ``FS`` and reports each
problem with the byte offset and the rule it breaks, using the same ``Problem``/``Report`` types
as the file backend's ``verify_store``. The ring checks are recovery's own (``damage.examine``,
BDEV-22), so errors are exactly what recovery refuses and warnings what it discards or passes
over (a torn or undetectably damaged slot or page after the head, an op whose last page never
reached the device), each saying what recovery does. It never raises on bad content.
"""

from __future__ import annotations

import os
from collections.abc import Callable

from tidelog.fsio import FS
from tidelog.report import ERROR, Problem, Report

from .damage import examine, read_slots, slot_warnings
from .device import Geometry, is_block_device
from .format import META_BYTES, SLOT_BYTES, SLOT_MAGIC
from .ring import page_reader

__all__ = ["verify_image", "is_ring", "Problem", "Report"]


class _Ctx:
    def __init__(self, path: str) -> None:
        self.path = path
        self.report = Report(path)

    def add(self, severity: str, offset: int | None, rule: str, message: str) -> None:
        self.report.problems.append(Problem(self.path, offset, rule, severity, message))


def _reader(fs: FS, path: str) -> tuple[Callable[[int, int], bytes], int, Callable[[], None]]:
    """(pread, size, close) read-only; a raw block device's size comes from lseek."""
    if is_block_device(fs, path):
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        size = os.lseek(fd, 0, os.SEEK_END)
        return (lambda n, off: os.pread(fd, n, off)), size, (lambda: os.close(fd))
    h = fs.open_read(path)
    return h.pread, h.size(), h.close


def is_ring(fs: FS, path: str) -> bool:
    """``path`` is a file or device whose metadata block holds a ring slot (BDEV-2): what
    ``tidelog verify`` asks the ``blockdev`` descriptor (REG-5)."""
    try:
        if fs.is_dir(path):
            return False
        h = fs.open_read(path)
        try:
            head = h.pread(4096, 0)
        finally:
            h.close()
    except OSError:
        return False
    return head[:8] == SLOT_MAGIC or head[SLOT_BYTES : SLOT_BYTES + 8] == SLOT_MAGIC


def verify_image(fs: FS, path: str) -> Report:
    """Check the ring at ``path``; never raises on bad content."""
    ctx = _Ctx(path)
    try:
        pread, size, close = _reader(fs, path)
    except OSError as exc:
        ctx.add(ERROR, None, "BDEV-11", f"cannot open: {exc}")
        return ctx.report
    try:
        ctx.report.files_checked = 1
        _check(ctx, pread, size)
    except OSError as exc:
        ctx.add(ERROR, None, "BDEV-11", f"cannot read: {exc}")
    except Exception as exc:  # verify must not raise on garbage
        ctx.add(ERROR, None, "BDEV-1", f"cannot check: {exc!r}")
    finally:
        close()
    return ctx.report


def _check(ctx: _Ctx, pread: Callable[[int, int], bytes], size: int) -> None:
    if size < META_BYTES:
        ctx.add(ERROR, None, "BDEV-1", f"{size} bytes: too small for the metadata block")
        return
    found, bad = read_slots(pread(META_BYTES, 0))
    if not found:
        for i, err in bad:
            ctx.add(ERROR, i * SLOT_BYTES, err.rule, f"metadata slot {i}: {err.detail}")
        ctx.add(ERROR, 0, "BDEV-11", "no valid metadata slot: not a tidelog ring")
        return
    ctx.report.problems += slot_warnings(ctx.path, found, bad)
    slot = max(found, key=lambda s: s.generation)
    geom = Geometry(slot.page_size, slot.page_count)
    if size < geom.ring_bytes:
        ctx.add(ERROR, None, "BDEV-12", f"{size} bytes, the ring needs {geom.ring_bytes}")
        return
    # the checks recovery makes, in its order (BDEV-22): errors are exactly its refusals
    ctx.report.problems += examine(ctx.path, geom, slot, page_reader(pread, geom)).problems
