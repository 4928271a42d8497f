#!/usr/bin/env python3
"""One-command set-up and entry point for tidelog development (standard library only).

    python3 run.py demo      # run the demo pipeline (the main job)
    python3 run.py tests     # run the whole test suite (what CI runs)

On first use it creates ./.venv (venv module) and installs nox into it; after that it only
runs ``.venv/bin/nox -s <session> -- <args>``. Each nox session builds its own virtualenv under
./.nox and installs tidelog and what that session needs (see noxfile.py).
"""

from __future__ import annotations

import os
import subprocess
import sys

MIN_PYTHON = (3, 11)
NOX_REQUIREMENT = "nox>=2024.3"
ROOT = os.path.dirname(os.path.abspath(__file__))
VENV = os.path.join(ROOT, ".venv")
BIN = os.path.join(VENV, "Scripts" if os.name == "nt" else "bin")
EXE = ".exe" if os.name == "nt" else ""
VENV_PYTHON = os.path.join(BIN, "python" + EXE)
VENV_NOX = os.path.join(BIN, "nox" + EXE)

HELP = """\
usage: python3 run.py COMMAND [ARGS...]

Set-up is automatic: the first run creates ./.venv with nox in it, and every
session installs tidelog and its own dependencies into ./.nox/<session>.

commands (nox sessions, see noxfile.py):
  demo         install tidelog and run `tidelog demo ARGS`
  tests        build + install the wheel, run pytest -n auto ARGS, then a short
               bounded CrossHair pass over tidelog.model (what CI runs)
  crosshair    CrossHair contract check of tidelog.model (longer budget)
  lint         ruff check + mypy (strict on tidelog and tidelog.model)
  packaging    only tests/packaging (wheel + editable install checks)
  bench        benchmarks vs the disk's limits and the Python peers
               (`python3 run.py bench --quick`; results in bench-results/)
  stateful, crash, forward, conformance, faults, damage
               long seeded campaigns (stateful suite, crash simulation,
               forwarder fault injection, conformance levels + mutants,
               I/O faults: fault-injecting FS, strace, libfiu; damaged
               files: corruption fuzzers over stores, slots and rings)
  blockdev_device  the blockdev backend on loop devices (root + losetup)
  spark_cluster  the Spark adapter on a standalone cluster on 127.0.0.1:
               workers SIGKILLed at more points, drivers killed (Java)
  SESSION      any other nox session in noxfile.py

other:
  list         list the nox sessions
  nox ARGS     run nox itself with raw ARGS (e.g. `python3 run.py nox -s lint -r`)
  -h, --help   show this help

ARGS go to the session (e.g. `python3 run.py tests -k uri -x`); a leading
`--` is optional. Environment knobs: TIDELOG_SEED (Hypothesis seed for
`tests`), HYPOTHESIS_MAX_EXAMPLES, TIDELOG_CROSSHAIR_TIMEOUT (per condition, s),
TIDELOG_CROSSHAIR_BUDGET (whole pass, s), TIDELOG_CROSSHAIR_JOBS (parallel
modules, default one per core), TIDELOG_SKIP_CROSSHAIR=1.
"""


def fail(message: str, code: int = 2) -> None:
    sys.stderr.write(f"run.py: error: {message}\n")
    sys.exit(code)


def say(message: str) -> None:
    sys.stderr.write(f"run.py: {message}\n")
    sys.stderr.flush()


def venv_works() -> bool:
    if not os.path.exists(VENV_PYTHON):
        return False
    try:
        probe = subprocess.run(
            [VENV_PYTHON, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
            capture_output=True,
            text=True,
            timeout=60,
        )
    except OSError:
        return False
    if probe.returncode != 0:
        return False
    major, minor = (int(part) for part in probe.stdout.strip().split("."))
    if (major, minor) < MIN_PYTHON:
        say(f"{VENV} has Python {major}.{minor}; tidelog needs >= {MIN_PYTHON[0]}.{MIN_PYTHON[1]}")
        return False
    return True


def ensure_venv() -> None:
    if venv_works():
        return
    try:
        import venv
    except ImportError:
        fail("this Python has no `venv` module (on Debian/Ubuntu: apt-get install python3-venv)")
    if os.path.exists(VENV):
        say(f"{VENV} exists but its Python does not run; recreating it")
    else:
        say(f"creating {VENV}")
    try:
        venv.EnvBuilder(with_pip=True, clear=True).create(VENV)
    except Exception as exc:  # ensurepip missing, read-only tree, ...
        fail(
            f"could not create {VENV}: {exc}\n"
            "  (is `ensurepip` available? on Debian/Ubuntu: apt-get install python3-venv)"
        )
    if not venv_works():
        fail(f"created {VENV} but {VENV_PYTHON} does not run")


def ensure_nox() -> None:
    if os.path.exists(VENV_NOX):
        return
    say(f"installing {NOX_REQUIREMENT} into {VENV}")
    cmd = [
        VENV_PYTHON,
        "-m",
        "pip",
        "install",
        "--quiet",
        "--upgrade",
        "--disable-pip-version-check",
        NOX_REQUIREMENT,
    ]
    result = subprocess.run(cmd)
    if result.returncode != 0 or not os.path.exists(VENV_NOX):
        fail(
            f"installing nox failed (exit {result.returncode}): {' '.join(cmd)}\n"
            "  (is PyPI reachable? pip honours PIP_INDEX_URL / pip.conf)"
        )


def run_nox(nox_args: list[str]) -> None:
    cmd = [VENV_NOX, "--noxfile", os.path.join(ROOT, "noxfile.py"), *nox_args]
    sys.stdout.flush()
    sys.stderr.flush()
    if os.name == "nt":
        sys.exit(subprocess.call(cmd))
    os.execv(cmd[0], cmd)


def main(argv: list[str]) -> None:
    if sys.version_info < MIN_PYTHON:
        wanted = ".".join(map(str, MIN_PYTHON))
        fail(
            f"tidelog needs Python >= {wanted}; this is {sys.version.split()[0]} ({sys.executable})"
        )
    if not argv or argv[0] in ("-h", "--help", "help"):
        sys.stdout.write(HELP)
        sys.exit(0 if argv else 2)
    command, rest = argv[0], argv[1:]
    if command.startswith("-"):
        fail(f"unknown option {command!r}; try `python3 run.py --help`")
    os.chdir(ROOT)
    if not os.path.exists(os.path.join(ROOT, "noxfile.py")):
        fail(f"no noxfile.py next to run.py in {ROOT}")
    ensure_venv()
    ensure_nox()
    if command == "nox":
        run_nox(rest)
    if command == "list":
        run_nox(["--list"])
    if rest[:1] == ["--"]:
        rest = rest[1:]
    run_nox(["-s", command, "--", *rest] if rest else ["-s", command])


if __name__ == "__main__":
    main(sys.argv[1:])
