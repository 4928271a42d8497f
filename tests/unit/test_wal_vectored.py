"""A leader writes the chunks it takes without joining them (``WalShard._write``,
backends/file/wal.py): a SYNCED frame due before an op's chunk (WAL-16) is an entry of its own,
written with the chunk in one vectored write, so the frame the encoder made is handed to the OS
as it is, not copied behind the SYNCED frame. The bytes in the file are the same: a SYNCED
frame, then the op's frames (WAL-14), and a crash replays every acknowledged record."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import tidelog
from tidelog import FakeClock, fsio
from tidelog.backends.file.format import wal as walfmt
from tidelog.hooks import Abandon, hooks

BATCH = 50


def _open(root: Path) -> tidelog.Store:
    return tidelog.open(
        f"file://{root}", clock=FakeClock(), prealloc="none", checkpoint_bytes="64GiB",
        background=False,
    )  # fmt: skip


def test_WAL_16_the_due_synced_frame_rides_with_the_chunk_uncopied(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    made: list[object] = []  # each batch frame the encoder returned
    seeds: dict[int, int] = {}  # id(frame) -> the seed it was encoded with
    encode = walfmt.encode_run

    def keep(*args: Any, **kwargs: Any) -> bytes | bytearray:
        frame = encode(*args, **kwargs)
        made.append(frame)
        seeds[id(frame)] = kwargs["seed"]
        return frame

    monkeypatch.setattr(walfmt, "encode_run", keep)
    writes: list[list[object]] = []  # the buffers of each write into a WAL file, in order
    pwrite, pwritev = fsio._OsHandle.pwrite, fsio._OsHandle.pwritev

    def one(self: Any, data: Any, offset: int) -> None:
        if "/wal/" in self.path:
            writes.append([data])
        pwrite(self, data, offset)

    def vectored(self: Any, parts: Any, offset: int) -> None:
        if "/wal/" in self.path:
            writes.append(list(parts))
        pwritev(self, parts, offset)

    monkeypatch.setattr(fsio._OsHandle, "pwrite", one)
    monkeypatch.setattr(fsio._OsHandle, "pwritev", vectored)
    s = _open(tmp_path / "s")
    t = s.topic("t", durability="fsync")
    told = []
    for n in range(20):
        told += t.append_many([bytes([n]) * (10 + n)] * BATCH)
    assert len(made) == 20
    carried = [w for w in writes if any(p is f for f in made for p in w)]
    assert len(carried) == 20  # every batch frame reached the OS as the encoder made it
    # after the first sync, each batch's write leads with the SYNCED frame due (WAL-16)
    with_mark = [w for w in carried if len(w) == 2]
    assert len(with_mark) >= 19
    for w in with_mark:
        mark = bytes(w[0])  # type: ignore[arg-type]
        assert len(mark) == walfmt.SYNCED_SIZE
        both = walfmt.scan(mark + bytes(w[1]), 0, seed=seeds[id(w[1])])  # type: ignore[arg-type]
        assert [f.type for f in both.frames] == [walfmt.FrameType.SYNCED,
                                                 walfmt.FrameType.APPEND_BATCH]  # fmt: skip
    hooks(s, Abandon).abandon()  # no clean close: the reopen replays these frames
    with _open(tmp_path / "s") as again:
        items = again.topic("t").read(0, 10_000)
        assert [r.seq for r in items] == told
        assert [r.payload for r in items] == [bytes([n]) * (10 + n) for n in range(20)
                                              for _ in range(BATCH)]  # fmt: skip
