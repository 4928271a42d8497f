"""An ``append_many``'s lengths and their sum are taken once: the engine's (for its size
checks and totals) travel with the op to the WAL's APPEND_BATCH frame (WAL-14), which then
takes no ``len`` of each payload again, nor their sum; the frame and the records read back are
the same either way."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import tidelog
from tidelog.backends.file import journal


def test_WAL_14_append_many_hands_the_engines_lengths_to_its_frame(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen: list[Any] = []
    encode = journal.walfmt.encode_append_batch

    def spy(*args: Any, **kwargs: Any) -> Any:
        seen.append((kwargs.get("sizes"), kwargs.get("total")))
        return encode(*args, **kwargs)

    monkeypatch.setattr(journal.walfmt, "encode_append_batch", spy)
    payloads = [b"a", b"", b"ccc" * 100, bytes(7)]
    with tidelog.open(f"file://{tmp_path}/st") as store:
        t = store.topic("t", durability="fsync")
        seqs = t.append_many(payloads)
        assert seen == [([len(p) for p in payloads], sum(map(len, payloads)))]
        assert [r.payload for r in t.read(0, limit=10)] == payloads
    with tidelog.open(f"file://{tmp_path}/st") as store:  # and after reopening
        assert [r.payload for r in store.topic("t").read(0, limit=10)] == payloads
        assert [r.seq for r in store.topic("t").read(0, limit=10)] == seqs
