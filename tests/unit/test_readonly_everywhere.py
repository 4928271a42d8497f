"""Read-only means read-only, for every backend with a read-only view and every command that
does not say it writes (spec/CLI.md CLI-10): each store state below is hashed (every file's
bytes, size and mtime, every directory's listing and mtime) before and after one read-only
command or one read-only open, and nothing may have changed, whatever the command answered.

The narrower tests stay where they are (test_sf_readonly.py, test_blockdev_readonly.py,
test_file_xpr.py, test_verify.py); this module is the product of backends x states x commands,
so a command or state added later is one entry in a table.
"""

from __future__ import annotations

import os
import struct
import subprocess
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

import pytest
from click.testing import CliRunner
from test_cli_process import WAIT
from test_sf_readonly import STATES as SF_STATES
from test_sf_readonly import payload, tree, write_slot

import tidelog
from tidelog.backends.sf import format as fmt
from tidelog.backends.sf.recovery import SYNC_FILE, WATERMARK_FILE
from tidelog.cli import main
from tidelog.errors import TidelogError
from tidelog.hooks import Abandon, hooks

SMALL_WAL = "wal_file_bytes=256KiB&checkpoint_bytes=16KiB"
RING = "size={size}&page_size=512&topic=events"
RING_PAGES = 16


class Target(NamedTuple):
    """A store in some state: its URI, the path a bare-path command takes, its topic."""

    uri: str
    path: Path
    topic: str
    scheme: str


# -- file:// ---------------------------------------------------------------------------------
def _file_store(tmp: Path, *, close: bool) -> Target:
    root = tmp / "store"
    store = tidelog.open(f"file://{root}?{SMALL_WAL}")
    events = store.topic("events", durability="fsync")
    events.append_many([b"sealed-%d" % k + b"-" * 900 for k in range(40)])
    sub = events.subscribe("s")
    sub.commit(10)
    sub.flush()
    events.append_many([b"tail-%d" % k for k in range(5)])
    if close:
        store.close()
    else:
        hooks(store, Abandon).abandon()
    return Target(f"file://{root}", root, "events", "file")


def _last_nonzero(data: bytes) -> int:
    return len(data.rstrip(b"\0"))


def file_clean(tmp: Path) -> Target:
    return _file_store(tmp, close=True)


def file_crashed(tmp: Path) -> Target:
    """abandon(): the lock released as the kernel would, recovery pending (CRASH-*)."""
    return _file_store(tmp, close=False)


def file_torn(tmp: Path) -> Target:
    """A crash mid-write: bytes of a frame that never completed after the WAL's last frame
    (recovery discards them, WAL-7; a writer's open would zero them)."""
    target = _file_store(tmp, close=False)
    wal = sorted((target.path / "wal").glob("wal-*.log"))[-1]
    data = bytearray(wal.read_bytes())
    end = _last_nonzero(bytes(data))
    data[end : end + 13] = b"\x5a" * 13
    wal.write_bytes(bytes(data))
    return target


def file_damaged(tmp: Path) -> Target:
    """A flipped byte inside a sealed segment's records: verify reports an error."""
    target = _file_store(tmp, close=True)
    seg = sorted(target.path.glob("topics/*/seg-*.data"))[0]
    data = bytearray(seg.read_bytes())
    data[len(data) // 2] ^= 0xFF
    seg.write_bytes(bytes(data))
    return target


# -- blockdev:// -----------------------------------------------------------------------------
def _ring(tmp: Path, *, close: bool) -> Target:
    image = tmp / "ring" / "r.img"
    image.parent.mkdir()
    size = 4096 + RING_PAGES * 512
    store = tidelog.open(f"blockdev://{image}?" + RING.format(size=size))
    events = store.topic("events", durability="fsync")
    sub = events.subscribe("s")
    for k in range(20):  # a wrap: the ring overwrote its oldest pages
        events.append(b"r%d-" % k + b"x" * 300)
    sub.commit(18)
    sub.flush()
    if close:
        store.close()
    else:
        hooks(store, Abandon).abandon()
    return Target(f"blockdev://{image}", image, "events", "blockdev")


def ring_clean(tmp: Path) -> Target:
    return _ring(tmp, close=True)


def ring_crashed(tmp: Path) -> Target:
    return _ring(tmp, close=False)


def _overwrite_record(target: Target, marker: bytes, skip: int, data: bytes) -> Target:
    """``data`` written ``skip`` bytes into the record whose payload starts with ``marker``."""
    at = target.path.read_bytes().find(marker, 4096)
    assert at > 0, marker
    with open(target.path, "r+b") as f:
        f.seek(at + skip)
        f.write(data)
    return target


def ring_torn(tmp: Path) -> Target:
    """The newest record's page cut short by a crash (a torn last page, which recovery skips)."""
    return _overwrite_record(_ring(tmp, close=False), b"r19-", 100, b"\0" * 200)


def ring_damaged(tmp: Path) -> Target:
    """Bytes of an older record's page overwritten: verify reports an error."""
    return _overwrite_record(_ring(tmp, close=True), b"r15-", 50, b"\xff\x00\xff")


# -- sf:// -----------------------------------------------------------------------------------
def _sf(tmp: Path, make: Callable[[Path], Path]) -> Target:
    slot = make(tmp)
    return Target(f"sf://{slot}", slot, "frames", "sf")


CRASHER = textwrap.dedent(
    """
    import os, sys
    from tidelog.backends.sf import Slot
    slot = Slot.open(sys.argv[1], "a", max_bytes=512, max_total_bytes=1 << 20,
                     durability="memory")
    for fsn in range(30):
        slot.append(b"frame-%d:" % fsn + b"x" * (fsn % 300))
    slot.acknowledge(7)
    slot.apply_acks()
    os._exit(0)
    """
)


def sf_crashed(tmp: Path) -> Target:
    """A writer process killed with everything in the page cache: lock files left behind,
    no clean close (SF-2, SF-13)."""
    sf_dir = tmp / "sf"
    subprocess.run([sys.executable, "-c", CRASHER, str(sf_dir)], check=True, timeout=WAIT)
    return _sf(tmp, lambda _: sf_dir / "a")


def sf_damaged(tmp: Path) -> Target:
    """A flipped byte in a sealed segment's frame: verify reports an error (SF-8)."""

    def make(t: Path) -> Path:
        slot = write_slot(t / "sf", "a", 40, ack=3, durability="append")
        seg = sorted(slot.glob("*.sfa"))[1]
        data = bytearray(seg.read_bytes())
        data[fmt.HEADER_SIZE + 20] ^= 0xFF
        seg.write_bytes(bytes(data))
        return slot

    return _sf(tmp, make)


def _dual_slot_record(magic: bytes, generation: int, first: int, second: int) -> bytes:
    """One 8192-byte file of two 4096-byte slots, the record at (generation & 1) * 4096:
    magic, version 1, generation, two i64 fields, CRC-32C of bytes 0..59 at 60 (the layout
    questdb 6.0.0 (Rust client 7.2.0) writes for .ack-watermark and sf-manifest.bin)."""
    record = bytearray(64)
    record[0:4] = magic
    struct.pack_into("<Iqqq", record, 4, 1, generation, first, second)
    struct.pack_into("<I", record, 60, fmt.crc32c(bytes(record[:60])))
    out = bytearray(8192)
    at = (generation & 1) * 4096
    out[at : at + 64] = record
    return bytes(out)


def sf_client_layout(tmp: Path) -> Target:
    """A slot laid out as questdb 6.0.0 (Rust client 7.2.0) leaves it after an undrained
    close: every segment flagged MANIFEST_REQUIRED (header byte 5, 0x01), an 8192-byte dual-slot
    watermark and manifest, a hot spare with no frames, a symbol dictionary header, its lock
    files and no .tidelog-sync. Whatever tidelog makes of it, a read must not change it (the
    client's watermark is not tidelog's 16 bytes)."""

    def make(t: Path) -> Path:
        slot = write_slot(t / "sf", "a", 40, ack=-1, durability="append")
        (slot / SYNC_FILE).unlink(missing_ok=True)
        segments = sorted(slot.glob("*.sfa"))
        bases = []
        for seg in segments:
            data = bytearray(seg.read_bytes())
            data[5] = 0x01
            bases.append(fmt.decode_header(bytes(data)).base_seq)
            seg.write_bytes(bytes(data))
        spare = fmt.segment_generation(segments[-1].name)
        assert spare is not None
        (slot / fmt.segment_name(spare + 1)).write_bytes(
            bytearray(fmt.encode_header(40, 0))[:5] + b"\x01" + fmt.encode_header(40, 0)[6:]
        )
        (slot / WATERMARK_FILE).write_bytes(_dual_slot_record(b"AKW1", 3, 9, 0))
        (slot / "sf-manifest.bin").write_bytes(_dual_slot_record(b"SFM1", 2, bases[0], bases[-1]))
        (slot / ".symbol-dict").write_bytes(b"SYD1\x01\0\0\0")
        return slot

    return _sf(tmp, make)


REAL_CLIENT = textwrap.dedent(
    """
    import os, socket, sys
    from questdb import Sender, TimestampNanos
    with socket.socket() as s:  # a port nobody listens on: the client keeps reconnecting
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    sender = Sender.from_conf(f"ws::addr=127.0.0.1:{port};sf_dir={sys.argv[1]};sender_id=a;"
                              "auto_flush=off;initial_connect_retry=async;")
    sender.establish()
    for i in range(25):
        sender.row("t", symbols={"s": "s%d" % (i % 3)}, columns={"v": i},
                   at=TimestampNanos(1_700_000_000_000_000_000 + i))
        sender.flush()
    os._exit(0)
    """
)


def sf_real_client(tmp: Path) -> Target:
    """A slot questdb 6.0.0 (Rust client 7.2.0) itself left when killed with 25 frames
    unacknowledged (no server): its watermark, manifest, flagged segments, hot spare and
    symbol dictionary as the client writes them."""
    sf_dir = tmp / "sf"
    subprocess.run([sys.executable, "-c", REAL_CLIENT, str(sf_dir)], check=True, timeout=WAIT)
    slot = sf_dir / "a"
    assert (slot / "sf-manifest.bin").stat().st_size == (slot / WATERMARK_FILE).stat().st_size
    assert (slot / WATERMARK_FILE).stat().st_size == 8192
    return _sf(tmp, lambda _: slot)


def _from_sf_readonly(name: str) -> Callable[[Path], Target]:
    def make(tmp: Path) -> Target:
        return _sf(tmp, SF_STATES[name])

    make.__doc__ = SF_STATES[name].__doc__
    return make


STATES: dict[str, Callable[[Path], Target]] = {
    "file-clean": file_clean,
    "file-crashed": file_crashed,
    "file-torn": file_torn,
    "file-damaged": file_damaged,
    "blockdev-clean": ring_clean,
    "blockdev-crashed": ring_crashed,
    "blockdev-torn": ring_torn,
    "blockdev-damaged": ring_damaged,
    "sf-clean": _from_sf_readonly("watermark"),
    "sf-crashed": sf_crashed,
    "sf-torn": _from_sf_readonly("torn"),
    "sf-damaged": sf_damaged,
    "sf-foreign": _from_sf_readonly("foreign"),
    "sf-drained": _from_sf_readonly("drained"),
    "sf-client-layout": sf_client_layout,
    "sf-real-client": sf_real_client,
}

#: the commands that do not say they write (spec/CLI.md CLI-10), as argv given a target;
#: None where the command does not apply to the scheme
COMMANDS: dict[str, Callable[[Target], list[str] | None]] = {
    "inspect": lambda t: ["inspect", t.uri],
    "inspect-json": lambda t: ["inspect", t.uri, "--json"],
    "inspect-topic": lambda t: ["inspect", t.uri, "--topic", t.topic],
    "tail": lambda t: ["tail", t.uri, t.topic],
    "tail-json-after": lambda t: ["tail", t.uri, t.topic, "--json", "--after", "2"],
    "tail-limit": lambda t: ["tail", t.uri, t.topic, "--limit", "3"],
    "verify-uri": lambda t: ["verify", t.uri],
    "verify-path": lambda t: ["verify", str(t.path)],
    "verify-json": lambda t: ["verify", str(t.path), "--json"],
    "blockdev-verify": lambda t: (
        ["blockdev", "verify", str(t.path)] if t.scheme == "blockdev" else None
    ),
    "repair-dry-run": lambda t: (
        ["repair", "--dry-run", t.uri] if t.scheme in ("file", "blockdev") else None
    ),
}


def snapshot(root: Path) -> dict[str, object]:
    """Every entry under root with size, mtime and a digest (test_sf_readonly.tree), plus each
    directory's listing, so a file created and removed again still shows."""
    out: dict[str, object] = dict(tree(root))
    for d in [root, *(p for p in root.rglob("*") if p.is_dir())]:
        out[f"listing:{d.relative_to(root)}"] = sorted(os.listdir(d))
    return out


def read_only_open(target: Target) -> None:
    """Everything a library user may do with a view: open, read, state, describe, refresh,
    flush, close; a refusal (corrupt, io_error) is an answer too."""
    try:
        with tidelog.open(f"{target.uri}?readonly=true") as store:
            store.describe()
            for name in store.topics():
                topic = store.topic(name, create=False)
                topic.read(0, 100_000)
                topic.state()
            store.refresh()
            store.flush()
    except TidelogError:
        pass


def _applies(state: str, command: str) -> bool:
    if command == "open-readonly":
        return True
    probe = Target("x://", Path("x"), "t", state.split("-", 1)[0])
    return COMMANDS[command](probe) is not None


CASES = [
    pytest.param(state, command, id=f"{state}-{command}")
    for state in STATES
    for command in [*COMMANDS, "open-readonly"]
    if _applies(state, command)
]


@pytest.mark.parametrize(("state", "command"), CASES)
def test_CLI_10_read_only_commands_change_nothing(tmp_path: Path, state: str, command: str) -> None:
    """CLI-10 (CLI-3, FORMATS XPR-1, FORMATS-blockdev BDEV-28, BDEV-21, FORWARD SF-21): a
    read-only command or a readonly=true open of a file:// store, blockdev:// ring or sf://
    slot, clean, crashed (abandon), with a torn tail, damaged where verify reports it, or (sf)
    left by another client (also by the real questdb 6.0.0 client), leaves every file and
    directory as it was: bytes, size, mtime and listing. Its answer may be a refusal (status
    2) or bad news (status 1), never a traceback."""
    target = STATES[state](tmp_path)
    before = snapshot(tmp_path)
    if command == "open-readonly":
        read_only_open(target)
    else:
        argv = COMMANDS[command](target)
        assert argv is not None  # CASES holds only the commands that apply
        result = CliRunner().invoke(main, argv)
        assert result.exit_code in (0, 1, 2), result.output
        assert result.exception is None or isinstance(result.exception, SystemExit), (
            result.exception
        )
    assert snapshot(tmp_path) == before


@pytest.mark.parametrize("state", ["file-damaged", "blockdev-damaged", "sf-damaged"])
def test_CLI_10_damaged_states_are_damaged(tmp_path: Path, state: str) -> None:
    """The damaged states above are ones verify reports as errors (status 1), so the table
    covers reading damage, not only clean stores."""
    target = STATES[state](tmp_path)
    result = CliRunner().invoke(main, ["verify", str(target.path)])
    assert result.exit_code == 1, result.output


@pytest.mark.parametrize("state", ["file-clean", "blockdev-clean", "sf-clean"])
def test_CLI_10_the_check_sees_a_writer(tmp_path: Path, state: str) -> None:
    """The snapshot is not blind: a writer's open and close of each clean state changes it,
    and so does touching one file's mtime alone."""
    target = STATES[state](tmp_path)
    before = snapshot(tmp_path)
    with tidelog.open(target.uri) as store:
        store.topic(target.topic).append(payload(1))
    assert snapshot(tmp_path) != before
    before = snapshot(tmp_path)
    some = next(p for p in sorted(tmp_path.rglob("*")) if p.is_file())
    info = some.stat()
    os.utime(some, ns=(info.st_atime_ns, info.st_mtime_ns + 1000))
    assert snapshot(tmp_path) != before


def test_CLI_10_repair_dry_run_still_refuses_beside_a_writer(tmp_path: Path) -> None:
    """CLI-10, REP-1: the dry run takes the store's lock without writing, so beside a live
    writer it is refused (status 2, naming the holder), and it writes nothing either way."""
    target = file_clean(tmp_path)
    with tidelog.open(target.uri):
        before = snapshot(tmp_path)
        result = CliRunner().invoke(main, ["repair", "--dry-run", target.uri])
        assert result.exit_code == 2
        assert "locked by pid" in result.stderr
        assert snapshot(tmp_path) == before
