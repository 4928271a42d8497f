"""The real QuestDB client against slots tidelog wrote (spec/FORWARD.md SF-29, SF-23):
questdb 6.0.0 from PyPI (Rust client 7.2.0), same ``sf_dir`` and ``sender_id``, connected to
the stdlib listener of tests/unit/qwp_listener.py on 127.0.0.1, which counts what it sends.
The client runs in a child process bounded in time and killed by PID (sf_v2_client.py); when
the package is missing the child fails, and so does the test (it is never skipped).
"""

from __future__ import annotations

import shutil
import struct
from pathlib import Path

from sf_v2_client import run_client
from test_sf_v2_slot import DATA, frames_in

from tidelog.backends.sf.slot import Slot

TS0 = 1_700_000_000_000_000_000


def data_messages(messages: list[bytes]) -> list[bytes]:
    """QWP messages that carry tables: a symbol-dictionary catch-up has table_count 0."""
    return [m for m in messages if m[6:8] != b"\0\0"]


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
