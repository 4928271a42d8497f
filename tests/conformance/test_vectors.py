"""Golden vectors (spec/CONFORMANCE.md §5): ``tidelog conformance vectors``
writes every format's valid and broken files and containers with a manifest; every manifest
entry is checked here against the reference decoders, against ``tidelog verify`` (the rule ids
it must report as errors and warnings) and, for valid containers, against what tidelog's own
backends recover from them."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import tidelog
from tidelog.clock import FakeClock
from tidelog.conformance.vectors import FORMATS, decode_error, decode_file, store_content
from tidelog.errors import TidelogError
from tidelog.verify import verify_path


@pytest.fixture(scope="module")
def vectors(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any]]:
    """Written once, through the CLI (as a user would), in a fresh directory."""
    out = tmp_path_factory.mktemp("vectors") / "v"
    run = subprocess.run(
        [sys.executable, "-P", "-m", "tidelog.cli", "conformance", "vectors", "--out", str(out)],
        capture_output=True, text=True, check=False,
    )
    assert run.returncode == 0, run.stderr
    manifest = json.loads((out / "manifest.json").read_text())
    return out, manifest


def _entries(manifest: dict[str, Any], key: str) -> list[dict[str, Any]]:
    return [v for v in manifest["vectors"] if key in v]


def test_every_format_has_valid_and_broken_vectors(vectors: tuple[Path, dict[str, Any]]) -> None:
    """CNF-28, CNF-29: every format tidelog reads or writes has at least one valid and one
    broken vector, and the broken ones cover torn writes, bad checksums, bad magic, overflowing
    lengths and gaps."""
    _, manifest = vectors
    kinds: dict[str, set[bool]] = {}
    for v in manifest["vectors"]:
        kinds.setdefault(v["format"], set()).add(v["valid"])
    assert set(kinds) == set(FORMATS), set(FORMATS) ^ set(kinds)
    missing = [f for f, k in kinds.items() if k != {True, False}]
    assert not missing, f"formats without both valid and broken vectors: {missing}"
    text = " ".join(v["what"] for v in manifest["vectors"] if not v["valid"])
    for damage in ("torn", "checksum", "magic", "overflow", "gap"):
        assert damage in text, damage


def test_decoders_match_the_manifest(vectors: tuple[Path, dict[str, Any]]) -> None:
    """CNF-29: each file vector decodes to exactly the manifest's ``decode``, or raises exactly
    its typed ``error`` (code, and rule id where the codec names one)."""
    out, manifest = vectors
    checked = 0
    for v in manifest["vectors"]:
        if "decode" not in v and "error" not in v:
            continue
        data = (out / v["path"]).read_bytes()
        try:
            got: Any = decode_file(v["format"], data, v.get("params"))
        except TidelogError as exc:
            got = {"error": decode_error(exc)}
        want = v["decode"] if "decode" in v else {"error": v["error"]}
        assert json.loads(json.dumps(got)) == want, f"{v['path']}: {v['what']}"
        checked += 1
    assert checked >= 40


def test_verify_matches_the_manifest(vectors: tuple[Path, dict[str, Any]]) -> None:
    """CNF-30, CNF-31: ``tidelog verify`` recognises every container (and .qseg) vector and
    passes or fails as the manifest says, reporting exactly the expected rule ids as errors and
    as warnings, each with a path."""
    out, manifest = vectors
    entries = _entries(manifest, "verify")
    assert len(entries) >= 25
    for v in entries:
        report = verify_path(str(out / v["path"]))
        got = {
            "ok": report.ok,
            "errors": sorted({p.rule for p in report.errors}),
            "warnings": sorted({p.rule for p in report.warnings}),
        }
        assert got == v["verify"], f"{v['path']} ({v['what']}): {[str(p) for p in report.problems]}"
        assert all(p.path.startswith(str(out)) for p in report.problems)


def test_valid_containers_read_back(vectors: tuple[Path, dict[str, Any]], tmp_path: Path) -> None:
    """A valid container recovers to the manifest's ``content``: what its writer had (file
    stores and rings opened by tidelog, on a copy; SF slots through SF recovery)."""
    from tidelog.conformance.vectors import _slot_content

    out, manifest = vectors
    for v in manifest["vectors"]:
        if "content" not in v:
            continue
        src = out / v["path"]
        if v["format"] == "sf-slot":
            assert _slot_content(str(src)) == v["content"], v["path"]
            continue
        copy = tmp_path / v["path"].replace("/", "_")
        (shutil.copytree if src.is_dir() else shutil.copy)(src, copy)
        store = tidelog.open(f"{'file' if src.is_dir() else 'blockdev'}://{copy}",
                             clock=FakeClock(1_800_000_000_000))
        try:
            assert store_content(store) == v["content"], v["path"]
        finally:
            store.close()


def test_verify_cli_explains_problems(vectors: tuple[Path, dict[str, Any]]) -> None:
    """CNF-30, CNF-31: ``tidelog verify PATH`` names file, offset and rule, and exits 1 on
    errors, 0 on warnings only."""
    out, _ = vectors
    bad = subprocess.run(
        [sys.executable, "-P", "-m", "tidelog.cli", "verify", str(out / "sf-slot" / "bad-magic")],
        capture_output=True, text=True, check=False,
    )
    assert bad.returncode == 1
    assert "[SF-3]" in bad.stdout and "@ 0" in bad.stdout, bad.stdout
    warn = subprocess.run(
        [sys.executable, "-P", "-m", "tidelog.cli", "verify",
         str(out / "blockdev-image" / "torn-head-page.img")],
        capture_output=True, text=True, check=False,
    )
    assert warn.returncode == 0 and "[BDEV-22]" in warn.stdout, warn.stdout
    assert os.path.isdir(out / "file-store" / "valid")
