"""``tidelog verify`` of an instances root (spec/INSTANCES.md INST-20): the shared part and
every instance, findings prefixed by the instance, one damaged instance never stopping the
checks of the others."""

from __future__ import annotations

import json
from pathlib import Path

from click.testing import CliRunner

import tidelog
from tidelog.backends.instances import merged
from tidelog.backends.instances import shared as sharedpart
from tidelog.cli import main
from tidelog.fsio import OsFS
from tidelog.report import ERROR, WARNING
from tidelog.verify import detect, verify_path


def _store(root: Path) -> None:
    """Three instances: topic t in 0 and 1 (a merged subscriber), topic u only in 2."""
    uri = f"file://{root}?instances=3"
    a, b, c = tidelog.open(uri), tidelog.open(uri), tidelog.open(uri)
    try:
        a.topic("t", cap_records=9).append_many([b"a1", b"a2"])
        b.topic("t").append(b"b1")
        merged(a.topic("t")).subscribe("s")
        c.topic("u").append(b"c1")
    finally:
        for s in (a, b, c):
            s.close()


def _damage_segment(instance: Path) -> None:
    """Flip a byte in the middle of the instance's first sealed segment's data."""
    data = next(instance.glob("topics/*/seg-*.data"))
    raw = bytearray(data.read_bytes())
    raw[len(raw) // 2] ^= 0xFF
    data.write_bytes(bytes(raw))


def test_INST_20_a_clean_root_verifies_ok(tmp_path: Path) -> None:
    """INST-20, CNF-30: detected as an instances root; the shared part and all three
    instances are read, no finding; the CLI exits 0 for a path and for the URI."""
    root = tmp_path / "s"
    _store(root)
    assert detect(str(root)) == "instances"
    report = verify_path(str(root))
    assert report.problems == [] and report.ok
    alone = verify_path(str(root / "instances" / "0"))  # one instance is a file:// store
    assert report.files_checked > 3 * alone.files_checked // 2
    for target in (str(root), f"file://{root}?instances=3"):
        result = CliRunner().invoke(main, ["verify", target])
        assert result.exit_code == 0, result.stdout
        assert result.stdout.startswith("OK:")


def test_INST_20_one_damaged_instance_is_reported_and_the_others_checked(
    tmp_path: Path,
) -> None:
    """INST-20: a byte of instance 0's segment flipped: errors, every one prefixed
    "instance 0:"; instance 2 is still checked after it (its copy of a topic left dropping
    is a warning); the CLI exits 1."""
    root = tmp_path / "s"
    _store(root)
    _damage_segment(root / "instances" / "0")
    fs = OsFS()
    found = sharedpart.read_topic(fs, str(root), "u")
    assert found is not None
    sharedpart.write_topic(fs, str(root), "u", found.config, 1, sharedpart.DROPPING)
    report = verify_path(str(root))
    assert not report.ok
    errors = report.errors
    assert errors and all(p.message.startswith("instance 0:") for p in errors), errors
    warnings = [str(p) for p in report.warnings]
    assert any("instance 2: topic 'u'" in w and "INST-6" in w for w in warnings), warnings
    result = CliRunner().invoke(main, ["verify", str(root)])
    assert result.exit_code == 1 and "instance 0:" in result.stdout


def test_INST_20_the_shared_part_is_checked(tmp_path: Path) -> None:
    """INST-20: a topic file that is not whole JSON, a config whose caps cannot be divided,
    a copy with no shared file, a stray entry of instances/ and a half-made instance."""
    root = tmp_path / "s"
    _store(root)
    (root / "config" / "t.json").write_bytes(b'{"config": {"cap_rec')
    body = json.loads((root / "config" / "u.json").read_text())
    body["config"]["cap_records"] = 2  # below the 3 instances (INST-9)
    (root / "config" / "u.json").write_text(json.dumps(body))
    (root / "instances" / "7").mkdir()
    (root / "instances" / "x").mkdir()
    report = verify_path(str(root))
    rules = sorted((p.rule, p.severity, Path(p.path).name) for p in report.problems)
    assert ("INST-5", ERROR, "t.json") in rules
    assert ("INST-9", ERROR, "u.json") in rules
    assert ("INST-2", ERROR, "7") in rules and ("INST-2", ERROR, "x") in rules
    # t and u have no valid shared config now: their copies are errors of their instances
    copies = [p.message for p in report.problems if "has no valid shared config" in p.message]
    assert sorted(m.split(":")[0] for m in copies) == ["instance 0", "instance 1", "instance 2"]
    (root / "instances.json").write_text("{}")
    bad = verify_path(str(root))
    assert [(p.rule, p.severity) for p in bad.problems] == [("INST-2", ERROR)]


def test_INST_20_a_half_made_instance_is_a_warning(tmp_path: Path) -> None:
    """INST-20, INST-3: an instance directory with entries but no snapshot (its first holder
    died creating it) and subscriber files of a dropped topic are warnings, not errors."""
    root = tmp_path / "s"
    _store(root)
    (root / "instances" / "2").rename(tmp_path / "gone")
    (root / "instances" / "2").mkdir()
    (root / "instances" / "2" / ".lock").write_bytes(b"")
    (root / "config" / "u.json").unlink()
    fs = OsFS()
    found = sharedpart.read_topic(fs, str(root), "t")
    assert found is not None
    sharedpart.write_topic(fs, str(root), "t", found.config, 1, sharedpart.DROPPED)
    report = verify_path(str(root))
    got = sorted((p.rule, p.severity) for p in report.problems)
    assert ("INST-3", WARNING) in got and ("INST-6", WARNING) in got
    # instance 0 and 1 still hold copies of t, now dropped: errors (a drop finished them)
    assert all(p.rule == "INST-6" for p in report.errors)
    assert len(report.errors) == 2
