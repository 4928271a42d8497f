"""``Engine.begin_inline``: ops run on a thread that must not block (the service's event loop,
service/calls.py) hand their wait for durability to the caller, never wait for the store lock,
never sleep for a change (``WouldBlock``) and never read a sealed segment."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

import tidelog
from tidelog.backends.blockdev.store import BlockdevBackend
from tidelog.backends.common.engine import Engine, WouldBlock
from tidelog.backends.file import FileBackend
from tidelog.backends.memory import MemoryBackend
from tidelog.hooks import hooks


def _engine(store: tidelog.Store) -> Engine:
    return hooks(store, Engine)


def test_DUR_2_an_inline_fsync_append_is_readable_only_once_its_wait_is_finished(
    tmp_path: Path,
) -> None:
    """DUR-2, SVC-15: inside begin_inline an append to an fsync topic returns its seq without
    waiting for the sync; its wait is handed over, and the record becomes readable (and the
    caller may answer) only once ``finish`` ran it. Without begin_inline the same append waits
    and is readable when it returns, as before."""
    with tidelog.open(f"file://{tmp_path}/s") as store:
        topic = store.topic("t", durability="fsync")
        engine = _engine(store)
        later = engine.begin_inline("t")
        assert later is not None
        try:
            seq = topic.append(b"one")
        finally:
            engine.end_inline()
        assert seq == 1 and len(later) == 1
        assert topic.read(0) == [] and topic.state().head_seq == 0  # not durable yet: unseen
        engine.finish(later)
        assert [r.payload for r in topic.read(0)] == [b"one"]
        assert topic.append(b"two") == 2  # in process: waited, readable at once
        assert [r.payload for r in topic.read(1)] == [b"two"]


def test_DUR_2_an_inline_op_that_is_refused_still_hands_over_what_entering_did(
    tmp_path: Path,
) -> None:
    """ERR-2, DUR-2: a refused op raises from inside begin_inline with nothing of its own to
    wait for; a batch that is not refused hands over one wait for the whole batch."""
    with tidelog.open(f"file://{tmp_path}/s") as store:
        topic = store.topic("t", durability="fsync", cap_records=2, discard="reject")
        engine = _engine(store)
        later = engine.begin_inline("t")
        assert later is not None
        try:
            assert topic.append_many([b"a", b"b"]) == [1, 2]
            with pytest.raises(tidelog.TopicFull):
                topic.append(b"c")
        finally:
            engine.end_inline()
        assert len(later) == 1
        engine.finish(later)
        assert [r.payload for r in topic.read(0)] == [b"a", b"b"]


def test_CON_1_begin_inline_never_waits_for_the_store_lock() -> None:
    """CON-1: ops are serialised by the store lock; a thread that must not block gets None
    while another thread holds it (and runs the op elsewhere), and holds it itself until
    end_inline, so an op inside takes it without waiting."""
    with tidelog.open("memory://") as store:
        store.topic("t")
        engine = _engine(store)
        held, release = threading.Event(), threading.Event()

        def hold() -> None:
            with engine.lock:
                held.set()
                release.wait(10)

        holder = threading.Thread(target=hold)
        holder.start()
        try:
            assert held.wait(10)
            assert engine.begin_inline("t") is None
        finally:
            release.set()
            holder.join(10)
        later = engine.begin_inline("t")
        assert later == []
        try:
            assert store.topic("t").append(b"x") == 1
            assert engine.lock.acquire(blocking=False)  # re-entrant: held by this thread
            engine.lock.release()
        finally:
            engine.end_inline()
        assert later == []  # a memory topic: nothing to wait for


def test_CON_3_a_wait_inside_begin_inline_raises_would_block_before_sleeping() -> None:
    """CON-3: a read or poll with wait_ms (and an append waiting out backpressure) sleeps on
    the change notification; inside begin_inline it raises WouldBlock at the first sleep,
    having changed nothing, so the caller runs the whole call on another thread."""
    with tidelog.open("memory://") as store:
        topic = store.topic("t")
        engine = _engine(store)
        later = engine.begin_inline("t")
        assert later is not None
        try:
            with pytest.raises(WouldBlock):
                topic.read(0, wait_ms=60_000)
            assert topic.read(0) == []  # without a wait: answered at once
        finally:
            engine.end_inline()
        assert later == []


def test_SEG_12_an_op_that_may_read_a_sealed_segment_is_not_run_inline(tmp_path: Path) -> None:
    """SEG-12: sealed segments are read through a map of their file (a read may wait for the
    disk): an op that may read a payload below the unsealed tail is refused by begin_inline
    (None), a read of the tail or an op that reads no payload is not."""
    with tidelog.open(f"file://{tmp_path}/s") as store:
        topic = store.topic("t", durability="disk")
        topic.append_many([b"x"] * 10)
        engine = hooks(store, FileBackend)
        engine.checkpoint()  # seals records 1..10
        topic.append(b"tail")
        assert engine.topics["t"].log.chunks
        for name, after, inline in (
            ("t", 0, False),  # a read from the start: sealed
            ("t", 9, False),
            ("t", 10, True),  # the tail
            ("t", None, True),  # an append, a state: no payload read
            ("other", 0, True),  # no such topic: it will raise, reading nothing
        ):
            later = engine.begin_inline(name, after)
            if later is not None:
                engine.end_inline()
            assert (later is not None) is inline, (name, after)
        dlq = store.topic("jobs", durability="disk", max_deliveries=1, dead_letter="dead")
        dlq.append_many([b"j"] * 3)
        engine.checkpoint()
        later = engine.begin_inline("jobs")  # entering may dead-letter a sealed job (QUE-7)
        assert later is None


def test_CAP_1_only_backends_without_io_under_the_lock_run_inline(tmp_path: Path) -> None:
    """Which backends allow begin_inline: memory (no disk) and file (no I/O in ops under the
    lock but the ones begin_inline refuses or the service runs on threads); blockdev writes
    its slots under the lock, so it never does."""
    assert MemoryBackend.INLINE and FileBackend.INLINE
    assert not BlockdevBackend.INLINE and not Engine.INLINE
