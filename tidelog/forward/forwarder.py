"""The public forwarder (FWD-1..FWD-18).

    from tidelog.forward import Forwarder
    with Forwarder("ws::addr=127.0.0.1:9000;sf_dir=/var/lib/app/sf;sender_id=edge-7;") as fwd:
        fwd.append(b"...")   # durable in the slot per sf_durability; never waits for the wire
    # close(): waits up to close_flush_timeout_millis for acks, then releases the slot

    fwd = Forwarder.for_topic("ws::addr=...;sender_id=edge-7;", store.topic("events"))

A forwarder owns one source (SF slot, memory ring or topic subscriber), one I/O thread, one
error dispatcher and, with ``drain_orphans=on``, a pool of orphan drainers.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from tidelog.api import Topic
from tidelog.backends.instances.backend import InstancesBackend
from tidelog.backends.sf.slot import Slot
from tidelog.clock import Clock
from tidelog.errors import NotAvailable
from tidelog.fsio import FS
from tidelog.hooks import offers

from .conf import SenderConfig, parse_conf
from .errors import ErrorHandler, ErrorInbox, SenderError, sender_failed
from .loop import IOLoop, Sleep, Tracer
from .orphans import DrainerPool
from .source import MemorySource, SlotSource, Source, TopicSource, topic_client_id

if TYPE_CHECKING:
    from .instances import InstancesForwarder

__all__ = ["Forwarder"]

log = logging.getLogger("tidelog.forward")


class Forwarder:
    """Drain a source to a receiver over WebSocket. See the module docstring."""

    def __init__(
        self,
        conf: str | SenderConfig,
        *,
        source: Source | None = None,
        error_handler: ErrorHandler | None = None,
        rng: random.Random | None = None,
        clock: Clock | None = None,
        sleep: Sleep | None = None,
        tracer: Tracer | None = None,
        fs: FS | None = None,
    ) -> None:
        self.conf = parse_conf(conf) if isinstance(conf, str) else conf
        if isinstance(source, TopicSource):
            # a re-created topic numbers its FSNs from 0 again: a client id of its own (FWD-34)
            client_id = topic_client_id(self.conf.client_id, source.incarnation)
            if client_id != self.conf.client_id:
                self.conf = self.conf.with_changes(tidelog_client_id=client_id)
        self._closed = False
        self._producer_saw_terminal = False
        self._drainers: Any = None
        self.inbox = ErrorInbox(self.conf.error_inbox_capacity, error_handler)
        owned = source is None
        if source is None:
            source = self._open_source(fs, clock)
        self.source: Source = source
        try:
            replay = source.published_fsn()  # after a restart every recovered frame may be resent
            self._io = IOLoop(
                self.conf,
                source,
                self.inbox,
                rng=rng,
                clock=clock,
                sleep=sleep,
                tracer=tracer,
                replay_target=replay,
            )
            self._wire_backpressure()
            self._io.start()
            if self.conf.initial_connect_retry != "async":
                # off: the first failure is terminal; on: retry until connected or out of budget.
                self._io.first_outcome.wait()
                if self._io.terminal is not None and not self._io.ever_connected:
                    error = self._io.terminal
                    self._shutdown()
                    self._closed = True
                    raise sender_failed(error)
        except BaseException:
            if not self._closed and owned:
                self._io_stop_quietly()
                source.close()
                self._closed = True
            raise
        if self.conf.drain_orphans:
            self._drainers = DrainerPool(
                self.conf,
                Forwarder,
                fs=fs,
                error_handler=error_handler,
                rng=rng,
                clock=clock,
                sleep=sleep,
            )
            self._drainers.start()

    @classmethod
    def for_topic(
        cls,
        conf: str | SenderConfig,
        topic: Topic,
        *,
        subscriber: str = "forward",
        start: str = "earliest",
        **kwargs: Any,
    ) -> Forwarder | InstancesForwarder:
        """Drain a tidelog topic through the durable subscriber ``subscriber`` (FWD-22); a
        topic of an instances store through the merged subscriber ``subscriber``, one
        forwarder per instance (FWD-33)."""
        if offers(topic.store, InstancesBackend):
            from .instances import InstancesForwarder

            return InstancesForwarder(
                cls, conf, topic, subscriber=subscriber, start=start, **kwargs
            )
        source = TopicSource(topic, subscriber, start=start)
        try:
            return cls(conf, source=source, **kwargs)
        except BaseException:
            source.close()
            raise

    def _open_source(self, fs: FS | None, clock: Clock | None) -> Source:
        conf = self.conf
        if conf.sf_dir is None:
            return MemorySource(
                conf.sf_max_total_bytes, conf.sf_max_bytes, conf.sf_append_deadline_millis
            )
        slot = Slot.open(
            conf.sf_dir,
            conf.sender_id,
            fs=fs,
            max_bytes=conf.sf_max_bytes,
            max_total_bytes=conf.sf_max_total_bytes,
            durability=conf.sf_durability,
            clock=clock,
        )
        return SlotSource(slot, append_deadline_ms=conf.sf_append_deadline_millis)

    def _wire_backpressure(self) -> None:
        conf = self.conf

        def reason() -> str:
            return self._io.backpressure_message(
                conf.sf_max_total_bytes, conf.sf_append_deadline_millis
            )

        target: Any = self.source.slot if isinstance(self.source, SlotSource) else self.source
        if hasattr(target, "backpressure_reason"):
            target.backpressure_reason = reason

    # -- producer API ----------------------------------------------------------------------
    def append(self, payload: bytes) -> int:
        """Publish one frame; returns its FSN. Raises the latched terminal error (§14.5)."""
        self.check_error()
        append: Callable[[bytes], int] | None = getattr(self.source, "append", None)
        if append is None:
            raise NotAvailable(f"{self.source.name}: append to the topic itself, not the forwarder")
        return append(payload)

    def flush(self) -> None:
        """Make published frames durable per ``sf_durability`` (SF-11); never waits for acks."""
        self.check_error()
        flush: Callable[[], None] | None = getattr(self.source, "flush", None)
        if flush is not None:
            flush()

    def check_error(self) -> None:
        """Raise the latched terminal error, if any (the producer saw it synchronously)."""
        error = self._io.terminal
        if error is not None:
            self._producer_saw_terminal = True
            raise sender_failed(error)

    def wait_acked(self, fsn: int | None = None, timeout: float = 30.0) -> bool:
        """Block until ``acked_fsn >= fsn`` (default: everything published so far), a terminal
        error, or ``timeout`` seconds. Returns whether the target was reached."""
        target = self.source.published_fsn() if fsn is None else fsn
        end = time.monotonic() + timeout
        with self._io.state_cond:
            while self._io.acked < target and self._io.terminal is None:
                left = end - time.monotonic()
                if left <= 0 or not self._io.running:
                    break
                self._io.state_cond.wait(min(left, 0.5))
            return self._io.acked >= target

    # -- state -----------------------------------------------------------------------------
    @property
    def acked_fsn(self) -> int:
        return self._io.acked

    @property
    def published_fsn(self) -> int:
        return self.source.published_fsn()

    @property
    def connected(self) -> bool:
        return self._io.connected

    @property
    def running(self) -> bool:
        return self._io.running

    def counters(self) -> dict[str, Any]:
        """FWD-16 counters under snake_case names, plus tidelog's extras."""
        out: dict[str, Any] = self._io.counters.as_dict()
        out["dropped_error_notifications"] = self.inbox.dropped
        out["total_error_notifications_delivered"] = self.inbox.delivered
        out["last_terminal_error"] = self._io.terminal
        stalls = getattr(self.source, "backpressure_stalls", None)
        if stalls is None and isinstance(self.source, SlotSource):
            stalls = self.source.slot.backpressure_stalls
        out["total_backpressure_stalls"] = stalls or 0
        pool = self._drainers
        out["active_background_drainers"] = pool.active if pool else 0
        out["total_background_drainers_succeeded"] = pool.succeeded if pool else 0
        out["total_background_drainers_failed"] = pool.failed if pool else 0
        out["acked_fsn"] = self._io.acked
        out["published_fsn"] = self.source.published_fsn()
        return out

    @property
    def last_terminal_error(self) -> SenderError | None:
        return self._io.terminal

    # -- close (FWD-15) -------------------------------------------------------------------
    def close(self) -> None:
        """Wait up to ``close_flush_timeout_millis`` for every published frame to be
        acknowledged (0 or -1: do not wait), stop the I/O loop, release the source (slot lock)
        last, then rethrow a latched terminal error nobody has seen yet (the safety net)."""
        if self._closed:
            return
        self._closed = True
        try:
            flush = getattr(self.source, "flush", None)
            if flush is not None:
                try:
                    flush()
                except Exception:
                    log.exception("flushing the source at close failed")
            timeout_ms = self.conf.close_flush_timeout_millis
            skip = timeout_ms <= 0 or self._io.terminal is not None  # 0 / -1: no drain
            drained = skip or self.wait_acked(timeout=timeout_ms / 1000.0)
            if not drained and self._io.terminal is None:
                log.warning(
                    "close: %d frames still unacknowledged after %d ms; they stay in %s",
                    self.source.published_fsn() - self._io.acked,
                    timeout_ms,
                    self.source.name,
                )
        finally:
            self._shutdown()
        self._safety_net()

    def _shutdown(self) -> None:
        # Order matters (FWD-15): the I/O loop and the drainers quiesce first, then
        # the source's manager, and only then is the slot (and its lock) released.
        self._io_stop_quietly()
        if self._drainers is not None:
            self._drainers.close()
        self.source.close()
        self.inbox.close()

    def _io_stop_quietly(self) -> None:
        io = getattr(self, "_io", None)  # None: failed before the loop existed
        if io is not None:
            io.stop()

    def _safety_net(self) -> None:
        error = self._io.terminal
        if error is None:
            return
        if self.inbox.custom and self.inbox.delivered > 0:
            return  # guard 1: a custom handler already owned a failure
        if self._producer_saw_terminal:
            return  # guard 2: append/flush already raised it
        raise sender_failed(error)

    def __enter__(self) -> Forwarder:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return (
            f"<tidelog.forward.Forwarder {self.conf.client_id} acked={self._io.acked} "
            f"published={self.source.published_fsn()}>"
        )
