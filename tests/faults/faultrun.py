"""Fault campaigns for the file backend (spec/SPEC.md FLT-3..FLT-8): run a small workload through
``tidelog.conformance.faultfs.FaultFS`` over a ``RecordingFS``, with one I/O call failed, then
recover and compare with the model.

A workload is a list of steps: ``("open",)``, ``("close",)`` or a ``crashcheck`` op. A baseline run
without faults lists every I/O call; ``cases`` yields (call index, fault) for every call and every
fault that applies to its kind. Each case runs the workload again with that one fault and checks:

* FLT-3: every error that surfaced is a ``TidelogError`` with code ``io_error`` (a bare
  ``OSError`` or another exception fails the case);
* FLT-4: unless the fault was absorbed (the step's result is the baseline's, e.g. a preallocation
  that fell back to a smaller size, FLT-8), every later step up to the next close raises
  ``io_error``: nothing is acknowledged after the first failure, and the run stops after that
  close (which must release the lock);
* FLT-5, DUR-2..DUR-6, DUR-9: recovery gives a state the model allows after the acknowledged
  steps, or after them plus the step that raised, from: the disk image a power loss would leave
  (the durable image) right after the step that raised returned, and at the end; and what the
  process left (the volatile image, reopened in the same process, which also proves the lock was
  released). For an absorbed fault, the durable image after every step from it on: a failure
  that was ignored shows there, before a later checkpoint rewrites what it lost. Recovering
  twice gives the same state, and a new append gets the seq after the recovered head (no seq
  reused).
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import tidelog
from tidelog.backends.file import open_store
from tidelog.clock import FakeClock
from tidelog.conformance.crashcheck import ROUTERS, apply_op, compare_recovered, observe
from tidelog.conformance.crashfs import RecordingFS
from tidelog.conformance.faultfs import APPLICABLE, Fault, FaultFS
from tidelog.errors import TidelogError
from tidelog.hooks import Abandon, hooks
from tidelog.model import ModelStore

ROOT = "/data/store"
OPTIONS: dict[str, Any] = dict(
    wal_file_bytes="64KiB",
    prealloc="fallocate",
    background=False,
    commit_interval_ms=60_000,
    head_reserve=4,
    segment_max_records=3,
)
START_MS = 1_000_000
Step = tuple[Any, ...]


class Untyped(AssertionError):
    """A step raised something other than a TidelogError (FLT-3)."""


@dataclass
class Run:
    results: list[Any]  # per step run: its value, or "error:<code>"
    marks: list[int]  # per step run: the I/O history's length when it returned
    fault_step: int | None  # the step during which the first fault fired
    diverged: int | None  # the first step from there whose result is not the baseline's


def do_step(
    store: Any, step: Step, clock: FakeClock, leases: dict[str, list[Any]], opener: Any
) -> tuple[Any, Any]:
    """Run one step; returns (its result or "error:<code>", the store open after it). A bare
    exception (not a TidelogError) is raised as ``Untyped`` (FLT-3)."""
    try:
        if step[0] == "open":
            return None, opener(clock)
        if step[0] == "close":
            store.close()
            return None, None
        return apply_op(store, step, clock, leases), store
    except TidelogError as exc:
        return f"error:{exc.code}", (None if step[0] in ("open", "close") else store)
    except Exception as exc:  # FLT-3: nothing untyped leaves an entry point
        raise Untyped(f"{step[0]} raised {exc!r}") from exc


def run_steps(
    fs: FaultFS,
    steps: Sequence[Step],
    baseline: Sequence[Any] | None = None,
    options: dict[str, Any] = OPTIONS,
) -> Run:
    """Run ``steps`` on ``fs``; with ``baseline``, stop as FLT-4 says once a fault made a step
    differ from it (after the next close, or at once if the store is not open)."""
    clock = FakeClock(START_MS)
    store: Any = None
    leases: dict[str, list[Any]] = {}
    results: list[Any] = []
    marks: list[int] = []
    history = getattr(fs.inner, "history", [])
    fault_step = diverged = None

    def opener(clock: FakeClock) -> Any:
        return open_store(fs, ROOT, clock, **options)

    for k, step in enumerate(steps):
        fired = len(fs.injected)
        try:
            res, store = do_step(store, step, clock, leases, opener)
        except Untyped as exc:
            raise Untyped(f"step {k} {exc} ({fs.summary()})") from exc
        results.append(res)
        marks.append(len(history))
        if fault_step is None and len(fs.injected) > fired:
            fault_step = k
        if baseline is None or fault_step is None:
            continue
        if diverged is None and res != baseline[k]:
            diverged = k
        if diverged is not None and store is None:
            break  # the open that failed, or the close that ended the poisoned run (FLT-4)
    if store is not None:  # a baseline that does not end closed: what a killed process leaves
        hooks(store, Abandon).abandon()
    return Run(results, marks, fault_step, diverged)


def encode(step: Step) -> Any:
    """A step as JSON (bytes as {"$b": hex}), for a worker process (fault_worker.py)."""
    if isinstance(step, bytes):
        return {"$b": step.hex()}
    if isinstance(step, (list, tuple)):
        return [encode(x) for x in step]
    if isinstance(step, dict):
        return {k: encode(v) for k, v in step.items()}
    return step


def decode(data: Any, top: bool = True) -> Any:
    """``encode`` undone (the step itself is a tuple again)."""
    if isinstance(data, dict):
        if set(data) == {"$b"}:
            return bytes.fromhex(data["$b"])
        return {k: decode(v, False) for k, v in data.items()}
    if isinstance(data, list):
        items = [decode(x, False) for x in data]
        return tuple(items) if top else items
    return data


def model_ops(steps: Sequence[Step]) -> list[Step]:
    """The ops the model runs for ``steps``: a close is a flush (DUR-8), an open nothing."""
    return [("flush",) if s[0] == "close" else s for s in steps if s[0] != "open"]


class Models:
    """The model after each prefix of a workload's ops (cached)."""

    def __init__(self, steps: Sequence[Step]) -> None:
        self.steps = list(steps)
        self._cache: dict[int, tuple[ModelStore, FakeClock]] = {}

    def after(self, n_steps: int) -> tuple[ModelStore, FakeClock]:
        if n_steps not in self._cache:
            clock = FakeClock(START_MS)
            store = tidelog.open("model://", clock=clock)
            leases: dict[str, list[Any]] = {}
            for op in model_ops(self.steps[:n_steps]):
                apply_op(store, op, clock, leases)
            self._cache[n_steps] = (hooks(store, ModelStore), clock)
        return self._cache[n_steps]


@dataclass
class Tally:
    """What a campaign did: printed, and appended to $TIDELOG_FAULT_REPORT."""

    cases: int = 0
    injected: int = 0
    absorbed: int = 0
    states: int = 0
    problems: list[str] = field(default_factory=list)

    def line(self, name: str) -> str:
        return (
            f"{name}: {self.cases} cases, {self.injected} faults injected "
            f"({self.absorbed} absorbed), {self.states} recovered states checked, "
            f"{len(self.problems)} failing (lost, reused, untyped or acknowledged after it)"
        )

    def report(self, name: str) -> None:
        print(self.line(name))
        path = os.environ.get("TIDELOG_FAULT_REPORT")
        if path:
            with open(path, "a", encoding="utf-8") as f:
                f.write(f"{name}\t{self.cases}\t{self.injected}\t{self.states}\t"
                        f"{len(self.problems)}\n")  # fmt: skip

    def check(self) -> None:
        assert not self.problems, f"{len(self.problems)} failing cases; first ones:\n" + "\n".join(
            self.problems[:5]
        )


class Campaign:
    """One workload: its baseline run, and a check per fault case."""

    def __init__(self, steps: Sequence[Step], options: dict[str, Any] = OPTIONS) -> None:
        self.steps = list(steps)
        self.options = options
        base = FaultFS(RecordingFS()).keep_log()
        self.baseline = run_steps(base, self.steps, options=options).results
        assert all(not str(r).startswith("error:io_error") for r in self.baseline)
        assert base.log is not None
        self.calls = base.log
        self.models = Models(self.steps)

    def cases(self) -> Iterator[tuple[int, str]]:
        """(call index, fault) for every I/O call of the baseline and every fault that applies."""
        for index, (kind, _) in enumerate(self.calls):
            for fault in APPLICABLE[kind]:
                yield index, fault

    def run_case(
        self,
        faults: Sequence[Fault],
        tally: Tally,
        *,
        samples: int = 0,
        seed: int = 0,
        rate: float = 0.0,
    ) -> None:
        """Run the workload with ``faults`` (and ``rate``: random ones from ``seed``), check it,
        and recover the durable image, ``samples`` more seeded crash states of that moment, and
        the volatile image. Problems go to ``tally``."""
        fs = FaultFS(RecordingFS(), faults, seed=seed, rate=rate)
        where = f"faults {[str(f) for f in faults]} seed {seed} rate {rate}"
        tally.cases += 1
        try:
            run = run_steps(fs, self.steps, self.baseline, self.options)
        except Untyped as exc:
            tally.problems.append(f"{where}: {exc}")
            return
        fs.armed = False
        tally.injected += len(fs.injected)
        where = f"{where}: {fs.summary()}; results {run.results}"
        problems = self._check_run(run)
        f, d = run.fault_step, run.diverged
        if len(fs.injected) == 1 and d is not None and d != f:  # no background work here
            problems.append(f"the fault in step {f} surfaced only at step {d} (FLT-3)")
        if f is not None and d is None:
            tally.absorbed += 1
        inner = fs.inner
        assert isinstance(inner, RecordingFS)
        end = len(run.results)
        # (crash point or None for the volatile image, the model's ops, the op in flight)
        checks: list[tuple[int | None, int, int | None]] = []
        first = end - 1 if f is None else f
        # absorbed faults: the durable image after each step they did not make fail
        checks += [(run.marks[k], k + 1, None) for k in range(first, end if d is None else d)]
        if d is None:
            checks.append((None, end, None))
        else:
            in_flight = d + 1 if self.steps[d][0] != "open" else None
            checks += [(run.marks[d], d, in_flight), (len(inner.history), d, in_flight)]
            checks.append((None, d, in_flight))
        for at, acked, in_flight in checks:
            model_i = self.models.after(acked)
            model_next = self.models.after(in_flight) if in_flight is not None else None
            if at is None:
                states: list[tuple[str, RecordingFS]] = [("volatile image", inner)]
            else:
                limit = 1 + (samples if at == len(inner.history) else 0)
                states = [
                    (s.description, s)
                    for s in inner.crash_states(at=at, mode="sample", seed=seed, limit=limit)
                ]
            for name, state in states:
                try:
                    recover_and_compare(state, model_i, model_next, self.options)
                except AssertionError as exc:
                    problems.append(f"{name}: {exc}")
                tally.states += 1
        if problems:
            tally.problems.append(f"{where}:\n  " + "\n  ".join(problems))

    def _check_run(self, run: Run) -> list[str]:
        return check_results(self.steps, self.baseline, run.results, run.diverged)


def check_results(
    steps: Sequence[Step], baseline: Sequence[Any], results: Sequence[Any], diverged: int | None
) -> list[str]:
    """FLT-3/FLT-4 on a run's results: the baseline's up to the first step that differs
    (``diverged``), io_error from there on (nothing acknowledged after a failure)."""
    out = []
    for k, res in enumerate(results):
        if diverged is None or k < diverged:
            if res != baseline[k]:
                out.append(f"step {k} {steps[k][0]}: {res!r}, without the fault {baseline[k]!r}")
        elif res != "error:io_error":
            out.append(
                f"step {k} {steps[k][0]} after the failure at step {diverged}: {res!r}, "
                "not io_error (FLT-3, FLT-4)"
            )
    return out


def recover_and_compare(
    state: RecordingFS,
    model_i: tuple[ModelStore, FakeClock],
    model_next: Any,
    options: dict[str, Any] = OPTIONS,
) -> None:
    """Open ``state`` (twice), compare with the model, append once per topic (CRASH-7)."""
    model, clock_i = model_i
    nxt = model_next[0] if model_next is not None else None
    clock = FakeClock(clock_i.now_ms())
    try:
        store = open_store(state, ROOT, clock, **options)
    except Exception as exc:
        raise AssertionError(f"recovery raised {exc!r}") from exc
    try:
        got = observe(store)
        compare_recovered(got, model, nxt, clock, "after the fault")
    finally:
        store.close()
    again = open_store(state, ROOT, FakeClock(clock.now_ms()), **options)
    try:
        assert observe(again) == got, "recovering twice gave different states"
        for name, view in got.items():
            if name == ROUTERS:
                continue
            try:
                seq = again.topic(name, create=False).append(b"after")
            except TidelogError:
                continue  # refused (a full topic): no seq handed out
            assert seq == view.head + 1, f"{name}: new seq {seq} after head {view.head}"
    finally:
        again.close()
