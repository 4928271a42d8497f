"""The stateful suite against the memory backend (spec: every TOP/TMB/DEL/RET/SUB/QUE rule,
DUR-1 restart via named reopen). The model is the oracle; see tidelog.conformance.machine."""

from __future__ import annotations

import os

from hypothesis import settings

from tidelog.backends.memory import forget
from tidelog.conformance.machine import LogMachine


class MemoryMachine(LogMachine):
    @staticmethod
    def sut_uri(name: str) -> str:
        return f"memory://{name}"

    def cleanup_sut(self, name: str) -> None:
        forget(name)


# CI runs 1000 examples of up to 50 steps (about 40 s on one core); `python3 run.py stateful`
# runs a long campaign by raising TIDELOG_STATEFUL_EXAMPLES.
MemoryMachine.TestCase.settings = settings(
    MemoryMachine.TestCase.settings,
    max_examples=int(os.environ.get("TIDELOG_STATEFUL_EXAMPLES", "1000")),
    stateful_step_count=50,
    deadline=None,
)
TestMemoryVsModel = MemoryMachine.TestCase
