"""Suite-wide set-up: Hypothesis profiles, the reproduction seed, and the installed-package guard.

Profiles (chosen by the HYPOTHESIS_PROFILE environment variable, default "dev"):
  ci   print_blob, no deadline, no example database, randomised; the seed comes from
       `--hypothesis-seed` (the nox `tests` session always passes one and prints it).
       HYPOTHESIS_MAX_EXAMPLES sets max_examples (default 100).
  dev  Hypothesis defaults, plus print_blob.

This file lives in tests/, never at the repository root: a root conftest.py would put the
repository on sys.path, and ./tidelog would shadow the installed package.
"""

from __future__ import annotations

import importlib.util
import json
import os
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, settings

REPO_ROOT = Path(__file__).resolve().parent.parent
_MUTATION_REPORT = "TIDELOG_MUTATION_REPORT"

settings.register_profile(
    "ci",
    print_blob=True,
    derandomize=False,
    deadline=None,
    database=None,
    max_examples=int(os.environ.get("HYPOTHESIS_MAX_EXAMPLES", "100")),
    suppress_health_check=[HealthCheck.too_slow],
)
settings.register_profile(
    "dev",
    print_blob=True,
    max_examples=int(os.environ.get("HYPOTHESIS_MAX_EXAMPLES", "100")),
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "dev"))


def _installed_tidelog_origin() -> Path | None:
    spec = importlib.util.find_spec("tidelog")  # locates the package without importing it
    if spec is None or spec.origin is None:
        return None
    return Path(spec.origin).resolve()


def pytest_configure(config: pytest.Config) -> None:
    if not hasattr(config, "workerinput") and _MUTATION_REPORT not in os.environ:
        # rows of tests/conformance/test_mutants.py; xdist workers, started later, inherit it
        fd, path = tempfile.mkstemp(prefix="tidelog-mutation-", suffix=".jsonl")
        os.close(fd)
        os.environ[_MUTATION_REPORT] = path
    # The nox sessions set TIDELOG_REQUIRE_INSTALLED=1: the suite must exercise the built wheel,
    # not the source folders (which have a different layout: model/ is tidelog.model only there).
    if os.environ.get("TIDELOG_REQUIRE_INSTALLED") == "1":
        origin = _installed_tidelog_origin()
        if origin is None:
            raise pytest.UsageError("tidelog is not installed in this environment")
        if origin.is_relative_to(REPO_ROOT / "tidelog"):
            raise pytest.UsageError(
                f"tidelog was imported from the source tree ({origin}), not from the installed "
                "wheel: run pytest as `python -P -m pytest` or the `pytest` script, and keep "
                "conftest.py / __init__.py out of the repository root and tests/"
            )


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> object:
    """With TIDELOG_FORBID_SKIPS=1 (the nox `tests` session, i.e. CI) a skip or an xfail is a
    failure: a test that did not run must never be counted as a pass. Tests that need what CI
    lacks live in their own nox session (e.g. tests/device), not behind a skip."""
    outcome = yield
    report = outcome.get_result()  # type: ignore[attr-defined]
    if os.environ.get("TIDELOG_FORBID_SKIPS") != "1":
        return report
    if report.skipped or hasattr(report, "wasxfail"):
        why = getattr(report, "wasxfail", None) or report.longrepr
        report.outcome = "failed"
        report.longrepr = f"did not run, and this run forbids skips (TIDELOG_FORBID_SKIPS=1): {why}"
    return report


def _seed_line(config: pytest.Config) -> str | None:
    seed = config.getoption("hypothesis_seed", default=None)
    if seed is None:
        return None
    return (
        f"hypothesis seed {seed} (profile {settings.get_current_profile_name()!r}); "
        f"reproduce with: TIDELOG_SEED={seed} python3 run.py tests"
    )


def pytest_report_header(config: pytest.Config) -> list[str]:
    lines = [f"tidelog imported from {_installed_tidelog_origin()}"]
    seed = _seed_line(config)
    if seed:
        lines.append(seed)
    return lines


def pytest_terminal_summary(
    terminalreporter: pytest.TerminalReporter, exitstatus: int, config: pytest.Config
) -> None:
    _mutation_report(terminalreporter)
    seed = _seed_line(config)
    if seed and exitstatus not in (pytest.ExitCode.OK, pytest.ExitCode.NO_TESTS_COLLECTED):
        terminalreporter.write_sep("=", "reproduce")
        terminalreporter.write_line(seed)


def _mutation_report(terminalreporter: pytest.TerminalReporter) -> None:
    """The mutation score of tests/conformance/test_mutants.py (CNF-32): caught / planted, and
    each mutant's time to its first failure (workers append rows to $TIDELOG_MUTATION_REPORT)."""
    path = os.environ.get(_MUTATION_REPORT)
    if not path or not os.path.exists(path):
        return
    with open(path, encoding="utf-8") as f:
        rows = [json.loads(line) for line in f if line.strip()]
    if not rows:
        return
    runs: dict[str, list[dict[str, Any]]] = {}
    for r in rows:
        runs.setdefault(r["mutant"], []).append(r)
    caught = sum(1 for rs in runs.values() if all(r["caught"] for r in rs))
    tr = terminalreporter
    tr.write_sep("=", f"mutation score: {caught}/{len(runs)} planted defects caught")
    for name, rs in sorted(runs.items()):
        r0 = rs[0]
        hit = [r for r in rs if r["caught"]]
        times = sorted(r["seconds_to_first"] for r in hit)
        examples = sorted(r["examples_to_first"] for r in hit)
        if not hit:
            first = "NOT CAUGHT"
        elif len(rs) == 1:
            first = f"first failure after {times[0]:.2f}s (example {examples[0]})"
        else:
            mid = (len(hit) - 1) // 2  # the lower median
            first = (f"caught with {len(hit)}/{len(rs)} seeds; first failure after median "
                     f"{times[mid]:.2f}s (max {times[-1]:.2f}s), example median "
                     f"{examples[mid]} (max {examples[-1]})")
        total = sum(r["seconds"] for r in rs)
        tr.write_line(f"  {name:<24} {r0['rule']:<12} level {r0['level']:<12} {first}; "
                      f"{total:.1f}s with shrinking")


@pytest.fixture
def s3_url(monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """A cold-tier URL (spec/TIERING.md TIER-1) into a new bucket of moto's threaded S3 server
    on 127.0.0.1, started and stopped by the test (moto keeps its buckets in the process across
    servers: a fresh name per test); credentials ``testing:testing`` in this process's
    environment (processes started earlier need them in the URL)."""
    moto_server = pytest.importorskip("moto.server")
    pafs = pytest.importorskip("pyarrow.fs")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=0)
    server.start()
    try:
        host, port = server.get_host_and_port()
        endpoint = f"{host}:{port}"
        s3 = pafs.S3FileSystem(
            endpoint_override=endpoint, scheme="http", region="us-east-1",
            access_key="testing", secret_key="testing", allow_bucket_creation=True,
        )  # fmt: skip
        bucket = f"tier-{uuid.uuid4().hex[:16]}"
        s3.create_dir(bucket)
        yield f"s3://{bucket}/cold?endpoint_override={endpoint}&scheme=http&region=us-east-1"
    finally:
        server.stop()
