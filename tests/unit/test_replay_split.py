"""A read-only view's replay cuts APPEND_BATCH payloads (FORMATS.md WAL-14, XPR-1):
``replay.split_payloads`` answers what ``split_append_batch`` does, and the size, whatever
the lengths; a view replaying such frames holds the same records and byte count as the writer."""

from __future__ import annotations

import struct
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

import tidelog
from tidelog.backends.file.format import wal as walfmt
from tidelog.backends.file.replay import split_payloads
from tidelog.errors import Corrupt
from tidelog.records import Record


def _batch(payloads: list[bytes]) -> bytes:
    n = len(payloads)
    return struct.pack(f"<I{n}I", n, *map(len, payloads)) + b"".join(payloads)


@given(st.lists(st.binary(max_size=8), min_size=1, max_size=40), st.booleans())
def test_WAL_14_split_payloads_equals_split_append_batch(
    payloads: list[bytes], equal: bool
) -> None:
    if equal:  # the stride path: every payload of one (non-zero) length
        payloads = [p.ljust(5, b"-")[:5] for p in payloads]
    data = _batch(payloads)
    got, size = split_payloads(data, "test")
    assert got == walfmt.split_append_batch(data, "test") == payloads
    assert size == sum(map(len, payloads))


def test_WAL_14_split_payloads_refuses_lengths_that_do_not_add_up() -> None:
    data = _batch([b"abc", b"def"])
    with pytest.raises(Corrupt, match="WAL-14"):
        split_payloads(data[:-1], "frame at 7")
    assert split_payloads(_batch([b"", b""]), "x") == ([b"", b""], 0)  # zero lengths: no stride


def test_XPR_1_a_view_replays_fixed_and_mixed_batches_as_the_writer_holds_them(
    tmp_path: Path,
) -> None:
    uri = f"file://{tmp_path}/s?checkpoint_bytes=64GiB"
    writer = tidelog.open(uri)
    t = writer.topic("t", durability="memory")
    t.append_many([b"%04d" % i for i in range(100)], tag="a")  # equal lengths
    t.append_many([b"x" * (i % 7) for i in range(50)], node="n")  # mixed, zero lengths too
    t.append(b"single")
    writer.flush()
    view = tidelog.open(f"file://{tmp_path}/s", readonly=True)
    try:
        want = t.read(0, 1000)
        got = view.topic("t", create=False).read(0, 1000)
        assert got == want and all(isinstance(r, Record) for r in got)
        assert view.topic("t", create=False).state() == t.state()  # bytes counted the same
    finally:
        view.close()
        writer.close()
