"""``tidelog conformance run``: the suite against any implementation, level by level
(spec/CONFORMANCE.md §1, §4).

Each level runs on a fresh ``RemoteSut`` (a new driver process, or a new in-process driver) with
Hypothesis; the oracle is the model in this process. A failure is shrunk by Hypothesis to a
minimal operation sequence, whose exchange with the driver is kept: the report prints it with
the expected and actual results, and a replay file holds its requests. ``replay`` sends them
again to the driver and to the reference (tidelog's driver over the model, ``model://``), one by
one, and reports the first response that differs.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from typing import Any

import hypothesis.core
import hypothesis.internal.conjecture.engine as _engine
from hypothesis import HealthCheck, given, settings
from hypothesis.reporting import with_reporter
from hypothesis.stateful import run_state_machine_as_test

from tidelog.clock import FakeClock
from tidelog.errors import NotAvailable, TidelogError
from tidelog.hooks import hooks
from tidelog.model import ModelStore

from .crashcheck import observe
from .driver import make_driver
from .fsnmachine import forward_machine_for
from .levels import LEVELS, ORDER, applies
from .machine import FAILURE_HOOKS, apply_ring_evictions, ring_eviction_refused
from .remote import LocalTransport, RemoteSut
from .ringcheck import check_ring_head, ring_images
from .suitemachine import crash_states, machine_for, recovered_allowed, snapshot_model
from .sut import RingEvent

__all__ = [
    "Failure", "LevelResult", "SutFactory", "run_levels", "run_level", "replay",
    "format_report", "reference_sut", "check_refusals",
]  # fmt: skip

SutFactory = Callable[[], RemoteSut]
#: requests the report leaves out of the minimal sequence (the suite's own reads after each
#: step: they are in the replay file)
_READS = frozenset(
    {"topics", "state", "read", "subscribers", "hwm", "config", "routers", "sf_state"}
)


@dataclass
class Failure:
    message: str
    steps: list[dict[str, Any]]  # the shrunk example's exchange: {"request", "response"}
    seconds_to_first: float  # from the start of the level to the first difference found
    examples_to_first: int  # examples generated up to and including the first failing one
    hypothesis_steps: str = ""  # Hypothesis's own account of the shrunk example (its rules)


@dataclass
class LevelResult:
    level: str
    status: str  # "pass" | "fail" | "n/a"
    examples: int = 0
    seconds: float = 0.0
    seed: int = 0
    detail: str = ""
    failure: Failure | None = None
    replay_file: str | None = None

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class _Watch:
    """Times the first failure of a run and counts examples (FAILURE_HOOKS, on_start)."""

    start: float = field(default_factory=time.perf_counter)
    examples: int = 0
    first: tuple[float, int] | None = None
    mark: int = 0  # index in the transport log where the current example starts
    link: RemoteSut | None = None

    def started(self, _machine: object) -> None:
        self.examples += 1
        if self.link is not None:
            self.mark = len(self.link.transport.log)

    #: the last example that failed: its message and exchange (when Hypothesis's final replay
    #: of the shrunk example does not fail again, FlakyFailure, this is the failure to report)
    failing: tuple[str, list[dict[str, Any]]] | None = None

    def failed(self, message: str) -> None:
        if self.first is None:
            self.first = (time.perf_counter() - self.start, self.examples)
        if self.link is not None:
            self.failing = (message, self.link.transport.log[self.mark :])


@contextlib.contextmanager
def _hypothesis(seed: int, shrink_seconds: float, sink: list[str]) -> Iterator[None]:
    """Seed Hypothesis (the printed seed reproduces the run), bound its shrinking (through a
    driver every candidate is a whole example: the default five minutes is too long; Hypothesis
    has no public setting for it) and collect what it reports (the falsifying steps)."""
    old_seed: Any = hypothesis.core.global_force_seed
    old_limit = getattr(_engine, "MAX_SHRINKING_SECONDS", None)
    hypothesis.core.global_force_seed = seed  # type: ignore[assignment]
    if old_limit is not None:
        _engine.MAX_SHRINKING_SECONDS = shrink_seconds  # type: ignore[assignment]
    try:
        with with_reporter(lambda text: sink.append(str(text))):
            yield
    finally:
        hypothesis.core.global_force_seed = old_seed
        if old_limit is not None:
            _engine.MAX_SHRINKING_SECONDS = old_limit


def _settings(examples: int, steps: int) -> settings:
    return settings(
        max_examples=examples,
        stateful_step_count=steps,
        deadline=None,
        database=None,
        print_blob=False,
        derandomize=False,
        report_multiple_bugs=False,
        suppress_health_check=list(HealthCheck),
    )


def _probe(link: RemoteSut) -> Any:
    """The capabilities of a fresh store (opened, then disposed of)."""
    name = "probe" + uuid.uuid4().hex[:8]
    store = link.open(name, FakeClock(1_000_000))
    caps = store.capabilities
    with contextlib.suppress(TidelogError):
        store.close()
    link.dispose(name)
    return caps


def check_refusals(link: RemoteSut) -> list[str]:
    """CAP-1, CNF-3: for every capability an implementation says it lacks, the operation
    needing it raises ``not_available`` (and changes nothing); without ``routers`` the router
    list is empty (RTR-13). Returns the violations."""
    name = "cap" + uuid.uuid4().hex[:8]
    store = link.open(name, FakeClock(1_000_000))
    caps = store.capabilities
    problems: list[str] = []
    try:
        existing = store.topics()
        topic = store.topic(existing[0] if existing else "t0")
        probes: dict[str, Callable[[], object]] = {
            "deletes": lambda: topic.delete(1),
            "subscribers": lambda: topic.subscribe("s0"),
            "queue": lambda: topic.claim("n0"),
            "multi_topic": lambda: store.topic("t1" if topic.name != "t1" else "t2"),
            "routers": lambda: store.router("r0", topic.name, topic.name),
        }
        for flag, probe in probes.items():
            if getattr(caps, flag):
                continue
            try:
                probe()
            except NotAvailable:
                continue
            except TidelogError as exc:
                problems.append(f"CAP-1: {flag} is False but its operation raised {exc.code}, "
                                "not not_available")
                continue
            problems.append(f"CAP-1: {flag} is False but its operation succeeded")
        if not caps.routers and store.routers():
            problems.append("RTR-13: routers is False but routers() is not empty")
    finally:
        with contextlib.suppress(TidelogError):
            store.close()
        link.dispose(name)
    return problems


def run_level(
    make_sut: SutFactory,
    level: str,
    *,
    examples: int,
    steps: int,
    seed: int,
    shrink_seconds: float = 30.0,
) -> LevelResult:
    """One level on a fresh implementation instance."""
    link = make_sut()
    t0 = time.perf_counter()
    try:
        caps = _probe(link)
        reason = applies(level, caps, link.hello)
        if reason is not None:
            return LevelResult(level, "n/a", 0, time.perf_counter() - t0, seed, reason)
        wrong = check_refusals(link) if level == "log" else []
        if wrong:
            return LevelResult(level, "fail", 0, time.perf_counter() - t0, seed, "; ".join(wrong))
        watch = _Watch(link=link)
        FAILURE_HOOKS.append(watch.failed)
        reported: list[str] = []
        try:
            with _hypothesis(seed, shrink_seconds, reported):
                _run_machines(link, level, examples, steps, watch)
        except Exception as exc:  # any failure is the implementation's finding
            flaky = watch.failing if getattr(exc, "exceptions", None) else None
            watch.failed(str(exc))
            first = watch.first or (time.perf_counter() - t0, watch.examples)
            message, steps_seen = _message(exc), link.transport.log[watch.mark :]
            if flaky is not None:
                # the shrunk example passed when replayed: report the last one that failed
                message = f"{flaky[0]} (the run was not reproducible: {message})"
                steps_seen = flaky[1]
            return LevelResult(
                level,
                "fail",
                watch.examples,
                time.perf_counter() - t0,
                seed,
                message,
                Failure(message, steps_seen, first[0], first[1], _steps_text(reported)),
            )
        finally:
            FAILURE_HOOKS.remove(watch.failed)
        return LevelResult(level, "pass", examples, time.perf_counter() - t0, seed)
    finally:
        link.shutdown()


def _steps_text(reported: list[str]) -> str:
    """Hypothesis's falsifying-example printout, without its notes about shrinking time."""
    keep = [r for r in reported if "shrink" not in r.lower() and "PLEASE REPORT" not in r]
    return "\n".join(keep).strip()


def _message(exc: BaseException) -> str:
    text = str(exc).strip() or type(exc).__name__
    return text if isinstance(exc, AssertionError) else f"{type(exc).__name__}: {text}"


def _run_machines(link: RemoteSut, level: str, examples: int, steps: int, watch: _Watch) -> None:
    cfg = _settings(examples, steps)
    if level == "forward":
        run_state_machine_as_test(forward_machine_for(link, watch.started), settings=cfg)
        return
    if level == "ring":

        @given(ring_images())
        @cfg
        def heads(image: tuple[int, list[int | None], str]) -> None:
            watch.started(None)
            check_ring_head(link.ring_head, *image)

        heads()
        if link.ring_pages() is None:
            probe = link.open("ring" + uuid.uuid4().hex[:8], FakeClock(1_000_000))
            is_ring = link.ring_pages() is not None
            with contextlib.suppress(TidelogError):
                probe.close()
            link.dispose(probe.name)
            if not is_ring:
                return  # not a ring store: the pure part is the whole level
    run_state_machine_as_test(machine_for(link, level, watch.started), settings=cfg)


def run_levels(
    make_sut: SutFactory,
    levels: list[str] | None = None,
    *,
    examples: int = 100,
    steps: int = 40,
    seed: int | None = None,
    replay_dir: str | None = None,
    command: str | None = None,
    shrink_seconds: float = 30.0,
    on_progress: Callable[[str], None] | None = None,
) -> list[LevelResult]:
    """Run ``levels`` (default: all, in order) one after the other; a failing level is recorded
    and the run goes on (levels are independent), so the report lists every level's verdict."""
    seed = seed if seed is not None else int(time.time())
    out = []
    for level in levels or list(ORDER):
        if level not in LEVELS:
            raise ValueError(f"unknown level {level!r}; levels: {', '.join(ORDER)}")
        if on_progress:
            on_progress(f"level {level}: up to {examples} examples of {steps} steps, seed {seed}")
        result = run_level(
            make_sut, level, examples=examples, steps=steps, seed=seed,
            shrink_seconds=shrink_seconds,
        )
        if result.failure is not None and replay_dir is not None:
            path = os.path.join(replay_dir, f"tidelog-replay-{level}-{uuid.uuid4().hex[:8]}.json")
            with open(path, "w", encoding="utf-8") as f:
                json.dump(
                    {
                        "driver": command,
                        "level": level,
                        "seed": seed,
                        "message": result.failure.message,
                        "requests": [s["request"] for s in result.failure.steps],
                    },
                    f,
                    indent=1,
                )
            result.replay_file = path
        out.append(result)
    return out


# -- the report ------------------------------------------------------------------------------
def _compact(obj: Any, width: int = 160) -> str:
    text = json.dumps(obj, separators=(",", ":"))
    return text if len(text) <= width else text[: width - 3] + "..."


def format_report(results: list[LevelResult]) -> list[str]:
    """Human-readable lines: one verdict per level; for a failure, the shrunk minimal sequence
    (state-changing requests with their responses) and what differed."""
    lines = []
    for r in results:
        verdict = {"pass": "PASS", "fail": "FAIL", "n/a": "N/A "}[r.status]
        title = LEVELS[r.level].title
        if r.status == "pass":
            lines.append(f"{verdict} {r.level:<12} {r.examples} examples in {r.seconds:.1f}s "
                         f"(seed {r.seed}): {title}")
        elif r.status == "n/a":
            lines.append(f"{verdict} {r.level:<12} {r.detail}")
        else:
            lines.append(f"{verdict} {r.level:<12} seed {r.seed}; binds {LEVELS[r.level].binds}")
            f = r.failure
            if f is not None:
                lines.append(f"     first failure after {f.seconds_to_first:.2f}s, in example "
                             f"{f.examples_to_first}; shrunk to:")
                shown = [s for s in f.steps if s["request"].get("op") not in _READS]
                for s in shown:
                    req = {k: v for k, v in s["request"].items() if k not in ("id", "now")}
                    lines.append(f"       {_compact(req)}")
                    lines.append(f"         -> {_compact(s['response'])}")
            lines.append(f"     difference: {r.detail.splitlines()[0][:400]}")
            if r.replay_file:
                lines.append(f"     replay: tidelog conformance run --replay {r.replay_file}")
    passed = [r.level for r in results if r.status == "pass"]
    lines.append(f"passed levels: {', '.join(passed) or 'none'}")
    return lines


# -- replay ------------------------------------------------------------------------------------
def reference_sut() -> RemoteSut:
    """tidelog's driver over the model (in-process): the expected side of a replay."""
    return RemoteSut(LocalTransport(make_driver("model://{name}")))


def _same(a: dict[str, Any] | None, b: dict[str, Any] | None) -> bool:
    def key(r: dict[str, Any] | None) -> Any:
        if r is None:
            return None
        return (bool(r.get("ok")), r.get("value"), r.get("code"))

    return bool(key(a) == key(b))


def replay(path: str, make_sut: SutFactory) -> list[dict[str, Any]]:
    """Send a replay file's requests to the implementation and to the reference, one by one.

    Returns one row per request (``request``, ``expected``, ``actual``, ``differs``), up to and
    including the first that differs. A power loss (``crash`` or ``crash_seed``) is checked the
    way the run checked it: the implementation's recovered store must be a state the model allows;
    the requests on that store after it are skipped (the run went on with a fresh store).
    """
    with open(path, encoding="utf-8") as f:
        data = json.load(f)
    link, ref = make_sut(), reference_sut()
    rows: list[dict[str, Any]] = []
    crashed: str | None = None
    pages: int | None = None  # the open ring's size (``open``'s ``ring_pages``)
    exact = True  # the open store's exact_progress (CNF-7)
    try:
        for req in data["requests"]:
            req = {k: v for k, v in req.items() if k != "id"}
            op = req.get("op")
            if op == "hello":
                continue
            if crashed is not None:
                if op == "open" and req.get("name") != crashed:
                    crashed = None  # the fresh store the run went on with
                else:
                    continue
            if op == "crash" or "crash_seed" in req:
                crashed = ref.transport.driver.name  # type: ignore[attr-defined]
                row = _replay_crash(link, ref, req, pages, exact)
                rows.append(row)
                if row["differs"]:
                    break
                continue
            expected = _exchange(ref, req)
            actual = _exchange(link, req)
            if op in ("open", "capabilities"):
                # the implementation's own claims (the run checks them against its level, CAP-1)
                differs = expected["ok"] != actual["ok"]
                if op == "open" and actual["ok"]:
                    pages = (actual["value"] or {}).get("ring_pages")
                    caps = (actual["value"] or {}).get("capabilities") or {}
                    exact = bool(caps.get("exact_progress", True))
            else:
                differs = not _same(expected, actual)
            if not differs:
                refused = _learn_ring(link, ref, pages)
                if refused is not None:
                    actual = {"ok": False, "code": "ring", "message": refused}
                    differs = True
            rows.append({"request": req, "expected": expected, "actual": actual,
                         "differs": differs})
            if differs:
                break
    finally:
        link.shutdown()
        ref.shutdown()
    return rows


def _exchange(link: RemoteSut, req: dict[str, Any]) -> dict[str, Any]:
    try:
        value = link.transport.request(dict(req))
        return {"ok": True, "value": value}
    except TidelogError as exc:
        return {"ok": False, "code": exc.code, "message": exc.message}
    except Exception as exc:  # the implementation broke the protocol itself
        return {"ok": False, "code": type(exc).__name__, "message": str(exc)}


def _reference_model(ref: RemoteSut) -> ModelStore:
    return hooks(ref.transport.driver.store, ModelStore)  # type: ignore[attr-defined]


def _learn_ring(link: RemoteSut, ref: RemoteSut, pages: int | None) -> str | None:
    """CNF-5: the ring overwrites the implementation reported for the last request reach the
    reference model, as in the run; returns why one was not legitimate (None: all were)."""
    events = link.ring_evictions()
    why = _refusal(events, pages)
    if why is None and events:
        apply_ring_evictions(_reference_model(ref), events)
    return why


def _refusal(events: list[RingEvent], pages: int | None) -> str | None:
    """Why the first of ``events`` the ring's size does not allow was refused (BDEV-16)."""
    return next((w for ev in events if (w := ring_eviction_refused(ev, pages))), None)


def _replay_crash(
    link: RemoteSut, ref: RemoteSut, req: dict[str, Any], pages: int | None, exact: bool
) -> dict[str, Any]:
    """Replay a power loss: apply the op (if any) to the model, crash the implementation,
    recover it and compare with the model's allowed states (CNF-6: with the ring overwrites
    the op began, or without them and the op)."""
    ref_driver = ref.transport.driver  # type: ignore[attr-defined]
    model = _reference_model(ref)
    name = ref_driver.name
    before = snapshot_model(model)
    after = None
    if "crash_seed" in req:
        inner = {k: v for k, v in req.items() if k != "crash_seed"}
        _exchange(ref, inner)
        after = model
    _exchange(link, req)
    events = link.ring_evictions()
    clock = FakeClock(int(req.get("now", 1_000_000)))
    try:
        why = _refusal(events, pages)
        if why is not None:
            raise AssertionError(why)
        states = crash_states(before, after, events)
        store = link.open(name, clock)
        got = observe(store)
        recovered_allowed(got, states, clock, "replayed power loss", exact_progress=exact)
        verdict: dict[str, Any] = {"ok": True, "value": "recovered state allowed"}
        differs = False
    except (AssertionError, TidelogError) as exc:
        verdict = {"ok": False, "code": "recovery", "message": str(exc)}
        differs = True
    ref_driver.handle({"op": "close"})
    return {"request": req, "expected": {"ok": True, "value": "a state the model allows"},
            "actual": verdict, "differs": differs}
