"""``tidelog conformance run``: the stateful suite against any program that speaks the driver
protocol, level by level (spec/CONFORMANCE.md).

Each level is the stateful machine of ``tidelog.conformance.machine`` with the rules that level
binds; the backend under test is a ``RemoteStore`` in the driver process, the oracle is the model
in this process. A failure is shrunk by Hypothesis to a minimal operation sequence; its requests
are written to a replay file that ``--replay`` sends again to the driver and to the model, one by
one, reporting the first response that differs.
"""

from __future__ import annotations

import contextlib
import json
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

import hypothesis.core
from hypothesis import HealthCheck, settings
from hypothesis.stateful import rule, precondition, run_state_machine_as_test

from tidelog.api import Store
from tidelog.backend import Capabilities
from tidelog.errors import TidelogError

from .driver import Driver
from .machine import LogMachine
from .remote import DriverProcess, RemoteStore

__all__ = ["LEVELS", "LevelResult", "run_levels", "replay"]

#: level -> (what it adds, the spec rule families it binds)
LEVELS: dict[str, tuple[str, str]] = {
    "log": ("topics, tombstones, deletes, retention, errors, restart",
            "TOP TMB DEL RET ERR DUR-1 DUR-7 DUR-8 CAP"),
    "subscribers": ("+ durable subscribers and the high-water mark", "SUB"),
    "queue": ("+ queue mode: leases, reclaim, dead letter", "QUE"),
    "durable": ("+ power loss: acknowledged fsync ops survive a crash", "DUR-2 DUR-6 DUR-9"),
}


@dataclass
class LevelResult:
    level: str
    passed: bool
    examples: int
    seconds: float
    error: str = ""
    replay_file: str | None = None
    skipped: str = ""


@dataclass
class _Recorder:
    """The requests of the example that ran last (Hypothesis replays the shrunk one last)."""

    driver: DriverProcess
    start: int = 0
    opened: list[int] = field(default_factory=list)

    def mark(self) -> None:
        self.start = len(self.driver.log)

    def last_example(self) -> list[dict[str, Any]]:
        return self.driver.log[self.start:]


def _level_caps(level: str, caps: Capabilities) -> Capabilities:
    """The capabilities a level exercises: lower levels switch the later rule families off."""
    if level == "log":
        return replace(caps, subscribers=False, queue=False)
    if level == "subscribers":
        return replace(caps, queue=False)
    if level == "durable":
        return replace(caps, queue=False, durability=frozenset({"fsync"}) & caps.durability)
    return caps


def machine_for(driver: DriverProcess, level: str, recorder: _Recorder) -> type[LogMachine]:
    crashable = bool(driver.hello.get("crash"))

    class DriverMachine(LogMachine):
        supports_reopen = bool(driver.hello.get("reopen", True))

        @staticmethod
        def sut_uri(name: str) -> str:
            return f"driver:{name}"

        def cleanup_sut(self, name: str) -> None:
            with contextlib.suppress(TidelogError):
                driver.request({"op": "dispose", "name": name})

        def open_sut(self) -> Store:
            if not hasattr(self, "caps"):
                recorder.mark()
            store = RemoteStore(driver, self.name, self.clock)
            self.capabilities = _level_caps(level, store.capabilities)
            return store  # type: ignore[return-value]

        @precondition(lambda self: level == "durable" and crashable)
        @rule()
        def crash(self) -> None:
            """DUR-2, DUR-9: flushed progress and acknowledged fsync ops survive power loss;
            after a crash the store equals the model after a restart."""
            self.sut.flush()
            self.model.flush()
            self.sut.crash()  # type: ignore[attr-defined]
            self.reopen_after_crash()

        def reopen_after_crash(self) -> None:
            import tidelog

            self.model.close()
            self.model = tidelog.open(self.model_uri, clock=self.clock)
            self.sut = self.open_sut()
            self.handles = {
                n: (self.model.topic(n, create=False), self.sut.topic(n, create=False))
                for n in self.model.topics()
            }
            self.leases = []
            self.stale = []

    return DriverMachine


def run_levels(command: str, levels: list[str], *, examples: int = 100, steps: int = 40,
               seed: int | None = None, replay_dir: str = ".",
               on_progress: Callable[[str], None] | None = None) -> list[LevelResult]:
    """Run each level against a fresh driver process; stops at the first failing level."""
    seed = seed if seed is not None else int(time.time())
    results: list[LevelResult] = []
    for level in levels:
        driver = DriverProcess(command)
        recorder = _Recorder(driver)
        machine = machine_for(driver, level, recorder)
        if level == "durable" and not driver.hello.get("crash"):
            results.append(LevelResult(level, True, 0, 0.0, skipped="driver cannot crash"))
            driver.close()
            continue
        if on_progress:
            on_progress(f"level {level}: {examples} examples of up to {steps} steps, seed {seed}")
        t0 = time.perf_counter()
        old = hypothesis.core.global_force_seed
        hypothesis.core.global_force_seed = seed  # the printed seed reproduces the run
        try:
            run_state_machine_as_test(machine, settings=settings(
                max_examples=examples, stateful_step_count=steps, deadline=None,
                database=None, print_blob=False, derandomize=False,
                suppress_health_check=list(HealthCheck)))
            results.append(LevelResult(level, True, examples, time.perf_counter() - t0))
        except Exception as exc:  # noqa: BLE001 - any failure is the driver's finding
            path = f"{replay_dir}/tidelog-replay-{level}-{uuid.uuid4().hex[:8]}.json"
            with open(path, "w", encoding="utf-8") as f:
                json.dump({"driver": command, "level": level, "seed": seed,
                           "requests": recorder.last_example()}, f, indent=1)
            results.append(LevelResult(level, False, examples, time.perf_counter() - t0,
                                       error=str(exc), replay_file=path))
            driver.close()
            break
        finally:
            hypothesis.core.global_force_seed = old
        driver.close()
    return results


def replay(path: str, command: str | None = None) -> list[dict[str, Any]]:
    """Send a replay file's requests to the driver and to the model; returns one row per
    request with the expected (model) and actual (driver) response; ``differs`` marks the
    first divergence."""
    with open(path, encoding="utf-8") as f:
        data = json.load(f)
    driver = DriverProcess(command or data["driver"])
    model = Driver("model://{name}")
    rows = []
    try:
        for req in data["requests"]:
            req = {k: v for k, v in req.items() if k != "id"}
            if req.get("op") == "hello":
                continue
            if req.get("op") == "open":  # a fresh name: replays must not meet old state
                req["name"] = "replay" + uuid.uuid4().hex[:8]
            expected = model.handle(dict(req))
            try:
                actual: dict[str, Any] = {"ok": True, "value": driver.request(dict(req))}
            except Exception as exc:  # noqa: BLE001
                actual = {"ok": False, "code": getattr(exc, "code", type(exc).__name__),
                          "message": str(exc)}
            expected.pop("id", None)
            differs = (expected.get("ok"), expected.get("value"), expected.get("code")) != (
                actual.get("ok"), actual.get("value"), actual.get("code"))
            rows.append({"request": req, "expected": expected, "actual": actual,
                         "differs": differs})
            if differs and req.get("op") not in ("open", "capabilities"):
                break
    finally:
        driver.close()
        if model.store is not None:
            model.store.close()
    return rows
