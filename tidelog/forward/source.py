"""What a forwarder drains: an SF slot, an in-memory ring, or a tidelog topic (FWD-2, FWD-22).

A source numbers its frames with FSNs and keeps the trim point. The I/O loop reads frames by FSN
and calls ``acknowledge``; a manager thread per source applies acknowledgements (watermark,
unlink, subscriber commit) off the loop (SF-6, SF-12).

- ``SlotSource``: an SF slot on disk (SF-1).
- ``MemorySource``: memory mode (no ``sf_dir``, FWD-2): frames in RAM, lost at exit.
- ``TopicSource``: a tidelog topic through a durable subscriber. ``fsn = seq - 1`` (tidelog seqs
  start at 1, FSNs at 0), and acknowledging FSN ``f`` commits the subscriber to seq ``f + 1``,
  so acknowledged records are trimmed from the topic (SUB-5). A topic can have holes (deleted
  or evicted records); ``read`` reports them as a ``Gap`` (FWD-22). Each incarnation of the
  topic (TOP-10) is sent under a client id of its own, ``topic_client_id`` (FWD-34).
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from tidelog.api import Subscriber, Topic
from tidelog.backends.sf import symdict
from tidelog.backends.sf.slot import Slot
from tidelog.errors import (
    Backpressure,
    BadOption,
    Closed,
    NoSuchSubscriber,
    NoSuchTopic,
    TidelogError,
    TooLarge,
)
from tidelog.records import Record, Tombstone

__all__ = ["Gap", "Source", "SlotSource", "MemorySource", "TopicSource", "topic_client_id"]

log = logging.getLogger("tidelog.forward")

_MAX_CLIENT_ID = 200  # FWD-20


def suffixed_client_id(client_id: str, suffix: str, rule: str) -> str:
    """``client_id`` + ``suffix``, which must stay within FWD-20's 200 bytes (``bad_option``
    naming ``rule`` otherwise)."""
    out = client_id + suffix
    if len(out.encode()) > _MAX_CLIENT_ID:
        raise BadOption(
            f"client id {client_id!r}: with the suffix {suffix!r} it is longer than "
            f"{_MAX_CLIENT_ID} bytes (FWD-20, {rule})"
        )
    return out


def topic_client_id(client_id: str, incarnation: int) -> str:
    """The client id a topic source's frames go under (FWD-34): ``client_id`` for incarnation
    1, ``<client_id>~g<incarnation>`` for a later one, whose seqs (so FSNs) start again at 1."""
    if incarnation <= 1:
        return client_id
    return suffixed_client_id(client_id, f"~g{incarnation}", "FWD-34")


@dataclass(frozen=True)
class Gap:
    """FSNs from the requested one up to ``next_fsn - 1`` do not exist and never will."""

    next_fsn: int


class Source(Protocol):
    name: str
    #: True when ``read`` may block on locks or I/O for long: the loop then reads in a thread.
    blocking_reads: bool
    #: why the source is gone for good (its topic dropped, FWD-35); None while it is not
    dropped: str | None

    def published_fsn(self) -> int: ...

    def acked_fsn(self) -> int: ...

    def read(self, fsn: int, max_frames: int) -> list[bytes] | Gap: ...

    def symbol_dict(self) -> symdict.SymbolDict | None:
        """The symbol dictionary the frames are delta-encoded against (FWD-32): a slot's
        `.symbol-dict`, read-only; None for sources without one."""

    def acknowledge(self, fsn: int) -> None:
        """Raise the trim point (cheap; applied by the source's manager)."""

    def add_listener(self, callback: Callable[[], None]) -> None:
        """``callback()`` (from any thread) whenever new frames may be available."""

    def close(self) -> None:
        """Stop the manager (after a final apply) and release what the source holds."""


class _Manager:
    """A worker thread that applies the latest acknowledged FSN, coalescing bursts."""

    def __init__(self, name: str, apply: Callable[[int], None]) -> None:
        self._apply = apply
        self._cond = threading.Condition()
        self._target: int | None = None
        self._stop = False
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def submit(self, fsn: int) -> None:
        with self._cond:
            if self._target is None or fsn > self._target:
                self._target = fsn
                self._cond.notify()

    def _run(self) -> None:
        while True:
            with self._cond:
                while self._target is None and not self._stop:
                    self._cond.wait()
                target, self._target = self._target, None
                stop = self._stop
            if target is not None:
                try:
                    self._apply(target)
                except Exception:
                    log.exception("applying acknowledgement up to FSN %d failed", target)
            if stop and target is None:
                return

    def close(self) -> None:
        with self._cond:
            self._stop = True
            self._cond.notify()
        self._thread.join()


class SlotSource:
    """Drain an SF slot; appends go straight to the slot (the producer's path)."""

    blocking_reads = False  # one pread under the slot lock
    dropped: str | None = None  # a slot is never dropped under its lock holder

    def __init__(self, slot: Slot, *, append_deadline_ms: int = 30_000) -> None:
        self.slot = slot
        self.name = slot.dir
        self.append_deadline_ms = append_deadline_ms
        self._manager = _Manager("tidelog-sf-manager", self._apply)

    def _apply(self, _fsn: int) -> None:
        self.slot.apply_acks()

    def published_fsn(self) -> int:
        return self.slot.published_fsn

    def acked_fsn(self) -> int:
        return self.slot.acked_fsn

    def read(self, fsn: int, max_frames: int) -> list[bytes] | Gap:
        return self.slot.read(fsn, max_frames)

    def append(self, payload: bytes) -> int:
        return self.slot.append(payload, deadline_ms=self.append_deadline_ms)

    def symbol_dict(self) -> symdict.SymbolDict | None:
        """The slot's `.symbol-dict` (FWD-32), None when it has none; read-only."""
        return symdict.read(self.slot.fs, self.slot.dir)

    def flush(self) -> None:
        self.slot.flush()

    def acknowledge(self, fsn: int) -> None:
        self.slot.acknowledge(fsn)
        self._manager.submit(fsn)

    def add_listener(self, callback: Callable[[], None]) -> None:
        self.slot.add_listener(callback)

    def close(self) -> None:
        # The manager quiesces before the slot (and its lock) goes (FWD-15).
        self._manager.close()
        self.slot.close()


class MemorySource:
    """Memory mode (FWD-2): frames in RAM up to ``max_total_bytes`` (8 bytes of envelope each,
    as on disk), trimmed as soon as they are acknowledged."""

    blocking_reads = False
    dropped: str | None = None

    def __init__(self, max_total_bytes: int, max_frame_bytes: int, append_deadline_ms: int):
        self.name = "memory"
        self.max_total_bytes = max_total_bytes
        self.max_frame_bytes = max_frame_bytes
        self.append_deadline_ms = append_deadline_ms
        self._frames: deque[bytes] = deque()
        self._base = 0  # FSN of _frames[0]
        self._published = -1
        self._acked = -1
        self._bytes = 0
        self._cond = threading.Condition()
        self._listeners: list[Callable[[], None]] = []
        self._closed = False
        self.backpressure_reason: Callable[[], str] = lambda: "backpressure: memory ring full"
        self.backpressure_stalls = 0

    def published_fsn(self) -> int:
        return self._published

    def symbol_dict(self) -> None:
        return None  # frames in RAM or a topic carry no client dictionary (FWD-32)

    def acked_fsn(self) -> int:
        return self._acked

    def append(self, payload: bytes) -> int:
        size = len(payload) + 8
        if size > self.max_frame_bytes:
            raise TooLarge(f"frame of {len(payload)} bytes exceeds sf_max_bytes")
        with self._cond:
            if self._bytes + size > self.max_total_bytes:
                self.backpressure_stalls += 1
                end = time.monotonic() + self.append_deadline_ms / 1000.0
                while self._bytes + size > self.max_total_bytes:
                    left = end - time.monotonic()
                    if left <= 0:
                        raise Backpressure(self.backpressure_reason())
                    self._cond.wait(left)
                    if self._closed:
                        raise Closed("forwarder is closed")
            if self._closed:
                raise Closed("forwarder is closed")
            self._frames.append(bytes(payload))
            self._bytes += size
            self._published += 1
            fsn = self._published
        for callback in list(self._listeners):
            callback()
        return fsn

    def flush(self) -> None:
        pass  # nothing below RAM to flush

    def read(self, fsn: int, max_frames: int) -> list[bytes] | Gap:
        with self._cond:
            start = fsn - self._base
            if start < 0:
                return Gap(self._base)  # cannot happen: reads are above the trim point
            return [
                self._frames[i] for i in range(start, min(len(self._frames), start + max_frames))
            ]

    def acknowledge(self, fsn: int) -> None:
        with self._cond:
            fsn = min(fsn, self._published)
            if fsn <= self._acked:
                return
            self._acked = fsn
            while self._frames and self._base <= fsn:
                self._bytes -= len(self._frames.popleft()) + 8
                self._base += 1
            self._cond.notify_all()

    def add_listener(self, callback: Callable[[], None]) -> None:
        self._listeners.append(callback)

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()


class TopicSource:
    """Drain a tidelog topic through the durable subscriber ``subscriber`` (FWD-22).

    The subscriber's hwm is the trim point: ``acked_fsn = hwm - 1``. Records are fetched with
    ``Topic.read`` (not ``poll``): a reconnect must re-read from ``acked_fsn + 1`` at once, and a
    poll cursor only rewinds at a restart (SUB-9). Progress is flushed at most every
    ``flush_interval_ms`` and on close: the receiver de-duplicates, so replaying a few records
    after a crash costs nothing but bandwidth (DUR-9 at-least-once).
    """

    blocking_reads = True

    def __init__(
        self,
        topic: Topic,
        subscriber: str = "forward",
        *,
        start: str = "earliest",
        flush_interval_ms: int = 200,
    ) -> None:
        self.topic = topic
        self.name = f"topic {topic.name!r} (subscriber {subscriber!r})"
        #: the topic's incarnation (TOP-10): its FSNs are a numbering of this one alone (FWD-34)
        self.incarnation: int = topic.incarnation
        self.dropped: str | None = None
        self.sub: Subscriber = topic.subscribe(subscriber, start=start)
        self._acked = self.sub.hwm - 1
        self._published = topic.state().head_seq - 1
        self._flush_interval = flush_interval_ms / 1000.0
        self._last_flush = time.monotonic()
        self._listeners: list[Callable[[], None]] = []
        self._stop = threading.Event()
        self._manager = _Manager("tidelog-topic-manager", self._apply)
        self._watcher = threading.Thread(
            target=self._watch, name="tidelog-topic-watch", daemon=True
        )
        self._watcher.start()

    def published_fsn(self) -> int:
        return self._published

    def symbol_dict(self) -> None:
        return None  # a topic's records carry no client dictionary (FWD-32)

    def acked_fsn(self) -> int:
        return self._acked

    def _refresh(self) -> None:
        self._published = max(self._published, self.topic.state().head_seq - 1)

    def _gone(self) -> None:
        """FWD-35: the topic was dropped; the loop stops on ``dropped``, listeners wake it."""
        if self.dropped is None:
            self.dropped = f"topic {self.topic.name!r} (incarnation {self.incarnation}) was dropped"
        for callback in list(self._listeners):
            callback()

    def read(self, fsn: int, max_frames: int) -> list[bytes] | Gap:
        try:
            return self._read(fsn, max_frames)
        except NoSuchTopic:
            self._gone()
            raise

    def _read(self, fsn: int, max_frames: int) -> list[bytes] | Gap:
        self._refresh()
        if fsn > self._published:
            return []
        items = self.topic.read(after=fsn, limit=max_frames)
        out: list[bytes] = []
        expect = fsn + 1  # the seq of FSN fsn
        for item in items:
            if isinstance(item, Tombstone):
                if out:
                    break
                continue
            assert isinstance(item, Record)
            if item.seq != expect:
                break  # a hole (deleted or evicted records) ends the contiguous run
            out.append(item.payload)
            expect += 1
        if out:
            return out
        # Nothing at fsn: FSNs resume at the next live record, or after the head.
        for item in items:
            if isinstance(item, Record):
                return Gap(item.seq - 1)
        return Gap(self._published + 1)

    def acknowledge(self, fsn: int) -> None:
        if fsn > self._acked:
            self._acked = min(fsn, self._published)
            self._manager.submit(self._acked)

    def _apply(self, fsn: int) -> None:
        try:
            self.sub.commit(fsn + 1)
            now = time.monotonic()
            if now - self._last_flush >= self._flush_interval:
                self.sub.flush()
                self._last_flush = now
        except (Closed, NoSuchTopic, NoSuchSubscriber):
            # the store closed under us (progress up to the last flush stands), or the topic
            # was dropped and its subscriber with it (FWD-35: the loop reports that)
            pass

    def add_listener(self, callback: Callable[[], None]) -> None:
        self._listeners.append(callback)

    def _watch(self) -> None:
        """Wake the loop when the topic grows (``read(wait_ms)`` blocks on its change event)."""
        while not self._stop.is_set():
            try:
                self.topic.read(after=self._published + 1, limit=1, wait_ms=200)
                before = self._published
                self._refresh()
            except NoSuchTopic:
                self._gone()  # FWD-35: nothing more to watch
                return
            except TidelogError:
                if self._stop.wait(0.05):
                    return
                continue
            if self._published != before:
                for callback in list(self._listeners):
                    callback()

    def close(self) -> None:
        self._stop.set()
        self._watcher.join()
        self._manager.close()
        try:
            if self._acked >= 0:
                self.sub.commit(self._acked + 1)
            self.sub.flush()
        except (Closed, NoSuchTopic, NoSuchSubscriber):
            pass  # closed, or dropped with its topic (FWD-35)
