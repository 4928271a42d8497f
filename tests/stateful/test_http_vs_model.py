"""The stateful suite through the remote backend (spec/SERVICE.md SVC-58..SVC-60): the store
under test is ``http://`` to a live service over a ``memory://`` and over a ``file://`` store
opened in this process with the machine's clock (``tidelog.conformance.served.ServedSut``), so
TTL, lease and nack deadlines are exact (RET-4, QUE-4, QUE-5) and the model judges the whole
path: the endpoints, the wire encoding, typed errors, incarnations (TOP-10, SVC-14) and waits. A
reopen restarts the service over the reopened store (DUR-1 applies to the served store; closing
a client closes only its connections).

Small example counts: every step is several HTTP requests. ``TIDELOG_STATEFUL_EXAMPLES`` raises
them with the other stateful suites (1000 there is 25 here)."""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile

import pytest
from hypothesis import settings

from tidelog.api import Store
from tidelog.conformance.machine import LogMachine

pytest.importorskip("aiohttp")  # the service needs the serve extra (the test extra has it)
from tidelog.conformance.served import ServedSut

_ROOT = tempfile.mkdtemp(prefix="tidelog-http-stateful-")
atexit.register(shutil.rmtree, _ROOT, True)  # one root per worker process
FILE_OPTIONS = (
    "wal_file_bytes=64KiB&checkpoint_bytes=4KiB&segment_max_records=4"
    "&head_reserve=3&prealloc=none&progress_flush_ms=5&commit_interval_ms=2"
)
EXAMPLES = int(os.environ.get("TIDELOG_STATEFUL_EXAMPLES", "1000")) // 40


class ServedMachine(LogMachine):
    """``sut_uri`` names the served store; the suite's store is ``http://`` to it."""

    link: ServedSut | None = None

    def open_sut(self) -> Store:
        if self.link is None:
            self.link = ServedSut(self.sut_uri)
        return self.link.open(self.name, self.clock)  # a restart of the service (DUR-1)

    def cleanup_sut(self, name: str) -> None:
        if self.link is not None:
            self.link.dispose(name)  # stops the service, closes and deletes the store


class HttpMemoryMachine(ServedMachine):
    @staticmethod
    def sut_uri(name: str) -> str:
        return f"memory://{name}"


class HttpFileMachine(ServedMachine):
    @staticmethod
    def sut_uri(name: str) -> str:
        return f"file://{os.path.join(_ROOT, name)}?{FILE_OPTIONS}"


for machine, share in ((HttpMemoryMachine, 1), (HttpFileMachine, 2)):
    machine.TestCase.settings = settings(
        machine.TestCase.settings,
        max_examples=max(5, EXAMPLES // share),
        stateful_step_count=30,
        deadline=None,
    )
TestHttpMemoryVsModel = HttpMemoryMachine.TestCase
TestHttpFileVsModel = HttpFileMachine.TestCase
