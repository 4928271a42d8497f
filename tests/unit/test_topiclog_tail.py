"""The engine's per-topic tail (backends/common/index.py) against a slot-by-slot reference: its
labels kept as runs and its count and byte total derived (not counted per append) must answer
exactly as one tag, node and counter per record would."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tidelog.backends.common import index as index_mod
from tidelog.backends.common.index import TopicLog
from tidelog.config import TopicConfig
from tidelog.records import Record

LABELS = st.sampled_from([None, None, None, "a", "b"])
OPS = st.lists(
    st.one_of(
        st.tuples(st.just("append"), st.integers(1, 4), LABELS, LABELS, st.integers(0, 3)),
        st.tuples(st.just("remove"), st.integers(0, 50)),
        st.tuples(st.just("skip"), st.integers(1, 3)),
    ),
    max_size=60,
)


class Reference:
    """One entry per seq: (ts, tag, node, payload or None)."""

    def __init__(self) -> None:
        self.slots: dict[int, tuple[int, str | None, str | None, bytes | None]] = {}
        self.head = 0

    def live(self) -> list[int]:
        return [q for q, s in sorted(self.slots.items()) if s[3] is not None]


def _replay(ops: list[tuple]) -> tuple[TopicLog, Reference]:
    log, ref = TopicLog("t", TopicConfig()), Reference()
    ts = 1
    for op in ops:
        if op[0] == "append":
            _, n, tag, node, dts = op
            ts += dts
            payloads = [bytes([ref.head % 251]) * (ref.head % 7) for _ in range(n)]
            first = ref.head + 1
            # the engine hands the run's size (general path) or not (a lane): both kinds
            nbytes = sum(map(len, payloads)) if dts % 2 else None
            assert log.append(payloads, tag, node, ts, nbytes) == list(range(first, first + n))
            for i, p in enumerate(payloads):
                ref.slots[first + i] = (ts, tag, node, p)
            ref.head += n
        elif op[0] == "remove":
            live = ref.live()
            victims = live[op[1] % 3 :: 2] if live else []
            log.remove(victims, involuntary=False)
            for q in victims:
                t, tag, _, _ = ref.slots[q]
                ref.slots[q] = (t, tag, None, None)  # a dead slot keeps its tag, not its node
        else:
            hi = ref.head + op[1]
            log.skip_to(hi)
            for q in range(ref.head + 1, hi + 1):
                ref.slots[q] = (ts, None, None, None)
            ref.head = hi
    return log, ref


def _check(log: TopicLog, ref: Reference) -> None:
    live = ref.live()
    assert log.count == len(live)
    assert log.nbytes == sum(len(ref.slots[q][3] or b"") for q in live)
    for q in live:
        t, tag, node, p = ref.slots[q]
        assert log.record(q) == Record(q, t, tag, node, p)
    for exclude in (None, "a", "b"):
        want = [log.record(q) for q in live if exclude is None or ref.slots[q][2] != exclude]
        for limit in (1, 2, 5, 1000):
            assert log.read(0, limit, exclude) == want[:limit]
    if log.payloads:
        first, payloads, tss, tags, nodes = log.tail_slice(ref.head)
        seqs = range(first, first + len(payloads))
        assert len(payloads) == ref.head - first + 1
        assert payloads == [ref.slots[q][3] for q in seqs]
        assert tss == [ref.slots[q][0] for q in seqs]
        assert tags == [ref.slots[q][1] for q in seqs]
        assert nodes == [ref.slots[q][2] for q in seqs]
        assert log.tail_columns(0, len(payloads))[2:] == (tags, nodes)
        a, b = len(payloads) // 3, 2 * len(payloads) // 3 + 1  # a range, as the Spark tail reads
        assert log.tail_columns(a, b) == (payloads[a:b], tss[a:b], tags[a:b], nodes[a:b])


@settings(max_examples=300, deadline=None)
@given(OPS)
def test_tail_labels_and_totals_match_per_record_reference(ops: list[tuple]) -> None:
    """TOP-5, TOP-7, TOP-8: records, reads (with ``exclude_node``), the checkpoint's
    ``tail_slice``, ``tail_columns`` and the totals TOP-3's state reports, over appends with
    and without labels, removals and skipped seqs, equal a per-record reference."""
    log, ref = _replay(ops)
    _check(log, ref)


@settings(max_examples=100, deadline=None)
@given(OPS)
def test_tail_compaction_keeps_labels_and_totals(ops: list[tuple]) -> None:
    """TOP-5, TOP-8: the dead prefix popped from the tail (lazy front reclaim) takes its label
    runs with it and leaves every live record's labels and the totals as they were."""
    saved = index_mod._COMPACT_MIN
    index_mod._COMPACT_MIN = 2
    try:
        log, ref = _replay(ops)
    finally:
        index_mod._COMPACT_MIN = saved
    _check(log, ref)


def test_label_runs_merge_and_stay_sparse() -> None:
    """TOP-5: unlabelled appends store no label at all; equal labels on consecutive appends
    extend one run; a labelled append after unlabelled ones starts one."""
    log = TopicLog("t", TopicConfig())
    for _ in range(100):
        log.append([b"x"], None, None, 1)
    assert log._label_firsts == []
    log.append([b"y"], "a", "n", 1)
    log.append([b"y", b"y"], "a", "n", 2)
    log.append([b"z"], None, None, 2)
    assert log._label_firsts == [101, 104]
    assert [log.record(q)[2:4] for q in (100, 101, 103, 104)] == [
        (None, None),
        ("a", "n"),
        ("a", "n"),
        (None, None),
    ]
    assert (log.count, log.nbytes) == (104, 104)


@pytest.mark.parametrize("gate", [False, True])
def test_nbytes_folds_appends_then_removals(gate: bool) -> None:
    """TOP-3 totals: the byte total folds in appends since it was last read, and a removal of
    a record not yet folded takes its size off once."""
    log = TopicLog("t", TopicConfig())
    log.gate_visibility = gate
    log.append([b"abc"], None, None, 1)
    assert log.nbytes == 3
    log.append([b"de", b"f"], "t", None, 1)
    log.remove([3], involuntary=False)  # b"f", appended after the last fold
    assert (log.count, log.nbytes) == (2, 5)
    log.nbytes = 10  # a recovery sets the totals it computed
    log.append([b"gh"], None, None, 1)
    assert (log.count, log.nbytes) == (3, 12)
