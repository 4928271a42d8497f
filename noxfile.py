"""Nox sessions for tidelog. Usually reached through ``python3 run.py SESSION [ARGS]``.

  tests      build + install the wheel (not editable), pytest -n auto, then a short CrossHair pass
  crash      a long crash campaign (many workloads, sampled states, SIGKILLs), seeded
  blockdev_device  the blockdev backend on loop devices (root + losetup; tests/device)
  spark_cluster  the Spark adapter on a standalone cluster, long: more SIGKILLs, drivers killed
  forward    a long store-and-forward fault campaign (proxy faults, SIGKILLs), seeded
  faults     a long I/O-fault campaign (tests/faults: fault-injecting FS, strace, libfiu), seeded
  conformance  a long conformance campaign: backends through the driver, mutants over seeds
  stateful   a long stateful campaign (TIDELOG_STATEFUL_EXAMPLES, default 20000), seeded
  crosshair  CrossHair (PEP 316 contracts) over every module of tidelog.model, bounded in time
  lint       ruff check + mypy (strict on tidelog and tidelog.model) on the installed layout
  demo       install tidelog and run ``tidelog demo ARGS``
  packaging  only tests/packaging (wheel + editable installs in fresh venvs)
  bench      install tidelog[bench] and run ``tidelog bench ARGS`` (e.g. ``--quick``)

Every session installs the project from a freshly built wheel, so what is tested is the package
layout users get (model/ -> tidelog.model, ...), never the source folders. pytest runs with
``python -P`` and PYTHONSAFEPATH=1 so ./tidelog in the repository cannot shadow the installed
package, and CrossHair/mypy run from temporary directories for the same reason.
"""

from __future__ import annotations

import os
import random
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import tomllib
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import nox

nox.options.default_venv_backend = "venv"
nox.options.reuse_existing_virtualenvs = True
nox.options.sessions = ["tests"]

ROOT = Path(__file__).resolve().parent
# Where the package's subpackages live in the source tree: pyproject.toml's one folder map.
with open(ROOT / "pyproject.toml", "rb") as _f:
    PACKAGE_FOLDERS: dict[str, str] = tomllib.load(_f)["tool"]["tidelog"]["package-folders"]
SOURCE_FOLDERS = {
    package.replace(".", "/") + "/": folder + "/"
    for package, folder in sorted(PACKAGE_FOLDERS.items(), key=lambda kv: -len(kv[0]))
}
BUILD_REQUIREMENTS = ("setuptools>=68", "wheel")

# A short pass inside `tests` (what CI runs) and a longer one for the `crosshair` session.
CROSSHAIR_SHORT = {"per_condition": 2.0, "budget": 100.0}
CROSSHAIR_LONG = {"per_condition": 10.0, "budget": 600.0}
CROSSHAIR_TARGETS = ("tidelog.model",)


def _install_project(session: nox.Session, extras: str = "") -> Path:
    """Build tidelog's wheel and install it (not editable), with ``extras`` and their deps."""
    session.install(*BUILD_REQUIREMENTS)
    dist = Path(session.create_tmp()) / "dist"
    shutil.rmtree(dist, ignore_errors=True)
    # setuptools builds in ./build: a stale copy there would put deleted modules in the wheel.
    shutil.rmtree(ROOT / "build", ignore_errors=True)
    session.run(
        "python",
        "-m",
        "pip",
        "wheel",
        "--quiet",
        "--no-deps",
        "--no-build-isolation",
        "--wheel-dir",
        str(dist),
        str(ROOT),
    )
    shutil.rmtree(ROOT / "build", ignore_errors=True)
    wheels = sorted(dist.glob("tidelog-*.whl"))
    if len(wheels) != 1:
        session.error(f"expected one tidelog wheel in {dist}, found {wheels}")
    wheel = wheels[0]
    # Dependencies first (a no-op when the reused venv already has them), then the wheel itself,
    # forced: pip would otherwise keep an older build of the same version.
    session.install(f"{wheel}[{extras}]" if extras else str(wheel))
    session.install("--no-deps", "--force-reinstall", "--quiet", str(wheel))
    return wheel


def _test_env(seed: str) -> dict[str, str]:
    return {
        "PYTHONSAFEPATH": "1",  # also for xdist workers and subprocesses: no cwd on sys.path
        "HYPOTHESIS_PROFILE": os.environ.get("HYPOTHESIS_PROFILE", "ci"),
        "TIDELOG_REQUIRE_INSTALLED": "1",
        "TIDELOG_SEED": seed,
    }


def _seed(session: nox.Session) -> str:
    """TIDELOG_SEED, or a fresh random one; either way the session prints it."""
    seed = os.environ.get("TIDELOG_SEED") or str(random.SystemRandom().randrange(2**32))
    if not seed.isdigit():
        session.error(f"TIDELOG_SEED must be a non-negative integer, got {seed!r}")
    session.log(f"Hypothesis seed: {seed}  (reproduce: TIDELOG_SEED={seed} python3 run.py tests)")
    return seed


def _float_env(name: str, default: float) -> float:
    raw = os.environ.get(name)
    if not raw:
        return default
    try:
        return float(raw)
    except ValueError:
        raise SystemExit(f"{name} must be a number of seconds, got {raw!r}") from None


def _crosshair_one(
    cmd: list[str], env: dict[str, str], timeout: float
) -> tuple[int | None, list[str]]:
    """Run one ``crosshair check``, echoing its output; (exit code or None if timed out, errors)."""
    problems: list[str] = []
    # CrossHair puts the working directory on sys.path: run it from an empty one.
    with tempfile.TemporaryDirectory(prefix="tidelog-crosshair-") as cwd:
        proc = subprocess.Popen(
            cmd,
            cwd=cwd,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )  # same process group: Ctrl-C reaches it too

        def pump() -> None:
            assert proc.stdout is not None
            for line in proc.stdout:
                sys.stdout.write(line)
                sys.stdout.flush()
                if re.search(r":\d+: error:", line):
                    problems.append(line.rstrip())

        reader = threading.Thread(target=pump, daemon=True)
        reader.start()
        try:
            proc.wait(timeout=max(timeout, 1.0))
        except subprocess.TimeoutExpired:
            proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            reader.join(timeout=10)
            return None, problems
        reader.join(timeout=10)
        return proc.returncode, problems


def _run_crosshair(
    session: nox.Session, per_condition: float, budget: float, extra_args: list[str]
) -> None:
    """CrossHair over every module under the targets, bounded by ``budget`` wall seconds.

    Fails when CrossHair reports a counterexample or any other error; passes when conditions
    merely time out, including when the whole budget runs out. CrossHair prints its findings only
    when a run ends, so each module gets its own run (a module cut off by the budget loses only
    its own findings, and that is said loudly).
    """
    options = [a for a in extra_args if a.startswith("-")]
    targets = [a for a in extra_args if not a.startswith("-")] or list(CROSSHAIR_TARGETS)
    listing = session.run(
        "python",
        "-P",
        "-c",
        "import importlib, pkgutil, sys\n"
        "for name in sys.argv[1:]:\n"
        "    mod = importlib.import_module(name)\n"
        "    print(name)\n"
        "    for info in pkgutil.walk_packages(getattr(mod, '__path__', []), name + '.'):\n"
        "        print(info.name)\n",
        *targets,
        silent=True,
        stderr=None,
        log=False,
    )
    modules = [line.strip() for line in str(listing).splitlines() if line.strip()]
    if not any(o.startswith("--analysis_kind") for o in options):
        options.append("--analysis_kind=PEP316")
    if not any(o.startswith("--per_condition_timeout") for o in options):
        options.append(f"--per_condition_timeout={per_condition:g}")
    crosshair = os.path.join(str(session.bin), "crosshair")
    session.log(
        f"crosshair check {' '.join(options)}: {len(modules)} module(s), budget {budget:g}s"
    )
    env = dict(
        os.environ,
        PYTHONSAFEPATH="1",
        PYTHONUNBUFFERED="1",
        VIRTUAL_ENV=str(Path(str(session.bin)).parent),
        PATH=os.pathsep.join([str(session.bin), os.environ.get("PATH", "")]),
    )
    jobs = max(1, min(len(modules), int(_float_env("TIDELOG_CROSSHAIR_JOBS", os.cpu_count() or 1))))
    problems: list[str] = []
    failures: list[str] = []
    cut_off: list[str] = []
    start = time.monotonic()
    deadline = start + budget

    def check(module: str) -> None:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            cut_off.append(module)
            return
        began = time.monotonic()
        code, found = _crosshair_one([crosshair, "check", *options, module], env, remaining)
        took = time.monotonic() - began
        problems.extend(found)
        if code is None:
            cut_off.append(module)
            session.warn(f"crosshair: {module}: cut off by the budget after {took:.0f}s")
            return
        session.log(f"crosshair: {module}: exit {code} in {took:.0f}s")
        if code != 0 and not found:
            failures.append(f"{module} (exit {code}: 2 = import or other error)")

    # Modules run in parallel (TIDELOG_CROSSHAIR_JOBS, default one per core); the budget is wall
    # time for the whole pass.
    with ThreadPoolExecutor(max_workers=jobs) as pool:
        list(pool.map(check, modules))
    complete = not cut_off
    if cut_off:
        session.warn(
            f"crosshair: budget of {budget:g}s used up; NOT (fully) checked, findings lost: "
            + ", ".join(sorted(cut_off))
            + " (raise TIDELOG_CROSSHAIR_BUDGET, or run `python3 run.py crosshair`)"
        )
    elapsed = time.monotonic() - start
    if problems or failures:
        session.error(
            f"crosshair: {len(problems)} counterexample(s)/error(s)"
            + (f", failed runs: {', '.join(failures)}" if failures else "")
            + f" in {elapsed:.0f}s (see above)"
        )
    if complete:
        session.log(
            f"crosshair: no counterexample in {elapsed:.0f}s "
            "(bounded search per condition, not a proof)"
        )
    else:
        session.log(
            f"crosshair: budget of {budget:g}s used up after {elapsed:.0f}s with no "
            "counterexample reported; passing (only a time-out, see warnings above)"
        )


def _pytest(session: nox.Session, seed: str, *args: str, **extra_env: str) -> None:
    """pytest from the installed wheel (``-P``: ./tidelog must not shadow it), seeded."""
    session.run(
        "python", "-P", "-m", "pytest", "-n", "auto", f"--hypothesis-seed={seed}", *args,
        env={**_test_env(seed), **extra_env},
    )  # fmt: skip


def _report_file(session: nox.Session, name: str) -> str:
    """A fresh file in the session's tmp dir that tests append their counts to."""
    report = os.path.join(session.create_tmp(), name)
    if os.path.exists(report):
        os.unlink(report)
    return report


def _forward_report(session: nox.Session) -> str:
    """A fresh file the store-and-forward fault tests append one JSON line per scenario to."""
    return _report_file(session, "forward-faults.jsonl")


def _log_forward_faults(session: nox.Session, report: str, seed: str) -> None:
    """Sum what tests/stateful/test_forward.py injected (spec/FORWARD.md)."""
    if not os.path.exists(report):
        return
    import json
    from collections import Counter

    kinds: Counter[str] = Counter()
    faults: Counter[str] = Counter()
    with open(report, encoding="utf-8") as f:
        for line in f:
            doc = json.loads(line)
            kinds[doc["kind"]] += 1
            faults.update(doc["faults"])
    injected = sum(n for k, n in faults.items() if not k.startswith("observed:"))
    session.log(
        f"forward fault campaign (seed {seed}): "
        + ", ".join(f"{n} {kind}s" for kind, n in sorted(kinds.items()))
        + f", {injected} faults injected: "
        + ", ".join(f"{k} x{v}" for k, v in sorted(faults.items()))
    )


def _damage_report(session: nox.Session) -> str:
    """A fresh file the damage fuzzers append one JSON line per run to (damage_report.py)."""
    return _report_file(session, "damage-report.jsonl")


def _log_damage(session: nox.Session, report: str, what: str) -> None:
    """Sum what the damage fuzzers checked (spec/SPEC.md FLT-1, FLT-2)."""
    if not os.path.exists(report):
        return
    import json

    with open(report, encoding="utf-8") as f:
        rows = [json.loads(line) for line in f if line.strip()]
    cases, refused, failures = (
        sum(int(r[k]) for r in rows) for k in ("cases", "refused", "failures")
    )
    session.log(
        f"{what}: {cases} damaged copies over {len(rows)} runs (file stores, SF slots, rings): "
        f"{refused} refused as corrupt (file stores and rings then repaired and checked), the "
        f"rest intact or tombstoned; {failures} silent losses, reused seqs or untyped errors"
    )


def _fault_report(session: nox.Session) -> str:
    """A fresh file the I/O-fault tests (tests/faults) append one line per campaign to."""
    return _report_file(session, "fault-report.tsv")


def _log_fault_campaign(session: nox.Session, report: str, what: str) -> None:
    """Sum what tests/faults checked (spec/SPEC.md FLT): cases, faults, recovered states."""
    if not os.path.exists(report):
        return
    with open(report, encoding="utf-8") as f:
        rows = [line.rstrip("\n").split("\t") for line in f if "\t" in line]
    cases, injected, states, failing = (sum(int(r[i]) for r in rows) for i in range(1, 5))
    session.log(
        f"{what}: {cases} cases over {len(rows)} workloads, {injected} faults injected, "
        f"{states} recovered states checked, {failing} failing (lost, reused or untyped)"
    )


@nox.session
def tests(session: nox.Session) -> None:
    """Full suite from the installed wheel, then a short bounded CrossHair pass (CI runs this)."""
    _install_project(session, "test,spark")
    seed = _seed(session)
    print(
        f"tidelog: hypothesis seed {seed}; reproduce with TIDELOG_SEED={seed} python3 run.py tests",
        flush=True,
    )
    report = _forward_report(session)
    faults = _fault_report(session)
    damage = _damage_report(session)
    _pytest(
        session, seed, *session.posargs, TIDELOG_FORWARD_REPORT=report, TIDELOG_FORBID_SKIPS="1",
        TIDELOG_FAULT_REPORT=faults, TIDELOG_DAMAGE_REPORT=damage,
    )  # fmt: skip
    _log_forward_faults(session, report, seed)
    _log_fault_campaign(session, faults, "I/O fault enumeration (tests/faults)")
    _log_damage(session, damage, "damage fuzzers")
    if session.posargs:
        session.log("crosshair pass skipped: pytest was given arguments (a partial run)")
    elif os.environ.get("TIDELOG_SKIP_CROSSHAIR") == "1":
        session.log("crosshair pass skipped: TIDELOG_SKIP_CROSSHAIR=1")
    else:
        _run_crosshair(
            session,
            per_condition=_float_env("TIDELOG_CROSSHAIR_TIMEOUT", CROSSHAIR_SHORT["per_condition"]),
            budget=_float_env("TIDELOG_CROSSHAIR_BUDGET", CROSSHAIR_SHORT["budget"]),
            extra_args=[],
        )


@nox.session
def stateful(session: nox.Session) -> None:
    """A long stateful campaign (backends vs the model): TIDELOG_STATEFUL_EXAMPLES (default
    20000) examples per machine, with a printed, reproducible seed. ARGS go to pytest."""
    _install_project(session, "test")
    seed = _seed(session)
    examples = os.environ.get("TIDELOG_STATEFUL_EXAMPLES", "20000")
    _pytest(
        session,
        seed,
        "--hypothesis-show-statistics",
        "tests/stateful",
        *session.posargs,
        TIDELOG_STATEFUL_EXAMPLES=examples,
    )


@nox.session
def crash(session: nox.Session) -> None:
    """A long crash campaign: many seeded random workloads with many sampled crash states each,
    and many SIGKILLs of a live writer (TIDELOG_CRASH_WORKLOADS, TIDELOG_CRASH_SAMPLES,
    TIDELOG_SIGKILL_RUNS override the sizes). The printed seed reproduces it."""
    _install_project(session, "test")
    seed = _seed(session)
    sizes = {
        "TIDELOG_CRASH_WORKLOADS": os.environ.get("TIDELOG_CRASH_WORKLOADS", "60"),
        "TIDELOG_CRASH_SAMPLES": os.environ.get("TIDELOG_CRASH_SAMPLES", "40"),
        "TIDELOG_SIGKILL_RUNS": os.environ.get("TIDELOG_SIGKILL_RUNS", "200"),
    }
    report = os.path.join(session.create_tmp(), "crash-report.tsv")
    if os.path.exists(report):
        os.unlink(report)
    _pytest(session, seed, "tests/crash", *session.posargs, TIDELOG_CRASH_REPORT=report, **sizes)
    if os.path.exists(report):
        with open(report, encoding="utf-8") as f:
            counts = [int(line.split("\t")[1]) for line in f if "\t" in line]
        session.log(
            f"crash campaign: {sum(counts)} crash states recovered and checked "
            f"over {len(counts)} workloads (seed {seed})"
        )


@nox.session
def spark_cluster(session: nox.Session) -> None:
    """The Spark adapter on a standalone cluster on 127.0.0.1 (tests/spark/cluster.py), with the
    long runs the default suite leaves out (tests/spark/test_cluster_long.py: workers SIGKILLed
    at more points, drivers killed; test_cluster_stale.py: a worker whose view of the store is
    an older copy, in a mount namespace of its own, so it needs root), then the default cluster
    test. Java is required; one test
    at a time (a cluster per module uses both cores). ARGS go to pytest."""
    _install_project(session, "test,spark")
    seed = _seed(session)
    _pytest(
        session, seed, "tests/spark/test_cluster_long.py", "tests/spark/test_cluster_stale.py",
        "tests/spark/test_cluster.py",
        "-n", "0", *session.posargs, TIDELOG_SPARK_CLUSTER_LONG="1", TIDELOG_FORBID_SKIPS="1",
    )  # fmt: skip


@nox.session
def blockdev_device(session: nox.Session) -> None:
    """The blockdev backend on real block devices (tests/device: loop devices, so root and
    losetup are required; a missing one fails the session). The default suite runs the same code
    paths on image files instead. ARGS go to pytest."""
    _install_project(session, "test")
    seed = _seed(session)
    _pytest(session, seed, "tests/device", *session.posargs, TIDELOG_DEVICE_TESTS="1")


@nox.session
def forward(session: nox.Session) -> None:
    """A long store-and-forward fault campaign (tests/stateful/test_forward.py): many seeded
    scenarios through the fault-injecting proxy and many SIGKILLs (TIDELOG_FORWARD_SCENARIOS,
    default 400; TIDELOG_FORWARD_STEPS, 30; TIDELOG_FORWARD_KILLS, 25). The scenario seeds are
    TIDELOG_FORWARD_SEED + 0, 1, ...; TIDELOG_FORWARD_SEED defaults to the printed run seed."""
    _install_project(session, "test")
    seed = _seed(session)
    report = _forward_report(session)
    sizes = {
        "TIDELOG_FORWARD_SCENARIOS": os.environ.get("TIDELOG_FORWARD_SCENARIOS", "400"),
        "TIDELOG_FORWARD_STEPS": os.environ.get("TIDELOG_FORWARD_STEPS", "30"),
        "TIDELOG_FORWARD_KILLS": os.environ.get("TIDELOG_FORWARD_KILLS", "25"),
        "TIDELOG_FORWARD_SEED": os.environ.get("TIDELOG_FORWARD_SEED", seed),
    }
    session.log(f"forward campaign: {sizes}")
    _pytest(
        session, seed, "tests/stateful/test_forward.py", *session.posargs,
        TIDELOG_FORWARD_REPORT=report, **sizes,
    )  # fmt: skip
    _log_forward_faults(session, report, sizes["TIDELOG_FORWARD_SEED"])


def _ensure_tool(session: nox.Session, tool: str, package: str) -> None:
    """Install Debian's ``package`` when ``tool`` is missing (root only); the tests that need a
    tool still missing skip that part and print why."""
    if shutil.which(tool):
        return
    if os.geteuid() != 0 or not shutil.which("apt-get"):
        session.warn(f"{tool} missing and not installable here (apt-get install {package})")
        return
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    for cmd in (["apt-get", "update", "-qq"], ["apt-get", "install", "-y", "-qq", package]):
        got = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=900)
        if got.returncode != 0:
            session.warn(f"{' '.join(cmd)} failed: {got.stderr.strip()[-300:]}")
            return
    session.log(f"installed {package} ({tool})")


@nox.session
def faults(session: nox.Session) -> None:
    """A long I/O-fault campaign (tests/faults, spec/SPEC.md FLT): seeded random file://
    workloads with every I/O call x every fault and random faults through the fault-injecting FS
    (TIDELOG_FAULT_WORKLOADS, default 24; TIDELOG_FAULT_RANDOM, 40; TIDELOG_FAULT_SAMPLES crash
    states each, 4), then the same checks through strace's --inject and libfiu (fiu-run) around
    an unmodified process (TIDELOG_FAULT_REAL runs each, 60; installed with apt-get if missing,
    else that part is skipped with the reason printed). TIDELOG_FAULT_SEED defaults to the
    printed run seed."""
    _install_project(session, "test")
    seed = _seed(session)
    _ensure_tool(session, "strace", "strace")
    _ensure_tool(session, "fiu-run", "fiu-utils")
    report = _fault_report(session)
    sizes = {
        "TIDELOG_FAULT_WORKLOADS": os.environ.get("TIDELOG_FAULT_WORKLOADS", "24"),
        "TIDELOG_FAULT_RANDOM": os.environ.get("TIDELOG_FAULT_RANDOM", "40"),
        "TIDELOG_FAULT_SAMPLES": os.environ.get("TIDELOG_FAULT_SAMPLES", "4"),
        "TIDELOG_FAULT_REAL": os.environ.get("TIDELOG_FAULT_REAL", "60"),
        "TIDELOG_FAULT_SEED": os.environ.get("TIDELOG_FAULT_SEED", seed),
    }
    session.log(f"fault campaign: {sizes}")
    _pytest(
        session, seed, "tests/faults", *session.posargs, TIDELOG_FAULT_CAMPAIGN="1",
        TIDELOG_FAULT_REPORT=report, **sizes,
    )  # fmt: skip
    _log_fault_campaign(session, report, f"fault campaign (seed {sizes['TIDELOG_FAULT_SEED']})")


@nox.session
def damage(session: nox.Session) -> None:
    """A long damage campaign (spec/SPEC.md FLT-1, FLT-2; FORMATS.md REP): the seeded
    corruption fuzzers over every file of a file:// store (each refused case repaired and
    checked again), an SF slot and a blockdev ring image, with TIDELOG_DAMAGE_CASES (default
    3000) cases per store variant and per SF durability. TIDELOG_DAMAGE_SEED defaults to the
    printed run seed; a failing case names its seed and index."""
    _install_project(session, "test")
    seed = _seed(session)
    cases = os.environ.get("TIDELOG_DAMAGE_CASES", "3000")
    damage_seed = os.environ.get("TIDELOG_DAMAGE_SEED", seed)
    session.log(f"damage campaign: {cases} cases per variant, seed {damage_seed}")
    damage = _damage_report(session)
    _pytest(
        session, seed, "tests/unit/test_store_damage.py", "tests/unit/test_sf_damage.py",
        "tests/unit/test_blockdev_damage.py", "-s", *session.posargs,
        TIDELOG_DAMAGE_CASES=cases, TIDELOG_DAMAGE_SEED=damage_seed,
        TIDELOG_SF_DAMAGE_CASES=cases, TIDELOG_SF_DAMAGE_SEED=damage_seed,
        TIDELOG_DAMAGE_REPORT=damage,
    )  # fmt: skip
    _log_damage(session, damage, f"damage campaign (seed {damage_seed})")


@nox.session
def conformance(session: nox.Session) -> None:
    """A long conformance campaign (spec/CONFORMANCE.md): tidelog's backends through its driver
    at every level with TIDELOG_CONFORMANCE_EXAMPLES (default 300) examples, the kit on every
    backend, and every mutant over TIDELOG_MUTANT_SEEDS (default 5) consecutive seeds from the
    printed one (the catch rate and time to first failure are reported). ARGS go to pytest."""
    _install_project(session, "test")
    seed = _seed(session)
    _pytest(
        session,
        seed,
        "tests/conformance",
        *session.posargs,
        TIDELOG_CONFORMANCE_EXAMPLES=os.environ.get("TIDELOG_CONFORMANCE_EXAMPLES", "300"),
        TIDELOG_MUTANT_SEEDS=os.environ.get("TIDELOG_MUTANT_SEEDS", "5"),
    )


@nox.session
def crosshair(session: nox.Session) -> None:
    """CrossHair over tidelog.model; ARGS may name other targets or add crosshair options."""
    _install_project(session, "test")
    _run_crosshair(
        session,
        per_condition=_float_env("TIDELOG_CROSSHAIR_TIMEOUT", CROSSHAIR_LONG["per_condition"]),
        budget=_float_env("TIDELOG_CROSSHAIR_BUDGET", CROSSHAIR_LONG["budget"]),
        extra_args=list(session.posargs),
    )


@nox.session
def packaging(session: nox.Session) -> None:
    """Only tests/packaging: the wheel and an editable install, each in a fresh venv."""
    _install_project(session, "test")
    seed = _seed(session)
    session.run(
        "python", "-P", "-m", "pytest", "tests/packaging", *session.posargs, env=_test_env(seed)
    )


@nox.session
def lint(session: nox.Session) -> None:
    """ruff check on the tree (ARGS go to ruff, e.g. `--fix`), then mypy on the installed package
    (mypy cannot follow the editable import hook). Both always run; it fails if either fails."""
    session.install("ruff>=0.5", "mypy>=1.10")
    _install_project(session, "test")  # the conformance kit imports hypothesis and pytest
    failed: list[str] = []
    ruff_args = list(session.posargs) or ["."]
    ruff_cmd = [os.path.join(str(session.bin), "ruff"), "check", *ruff_args]
    session.log(" ".join(ruff_cmd[1:]))
    if subprocess.run(ruff_cmd, cwd=ROOT).returncode != 0:
        failed.append("ruff")

    installed = session.run(
        "python",
        "-P",
        "-c",
        "import importlib.util as u; print(u.find_spec('tidelog').submodule_search_locations[0])",
        silent=True,
        stderr=None,
        log=False,
    )
    package = Path(str(installed).strip())
    src = Path(session.create_tmp()).resolve() / "mypy-src"
    shutil.rmtree(src, ignore_errors=True)
    # Copy the installed tree (copy2 keeps mtimes, so mypy's cache stays warm) and check it
    # from its own directory: the wheel layout, without needing a py.typed marker.
    shutil.copytree(package, src / "tidelog", ignore=shutil.ignore_patterns("__pycache__"))
    cmd = [
        os.path.join(str(session.bin), "mypy"),
        "--config-file",
        str(ROOT / "pyproject.toml"),
        "--cache-dir",
        str(src.parent / "mypy-cache"),
        "-p",
        "tidelog",
    ]
    session.log(" ".join(cmd) + f"  (in {src})")
    mypy = subprocess.run(cmd, cwd=src, capture_output=True, text=True)
    for line in (mypy.stdout + mypy.stderr).splitlines():
        for installed_prefix, source_prefix in SOURCE_FOLDERS.items():
            if line.startswith(installed_prefix):
                line = source_prefix + line[len(installed_prefix) :]
                break
        print(line)
    if mypy.returncode != 0:
        failed.append("mypy")
    if failed:
        session.error(f"lint failed: {', '.join(failed)}")


@nox.session
def demo(session: nox.Session) -> None:
    """Install tidelog (wheel, not editable) and run the demo pipeline: ``tidelog demo ARGS``."""
    _install_project(session, "spark")
    session.run("tidelog", "demo", *session.posargs)


@nox.session
def bench(session: nox.Session) -> None:
    """Install tidelog with the `bench` extra (the peers, matplotlib) and run ``tidelog bench
    ARGS`` from an empty directory; results go to ./bench-results unless ``--out`` says."""
    _install_project(session, "bench")
    args = list(session.posargs)
    if not any(a == "--out" or a.startswith("--out=") for a in args):
        args += ["--out", str(ROOT / "bench-results")]
    with tempfile.TemporaryDirectory(prefix="tidelog-bench-cwd-") as cwd, session.chdir(cwd):
        session.run("tidelog", "bench", *args, env={"PYTHONSAFEPATH": "1"})
