"""``tidelog verify PATH``: check any of tidelog's on-disk artefacts offline, whoever wrote it
(spec/CONFORMANCE.md §5).

``verify_path`` recognises what ``PATH`` is and dispatches to that format's verifier; every
problem comes back as a ``Problem`` (path, byte offset, rule id, severity, message) in one
``Report``. It never raises on bad content.

* a directory with ``meta/``: a file-backend store (spec/FORMATS.md; ``backends.file.verify``);
* a directory holding ``sf-*.sfa`` segments or an ``.ack-watermark``: a store-and-forward slot
  (spec/FORWARD.md SF-1..SF-16, checked here); a directory of such slots: each of them;
* a ``.qseg`` file (or any file ending in the Quiver trailer): a bundle segment
  (spec/BUNDLES.md QSEG-1..QSEG-8, checked here by decoding every bundle);
* a file or block device whose metadata block holds a ring slot: a blockdev ring
  (spec/FORMATS-blockdev.md; ``backends.blockdev.verify``);
* anything else: checked as a file-backend store, whose LAY-1 errors say why it is not one.
"""

from __future__ import annotations

import os
import posixpath
import re
from collections.abc import Callable
from itertools import pairwise

from tidelog.backends.file.verify import ERROR, WARNING, Problem, Report
from tidelog.errors import Corrupt
from tidelog.fsio import FS, OsFS

__all__ = ["verify_path", "verify_slot", "verify_qseg", "detect", "KINDS", "Problem", "Report"]

KINDS = ("file", "sf", "sf_dir", "qseg", "blockdev")
_PID = re.compile(r"[0-9]+\n")


def _read(fs: FS, path: str) -> bytes:
    h = fs.open_read(path)
    try:
        return h.pread(h.size(), 0)
    finally:
        h.close()


def _is_slot(fs: FS, path: str) -> bool:
    from tidelog.sf.format import is_segment_name
    from tidelog.sf.recovery import WATERMARK_FILE

    names = fs.listdir(path)
    return any(is_segment_name(n) or n == WATERMARK_FILE for n in names)


def detect(path: str, fs: FS | None = None) -> str | None:
    """Which of ``KINDS`` ``path`` is, or None."""
    fs = fs or OsFS()
    try:
        if fs.is_dir(path):
            if fs.is_dir(posixpath.join(path, "meta")):
                return "file"
            if _is_slot(fs, path):
                return "sf"
            subdirs = [posixpath.join(path, n) for n in fs.listdir(path)]
            if any(fs.is_dir(d) and _is_slot(fs, d) for d in subdirs):
                return "sf_dir"
            return None
        if path.endswith(".qseg"):
            return "qseg"
        h = fs.open_read(path)
        try:
            size = h.size()
            head = h.pread(4096, 0)
            tail = h.pread(8, size - 12) if size >= 16 else b""
        finally:
            h.close()
    except OSError:
        return None
    from tidelog.backends.blockdev.format import SLOT_BYTES, SLOT_MAGIC
    from tidelog.backends.file.format.qseg import MAGIC as QSEG_MAGIC

    if head[:8] == SLOT_MAGIC or head[SLOT_BYTES : SLOT_BYTES + 8] == SLOT_MAGIC:
        return "blockdev"
    if tail == QSEG_MAGIC:
        return "qseg"
    return None


def verify_path(path: str, *, kind: str | None = None, fs: FS | None = None) -> Report:
    """Check ``path`` (kind detected unless given); never raises on bad content."""
    fs = fs or OsFS()
    path = os.path.abspath(path) if isinstance(fs, OsFS) else path
    kind = kind or detect(path, fs)
    if kind == "file":
        from tidelog.backends.file.verify import verify_store

        return verify_store(fs, path)
    if kind == "blockdev":
        from tidelog.backends.blockdev.verify import verify_image

        return verify_image(fs, path)
    if kind == "sf":
        return verify_slot(fs, path)
    if kind == "sf_dir":
        report = Report(path)
        for name in fs.listdir(path):
            sub = posixpath.join(path, name)
            if fs.is_dir(sub) and _is_slot(fs, sub):
                one = verify_slot(fs, sub)
                report.problems += one.problems
                report.files_checked += one.files_checked
        return report
    if kind == "qseg":
        return verify_qseg(fs, path)
    # Not recognisably anything else: check it as a file-backend store, whose LAY-1 errors say
    # why it is not one (no such path, not a directory, no meta/, no snapshot).
    from tidelog.backends.file.verify import verify_store

    return verify_store(fs, path)


# -- store-and-forward slots (spec/FORWARD.md) -----------------------------------------------------
def verify_slot(fs: FS, slot_dir: str) -> Report:
    """SF-1..SF-16 over one slot directory: what recovery would refuse is an error, what it
    repairs or ignores (torn tails, unborn or leftover segments, an unusable watermark) a
    warning."""
    from tidelog.sf import format as sff
    from tidelog.sf.recovery import FAILED_FILE, TMP_SUFFIX, WATERMARK_FILE

    report = Report(slot_dir)

    def add(severity: str, name: str, offset: int | None, rule: str, message: str) -> None:
        report.problems.append(
            Problem(posixpath.join(slot_dir, name), offset, rule, severity, message)
        )

    segments: list[tuple[int, int, str]] = []  # (base, frames, name)
    watermark: int | None = None
    for name in fs.listdir(slot_dir):
        path = posixpath.join(slot_dir, name)
        if name in (".lock",):
            continue
        if name == ".lock.pid":
            data = _read(fs, path)
            if data and not _PID.fullmatch(data.decode("utf-8", "replace")):
                add(WARNING, name, 0, "SF-2", f"expected '<pid>\\n', found {data[:40]!r}")
            continue
        if name == FAILED_FILE:
            add(WARNING, name, None, "SF-16", "slot is marked failed: orphan drainers skip it")
            continue
        if name == WATERMARK_FILE:
            report.files_checked += 1
            raw = _read(fs, path)
            watermark = sff.decode_watermark(raw)
            if watermark is None:
                add(WARNING, name, 0, "SF-6", "not a valid watermark record (magic 'AKW1', "
                    "reserved 0, fsn >= 0): recovery ignores it and replays from the lowest "
                    "segment")
            continue
        if name.endswith(TMP_SUFFIX) and sff.is_segment_name(name[: -len(TMP_SUFFIX)]):
            add(WARNING, name, None, "SF-5", "an interrupted segment creation: recovery deletes it")
            continue
        if not sff.is_segment_name(name):
            add(WARNING, name, None, "SF-1", "unknown entry in an SF slot")
            continue
        report.files_checked += 1
        found = _check_segment(_read(fs, path), lambda *a, n=name: add(a[0], n, *a[1:]))
        if found is not None:
            segments.append((found[0], found[1], name))
    segments.sort()
    for (base, count, name), (nbase, _, nname) in pairwise(segments):
        if base + count != nbase:
            add(ERROR, nname, 8, "SF-10",
                f"baseSeq {nbase} does not follow {name} ({base} + {count} frames): a gap "
                "between segments; recovery refuses the slot")
    if segments and watermark is not None:
        published = segments[-1][0] + segments[-1][1] - 1
        if watermark > published:
            add(WARNING, WATERMARK_FILE, 8, "SF-10",
                f"watermark {watermark} above publishedFsn {published}: recovery ignores it")
    return report


def _check_segment(data: bytes, add: Callable[..., None]) -> tuple[int, int] | None:
    """(baseSeq, frames) of a valid segment, else None (problems reported through ``add``)."""
    from tidelog.sf import format as sff

    if data.count(0) == len(data):
        add(WARNING, None, "SF-8", "unborn segment (all zeros, no frame): recovery deletes it")
        return None
    if len(data) < sff.HEADER_SIZE:
        add(ERROR, 0, "SF-8", f"{len(data)} bytes, shorter than the 24-byte header: recovery "
            "refuses the slot")
        return None
    try:
        header = sff.decode_header(data, "segment")
    except Corrupt as exc:
        add(ERROR, 0, "SF-3", f"{exc.message}: recovery refuses the slot (SF-8)")
        return None
    scan = sff.scan_frames(data)
    if scan.torn_tail:
        add(WARNING, scan.last_good, "SF-7",
            f"torn tail: {scan.torn_tail} non-zero bytes after the last good frame; recovery "
            "zeroes them (SF-9), nothing acknowledged is lost")
    elif any(data[scan.last_good :]):
        add(WARNING, scan.last_good, "SF-9",
            "non-zero bytes after the last good frame: recovery zeroes them before appending")
    return header.base_seq, len(scan.offsets)


# -- Quiver bundle segments (spec/BUNDLES.md) ------------------------------------------------------
def verify_qseg(fs: FS, path: str) -> Report:
    """QSEG-1..QSEG-8: open the segment and decode every bundle and slot stream; any damage is
    an error (a reader skips the whole file)."""
    from tidelog.backends.file.format.qseg import QsegError, open_qseg

    report = Report(path)
    try:
        data = _read(fs, path)
    except OSError as exc:
        report.problems.append(Problem(path, None, "QSEG-1", ERROR, f"cannot read: {exc}"))
        return report
    report.files_checked = 1
    try:
        reader = open_qseg(data)
        for i in range(len(reader)):
            reader.bundle(i)
            reader.labels(i)
    except QsegError as exc:
        report.problems.append(Problem(path, None, exc.rule, ERROR, exc.detail))
    except Exception as exc:  # verify never raises on garbage
        report.problems.append(Problem(path, None, "QSEG-1", ERROR, f"cannot decode: {exc!r}"))
    return report
