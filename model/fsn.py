"""Store-and-forward FSN bookkeeping of the sending side (spec FSN-1..FSN-10).

A forwarder drains frames, numbered by a monotonic frame sequence number (FSN), to a receiver.
Each connection numbers what it sends from 0 (the wire sequence); the receiver echoes wire
sequences back in OK and error frames, and the forwarder maps them to FSNs with
``fsn = fsn_at_zero + wire_seq`` (FSN-1). ``acked_fsn`` is the trim point: everything at or below
it is confirmed and never sent again.

The pure functions are the rules; :class:`ForwarderModel` is the executable model that strings
them together into the sender's state machine (no I/O, no clock: time and randomness are passed
in by the caller).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from itertools import pairwise
from typing import Final, Literal, NamedTuple, get_args

from tidelog.errors import BadArgument, Corrupt

__all__ = [
    "CATEGORIES",
    "DEFAULT_INITIAL_BACKOFF_MS",
    "DEFAULT_MAX_BACKOFF_MS",
    "DEFAULT_MAX_OUTAGE_MS",
    "POLICIES",
    "TERMINAL_CLOSE_CODES",
    "Category",
    "ForwarderModel",
    "Halt",
    "Policy",
    "backoff_sleep",
    "backoff_window",
    "close_code_is_terminal",
    "default_policy",
    "effective_policy",
    "fsn_of",
    "ok_ack_target",
    "recovery_seed",
    "status_category",
]

Category = Literal[
    "SCHEMA_MISMATCH",
    "PARSE_ERROR",
    "INTERNAL_ERROR",
    "SECURITY_ERROR",
    "WRITE_ERROR",
    "PROTOCOL_VIOLATION",
    "UNKNOWN",
]
Policy = Literal["HALT", "DROP_AND_CONTINUE"]

CATEGORIES: Final[tuple[Category, ...]] = get_args(Category)
POLICIES: Final[tuple[Policy, ...]] = get_args(Policy)

#: Error-frame status byte -> category (FSN-7, FWD-9). Anything else is UNKNOWN.
_STATUS_CATEGORY: Final[Mapping[int, Category]] = {
    3: "SCHEMA_MISMATCH",
    5: "PARSE_ERROR",
    6: "INTERNAL_ERROR",
    8: "SECURITY_ERROR",
    9: "WRITE_ERROR",
}
#: Rejections that replaying would only reproduce, and that are per batch in character.
_DROP_BY_DEFAULT: Final = frozenset({"SCHEMA_MISMATCH", "WRITE_ERROR"})
#: The connection is gone, or we do not understand the error: never overridable (FSN-7).
_FORCED_HALT: Final = frozenset({"PROTOCOL_VIOLATION", "UNKNOWN"})

#: WebSocket close codes that mean a protocol violation: halt, do not reconnect (FSN-8).
TERMINAL_CLOSE_CODES: Final = frozenset({1002, 1003, 1007, 1008, 1009, 1010})

#: Defaults for the reconnect loop (FSN-9; FWD-1 lists them).
DEFAULT_INITIAL_BACKOFF_MS: Final = 100
DEFAULT_MAX_BACKOFF_MS: Final = 5_000
DEFAULT_MAX_OUTAGE_MS: Final = 300_000


# --- FSN arithmetic (FSN-1, FSN-2, FSN-5) -------------------------------------------------------


def fsn_of(fsn_at_zero: int, wire_seq: int) -> int:
    """FSN of the frame sent with wire sequence ``wire_seq`` on a connection (FSN-1).

    pre: fsn_at_zero >= 0
    pre: wire_seq >= 0
    post: __return__ - wire_seq == fsn_at_zero
    """
    return fsn_at_zero + wire_seq


def ok_ack_target(fsn_at_zero: int, sequence: int, next_wire_seq: int) -> int | None:
    """The FSN an OK with wire sequence ``sequence`` confirms up to (FSN-2).

    Clamped to the last frame actually sent, so a receiver acking frames it never got cannot
    move the trim point past them. ``None`` when nothing was sent on this connection yet.

    pre: fsn_at_zero >= 0
    pre: next_wire_seq >= 0
    post: (__return__ is None) == (next_wire_seq == 0)
    post: __return__ is None or __return__ <= fsn_at_zero + next_wire_seq - 1
    post: __return__ is None or __return__ <= fsn_at_zero + sequence
    """
    if next_wire_seq == 0:
        return None
    return fsn_at_zero + min(sequence, next_wire_seq - 1)


def recovery_seed(segments: Sequence[tuple[int, int]], watermark: int | None) -> tuple[int, int]:
    """``(acked_fsn, published_fsn)`` recovered from ``(base_seq, frame_count)`` pairs (FSN-5).

    ``segments`` may come in any order (directory listing order). ``watermark`` is the
    ``.ack-watermark`` FSN, or ``None`` when the file is absent, torn or has a bad magic. A
    watermark above the frames on disk is corruption and is ignored: trusting it would skip
    frames that were never acknowledged.

    raises: Corrupt
    post: -1 <= __return__[0] <= __return__[1]
    post: len(segments) > 0 or __return__ == (-1, -1)
    """
    if not segments:
        return (-1, -1)
    # Ties on base_seq are only legal when the earlier one is empty; sorting by count too makes
    # the answer independent of listing order.
    ordered = sorted(segments)
    _check_contiguous(ordered)
    lowest_base = ordered[0][0]
    last_base, last_count = ordered[-1]
    published = last_base + last_count - 1
    acked = lowest_base - 1
    if watermark is not None and watermark <= published:
        acked = max(acked, watermark)
    return (acked, published)


def _check_contiguous(ordered: Sequence[tuple[int, int]]) -> None:
    """Raise Corrupt unless the sorted segments are valid and leave no FSN gap (FSN-5)."""
    for base, count in ordered:
        if base < 0 or count < 0:
            raise Corrupt(f"segment base_seq={base} frame_count={count}: must not be negative")
    for (prev_base, prev_count), (base, _) in pairwise(ordered):
        if prev_base + prev_count != base:
            raise Corrupt(
                f"segments not contiguous: {prev_base}+{prev_count} != {base}; refusing recovery"
            )


# --- error frames and close codes (FSN-7, FSN-8) ------------------------------------------------


def status_category(status: int) -> Category:
    """Category of an error frame's status byte (FSN-7).

    post: __return__ in CATEGORIES
    post: __return__ not in ("PROTOCOL_VIOLATION",)
    post: (__return__ == "UNKNOWN") == (status not in (3, 5, 6, 8, 9))
    """
    return _STATUS_CATEGORY.get(status, "UNKNOWN")


def default_policy(category: str) -> Policy:
    """Default policy of a category (FSN-7). Unrecognised categories halt.

    post: (__return__ == "DROP_AND_CONTINUE") == (category in ("SCHEMA_MISMATCH", "WRITE_ERROR"))
    """
    return "DROP_AND_CONTINUE" if category in _DROP_BY_DEFAULT else "HALT"


def effective_policy(category: str, overrides: Mapping[str, str] | None = None) -> Policy:
    """Policy after user overrides (keyed by category); UNKNOWN and PROTOCOL_VIOLATION always halt.

    raises: BadArgument
    post: category not in ("UNKNOWN", "PROTOCOL_VIOLATION") or __return__ == "HALT"
    """
    if category in _FORCED_HALT or category not in CATEGORIES:
        return "HALT"
    chosen = (overrides or {}).get(category)
    if chosen is None:
        return default_policy(category)
    for policy in POLICIES:
        if chosen == policy:
            return policy
    raise BadArgument(f"error policy for {category} must be one of {POLICIES}, got {chosen!r}")


def close_code_is_terminal(code: int) -> bool:
    """Whether a WebSocket close code is a terminal protocol violation (FSN-8).

    post: __return__ == (code in (1002, 1003, 1007, 1008, 1009, 1010))
    """
    return code in TERMINAL_CLOSE_CODES


# --- reconnect backoff (FSN-9) ------------------------------------------------------------------


def backoff_window(attempt: int, initial_ms: int, max_ms: int) -> tuple[int, int]:
    """Equal-jitter window ``[d, 2d)`` after failed attempt ``attempt`` (from 0) (FSN-9).

    ``d = min(initial_ms * 2**attempt, max_ms)``; the shift is capped so a huge attempt count
    costs nothing (past ``max_ms.bit_length()`` doublings ``d`` is already ``max_ms``).

    raises: BadArgument
    pre: attempt >= 0
    pre: 1 <= initial_ms <= max_ms
    post: __return__[1] == 2 * __return__[0]
    post: initial_ms <= __return__[0] <= max_ms
    post: attempt > 30 or __return__[0] == min(initial_ms * 2 ** attempt, max_ms)
    """
    _check_backoff_args(attempt, initial_ms, max_ms)
    shift = min(attempt, max_ms.bit_length())
    d = min(initial_ms << shift, max_ms)
    return (d, 2 * d)


def backoff_sleep(
    attempt: int, initial_ms: int, max_ms: int, remaining_ms: int, unit: float
) -> int | None:
    """Milliseconds to sleep before the next attempt, or ``None`` to give up (FSN-9).

    ``unit`` in ``[0, 1)`` is the caller's random draw (no randomness in here). The sleep is
    uniform in the equal-jitter window and clamped to ``remaining_ms``, the time left in the
    outage budget, so one sleep never overshoots it; a spent budget gives up.

    raises: BadArgument
    pre: attempt >= 0
    pre: 1 <= initial_ms <= max_ms
    pre: 0.0 <= unit < 1.0
    post: (__return__ is None) == (remaining_ms <= 0)
    post: __return__ is None or 1 <= __return__ <= remaining_ms
    post: __return__ is None or __return__ < 2 * max_ms
    """
    if not 0.0 <= unit < 1.0:
        raise BadArgument(f"unit must be in [0, 1), got {unit!r}")
    low, high = backoff_window(attempt, initial_ms, max_ms)
    if remaining_ms <= 0:
        return None
    # min(): float rounding of unit * span may reach span itself when unit is just below 1.
    jitter = min(math.floor(unit * (high - low)), high - low - 1)
    return min(low + jitter, remaining_ms)


def _check_backoff_args(attempt: int, initial_ms: int, max_ms: int) -> None:
    if attempt < 0:
        raise BadArgument(f"attempt must be >= 0, got {attempt}")
    if not 1 <= initial_ms <= max_ms:
        raise BadArgument(f"need 1 <= initial_ms <= max_ms, got {initial_ms}, {max_ms}")


# --- the sender's state machine -----------------------------------------------------------------


class Halt(NamedTuple):
    """A latched terminal error (FSN-7, FSN-8, FSN-9)."""

    category: str
    status: int  # the error frame's status byte; -1 when synthesized (close code, budget)
    sequence: int  # the wire sequence it applies to; -1 when synthesized
    first_fsn: int  # the unacknowledged window at halt time: first_fsn..last_fsn
    last_fsn: int


class ForwarderModel:
    """Executable model of the forwarder's FSN bookkeeping (FWD-5, FWD-6, FWD-7, FSN-6, FWD-9).

    Drive it with the events a real forwarder sees; it answers which FSN to send next and keeps
    ``acked_fsn``. The ``FSN_n`` methods assert the invariants checkable from the state alone.
    Messages for a connection that is no longer open must not be fed in: their wire sequences
    would be mapped with the wrong ``fsn_at_zero``.
    """

    def __init__(self) -> None:
        self._reset()

    def _reset(self) -> None:
        self.published_fsn = -1
        self.acked_fsn = -1
        self.fsn_at_zero = 0
        self.next_wire_seq = 0
        self.connected = False
        self.durable_mode = False
        self.pending_durable: list[tuple[int, dict[str, int]]] = []
        self.table_watermarks: dict[str, int] = {}
        self.halted: Halt | None = None
        self.frames_replayed = 0
        self.replay_target_fsn = -1

    # producer side

    def publish(self, n: int = 1) -> list[int]:
        """Append ``n`` frames; returns their FSNs. Appending goes on while disconnected."""
        if n < 0:
            raise BadArgument(f"cannot publish {n} frames")
        first = self.published_fsn + 1
        self.published_fsn += n
        return list(range(first, self.published_fsn + 1))

    # connection lifecycle

    def connect(self, durable: bool = False) -> None:
        """A successful (re)connect: replay starts at the first unacknowledged frame (FSN-1, 6)."""
        if self.connected:
            raise BadArgument("already connected")
        if self.halted is not None:
            raise BadArgument(f"halted on {self.halted.category}; restart to resume")
        self.connected = True
        self.durable_mode = durable
        self.fsn_at_zero = self.acked_fsn + 1
        self.next_wire_seq = 0
        # Wire sequences of the old connection mean nothing on this one (FSN-4). The receiver
        # re-sends cumulative table watermarks, so forgetting ours only delays trimming.
        self.pending_durable = []
        self.table_watermarks = {}

    def disconnect(self) -> None:
        """The connection failed or closed with a reconnect-eligible code."""
        if self.connected:
            # Frames published from now on are new, not replays (FSN-6); a counter only.
            self.replay_target_fsn = self.published_fsn
        self.connected = False
        self.pending_durable = []

    def on_close(self, code: int) -> None:
        """A WebSocket close frame (FSN-8): terminal codes halt, every other code reconnects."""
        if not self.connected:
            return
        self.disconnect()
        if close_code_is_terminal(code):
            self._halt("PROTOCOL_VIOLATION", -1, -1)

    def give_up(self) -> None:
        """The reconnect budget is spent (FSN-9): terminal, surfaced as PROTOCOL_VIOLATION."""
        self.disconnect()
        if self.halted is None:
            self._halt("PROTOCOL_VIOLATION", -1, -1)

    def restart(self, segments: Sequence[tuple[int, int]], watermark: int | None) -> None:
        """A new process over the same slot: recover from disk, disconnected (FSN-5)."""
        acked, published = recovery_seed(segments, watermark)
        self._reset()  # a new process remembers nothing but the disk
        self.acked_fsn = acked
        self.published_fsn = published
        self.fsn_at_zero = acked + 1
        self.replay_target_fsn = published  # the previous process may have sent any of them

    # sending

    def next_frame(self) -> int | None:
        """The FSN to send next on this connection, in strict order (FSN-1, FSN-6), or None."""
        if not self.connected or self.halted is not None:
            return None
        fsn = fsn_of(self.fsn_at_zero, self.next_wire_seq)
        if fsn > self.published_fsn:
            return None
        self.next_wire_seq += 1
        if fsn <= self.replay_target_fsn:
            self.frames_replayed += 1
        return fsn

    # receiving

    def on_ok(self, sequence: int, tables: Mapping[str, int] | None = None) -> None:
        """An OK frame (FSN-2); in durable mode it is only queued (FSN-4)."""
        if not self._listening():
            return
        target = ok_ack_target(self.fsn_at_zero, sequence, self.next_wire_seq)
        if target is None:
            return
        if self.durable_mode:
            self.pending_durable.append((target - self.fsn_at_zero, dict(tables or {})))
            # An empty OK (no tables) is trivially durable: it drains at once when it reaches the
            # head of the queue (FWD-7), so an idle sender's close() can finish.
            self._drain_durable()
        else:
            self.acked_fsn = max(self.acked_fsn, target)

    def on_durable_ack(self, watermarks: Mapping[str, int]) -> None:
        """A durable-ack frame: max-merge table watermarks, pop covered entries (FSN-4)."""
        if not self._listening():
            return
        for table, seq_txn in watermarks.items():
            self.table_watermarks[table] = max(self.table_watermarks.get(table, seq_txn), seq_txn)
        self._drain_durable()

    def on_error(
        self, status: int, sequence: int, policy_overrides: Mapping[str, str] | None = None
    ) -> None:
        """An error frame (FSN-7): drop the rejected frame and go on, or halt."""
        if not self._listening():
            return
        category = status_category(status)
        if effective_policy(category, policy_overrides) == "HALT":
            self._halt(category, status, sequence)
            return
        target = ok_ack_target(self.fsn_at_zero, sequence, self.next_wire_seq)
        if target is None:
            return
        if self.durable_mode:
            # A rejected frame will never become durable: queue it as trivially covered.
            self.pending_durable.append((target - self.fsn_at_zero, {}))
            self._drain_durable()
        else:
            self.acked_fsn = max(self.acked_fsn, target)

    def skip_to(self, next_fsn: int) -> None:
        """The FSNs from the next unsent one up to ``next_fsn - 1`` no longer exist (a hole in a
        tidelog topic source: deleted or evicted records; FSN-10, spec/FORWARD.md FWD-22).

        ``fsn = fsn_at_zero + wire_seq`` cannot skip inside a connection, so the forwarder waits
        until everything sent is acknowledged, moves ``acked_fsn`` to ``next_fsn - 1`` and ends
        the connection; the next one starts at ``next_fsn`` (FSN-1, FSN-6 still hold).
        """
        if not self._listening():
            raise BadArgument("skip_to needs an open, unhalted connection")
        first_missing = self.fsn_at_zero + self.next_wire_seq
        if self.acked_fsn != first_missing - 1:
            raise BadArgument(f"frames up to {first_missing - 1} are not all acknowledged")
        if not first_missing < next_fsn <= self.published_fsn + 1:
            raise BadArgument(f"hole {first_missing}..{next_fsn - 1} outside the published range")
        self.acked_fsn = next_fsn - 1
        self.disconnect()
        # The closed window is accounted for; the next one is pinned at next_fsn (FSN-6).
        self.fsn_at_zero, self.next_wire_seq = next_fsn, 0

    def unacked_span(self) -> tuple[int, int]:
        """``(first, last)`` FSNs not yet acknowledged; empty when ``first > last``."""
        return (self.acked_fsn + 1, self.published_fsn)

    # internals

    def _listening(self) -> bool:
        # A halted loop has stopped: it neither sends nor processes incoming frames.
        return self.connected and self.halted is None

    def _covered(self, tables: Mapping[str, int]) -> bool:
        return all(
            table in self.table_watermarks and self.table_watermarks[table] >= seq_txn
            for table, seq_txn in tables.items()
        )

    def _drain_durable(self) -> None:
        top: int | None = None
        while self.pending_durable and self._covered(self.pending_durable[0][1]):
            wire_seq = self.pending_durable.pop(0)[0]
            top = wire_seq if top is None else max(top, wire_seq)
        if top is not None:
            self.acked_fsn = max(self.acked_fsn, self.fsn_at_zero + top)

    def _halt(self, category: str, status: int, sequence: int) -> None:
        self.halted = Halt(category, status, sequence, self.acked_fsn + 1, self.published_fsn)

    # invariant checks (raise AssertionError naming the rule)

    def FSN_1(self) -> None:
        """Sent frames are ``fsn_at_zero .. fsn_at_zero + next_wire_seq - 1``, all published."""
        _require(self.fsn_at_zero >= 0 and self.next_wire_seq >= 0, "FSN-1", "negative counter")
        last_sent = self.fsn_at_zero + self.next_wire_seq - 1
        _require(last_sent <= self.published_fsn, "FSN-1", f"sent {last_sent} > published")

    def FSN_2(self) -> None:
        """While connected, nothing beyond the last frame sent is acknowledged."""
        if self.connected:
            last_sent = self.fsn_at_zero + self.next_wire_seq - 1
            _require(self.acked_fsn <= last_sent, "FSN-2", f"acked > last sent {last_sent}")

    def FSN_3(self) -> None:
        """``-1 <= acked_fsn <= published_fsn``."""
        ok = -1 <= self.acked_fsn <= self.published_fsn
        _require(ok, "FSN-3", f"acked {self.acked_fsn}, published {self.published_fsn}")

    def FSN_4(self) -> None:
        """Durable entries exist only in durable mode, for frames already sent."""
        if not (self.durable_mode and self.connected):
            _require(not self.pending_durable, "FSN-4", "durable queue outside durable mode")
        for wire_seq, _ in self.pending_durable:
            _require(wire_seq < self.next_wire_seq, "FSN-4", f"queued unsent wire seq {wire_seq}")

    def FSN_6(self) -> None:
        """Each connection starts at the first unacknowledged frame: nothing skipped."""
        _require(self.fsn_at_zero <= self.acked_fsn + 1, "FSN-6", "frames skipped")
        if self.next_wire_seq == 0:
            # Nothing sent yet, so nothing can have been acknowledged since the connect.
            _require(self.fsn_at_zero == self.acked_fsn + 1, "FSN-6", "replay not at acked+1")

    def FSN_7(self) -> None:
        """A halt carries its status byte's category, and a halted model sends nothing."""
        if self.halted is None:
            return
        halt = self.halted
        if halt.status >= 0:
            _require(status_category(halt.status) == halt.category, "FSN-7", "wrong category")
        _require(not self._listening(), "FSN-7", "halted but still sending")

    def check_invariants(self) -> None:
        """Run every state invariant check."""
        for check in (self.FSN_1, self.FSN_2, self.FSN_3, self.FSN_4, self.FSN_6, self.FSN_7):
            check()


def _require(condition: bool, rule: str, detail: str) -> None:
    if not condition:
        raise AssertionError(f"{rule} violated: {detail}")
