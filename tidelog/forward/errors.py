"""Sender errors and the bounded error inbox (FWD-9, FWD-10, FWD-15, FWD-16).

A ``SenderError`` describes one server rejection, close code or give-up. The I/O loop offers each
one to an ``ErrorInbox`` (never blocking: overflow drops the oldest and counts it); a lazily
started daemon thread delivers them to the user's handler. The default handler logs every error
(ERROR for HALT, WARNING for DROP_AND_CONTINUE): silence is forbidden (§14.6, §20), because a
quiet handler hides data loss exactly like a healthy connection would.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from tidelog.errors import NoSuchTopic, TidelogError

__all__ = [
    "SenderError",
    "SenderFailed",
    "TopicDropped",
    "sender_failed",
    "ErrorHandler",
    "ErrorInbox",
    "default_error_handler",
]

log = logging.getLogger("tidelog.forward")


@dataclass(frozen=True)
class SenderError:
    """One error notification (FWD-9, FSN-7)."""

    category: str  # model.fsn.CATEGORIES
    policy: str  # HALT | DROP_AND_CONTINUE
    status: int  # server status byte; -1 when synthesized (close code, give-up, handshake)
    sequence: int  # the wire sequence it applies to; -1 when synthesized
    first_fsn: int  # FSN span the error covers (inclusive)
    last_fsn: int
    message: str
    client_id: str = ""
    #: the ERR-1 code the producer gets it under: ``no_such_topic`` for a dropped topic (FWD-35)
    code: str = "sender_error"

    def __str__(self) -> str:
        status = f"0x{self.status:02x}" if self.status >= 0 else "-"
        return (
            f"{self.category}/{self.policy} [{self.client_id}] status={status} "
            f"wireSeq={self.sequence} fsn={self.first_fsn}..{self.last_fsn}: {self.message}"
        )


class SenderFailed(TidelogError):
    """The forwarder latched a terminal error (HALT); raised to the producer and by close()."""

    code = "sender_error"

    def __init__(self, error: SenderError) -> None:
        super().__init__(str(error))
        self.error = error


class TopicDropped(SenderFailed, NoSuchTopic):
    """FWD-35: the topic the forwarder drained was dropped; ``except NoSuchTopic`` catches it."""

    code = "no_such_topic"


def sender_failed(error: SenderError) -> SenderFailed:
    """The exception a latched terminal error is raised as (FWD-9, FWD-35)."""
    return TopicDropped(error) if error.code == TopicDropped.code else SenderFailed(error)


ErrorHandler = Callable[[SenderError], None]


def default_error_handler(error: SenderError) -> None:
    """Log every error: ERROR for HALT, WARNING for DROP_AND_CONTINUE."""
    level = logging.ERROR if error.policy == "HALT" else logging.WARNING
    log.log(level, "sender error: %s", error)


class ErrorInbox:
    """Bounded queue from the I/O loop to a dispatcher thread; drop-oldest on overflow."""

    def __init__(self, capacity: int, handler: ErrorHandler | None) -> None:
        self.capacity = capacity
        self.custom = handler is not None
        self._handler = handler or default_error_handler
        self._queue: deque[SenderError] = deque()
        self._cond = threading.Condition()
        self._thread: threading.Thread | None = None
        self._stopping = False
        self._busy = False
        self.dropped = 0  # droppedErrorNotifications
        self.delivered = 0  # totalErrorNotificationsDelivered

    def offer(self, error: SenderError) -> None:
        """Never blocks (the I/O loop calls it)."""
        with self._cond:
            if self._stopping:
                # Late errors after close still must not vanish silently.
                default_error_handler(error)
                return
            if len(self._queue) >= self.capacity:
                self._queue.popleft()
                self.dropped += 1
            self._queue.append(error)
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, name="tidelog-forward-errors", daemon=True
                )
                self._thread.start()
            self._cond.notify_all()

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._queue and not self._stopping:
                    self._cond.wait()
                if not self._queue:
                    return
                error = self._queue.popleft()
                self._busy = True
            try:
                self._handler(error)
            except Exception:  # a broken handler must not kill the dispatcher
                log.exception("error handler raised on %s", error)
            with self._cond:
                self._busy = False
                self.delivered += 1
                self._cond.notify_all()

    def drain(self, timeout: float) -> bool:
        """Wait until every queued error was delivered; False on timeout."""
        end = time.monotonic() + timeout
        with self._cond:
            while self._queue or self._busy:
                left = end - time.monotonic()
                if left <= 0 or self._thread is None:
                    return False
                self._cond.wait(left)
            return True

    def close(self, timeout: float = 5.0) -> None:
        self.drain(timeout)
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
            thread = self._thread
        if thread is not None:
            thread.join(timeout)
