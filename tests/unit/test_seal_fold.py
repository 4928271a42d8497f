"""TOP-3 totals across checkpoints: a checkpoint that seals the tail adds the sealed records'
bytes from the lengths column it built the segments with (``TopicLog._fold_prefix``), not by a
``len`` of every tail payload under the store lock; the byte total stays exactly the sum over
live records whatever was appended, removed or read in between."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import tidelog
from tidelog.backends.common.index import TopicLog
from tidelog.backends.file import FileBackend
from tidelog.hooks import Checkpoint, hooks

OPS = st.lists(
    st.one_of(
        st.tuples(st.just("append"), st.integers(1, 40), st.integers(0, 30)),  # lane appends
        st.tuples(st.just("tagged"), st.integers(1, 5)),  # the general path: size handed
        st.tuples(st.just("delete"), st.integers(1, 30)),  # a prefix goes (folds first)
        st.tuples(
            st.just("untag"),
        ),  # the tagged records go, anywhere in the log
        st.tuples(
            st.just("read"),
        ),  # the totals read: folds the whole tail
        st.tuples(
            st.just("checkpoint"),
        ),
    ),
    max_size=25,
)


def _bytes(store: tidelog.Store) -> tuple[int, int]:
    state = store.describe()["topics"]["t"]["state"]
    return state["count"], state["bytes"]


@settings(max_examples=40, deadline=None)
@given(OPS)
def test_checkpoints_keep_the_byte_total_exact(ops: list[tuple]) -> None:
    root = tempfile.mkdtemp(prefix="tidelog-sealfold-")
    try:
        with tidelog.open(f"file://{root}/st?checkpoint_bytes=64GiB") as s:
            t = s.topic("t", durability="memory", trim="none")
            live: dict[int, tuple[int, str | None]] = {}  # seq -> (size, tag)
            n = 0
            for op in ops:
                if op[0] == "append":
                    for i in range(op[1]):
                        size = (n + i * op[2]) % 61
                        live[t.append(bytes(size))] = (size, None)
                    n += op[1]
                elif op[0] == "tagged":
                    for i in range(op[1]):
                        live[t.append(b"x" * (i + 1), tag="g")] = (i + 1, "g")
                elif op[0] == "delete":
                    cut = min(live, default=0) + op[1]
                    t.delete(before_seq=cut)
                    live = {q: v for q, v in live.items() if q >= cut}
                elif op[0] == "untag":
                    t.delete(tag="g")
                    live = {q: v for q, v in live.items() if v[1] != "g"}
                elif op[0] == "read":
                    assert _bytes(s) == (len(live), sum(v[0] for v in live.values()))
                else:
                    hooks(s, Checkpoint).checkpoint()
            assert _bytes(s) == (len(live), sum(v[0] for v in live.values()))
            hooks(s, Checkpoint).checkpoint()
            assert _bytes(s) == (len(live), sum(v[0] for v in live.values()))
    finally:
        shutil.rmtree(root, ignore_errors=True)


def test_seal_adds_the_sealed_bytes_from_the_lengths_not_the_tail(tmp_path, monkeypatch) -> None:
    """TOP-3: sealing a tail nobody read the totals of takes no ``len`` of its payloads (no
    whole-tail fold under the store lock); the records appended after the capture stay
    unfolded until the totals are read, and then count once."""
    folds = []
    real = TopicLog._fold

    def counted(self: TopicLog) -> None:
        folds.append(len(self.payloads) - self._folded)
        real(self)

    with tidelog.open(f"file://{tmp_path}/st?checkpoint_bytes=64GiB") as s:
        t = s.topic("t", durability="memory", trim="none")
        for i in range(3000):
            t.append(bytes(i % 50))
        monkeypatch.setattr(TopicLog, "_fold", counted)
        hooks(s, Checkpoint).checkpoint()
        assert folds == []
        for _ in range(7):
            t.append(bytes(100))
        assert _bytes(s) == (3007, sum(i % 50 for i in range(3000)) + 700)
        assert folds == [7]  # only the records appended after the checkpoint


@pytest.mark.parametrize("durability", ["memory", "fsync"])
def test_TOP_3_a_checkpoint_cuts_the_tail_once_for_all_its_segments(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, durability: str
) -> None:
    """TOP-3, TOP-7, DEL-1: a checkpoint that seals a topic's tail into several segments
    (sealed from memory for ``memory``, from the WAL frames for ``fsync``) cuts the tail once
    (each cut moves the rest of the tail under the store lock), and records removed after the
    capture, in several of those segments, are dead in them: reads, totals and a reopen agree
    with what was removed."""
    cuts: list[int] = []
    real_cut = TopicLog._cut_tail

    def counted(self: TopicLog, cut: int) -> None:
        cuts.append(cut)
        real_cut(self, cut)

    uri = f"file://{tmp_path}/st?checkpoint_bytes=64GiB&segment_max_records=5"
    with tidelog.open(uri) as s:
        t = s.topic("t", durability=durability, trim="none")
        for i in range(40):
            t.append(bytes(i % 7 + 1), tag="odd" if i % 2 else None)
        real_sync = FileBackend.sync_wal
        removed: list[int] = []

        def sync_then_remove(self: FileBackend) -> None:
            real_sync(self)
            if not removed:  # between the capture and the swap: in five of the segments
                removed.append(t.delete(tag="odd"))

        monkeypatch.setattr(FileBackend, "sync_wal", sync_then_remove)
        monkeypatch.setattr(TopicLog, "_cut_tail", counted)
        hooks(s, Checkpoint).checkpoint()
        monkeypatch.undo()
        assert removed == [20] and cuts == [40]
        log = hooks(s, FileBackend).topics["t"].log
        assert len(log.chunks) == 8 and not log.payloads
        want = [(i + 1, bytes(i % 7 + 1)) for i in range(0, 40, 2)]
        assert [(r.seq, r.payload) for r in t.read(0) if hasattr(r, "payload")] == want
        assert _bytes(s) == (20, sum(len(p) for _, p in want))
    with tidelog.open(uri) as s:
        assert [(r.seq, r.payload) for r in s.topic("t").read(0) if hasattr(r, "payload")] == want
        assert _bytes(s) == (20, sum(len(p) for _, p in want))
