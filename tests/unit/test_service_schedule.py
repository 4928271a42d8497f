"""The service's priority scheduler and pressure governor (spec/SERVICE.md section 7,
SVC-36..SVC-46), driven by a fake clock with exact outcomes: ``service/schedule.py`` is pure, so
every test here is a sequence of calls and the values they return."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tidelog import FakeClock
from tidelog.errors import BadArgument, BadOption
from tidelog.service.schedule import (
    COALESCE_MAX_MS,
    WEIGHTS,
    Admission,
    Delivery,
    Governor,
    Scheduler,
    band,
    busy_term,
    coalesce_ms,
    effective_priority,
    parse_priority_rule,
)

T0 = 1_000_000
BUSY = [None, 0.0, 0.5, 0.7, 0.85, 0.95, 1.0]  # the loop's busy shares the tests feed SVC-41


def names(deliveries: list[Delivery]) -> list[str]:
    return [d.name for d in deliveries]


def drive(gov: Governor, clock: FakeClock, pending: int, samples: int = 1) -> list[str | None]:
    """Take ``samples`` samples, one per 100 ms, each seeing ``pending`` ready topics."""
    out = []
    for _ in range(samples):
        clock.advance(gov.next_sample_ms())
        out.append(gov.tick(pending))
    return out


# -- SVC-36 priorities -------------------------------------------------------------------------


def test_SVC_36_priority_default_rules_in_order_put_and_clear() -> None:
    s = Scheduler(FakeClock(T0), [("log-*", -5), ("log-audit", 900), ("*-hot", 700)])
    assert s.priority("metrics") == 0
    assert s.priority("log-audit") == -5  # the first matching rule wins, in the order given
    assert s.priority("cpu-hot") == 700
    assert s.priority("Log-x") == 0  # fnmatchcase: case matters
    s.set_priority("log-audit", 900)
    assert s.priority("log-audit") == 900
    s.clear_priority("log-audit")  # the topic was dropped: the rules decide again
    assert s.priority("log-audit") == -5


def test_SVC_36_priority_range_and_type_checked() -> None:
    """Outside -1000..1000 or not an int: bad_argument from PUT, bad_option from --priority."""
    s = Scheduler(FakeClock(T0))
    for p in (-1000, 1000, 0):
        s.set_priority("t", p)
        assert s.priority("t") == p
    for bad in (1001, -1001, True, 1.0, "5", None):
        with pytest.raises(BadArgument, match="SVC-36"):
            s.set_priority("t", bad)  # type: ignore[arg-type]
    assert s.priority("t") == 0  # a refused PUT changed nothing
    assert parse_priority_rule("log-*=-5") == ("log-*", -5)
    assert parse_priority_rule("*= 1000") == ("*", 1000)
    for bad_rule in ("log-*", "=5", "a=b", "a=1001", "a=-1001", "a=1.5"):
        with pytest.raises(BadOption, match="SVC-36"):
            parse_priority_rule(bad_rule)
    with pytest.raises(BadOption, match="1001"):
        Scheduler(FakeClock(T0), [("a", 1001)])


# -- SVC-37 the ready set ----------------------------------------------------------------------


def test_SVC_37_ready_once_keeps_first_enqueued_at_and_leaves_on_delivery() -> None:
    clock = FakeClock(T0)
    s = Scheduler(clock)
    assert s.mark_ready("a") is True
    clock.advance(7)
    assert s.mark_ready("a") is False  # a burst is one delivery
    assert s.enqueued_at("a") == T0
    assert s.ready_count() == 1
    assert s.round() == [Delivery("a", 7)]
    assert s.ready_count() == 0 and s.enqueued_at("a") is None
    assert s.round() == []
    clock.advance(3)
    assert s.mark_ready("a") is True  # enters again on the next op, with a new enqueued_at
    assert s.enqueued_at("a") == T0 + 10
    s.forget("a")  # lost its streams
    s.forget("a")
    assert s.ready_count() == 0 and s.round() == [] and s.next_wake_ms() is None


# -- SVC-38 bands and aging --------------------------------------------------------------------


def test_SVC_38_aging_and_band_arithmetic() -> None:
    assert [effective_priority(0, w) for w in (0, 9, 10, 999, 2500, 10_000, 3_600_000)] == [
        0,
        0,
        1,
        99,
        250,
        1000,
        1000,
    ]
    assert effective_priority(-1000, 3_600_000) == 0  # aging stops at +1000
    assert [band(p) for p in (2000, 750, 749, 500, 499, 250, 249, 0, -1, -2000)] == [
        4,
        4,
        3,
        3,
        2,
        2,
        1,
        1,
        0,
        0,
    ]
    # P >= -250 reaches B4 after 10 s of waiting; -251 does not, ever
    assert band(effective_priority(-250, 10_000)) == 4
    assert band(effective_priority(-251, 10**9)) == 3


def test_SVC_38_a_waiting_topic_climbs_bands_in_rounds() -> None:
    """A P=0 topic that waited 5 s (P_eff 500, B3) goes before a fresh P=499 one (B2), and a
    fresh P=750 one (B4) before both."""
    clock = FakeClock(T0)
    s = Scheduler(clock, [("hi", 750), ("mid", 499)])
    s.mark_ready("old")
    clock.advance(5000)
    s.mark_ready("mid")
    s.mark_ready("hi")
    assert names(s.round()) == ["hi", "old", "mid"]


# -- SVC-39 rounds -----------------------------------------------------------------------------


def test_SVC_39_weights_per_round_b4_down_oldest_first() -> None:
    """Ten topics in every band: a round delivers 8, 4, 2, 1, 1 of them, from B4 down, each band
    oldest first; the next round goes on where it stopped; every band moves every round."""
    clock = FakeClock(T0)
    prio = {4: 800, 3: 600, 2: 300, 1: 100, 0: -100}
    s = Scheduler(clock, [(f"b{b}-*", p) for b, p in prio.items()])
    for i in range(10):
        for b in (0, 1, 2, 3, 4):  # interleaved entries: order within a band is entry order
            s.mark_ready(f"b{b}-{i}")
    first = names(s.round())
    assert first == (
        [f"b4-{i}" for i in range(8)]
        + [f"b3-{i}" for i in range(4)]
        + ["b2-0", "b2-1", "b1-0", "b0-0"]
    )
    second = names(s.round())
    assert second == (
        ["b4-8", "b4-9"] + [f"b3-{i}" for i in range(4, 8)] + ["b2-2", "b2-3", "b1-1", "b0-1"]
    )
    assert s.ready_count() == 50 - 16 - 10  # B4 had 2 left for the second round


def test_SVC_39_ties_go_by_entry_order_not_name() -> None:
    """Two topics entering in the same millisecond go in the order they entered. The draft broke
    ties by topic name, which let "a" (entered second) pass "z" in a weight-1 band, so "z" was
    not delivered within R + 1 = 1 eligible rounds (SVC-40)."""
    clock = FakeClock(T0)
    s = Scheduler(clock)
    s.mark_ready("z")
    s.mark_ready("a")
    assert names(s.round()) == ["z"]
    assert names(s.round()) == ["a"]


def test_SVC_39_a_topic_that_comes_back_goes_behind_the_others() -> None:
    clock = FakeClock(T0)
    s = Scheduler(clock)
    s.mark_ready("a")
    s.mark_ready("b")
    assert names(s.round()) == ["a"]
    s.mark_ready("a")  # ready again during b's wait: behind b
    assert names(s.round()) == ["b"]
    assert names(s.round()) == ["a"]


# -- SVC-40 the wait bound ---------------------------------------------------------------------

TOPICS = [f"t{i}" for i in range(8)]
PRIOS = st.one_of(
    st.sampled_from([-1000, -251, -250, -1, 0, 249, 250, 499, 500, 749, 750, 1000]),
    st.integers(-1000, 1000),
)
OPS = st.lists(
    st.one_of(
        st.tuples(st.just("ready"), st.sampled_from(TOPICS)),
        st.tuples(st.just("ready"), st.sampled_from(TOPICS)),
        st.tuples(st.just("round"), st.none()),
        st.tuples(st.just("round"), st.none()),
        st.tuples(st.just("advance"), st.sampled_from([0, 1, 5, 19, 20, 100, 2500, 10_000])),
        st.tuples(st.just("prio"), st.tuples(st.sampled_from(TOPICS), PRIOS)),
        st.tuples(st.just("forget"), st.sampled_from(TOPICS)),
        st.tuples(
            st.just("govern"),
            st.tuples(st.sampled_from([0.0, 0.2, 0.21, 0.3, 0.55, 0.8, 1.0]), st.booleans()),
        ),
    ),
    max_size=120,
)


@dataclass
class Waiting:
    others: int  # R: the topics in the ready set when it entered
    enqueued_at: int
    eligible_rounds: int = 0


@dataclass
class Oracle:
    """SVC-37..SVC-43 restated for checking: which topics are ready, since when, how many
    others were ready when each entered, and in how many rounds each was eligible."""

    clock: FakeClock
    prio: dict[str, int] = field(default_factory=dict)
    ready: dict[str, Waiting] = field(default_factory=dict)
    pressure: float = 0.0
    deferring: bool = False
    delivered: int = 0

    def eligible(self, name: str, now: int) -> bool:
        w = self.ready[name]
        held = self.deferring and self.prio.get(name, 0) < 0
        wait = coalesce_ms(self.pressure, self.prio.get(name, 0))  # none from priority 750
        return not held and now - w.enqueued_at >= wait

    def step(self, s: Scheduler, op: str, arg: object) -> None:
        now = self.clock.now_ms()
        if op == "ready":
            assert isinstance(arg, str)
            entered = s.mark_ready(arg)
            assert entered == (arg not in self.ready)
            if entered:
                self.ready[arg] = Waiting(len(self.ready), now)
        elif op == "advance":
            assert isinstance(arg, int)
            self.clock.advance(arg)
        elif op == "prio":
            assert isinstance(arg, tuple)
            s.set_priority(*arg)
            self.prio[arg[0]] = arg[1]
        elif op == "forget":
            assert isinstance(arg, str)
            s.forget(arg)
            self.ready.pop(arg, None)
        elif op == "govern":
            assert isinstance(arg, tuple)
            self.pressure, self.deferring = arg
            s.update(*arg)
        else:
            self.check_round(s, now)

    def check_round(self, s: Scheduler, now: int) -> None:
        eligible = {n for n in self.ready if self.eligible(n, now)}
        out = names(s.round())
        assert len(out) == len(set(out)) <= 16
        assert set(out) <= eligible  # SVC-42, SVC-43: only eligible topics are delivered
        bands = {
            n: band(effective_priority(self.prio.get(n, 0), now - w.enqueued_at))
            for n, w in self.ready.items()
            if n in eligible
        }
        # SVC-39: B4 first, and each band delivers as many as its weight allows
        assert [bands[n] for n in out] == sorted((bands[n] for n in out), reverse=True)
        for b in range(5):
            in_band = sum(1 for n in eligible if bands[n] == b)
            assert sum(1 for n in out if bands[n] == b) == min(WEIGHTS[b], in_band)
        for n in eligible:
            self.ready[n].eligible_rounds += 1
        for n in out:
            w = self.ready.pop(n)
            assert w.eligible_rounds <= w.others + 1, (n, w)
        for n in eligible - set(out):
            w = self.ready[n]
            assert w.eligible_rounds < w.others + 1, (n, w)  # SVC-40
        self.delivered += len(out)


@settings(max_examples=400, deadline=None)
@given(OPS)
def test_SVC_40_wait_bound_within_R_plus_1_eligible_rounds(ops: list[tuple[str, object]]) -> None:
    """SVC-40: whatever the arrivals, priorities (changed at any time), pressures and
    deferrals, a topic that entered with R others ready is delivered in at most R + 1 of the
    rounds it was eligible for, and only eligible topics are delivered (SVC-42, SVC-43). Checked
    to fail once with rounds that ignore entry order (newest first; ties by name)."""
    clock = FakeClock(T0)
    s = Scheduler(clock)
    oracle = Oracle(clock)
    for op, arg in ops:
        oracle.step(s, op, arg)


@settings(max_examples=200, deadline=None)
@given(OPS)
def test_SVC_46_every_entry_delivered_once_however_long_deferred(
    ops: list[tuple[str, object]],
) -> None:
    """SVC-46: after any history, once deferral ends and pressure drops, rounds deliver every
    topic still in the ready set exactly once, and nothing else (nothing dropped, nothing
    doubled); the wait bound holds throughout (SVC-40)."""
    clock = FakeClock(T0)
    s = Scheduler(clock)
    oracle = Oracle(clock)
    for op, arg in ops:
        oracle.step(s, op, arg)
    left = set(oracle.ready)
    oracle.step(s, "govern", (1.0, False))
    clock.advance(COALESCE_MAX_MS)  # eligible at any pressure
    seen: list[str] = []
    while s.ready_count():
        before = oracle.delivered
        oracle.step(s, "round", None)
        assert oracle.delivered > before
        seen += [n for n in left if n not in oracle.ready and n not in seen]
    assert sorted(seen) == sorted(left)
    assert s.next_wake_ms() is None


# -- SVC-43 coalescing -------------------------------------------------------------------------


def test_SVC_43_coalescing_wait_values() -> None:
    assert [coalesce_ms(p) for p in (0.0, 0.1, 0.2, 0.21, 0.24, 0.6, 0.95, 1.0)] == [
        0,
        0,
        0,
        1,
        1,
        10,
        19,
        20,
    ]


@given(st.floats(0.0, 1.0))
def test_SVC_43_coalescing_bounded_by_20_ms(p: float) -> None:
    """At any pressure the wait is in 0..20 ms, is the rule's ceiling, and a topic ready for 20
    ms is eligible; next_wake_ms never asks for more than 20 ms."""
    c = coalesce_ms(p)
    assert 0 <= c <= COALESCE_MAX_MS
    if p > 0.2:
        exact = 20 * (p - 0.2) / 0.8
        assert exact - 1e-9 <= c < exact + 1 + 1e-9
    clock = FakeClock(T0)
    s = Scheduler(clock)
    s.update(p, False)
    s.mark_ready("t")
    wake = s.next_wake_ms()
    assert wake == c
    clock.advance(COALESCE_MAX_MS)
    assert s.next_wake_ms() == 0
    assert names(s.round()) == ["t"]


def test_SVC_43_eligible_only_after_the_wait_next_wake_counts_down() -> None:
    clock = FakeClock(T0)
    s = Scheduler(clock)
    s.update(1.0, False)
    s.mark_ready("a")
    clock.advance(5)
    s.mark_ready("b")
    assert s.next_wake_ms() == 15
    clock.advance(14)
    assert s.round() == [] and s.next_wake_ms() == 1
    clock.advance(1)
    assert s.round() == [Delivery("a", 0)]
    assert s.next_wake_ms() == 5
    s.update(0.2, False)  # pressure fell: b is eligible at once
    assert s.next_wake_ms() == 0
    assert s.round() == [Delivery("b", 15)]


def test_SVC_43_a_clock_stepping_back_stalls_no_topic() -> None:
    """Section 7's now never steps back: time goes on from the last reading, so a topic ready
    before the clock stepped back an hour is eligible 20 ms after it entered, not an hour
    later, and its wait neither stalls nor goes negative (SVC-38, SVC-41)."""
    clock = FakeClock(T0)
    s = Scheduler(clock)
    s.update(1.0, False)
    s.mark_ready("t")
    clock.advance(15)
    assert s.next_wake_ms() == 5
    clock.set(T0 - 3_600_000)
    assert s.next_wake_ms() == 5
    clock.advance(5)
    assert s.next_wake_ms() == 0
    s.update(0.0, False)
    clock.advance(995)
    assert s.round() == [Delivery("t", 1015)]


# -- SVC-42 deferral ---------------------------------------------------------------------------


def test_SVC_42_deferred_topics_skip_rounds_and_come_back_aged() -> None:
    clock = FakeClock(T0)
    s = Scheduler(clock, [("low-*", -300)])
    s.update(0.9, True)
    assert s.is_deferred("low-1") and not s.is_deferred("hi")
    s.mark_ready("low-1")
    s.mark_ready("hi")
    clock.advance(20)
    assert s.pending_count() == 1 and s.deferred_ready() == ["low-1"]
    assert names(s.round()) == ["hi"]
    assert s.round() == [] and s.next_wake_ms() is None  # only deferred topics: nothing to wake
    clock.advance(6000)
    s.update(0.5, False)  # deferral ended: low-1 kept its enqueued_at and aged
    assert s.enqueued_at("low-1") == T0
    s.mark_ready("fresh")
    clock.advance(10)
    # low-1: -300 + 603 = 303 (B2) goes before fresh (B1, 1), though it is ready since the start
    # low-1's SVC-41 wait counts from the end of the deferral (10 ms); fresh's from the end of
    # its coalescing wait at pressure 0.5 (8 ms), so 2 ms
    assert s.round() == [Delivery("low-1", 10), Delivery("fresh", 2)]


def test_SVC_42_priority_crossing_zero_during_deferral_reports_the_change() -> None:
    clock = FakeClock(T0)
    s = Scheduler(clock)
    assert s.set_priority("t", -1) is None  # no deferral on: nothing to say
    s.update(0.0, True)
    s.mark_ready("t")
    assert s.round() == []
    assert s.set_priority("t", -7) is None
    clock.advance(30)
    assert s.set_priority("t", 0) == "resumed"
    clock.advance(4)
    assert s.round() == [Delivery("t", 4)]  # its wait counts from the resume (SVC-41)
    assert s.set_priority("t", -1) == "deferred"
    assert s.clear_priority("t") == "resumed"


def _drive_pressure(gov: Governor, clock: FakeClock, pressures: list[float]) -> list[str | None]:
    """One sample per pressure, made by the ready-set term alone (256 topics = 1.0)."""
    out = []
    for p in pressures:
        pending = round(p * 256)
        assert pending / 256 == p
        out += drive(gov, clock, pending)
        assert gov.pressure == p
    return out


def test_SVC_42_hysteresis_ten_samples_above_and_below() -> None:
    """Deferral starts at the 10th sample in a row above 0.8 and ends at the 10th in a row
    below 0.6; each switch is reported once."""
    clock = FakeClock(T0)
    gov = Governor(clock)
    hi, mid, lo = 208 / 256, 180 / 256, 128 / 256  # 0.8125, 0.703125, 0.5
    events = _drive_pressure(gov, clock, [hi] * 9 + [mid] + [hi] * 9)
    assert set(events) == {None} and not gov.deferring  # 9, broken, 9: never 10 in a row
    events = _drive_pressure(gov, clock, [hi])
    assert events == ["deferred"] and gov.deferring
    events = _drive_pressure(gov, clock, [lo] * 9 + [mid] + [lo] * 9 + [hi, mid])
    assert set(events) == {None} and gov.deferring
    events = _drive_pressure(gov, clock, [lo] * 10)
    assert events == [None] * 9 + ["resumed"] and not gov.deferring


@given(st.lists(st.integers(-12, 12), min_size=1, max_size=300))
def test_SVC_42_no_flapping_around_one_threshold(wiggle: list[int]) -> None:
    """A pressure wandering around 0.8 (0.75..0.85) starts deferral at most once and never ends
    it; around 0.6 (0.55..0.65) it never starts it: switching needs the whole 0.6..0.8 gap."""
    for centre in (205, 154):  # 0.80078, 0.6016 of 256
        clock = FakeClock(T0)
        gov = Governor(clock)
        events = []
        for w in wiggle:
            events += drive(gov, clock, centre + w)
        switches = [e for e in events if e is not None]
        assert switches in ([], ["deferred"])
        if centre == 154:
            assert switches == []


# -- SVC-41 pressure ---------------------------------------------------------------------------


def test_SVC_41_pressure_is_the_largest_term_each_capped() -> None:
    clock = FakeClock(T0)
    gov = Governor(clock, delivery_workers=2, max_inflight_appends=8)  # 128 ready topics = 1.0
    assert gov.next_sample_ms() == 100
    drive(gov, clock, 32)
    assert gov.pressure == 0.25
    for _ in range(3):
        assert gov.begin_append().admission is Admission.ADMITTED
    drive(gov, clock, 32)
    assert gov.pressure == 3 / 8  # the slots' term
    drive(gov, clock, 1000)
    assert gov.pressure == 1.0  # capped
    gov.delivered(100)
    drive(gov, clock, 0)
    assert gov.delay_ms == 20.0 and gov.pressure == 1.0  # 0.2 × 100 = 20 ms, over 5 ms: capped
    drive(gov, clock, 0)
    assert gov.delay_ms == 16.0
    for _ in range(3):
        gov.end_append()
    drive(gov, clock, 0, samples=6)
    assert gov.delay_ms == pytest.approx(16 * 0.8**6)
    assert gov.pressure == pytest.approx(16 * 0.8**6 / 5)


def test_SVC_41_delay_is_the_ewma_of_the_mean_per_sample() -> None:
    clock = FakeClock(T0)
    gov = Governor(clock)
    for d in (1, 2, 6):
        gov.delivered(d)
    drive(gov, clock, 0)
    assert gov.delay_ms == pytest.approx(0.2 * 3)  # mean 3
    gov.delivered(10)
    drive(gov, clock, 0)
    assert gov.delay_ms == pytest.approx(0.8 * 0.6 + 0.2 * 10)
    drive(gov, clock, 0)  # no deliveries: d = 0
    assert gov.delay_ms == pytest.approx(0.8 * (0.8 * 0.6 + 0.2 * 10))
    with pytest.raises(BadArgument):
        gov.delivered(-1)


def test_SVC_41_late_tick_takes_every_due_sample() -> None:
    """Samples fall every 100 ms from the start; a tick 350 ms late takes the 3 due samples
    (the deliveries count in the first), the next is due at +400; after a jump of the clock
    only the last 100 are taken; a clock stepping back does not stop sampling."""
    clock = FakeClock(T0)
    gov = Governor(clock)
    clock.advance(99)
    assert gov.tick(0) is None and gov.delay_ms == 0.0 and gov.next_sample_ms() == 1
    gov.delivered(50)
    clock.advance(251)  # T0 + 350
    gov.tick(256)
    assert gov.delay_ms == pytest.approx(10 * 0.8 * 0.8)  # d = 50 at the first, then 0, 0
    assert gov.pressure == 1.0 and gov.saturated_samples == 3
    assert gov.next_sample_ms() == 50
    clock.advance(50 + 100 * 5000 - 1)  # 5000 samples due at once
    gov.tick(256)
    assert gov.saturated_samples == 3 + 100
    assert gov.next_sample_ms() == 1
    clock.set(T0)  # the clock steps back by 500 s: time goes on from the last reading
    assert gov.next_sample_ms() == 1
    clock.advance(1)
    assert gov.tick(0) is None and gov.saturated_samples == 0


def test_SVC_41_a_deferred_backlog_does_not_restart_the_deferral() -> None:
    """A delivery's wait counted from enqueued_at would make 300 topics deferred for 3 s report
    3 s waits once resumed: the delay term would sit at 1 and deferral start again at once.
    Deferred topics are not counted in the ready term either, or 300 of them would hold it at 1
    and deferral would never end."""
    clock = FakeClock(T0)
    gov = Governor(clock)
    s = Scheduler(clock, [("low-*", -1)])
    drive(gov, clock, 256, samples=10)
    s.update(gov.pressure, gov.deferring)
    assert gov.deferring
    for i in range(300):
        s.mark_ready(f"low-{i}")
    assert s.pending_count() == 0 and s.next_wake_ms() is None
    events = []
    for _ in range(6000):  # 6 s; the load went away; the loop runs rounds while any is due
        clock.advance(1)
        while s.next_wake_ms() == 0:
            for d in s.round():
                gov.delivered(d.delay_ms)
        if gov.next_sample_ms() == 0:
            events.append(gov.tick(s.pending_count()))
            s.update(gov.pressure, gov.deferring)
    assert [e for e in events if e] == ["resumed"]
    assert s.ready_count() == 0 and not gov.deferring


def test_SVC_41_coalescing_does_not_feed_the_pressure() -> None:
    """A topic ready every millisecond, rounds run as soon as one is eligible: a short burst to
    pressure 0.5 decays back below 0.2. Counting the coalescing wait as delay would make the
    pressure rise to 1 and stay there (every round would wait 20 ms, four times the target)."""
    clock = FakeClock(T0)
    gov = Governor(clock)
    s = Scheduler(clock)
    drive(gov, clock, 128)  # 0.5
    s.update(gov.pressure, gov.deferring)
    pressures = []
    for _ in range(2000):
        clock.advance(1)
        s.mark_ready("busy")
        if s.next_wake_ms() == 0:
            for d in s.round():
                gov.delivered(d.delay_ms)
        if gov.next_sample_ms() == 0:
            gov.tick(s.pending_count())
            s.update(gov.pressure, gov.deferring)
            pressures.append(gov.pressure)
    assert pressures[-1] < 0.2 and not gov.deferring


# -- SVC-44 saturation, SVC-45 the override ----------------------------------------------------


def _full(slots: int = 2, workers: int = 5) -> tuple[Governor, FakeClock]:
    clock = FakeClock(T0)
    gov = Governor(clock, delivery_workers=workers, max_inflight_appends=slots)
    for _ in range(slots):
        assert gov.begin_append().admission is Admission.ADMITTED
    return gov, clock


def test_SVC_44_refused_only_at_or_above_0_95_and_only_without_a_slot() -> None:
    """320 ready topics are 1.0 (5 workers): 304 make exactly 0.95, 303 make 0.946875."""
    clock = FakeClock(T0)
    gov = Governor(clock, delivery_workers=5, max_inflight_appends=2)
    drive(gov, clock, 303)
    assert gov.pressure == 0.946875
    assert [gov.begin_append().admission for _ in range(3)] == [
        Admission.ADMITTED,
        Admission.ADMITTED,
        Admission.WAIT,  # no slot, but the last sample was below 0.95
    ]
    drive(gov, clock, 303)
    assert gov.pressure == 1.0  # the slots' term, now that they are full
    assert gov.begin_append().admission is Admission.REFUSED
    gov, clock = _full(slots=4)
    gov.end_append()
    gov.end_append()  # 2 of 4 slots held: pressure from the ready term alone
    drive(gov, clock, 304)
    assert gov.pressure == 0.95
    assert gov.begin_append().admission is Admission.ADMITTED  # a free slot: taken
    assert gov.begin_append().admission is Admission.ADMITTED
    refused = gov.begin_append()
    assert refused.admission is Admission.REFUSED and refused.retry_after_ms == 100
    assert gov.inflight == 4 and gov.waiting == 0  # it holds nothing (SVC-46)


def test_SVC_44_retry_after_grows_100_ms_per_saturated_sample_up_to_5000() -> None:
    gov, clock = _full()
    seq = []
    for _ in range(53):
        drive(gov, clock, 0)  # the full slots alone make pressure 1.0
        seq.append(gov.begin_append().retry_after_ms)
    assert seq == [100 * k for k in range(1, 51)] + [5000] * 3
    gov.end_append()
    gov.end_append()
    drive(gov, clock, 0)  # one sample below 0.95: the count starts again
    assert gov.pressure == 0.0 and gov.saturated_samples == 0
    assert gov.retry_after_ms == 100


def test_SVC_44_waiting_appends_take_freed_slots_in_order() -> None:
    gov, clock = _full(slots=2)
    assert [gov.begin_append().admission for _ in range(3)] == [Admission.WAIT] * 3
    assert gov.end_append() is True  # handed to the oldest waiter: still 2 held
    assert (gov.inflight, gov.waiting) == (2, 2)
    gov.cancel_wait()
    drive(gov, clock, 0)
    assert gov.pressure == 1.0
    # a newcomer finds no slot (the waiter holds it) and is refused at 1.0
    assert gov.begin_append().admission is Admission.REFUSED
    assert gov.end_append() is True
    assert gov.end_append() is False and gov.end_append() is False
    assert (gov.inflight, gov.waiting) == (0, 0)
    with pytest.raises(BadArgument):
        gov.end_append()
    with pytest.raises(BadArgument):
        gov.cancel_wait()
    with pytest.raises(BadOption, match="max-inflight"):
        Governor(clock, max_inflight_appends=0)
    with pytest.raises(BadOption, match="delivery-workers"):
        Governor(clock, delivery_workers=True)


@given(
    st.lists(
        st.one_of(
            st.tuples(st.just("begin"), st.tuples(st.booleans(), st.booleans())),
            st.tuples(st.just("end"), st.none()),
            st.tuples(st.just("tick"), st.tuples(st.integers(0, 400), st.sampled_from(BUSY))),
            st.tuples(st.just("advance"), st.integers(0, 30)),
        ),
        max_size=200,
    )
)
def test_SVC_45_override_never_refused(ops: list[tuple[str, object]]) -> None:
    """SVC-45: whatever the pressure, an append with the override is admitted or waits, never
    refused, nor shed; SVC-44: one without it is refused only when no slot is free and the last
    sample was at least 0.95, or when it is to a topic of priority below 0 while their rate is
    limited; slots are never over-held."""
    clock = FakeClock(T0)
    gov = Governor(clock, max_inflight_appends=3)
    for op, arg in ops:
        if op == "begin":
            assert isinstance(arg, tuple)
            bypass, low = arg
            free = gov.inflight < 3
            limited = gov.low_rate is not None
            r = gov.begin_append(bypass=bypass, low=low)
            refused = r.admission is Admission.REFUSED
            saturated = not bypass and not free and gov.pressure >= 0.95
            if bypass or not low or not limited:
                assert refused == saturated
            else:
                assert refused or not saturated
            if not refused:
                assert (r.admission is Admission.ADMITTED) == free
        elif op == "end" and gov.inflight:
            gov.end_append()
        elif op == "tick":
            assert isinstance(arg, tuple)
            clock.advance(gov.next_sample_ms())
            gov.tick(*arg)
        elif op == "advance":
            assert isinstance(arg, int)
            clock.advance(arg)
        assert 0 <= gov.inflight <= 3 and gov.waiting >= 0
        assert gov.waiting == 0 or gov.inflight == 3


# -- SVC-41's loop term, SVC-43's exemption, SVC-44's shedding ----------------------------------


def test_SVC_41_the_loop_term_counts_busy_above_one_half() -> None:
    """SVC-41: the loop's term is (busy - 0.5) / 0.5, 0 below one half and when not measured;
    the pressure is the largest term, the delivery pressure (SVC-43's) the largest but the
    loop's."""
    assert [busy_term(b) for b in BUSY] == pytest.approx([0.0, 0.0, 0.0, 0.4, 0.7, 0.9, 1.0])
    clock = FakeClock(T0)
    gov = Governor(clock)
    for busy, pressure in ((0.95, 0.9), (None, 0.0), (0.75, 0.5), (0.3, 0.0)):
        clock.advance(gov.next_sample_ms())
        gov.tick(64, busy)  # the ready term: 64 / 256 = 0.25
        assert gov.pressure == pytest.approx(max(pressure, 0.25))
        assert gov.delivery_pressure == 0.25


def test_SVC_43_a_topic_of_priority_750_or_more_is_never_coalesced() -> None:
    """SVC-43: at pressure 1 a topic of priority 749 waits 20 ms for its round; one of 750 is
    eligible at once, and its delivery's wait counts from its entry (SVC-41)."""
    clock = FakeClock(T0)
    s = Scheduler(clock, [("hi", 750), ("mid", 749)])
    s.update(1.0, False)
    assert coalesce_ms(1.0, 749) == 20 and coalesce_ms(1.0, 750) == 0
    s.mark_ready("mid")
    s.mark_ready("hi")
    assert s.next_wake_ms() == 0
    clock.advance(3)
    assert s.round() == [Delivery("hi", 3)]
    assert s.next_wake_ms() == 17
    clock.advance(17)
    assert s.round() == [Delivery("mid", 0)]


def _sample(gov: Governor, clock: FakeClock, busy: float) -> None:
    clock.advance(gov.next_sample_ms())
    gov.tick(0, busy)


def test_SVC_44_low_priority_appends_are_held_to_half_of_what_was_admitted() -> None:
    """SVC-44's shedding: after a sample above 0.8, appends to topics of priority below 0 are
    admitted at half the rate admitted in it, from a bucket holding 10 ms of that rate; the
    others, and the override (SVC-45), are not held; a refused one takes no slot (SVC-46)."""
    clock = FakeClock(T0)
    gov = Governor(clock, max_inflight_appends=1000)
    for _ in range(100):  # 1000 per second in this sample
        assert gov.begin_append(low=True).admission is Admission.ADMITTED
    _sample(gov, clock, 1.0)
    assert gov.pressure == 1.0 and gov.low_rate == 500.0
    refused = gov.begin_append(low=True)
    assert refused.admission is Admission.REFUSED and refused.retry_after_ms == 100
    assert gov.inflight == 100  # it took nothing
    assert gov.begin_append().admission is Admission.ADMITTED  # priority 0: not shed
    assert gov.begin_append(bypass=True, low=True).admission is Admission.ADMITTED
    clock.advance(2)  # 500 per second: one token per 2 ms
    assert [gov.begin_append(low=True).admission for _ in range(2)] == [
        Admission.ADMITTED,
        Admission.REFUSED,
    ]
    clock.advance(50)  # the bucket holds 10 ms of the rate: 5 tokens
    admitted = [gov.begin_append(low=True).admission for _ in range(7)]
    assert admitted.count(Admission.ADMITTED) == 5 and admitted[-1] is Admission.REFUSED


def test_SVC_44_the_low_rate_climbs_back_in_steps_and_is_lifted_after_1_s() -> None:
    """SVC-44's shedding: a sample below 0.6 raises the rate by a sixteenth of the rate that
    was too much (admitted at the last cut), one between 0.6 and 0.8 keeps it, one above 0.8
    cuts it to half of what was admitted (at least 10 per second); after 10 samples in a row
    below 0.6 the rate is unlimited again."""
    clock = FakeClock(T0)
    gov = Governor(clock, max_inflight_appends=1000)
    for _ in range(160):  # 1600 per second
        gov.begin_append(low=True)
    _sample(gov, clock, 1.0)
    assert gov.low_rate == 800.0
    _sample(gov, clock, 0.0)
    assert gov.low_rate == 900.0  # + 1600 / 16
    _sample(gov, clock, 0.85)  # pressure 0.7: kept
    assert gov.low_rate == 900.0
    for k in range(1, 10):
        _sample(gov, clock, 0.5)
        assert gov.low_rate == 900.0 + 100 * k
    _sample(gov, clock, 0.5)  # the tenth calm sample in a row
    assert gov.low_rate is None
    _sample(gov, clock, 1.0)  # nothing admitted: the floor
    assert gov.low_rate == 10.0
    for _ in range(3):
        gov.begin_append(low=True)
    clock.advance(gov.next_sample_ms() + 200)  # a late tick: 3 samples due, 10 per second
    gov.tick(0, 1.0)
    assert gov.low_rate == 10.0
