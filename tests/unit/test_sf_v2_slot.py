"""Slot format 2 read and written by tidelog (spec/FORWARD.md SF-23, SF-26..SF-29): slots the
real QuestDB client left (tests/unit/data/sf-v2/) open, verify and read without refusal and
without the acknowledged frames; read-only opens change no byte; a slot tidelog writes keeps the
client's invariants; and questdb 6.0.0 itself resumes a slot tidelog wrote, acknowledged and
trimmed without replaying an acknowledged frame (this test needs questdb==6.0.0: it fails,
never skips, when the package is missing).
"""

from __future__ import annotations

import hashlib
import shutil
from pathlib import Path

import pytest

import tidelog
from tidelog.backends.sf import format as fmt
from tidelog.backends.sf import records as rec
from tidelog.backends.sf.recovery import MANIFEST_FILE, WATERMARK_FILE, examine
from tidelog.backends.sf.slot import Slot
from tidelog.backends.sf.verify import verify_slot
from tidelog.errors import Corrupt
from tidelog.fsio import OsFS

DATA = Path(__file__).parent / "data" / "sf-v2"
AKW1 = fmt.WATERMARK_MAGIC

#: (ackedFsn, publishedFsn, files a writing open deletes) of each client slot
EXPECTED = {
    "undrained-close": (11, 19, ["sf-0000000000000002.sfa"]),
    "crash-acked": (11, 24, ["sf-0000000000000003.sfa"]),
    "crash-noserver": (-1, 14, ["sf-0000000000000002.sfa"]),
    "crash-at-open": (-1, -1, ["sf-0000000000000001.sfa"]),
}


def client_slot(tmp_path: Path, case: str) -> Path:
    slot = tmp_path / "sf" / "slot"
    shutil.copytree(DATA / case, slot)
    return slot


def frames_in(slot: Path) -> dict[int, bytes]:
    """Every CRC-valid frame of every segment, by FSN (read with the plain codecs)."""
    out: dict[int, bytes] = {}
    for seg in sorted(slot.glob("sf-*.sfa")):
        data = seg.read_bytes()
        base = fmt.decode_header(data).base_seq
        for i, off in enumerate(fmt.scan_frames(data).offsets):
            n = int.from_bytes(data[off + 4 : off + 8], "little")
            out[base + i] = data[off + 8 : off + 8 + n]
    return out


def hashes(root: Path) -> dict[str, str]:
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


@pytest.mark.parametrize("case", sorted(EXPECTED))
def test_SF_28_client_slots_read_only_then_open_and_drain(tmp_path: Path, case: str) -> None:
    """SF-28, SF-26, SF-23, SF-21: every slot the client left (clean undrained close, crash
    with acks, crash without a server, crash right after open) is format 2; examine, verify
    and a read-only view accept it and change no byte; a writing open seeds ackedFsn from the
    dual-slot watermark and the manifest's head, so the first unacknowledged frame is next and
    no acknowledged one is replayed; it deletes only the spares; the result opens again."""
    acked, published, spares = EXPECTED[case]
    slot = client_slot(tmp_path, case)
    frames = frames_in(slot)
    before = hashes(slot)
    found, findings = examine(OsFS(), str(slot))
    assert found is not None, findings
    assert (found.version, found.acked_fsn, found.published_fsn) == (2, acked, published)
    assert sorted(found.extras) == spares
    report = verify_slot(OsFS(), str(slot))
    assert report.errors == [] and not [p for p in report.problems if p.rule == "SF-1"]
    lowest = found.segments[0].base_seq if found.segments else 0
    with tidelog.open(f"sf://{slot}?readonly=true") as view:
        got = view.topic("frames", create=False).read(0, 1000)
    assert [(r.seq, r.payload) for r in got] == [  # type: ignore[union-attr]
        (f + 1, frames[f]) for f in range(lowest, published + 1)
    ]
    assert hashes(slot) == before  # read-only: not a byte changed
    with Slot.open(str(slot.parent), "slot") as s:
        assert (s.acked_fsn, s.published_fsn, s.version) == (acked, published, 2)
        start = acked + 1
        assert s.read(start, 1000) == [frames[f] for f in range(start, published + 1)]
    assert not any((slot / n).exists() for n in spares)
    with Slot.open(str(slot.parent), "slot") as s:
        assert (s.acked_fsn, s.published_fsn) == (acked, published)


def test_SF_28_refusals_match_the_client(tmp_path: Path) -> None:
    """SF-28: segments flagged MANIFEST_REQUIRED without a valid manifest refuse (as questdb
    6.0.0 does); frames beyond the manifest's active base refuse; a missing head segment
    refuses; a leftover wholly below the head is only a warning and is never replayed."""
    slot = client_slot(tmp_path / "a", "crash-noserver")
    (slot / MANIFEST_FILE).unlink()
    with pytest.raises(Corrupt, match=r"MANIFEST_REQUIRED.*\(SF-28\)"):
        Slot.open(str(slot.parent), "slot")
    slot = client_slot(tmp_path / "b", "crash-noserver")
    (slot / MANIFEST_FILE).write_bytes(bytes(rec.DUAL_FILE_SIZE))  # no valid record
    with pytest.raises(Corrupt, match="MANIFEST_REQUIRED"):
        Slot.open(str(slot.parent), "slot")
    slot = client_slot(tmp_path / "c", "crash-noserver")  # head 0, active 10; frames 0..14
    (slot / MANIFEST_FILE).write_bytes(bytes(4096) + rec.manifest_record(1, 0, 0) + bytes(4032))
    with pytest.raises(Corrupt, match="beyond the manifest's active"):
        Slot.open(str(slot.parent), "slot")
    slot = client_slot(tmp_path / "d", "crash-noserver")
    (slot / "sf-0000000000000000.sfa").unlink()
    with pytest.raises(Corrupt, match="head segment is missing"):
        Slot.open(str(slot.parent), "slot")
    slot = client_slot(tmp_path / "e", "crash-noserver")
    (slot / MANIFEST_FILE).write_bytes(
        bytes(4096) + rec.manifest_record(1, 10, 10) + bytes(4032)
    )  # the head advanced past sf-0000 (FSN 0..9); the crash came before its unlink
    found, findings = examine(OsFS(), str(slot))
    assert found is not None and found.acked_fsn == 9
    assert [f.rule for f in findings] == ["SF-28"]
    assert "below the manifest's head" in findings[0].message
    with Slot.open(str(slot.parent), "slot") as s:
        assert (s.lowest_fsn(), s.acked_fsn) == (10, 9)
    assert not (slot / "sf-0000000000000000.sfa").exists()


def test_SF_27_quarantined_names_count_for_the_next_generation(tmp_path: Path) -> None:
    """SF-27: a client's `*.sfa.corrupt` is ignored but its generation is never reused;
    `.symbol-dict` and `.last_error` are the client's and verify does not call them unknown."""
    slot = client_slot(tmp_path, "crash-at-open")
    (slot / "sf-0000000000000007.sfa.corrupt").write_bytes(b"junk")
    (slot / ".last_error").write_text("retry later")
    found, _ = examine(OsFS(), str(slot))
    assert found is not None and found.next_generation == 8
    report = verify_slot(OsFS(), str(slot))
    assert report.errors == [] and not [p for p in report.problems if p.rule == "SF-1"]
    with Slot.open(str(slot.parent), "slot", max_bytes=1024, max_total_bytes=1 << 20) as s:
        for i in range(60):  # fill the active and rotate
            s.append(b"x%d" % i + bytes(30))
        assert s.segment_names()[-1] > "sf-0000000000000007.sfa"
    assert (slot / "sf-0000000000000007.sfa.corrupt").read_bytes() == b"junk"
    assert (slot / ".last_error").read_text() == "retry later"


def test_SF_29_a_new_slot_is_format_2_and_trims_in_the_client_order(tmp_path: Path) -> None:
    """SF-29, SF-24, SF-25: a slot tidelog creates is format 2: every segment flagged
    MANIFEST_REQUIRED, the manifest's (head, active) follow rotation and trim, the watermark is
    the dual-slot record of the acked FSN (never a 16-byte record), and a reopen resumes there."""
    slot = tmp_path / "a"
    with Slot.open(str(tmp_path), "a", max_bytes=128, max_total_bytes=8192) as s:
        for i in range(30):
            s.append(b"frame-%02d" % i)
        names = s.segment_names()
        assert len(names) > 3
        bases = [fmt.decode_header((slot / n).read_bytes()).base_seq for n in names]
        man = rec.read_dual((slot / MANIFEST_FILE).read_bytes(), rec.MANIFEST_MAGIC)
        assert man is not None and (man.first, man.second) == (0, bases[-1])
        s.acknowledge(bases[2] + 1)  # inside the third segment
        assert s.apply_acks() == 2
        man = rec.read_dual((slot / MANIFEST_FILE).read_bytes(), rec.MANIFEST_MAGIC)
        assert man is not None and (man.first, man.second) == (bases[2], bases[-1])
        wm = (slot / WATERMARK_FILE).read_bytes()
        assert len(wm) == rec.DUAL_FILE_SIZE
        assert rec.read_dual(wm, AKW1).first == bases[2] + 1  # type: ignore[union-attr]
        assert fmt.decode_watermark(wm) is None  # no 16-byte record over the first half
    for n in sorted(slot.glob("sf-*.sfa")):
        assert rec.header_flags(n.read_bytes()) == rec.MANIFEST_REQUIRED
    with Slot.open(str(tmp_path), "a", max_bytes=128, max_total_bytes=8192) as s:
        assert (s.acked_fsn, s.published_fsn, s.version) == (bases[2] + 1, 29, 2)
    with Slot.open(str(tmp_path), "old", slot_format=1) as s:  # format 1 on request
        s.append(b"x")
        s.acknowledge(0)
        s.apply_acks()
    assert len((tmp_path / "old" / WATERMARK_FILE).read_bytes()) == fmt.WATERMARK_SIZE
    assert not (tmp_path / "old" / MANIFEST_FILE).exists()
    with Slot.open(str(tmp_path), "old") as s:  # a found slot keeps its format (SF-23)
        assert s.version == 1


def test_SF_29_a_client_slot_written_by_tidelog_stays_format_2(tmp_path: Path) -> None:
    """SF-29, SF-23: tidelog appends to, acknowledges and trims a client slot in format 2:
    the watermark's next record goes to the other half (the client's newest one stays
    readable until it is superseded), the manifest's head advances before the unlink."""
    slot = client_slot(tmp_path, "crash-noserver")  # frames 0..14, nothing acked
    with Slot.open(str(slot.parent), "slot", max_bytes=1024, max_total_bytes=1 << 20) as s:
        s.append(b"tidelog-15")
        s.acknowledge(12)
        assert s.apply_acks() == 1  # sf-0000 (0..9) goes, sf-0001 (10..) is kept
    wm = rec.read_dual((slot / WATERMARK_FILE).read_bytes(), AKW1)
    man = rec.read_dual((slot / MANIFEST_FILE).read_bytes(), rec.MANIFEST_MAGIC)
    assert wm is not None and wm.first == 12
    assert man is not None and (man.first, man.second) == (10, 10) and man.generation == 3
    assert not (slot / "sf-0000000000000000.sfa").exists()
    found, findings = examine(OsFS(), str(slot))
    assert found is not None and (found.acked_fsn, found.published_fsn) == (12, 15), findings


def test_SF_28_a_sync_record_of_an_older_file_claims_nothing(tmp_path: Path) -> None:
    """SF-28 item 6, SF-17: tidelog wrote a slot under sf_durability=append (a sync record
    naming generation 0); the client drained it (removing every file it knows) and wrote new
    segments from generation 0 on: the record names a file with another createdMicros, so it
    claims nothing (a warning) instead of refusing the client's slot as damaged."""
    slot = tmp_path / "slot"
    with Slot.open(str(tmp_path), "slot", durability="append", max_bytes=4096) as s:
        for i in range(30):
            s.append(b"tidelog-%02d" % i + bytes(20))
    assert (slot / ".tidelog-sync").exists()
    for p in slot.iterdir():
        if p.name not in (".lock", ".lock.pid", ".tidelog-sync"):
            p.unlink()  # the client's fully drained close
    for p in (DATA / "crash-noserver").iterdir():
        shutil.copy(p, slot / p.name)
    found, findings = examine(OsFS(), str(slot))
    assert found is not None, findings
    assert (found.acked_fsn, found.published_fsn) == (-1, 14)
    assert [f.rule for f in findings] == ["SF-17"]


def test_SF_28_an_empty_chain_below_the_active_base_refuses(tmp_path: Path) -> None:
    """SF-28 item 4: no segment holds frames, yet the manifest's head (0) is below its active
    base (5): FSNs 0..4 are missing (under sf_durability=memory a power loss can leave this).
    The client refuses it; so does tidelog, rather than accept it once and then refuse the slot
    its own writes left (found by the format-2 memory crash test)."""
    slot = client_slot(tmp_path, "crash-at-open")
    (slot / MANIFEST_FILE).write_bytes(bytes(4096) + rec.manifest_record(1, 0, 5) + bytes(4032))
    spare = slot / "sf-0000000000000001.sfa"
    data = bytearray(spare.read_bytes())
    data[8:16] = (5).to_bytes(8, "little")
    spare.write_bytes(bytes(data))
    found, findings = examine(OsFS(), str(slot))
    assert found is None and "FSNs 0..4 are missing" in findings[0].message
    with pytest.raises(Corrupt, match="SF-28"):
        Slot.open(str(slot.parent), "slot")
