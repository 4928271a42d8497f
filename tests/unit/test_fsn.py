"""Store-and-forward FSN rules and the forwarder model (spec FSN-1..FSN-10).

Unit tests pin each pure function to worked examples; a Hypothesis state machine then drives
:class:`ForwarderModel` against a simulated receiver that records what it really received and
confirmed, so the model is checked against the receiver's view rather than against itself.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

from tidelog.errors import BadArgument, Corrupt
from tidelog.model.fsn import (
    CATEGORIES,
    DEFAULT_INITIAL_BACKOFF_MS,
    DEFAULT_MAX_BACKOFF_MS,
    ForwarderModel,
    backoff_sleep,
    backoff_window,
    close_code_is_terminal,
    default_policy,
    effective_policy,
    fsn_of,
    ok_ack_target,
    recovery_seed,
    status_category,
)

# --- FSN-1, FSN-2 -------------------------------------------------------------------------------


def test_fsn_1_fsn_of_wire_seq() -> None:
    """FSN-1: fsn = fsnAtZero + wireSeq."""
    assert fsn_of(0, 0) == 0
    assert fsn_of(100, 0) == 100
    assert fsn_of(100, 7) == 107


def test_fsn_2_ok_ack_target_examples() -> None:
    """FSN-2: an OK maps back through fsnAtZero; a sequence ahead of what was sent is clamped."""
    assert ok_ack_target(100, 2, 5) == 102
    assert ok_ack_target(100, 4, 5) == 104
    assert ok_ack_target(100, 9, 5) == 104  # malicious: acks frames never sent
    assert ok_ack_target(100, 0, 0) is None  # nothing sent on this connection yet
    assert ok_ack_target(0, 0, 1) == 0


def test_fsn_2_ok_ack_target_grid() -> None:
    """FSN-2: exhaustive small grid, including sequences ahead of and below what was sent."""
    for fsn_at_zero in range(6):
        for next_wire_seq in range(7):
            for sequence in range(-2, 10):
                got = ok_ack_target(fsn_at_zero, sequence, next_wire_seq)
                if next_wire_seq == 0:
                    assert got is None
                    continue
                assert got is not None
                assert got <= fsn_at_zero + next_wire_seq - 1
                if sequence < next_wire_seq:
                    assert got == fsn_at_zero + sequence
                else:
                    assert got == fsn_at_zero + next_wire_seq - 1


def test_fsn_2_ok_before_any_frame_changes_nothing() -> None:
    """FSN-2: an OK received before any frame was sent on the connection changes nothing."""
    model = ForwarderModel()
    model.publish(3)
    model.connect()
    model.on_ok(0)
    model.on_ok(5)
    assert model.acked_fsn == -1
    assert model.next_frame() == 0


def test_fsn_2_malicious_ok_cannot_ack_unsent_frames() -> None:
    """FSN-2, FSN-3: a receiver acking wire sequences it was never sent cannot trim them."""
    model = ForwarderModel()
    model.publish(10)
    model.connect()
    for _ in range(3):
        model.next_frame()
    model.on_ok(1_000)
    assert model.acked_fsn == 2
    model.check_invariants()


# --- FSN-5 --------------------------------------------------------------------------------------


def test_fsn_5_recovery_without_watermark() -> None:
    """FSN-5: no usable watermark (absent, torn, bad magic): ackedFsn = lowestBase - 1."""
    assert recovery_seed([(0, 10), (10, 5)], None) == (-1, 14)
    assert recovery_seed([(10, 5), (15, 3)], None) == (9, 17)


def test_fsn_5_watermark_max_clamp_absorbs_either_order() -> None:
    """FSN-5, SF-6, SF-12: persist-then-crash picks the watermark, trim-then-crash the base."""
    assert recovery_seed([(0, 10), (10, 5)], 7) == (7, 14)  # persisted, trim never ran
    assert recovery_seed([(10, 5), (15, 3)], 7) == (9, 17)  # trimmed, watermark stale
    assert recovery_seed([(10, 5), (15, 3)], 17) == (17, 17)  # everything acked
    assert recovery_seed([(10, 5)], -5) == (9, 14)  # absurdly low: the base wins


def test_fsn_5_watermark_above_published_is_ignored() -> None:
    """FSN-5: a watermark above the frames on disk is corruption; trusting it would skip
    un-acked frames, so recovery falls back to lowestBase - 1."""
    assert recovery_seed([(10, 5), (15, 3)], 18) == (9, 17)
    assert recovery_seed([(10, 5), (15, 3)], 10**12) == (9, 17)


def test_fsn_5_segments_in_any_order() -> None:
    """FSN-5: the directory listing order does not matter."""
    segments = [(0, 4), (4, 4), (8, 4), (12, 0)]
    rng = random.Random(5)
    for _ in range(20):
        rng.shuffle(segments)
        assert recovery_seed(segments, 6) == (6, 11)


def test_fsn_5_empty_segments() -> None:
    """FSN-5: an empty active segment (frameCount 0) ends at base - 1."""
    assert recovery_seed([(0, 10), (10, 0)], None) == (-1, 9)
    assert recovery_seed([(5, 0)], None) == (4, 4)
    assert recovery_seed([(5, 3), (5, 0)], None) == (4, 7)
    assert recovery_seed([(5, 0), (5, 3)], None) == (4, 7)


def test_fsn_5_no_segments_is_a_fresh_start() -> None:
    """FSN-5: no segments -> (-1, -1), whatever the watermark says."""
    assert recovery_seed([], None) == (-1, -1)
    assert recovery_seed([], 42) == (-1, -1)


@pytest.mark.parametrize(
    "segments",
    [
        [(0, 10), (11, 5)],  # gap
        [(0, 10), (9, 5)],  # overlap
        [(20, 1), (0, 10)],  # gap, listed out of order
        [(-1, 3)],  # negative base
        [(0, 3), (3, -1)],  # negative count
    ],
)
def test_fsn_5_gap_or_negative_refuses_recovery(segments: list[tuple[int, int]]) -> None:
    """FSN-5: non-contiguous segments or a negative header field refuse recovery."""
    with pytest.raises(Corrupt):
        recovery_seed(segments, None)


def test_fsn_5_model_restart() -> None:
    """FSN-5, FSN-6: a restarted model resumes at the recovered trim point."""
    model = ForwarderModel()
    model.restart([(10, 5), (15, 3)], 12)
    assert (model.acked_fsn, model.published_fsn, model.connected) == (12, 17, False)
    model.connect()
    assert [model.next_frame() for _ in range(6)] == [13, 14, 15, 16, 17, None]
    assert model.frames_replayed == 5


# --- FSN-6 --------------------------------------------------------------------------------------


def test_fsn_6_reconnect_replays_from_acked_plus_one() -> None:
    """FSN-6, FSN-1: a reconnect restarts wire sequences at 0 and sends ackedFsn + 1 first."""
    model = ForwarderModel()
    assert model.publish(5) == [0, 1, 2, 3, 4]
    model.connect()
    assert [model.next_frame() for _ in range(6)] == [0, 1, 2, 3, 4, None]
    model.on_ok(2)
    assert model.acked_fsn == 2
    model.disconnect()
    model.publish(1)
    model.connect()
    assert (model.fsn_at_zero, model.next_wire_seq) == (3, 0)
    assert [model.next_frame() for _ in range(4)] == [3, 4, 5, None]
    model.on_ok(1)  # wire seq 1 on this connection is FSN 4
    assert model.acked_fsn == 4
    # 3 and 4 were published before the disconnect: replayed; 5 is new (FSN-6).
    assert model.frames_replayed == 2
    model.check_invariants()


# --- FSN-10 -------------------------------------------------------------------------------------


def test_fsn_10_skip_to_moves_past_a_hole_with_a_fresh_window() -> None:
    """FSN-10: once everything sent is acknowledged, a hole moves ackedFsn to just below the
    next existing FSN and ends the connection; the next window starts there."""
    model = ForwarderModel()
    model.publish(10)
    model.connect()
    assert [model.next_frame() for _ in range(3)] == [0, 1, 2]
    model.on_ok(2)
    model.skip_to(6)  # FSNs 3, 4, 5 were deleted
    assert (model.acked_fsn, model.connected, model.fsn_at_zero) == (5, False, 6)
    model.check_invariants()
    model.connect()
    assert [model.next_frame() for _ in range(2)] == [6, 7]
    model.on_ok(1)
    assert model.acked_fsn == 7  # wire seq 1 of the new window is FSN 7
    model.skip_to(10)  # 8 and 9 deleted too: the hole reaches the head
    assert (model.acked_fsn, model.published_fsn) == (9, 9)


def test_fsn_10_skip_to_refuses_what_would_break_fsn_1_or_fsn_3() -> None:
    """FSN-10: not while frames sent are unacknowledged (their wire sequences still map through
    this window), not backwards, not past the head, not while disconnected or halted."""
    model = ForwarderModel()
    model.publish(5)
    with pytest.raises(BadArgument, match="open, unhalted"):
        model.skip_to(3)
    model.connect()
    model.next_frame()
    with pytest.raises(BadArgument, match="not all acknowledged"):
        model.skip_to(3)
    model.on_ok(0)
    for bad in (1, 0, 7):
        with pytest.raises(BadArgument, match="outside the published range"):
            model.skip_to(bad)
    model.on_error(5, 0)  # PARSE_ERROR halts
    with pytest.raises(BadArgument, match="open, unhalted"):
        model.skip_to(3)


# --- FSN-4 --------------------------------------------------------------------------------------


def test_fsn_4_durable_mode_oks_queue_and_durable_acks_trim() -> None:
    """FSN-4: OKs only queue; a durable ack pops the covered run at the queue head."""
    model = ForwarderModel()
    model.publish(4)
    model.connect(durable=True)
    for _ in range(4):
        model.next_frame()
    model.on_ok(0, {"a": 1})
    model.on_ok(1, {})
    model.on_ok(2, {"b": 1})
    model.on_ok(3, {"a": 2, "b": 2})
    assert model.acked_fsn == -1
    model.on_durable_ack({"a": 1})
    assert model.acked_fsn == 1  # entry 0 covered, entry 1 has no tables: covered once reached
    model.on_durable_ack({"a": 5, "b": 1})
    assert model.acked_fsn == 2
    model.on_durable_ack({"a": 0, "b": 0})  # late, reordered: max-merge keeps the watermarks
    assert model.table_watermarks == {"a": 5, "b": 1}
    model.on_durable_ack({"b": 2})
    assert model.acked_fsn == 3
    assert model.pending_durable == []
    model.check_invariants()


def test_fsn_4_reconnect_discards_the_durable_queue() -> None:
    """FSN-4: on reconnect the queue is discarded and trimming restarts on the new mapping."""
    model = ForwarderModel()
    model.publish(2)
    model.connect(durable=True)
    model.next_frame()
    model.on_ok(0, {"a": 1})
    model.disconnect()
    model.connect(durable=True)
    assert model.pending_durable == []
    assert model.next_frame() == 0
    model.on_durable_ack({"a": 1})  # nothing queued on this connection yet
    assert model.acked_fsn == -1


# --- FSN-7 --------------------------------------------------------------------------------------


def test_fsn_7_status_categories() -> None:
    """FSN-7: the status byte table; anything else (0x04, 0x07, 0xFF, ...) is UNKNOWN."""
    table = {3: "SCHEMA_MISMATCH", 5: "PARSE_ERROR", 6: "INTERNAL_ERROR", 8: "SECURITY_ERROR"}
    table[9] = "WRITE_ERROR"
    for status in range(-1, 300):
        assert status_category(status) == table.get(status, "UNKNOWN")


def test_fsn_7_default_policies() -> None:
    """FSN-7: DROP_AND_CONTINUE for SCHEMA_MISMATCH and WRITE_ERROR, HALT otherwise."""
    expected = {
        "SCHEMA_MISMATCH": "DROP_AND_CONTINUE",
        "PARSE_ERROR": "HALT",
        "INTERNAL_ERROR": "HALT",
        "SECURITY_ERROR": "HALT",
        "WRITE_ERROR": "DROP_AND_CONTINUE",
        "PROTOCOL_VIOLATION": "HALT",
        "UNKNOWN": "HALT",
    }
    assert set(expected) == set(CATEGORIES)
    for category, policy in expected.items():
        assert default_policy(category) == policy
        assert effective_policy(category) == policy
    assert default_policy("NO_SUCH_CATEGORY") == "HALT"


def test_fsn_7_overrides_cannot_unforce_halt() -> None:
    """FSN-7: named categories are overridable; UNKNOWN and PROTOCOL_VIOLATION always halt."""
    assert effective_policy("SCHEMA_MISMATCH", {"SCHEMA_MISMATCH": "HALT"}) == "HALT"
    assert effective_policy("PARSE_ERROR", {"PARSE_ERROR": "DROP_AND_CONTINUE"}) == (
        "DROP_AND_CONTINUE"
    )
    assert effective_policy("WRITE_ERROR", {"PARSE_ERROR": "HALT"}) == "DROP_AND_CONTINUE"
    for forced in ("UNKNOWN", "PROTOCOL_VIOLATION"):
        assert effective_policy(forced, {forced: "DROP_AND_CONTINUE"}) == "HALT"
    with pytest.raises(BadArgument):
        effective_policy("WRITE_ERROR", {"WRITE_ERROR": "IGNORE"})


def test_fsn_7_drop_and_continue_non_durable() -> None:
    """FSN-7: DROP_AND_CONTINUE acks the rejected frame like an OK and keeps sending."""
    model = ForwarderModel()
    model.publish(4)
    model.connect()
    for _ in range(3):
        model.next_frame()
    model.on_ok(0)
    model.on_error(3, 1)  # SCHEMA_MISMATCH on FSN 1
    assert model.acked_fsn == 1
    assert model.halted is None
    assert model.next_frame() == 3


def test_fsn_7_drop_and_continue_durable_waits_for_earlier_entries() -> None:
    """FSN-7, FSN-4: in durable mode a dropped frame is a trivially covered queue entry, popped
    only once the entries before it are covered."""
    model = ForwarderModel()
    model.publish(3)
    model.connect(durable=True)
    for _ in range(3):
        model.next_frame()
    model.on_ok(0, {"a": 4})
    model.on_error(9, 1)  # WRITE_ERROR on FSN 1
    assert model.acked_fsn == -1
    model.on_durable_ack({"a": 4})
    assert model.acked_fsn == 1
    model.on_error(9, 2)  # queue empty now: the drop advances at once
    assert model.acked_fsn == 2


def test_fsn_7_halt_latches_and_stops_sending() -> None:
    """FSN-7: HALT latches a terminal error, stops sending and ignores further frames."""
    model = ForwarderModel()
    model.publish(5)
    model.connect()
    for _ in range(3):
        model.next_frame()
    model.on_ok(0)
    model.on_error(5, 1)  # PARSE_ERROR
    assert model.halted is not None
    assert (model.halted.category, model.halted.status, model.halted.sequence) == (
        "PARSE_ERROR",
        5,
        1,
    )
    assert (model.halted.first_fsn, model.halted.last_fsn) == (1, 4)
    assert model.next_frame() is None
    model.on_ok(2)
    assert model.acked_fsn == 0
    model.check_invariants()
    model.disconnect()
    with pytest.raises(BadArgument):
        model.connect()
    model.restart([(0, 5)], 0)  # a new process may resume
    assert model.halted is None


def test_fsn_7_unknown_status_halts_even_with_override() -> None:
    """FSN-7: an UNKNOWN status byte halts whatever the overrides say."""
    model = ForwarderModel()
    model.publish(1)
    model.connect()
    model.next_frame()
    model.on_error(0xFF, 0, {"UNKNOWN": "DROP_AND_CONTINUE"})
    assert model.halted is not None and model.halted.category == "UNKNOWN"


# --- FSN-8 --------------------------------------------------------------------------------------


def test_fsn_8_close_codes() -> None:
    """FSN-8: 1002, 1003, 1007, 1008, 1009, 1010 are terminal; everything else reconnects."""
    terminal = {1002, 1003, 1007, 1008, 1009, 1010}
    for code in range(0, 5000):
        assert close_code_is_terminal(code) == (code in terminal)


@pytest.mark.parametrize("code", [1000, 1001, 1006, 1011, 4000, 1002, 1010])
def test_fsn_8_model_close(code: int) -> None:
    """FSN-8: a terminal close halts as PROTOCOL_VIOLATION over the unacked window; any other
    close only disconnects."""
    model = ForwarderModel()
    model.publish(3)
    model.connect()
    model.next_frame()
    model.on_ok(0)
    model.on_close(code)
    assert not model.connected
    if code in (1002, 1010):
        assert model.halted is not None
        assert model.halted[:3] == ("PROTOCOL_VIOLATION", -1, -1)
        assert (model.halted.first_fsn, model.halted.last_fsn) == model.unacked_span() == (1, 2)
    else:
        assert model.halted is None
        model.connect()
        assert model.next_frame() == 1


# --- FSN-9 --------------------------------------------------------------------------------------


def test_fsn_9_backoff_window_attempts_0_to_20() -> None:
    """FSN-9: equal jitter [d, 2d) with d = min(initial * 2**n, max)."""
    for attempt in range(21):
        d = min(100 * 2**attempt, 5000)
        assert backoff_window(attempt, 100, 5000) == (d, 2 * d)
    assert backoff_window(0, 100, 5000) == (100, 200)
    assert backoff_window(5, 100, 5000) == (3200, 6400)
    assert backoff_window(6, 100, 5000) == (5000, 10000)
    assert backoff_window(10**9, 100, 5000) == (5000, 10000)  # no huge powers computed


def test_fsn_9_backoff_sleep_bounds() -> None:
    """FSN-9: every draw in [0, 1) sleeps within [d, 2d); the budget clamps and then gives up."""
    below_one = math.nextafter(1.0, 0.0)
    budget = 10**9
    initial, cap = DEFAULT_INITIAL_BACKOFF_MS, DEFAULT_MAX_BACKOFF_MS
    for attempt in range(21):
        low, high = backoff_window(attempt, initial, cap)
        for unit in (0.0, 0.25, 0.5, 0.999, below_one):
            sleep = backoff_sleep(attempt, initial, cap, budget, unit)
            assert sleep is not None and low <= sleep < high
        assert backoff_sleep(attempt, initial, cap, budget, 0.0) == low
        assert backoff_sleep(attempt, initial, cap, budget, below_one) == high - 1
    assert backoff_sleep(0, 1, 1, budget, below_one) == 1  # a one-millisecond window


def test_fsn_9_backoff_budget_clamp_and_give_up() -> None:
    """FSN-9: a sleep never overshoots the outage budget; a spent budget gives up."""
    assert backoff_sleep(3, 100, 5000, 50, 0.5) == 50
    assert backoff_sleep(3, 100, 5000, 1, 0.0) == 1
    assert backoff_sleep(3, 100, 5000, 0, 0.5) is None
    assert backoff_sleep(3, 100, 5000, -7, 0.5) is None


def test_fsn_9_outage_loop_spends_the_budget_exactly() -> None:
    """FSN-9: sleeping what backoff_sleep says exhausts a budget exactly, then gives up."""
    rng = random.Random(9)
    budget, spent, attempt = 60_000, 0, 0
    while (sleep := backoff_sleep(attempt, 100, 5000, budget - spent, rng.random())) is not None:
        spent += sleep
        attempt += 1
    assert spent == budget
    model = ForwarderModel()
    model.give_up()
    assert model.halted is not None and model.halted.category == "PROTOCOL_VIOLATION"


@pytest.mark.parametrize(
    "args",
    [(-1, 100, 5000, 10, 0.5), (0, 0, 5000, 10, 0.5), (0, 200, 100, 10, 0.5)]
    + [(0, 100, 5000, 10, u) for u in (1.0, -0.1, math.nan, math.inf)],
)
def test_fsn_9_backoff_rejects_bad_arguments(args: tuple[int, int, int, int, float]) -> None:
    """FSN-9: nonsense configuration or draws are refused, not silently used."""
    with pytest.raises(BadArgument):
        backoff_sleep(*args)


# --- invariant checks ---------------------------------------------------------------------------


def test_fsn_3_invariant_checks_catch_broken_state() -> None:
    """FSN-3, FSN-1, FSN-6: the model's invariant checks fail loudly on impossible states."""
    model = ForwarderModel()
    model.publish(2)
    model.acked_fsn = 5
    with pytest.raises(AssertionError, match="FSN-3"):
        model.FSN_3()
    model = ForwarderModel()
    model.publish(2)
    model.connect()
    model.next_wire_seq = 7
    with pytest.raises(AssertionError, match="FSN-1"):
        model.FSN_1()
    model = ForwarderModel()
    model.publish(2)
    model.connect()
    model.fsn_at_zero = 1
    with pytest.raises(AssertionError, match="FSN-6"):
        model.FSN_6()


# --- the state machine --------------------------------------------------------------------------

TABLES = ("a", "b")
TABLE_SETS: tuple[tuple[str, ...], ...] = ((), ("a",), ("b",), ("a", "b"))
SEGMENT_FRAMES = 3
TICKS = ("none", "none", "persist", "trim", "both")
#: How a send step leaves the connection: mostly open; else a failure or a close code.
ENDINGS: tuple[str | int, ...] = ("open",) * 12 + ("failure", 1000, 1006, 1011, 4001, 1002, 1008)
STATUSES = (3, 3, 3, 9, 9, 9, 5, 6, 8, 4, 0xFF)
OVERRIDES: tuple[dict[str, str] | None, ...] = (
    None,
    {"SCHEMA_MISMATCH": "HALT"},
    {"PARSE_ERROR": "DROP_AND_CONTINUE", "INTERNAL_ERROR": "DROP_AND_CONTINUE"},
    {"UNKNOWN": "DROP_AND_CONTINUE"},
)


def tables_of(fsn: int) -> tuple[str, ...]:
    """Which tables a frame writes (deterministic, so replays write the same tables)."""
    return TABLE_SETS[fsn % len(TABLE_SETS)]


@dataclass
class Connection:
    """The receiver's view of one connection."""

    first_fsn: int  # what FSN-6 says the first frame must be
    durable: bool
    sent: int = 0  # frames the forwarder handed to the wire
    received: list[int] = field(default_factory=list)  # FSN by wire sequence
    responded: int = 0  # frames answered with OK or error, in order


class ForwarderMachine(RuleBasedStateMachine):
    """FSN-1..FSN-10: drive ForwarderModel against a simulated receiver and slot directory.

    Checked after every step: ackedFsn never exceeds what the receiver received and confirmed
    and never decreases within a process (FSN-3); each connection sends ackedFsn+1, +2, ... in
    order (FSN-1, FSN-6); durable-mode OKs never trim (FSN-4); recovery (FSN-5); drop moves past
    the rejected frame and halt stops sending (FSN-7); close codes (FSN-8); giving up (FSN-9).
    Few, composite rules: a long chain (publish, connect, send, deliver, answer) must fit in 40
    steps, and every rule that ends a connection makes that chain rarer.
    """

    def __init__(self) -> None:
        super().__init__()
        self.model = ForwarderModel()
        self.overrides: dict[str, str] | None = None
        self.conn: Connection | None = None
        self.in_flight: list[int] = []  # sent, not yet received; lost on disconnect
        # receiver, server-wide
        self.seq_txn = dict.fromkeys(TABLES, 0)  # last seqTxn assigned per table
        self.durable = dict.fromkeys(TABLES, 0)  # seqTxn durable per table
        self.snapshots: list[dict[str, int]] = [{}]  # durable watermarks it may (re)send
        self.max_sent = dict.fromkeys(TABLES, 0)  # per table, highest watermark ever sent
        # FSN -> how the receiver confirmed it: None (dropped) or its seqTxns and whether the
        # connection was in durable mode; survives restarts (it is the receiver's memory)
        self.confirmations: dict[int, list[tuple[bool, dict[str, int]] | None]] = {}
        self.confirmed_upto = -1  # every FSN <= this is confirmed
        self.highest_received = -1
        self.prev_acked = -1
        # slot directory
        self.disk_low = 0  # base of the lowest surviving segment
        self.stored_watermark: int | None = None

    @initialize(overrides=st.sampled_from(OVERRIDES), n=st.integers(0, 6))
    def start(self, overrides: dict[str, str] | None, n: int) -> None:
        self.overrides = overrides
        self.model.publish(n)

    # producer and connection

    def _publish(self, n: int) -> None:
        before = self.model.published_fsn
        assert self.model.publish(n) == list(range(before + 1, before + 1 + n))

    @precondition(lambda self: not self.model.connected and self.model.halted is None)
    @rule(
        durable=st.booleans(),
        outcome=st.sampled_from(["connected"] * 7 + ["budget spent"]),
        published_offline=st.integers(0, 3),
    )
    def connect(self, durable: bool, outcome: str, published_offline: int) -> None:
        """FSN-6: the first frame of every connection is ackedFsn + 1. FSN-9: a reconnect loop
        that spends its budget gives up, terminally. The producer keeps appending offline."""
        self._publish(published_offline)
        if outcome == "budget spent":
            self.model.give_up()
            assert self.model.halted is not None
            assert self.model.halted.category == "PROTOCOL_VIOLATION"
            return
        self.model.connect(durable)
        assert self.model.fsn_at_zero == self.model.acked_fsn + 1
        self.conn = Connection(self.model.acked_fsn + 1, durable)
        self.in_flight = []

    def _end_connection(self, ending: str | int) -> None:
        """FSN-8: terminal close codes halt, the others (and plain failures) only disconnect."""
        was_halted = self.model.halted is not None
        if ending == "failure":
            self.model.disconnect()
        else:
            assert isinstance(ending, int)
            self.model.on_close(ending)
        self.conn, self.in_flight = None, []
        assert not self.model.connected
        assert (self.model.halted is not None) == (was_halted or ending in (1002, 1008))

    # the wire

    @precondition(lambda self: self.model.connected)
    @rule(
        published=st.integers(0, 3),
        k=st.integers(1, 4),
        delivered=st.integers(0, 5),
        tick=st.sampled_from(TICKS),
        ending=st.sampled_from(ENDINGS),
    )
    def send(self, published: int, k: int, delivered: int, tick: str, ending: str | int) -> None:
        """FSN-1, FSN-6, FSN-7: frames go out as ackedAtConnect+1, +2, ... and never after a
        halt; the receiver then gets the oldest ``delivered`` frames still in flight. Then,
        maybe, the connection ends (FSN-8)."""
        assert self.conn is not None
        self._publish(published)
        if self.model.halted is not None:
            assert self.model.next_frame() is None, "FSN-7: sent after a halt"
        for _ in range(k):
            fsn = self.model.next_frame()
            if fsn is None:
                break
            assert fsn == self.conn.first_fsn + self.conn.sent, "FSN-1: out of order"
            assert fsn <= self.model.published_fsn
            self.conn.sent += 1
            self.in_flight.append(fsn)
        arrived, self.in_flight = self.in_flight[:delivered], self.in_flight[delivered:]
        self.conn.received.extend(arrived)
        self.highest_received = max(self.highest_received, *arrived, -1)
        self._manager_tick(tick)
        if ending != "open":
            self._end_connection(ending)

    def _unanswered(self) -> int:
        assert self.conn is not None
        return len(self.conn.received) - self.conn.responded

    def _process(self, fsn: int, durable: bool) -> dict[str, int]:
        """The receiver commits a frame: new seqTxns for the tables it writes."""
        txns: dict[str, int] = {}
        for table in tables_of(fsn):
            self.seq_txn[table] += 1
            txns[table] = self.seq_txn[table]
        self.confirmations.setdefault(fsn, []).append((durable, txns))
        return txns

    def _answer(self, count: int) -> tuple[int, dict[str, int]]:
        """Commit the next ``count`` frames; the OK's sequence and per-table max seqTxns."""
        assert self.conn is not None
        tables: dict[str, int] = {}
        for wire_seq in range(self.conn.responded, self.conn.responded + count):
            txns = self._process(self.conn.received[wire_seq], self.conn.durable)
            for table, txn in txns.items():
                tables[table] = max(tables.get(table, 0), txn)
        self.conn.responded += count
        return self.conn.responded - 1, tables

    @precondition(lambda self: self.conn is not None and self._unanswered() > 0)
    @rule(k=st.integers(1, 3), ahead=st.sampled_from([0] * 5 + [1, 7]))
    def ok(self, k: int, ahead: int) -> None:
        """FSN-2, FSN-4: an in-order (possibly cumulative) OK. In durable mode an OK carrying
        tables never trims by itself; an empty OK drains only once everything queued before it
        is covered. With ``ahead`` and nothing in flight, a malicious OK for wire sequences
        never sent."""
        before = self.model.acked_fsn
        queued_uncovered = [
            entry
            for entry in self.model.pending_durable
            if any(self.model.table_watermarks.get(t, -1) < x for t, x in entry[1].items())
        ]
        if ahead and not self.in_flight:
            sequence, tables = self._answer(self._unanswered())
        else:
            ahead = 0
            sequence, tables = self._answer(min(k, self._unanswered()))
        self.model.on_ok(sequence + ahead, tables)
        if self.model.durable_mode and (tables or queued_uncovered):
            covered = all(self.model.table_watermarks.get(t, -1) >= x for t, x in tables.items())
            if not covered or queued_uncovered:
                assert self.model.acked_fsn == before, "FSN-4: an uncovered OK moved ackedFsn"

    @precondition(lambda self: self.conn is not None and self._unanswered() > 0)
    @rule(status=st.sampled_from(STATUSES))
    def error(self, status: int) -> None:
        """FSN-7: DROP_AND_CONTINUE moves past the rejected frame; HALT stops sending."""
        assert self.conn is not None
        wire_seq = self.conn.responded
        fsn = self.conn.received[wire_seq]
        self.conn.responded += 1
        policy = effective_policy(status_category(status), self.overrides)
        if policy == "DROP_AND_CONTINUE" and self.model.halted is None:
            self.confirmations.setdefault(fsn, []).append(None)
        self.model.on_error(status, wire_seq, self.overrides)
        if self.model.halted is not None:
            assert self.model.next_frame() is None, "FSN-7: halted but still sending"
            return
        assert policy == "DROP_AND_CONTINUE"
        if not self.model.durable_mode:
            assert self.model.acked_fsn >= fsn
        else:
            queued = [w for w, _ in self.model.pending_durable]
            assert self.model.acked_fsn >= fsn or queued[-1] == wire_seq
            self._assert_drained()

    def _assert_drained(self) -> None:
        """FSN-4: after the drain loop ran, the queue head is not covered."""
        if self.model.pending_durable:
            head = self.model.pending_durable[0][1]
            marks = self.model.table_watermarks
            assert not all(t in marks and marks[t] >= txn for t, txn in head.items())

    @precondition(lambda self: self.conn is not None and self.conn.durable)
    @rule(
        lag=st.sampled_from(TABLES), amount=st.sampled_from([0, 1, 2, 99]), stale=st.integers(0, 3)
    )
    def durable_ack(self, lag: str, amount: int, stale: int) -> None:
        """FSN-4: the server makes more data durable (table ``lag`` one step behind), then
        sends a durable ack that may be late or reordered (an earlier snapshot)."""
        for table in TABLES:
            step = max(amount - 1, 0) if table == lag else amount
            self.durable[table] = min(self.seq_txn[table], self.durable[table] + step)
        self.snapshots.append(dict(self.durable))
        before = self.model.acked_fsn
        snapshot = self.snapshots[-1 - min(stale, len(self.snapshots) - 1)]
        for name, txn in snapshot.items():
            self.max_sent[name] = max(self.max_sent[name], txn)
        self.model.on_durable_ack(snapshot)
        assert self.model.acked_fsn >= before
        if self.model.halted is None:
            self._assert_drained()

    def _all_sent_acked(self) -> bool:
        m = self.model
        return (
            m.connected
            and m.halted is None
            and m.acked_fsn == m.fsn_at_zero + m.next_wire_seq - 1
            and m.published_fsn > m.acked_fsn
        )

    @precondition(lambda self: self._all_sent_acked())
    @rule(size=st.integers(1, 3))
    def hole(self, size: int) -> None:
        """FSN-10: FSNs that will never exist (a topic source's deleted records) are skipped
        only once everything sent is acknowledged, by ending the connection; the next one
        starts right after the hole, and nothing that exists is skipped."""
        m = self.model
        first = m.acked_fsn + 1
        nxt = min(first + size, m.published_fsn + 1)
        for fsn in range(first, nxt):
            self.confirmations.setdefault(fsn, []).append(None)  # known never to exist
        self.highest_received = max(self.highest_received, nxt - 1)
        m.skip_to(nxt)
        assert (m.acked_fsn, m.connected) == (nxt - 1, False)
        assert (m.fsn_at_zero, m.next_wire_seq) == (nxt, 0)
        self.conn, self.in_flight = None, []

    # the slot directory and restarts

    def _manager_tick(self, tick: str) -> None:
        """Persist the watermark and/or delete fully acknowledged segments (never the last);
        a crash may fall between the two, in either order."""
        if tick in ("persist", "both"):
            self.stored_watermark = self.model.acked_fsn
        while (
            tick in ("trim", "both")
            and self.disk_low + SEGMENT_FRAMES - 1 <= self.model.acked_fsn
            and self.disk_low + SEGMENT_FRAMES <= self.model.published_fsn
        ):
            self.disk_low += SEGMENT_FRAMES

    def _segments(self, empty_tail: bool) -> list[tuple[int, int]]:
        published = self.model.published_fsn
        segments = [
            (base, min(SEGMENT_FRAMES, published + 1 - base))
            for base in range(self.disk_low, published + 1, SEGMENT_FRAMES)
        ]
        if empty_tail and segments and (published + 1) % SEGMENT_FRAMES == 0:
            segments.append((published + 1, 0))  # a rotated-in, still empty, active segment
        return segments

    @precondition(lambda self: not self.model.connected)
    @rule(
        watermark_mode=st.sampled_from(["stored", "absent", "above", "drained"]),
        empty_tail=st.booleans(),
        shuffle_seed=st.integers(0, 100),
    )
    def restart(self, watermark_mode: str, empty_tail: bool, shuffle_seed: int) -> None:
        """FSN-5: a new process recovers (acked, published) from the segments and watermark.
        (A crash while connected is a connection end followed by this.)"""
        if watermark_mode == "drained" and self.model.acked_fsn == self.model.published_fsn:
            self._drained_restart()
            return
        published = self.model.published_fsn
        segments = self._segments(empty_tail)
        random.Random(shuffle_seed).shuffle(segments)
        watermark = {
            "stored": self.stored_watermark,
            "above": published + 1 + shuffle_seed,
        }.get(watermark_mode)
        expected = -1 if not segments else self.disk_low - 1
        if segments and watermark is not None and watermark <= published:
            expected = max(expected, watermark)
        self.model.restart(segments, watermark)
        assert self.model.published_fsn == (published if segments else -1)
        assert self.model.acked_fsn == expected
        self.conn, self.in_flight = None, []
        self.prev_acked = self.model.acked_fsn

    def _drained_restart(self) -> None:
        """FSN-5: a fully drained slot was unlinked on shutdown: a fresh start at -1."""
        self.model.restart([], self.stored_watermark)
        assert (self.model.acked_fsn, self.model.published_fsn) == (-1, -1)
        # FSNs start over, so the receiver's per-FSN memory starts over too.
        self.conn, self.in_flight = None, []
        self.confirmations, self.confirmed_upto, self.highest_received = {}, -1, -1
        self.disk_low, self.stored_watermark, self.prev_acked = 0, None, -1

    # invariants after every step

    def _confirmed(self, fsn: int) -> bool:
        for record in self.confirmations.get(fsn, []):
            if record is None:
                return True
            durable, txns = record
            if not durable or all(txn <= self.max_sent[t] for t, txn in txns.items()):
                return True
        return False

    @invariant()
    def model_invariants(self) -> None:
        """FSN-1, FSN-2, FSN-3, FSN-4, FSN-6, FSN-7 as checked from the model's state."""
        self.model.check_invariants()

    @invariant()
    def acked_only_what_the_receiver_confirmed(self) -> None:
        """FSN-3: ackedFsn never exceeds what the receiver received and confirmed, and never
        decreases while the process lives."""
        acked = self.model.acked_fsn
        assert -1 <= acked <= self.model.published_fsn
        assert acked <= self.highest_received, "FSN-3: acked a frame never received"
        while self._confirmed(self.confirmed_upto + 1):
            self.confirmed_upto += 1
        assert acked <= self.confirmed_upto, f"acked {acked} > confirmed {self.confirmed_upto}"
        assert acked >= self.prev_acked, "FSN-3: ackedFsn decreased"
        self.prev_acked = acked


ForwarderMachine.TestCase.settings = settings(
    max_examples=200,
    stateful_step_count=40,
    deadline=None,
    suppress_health_check=[HealthCheck.filter_too_much, HealthCheck.too_slow],
)
TestFsnForwarderStateMachine = ForwarderMachine.TestCase
