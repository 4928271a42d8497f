"""tidelog's orphan drainer beside the real QuestDB client (spec/FORWARD.md FWD-31, FWD-17,
SF-16, SF-28): questdb 6.0.0 from PyPI (Rust client 7.2.0) leaves slots in a shared ``sf_dir``
(crashed with ``os._exit``), a tidelog forwarder with ``drain_orphans=on`` drains them, and the
client's own sender and orphan drainer use them afterwards. The client runs in a child process
bounded in time and killed by PID (tests/unit/sf_v2_client.py) against the stdlib listener of
tests/unit/qwp_listener.py on 127.0.0.1; a missing questdb package fails the child and the test
(never a skip).
"""

from __future__ import annotations

import contextlib
import shutil
from pathlib import Path

from qwp_listener import QwpListener, data_messages
from sf_v2_client import run_client
from test_sf_v2_slot import DATA, EXPECTED, frames_in

from tidelog.backends.sf.recovery import FAILED_FILE, examine
from tidelog.forward import Forwarder, SenderFailed
from tidelog.forward.orphans import LAST_ERROR_FILE
from tidelog.fsio import OsFS

LOCK_FILES = [".lock", ".lock.pid"]


def crashed_client_slot(sf_dir: Path, rows: int, acks: int) -> Path:
    """The client writes ``rows`` rows (1 KiB segments, so several segments), the listener
    acknowledges the first ``acks``, and the client dies with ``os._exit`` (no close)."""
    run_client(sf_dir, "orphan", rows, "exit", acks=acks, env={"SETTLE": "0.5"})
    slot = sf_dir / "orphan"
    assert len(list(slot.glob("sf-*.sfa"))) >= 2, sorted(p.name for p in slot.iterdir())
    return slot


def tidelog_drain(sf_dir: Path, port: int, **keys: object) -> dict[str, object]:
    """A tidelog forwarder (sender ``main``, nothing of its own) with drain_orphans=on; returns
    its counters once every drainer has finished."""
    base: dict[str, object] = {
        "addr": f"127.0.0.1:{port}",
        "sf_dir": sf_dir,
        "sender_id": "main",
        "drain_orphans": "on",
        "initial_connect_retry": "async",
        "reconnect_initial_backoff_millis": 5,
        "reconnect_max_backoff_millis": 20,
        "close_flush_timeout_millis": 0,
    }
    base.update(keys)
    fwd = Forwarder("ws::" + "".join(f"{k}={v};" for k, v in base.items()))
    try:
        fwd._drainers._pool.shutdown(wait=True)
        return fwd.counters()
    finally:
        with contextlib.suppress(SenderFailed):  # a closed port spends main's budget too
            fwd.close()


def drain_to_listener(sf_dir: Path, **keys: object) -> tuple[dict[str, object], list[bytes]]:
    """``tidelog_drain`` to a stdlib listener that acknowledges everything: the counters and
    every message the listener received."""
    listener = QwpListener()
    try:
        return tidelog_drain(sf_dir, listener.port, **keys), listener.messages
    finally:
        listener.stop()


def acked_fsn(slot: Path) -> int:
    """What the client's own recovery holds as acknowledged (SF-28 item 5), read-only."""
    found, findings = examine(OsFS(), str(slot))
    assert found is not None, findings
    return found.acked_fsn


def test_FWD_31_tidelog_drains_a_crashed_client_slot_without_failed(tmp_path: Path) -> None:
    """FWD-31, FWD-17, SF-28: a slot questdb 6.0.0 left when it crashed (25 rows, the first 8
    acknowledged) beside a tidelog forwarder with drain_orphans=on is drained to the receiver:
    its symbol-dictionary catch-up (FWD-32), then exactly the unacknowledged frames, in order,
    once each; no .failed and no .last_error is written; and the client reopening that
    sender_id afterwards sends no data frame at all (everything it would resend was
    acknowledged through tidelog) and accepts the slot."""
    sf = tmp_path / "sf"
    slot = crashed_client_slot(sf, 25, 8)
    frames = frames_in(slot)
    acked = acked_fsn(slot)
    assert 0 <= acked < max(frames)  # partly acknowledged, partly not
    counters, messages = drain_to_listener(sf)
    assert counters["total_background_drainers_succeeded"] == 1
    assert counters["total_background_drainers_failed"] == 0
    # FWD-32: the drain's connection opens with the slot's symbol-dictionary catch-up
    assert messages[0][6:8] == b"\0\0"
    assert data_messages(messages) == [frames[f] for f in range(acked + 1, max(frames) + 1)]
    assert not (slot / FAILED_FILE).exists() and not (slot / LAST_ERROR_FILE).exists()
    again = run_client(sf, "orphan", 0, "close")
    assert data_messages(again.messages) == []
    assert sorted(p.name for p in slot.iterdir()) == LOCK_FILES  # the client's drained close


def test_FWD_31_every_client_crash_state_drains_without_failed(tmp_path: Path) -> None:
    """FWD-31, FWD-17, SF-28: the four slots of tests/unit/data/sf-v2 (questdb 6.0.0 closed
    undrained, crashed with and without acknowledgements, crashed right after open with its
    hot spare), side by side in one sf_dir, are all drained by one tidelog forwarder with
    drain_orphans=on: each sends exactly its frames above the client's own ackedFsn, none gets
    .failed or .last_error, and the client reopening each afterwards sends no data frame."""
    sf = tmp_path / "sf"
    expected: dict[str, list[bytes]] = {}
    for case, (acked, published, _) in EXPECTED.items():
        shutil.copytree(DATA / case, sf / case)
        frames = frames_in(sf / case)
        expected[case] = [frames[f] for f in range(acked + 1, published + 1)]
    counters, messages = drain_to_listener(sf, max_background_drainers=1)
    assert counters["total_background_drainers_succeeded"] == len(EXPECTED)
    assert counters["total_background_drainers_failed"] == 0
    # one drainer at a time, orphans in name order: the messages are the slots one after another
    assert data_messages(messages) == [m for case in sorted(expected) for m in expected[case]]
    for case in sorted(EXPECTED):
        assert not (sf / case / FAILED_FILE).exists(), case
        assert not (sf / case / LAST_ERROR_FILE).exists(), case
        again = run_client(sf, case, 0, "close")
        assert data_messages(again.messages) == [], case
        assert sorted(p.name for p in (sf / case).iterdir()) == LOCK_FILES, case


def test_FWD_31_terminal_wire_error_leaves_last_error_and_the_client_drains_later(
    tmp_path: Path,
) -> None:
    """FWD-31, FWD-17: tidelog's drainer of a crashed client slot whose receiver is down
    spends its reconnect budget (a terminal error that is not damage): it writes .last_error
    naming the budget and no .failed, and keeps every frame. The client's own orphan drainer
    (drain_orphans=on under another sender_id) then takes the slot -- a .failed would have made
    it skip it -- delivers every frame in order, removes .last_error and closes the slot
    fully drained."""
    sf = tmp_path / "sf"
    slot = crashed_client_slot(sf, 15, 0)
    frames = frames_in(slot)
    dead = QwpListener()
    port = dead.port
    dead.stop()  # nothing listens on this port any more
    counters = tidelog_drain(sf, port, reconnect_max_duration_millis=300)
    assert counters["total_background_drainers_failed"] == 1
    assert not (slot / FAILED_FILE).exists()
    assert "budget" in (slot / LAST_ERROR_FILE).read_text()
    assert frames_in(slot) == frames
    listener = run_client(
        sf, "other", 0, "close", env={"CONF_EXTRA": "drain_orphans=on;"},
        done=lambda m: len(data_messages(m)) >= len(frames),
    )  # fmt: skip
    assert data_messages(listener.messages) == [frames[f] for f in sorted(frames)]
    assert sorted(p.name for p in slot.iterdir()) == LOCK_FILES  # .last_error removed too


def test_FWD_31_damaged_client_slot_gets_failed_as_the_client_refuses_it(tmp_path: Path) -> None:
    """FWD-31, SF-16, SF-28 item 3: a crashed client slot with a segment in the middle of its
    chain deleted (FSNs missing between head and active) is refused by tidelog's recovery, so
    its drainer writes .failed ("recovery refused") and sends nothing. An unmarked copy of the
    same damaged slot given to the client's own orphan drainer gets .failed from the client too,
    and nothing is sent: tidelog marks exactly what the client would refuse."""
    sf = tmp_path / "sf"
    slot = crashed_client_slot(sf, 25, 0)
    segments = sorted(slot.glob("sf-*.sfa"))
    assert len(segments) >= 3
    segments[1].unlink()
    client_sf = tmp_path / "client-sf"
    shutil.copytree(slot, client_sf / "orphan", ignore=shutil.ignore_patterns(".lock*"))
    counters, messages = drain_to_listener(sf)
    assert counters["total_background_drainers_failed"] == 1
    assert (slot / FAILED_FILE).read_text().startswith("recovery refused")
    assert not (slot / LAST_ERROR_FILE).exists()
    assert messages == []
    marked = client_sf / "orphan" / FAILED_FILE
    theirs = run_client(
        client_sf, "other", 0, "close", env={"CONF_EXTRA": "drain_orphans=on;"},
        done=lambda m: marked.exists(),
    )  # fmt: skip
    assert marked.exists(), sorted(p.name for p in (client_sf / "orphan").iterdir())
    assert data_messages(theirs.messages) == []
