"""The real QuestDB client against slots tidelog wrote (spec/FORWARD.md SF-29, SF-23):
questdb 6.0.0 from PyPI (Rust client 7.2.0), same ``sf_dir`` and ``sender_id``, connected to
the stdlib listener of tests/unit/qwp_listener.py on 127.0.0.1, which counts what it sends.
The client runs in a child process bounded in time and killed by PID (sf_v2_client.py); when
the package is missing the child fails, and so does the test (it is never skipped).
"""

from __future__ import annotations

import random
import shutil
import struct
from pathlib import Path

from qwp_listener import data_messages
from sf_v2_client import run_client
from test_sf_v2_slot import DATA, frames_in, hashes

from tidelog.backends.sf import format as fmt
from tidelog.backends.sf import records as rec
from tidelog.backends.sf.recovery import MANIFEST_FILE, WATERMARK_FILE, examine
from tidelog.backends.sf.slot import Slot
from tidelog.fsio import OsFS

TS0 = 1_700_000_000_000_000_000


def test_SF_29_real_client_resumes_a_tidelog_slot_without_replaying_acked_frames(
    tmp_path: Path,
) -> None:
    """SF-29, SF-23: a slot tidelog creates (format 2), fills with 20 self-contained QWP
    messages, acknowledges through FSN 12 and trims is adopted by questdb 6.0.0 under the same
    sender_id: it sends FSNs 13..19 exactly, once each, in order, and none at or below 12 (a
    16-byte watermark would have made it replay the acknowledged frames still on disk)."""
    first = frames_in(DATA / "crash-noserver")[0]  # delta 0..1 ("s0"), one row; ts at the end
    payloads = [first[:-8] + struct.pack("<q", TS0 + k) for k in range(20)]
    with Slot.open(str(tmp_path), "slot", max_bytes=1024, max_total_bytes=1 << 20) as s:
        for p in payloads:
            s.append(p)
        s.acknowledge(12)
        assert s.apply_acks() >= 1
        assert s.lowest_fsn() <= 12  # acknowledged frames are still on disk
    listener = run_client(tmp_path, "slot", 0, "close", done=lambda m: len(data_messages(m)) >= 7)
    assert data_messages(listener.messages) == payloads[13:]
    # Fully acknowledged, the client's close drained the slot: only its lock files are left.
    assert sorted(p.name for p in (tmp_path / "slot").iterdir()) == [".lock", ".lock.pid"]


def test_SF_29_real_client_reopens_a_client_slot_tidelog_drained_in_part(
    tmp_path: Path,
) -> None:
    """SF-29, SF-28: a slot the client left after a crash (15 frames, none acknowledged) is
    opened by tidelog, acknowledged through FSN 12 and trimmed (watermark, manifest head, then
    unlink); the client then opens it again without refusing it and sends only FSNs 13 and 14
    (after its symbol-dictionary catch-up)."""
    slot = tmp_path / "slot"
    shutil.copytree(DATA / "crash-noserver", slot)
    frames = frames_in(slot)
    with Slot.open(str(tmp_path), "slot", max_bytes=1024, max_total_bytes=1 << 20) as s:
        s.acknowledge(12)
        assert s.apply_acks() == 1
    listener = run_client(tmp_path, "slot", 0, "close", done=lambda m: len(data_messages(m)) >= 2)
    assert data_messages(listener.messages) == [frames[13], frames[14]]
    assert sorted(p.name for p in slot.iterdir()) == [".lock", ".lock.pid"]


def test_SF_29_real_clients_orphan_drainer_drains_a_tidelog_slot(tmp_path: Path) -> None:
    """SF-29, SF-23, FWD-31: a slot tidelog creates (format 2) under its own sender_id, fills
    with 20 self-contained QWP messages and acknowledges through FSN 7, is an orphan to
    questdb 6.0.0 running under another sender_id with drain_orphans=on: the client's own
    drainer takes it, sends FSNs 8..19 exactly, once each and in order, and closes it fully
    drained (only the lock files stay), writing neither .failed nor .last_error."""
    first = frames_in(DATA / "crash-noserver")[0]
    payloads = [first[:-8] + struct.pack("<q", TS0 + k) for k in range(20)]
    with Slot.open(str(tmp_path), "tidelog", max_bytes=1024, max_total_bytes=1 << 20) as s:
        for p in payloads:
            s.append(p)
        s.acknowledge(7)
        s.apply_acks()
    listener = run_client(
        tmp_path, "client", 0, "close", env={"CONF_EXTRA": "drain_orphans=on;"},
        done=lambda m: len(data_messages(m)) >= 12,
    )  # fmt: skip
    assert data_messages(listener.messages) == payloads[8:]
    assert sorted(p.name for p in (tmp_path / "tidelog").iterdir()) == [".lock", ".lock.pid"]


KILL_SEED = 20261127


def value(path: Path, magic: int) -> rec.Record | None:
    return rec.read_dual(path.read_bytes(), magic) if path.exists() else None


def test_SF_28_real_client_killed_at_random_points_opens_and_hands_back(tmp_path: Path) -> None:
    """SF-28, SF-29, SF-21: questdb 6.0.0 writing 60 rows (1 KiB segments, the listener
    acknowledging the first 25) is SIGKILLed at seeded random moments, from its first open to
    after its last row. Every slot it leaves is read without a changed byte and opens without
    refusal; ackedFsn is exactly what the client itself recovers (max(head - 1, watermark));
    the frames above it read back as on disk; tidelog then acknowledges everything, and the
    client reopens the slot without refusing it and without sending a single frame again."""
    rng = random.Random(KILL_SEED)
    delays = sorted(rng.uniform(0.1, 1.6) for _ in range(8))
    for n, delay in enumerate(delays):
        sf_dir = tmp_path / f"run{n}"
        run_client(sf_dir, "slot", 60, "close", acks=25, kill_after=delay,
                   env={"SETTLE": "0.5", "ROW_SLEEP": "0.015"})  # fmt: skip
        slot = sf_dir / "slot"
        where = f"killed after {delay:.3f}s (seed {KILL_SEED})"
        if not any(slot.glob("sf-*.sfa")):
            continue  # killed before its first segment: nothing to hand over
        before = hashes(slot)
        found, findings = examine(OsFS(), str(slot))
        assert found is not None, f"{where}: {findings}"
        assert hashes(slot) == before, where
        wm = value(slot / WATERMARK_FILE, fmt.WATERMARK_MAGIC)
        man = value(slot / MANIFEST_FILE, rec.MANIFEST_MAGIC)
        floor = (man.first if man else found.segments[0].base_seq) - 1 if found.segments else -1
        mark = wm.first if wm is not None and wm.first <= found.published_fsn else -1
        assert found.acked_fsn == max(floor, mark), where
        frames = frames_in(slot)
        with Slot.open(str(sf_dir), "slot", max_bytes=1024, max_total_bytes=1 << 20) as s:
            start, end = s.acked_fsn + 1, s.published_fsn
            assert s.read(start, 1000) == [frames[f] for f in range(start, end + 1)], where
            s.acknowledge(end)
            s.apply_acks()
        listener = run_client(sf_dir, "slot", 0, "close")
        assert data_messages(listener.messages) == [], where
