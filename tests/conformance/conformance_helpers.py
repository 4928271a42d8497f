"""Helpers of the conformance tests: how to start tidelog's driver (and its mutants) as a
separate process, and where a mutant's result goes for the session's mutation report
(tests/conftest.py prints it)."""

from __future__ import annotations

import importlib.util
import json
import os
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

from tidelog.cli_conformance import own_driver_command
from tidelog.conformance.remote import DriverProcess, RemoteSut

HERE = Path(__file__).resolve().parent
MUTANTS_FILE = str(HERE / "mutants.py")
_REPORT = "TIDELOG_MUTATION_REPORT"


def load_mutants() -> ModuleType:
    """tests/conformance/mutants.py, loaded by path as the driver's --load does."""
    name = "tidelog_test_mutants"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, MUTANTS_FILE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def driver_factory(
    template: str, fs: str = "os", plugin: str | None = None, http: bool = False
) -> Any:
    """A SutFactory starting tidelog's driver as a separate process (with ``http``: its stores
    served and driven over HTTP, CNF-24)."""
    command = own_driver_command(template, fs, plugin, http)
    return lambda: RemoteSut(DriverProcess(command))


def record_mutation(row: dict[str, Any]) -> None:
    """Append one mutant's result to the run's report (xdist workers share the file)."""
    path = os.environ.get(_REPORT)
    if path:
        with open(path, "a", encoding="utf-8") as f:
            f.write(json.dumps(row) + "\n")
