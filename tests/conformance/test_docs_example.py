"""The worked example of docs/conformance.md (a tiny third-party backend and its conformance
tests) runs as written: its two code blocks are saved as files and pytest runs them, as a user
would (docs/conformance.md: the kit documented with a complete example)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

DOC = Path(__file__).resolve().parents[2] / "docs" / "conformance.md"


def test_docs_example_runs(tmp_path: Path) -> None:
    blocks = re.findall(r"```python\n(.*?)```", DOC.read_text(encoding="utf-8"), re.S)
    assert len(blocks) >= 2, "docs/conformance.md lost its example"
    (tmp_path / "tinylog.py").write_text(blocks[0])
    (tmp_path / "test_tinylog.py").write_text(blocks[1])
    env = {**os.environ, "TIDELOG_CONFORMANCE_EXAMPLES": "10"}
    run = subprocess.run(
        [sys.executable, "-P", "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p",
         "no:xdist", "-rA", str(tmp_path / "test_tinylog.py")],
        cwd=tmp_path, env=env, capture_output=True, text=True, check=False, timeout=600,
    )
    out = run.stdout + run.stderr
    assert run.returncode == 0, out
    passed = set(re.findall(r"PASSED \S+::TestTinyBackend::(\w+)", out))
    assert passed == {
        "test_capabilities_claimed",
        "test_lacking_capabilities_refuse",
        "test_level_log",
        "test_level_subscribers",
    }, out
