"""``tidelog repair``: the documented way out of a refused, damaged file:// store
(spec/FORMATS.md REP-1..REP-5; FLT-2 keeps the refusal the default). The seeded fuzzer in
test_store_damage.py repairs every case it refuses; these are the exact cases."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from click.testing import CliRunner

import tidelog
from tidelog.backends.file import FileBackend
from tidelog.backends.file.format import segment as segfmt
from tidelog.backends.file.format import wal as walfmt
from tidelog.backends.file.repair import RepairReport, repair_store
from tidelog.backends.file.verify import verify_store
from tidelog.cli import main
from tidelog.fsio import OsFS
from tidelog.hooks import hooks
from tidelog.records import Record, Tombstone

OPTS = "background=false&commit_interval_ms=60000&checkpoint_bytes=1GiB&wal_file_bytes=1MiB"


def _uri(root: Path) -> str:
    return f"file://{root}?{OPTS}"


def _fill(root: Path, n: int, *, seal: bool) -> list[bytes]:
    payloads = [f"record {i:04d} ".encode() * 4 for i in range(1, n + 1)]
    store = tidelog.open(_uri(root))
    t = store.topic("t", durability="fsync", trim="none")
    for p in payloads:
        t.append(p)
    b = hooks(store, FileBackend)
    if seal:
        b.checkpoint()
    b.abandon()  # a crash: nothing after the last ack
    return payloads


def _items(root: Path) -> list[Record | Tombstone]:
    with tidelog.open(_uri(root)) as store:
        return list(store.topic("t").read(after=0, limit=10_000))


def _flip(path: Path, offset: int) -> None:
    image = bytearray(path.read_bytes())
    image[offset] ^= 0x04
    path.write_bytes(bytes(image))


def _wal(root: Path) -> Path:
    names = sorted(n for n in os.listdir(root / "wal") if walfmt.parse_file_name(n))
    return root / "wal" / names[-1]


def test_REP_4_wal_damage_repaired_with_a_tombstone_and_no_seq_reused(tmp_path: Path) -> None:
    """REP-1, REP-4: the refused WAL damage of test_wal_damage.py, repaired from the command
    line: the damaged file is copied to quarantine/ first, byte for byte; ops before the damage
    stay; every seq from it to the last one the file names is behind one tombstone; a new append
    gets the next seq (none reused); verify is clean; a second repair finds nothing to do."""
    _fill(tmp_path, 30, seal=False)
    path = _wal(tmp_path)
    victim = [f for f in walfmt.scan_file(path.read_bytes()).frames if f.type == 1][11]
    _flip(path, victim.offset + 60)
    damaged = path.read_bytes()
    with pytest.raises(tidelog.Corrupt):
        tidelog.open(_uri(tmp_path))
    dry = CliRunner().invoke(main, ["repair", str(tmp_path), "--dry-run"])
    assert dry.exit_code == 0 and "would do:" in dry.output
    assert path.read_bytes() == damaged and not (tmp_path / "quarantine").exists()
    run = CliRunner().invoke(main, ["repair", f"file://{tmp_path}"])
    assert run.exit_code == 0, run.output
    copies = list((tmp_path / "quarantine").rglob(path.name))
    assert len(copies) == 1 and copies[0].read_bytes() == damaged
    assert verify_store(OsFS(), str(tmp_path)).errors == []
    items = _items(tmp_path)
    assert [i.seq for i in items if isinstance(i, Record)] == list(range(1, 12))
    assert [(i.gap_from, i.gap_to) for i in items if isinstance(i, Tombstone)] == [(12, 30)]
    with tidelog.open(_uri(tmp_path)) as store:
        assert store.topic("t").append(b"after") == 31
    assert repair_store(OsFS(), str(tmp_path)).actions == []


def test_REP_2_a_damaged_segment_keeps_every_intact_record(tmp_path: Path) -> None:
    """REP-2: one damaged record frame in a sealed segment: repair re-seals every other record
    (those after the damage found through the intact .idx) and only the damaged frame's seqs
    become a loss range."""
    payloads = _fill(tmp_path, 40, seal=True)
    seg_dir = next((tmp_path / "topics").iterdir())
    data = next(seg_dir.glob("*.data"))
    scan = segfmt.scan_data(data.read_bytes())
    assert scan.problem is None
    runs = scan.runs or [(0, segfmt.HEADER_SIZE)]
    slot, offset = runs[len(runs) // 2]
    _flip(data, offset + 8)  # the frame's header: its checksum fails
    with tidelog.open(_uri(tmp_path)) as store, pytest.raises(tidelog.Corrupt):
        list(store.topic("t").read(after=0, limit=100))
    report = repair_store(OsFS(), str(tmp_path))
    assert any("segment 1" in a for a in report.actions)
    items = _items(tmp_path)
    got = {i.seq: i.payload for i in items if isinstance(i, Record)}
    gaps = [(i.gap_from, i.gap_to) for i in items if isinstance(i, Tombstone)]
    assert len(gaps) == 1
    lo, hi = gaps[0]
    assert lo == 1 + slot and set(got) | set(range(lo, hi + 1)) == set(range(1, 41))
    assert all(got[s] == payloads[s - 1] for s in got)
    assert verify_store(OsFS(), str(tmp_path)).errors == []


def test_REP_2_a_damaged_index_loses_nothing(tmp_path: Path) -> None:
    """REP-2: a damaged .idx beside an intact .data: rebuilt, every record kept, no tombstone."""
    payloads = _fill(tmp_path, 25, seal=True)
    seg_dir = next((tmp_path / "topics").iterdir())
    idx = next(seg_dir.glob("*.idx"))
    _flip(idx, 40)
    with pytest.raises(tidelog.Corrupt):
        tidelog.open(_uri(tmp_path))
    repair_store(OsFS(), str(tmp_path))
    items = _items(tmp_path)
    assert [i.payload for i in items if isinstance(i, Record)] == payloads
    assert not [i for i in items if isinstance(i, Tombstone)]


def test_REP_3_a_damaged_progress_file_redelivers_never_skips(tmp_path: Path) -> None:
    """REP-3: a damaged progress file is removed; the subscriber resumes from its base, so it
    sees again what it acked (at-least-once), never less."""
    store = tidelog.open(_uri(tmp_path))
    t = store.topic("t", durability="fsync", trim="none")
    for i in range(10):
        t.append(b"x%d" % i)
    sub = t.subscribe("s", start="earliest")
    for rec in sub.poll(max=6):
        sub.ack(rec.seq)
    sub.flush()
    store.close()
    progress = next((tmp_path / "topics").rglob("quiver.sub.s"))
    _flip(progress, 3)
    with pytest.raises(tidelog.Corrupt):
        tidelog.open(_uri(tmp_path))
    report = repair_store(OsFS(), str(tmp_path))
    assert any("redelivered" in a for a in report.actions)
    with tidelog.open(_uri(tmp_path)) as store:
        sub = store.topic("t").subscribe("s", start="resume")
        assert sub.hwm == 0
        assert [r.seq for r in sub.poll(max=100)] == list(range(1, 11))


def test_SNAP_5_one_damaged_copy_of_the_only_snapshot_costs_nothing(tmp_path: Path) -> None:
    """SNAP-5: every snapshot has a mirror; one damaged copy (of the store's only snapshot
    here) opens from the other with every record, verify warns, repair writes both anew."""
    payloads = _fill(tmp_path, 5, seal=True)
    snaps = sorted((tmp_path / "meta").iterdir())
    assert [p.suffix for p in snaps] == [".bin", ".mirror"]
    _flip(snaps[0], 20)
    report = verify_store(OsFS(), str(tmp_path))
    assert report.errors == [] and [p.rule for p in report.warnings] == ["SNAP-5"]
    assert repair_store(OsFS(), str(tmp_path)).actions
    assert verify_store(OsFS(), str(tmp_path)).problems == []
    _flip(sorted((tmp_path / "meta").iterdir())[1], 20)  # now the mirror: the file serves
    assert [i.payload for i in _items(tmp_path)] == payloads


def test_REP_5_no_valid_snapshot_is_refused(tmp_path: Path) -> None:
    """REP-5: without a valid snapshot (both copies damaged) repair refuses (exit 2, `corrupt`
    on stderr) and changes nothing."""
    _fill(tmp_path, 3, seal=False)
    for snap in (tmp_path / "meta").iterdir():
        _flip(snap, 20)
    before = {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()}
    run = CliRunner().invoke(main, ["repair", str(tmp_path)])
    assert run.exit_code == 2 and "corrupt" in run.output and "REP-5" in run.output
    assert {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()} == before


def _lagging_subscriber_repaired(root: Path, segments: int, damaged: list[int]) -> RepairReport:
    """Segments of 20 records each, a subscriber that acked 1..5 (its progress file says so),
    the first frame of each ``damaged`` segment (by its first seq) flipped, then repair."""
    store = tidelog.open(_uri(root))
    t = store.topic("t", durability="fsync", trim="none")
    sub = t.subscribe("s", start="earliest")
    b = hooks(store, FileBackend)
    for k in range(segments):  # 1..20, 21..40, ...
        t.append_many([b"r%03d" % i for i in range(20 * k + 1, 20 * k + 21)])
        b.checkpoint()
    for rec in sub.poll(max=5):
        sub.ack(rec.seq)
    sub.flush()
    store.close()
    topic = next((root / "topics").iterdir())
    for first in damaged:
        data = next(topic.glob(f"*{first:05d}.data"))
        runs = segfmt.scan_data(data.read_bytes()).runs
        assert runs is not None
        _flip(data, runs[0][1] + 8)
    return repair_store(OsFS(), str(root))


def _order(items: list[Record | Tombstone]) -> list[int | tuple[int, int]]:
    return [i.seq if isinstance(i, Record) else (i.gap_from, i.gap_to) for i in items]


def test_REP_2_SUB_4_SUB_7_a_lagging_subscriber_gets_the_gap_in_seq_order(
    tmp_path: Path,
) -> None:
    """REP-2, SUB-7: seqs repair turns into a loss range are a gap for every subscriber that
    had not resolved them (its progress file says so); SUB-4: its poll returns the records below
    the gap first, then the tombstone, then the records above it (the tombstone used to come
    first and the cursor jumped past the records below it until the next restart)."""
    _lagging_subscriber_repaired(tmp_path, 3, [21])
    with tidelog.open(_uri(tmp_path)) as store:
        got = store.topic("t").subscribe("s", start="resume").poll(max=100)
    assert _order(got) == [*range(6, 21), (21, 40), *range(41, 61)]


def test_REP_2_SUB_4_SUB_7_two_loss_ranges_with_live_records_between_are_two_gaps(
    tmp_path: Path,
) -> None:
    """REP-2, REP-1, SUB-7: repair makes two loss ranges (two damaged segments) with live
    records between them: the subscriber gets two gaps, not one over the live records; SUB-4:
    its poll returns 6..20, Tombstone(21, 40), 41..60, Tombstone(61, 80), 81..100 (one merged
    gap returned Tombstone(21, 80) and passed 41..60 over until the next restart)."""
    report = _lagging_subscriber_repaired(tmp_path, 5, [21, 61])
    assert any("tombstone for seqs 21..40, 61..80" in a for a in report.actions), report.actions
    with tidelog.open(_uri(tmp_path)) as store:
        sub = store.topic("t").subscribe("s", start="resume")
        got = sub.poll(max=200)
        assert _order(got) == [*range(6, 21), (21, 40), *range(41, 61), (61, 80), *range(81, 101)]
        sub.commit(100)
        assert sub.hwm == 100
