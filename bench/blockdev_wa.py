"""Write amplification of the blockdev ring (FORMATS-blockdev BDEV-19, BDEV-21).

    python bench/blockdev_wa.py [--records 10000] [--page-size 4096] [--dir /tmp]

For 100-byte and 1-KiB records under both durability classes the ring offers (``memory``: pages
written when full, plus the partial last page at close; ``fsync``: every commit writes and syncs
its page), and for ``fsync`` batches (``append_many``), it appends ``--records`` records to a
fresh image-backed ring and closes it, then prints:

* write amplification: device bytes written / payload bytes written, from the topic's creation
  to the clean close (pages, metadata slots, everything the backend wrote);
* the same for pages alone (what the record encoding and padding cost);
* page writes per 1000 records, and metadata slot writes in all.

How it is measured: every byte goes through an FS seam that logs each ``pwrite`` the backend
issues; the totals are checked against the backend's own counters (``io_stats``), so the two
agree by construction of the run, not by assumption. The clock is a fake one stepping 1 ms per
record, so the output is deterministic. Not a test: it asserts nothing about speed (it takes
about a minute: each fsync row syncs up to 10000 times). The format write (one slot; a new
image's pages are already zero) is not counted; the ring is large enough never to wrap (a wrap
adds one slot write, once).
"""

from __future__ import annotations

import argparse
import os
import tempfile
from dataclasses import dataclass
from typing import Any

from tidelog.backends.blockdev import io_stats, open_store
from tidelog.clock import FakeClock
from tidelog.fsio import OsFS


class _Counted:
    def __init__(self, inner: Any, log: list[int]) -> None:
        self._inner, self._log = inner, log

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def pwrite(self, data: bytes | bytearray | memoryview, offset: int) -> None:
        self._log.append(len(data))
        self._inner.pwrite(data, offset)


class CountingFS(OsFS):
    """The real file system, logging the size of every write through the seam."""

    def __init__(self) -> None:
        self.writes: list[int] = []

    def open(self, path: str, *, create: bool = True) -> Any:
        return _Counted(super().open(path, create=create), self.writes)


@dataclass
class Row:
    cls: str
    size: int
    batch: int
    wa: float
    wa_pages: float
    pages_per_1000: float
    meta_writes: int


def measure(root: str, cls: str, size: int, records: int, page_size: int, batch: int) -> Row:
    path = os.path.join(root, f"wa-{cls}-{size}-{batch}.img")
    pages = records + 16  # room for one page per record: the ring never wraps
    fs, clock = CountingFS(), FakeClock(1_000_000)
    store = open_store(
        fs, path, clock, size=4096 + pages * page_size, page_size=page_size, topic="t"
    )
    t = store.topic("t", durability=cls)
    start, seam0 = io_stats(store), sum(fs.writes)
    payload = b"x" * size
    for _ in range(0, records, batch):
        t.append_many([payload] * batch)
        clock.advance(1)
    store.close()
    end, seam = io_stats(store), sum(fs.writes) - seam0
    device = end.device_bytes - start.device_bytes
    assert seam == device, f"FS seam saw {seam} bytes, the backend counted {device}"
    assert end.payload_bytes - start.payload_bytes == records * size
    page_writes = end.page_writes - start.page_writes
    os.unlink(path)
    return Row(
        cls,
        size,
        batch,
        device / (records * size),
        page_writes * page_size / (records * size),
        page_writes * 1000 / records,
        end.meta_writes - start.meta_writes,
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--records", type=int, default=10_000)
    ap.add_argument("--page-size", type=int, default=4096)
    ap.add_argument("--dir", default=None, help="where the image files go (default: a temp dir)")
    args = ap.parse_args()
    cases = [
        ("memory", size, 1) for size in (100, 1024)
    ] + [("fsync", size, 1) for size in (100, 1024)] + [
        ("fsync", size, batch) for size in (100, 1024) for batch in (10, 100)
    ]
    with tempfile.TemporaryDirectory(dir=args.dir, prefix="tidelog-wa-") as root:
        rows = [measure(root, c, s, args.records, args.page_size, b) for c, s, b in cases]
    print(
        f"blockdev write amplification: {args.records} records per row, "
        f"{args.page_size}-byte pages, from topic creation to clean close"
    )
    print(
        f"{'class':7} {'record':>7} {'append':>16} {'WA (all)':>9} {'WA (pages)':>10} "
        f"{'pages/1000 rec':>15} {'slot writes':>11}"
    )
    for r in rows:
        how = "single" if r.batch == 1 else f"append_many({r.batch})"
        print(
            f"{r.cls:7} {r.size:>6}B {how:>16} {r.wa:9.3f} {r.wa_pages:10.3f} "
            f"{r.pages_per_1000:15.1f} {r.meta_writes:11d}"
        )


if __name__ == "__main__":
    main()
