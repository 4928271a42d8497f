"""tidelog's own backends through the Python conformance kit (tidelog.conformance.suite), as a
third-party backend would use it: one BackendSuite subclass each, with a URI factory and the
capabilities it claims. Which tests exist follows from the capabilities (CAP-2): the memory
backend has no crash tests, blockdev no queue level; nothing is skipped."""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile
from typing import ClassVar

from tidelog.backend import Capabilities
from tidelog.backends.blockdev import CAPABILITIES as BLOCKDEV
from tidelog.backends.file import CAPABILITIES as FILE
from tidelog.backends.memory import CAPABILITIES as MEMORY
from tidelog.conformance.suite import BackendSuite
from tidelog.conformance.sut import FS_OPENERS, FsOpener

_ROOT = tempfile.mkdtemp(prefix="tidelog-kit-")
atexit.register(shutil.rmtree, _ROOT, True)  # one root per worker process
FILE_OPTIONS = (
    "background=false&commit_interval_ms=60000&prealloc=none&wal_file_bytes=64KiB"
    "&checkpoint_bytes=4KiB"
    "&segment_max_records=4&head_reserve=3"
)


class TestMemoryBackend(BackendSuite):
    capabilities = MEMORY
    examples = 30

    def store_uri(self, name: str) -> str:
        return f"memory://{name}"


class TestHttpMemoryBackend(BackendSuite):
    """The memory backend served by the service, every level through ``http://`` (SVC-58):
    the remote store claims the served store's capabilities, so the same tests exist."""

    capabilities = MEMORY
    over_http = True
    examples = 10

    def store_uri(self, name: str) -> str:
        return f"memory://{name}"


class TestFileBackend(BackendSuite):
    capabilities = FILE
    fs_opener: ClassVar[FsOpener | None] = FS_OPENERS["file"]
    verify_format = "file"
    examples = 20

    def store_uri(self, name: str) -> str:
        return f"file://{os.path.join(_ROOT, name)}?{FILE_OPTIONS}"


class TestBlockdevBackend(BackendSuite):
    capabilities = BLOCKDEV
    fs_opener: ClassVar[FsOpener | None] = FS_OPENERS["blockdev"]
    verify_format = "blockdev"
    ring = True
    examples = 20

    def store_uri(self, name: str) -> str:
        return f"blockdev://{os.path.join(_ROOT, name)}.img?size=7168&page_size=512&topic=t0"


def test_collection_follows_capabilities() -> None:
    """CAP-2, CNF-10, CNF-11, CNF-12, CNF-33: subclasses of the BackendSuite base class (a URI
    factory, capabilities, optionally an fs_opener onto the recording FS, a verify format, or
    the service and the remote backend in between: over_http)
    collect exactly the applicable tests: a level the capabilities exempt a backend from is not
    collected at all (the routers level only for a backend claiming routers), crash workloads
    only with an fs_opener on a crash-safe backend."""
    assert TestMemoryBackend.test_level_crash is None  # type: ignore[comparison-overlap]
    assert TestHttpMemoryBackend.test_level_crash is None  # type: ignore[comparison-overlap]
    assert callable(TestHttpMemoryBackend.test_level_routers) and TestHttpMemoryBackend.over_http
    assert TestBlockdevBackend.test_level_routers is None  # type: ignore[comparison-overlap]
    assert callable(TestMemoryBackend.test_level_routers)
    assert callable(TestFileBackend.test_level_routers)
    assert TestMemoryBackend.test_crash_workloads is None  # type: ignore[comparison-overlap]
    assert TestMemoryBackend.test_level_ring is None  # type: ignore[comparison-overlap]
    assert TestBlockdevBackend.test_level_queue is None  # type: ignore[comparison-overlap]
    assert callable(TestFileBackend.test_level_crash)
    assert callable(TestFileBackend.test_crash_workloads)  # fs_opener given, crash_safe
    assert callable(TestFileBackend.test_format_roundtrip)  # verify_format given
    assert callable(TestBlockdevBackend.test_level_ring)
    assert isinstance(BLOCKDEV, Capabilities) and not BLOCKDEV.queue
