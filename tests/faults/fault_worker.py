"""One workload against a real ``file://`` store, in a process of its own, for the fault
campaign's real mechanisms (test_fault_campaign.py): strace's syscall fault injection or libfiu's
wrappers around an otherwise unmodified process.

    python fault_worker.py ROOT CASE.json RESULTS.jsonl

CASE.json holds the steps, their baseline results and the store options (faultrun.encode);
with ``"fiu": [point, n, errno]`` libfiu (preloaded by ``fiu-run -x``) fails the n-th call of
that point from the first step on (with ``n`` 0 it only counts, and the count is the last line
written). One JSON line per step goes to RESULTS.jsonl as it returns; the run stops as FLT-4
says (faultrun.run_steps). A bare exception from tidelog is written as {"untyped": ...} and the
exit status is 3.
"""

from __future__ import annotations

import ctypes
import json
import sys
from typing import Any

from faultrun import START_MS, Untyped, decode, do_step

import tidelog
import tidelog.backends.file  # imported before faults are armed (they would land in imports)
from tidelog.clock import FakeClock

_CALLBACK = ctypes.CFUNCTYPE(
    ctypes.c_int,
    ctypes.c_char_p,
    ctypes.POINTER(ctypes.c_int),
    ctypes.POINTER(ctypes.c_void_p),
    ctypes.POINTER(ctypes.c_uint),
)


_ARMED: list[Any] = []  # the callbacks libfiu may call: alive until disarmed


def arm_fiu(point: str, nth: int, code: int) -> list[int]:
    """Fail the ``nth`` call (1-based) of libfiu point ``point`` with errno ``code``; returns
    the call counter."""
    lib = ctypes.CDLL("libfiu.so.0")
    seen = [0]

    def decide(name: bytes, failnum: Any, failinfo: Any, flags: Any) -> int:
        seen[0] += 1
        if seen[0] == nth:
            failinfo[0] = code
            return 1
        return 0

    callback = _CALLBACK(decide)
    lib.fiu_enable_external.argtypes = [
        ctypes.c_char_p, ctypes.c_int, ctypes.c_void_p, ctypes.c_uint, _CALLBACK
    ]  # fmt: skip
    if lib.fiu_enable_external(point.encode(), 1, None, 0, callback) != 0:
        raise SystemExit(f"fiu_enable_external({point}) failed")
    _ARMED.append((lib, point, callback))
    return seen


def disarm_fiu() -> None:
    """Disarm before the interpreter tears down (a wrapped call must not reach a freed
    callback)."""
    for lib, point, _ in _ARMED:
        lib.fiu_disable(point.encode())


def main() -> int:
    root, case_path, out_path = sys.argv[1:4]
    with open(case_path, encoding="utf-8") as f:
        case = json.load(f)
    steps = [decode(s) for s in case["steps"]]
    baseline = case["baseline"]
    with open(out_path, "w", encoding="utf-8") as out:  # opened before any fault is armed
        counter = arm_fiu(*case["fiu"]) if case.get("fiu") else None
        try:
            return run(root, steps, baseline, out, counter, case["options"])
        finally:
            disarm_fiu()


def run(
    root: str, steps: list[Any], baseline: list[Any], out: Any, counter: Any, options: Any
) -> int:
    clock = FakeClock(START_MS)
    store: Any = None
    leases: dict[str, list[Any]] = {}
    diverged = None

    def opener(clock: FakeClock) -> Any:
        return tidelog.open(f"file://{root}", clock=clock, **options)

    for k, step in enumerate(steps):
        try:
            res, store = do_step(store, step, clock, leases, opener)
        except Untyped as exc:
            out.write(json.dumps({"untyped": f"step {k} {exc}"}) + "\n")
            return 3
        out.write(json.dumps({"result": res}) + "\n")
        out.flush()
        if diverged is None and res != baseline[k]:
            diverged = k
        if diverged is not None and store is None:
            break
    if counter is not None:
        out.write(json.dumps({"fiu_calls": counter[0]}) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
