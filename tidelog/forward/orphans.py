"""Orphan adoption: drain sibling slots another sender left behind (FWD-17, FWD-31).

With ``drain_orphans=on`` the foreground sender, after locking its own slot, lists
``<sf_dir>/*`` for slots that are not its own, hold at least one ``*.sfa`` and have no
``.failed``. Lock state is deliberately not part of that filter (testing a lock races with
concurrent acquirers): each drainer just tries the lock and skips the slot on contention.

At most ``max_background_drainers`` drainers run at once. A drainer recovers the slot, opens its
own connection with the orphan's ``sender_id`` as client id (so the receiver de-duplicates the
orphan's FSNs against what that sender already delivered, FWD-20), and releases the slot once
``ackedFsn >= publishedFsn``. What it leaves follows the rule of questdb 6.0.0's own orphan
drainer (FWD-31), so the two can share an ``sf_dir``: only a slot whose recovery is refused gets
``.failed`` (SF-16; later scans, tidelog's and the client's, skip it until an operator removes
it); every other give-up -- reconnect budget spent, an auth failure, a halt, an I/O error at
open -- writes ``.last_error`` and leaves the slot for the next drainer; a drain that succeeds
removes ``.last_error``.
"""

from __future__ import annotations

import logging
import os
import random
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from tidelog.backends.sf.format import is_segment_name
from tidelog.backends.sf.recovery import FAILED_FILE
from tidelog.backends.sf.slot import Slot
from tidelog.clock import Clock
from tidelog.errors import Corrupt, Locked, TidelogError
from tidelog.fsio import FS, OsFS

from .conf import SenderConfig
from .errors import ErrorHandler, SenderFailed
from .loop import Sleep
from .source import SlotSource

__all__ = ["LAST_ERROR_FILE", "DrainerPool", "orphan_candidates"]

log = logging.getLogger("tidelog.forward")

#: the orphan drainer's last give-up reason (FWD-31; questdb 6.0.0 writes the same file, SF-27)
LAST_ERROR_FILE = ".last_error"


def write_last_error(fs: FS, slot_dir: str, reason: str) -> None:
    """FWD-31: record why a drain stopped without marking the slot failed. Informational, as the
    client's (not synced, best effort): losing it costs nothing, failing to write it is logged."""
    path = os.path.join(slot_dir, LAST_ERROR_FILE)
    try:
        if not fs.is_dir(slot_dir):
            return  # the slot is gone: nothing to annotate, and never create it
        h = fs.open(path)
        try:
            h.truncate(0)
            h.pwrite((reason.rstrip() + "\n").encode("utf-8"), 0)
        finally:
            h.close()
    except OSError as exc:
        log.warning("orphan slot %s: cannot write %s: %s", slot_dir, LAST_ERROR_FILE, exc)


def clear_last_error(fs: FS, slot_dir: str) -> None:
    """FWD-31: a drain that succeeded removes the previous give-up reason (best effort)."""
    path = os.path.join(slot_dir, LAST_ERROR_FILE)
    try:
        if fs.exists(path):
            fs.unlink(path)
    except OSError as exc:
        log.warning("orphan slot %s: cannot remove %s: %s", slot_dir, LAST_ERROR_FILE, exc)


def orphan_candidates(fs: FS, sf_dir: str, own: str) -> list[str]:
    """Sibling slot names worth draining (FWD-17), sorted."""
    out: list[str] = []
    if not fs.is_dir(sf_dir):
        return out
    for name in fs.listdir(sf_dir):
        path = os.path.join(sf_dir, name)
        if name == own or not fs.is_dir(path):
            continue
        names = fs.listdir(path)
        if FAILED_FILE in names or not any(is_segment_name(n) for n in names):
            continue
        out.append(name)
    return out


class DrainerPool:
    """Runs up to ``max_background_drainers`` orphan drainers; see the module docstring.

    ``sender`` builds each drainer (the ``Forwarder`` class, passed in by the forwarder that
    owns the pool, so this module need not import that one)."""

    def __init__(
        self,
        conf: SenderConfig,
        sender: Callable[..., Any],
        *,
        fs: FS | None = None,
        error_handler: ErrorHandler | None = None,
        rng: random.Random | None = None,
        clock: Clock | None = None,
        sleep: Sleep | None = None,
    ) -> None:
        assert conf.sf_dir is not None
        self.conf = conf
        self._sender = sender
        self.fs = fs or OsFS()
        self._kwargs: dict[str, Any] = dict(
            error_handler=error_handler, rng=rng, clock=clock, sleep=sleep, fs=self.fs
        )
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._live: list[Any] = []  # running drainer forwarders, closed on stop
        self.active = 0
        self.peak_active = 0  # the most drainers ever running at once (<= the pool size)
        self.succeeded = 0
        self.failed = 0
        self.skipped = 0
        self._pool = ThreadPoolExecutor(
            max_workers=conf.max_background_drainers, thread_name_prefix="tidelog-drainer"
        )

    def start(self) -> None:
        assert self.conf.sf_dir is not None
        for name in orphan_candidates(self.fs, self.conf.sf_dir, self.conf.sender_id):
            self._pool.submit(self._drain, name)

    def _drain(self, name: str) -> None:
        if self._stop.is_set():
            return
        with self._lock:
            self.active += 1
            self.peak_active = max(self.peak_active, self.active)
        try:
            outcome = self._drain_slot(name)
        except Exception:
            log.exception("orphan drainer for %s crashed", name)
            outcome = "failed"
        finally:
            with self._lock:
                self.active -= 1
        with self._lock:
            if outcome == "succeeded":
                self.succeeded += 1
            elif outcome == "failed":
                self.failed += 1
            else:
                self.skipped += 1

    def _drain_slot(self, name: str) -> str:
        """One orphan, to one of ``succeeded``/``failed``/``skipped``/``stopped``. What it
        leaves in the slot (``.failed`` only for a refused recovery, ``.last_error`` for every
        other give-up) is FWD-31."""
        conf = self.conf
        assert conf.sf_dir is not None
        slot_dir = os.path.join(conf.sf_dir, name)
        try:
            slot = Slot.open(
                conf.sf_dir,
                name,
                fs=self.fs,
                max_bytes=conf.sf_max_bytes,
                max_total_bytes=conf.sf_max_total_bytes,
                durability=conf.sf_durability,
                create=False,
                fail_marker=True,
            )
        except Locked:
            log.info("orphan slot %s is locked by a live sender; skipping", name)
            return "skipped"
        except Corrupt as exc:  # Slot.open wrote .failed under the lock (fail_marker, SF-16)
            log.error("orphan slot %s: %s; marked .failed", name, exc.message)
            return "failed"
        except TidelogError as exc:  # io_error, a vanished slot: not damage (FWD-31)
            write_last_error(self.fs, slot_dir, f"opening the slot failed: {exc}")
            log.error("orphan slot %s: cannot open: %s", name, exc)
            return "failed"
        if slot.acked_fsn >= slot.published_fsn:
            clear_last_error(self.fs, slot.dir)
            slot.close()
            return "succeeded"
        drainer_conf = conf.with_changes(
            sender_id=name,
            tidelog_client_id=None,
            drain_orphans=False,
            initial_connect_retry="async",
        )
        source = SlotSource(slot, append_deadline_ms=0)
        try:
            fwd = self._sender(drainer_conf, source=source, **self._kwargs)
        except TidelogError as exc:
            write_last_error(self.fs, slot.dir, f"drainer could not start: {exc}")
            source.close()
            return "failed"
        with self._lock:
            self._live.append(fwd)
        try:
            while not self._stop.is_set():
                if fwd.wait_acked(timeout=0.5) or fwd.last_terminal_error is not None:
                    break
            error = fwd.last_terminal_error
            if error is not None:
                # A terminal wire error is no damage of the slot: .last_error, never .failed,
                # so the next drainer (tidelog's or the client's) tries again (FWD-31).
                write_last_error(self.fs, slot.dir, f"orphan drainer gave up: {error}")
                log.error("orphan slot %s: drainer gave up: %s", name, error)
                return "failed"
            if fwd.acked_fsn >= fwd.published_fsn:
                clear_last_error(self.fs, slot.dir)  # still under the slot lock
                return "succeeded"
            return "stopped"
        finally:
            with self._lock:
                self._live.remove(fwd)
            try:
                fwd.conf = fwd.conf.with_changes(close_flush_timeout_millis=0)
                fwd.close()
            except SenderFailed:
                pass  # already recorded in .failed and logged

    def close(self) -> None:
        """Stop every drainer (their slots keep what is unacknowledged) and wait for them."""
        self._stop.set()
        self._pool.shutdown(wait=True, cancel_futures=True)
