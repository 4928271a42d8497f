"""The stateful suite against the memory backend (spec: every TOP/TMB/DEL/RET/SUB/QUE rule,
DUR-1 restart via named reopen). The model is the oracle; see tidelog.conformance.machine."""

from __future__ import annotations

from hypothesis import settings

from tidelog.backends.memory import forget
from tidelog.conformance.machine import LogMachine


class MemoryMachine(LogMachine):
    @staticmethod
    def sut_uri(name: str) -> str:
        return f"memory://{name}"

    def cleanup_sut(self, name: str) -> None:
        forget(name)


MemoryMachine.TestCase.settings = settings(
    MemoryMachine.TestCase.settings, stateful_step_count=50, deadline=None
)
TestMemoryVsModel = MemoryMachine.TestCase
