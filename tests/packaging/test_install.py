"""The one `tidelog` distribution installs correctly, as a wheel and as an editable install.

The brief fixes the top level (model/, backends/, adapters/ next to tidelog/) and requires them to
import as tidelog.model, tidelog.backends, tidelog.adapters; setup.py maps the folders. This test
proves both install modes against fresh virtual environments:

* the wheel holds exactly the package's files (nothing forgotten, e.g. a folder without
  ``__init__.py``; nothing top-level besides ``tidelog``);
* in a fresh venv, from an empty working directory, every module of the package resolves inside
  that venv (wheel) or inside the mapped source folder (editable), and imports;
* a bare ``import model`` / ``backends`` / ``adapters`` fails: no top-level leak.

Offline by design: the fresh venvs see the running environment's third-party packages through a
folder of symlinks (without tidelog itself), and builds use ``--no-build-isolation``. A module whose
import needs a package from an optional extra that is not installed (e.g. pyspark) is still
located, and reported as a warning instead of being imported.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import tomllib
import warnings
import zipfile
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]
# Package -> source folder: pyproject.toml's one map, which setup.py builds from.
with open(REPO / "pyproject.toml", "rb") as _f:
    ROOTS: dict[str, str] = tomllib.load(_f)["tool"]["tidelog"]["package-folders"]
MUST_RESOLVE = [
    "tidelog",
    "tidelog.model",
    "tidelog.backends.memory",
    "tidelog.backends.file",
    "tidelog.backends.blockdev",
    "tidelog.adapters.spark",
    "tidelog.bench",
]
MUST_NOT_IMPORT = ["model", "backends", "adapters", "bench"]
IGNORED_NAMES = {"__pycache__", ".DS_Store"}
IGNORED_SUFFIXES = (".pyc", ".pyo")
TIMEOUT = 300

# Runs inside the fresh venv: locate every module without executing it (the same finders import
# uses, walked level by level), then import it, then try the bare top-level names.
PROBE = r"""
import importlib, json, sys, traceback
modules, optional_tops, bare = json.loads(sys.argv[1])

def locate(name):
    path, spec = None, None
    parts = name.split(".")
    for i in range(len(parts)):
        full = ".".join(parts[: i + 1])
        for finder in sys.meta_path:
            find_spec = getattr(finder, "find_spec", None)
            spec = find_spec(full, path) if find_spec else None
            if spec is not None:
                break
        else:
            return None
        path = spec.submodule_search_locations
    return spec.origin

out = {"located": {}, "imported": {}, "optional_missing": {}, "errors": {}, "leaks": {},
       "sys_path": sys.path, "prefix": sys.prefix}
for name in modules:
    out["located"][name] = locate(name)
    try:
        out["imported"][name] = importlib.import_module(name).__file__
    except ModuleNotFoundError as exc:
        if (exc.name or "").split(".")[0] in optional_tops:
            out["optional_missing"][name] = exc.name
        else:
            out["errors"][name] = traceback.format_exc()
    except BaseException:
        out["errors"][name] = traceback.format_exc()
for name in bare:
    try:
        out["leaks"][name] = getattr(importlib.import_module(name), "__file__", None) or "?"
    except ModuleNotFoundError:
        pass
print(json.dumps(out))
"""


# ----------------------------------------------------------------------------- helpers


def run(cmd: Sequence[str | Path], *, cwd: Path | None = None, what: str) -> str:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    try:
        proc = subprocess.run(
            [str(c) for c in cmd], cwd=cwd, env=env, capture_output=True, text=True, timeout=TIMEOUT
        )
    except FileNotFoundError as exc:
        pytest.fail(f"{what}: cannot run {cmd[0]}: {exc}")
    except subprocess.TimeoutExpired:
        pytest.fail(f"{what}: timed out after {TIMEOUT}s: {' '.join(map(str, cmd))}")
    if proc.returncode != 0:
        pytest.fail(
            f"{what} failed (exit {proc.returncode}): {' '.join(map(str, cmd))}\n"
            f"--- stdout\n{proc.stdout}\n--- stderr\n{proc.stderr}"
        )
    return proc.stdout


def require_tools() -> None:
    """Fail (never skip) with a clear message when the build tooling is missing."""
    problems = []
    for dist, minimum in (("pip", (22, 3)), ("setuptools", (68,)), ("wheel", (0,))):
        try:
            version = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            problems.append(f"{dist} is not installed")
            continue
        numbers = tuple(int(n) for n in re.findall(r"\d+", version)[: len(minimum)])
        if numbers < minimum:
            problems.append(f"{dist} {version} is too old (need >= {'.'.join(map(str, minimum))})")
    if problems:
        pytest.fail(
            "packaging test needs pip>=22.3, setuptools>=68 and wheel in the test "
            f"environment ({sys.executable}): "
            + "; ".join(problems)
            + ". Install the `test` extra: pip install '.[test]'"
        )


def source_files() -> dict[str, Path]:
    """Every file the package should ship, as its path inside the wheel -> source path."""
    files: dict[str, Path] = {}
    for package, folder in ROOTS.items():
        base = REPO / folder
        prefix = package.replace(".", "/")
        for path in base.rglob("*"):
            rel = path.relative_to(base)
            if (
                path.is_dir()
                or IGNORED_NAMES & set(rel.parts)
                or path.name.endswith(IGNORED_SUFFIXES)
            ):
                continue
            # A nested root (tidelog.model inside tidelog/) is never also under tidelog/.
            files[f"{prefix}/{rel.as_posix()}"] = path
    return files


def module_name(wheel_path: str) -> str | None:
    if not wheel_path.endswith(".py"):
        return None
    parts = wheel_path[: -len(".py")].split("/")
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def optional_import_names(metadata: str) -> list[str]:
    """Top-level import names of distributions that only an extra pulls in (pyspark, ...)."""
    core: set[str] = set()
    optional: set[str] = set()
    for line in metadata.splitlines():
        if not line.startswith("Requires-Dist:"):
            continue
        requirement = line.split(":", 1)[1].strip()
        name = re.match(r"[A-Za-z0-9._-]+", requirement)
        if name is None:
            continue
        normalized = re.sub(r"[-_.]+", "_", name.group(0)).lower()
        (optional if "extra ==" in requirement else core).add(normalized)
    return sorted(optional - core - {"tidelog"})


def make_venv(path: Path, deps: Path) -> Path:
    """A fresh venv (no pip of its own) that sees the current environment's third-party
    packages through ``deps`` and nothing of tidelog."""
    run([sys.executable, "-m", "venv", "--without-pip", path], what="creating a venv")
    python = path / ("Scripts/python.exe" if os.name == "nt" else "bin/python")
    purelib = run(
        [python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        what="asking the venv for its site-packages",
    ).strip()
    (Path(purelib) / "_tidelog_test_deps.pth").write_text(f"{deps}\n")
    return python


def pip_into(python: Path, *args: str | Path, what: str) -> None:
    run(
        [
            sys.executable,
            "-m",
            "pip",
            "--python",
            python,
            "install",
            "--no-index",
            "--no-deps",
            "--disable-pip-version-check",
            *args,
        ],
        what=what,
    )


def probe(python: Path, cwd: Path, modules: list[str], optional: list[str]) -> dict[str, Any]:
    cwd.mkdir(parents=True, exist_ok=True)
    out = run(
        [python, "-c", PROBE, json.dumps([modules, optional, MUST_NOT_IMPORT])],
        cwd=cwd,
        what="importing every module in the fresh venv",
    )
    result: dict[str, Any] = json.loads(out.strip().splitlines()[-1])
    return result


def check_probe(result: dict[str, Any], expected: dict[str, Path], label: str) -> None:
    problems = []
    for name, want in sorted(expected.items()):
        located = result["located"].get(name)
        if located is None:
            problems.append(f"{name}: not found at all")
            continue
        if Path(located).resolve() != want.resolve():
            problems.append(f"{name}: resolves to {located}, expected {want}")
        imported = result["imported"].get(name)
        if imported is not None and Path(imported).resolve() != want.resolve():
            problems.append(f"{name}: imported from {imported}, expected {want}")
    for name, tb in sorted(result["errors"].items()):
        problems.append(f"{name}: import failed:\n{tb}")
    for name, where in sorted(result["leaks"].items()):
        problems.append(f"bare `import {name}` works ({where}): a top-level package leaked")
    if problems:
        pytest.fail(
            f"{label}:\n  "
            + "\n  ".join(problems)
            + f"\n  (venv {result['prefix']}, sys.path {result['sys_path']})"
        )
    if result["optional_missing"]:
        warnings.warn(
            f"{label}: located but not imported, an optional extra is not installed: "
            + ", ".join(
                f"{m} (needs {dep})" for m, dep in sorted(result["optional_missing"].items())
            ),
            stacklevel=1,
        )


# ----------------------------------------------------------------------------- fixtures


@pytest.fixture(scope="module")
def deps_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Symlinks to everything in this environment's site-packages except tidelog itself."""
    require_tools()
    deps = tmp_path_factory.mktemp("deps")
    paths = sysconfig.get_paths()
    for site in dict.fromkeys([paths["purelib"], paths["platlib"]]):
        for entry in Path(site).iterdir():
            name = entry.name.lower()
            if (
                name.startswith(("tidelog", "__editable__"))
                or name.endswith(".pth")
                or name == "__pycache__"
                or (deps / entry.name).exists()
            ):
                continue
            (deps / entry.name).symlink_to(entry, target_is_directory=entry.is_dir())
    return deps


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The wheel, built offline from a copy of the tree (a stale ./build can't leak into it)."""
    require_tools()
    stage = tmp_path_factory.mktemp("stage")
    for entry in REPO.iterdir():
        if entry.is_file():
            shutil.copy2(entry, stage / entry.name)
    for folder in ROOTS.values():
        shutil.copytree(
            REPO / folder, stage / folder, ignore=shutil.ignore_patterns("__pycache__", "*.pyc")
        )
    dist = tmp_path_factory.mktemp("dist")
    run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "--no-index",
            "--disable-pip-version-check",
            "--wheel-dir",
            dist,
            stage,
        ],
        what="building the wheel",
    )
    wheels = list(dist.glob("tidelog-*.whl"))
    assert len(wheels) == 1, f"expected one tidelog wheel, got {wheels}"
    return wheels[0]


@pytest.fixture
def workdir(tmp_path: Path) -> Iterator[Path]:
    cwd = tmp_path / "empty-cwd"
    cwd.mkdir()
    yield cwd


# ----------------------------------------------------------------------------- tests


def test_wheel_contents_match_the_source_tree(wheel: Path) -> None:
    with zipfile.ZipFile(wheel) as zf:
        names = [n for n in zf.namelist() if not n.endswith("/")]
    dist_info = {n for n in names if n.split("/")[0].endswith(".dist-info")}
    shipped = {n for n in names if n not in dist_info}
    tops = {n.split("/")[0] for n in names}
    assert tops == {"tidelog", next(iter(dist_info)).split("/")[0]}, (
        f"the wheel must hold only tidelog/ and its .dist-info, got {sorted(tops)}"
    )
    expected = set(source_files())
    missing, extra = sorted(expected - shipped), sorted(shipped - expected)
    assert not missing, (
        "files in the source tree but not in the wheel (a folder without __init__.py, or a data "
        f"file needing package_data in setup.py): {missing}"
    )
    assert not extra, f"files in the wheel with no source: {extra}"
    for name in MUST_RESOLVE:
        path = name.replace(".", "/")
        assert f"{path}/__init__.py" in shipped or f"{path}.py" in shipped, f"{name} not shipped"
    with zipfile.ZipFile(wheel) as zf:
        entry_points = zf.read(next(n for n in dist_info if n.endswith("entry_points.txt")))
    assert re.search(r"^tidelog\s*=\s*tidelog\.cli:main\s*$", entry_points.decode(), re.M), (
        "console script `tidelog = tidelog.cli:main` missing from the wheel"
    )


def test_wheel_install_imports_every_module(
    wheel: Path, deps_dir: Path, tmp_path: Path, workdir: Path
) -> None:
    python = make_venv(tmp_path / "venv", deps_dir)
    pip_into(python, wheel, what="installing the wheel")
    purelib = Path(
        run(
            [python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            what="asking for site-packages",
        ).strip()
    )
    with zipfile.ZipFile(wheel) as zf:
        names = zf.namelist()
        metadata = zf.read(next(n for n in names if n.endswith(".dist-info/METADATA"))).decode()
    expected = {m: purelib / n for n in names if (m := module_name(n)) and n.startswith("tidelog/")}
    assert set(MUST_RESOLVE) <= set(expected)
    result = probe(python, workdir, sorted(expected), optional_import_names(metadata))
    check_probe(result, expected, "wheel install")
    script = python.parent / ("tidelog.exe" if os.name == "nt" else "tidelog")
    assert script.exists(), f"console script not installed at {script}"


def test_editable_install_imports_every_module(
    deps_dir: Path, tmp_path: Path, workdir: Path
) -> None:
    python = make_venv(tmp_path / "venv", deps_dir)
    pip_into(python, "--no-build-isolation", "--editable", REPO, what="installing editable")
    expected = {m: src for n, src in source_files().items() if (m := module_name(n))}
    assert set(MUST_RESOLVE) <= set(expected)
    metadata = (REPO / "pyproject.toml").read_text()
    optional = optional_import_names(_metadata_from_pyproject(metadata))
    result = probe(python, workdir, sorted(expected), optional)
    check_probe(result, expected, "editable install")


def _metadata_from_pyproject(text: str) -> str:
    """Requires-Dist lines from pyproject.toml (the editable install has no wheel to read)."""
    import tomllib

    project = tomllib.loads(text)["project"]
    lines = [f"Requires-Dist: {req}" for req in project.get("dependencies", [])]
    for extra, reqs in project.get("optional-dependencies", {}).items():
        lines += [f'Requires-Dist: {req}; extra == "{extra}"' for req in reqs]
    return "\n".join(lines)
