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
from tidelog.report import ERROR, INFO, WARNING
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


def _rewrite(root: Path, name: str, **fields: object) -> None:
    """Rewrite topic ``name``'s shared file with ``fields`` changed (canonical JSON)."""
    path = root / "config" / f"{name}.json"
    body = {**json.loads(path.read_text()), **fields}
    path.write_text(json.dumps(body, separators=(",", ":"), sort_keys=True))


def _findings(root: Path) -> list[tuple[str, str, str]]:
    """(severity, file name, message) of every INST-23 finding of ``verify``."""
    report = verify_path(str(root))
    return sorted((p.severity, Path(p.path).name, p.message) for p in report.problems
                  if p.rule == "INST-23")  # fmt: skip


def test_INST_23_copies_a_crash_cannot_leave_are_errors(tmp_path: Path) -> None:
    """INST-23, INST-6: a copies list naming an instance not below N, one not empty while
    the topic is dropped, and one missing an instance that holds a copy (live, and
    dropping) are errors on the topic's shared file naming `copies`."""
    root = tmp_path / "s"
    _store(root)
    assert json.loads((root / "config" / "t.json").read_text())["copies"] == [0, 1]
    assert _findings(root) == []
    _rewrite(root, "t", copies=[0, 1, 5])
    _rewrite(root, "u", copies=[])  # instance 2 holds u
    got = _findings(root)
    assert [(s, f) for s, f, _ in got] == [(ERROR, "t.json"), (ERROR, "u.json")], got
    assert "field copies names instance 5, not one of the 3" in got[0][2]
    assert "instance 2 holds a copy but field copies does not list it" in got[1][2]
    _rewrite(root, "t", copies=[0], state="dropping")  # instance 1 holds a copy too
    _rewrite(root, "u", copies=[2], state="dropped")
    got = _findings(root)
    assert [(s, f) for s, f, _ in got] == [(ERROR, "t.json"), (ERROR, "u.json")], got
    assert "instance 1 holds a copy but field copies does not list it" in got[0][2]
    assert "field copies lists [2] while field state is dropped" in got[1][2]


def test_INST_23_what_a_crash_leaves_is_info_or_warning(tmp_path: Path) -> None:
    """INST-23, INST-6, INST-22: an instance listed in copies without a copy (a crash between
    the listing and the copy) is info; a subscriber file left `unregistering` is a warning
    naming the instances that still register it, info once none does; no error, verify
    exits 0; a subscribe of the name finishes the unregister and the finding goes."""
    root = tmp_path / "s"
    _store(root)
    _rewrite(root, "u", copies=[1, 2])  # instance 1 has no copy of u
    fs = OsFS()
    sharedpart.mark_unregistering(fs, str(root), "t", "s", "earliest")
    got = _findings(root)
    assert [(s, f) for s, f, _ in got] == [(INFO, "u.json"), (WARNING, "s.json")], got
    assert "field copies lists instance 1, which holds no copy" in got[0][2]
    assert "instances 0, 1 still register it" in got[1][2] and "next subscribe" in got[1][2]
    result = CliRunner().invoke(main, ["verify", str(root)])
    assert result.exit_code == 0, result.stdout
    uri = f"file://{root}?instances=3"
    with tidelog.open(uri) as a:
        sub = merged(a.topic("t")).subscribe("s")  # finishes the unregister, then anew
        sub.unregister()  # whole this time
    assert _findings(root) == [(INFO, "u.json", got[0][2])]
    sharedpart.mark_unregistering(fs, str(root), "t", "s", "earliest")  # after (2), not (3)
    got = _findings(root)
    assert [(s, f) for s, f, _ in got] == [(INFO, "s.json"), (INFO, "u.json")], got
    assert "no instance registers it" in got[0][2]
