"""Conformance tests: the mutation report printed at the end of the run (the score, caught /
planted, and the time to the first failure of each mutant; rows come from test_mutants.py)."""

from __future__ import annotations

import json
import os
import tempfile
from typing import Any

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
            first = (f"caught with {len(hit)}/{len(rs)} seeds; first failure after median "
                     f"{times[len(times) // 2]:.2f}s (max {times[-1]:.2f}s), example median "
                     f"{examples[len(examples) // 2]} (max {examples[-1]})")
        total = sum(r["seconds"] for r in rs)
        tr.write_line(f"  {name:<24} {r0['rule']:<12} level {r0['level']:<12} {first}; "
                      f"{total:.1f}s with shrinking")
