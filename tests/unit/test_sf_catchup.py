"""FWD-32: the symbol-dictionary catch-up tidelog's forwarder sends before a client slot's
frames, byte for byte what questdb 6.0.0 (Rust client 7.2.0) sends on the same slot.

The real client runs in a child process bounded in time and killed by PID (sf_v2_client.py),
against the stdlib listener of qwp_listener.py on 127.0.0.1; when the package is missing the
child fails, and so does the test (it is never skipped).
"""

from __future__ import annotations

import shutil
import time
from pathlib import Path

import pytest
from qwp_listener import QwpListener, data_messages
from sf_v2_client import run_client
from test_sf_v2_slot import DATA, frames_in

from tidelog.backends.sf import symdict
from tidelog.backends.sf.format import crc32c
from tidelog.backends.sf.recovery import examine
from tidelog.forward import Forwarder, SenderFailed
from tidelog.forward.catchup import CatchUpTooLarge, DictMirror
from tidelog.fsio import OsFS

#: The client's `.symbol-dict` after 15 rows over 3 symbols (s0, s1, s2, one chunk each).
SYD = (DATA / "crash-noserver" / ".symbol-dict").read_bytes()
ENTRIES = b"\x02s0\x02s1\x02s2"


def catch_ups(messages: list[bytes]) -> list[bytes]:
    return [m for m in messages if m[6:8] == b"\0\0"]


def chunk(entries: list[bytes]) -> bytes:
    """One `.symbol-dict` chunk, built the way the client builds it."""
    body = b"".join(bytes([len(e)]) + e for e in entries)
    head = bytes([len(entries), len(body)])
    return head + body + crc32c(head + body).to_bytes(4, "little")


def test_FWD_32_reads_the_clients_symbol_dict() -> None:
    """FWD-32: the client's file is the SYD1 header and one CRC-32C chunk per new symbol; the
    entries come back verbatim in id order, and a chunk we build the client's way is
    byte-identical to the client's."""
    d = symdict.parse(SYD)
    assert (d.entries, d.count, d.end) == (ENTRIES, 3, len(SYD))
    assert b"SYD1\x01\0\0\0" + chunk([b"s0"]) + chunk([b"s1"]) + chunk([b"s2"]) == SYD


@pytest.mark.parametrize("cut", range(9, 35))
def test_FWD_32_a_torn_chunk_ends_the_dictionary(cut: int) -> None:
    """FWD-32: a file cut anywhere inside a chunk keeps exactly the chunks before it."""
    d = symdict.parse(SYD[:cut])
    whole = (cut - 8) // 9  # each chunk is 9 bytes
    assert (d.count, d.entries, d.end) == (whole, ENTRIES[: 3 * whole], 8 + 9 * whole)


def test_FWD_32_a_crc_bad_chunk_ends_the_dictionary() -> None:
    """FWD-32: one flipped byte in chunk 2 ("s1" -> "t1") ends the file at chunk 1, even
    though chunk 3 is intact; a bad magic or version is an empty dictionary."""
    bad = bytearray(SYD)
    bad[8 + 9 + 3] = ord("t")
    assert symdict.parse(bytes(bad)) == symdict.SymbolDict(b"\x02s0", 1, 17)
    assert symdict.parse(b"SYD2" + SYD[4:]).count == 0
    assert symdict.parse(SYD[:4] + b"\x02" + SYD[5:]).count == 0
    # a chunk whose CRC matches but whose entries do not fill it exactly
    assert symdict.parse(SYD[:8] + chunk([b"s0"])[:1] + b"\x04" + b"\x02s0\0").count == 0


def test_FWD_32_read_is_none_without_a_file_and_changes_nothing(tmp_path: Path) -> None:
    """FWD-32: a slot with no `.symbol-dict` has none (no catch-up); reading writes nothing."""
    assert symdict.read(OsFS(), str(tmp_path)) is None
    (tmp_path / ".symbol-dict").write_bytes(SYD[:20])
    assert symdict.read(OsFS(), str(tmp_path)) == symdict.SymbolDict(b"\x02s0", 1, 17)
    assert (tmp_path / ".symbol-dict").read_bytes() == SYD[:20]


def test_FWD_32_frames_extend_a_torn_dictionary() -> None:
    """FWD-32: the client's own frames define ids past a torn file (its recovery folds their
    delta sections in): with only "s0" left in the file, the 15 frames restore s1 and s2."""
    frames = frames_in(DATA / "crash-noserver")
    m = DictMirror(symdict.parse(SYD[:17]))
    assert m.fold(frames[f] for f in sorted(frames))
    assert (bytes(m.entries), m.count) == (ENTRIES, 3)
    # a frame redefining a held id differently stops the fold before it
    other = frames[0].replace(b"\x02s0", b"\x02x0", 1)
    m = DictMirror(symdict.parse(SYD[:17]))
    assert not m.fold([other, frames[1]])
    assert m.count == 1


def test_FWD_32_catch_up_messages_split_at_the_batch_cap() -> None:
    """FWD-32: one message without a cap (the client's bytes); with X-QWP-Max-Batch-Size B,
    contiguous id ranges of at most B - 28 entry bytes; an entry too large for it refuses."""
    m = DictMirror(symdict.parse(SYD))
    # as the client sent it on a reconnect (questdb 6.0.0): ids 0..2 in one message
    assert m.messages(0) == [bytes.fromhex("515750310108 0000 0b000000 0003 027330027331027332")]
    assert m.messages(28 + 6) == [
        bytes.fromhex("515750310108 0000 08000000 0002 027330027331"),
        bytes.fromhex("515750310108 0000 05000000 0201 027332"),
    ]
    assert [msg[12:14] for msg in m.messages(28 + 3)] == [b"\0\1", b"\1\1", b"\2\1"]
    with pytest.raises(CatchUpTooLarge):
        m.messages(28 + 2)
    assert DictMirror(symdict.SymbolDict(b"", 0, 0)).messages(0) == []


def fwd_conf(port: int, sf_dir: Path, extra: str = "") -> str:
    """Forward slot ``slot`` of ``sf_dir`` to 127.0.0.1:``port`` (reconnects within ms)."""
    return (
        f"ws::addr=127.0.0.1:{port};sf_dir={sf_dir};sender_id=slot;close_flush_timeout_millis=0;"
        f"reconnect_initial_backoff_millis=10;reconnect_max_backoff_millis=20;{extra}"
    )


def client_slot(sf_dir: Path) -> dict[int, bytes]:
    """A copy of the client's crashed slot (15 frames, none acknowledged) as ``slot``."""
    shutil.copytree(DATA / "crash-noserver", sf_dir / "slot")
    return frames_in(sf_dir / "slot")


def drain(port: int, sf_dir: Path, upto: int) -> None:
    """Forward until FSN ``upto`` is acknowledged."""
    with Forwarder(fwd_conf(port, sf_dir)) as fwd:
        assert fwd.wait_acked(upto, timeout=30)


def forwarder_messages(sf_dir: Path, n: int, headers: dict[str, str]) -> list[bytes]:
    """Drain slot ``slot`` of ``sf_dir`` with tidelog's forwarder until ``n`` data messages
    reached the listener; every message it got, in order."""
    listener = QwpListener(headers=headers)
    try:
        conf = fwd_conf(listener.port, sf_dir)
        with Forwarder(conf):
            deadline = time.monotonic() + 30
            while len(data_messages(listener.messages)) < n and time.monotonic() < deadline:
                time.sleep(0.02)
            time.sleep(0.3)
    finally:
        listener.stop()
    return list(listener.messages)


def tear(syd: Path, keep: int) -> None:
    """Cut ``syd`` 3 bytes into the chunk after its first ``keep`` symbols (a torn append)."""
    data = syd.read_bytes()
    end = next(n for n in range(len(data) + 1) if symdict.parse(data[:n]).count == keep)
    syd.write_bytes(data[: end + 3])


@pytest.mark.parametrize(("cap", "torn"), [(None, False), (60, False), (60, True)])
def test_FWD_32_forwarder_sends_the_catch_up_the_real_client_sends(
    tmp_path: Path, cap: int | None, torn: bool
) -> None:
    """FWD-32: questdb 6.0.0 writes 30 rows over 20 symbols (the listener acknowledging the
    first 10) and crashes. On copies of that slot, the client reopened and tidelog's
    forwarder each connect to a listener (with and without X-QWP-Max-Batch-Size; and with the
    `.symbol-dict` torn after 12 symbols, so ids 12..19 come from the unacknowledged frames'
    deltas): their catch-up messages are byte-identical, come first, and are followed by the
    same data frames in the same order (FSN 10 on)."""
    src = tmp_path / "made"
    run_client(src, "slot", 30, "exit", acks=10, env={"SYMS": "20", "SETTLE": "1.0"})
    if torn:
        tear(src / "slot" / symdict.FILE_NAME, 12)
    for name in ("client", "tidelog"):
        shutil.copytree(src, tmp_path / name)
    found, findings = examine(OsFS(), str(src / "slot"))
    assert found is not None, findings
    n = found.published_fsn - found.acked_fsn
    assert n > 0 and symdict.read(OsFS(), str(src / "slot")) is not None
    headers = {} if cap is None else {"X-QWP-Max-Batch-Size": str(cap)}
    theirs = run_client(
        tmp_path / "client", "slot", 0, "close",
        done=lambda m: len(data_messages(m)) >= n, headers=headers,
    ).messages  # fmt: skip
    ours = forwarder_messages(tmp_path / "tidelog", n, headers)
    k = len(catch_ups(theirs))
    assert k >= (1 if cap is None else 2)
    assert sum(m[13] for m in catch_ups(theirs)) == 20  # every id, the torn ones included
    assert theirs[:k] == catch_ups(theirs)  # the client's catch-up comes first
    assert ours[:k] == theirs[:k]
    assert data_messages(ours) == data_messages(theirs)
    assert len(ours) == len(theirs)


def test_FWD_32_acks_of_catch_up_messages_are_ignored(tmp_path: Path) -> None:
    """FWD-32: the client's crashed slot (15 frames, none acknowledged, 3 symbols) drained to
    a listener that acknowledges only its first 6 messages: wire seq 0 is the catch-up, so
    seqs 1..5 are FSNs 0..4 and the slot's acknowledged FSN ends at 4, not 5."""
    frames = client_slot(tmp_path)
    listener = QwpListener(ack_limit=6)
    try:
        conf = fwd_conf(listener.port, tmp_path)
        with Forwarder(conf) as fwd:
            deadline = time.monotonic() + 30
            while len(listener.messages) < 16 and time.monotonic() < deadline:
                time.sleep(0.02)
            assert fwd.wait_acked(4, timeout=10)
            time.sleep(0.3)
            assert fwd.acked_fsn == 4
    finally:
        listener.stop()
    assert listener.messages == [DictMirror(symdict.parse(SYD)).messages(0)[0]] + [
        frames[f] for f in range(15)
    ]
    found, _ = examine(OsFS(), str(tmp_path / "slot"))
    assert found is not None and found.acked_fsn == 4


def test_FWD_32_no_catch_up_to_a_tidelog_receiver(tmp_path: Path) -> None:
    """FWD-32: to `tidelog serve` (which answers X-Tidelog-Last-Fsn and numbers an identified
    sender's frames by wire sequence) the forwarder sends the client slot's frames alone: the
    records are exactly FSNs 0..14 as stored, none of them a catch-up."""
    import tidelog
    from tidelog.forward import Receiver
    from tidelog.forward.dedup import forwarded

    frames = client_slot(tmp_path)
    uri = f"file://{tmp_path / 'rx'}?wal_file_bytes=1MiB"
    receiver = Receiver.open(uri, "events", flush_interval_ms=5).start()
    try:
        drain(receiver.port, tmp_path, 14)
    finally:
        receiver.stop()
    with tidelog.open(uri) as store:
        got = [(f, r.payload) for _, f, r in forwarded(store.topic("events", create=False))]
    assert got == [(f, frames[f]) for f in range(15)]


def test_FWD_32_an_entry_above_the_cap_sends_nothing_and_reconnects(tmp_path: Path) -> None:
    """FWD-32: X-QWP-Max-Batch-Size 30 leaves 2 bytes per catch-up message, less than one
    3-byte entry: each upgrade is a failed attempt (nothing sent), the forwarder retries and
    fails when the reconnect budget ends; the slot's frames are all still unacknowledged."""
    client_slot(tmp_path)
    listener = QwpListener(headers={"X-QWP-Max-Batch-Size": "30"})
    try:
        conf = fwd_conf(
            listener.port, tmp_path, "reconnect_max_duration_millis=300;initial_connect_retry=on;"
        )
        with pytest.raises(SenderFailed, match="reconnect budget"):
            Forwarder(conf)
    finally:
        listener.stop()
    assert listener.connections >= 2
    assert listener.messages == []
    found, _ = examine(OsFS(), str(tmp_path / "slot"))
    assert found is not None and found.acked_fsn == -1


def test_FWD_32_every_connection_starts_with_the_catch_up(tmp_path: Path) -> None:
    """FWD-32: the listener drops the first connection after 6 messages; the next connection
    again opens with the whole dictionary, then resumes the frames after the last one
    acknowledged, through FSN 14."""
    frames = client_slot(tmp_path)
    catch_up = DictMirror(symdict.parse(SYD)).messages(0)
    listener = QwpListener(drop_first_after=6)
    try:
        drain(listener.port, tmp_path, 14)
    finally:
        listener.stop()
    first, second = listener.starts[:2]
    got = listener.messages
    assert got[first:second] == catch_up + [frames[f] for f in range(5)]
    assert got[second] == catch_up[0]
    resumed = got[second + 1 :]
    start = 15 - len(resumed)
    assert 0 <= start <= 5
    assert resumed == [frames[f] for f in range(start, 15)]


def test_FWD_32_frames_sent_extend_the_next_catch_up(tmp_path: Path) -> None:
    """FWD-32: a frame appended after the first connection opened, defining id 3 ("s3"), is
    sent on it; the listener drops that connection before acknowledging it, and the next
    connection's catch-up re-registers ids 0..3, not just the file's 0..2, before resending
    it."""
    client_slot(tmp_path)
    body = b"\x03\x01\x02s3" + b"\x01table-block"
    extra = b"QWP1\x01\x08\x01\x00" + len(body).to_bytes(4, "little") + body
    listener = QwpListener(ack_limit=16, drop_first_after=17)
    try:
        conf = fwd_conf(listener.port, tmp_path)
        with Forwarder(conf) as fwd:
            assert fwd.append(extra) == 15
            assert fwd.wait_acked(15, timeout=30)
    finally:
        listener.stop()
    second = listener.starts[1]
    assert listener.messages[second - 1] == extra
    four = DictMirror(symdict.SymbolDict(ENTRIES + b"\x02s3", 4, 0)).messages(0)
    assert listener.messages[second:] == [four[0], extra]
    assert four[0] == bytes.fromhex("515750310108 0000 0e000000 0004 027330027331027332027333")
