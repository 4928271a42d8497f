"""``tidelog conformance``: check any implementation against the spec (spec/CONFORMANCE.md).

    tidelog conformance run --uri 'memory://{name}'               # tidelog's own memory backend
    tidelog conformance run --uri 'memory://{name}' --http        # ... served, over http://
    tidelog conformance run --driver './my-log-driver --dir /tmp/x' --level log --level crash
    tidelog conformance run --driver CMD --replay tidelog-replay-log-1a2b3c4d.json
    tidelog conformance driver --fs recording \
        --uri 'file:///conf/{name}?background=false&commit_interval_ms=60000'
    tidelog conformance vectors --out vectors/                     # golden format test vectors
"""

from __future__ import annotations

import importlib.util
import json
import shlex
import sys
from typing import Any

import click

from tidelog.cli_group import EXIT_FAILED, main
from tidelog.conformance.levels import ORDER as _LEVELS

__all__ = ["conformance"]

_FS = click.Choice(["os", "recording"])
_HTTP_HELP = (
    "Serve each store with tidelog serve's service on 127.0.0.1 and drive it through the "
    "remote backend (http://, spec/SERVICE.md SVC-58); needs the serve extra."
)


@main.group("conformance")
def conformance() -> None:
    """Conformance kit: driver protocol, level runner, replay, golden vectors."""


def _load(path: str) -> Any:
    """Import a Python file (e.g. one registering a third-party backend scheme, or test-only
    mutant implementations) and return the module."""
    spec = importlib.util.spec_from_file_location("tidelog_conformance_plugin", path)
    if spec is None or spec.loader is None:
        raise click.BadParameter(f"cannot import {path}", param_hint="--load")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


@conformance.command("driver")
@click.option("--uri", "template", required=True, metavar="TEMPLATE",
              help="Store URI with {name}, e.g. 'memory://{name}' or 'file:///tmp/c/{name}'.")
@click.option("--fs", "fs", type=_FS, default="os", show_default=True,
              help="'recording': file:// and blockdev:// stores live on tidelog's recording FS "
                   "(in memory) so 'crash' is a simulated power loss, also inside an op.")
@click.option("--load", "plugin", type=click.Path(exists=True, dir_okay=False),
              help="Import this Python file first; a make_driver(template, fs) in it replaces "
                   "tidelog's driver (third-party backends, test mutants).")
@click.option("--http", "http", is_flag=True, help=_HTTP_HELP)
def driver_cmd(template: str, fs: str, plugin: str | None, http: bool) -> None:
    """Serve the driver protocol on stdin/stdout for tidelog's backend at TEMPLATE."""
    from tidelog.conformance.driver import make_driver, serve
    from tidelog.errors import TidelogError

    factory = make_driver
    if plugin is not None:
        factory = getattr(_load(plugin), "make_driver", make_driver)
    try:
        driver = factory(template, fs=fs, **({"http": True} if http else {}))
    except TidelogError as exc:
        raise click.BadParameter(exc.message, param_hint="--uri") from None
    raise SystemExit(serve(driver))


def own_driver_command(
    template: str, fs: str = "os", plugin: str | None = None, http: bool = False
) -> str:
    """The command line of tidelog's own driver (a separate process, this interpreter)."""
    cmd = [sys.executable, "-P", "-m", "tidelog.cli", "conformance", "driver", "--uri", template,
           "--fs", fs]
    if plugin is not None:
        cmd += ["--load", plugin]
    if http:
        cmd.append("--http")
    return shlex.join(cmd)


@conformance.command("run")
@click.option("--driver", "command", metavar="CMD", help="Command that starts the driver.")
@click.option("--uri", "template", metavar="TEMPLATE",
              help="Run tidelog's own driver on this store template instead of --driver.")
@click.option("--fs", "fs", type=_FS, default="os", show_default=True,
              help="With --uri: the driver's --fs.")
@click.option("--http", "http", is_flag=True, help="With --uri: " + _HTTP_HELP)
@click.option("--level", "levels", multiple=True, type=click.Choice(_LEVELS),
              help="Levels to run (repeatable; default: all, in order).")
@click.option("--examples", default=100, show_default=True, type=click.IntRange(min=1),
              help="Hypothesis examples per level.")
@click.option("--steps", default=40, show_default=True, type=click.IntRange(min=1),
              help="Operations per example (at most).")
@click.option("--seed", type=int, help="Seed (printed; the same seed replays the same run).")
@click.option("--shrink-seconds", default=30.0, show_default=True,
              type=click.FloatRange(min=0), help="Time Hypothesis may spend shrinking a failure.")
@click.option("--replay", "replay_file", type=click.Path(exists=True, dir_okay=False),
              help="Instead of a run: send this replay file's requests to the driver and the "
                   "reference, and show the first response that differs.")
@click.option("--replay-dir", default=".", show_default=True, type=click.Path(file_okay=False),
              help="Where a failing level's replay file is written.")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable JSON result.")
def run_cmd(command: str | None, template: str | None, fs: str, http: bool,
            levels: tuple[str, ...], examples: int, steps: int, seed: int | None,
            shrink_seconds: float,
            replay_file: str | None, replay_dir: str, as_json: bool) -> None:
    """Run the conformance suite, level by level, against a driver; exit 1 if a level fails.

    A failure is shrunk to a minimal operation sequence, printed with the expected and actual
    results, and saved as a replay file (--replay FILE sends it again).
    """
    from tidelog.conformance.remote import DriverProcess, RemoteSut
    from tidelog.conformance.runner import format_report, run_levels

    if replay_file is not None and command is None and template is None:
        with open(replay_file, encoding="utf-8") as f:
            command = json.load(f).get("driver")
    if (command is None) == (template is None):
        raise click.UsageError("give exactly one of --driver CMD and --uri TEMPLATE")
    if http and template is None:
        raise click.UsageError("--http goes with --uri TEMPLATE (tidelog's own driver)")
    cmd = command if command is not None else own_driver_command(str(template), fs, http=http)

    def make_sut() -> RemoteSut:
        return RemoteSut(DriverProcess(cmd))

    if replay_file is not None:
        _replay(replay_file, make_sut, as_json)
        return
    progress = None if as_json else (lambda msg: click.echo(msg, err=True))
    results = run_levels(make_sut, list(levels) or None, examples=examples, steps=steps,
                         seed=seed, replay_dir=replay_dir, command=cmd,
                         shrink_seconds=shrink_seconds, on_progress=progress)
    if as_json:
        click.echo(json.dumps([r.to_json() for r in results], indent=2))
    else:
        for line in format_report(results):
            click.echo(line)
    if any(r.status == "fail" for r in results):
        raise SystemExit(EXIT_FAILED)


def _replay(path: str, make_sut: Any, as_json: bool) -> None:
    from tidelog.conformance.runner import replay

    rows = replay(path, make_sut)
    differing = [r for r in rows if r["differs"]]
    if as_json:
        click.echo(json.dumps(rows, indent=2))
    else:
        for r in rows:
            req = {k: v for k, v in r["request"].items() if k != "now"}
            click.echo(f"{'!=' if r['differs'] else '  '} {json.dumps(req)}")
            if r["differs"]:
                click.echo(f"   expected: {json.dumps(r['expected'])}")
                click.echo(f"   actual:   {json.dumps(r['actual'])}")
        if differing:
            click.echo(f"FAILED: request {len(rows)} differs from the reference")
        else:
            click.echo(f"no difference in {len(rows)} requests")
    if differing:
        raise SystemExit(EXIT_FAILED)


@conformance.command("vectors")
@click.option("--out", "out_dir", required=True, type=click.Path(file_okay=False),
              help="Directory to write the vectors and manifest.json into.")
def vectors_cmd(out_dir: str) -> None:
    """Write golden test vectors of the on-disk formats (valid and broken) with a manifest."""
    from tidelog.conformance.vectors import write_vectors

    manifest = write_vectors(out_dir)
    click.echo(f"wrote {len(manifest['vectors'])} vectors and manifest.json to {out_dir}")
