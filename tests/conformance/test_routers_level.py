"""The ``routers`` conformance level (spec/CONFORMANCE.md CNF-33): when it applies, what the
other levels leave to it, how ``tidelog conformance run`` selects and reports it, and the
refusal check of an implementation without routers (CNF-3, RTR-13)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

from tidelog.backend import Capabilities
from tidelog.cli_conformance import own_driver_command
from tidelog.conformance.driver import Driver
from tidelog.conformance.levels import LEVELS, ORDER, applies, level_caps
from tidelog.conformance.remote import LocalTransport, RemoteSut
from tidelog.conformance.runner import check_refusals
from tidelog.conformance.suite import session_seed
from tidelog.conformance.sut import LocalSut

ROUTED = Capabilities(persistent=True, crash_safe=True, routers=True)


def test_CNF_33_CNF_1_routers_level_applies_with_the_capability() -> None:
    """CNF-33, CNF-1, RTR-13: the level exists in the run order (before ``crash``), binds
    RTR-1..RTR-12, applies iff the implementation claims ``routers``; routers run in it and in
    ``crash`` only, and the routers level leaves queue mode out."""
    assert ORDER.index("queue") < ORDER.index("routers") < ORDER.index("crash")
    assert LEVELS["routers"].binds == "RTR-1..RTR-12"
    assert "RTR-10" in LEVELS["crash"].binds
    assert applies("routers", ROUTED, {}) is None
    unrouted = Capabilities(persistent=True, crash_safe=True)
    assert applies("routers", unrouted, {}) == "capability routers is False"
    on = {level for level in ORDER if level_caps(level, ROUTED).routers}
    assert on == {"routers", "crash", "forward"}  # forward runs no store machine
    assert not level_caps("routers", ROUTED).queue
    assert level_caps("routers", ROUTED).subscribers


class _ClaimsNoRouters(Driver):
    """A driver whose store says it lacks ``routers`` but still creates them."""

    def op_open(self, req: dict[str, Any]) -> dict[str, Any]:
        out = super().op_open(req)
        out["capabilities"]["routers"] = False
        return out


def test_CNF_3_RTR_13_lacking_routers_means_refusing_them() -> None:
    """CNF-3, RTR-13, CAP-1: an implementation that does not claim ``routers`` must refuse
    ``router`` with ``not_available``; tidelog's blockdev store does, one that creates the
    router anyway is reported."""
    honest = RemoteSut(LocalTransport(Driver(LocalSut("memory://{name}"))))
    try:
        assert check_refusals(honest) == []
    finally:
        honest.shutdown()
    liar = RemoteSut(LocalTransport(_ClaimsNoRouters(LocalSut("memory://{name}"))))
    try:
        problems = check_refusals(liar)
    finally:
        liar.shutdown()
    # its router (source = dest: a cycle, RTR-9) is refused, but not as a missing capability
    assert problems == [
        "CAP-1: routers is False but its operation raised bad_argument, not not_available"
    ], problems


def _run(template: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-P", "-m", "tidelog.cli", "conformance", "run", "--driver",
         own_driver_command(template), "--level", "routers", "--seed", str(session_seed()),
         *args],
        capture_output=True, text=True, check=False, timeout=600,
    )  # fmt: skip


def test_CNF_33_CNF_25_run_selects_and_reports_the_routers_level(tmp_path: Path) -> None:
    """CNF-33, CNF-25, CNF-1: `tidelog conformance run --level routers` runs the level and lists
    it among the passed ones for a store with routers; for one without (a blockdev ring) it
    reports N/A with the reason, never a pass, and exits 0."""
    run = _run("memory://{name}", "--examples", "5", "--steps", "15")
    assert run.returncode == 0, run.stdout + run.stderr
    assert "PASS routers" in run.stdout and "passed levels: routers" in run.stdout, run.stdout
    ring = f"blockdev://{tmp_path}/{{name}}.img?size=7168&page_size=512&topic=t0"
    run = _run(ring)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "N/A  routers      capability routers is False" in run.stdout, run.stdout
    assert "passed levels: none" in run.stdout, run.stdout
