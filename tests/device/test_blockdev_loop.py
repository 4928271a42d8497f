"""The blockdev backend on real block devices: loop devices over sparse files (root, losetup).
Run by ``python3 run.py blockdev_device`` (see conftest.py). BDEV-2, BDEV-11, BDEV-12, BDEV-13,
BDEV-19, BDEV-20, BDEV-21."""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

import tidelog
from tidelog.backends.blockdev import BlockdevBackend, verify_image
from tidelog.cli import main
from tidelog.errors import BadOption, Corrupt
from tidelog.fsio import OsFS
from tidelog.hooks import IoCounters, hooks
from tidelog.records import Record

SIZE = 8 << 20


def _losetup(*args: str) -> str:
    if shutil.which("losetup") is None:
        pytest.fail("losetup is not installed: the blockdev_device session needs util-linux")
    if os.geteuid() != 0:
        pytest.fail("the blockdev_device session must run as root (it attaches loop devices)")
    done = subprocess.run(["losetup", *args], capture_output=True, text=True)
    if done.returncode != 0:
        pytest.fail(f"losetup {' '.join(args)} failed: {done.stderr.strip()}")
    return done.stdout.strip()


@pytest.fixture
def loop(tmp_path: Path) -> Iterator[Any]:
    """``loop(sector_size=512) -> /dev/loopN`` over a fresh all-zero sparse file; detached at
    the end of the test."""
    attached: list[str] = []

    def make(sector_size: int = 512) -> str:
        backing = tmp_path / f"backing-{len(attached)}.img"
        with open(backing, "wb") as f:
            f.truncate(SIZE)
        dev = _losetup("--find", "--show", "--sector-size", str(sector_size), str(backing))
        attached.append(dev)
        return dev

    try:
        yield make
    finally:
        for dev in attached:
            subprocess.run(["losetup", "-d", dev], check=False)


def _read(dev: str, n: int, offset: int = 0) -> bytes:
    fd = os.open(dev, os.O_RDONLY)
    try:
        return os.pread(fd, n, offset)
    finally:
        os.close(fd)


def _write(dev: str, data: bytes, offset: int = 0) -> None:
    fd = os.open(dev, os.O_WRONLY)
    try:
        os.pwrite(fd, data, offset)
        os.fsync(fd)
    finally:
        os.close(fd)


def _direct_flag(store: tidelog.Store) -> bool:
    fd = hooks(store, BlockdevBackend).dev.handle.fd  # the device the backend opened
    return bool(fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_DIRECT)


def test_BDEV_11_BDEV_12_device_is_sized_by_the_kernel_and_never_formatted_unasked(
    loop: Any,
) -> None:
    """BDEV-11, BDEV-12, BDEV-13: an all-zero device is refused without format=true and left
    untouched; so is a device holding foreign data; size= is bad_option on a device; format=true
    sizes the ring from the device: (8 MiB - 4 KiB) // 4 KiB = 2047 pages, rounded to 2046."""
    dev = loop()
    with pytest.raises(Corrupt, match="format=true"):
        tidelog.open(f"blockdev://{dev}")
    assert _read(dev, 1 << 20) == bytes(1 << 20)
    with pytest.raises(BadOption, match="comes from the device"):
        tidelog.open(f"blockdev://{dev}?size=1MiB&format=true")
    foreign = b"ext4? no: foreign data " * 200
    _write(dev, foreign)
    with pytest.raises(Corrupt, match="not a tidelog ring"):
        tidelog.open(f"blockdev://{dev}?topic=t")
    assert _read(dev, len(foreign)) == foreign
    with tidelog.open(f"blockdev://{dev}?format=true&topic=t") as store:
        facts = store.describe()
        assert (facts["device"], facts["page_count"], facts["page_size"]) == ("device", 2046, 4096)
        assert facts["ring_bytes"] == 4096 + 2046 * 4096 <= SIZE
    with pytest.raises(BadOption, match="4096-byte pages"):
        tidelog.open(f"blockdev://{dev}?page_size=8192")


def test_BDEV_20_direct_io_on_a_512_byte_sector_device(loop: Any) -> None:
    """BDEV-20, BDEV-2: O_DIRECT (checked on the file descriptor) with direct=auto; 512-byte
    sectors allow 512-byte pages and 2 KiB slot writes; records survive a reopen; verify and
    inspect read the device."""
    dev = loop()
    with tidelog.open(f"blockdev://{dev}?format=true&topic=t&page_size=512") as store:
        assert store.describe()["direct_io"] is True and _direct_flag(store)
        t = store.topic("t", durability="fsync", trim="none")
        for i in range(50):
            t.append(bytes([i]) * 100)
        t.subscribe("s", start="earliest").commit(20)
        store.flush()
        io: Any = hooks(store, IoCounters).io_stats()
        assert io["page_writes"] == 50
    with tidelog.open(f"blockdev://{dev}") as store:
        t = store.topic("t")
        got = [r.payload for r in t.read() if isinstance(r, Record)]
        assert got == [bytes([i]) * 100 for i in range(50)]
        assert t.subscriber("s").hwm == 20
    assert verify_image(OsFS(), dev).problems == []
    result = CliRunner().invoke(main, ["inspect", f"blockdev://{dev}", "--json"])
    assert result.exit_code == 0, result.output
    facts = json.loads(result.output)["describe"]
    assert facts["page_count"] == (SIZE - 4096) // 512 and facts["device"] == "device"


def test_BDEV_20_four_kib_sector_device(loop: Any) -> None:
    """BDEV-20, BDEV-2 on a 4Kn device (loop with 4096-byte sectors): 512-byte pages cannot use
    O_DIRECT (direct=on is bad_option, direct=auto falls back with a warning); 4 KiB pages do,
    and the 2 KiB metadata slot is then written as the whole 4 KiB block."""
    dev = loop(4096)
    with pytest.raises(BadOption, match="not a multiple"):
        tidelog.open(f"blockdev://{dev}?format=true&topic=t&page_size=512&direct=on")
    with tidelog.open(f"blockdev://{dev}?format=true&topic=t&page_size=512") as store:
        facts = store.describe()
        assert facts["direct_io"] is False and not _direct_flag(store)
        assert any("direct I/O disabled" in w for w in facts["warnings"])  # type: ignore[union-attr]
    with tidelog.open(f"blockdev://{dev}?format=true&topic=t&page_size=4096&direct=on") as store:
        assert store.describe()["direct_io"] is True and _direct_flag(store)
        t = store.topic("t", durability="fsync")
        t.append_many([b"y" * 1000] * 10)
        t.subscribe("s").flush()
    with tidelog.open(f"blockdev://{dev}") as store:
        assert store.topic("t").state().head_seq == 10
    assert verify_image(OsFS(), dev).problems == []


def test_BDEV_24_BDEV_28_repair_and_a_view_on_a_raw_device(
    loop: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """BDEV-24, BDEV-25, BDEV-28: on a raw device, a view reads the ring beside its writer
    (O_RDONLY, no lock) and writes nothing; a damaged middle page is refused, and `tidelog
    repair` puts the copy of what it overwrites in the current directory (a device's own
    directory is /dev), turns exactly that page's seq into a tombstone, and verify is clean."""
    dev = loop()
    writer = tidelog.open(f"blockdev://{dev}?format=true&topic=t")
    t = writer.topic("t", durability="fsync")
    for k in range(1, 7):
        t.append(b"r%d" % k)  # one 4 KiB page each
    with tidelog.open(f"blockdev://{dev}?readonly=true") as view:
        shown = view.topic("t", create=False).read()
        assert [r.payload for r in shown if isinstance(r, Record)] == [
            b"r%d" % k for k in range(1, 7)
        ]
    writer.close()
    page2 = 4096 + 2 * 4096
    damaged = bytearray(_read(dev, 4096, page2))
    damaged[3] ^= 1
    _write(dev, bytes(damaged), page2)
    with pytest.raises(Corrupt, match=f"byte offset {page2}:"):
        tidelog.open(f"blockdev://{dev}")
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(main, ["repair", f"blockdev://{dev}"])
    assert result.exit_code == 0, result.output
    [copy] = [p for p in tmp_path.iterdir() if ".quarantine-" in p.name]
    assert copy.name.startswith(os.path.basename(dev) + ".quarantine-")
    assert verify_image(OsFS(), dev).errors == []
    with tidelog.open(f"blockdev://{dev}") as store:
        items = store.topic("t").read()
    assert [r.seq for r in items if isinstance(r, Record)] == [1, 2, 4, 5, 6]
    assert [(i.gap_from, i.gap_to) for i in items if not isinstance(i, Record)] == [(3, 3)]
