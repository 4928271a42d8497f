"""``tidelog verify PATH``: check any of tidelog's on-disk artefacts offline, whoever wrote it
(spec/CONFORMANCE.md §5).

``verify_path`` recognises what ``PATH`` is and dispatches to that format's verifier; every
problem comes back as a ``Problem`` (path, byte offset, rule id, severity, message) in one
``Report``. It never raises on bad content.

* a directory with ``meta/``: a file-backend store (spec/FORMATS.md; ``backends.file.verify``);
* a directory holding ``sf-*.sfa`` segments or an ``.ack-watermark``: a store-and-forward slot
  (spec/FORWARD.md SF-1..SF-20, with recovery's own findings); a directory of such slots: each;
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

from tidelog.fsio import FS, OsFS, read_whole
from tidelog.report import ERROR, WARNING, Problem, Report

__all__ = ["verify_path", "verify_slot", "verify_qseg", "detect", "KINDS", "Problem", "Report"]

KINDS = ("file", "sf", "sf_dir", "qseg", "blockdev")
_PID = re.compile(r"[0-9]+\n")


def _is_slot(fs: FS, path: str) -> bool:
    from tidelog.backends.sf.format import is_segment_name
    from tidelog.backends.sf.recovery import WATERMARK_FILE

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
    """SF-1..SF-20 over one slot directory. Recovery's own ``examine`` classifies everything
    recovery reads (SF-18: what recovery refuses is an error, what it repairs or ignores a
    warning, from the same code); the lock files, ``.failed`` and unknown entries are checked
    here."""
    from tidelog.backends.sf import format as sff
    from tidelog.backends.sf.recovery import (
        FAILED_FILE,
        SYNC_FILE,
        TMP_SUFFIX,
        WATERMARK_FILE,
        examine,
    )

    report = Report(slot_dir)

    def add(severity: str, name: str | None, offset: int | None, rule: str, msg: str) -> None:
        path = posixpath.join(slot_dir, name) if name else slot_dir
        report.problems.append(Problem(path, offset, rule, severity, msg))

    try:
        names = fs.listdir(slot_dir)
        for name in names:
            if name == ".lock.pid":
                data = read_whole(fs, posixpath.join(slot_dir, name))
                if data and not _PID.fullmatch(data.decode("utf-8", "replace")):
                    add(WARNING, name, 0, "SF-2", f"expected '<pid>\\n', found {data[:40]!r}")
            elif name == FAILED_FILE:
                add(WARNING, name, None, "SF-16", "slot is marked failed: orphan drainers skip it")
            elif sff.is_segment_name(name) or name in (WATERMARK_FILE, SYNC_FILE):
                report.files_checked += 1
            elif name != ".lock" and not (
                name.endswith(TMP_SUFFIX) and sff.is_segment_name(name[: -len(TMP_SUFFIX)])
            ):
                add(WARNING, name, None, "SF-1", "unknown entry in an SF slot")
        _, findings = examine(fs, slot_dir)
    except OSError as exc:  # io_error included: verify reports, never raises
        add(ERROR, None, None, "SF-19", f"cannot read: {exc}")
        return report
    for f in findings:
        add(f.severity, f.name, f.offset, f.rule, f.message)
    return report


# -- Quiver bundle segments (spec/BUNDLES.md) ------------------------------------------------------
def verify_qseg(fs: FS, path: str) -> Report:
    """QSEG-1..QSEG-8: open the segment and decode every bundle and slot stream; any damage is
    an error (a reader skips the whole file)."""
    from tidelog.backends.file.format.qseg import QsegError, open_qseg

    report = Report(path)
    try:
        data = read_whole(fs, path)
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
