"""Offline checker for a store-and-forward slot (spec/FORWARD.md SF-1..SF-20): what the ``sf``
descriptor gives ``tidelog verify`` (REG-5)."""

from __future__ import annotations

import posixpath
import re

from tidelog.fsio import FS, read_whole
from tidelog.report import ERROR, WARNING, Problem, Report

from . import format as sff
from .recovery import (
    CORRUPT_SUFFIX,
    FAILED_FILE,
    MANIFEST_FILE,
    SYNC_FILE,
    TMP_SUFFIX,
    WATERMARK_FILE,
    examine,
)

__all__ = ["is_slot", "verify_slot"]

_PID = re.compile(r"[0-9]+\n")
# SF-27, FWD-31: the client's symbol dictionary and the drainers' error notes, not slot data
_CLIENT_FILES = (".symbol-dict", ".last_error")


def is_slot(fs: FS, path: str) -> bool:
    """``path`` is a directory holding an SF segment or an ``.ack-watermark`` (SF-1)."""
    try:
        if not fs.is_dir(path):
            return False
        names = fs.listdir(path)
    except OSError:
        return False
    return any(sff.is_segment_name(n) or n in (WATERMARK_FILE, MANIFEST_FILE) for n in names)


def verify_slot(fs: FS, slot_dir: str) -> Report:
    """SF-1..SF-20 over one slot directory. Recovery's own ``examine`` classifies everything
    recovery reads (SF-18: what recovery refuses is an error, what it repairs or ignores a
    warning, from the same code); the lock files, ``.failed`` and unknown entries are checked
    here."""
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
            elif sff.is_segment_name(name) or name in (WATERMARK_FILE, SYNC_FILE, MANIFEST_FILE):
                report.files_checked += 1
            elif name in _CLIENT_FILES or name.endswith(CORRUPT_SUFFIX):
                pass  # questdb 6.0.0's own files and quarantined ones (SF-27)
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
