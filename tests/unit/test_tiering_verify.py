"""``tidelog verify`` of a store with a cold tier and of a cold tier alone (spec/TIERING.md
TIER-14): cold objects checked as hot segments are, missing objects, orphans, located
findings."""

from __future__ import annotations

import json
from pathlib import Path

from click.testing import CliRunner
from test_tiering_coldstore import _history

from tidelog.cli import main
from tidelog.report import ERROR, INFO
from tidelog.verify import verify_cold, verify_path


def _objects(cold: Path, suffix: str) -> list[Path]:
    return sorted(p for p in cold.rglob(f"*{suffix}") if "/topics/" in str(p))


def test_TIER_14_a_store_with_a_cold_tier_verifies_clean(tmp_path: Path) -> None:
    """TIER-14: the segments the state names cold (snapshot and the TIER frames replay
    applies) are no missing hot files; without the cold tier they are a warning naming
    --cold, with it their objects and the manifests are checked; the cold tier alone too."""
    root, cold = _history(tmp_path)
    alone = verify_path(str(root))
    assert alone.ok, alone.problems
    assert [p.rule for p in alone.problems] == ["TIER-14"]
    assert "--cold" in alone.problems[0].message
    both = verify_path(str(root), cold=str(cold))
    assert both.ok and not both.problems, both.problems
    assert both.files_checked > alone.files_checked + 2 * len(_objects(cold, ".data"))
    report = verify_cold(f"cold+file://{cold}")
    assert report.ok and not report.problems, report.problems
    out = CliRunner().invoke(main, ["verify", str(root), "--cold", str(cold)])
    assert out.exit_code == 0 and "0 errors, 0 warnings" in out.output, out.output


def test_TIER_14_a_flipped_byte_in_a_cold_object_is_located(tmp_path: Path) -> None:
    """TIER-14, SEG-2: one flipped payload byte in a cold .data object is an error naming the
    object's key and the frame's offset, through the store's verify and the cold tier's."""
    root, cold = _history(tmp_path)
    victim = _objects(cold, ".data")[-1]
    raw = bytearray(victim.read_bytes())
    raw[-12] ^= 0xFF  # inside the last frame
    victim.write_bytes(bytes(raw))
    key = str(victim.relative_to(cold))
    for report in (verify_path(str(root), cold=str(cold)), verify_cold(f"cold+file://{cold}")):
        assert not report.ok
        found = [p for p in report.errors if p.path.endswith(key)]
        assert found and found[0].offset is not None and 0 < found[0].offset < len(raw), found
    out = CliRunner().invoke(main, ["verify", f"cold+file://{cold}"])
    assert out.exit_code == 1 and key in out.output, out.output


def test_TIER_14_a_missing_object_and_an_orphan(tmp_path: Path) -> None:
    """TIER-14, TIER-10: an object a manifest names that is gone is an error naming it and
    who names it; an object nothing names is an orphan, reported as info (the report stays
    ok)."""
    root, cold = _history(tmp_path)
    gone = _objects(cold, ".idx")[-1]
    gone.unlink()
    stray = gone.parent / "seg-00000000000000999999.data"
    stray.write_bytes(b"junk")
    for report in (verify_path(str(root), cold=str(cold)), verify_cold(f"cold+file://{cold}")):
        missing = [p for p in report.errors if p.path.endswith(gone.name)]
        assert [p.rule for p in missing] == ["TIER-10"] and "manifest version" in missing[0].message
        orphans = [p for p in report.problems if p.severity == INFO]
        assert [Path(p.path).name for p in orphans] == [stray.name]
        assert {p.severity for p in report.problems} == {ERROR, INFO}
    gone.parent.rename(gone.parent.with_name("moved"))  # the whole topic's objects: orphans
    report = verify_cold(f"cold+file://{cold}")
    assert not report.ok  # every manifest's segments are missing now
    assert any(p.severity == INFO for p in report.problems)


def test_TIER_14_a_manifest_whose_range_disagrees_with_its_segment(tmp_path: Path) -> None:
    """TIER-14, TIER-9: a manifest version saying another seq range than its segment holds is
    an error naming the version and both ranges; one that does not parse is an error naming
    its key."""
    _, cold = _history(tmp_path)
    manifests = sorted(cold.rglob("manifest-*.json"))
    newest = manifests[-1]
    body = json.loads(newest.read_bytes())
    lo, hi = body["topics"][0]["segments"][-1]
    body["topics"][0]["segments"][-1] = [lo, hi + 1]
    newest.write_text(json.dumps(body))
    report = verify_cold(f"cold+file://{cold}")
    found = [p for p in report.errors if p.rule == "TIER-9"]
    assert len(found) == 1 and f"seqs {lo}..{hi + 1}" in found[0].message, report.problems
    assert f"holds {lo}..{hi}" in found[0].message
    manifests[0].write_bytes(b"{not json")
    report = verify_cold(f"cold+file://{cold}")
    assert any(p.path.endswith(manifests[0].name) and p.rule == "TIER-9" for p in report.errors)
