"""``tidelog verify PATH``: check any of tidelog's on-disk artefacts offline, whoever wrote it
(spec/CONFORMANCE.md §5).

``verify_path`` recognises what ``PATH`` is and dispatches to that format's verifier; every
problem comes back as a ``Problem`` (path, byte offset, rule id, severity, message) in one
``Report``. It never raises on bad content.

* a directory with ``instances.json``: a store of several instances (spec/INSTANCES.md
  INST-20; ``backends.instances.verify``), its shared part and every instance;
* a directory with ``meta/``: a file-backend store (spec/FORMATS.md; ``backends.file.verify``);
* a directory holding ``sf-*.sfa`` segments or an ``.ack-watermark``: a store-and-forward slot
  (spec/FORWARD.md SF-1..SF-20, with recovery's own findings); a directory of such slots: each;
* a ``.qseg`` file (or any file ending in the Quiver trailer): a bundle segment
  (spec/BUNDLES.md QSEG-1..QSEG-8, checked here by decoding every bundle);
* a file or block device whose metadata block holds a ring slot: a blockdev ring
  (spec/FORMATS-blockdev.md; ``backends.blockdev.verify``);
* ``cold+URL`` (``verify_cold``): a store's cold tier alone (spec/TIERING.md TIER-14), and
  a file store's with ``cold=``;
* what a registered backend's descriptor recognises (``detect``): its own ``verify`` (REG-5);
* anything else: checked as a file-backend store, whose LAY-1 errors say why it is not one.

Backends are recognised and checked through their registry descriptors (``detect``, ``verify``);
bundle segments and directories of slots are not backends and are handled here.
"""

from __future__ import annotations

import os
import posixpath

from tidelog import registry
from tidelog.fsio import FS, OsFS, read_whole
from tidelog.report import ERROR, Problem, Report

__all__ = [
    "verify_path",
    "verify_cold",
    "verify_slot",
    "verify_qseg",
    "detect",
    "KINDS",
    "Problem",
    "Report",
]

#: the built-in kinds; a registered backend whose descriptor can ``detect`` adds its scheme
KINDS = ("file", "instances", "sf", "sf_dir", "qseg", "blockdev")


def _is_slot(fs: FS, path: str) -> bool:
    is_slot: bool = registry.descriptor("sf").tool("detect")(fs, path)
    return is_slot


def detect(path: str, fs: FS | None = None) -> str | None:
    """Which of ``KINDS`` ``path`` is (or the scheme of a registered backend whose descriptor
    recognises it, REG-5), or None."""
    fs = fs or OsFS()
    try:
        is_dir = fs.is_dir(path)
    except OSError:
        return None
    if not is_dir and path.endswith(".qseg"):
        return "qseg"
    if is_dir:
        from tidelog.backends.instances.verify import is_instances_root

        if is_instances_root(fs, path):
            return "instances"  # INST-20: before the file store (neither has the other's marks)
    for described in registry.descriptors():  # the built-in ones first: file before sf
        if described.has("detect") and described.tool("detect")(fs, path):
            return described.scheme
    try:
        if is_dir:
            subdirs = [posixpath.join(path, n) for n in fs.listdir(path)]
            return "sf_dir" if any(_is_slot(fs, d) for d in subdirs) else None
        h = fs.open_read(path)
        try:
            size = h.size()
            tail = h.pread(8, size - 12) if size >= 16 else b""
        finally:
            h.close()
    except OSError:
        return None
    from tidelog.backends.file.format.qseg import MAGIC as QSEG_MAGIC

    return "qseg" if tail == QSEG_MAGIC else None


def verify_cold(target: str) -> Report:
    """``cold+URL``: a cold tier alone (spec/TIERING.md TIER-14)."""
    from tidelog.backends.file.verify import verify_cold as check

    return check(target)


def verify_path(
    path: str, *, kind: str | None = None, fs: FS | None = None, cold: str | None = None
) -> Report:
    """Check ``path`` (kind detected unless given); never raises on bad content. ``cold``: a
    file store's cold tier, checked with it (TIER-14)."""
    fs = fs or OsFS()
    path = os.path.abspath(path) if isinstance(fs, OsFS) else path
    kind = kind or detect(path, fs)
    if kind == "sf_dir":
        slots = Report(path)
        for name in fs.listdir(path):
            sub = posixpath.join(path, name)
            if _is_slot(fs, sub):
                one = verify_slot(fs, sub)
                slots.problems += one.problems
                slots.files_checked += one.files_checked
        return slots
    if kind == "qseg":
        return verify_qseg(fs, path)
    if kind == "instances":
        from tidelog.backends.instances.verify import verify_instances

        return verify_instances(fs, path)
    described = registry.find(kind) if kind is not None else None
    if described is None or not described.has("verify"):
        # Not recognisably anything else: check it as a file-backend store, whose LAY-1 errors
        # say why it is not one (no such path, not a directory, no meta/, no snapshot).
        described = registry.descriptor("file")
    if cold is not None and described.scheme == "file":
        report: Report = described.tool("verify")(fs, path, cold=cold)
        return report
    report = described.tool("verify")(fs, path)
    return report


# -- store-and-forward slots (spec/FORWARD.md) -----------------------------------------------------
def verify_slot(fs: FS, slot_dir: str) -> Report:
    """SF-1..SF-20 over one slot directory (``tidelog.backends.sf.verify``)."""
    check = registry.descriptor("sf").tool("verify")
    report: Report = check(fs, slot_dir)
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
