"""The README's Python examples run as written (the ones that need neither Spark nor a
receiver or a service on the network: those are covered by tests/spark,
tests/stateful/test_forward.py and tests/service/test_readme_service.py)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[2] / "README.md"
_BLOCK = re.compile(r"^```python\n(.*?)^```", re.S | re.M)
_NEEDS_MORE = ("spark", "Forwarder(", "{PORT}")  # the last: tests/service/test_readme_service.py


def _blocks() -> list[str]:
    return [b for b in _BLOCK.findall(README.read_text()) if not any(k in b for k in _NEEDS_MORE)]


def test_the_runnable_readme_examples_are_the_expected_ones() -> None:
    """Five examples run here: the core API on memory://, several writer instances on
    file://, a cold tier on file://, bundles on file://, blockdev on an image. A new example
    changes this count on purpose (and runs below)."""
    assert len(_blocks()) == 5


@pytest.mark.parametrize("index", range(5))
def test_readme_example_runs(index: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)  # file://./buf and blockdev://./ring.img land here
    code = _blocks()[index]
    exec(compile(code, f"README.md python example {index + 1}", "exec"), {"__name__": "readme"})
