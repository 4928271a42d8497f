"""Conformance tests: the mutation report printed at the end of the run (the score, caught /
planted, and the time to the first failure of each mutant; rows come from test_mutants.py)."""

from __future__ import annotations

import json
import os
import tempfile

import pytest

_REPORT = "TIDELOG_MUTATION_REPORT"


def pytest_configure(config: pytest.Config) -> None:
    if not hasattr(config, "workerinput") and _REPORT not in os.environ:
        fd, path = tempfile.mkstemp(prefix="tidelog-mutation-", suffix=".jsonl")
        os.close(fd)
        os.environ[_REPORT] = path  # inherited by the xdist workers started after this


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    path = os.environ.get(_REPORT)
    if not path or not os.path.exists(path):
        return
    with open(path, encoding="utf-8") as f:
        rows = [json.loads(line) for line in f if line.strip()]
    if not rows:
        return
    caught = sum(1 for r in rows if r["caught"])
    tr = terminalreporter
    tr.write_sep("=", f"mutation score: {caught}/{len(rows)} planted defects caught")
    for r in sorted(rows, key=lambda r: r["mutant"]):
        first = (f"first failure after {r['seconds_to_first']:.2f}s (example "
                 f"{r['examples_to_first']})" if r["caught"] else "NOT CAUGHT")
        tr.write_line(f"  {r['mutant']:<24} {r['rule']:<12} level {r['level']:<12} {first}; "
                      f"{r['seconds']:.1f}s with shrinking")
