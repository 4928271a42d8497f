"""`tidelog demo` end to end, as a user runs it: its own process, its own Spark session."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.spark, pytest.mark.slow]


def test_demo_pipeline_end_to_end(tmp_path: Path) -> None:
    """Producers -> file store (fsync) -> Spark streaming -> Parquet: every row exactly once
    (SPK-9..SPK-12), the store trimmed after the final acknowledgement (SPK-10)."""
    pytest.importorskip("pyspark")
    env = dict(os.environ, PYTHONSAFEPATH="1")
    args = ["--records", "300", "--rows", "20", "--producers", "3", "--max-per-trigger", "100"]
    result = subprocess.run(
        [sys.executable, "-m", "tidelog.cli", "demo", *args, "--trigger-ms", "200"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    out = result.stdout
    assert result.returncode == 0, out + result.stderr[-3000:]
    assert "OK: 300 bundles (6,000 rows) produced" in out
    assert re.search(r"records in\s+300 bundles = 6,000 rows, 3 producers", out)
    assert re.search(r"records out\s+300 bundles = 6,000 rows", out)
    assert re.search(r"live records\s+\d+ before the final ack -> 0 after", out)
    # the report tells active WAL files from spares and says what the trim freed (diskuse.py)
    disk = r"bytes on disk\s+.+ before the final ack -> .+ after: .+ in 1 WAL file, .+ in 0 spare"
    assert re.search(disk, out), out
    assert re.search(r"trim freed\s+nothing on disk: the \d+ records the final ack trimmed", out)
    assert (tmp_path / "tidelog-data" / "meta").is_dir()
    assert list((tmp_path / "tidelog-demo-out" / "parquet").glob("*.parquet"))
