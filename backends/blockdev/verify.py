"""Offline checker for a blockdev ring image or device (spec/FORMATS-blockdev.md, BDEV-*).

``verify_image`` reads the metadata block and every page through an ``FS`` and reports each
problem with the byte offset and the rule it breaks, using the same ``Problem``/``Report`` types
as the file backend's ``verify_store``. Errors mean recovery would refuse the ring (or it holds
something recovery cannot explain); warnings are states a crash leaves that recovery handles (a
torn metadata slot, a torn last page, an op whose last page never reached the device). It never
raises on bad content.
"""

from __future__ import annotations

import os
from collections.abc import Callable

from tidelog.backends.file.verify import ERROR, WARNING, Problem, Report
from tidelog.config import TopicConfig
from tidelog.errors import Corrupt
from tidelog.fsio import FS

from .device import Geometry, is_block_device
from .format import META_BYTES, SLOT_BYTES, FormatCorrupt, Slot, decode_slot
from .ring import assemble, page_reader, scan_ring

__all__ = ["verify_image", "Problem", "Report"]


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
    slot = _check_slots(ctx, pread(META_BYTES, 0))
    if slot is None:
        return
    geom = Geometry(slot.page_size, slot.page_count)
    if size < geom.ring_bytes:
        ctx.add(ERROR, None, "BDEV-12", f"{size} bytes, the ring needs {geom.ring_bytes}")
        return
    body = slot.body
    if not isinstance(body.get("topic"), str):
        ctx.add(ERROR, slot_offset(slot), "BDEV-4", "metadata body has no topic binding")
    config = body.get("config")
    if config is not None:
        try:
            TopicConfig(**config)
        except (TypeError, ValueError) as exc:
            ctx.add(ERROR, slot_offset(slot), "BDEV-4", f"bad topic config: {exc}")
    try:
        scan = scan_ring(page_reader(pread, geom), geom, slot.ring_id)
    except FormatCorrupt as exc:
        ctx.add(ERROR, None, exc.rule, exc.detail)
        return
    except Corrupt as exc:
        ctx.add(ERROR, geom.offset(0), "RING-4", exc.message)
        return
    n = geom.page_count
    if scan.head is not None and slot.looped:  # before the first wrap such pages are unused
        retained = {p.index for p in scan.pages}
        torn = (scan.head.index + 1) % n
        if torn not in retained:
            ctx.add(
                WARNING,
                geom.offset(torn),
                "RING-4",
                f"page {torn} after the head is not part of the ring (a torn last write, or "
                "never written): recovery skips it",
            )
    elif scan.head is None and slot.num_pages:
        ctx.add(
            ERROR,
            geom.offset(0),
            "RING-5",
            f"metadata says {slot.num_pages} pages were written but pages 0 and 1 are invalid",
        )
    try:
        asm = assemble(scan)
    except FormatCorrupt as exc:
        ctx.add(ERROR, None, exc.rule, exc.detail)
        return
    if asm.dropped:
        ctx.add(ERROR, None, "BDEV-10", "; ".join(asm.notes))
    elif asm.abandoned:
        ctx.add(WARNING, None, "BDEV-10", "; ".join(asm.notes))
    if asm.records and config is None:
        ctx.add(ERROR, None, "BDEV-4", "ring pages hold records but no topic exists")
    facts = body.get("state") or {}
    if int(facts.get("head", 0)) > asm.head_seq:
        ctx.add(
            ERROR,
            slot_offset(slot),
            "BDEV-14",
            f"metadata records seq {facts['head']} as written; the ring ends at {asm.head_seq}",
        )


def slot_offset(slot: Slot) -> int:
    return ((slot.generation - 1) % 2) * SLOT_BYTES


def _check_slots(ctx: _Ctx, block: bytes) -> Slot | None:
    found: list[Slot] = []
    bad: list[tuple[int, FormatCorrupt]] = []
    for i in (0, 1):
        try:
            found.append(decode_slot(block[i * SLOT_BYTES : (i + 1) * SLOT_BYTES], i))
        except FormatCorrupt as exc:
            bad.append((i, exc))
    if not found:
        for i, err in bad:
            ctx.add(ERROR, i * SLOT_BYTES, err.rule, f"metadata slot {i}: {err.detail}")
        ctx.add(ERROR, 0, "BDEV-11", "no valid metadata slot: not a tidelog ring")
        return None
    for i, err in bad:
        if "all zeros" not in err.detail:
            ctx.add(
                WARNING,
                i * SLOT_BYTES,
                "BDEV-4",
                f"metadata slot {i}: {err.detail}; the other slot is used (torn slot write)",
            )
    return max(found, key=lambda s: s.generation)
