"""What ``tidelog verify`` reports (spec/CONFORMANCE.md §5): one ``Problem`` per finding (path,
byte offset, rule id, severity, message), gathered in a ``Report``. Every format's verifier
(``tidelog.verify`` and the backends' own: ``backends.file.verify``, ``backends.blockdev.verify``,
SF slots) fills these same types, so the core owns them and no backend imports another's.
"""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["ERROR", "WARNING", "INFO", "Problem", "Report"]

ERROR = "error"
WARNING = "warning"
INFO = "info"  # a finding that is no damage (a cold tier's orphan object, TIERING.md TIER-14)


@dataclass(frozen=True)
class Problem:
    path: str
    offset: int | None  # byte offset in ``path``; None for a whole file or directory
    rule: str
    severity: str  # "error" | "warning" | "info"
    message: str

    def __str__(self) -> str:
        where = self.path if self.offset is None else f"{self.path} @ {self.offset}"
        return f"{self.severity}: {where}: [{self.rule}] {self.message}"


@dataclass
class Report:
    root: str
    problems: list[Problem] = field(default_factory=list)
    files_checked: int = 0

    @property
    def ok(self) -> bool:
        """No errors (warnings allowed)."""
        return not self.errors

    @property
    def errors(self) -> list[Problem]:
        return [p for p in self.problems if p.severity == ERROR]

    @property
    def warnings(self) -> list[Problem]:
        return [p for p in self.problems if p.severity == WARNING]
