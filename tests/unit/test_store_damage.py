"""A seeded corruption fuzzer over every file of a file:// store (spec/SPEC.md FLT-1, FLT-2):
bit flips, zeroed sectors, truncations, swapped, stray and missing files, in the WAL, snapshots,
segments, indexes and progress files, each case compared record by record with the undamaged
store. The rule for every case:

* opening and reading either raise a typed ``corrupt`` error (and ``verify`` reports an
  error), or return every acknowledged record intact or behind a tombstone;
* no record that was never written, no payload that differs, no seq handed out again (the
  head never goes back), no subscriber progress that was never made;
* ``verify`` reports an error exactly when something is refused.

CI runs a small sample; ``TIDELOG_DAMAGE_CASES=N TIDELOG_DAMAGE_SEED=S`` runs a campaign.
"""

from __future__ import annotations

import os
import random
import shutil
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import pytest
from damage_report import report

import tidelog
from tidelog.backends.file import FileBackend
from tidelog.backends.file.repair import repair_store
from tidelog.backends.file.verify import verify_store
from tidelog.fsio import OsFS
from tidelog.hooks import hooks
from tidelog.records import Record, Tombstone

URI_OPTS = "background=false&commit_interval_ms=60000&checkpoint_bytes=1GiB&wal_file_bytes=256KiB"
CASES = int(os.environ.get("TIDELOG_DAMAGE_CASES", "120"))
SEED = int(os.environ.get("TIDELOG_DAMAGE_SEED", "20261127"))
TOPICS = ("a", "b")


@dataclass
class Snapshot:
    """What the undamaged store holds, as a reader sees it."""

    records: dict[str, dict[int, tuple[bytes, str | None]]]
    heads: dict[str, int]
    hwm: int
    polled: set[int]  # seqs the subscriber's polls return or cover with a tombstone


def _build(root: Path, *, crash: bool) -> None:
    """Two fsync topics with tags, sealed segments from two checkpoints, a WAL tail after the
    last one, a subscriber that acked part of one topic; a clean close, or a crash."""
    rng = random.Random(7)
    store = tidelog.open(f"file://{root}?{URI_OPTS}")
    b = hooks(store, FileBackend)
    # trim="none": every sealed record stays live, so a read reaches every damaged frame
    topics = {name: store.topic(name, durability="fsync", trim="none") for name in TOPICS}
    sub = topics["a"].subscribe("exp", start="earliest")
    for round_ in range(3):
        for i in range(40):
            name = TOPICS[i % 2]
            tag = None if i % 3 else f"k{i % 5}"
            topics[name].append(rng.randbytes(rng.randrange(1, 300)), tag=tag)
        topics["b"].append_many([rng.randbytes(50) for _ in range(20)])
        if round_ < 2:
            b.checkpoint()
    for rec in sub.poll(max=25):
        sub.ack(rec.seq)
    sub.flush()
    if crash:
        b.abandon()
    else:
        store.close()


def _read(root: Path) -> tuple[Snapshot, list[Tombstone]]:
    records: dict[str, dict[int, tuple[bytes, str | None]]] = {}
    heads: dict[str, int] = {}
    tombstones: list[Tombstone] = []
    with tidelog.open(f"file://{root}?{URI_OPTS}") as store:
        for name in TOPICS:
            t = store.topic(name)
            got: dict[int, tuple[bytes, str | None]] = {}
            for item in t.read(after=0, limit=100_000):
                if isinstance(item, Record):
                    got[item.seq] = (item.payload, item.tag)
                else:
                    tombstones.append(item)
            records[name] = got
            heads[name] = t.state().head_seq
        sub = store.topic("a").subscribe("exp", start="resume")
        hwm, polled = sub.hwm, set()
        while batch := sub.poll(max=1000):
            for item in batch:
                if isinstance(item, Record):
                    polled.add(item.seq)
                else:
                    polled.update(range(item.gap_from, item.gap_to + 1))
    return Snapshot(records, heads, hwm, polled), tombstones


def _files(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*") if p.is_file() and not p.name.startswith(".lock"))


def _damage(root: Path, rng: random.Random) -> str:
    """Apply one seeded mutation to the store at ``root``; returns what it did."""
    files = [p for p in _files(root) if p.stat().st_size > 0]
    victim = rng.choice(files)
    rel = victim.relative_to(root)
    data = bytearray(victim.read_bytes())
    kind = rng.choice(("flip", "flip", "flip", "zero", "truncate", "swap", "stray", "delete"))
    if kind == "flip":
        at = rng.randrange(len(data))
        data[at] ^= 1 << rng.randrange(8)
        victim.write_bytes(bytes(data))
        return f"flip {rel}@{at}"
    if kind == "zero":
        at = rng.randrange(0, len(data), 512)
        data[at : at + 512] = bytes(len(data[at : at + 512]))
        victim.write_bytes(bytes(data))
        return f"zero {rel}@{at}"
    if kind == "truncate":
        at = rng.randrange(len(data))
        victim.write_bytes(bytes(data[:at]))
        return f"truncate {rel}@{at}"
    if kind == "delete":
        victim.unlink()
        return f"delete {rel}"
    same = [p for p in files if p.suffix == victim.suffix and p != victim]
    if kind == "swap" and same:
        other = rng.choice(same)
        a, b = victim.read_bytes(), other.read_bytes()
        victim.write_bytes(b)
        other.write_bytes(a)
        return f"swap {rel} {other.relative_to(root)}"
    stray = victim.with_name(_stray_name(victim.name, rng))
    if stray.exists():
        return "none"
    shutil.copyfile(victim, stray)
    return f"stray {stray.relative_to(root)} (copy of {rel})"


def _stray_name(name: str, rng: random.Random) -> str:
    """A name of the same kind as ``name`` that the store does not have (a hex number moved)."""
    head, dot, tail = name.partition(".")
    prefix, _, number = head.rpartition("-")
    if prefix and all(c in "0123456789abcdef" for c in number):
        return f"{prefix}-{int(number, 16) + rng.randrange(1, 9):0{len(number)}x}{dot}{tail}"
    return name + ".stray"


def _check_case(root: Path, ref: Snapshot) -> str:
    """The outcome of opening and reading the damaged store ``root``; asserts the rule."""
    report = verify_store(OsFS(), str(root))
    try:
        got, tombstones = _read(root)
    except tidelog.TidelogError as exc:
        assert exc.code == "corrupt", f"refused with {exc.code}: {exc}"
        assert report.errors, f"open refused ({exc}), verify found no error"
        return "refused, " + _check_repair(root, ref)
    _check_read(got, tombstones, ref)
    if report.errors:
        return "verify-only"
    return "tombstoned" if tombstones else "intact"


def _check_repair(root: Path, ref: Snapshot) -> str:
    """REP-1..REP-5: a refused store, repaired, opens; verify finds no error; every
    acknowledged record is intact or behind a tombstone and no seq goes back. Without a valid
    snapshot (REP-5), or without any trace of the WAL it replays from (REP-4), repair refuses."""
    try:
        done = repair_store(OsFS(), str(root))
    except tidelog.Corrupt as exc:
        assert "REP-5" in exc.message or "REP-4" in exc.message, f"repair refused: {exc}"
        return "unrepairable (" + ("no snapshot" if "REP-5" in exc.message else "WAL gone") + ")"
    assert done.actions, "repair found nothing to do, yet open refused"
    errors = verify_store(OsFS(), str(root)).errors
    assert not errors, f"after repair ({done.actions}) verify reports {errors}"
    try:
        got, tombstones = _read(root)
    except tidelog.TidelogError as exc:
        raise AssertionError(f"after repair ({done.actions}) open/read: {exc}") from None
    _check_read(got, tombstones, ref)
    return "repaired with tombstones" if tombstones else "repaired intact"


def _check_read(got: Snapshot, tombstones: list[Tombstone], ref: Snapshot) -> None:
    for name in TOPICS:
        want, have = ref.records[name], got.records[name]
        extra = set(have) - set(want)
        assert not extra, f"{name}: records never written: {sorted(extra)[:5]}"
        for seq, value in have.items():
            assert value == want[seq], f"{name}: seq {seq} differs from what was written"
        missing = [s for s in want if s not in have]
        for s in missing:
            assert any(t.gap_from <= s <= t.gap_to for t in tombstones), (
                f"{name}: seq {s} is missing without a tombstone (silent loss)"
            )
        assert got.heads[name] >= ref.heads[name], f"{name}: head went back: seqs reused"
    # SUB-4, SUB-7: every record the subscriber had not acked reaches it, as itself or inside
    # a tombstone, never skipped silently
    missed = set(ref.polled) - got.polled - set(range(1, got.hwm + 1))
    assert not missed, f"subscriber never sees seqs {sorted(missed)[:5]}"
    # the hwm moves past the acked seqs only over seqs lost behind a tombstone (SUB-7: a lost
    # seq is a dropped outcome with a gap, never an ack)
    for s in range(ref.hwm + 1, got.hwm + 1):
        assert s not in got.records["a"] and any(t.gap_from <= s <= t.gap_to for t in tombstones), (
            f"subscriber progress that was never made (hwm {got.hwm}, acked {ref.hwm})"
        )


@pytest.mark.parametrize("crash", [False, True], ids=["clean-close", "crash"])
def test_FLT_1_FLT_2_damage_anywhere_in_a_store_is_refused_or_harmless(
    tmp_path: Path, crash: bool
) -> None:
    """FLT-1, FLT-2: the seeded fuzzer (module docstring). Prints the counts; the campaign
    reproduces a case from its seed and index."""
    orig = tmp_path / "orig"
    _build(orig, crash=crash)
    copy = tmp_path / "ref"
    shutil.copytree(orig, copy)
    ref, ref_tombstones = _read(copy)
    assert not ref_tombstones and all(ref.records.values())
    shutil.rmtree(orig)
    _build(orig, crash=crash)  # the reference read may have written (recovery): start afresh
    counts: Counter[str] = Counter()
    failures: list[str] = []
    for i in range(CASES):
        rng = random.Random(f"{SEED}-{crash}-{i}")
        root = tmp_path / f"case{i}"
        shutil.copytree(orig, root)
        what = _damage(root, rng)
        try:
            counts[_check_case(root, ref)] += 1
        except AssertionError as exc:
            failures.append(f"case {i} (seed {SEED}) {what}: {exc}")
        shutil.rmtree(root, ignore_errors=True)
    variant = "crash" if crash else "clean close"
    report(f"file store damage ({variant})", SEED, counts, len(failures))
    assert not failures, "\n".join(failures[:20])
