"""The conformance levels through the remote backend (spec/SERVICE.md SVC-58..SVC-60,
spec/CONFORMANCE.md CNF-24): tidelog's driver with ``--http`` serves each store with the
service on 127.0.0.1 and runs every operation through ``http://``, in a separate process, with
the model as the oracle. ``memory://`` for the levels it claims; ``file://`` on the recording
FS for ``log`` and ``crash`` (power loss under a served store, inside operations sent over
HTTP too). Small example counts; ``TIDELOG_CONFORMANCE_EXAMPLES`` raises them."""

from __future__ import annotations

import os

import pytest
from conformance_helpers import driver_factory

from tidelog.conformance.runner import format_report, run_level
from tidelog.conformance.suite import session_seed

pytest.importorskip("aiohttp")  # the service: the serve extra (the test extra has it)

FILE_OPTIONS = (
    "background=false&commit_interval_ms=60000&prealloc=none&wal_file_bytes=64KiB"
    "&checkpoint_bytes=4KiB&segment_max_records=4&head_reserve=3"
)
EXAMPLES, STEPS = int(os.environ.get("TIDELOG_CONFORMANCE_EXAMPLES", "15")), 30

# (template, --fs, level, expected)
CASES = [
    ("memory://{name}", "os", "log", "pass"),
    ("memory://{name}", "os", "subscribers", "pass"),
    ("memory://{name}", "os", "queue", "pass"),
    ("memory://{name}", "os", "routers", "pass"),
    ("memory://{name}", "os", "crash", "n/a"),
    ("file:///c/{name}?" + FILE_OPTIONS, "recording", "log", "pass"),
    ("file:///c/{name}?" + FILE_OPTIONS, "recording", "crash", "pass"),
]


@pytest.mark.parametrize(
    ("template", "fs", "level", "expected"),
    CASES,
    ids=[f"{t.split(':')[0]}-{lv}" for t, _, lv, _ in CASES],
)
def test_level_through_http(template: str, fs: str, level: str, expected: str) -> None:
    """SVC-58, SVC-59, SVC-60, CNF-1, CNF-24: each level's verdict for a store served by the
    service and driven through the remote backend equals the in-process verdict: pass where the
    served store's capabilities make the level apply (they are the served store's, SVC-58), n/a
    where they do not; the crash level loses power under the served store (CNF-6)."""
    factory = driver_factory(template, fs=fs, http=True)
    result = run_level(factory, level, examples=EXAMPLES, steps=STEPS, seed=session_seed())
    assert result.status == expected, "\n".join(format_report([result]))
    if result.status == "n/a":
        assert result.examples == 0 and result.detail


def test_the_driver_says_it_runs_over_http() -> None:
    """CNF-24, SVC-58: `tidelog conformance driver --http` names what it runs in its hello."""
    link = driver_factory("memory://{name}", http=True)()
    try:
        assert link.hello["implementation"].endswith("over HTTP (tidelog serve, http://)")
    finally:
        link.shutdown()
