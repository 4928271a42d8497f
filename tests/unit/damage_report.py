"""What a damage fuzzer did (spec/SPEC.md FLT-1, FLT-2): printed, and appended as one JSON line
to $TIDELOG_DAMAGE_REPORT, which the nox `tests` and `damage` sessions sum and print, as they do
for the fault campaigns."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping


def report(name: str, seed: int | str, counts: Mapping[str, int], failures: int) -> None:
    """``counts``: outcome -> cases (refusals are the outcomes whose name says "refused");
    ``failures``: cases that broke the rule (a silent loss, a reused seq, an untyped error)."""
    cases = sum(counts.values())
    print(f"\n{name} (seed {seed}): {cases} cases, {dict(counts)}, failures {failures}")
    path = os.environ.get("TIDELOG_DAMAGE_REPORT")
    if path:
        refused = sum(n for what, n in counts.items() if "refused" in what)
        row = {"name": name, "cases": cases, "refused": refused, "failures": failures}
        with open(path, "a", encoding="utf-8") as f:
            f.write(json.dumps(row) + "\n")
