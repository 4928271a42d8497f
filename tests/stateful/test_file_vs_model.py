"""The stateful suite against the file backend (spec: every TOP/TMB/DEL/RET/SUB/QUE rule, and
DUR-1 through real close + recovery from disk). Tiny WAL files, checkpoint thresholds and
segments make rotation, sealing, checkpoints and replay happen within a few steps."""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile

from hypothesis import event, settings

from tidelog.conformance.machine import LogMachine

OPTIONS = (
    "wal_file_bytes=64KiB&checkpoint_bytes=4KiB&segment_max_records=4"
    "&head_reserve=3&prealloc=none&progress_flush_ms=5&commit_interval_ms=2"
)
_ROOT = tempfile.mkdtemp(prefix="tidelog-stateful-")
atexit.register(shutil.rmtree, _ROOT, True)  # one root per worker process


class FileMachine(LogMachine):
    @staticmethod
    def sut_uri(name: str) -> str:
        return f"file://{os.path.join(_ROOT, name)}?{OPTIONS}"

    def after_reopen(self) -> None:
        facts = self.sut.describe()
        if any(facts["segments"].values()):  # type: ignore[union-attr]
            event("reopened with sealed segments")
        if int(facts["snapshot"]) > 2:  # type: ignore[call-overload]
            event("reopened after several checkpoints")

    def cleanup_sut(self, name: str) -> None:
        shutil.rmtree(os.path.join(_ROOT, name), ignore_errors=True)


FileMachine.TestCase.settings = settings(
    FileMachine.TestCase.settings,
    max_examples=int(os.environ.get("TIDELOG_STATEFUL_EXAMPLES", "1000")) // 4,
    stateful_step_count=50,
    deadline=None,
)
TestFileVsModel = FileMachine.TestCase
