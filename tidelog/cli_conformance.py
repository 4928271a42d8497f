"""``tidelog conformance``: check any implementation against the spec (spec/CONFORMANCE.md).

    tidelog conformance run --uri 'memory://{name}'              # tidelog's own memory backend
    tidelog conformance run --driver './my-log-driver --dir /tmp/x' --level log --level subscribers
    tidelog conformance replay tidelog-replay-log-1a2b3c4d.json  # first differing response
    tidelog conformance vectors --out vectors/                    # golden format test vectors
    tidelog conformance driver --uri 'file:///tmp/conf/{name}'    # the protocol on stdin/stdout
"""

from __future__ import annotations

import json
import shlex
import sys

import click

from tidelog.cli import EXIT_FAILED, main

__all__ = ["conformance"]


@main.group("conformance")
def conformance() -> None:
    """Conformance kit: driver protocol, level runner, replay, golden vectors."""


@conformance.command("driver")
@click.option("--uri", "template", required=True, metavar="TEMPLATE",
              help="Store URI with {name}, e.g. 'memory://{name}' or 'file:///tmp/c/{name}'.")
def driver_cmd(template: str) -> None:
    """Serve the driver protocol on stdin/stdout for tidelog's backend at TEMPLATE."""
    from tidelog.conformance.driver import serve

    if "{name}" not in template:
        raise click.BadParameter("the template needs {name} (each example opens a fresh store)",
                                 param_hint="--uri")
    raise SystemExit(serve(template))


def _own_driver(template: str) -> str:
    return shlex.join([sys.executable, "-m", "tidelog.cli", "conformance", "driver", "--uri",
                       template])


@conformance.command("run")
@click.option("--driver", "command", metavar="CMD", help="Command that starts the driver.")
@click.option("--uri", "template", metavar="TEMPLATE",
              help="Run tidelog's own driver on this store template instead of --driver.")
@click.option("--level", "levels", multiple=True,
              type=click.Choice(["log", "subscribers", "queue", "durable"]),
              help="Levels to run (repeatable; default: all, in order).")
@click.option("--examples", default=100, show_default=True, type=click.IntRange(min=1),
              help="Hypothesis examples per level.")
@click.option("--steps", default=40, show_default=True, type=click.IntRange(min=1),
              help="Operations per example (at most).")
@click.option("--seed", type=int, help="Seed (printed; the same seed replays the same run).")
@click.option("--replay-dir", default=".", show_default=True, type=click.Path(file_okay=False),
              help="Where a failing level's replay file is written.")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable JSON result.")
def run_cmd(command: str | None, template: str | None, levels: tuple[str, ...], examples: int,
            steps: int, seed: int | None, replay_dir: str, as_json: bool) -> None:
    """Run the stateful suite, level by level, against a driver; exit 1 on the first failure.

    A failure is shrunk to a minimal operation sequence, printed, and saved as a replay file.
    """
    from tidelog.conformance.runner import LEVELS, run_levels

    if (command is None) == (template is None):
        raise click.UsageError("give exactly one of --driver CMD and --uri TEMPLATE")
    cmd = command if command is not None else _own_driver(str(template))
    chosen = list(levels) or list(LEVELS)
    progress = None if as_json else (lambda msg: click.echo(msg, err=True))
    results = run_levels(cmd, chosen, examples=examples, steps=steps, seed=seed,
                         replay_dir=replay_dir, on_progress=progress)
    if as_json:
        click.echo(json.dumps([r.__dict__ for r in results], indent=2))
    else:
        for r in results:
            verdict = "SKIP" if r.skipped else ("PASS" if r.passed else "FAIL")
            detail = r.skipped or (f"{r.examples} examples in {r.seconds:.1f}s"
                                   if r.passed else r.error.strip().splitlines()[-1][:300])
            click.echo(f"{verdict} {r.level:<12} {detail}")
            if r.replay_file:
                click.echo(f"     replay: tidelog conformance replay {r.replay_file}")
    if not all(r.passed for r in results):
        raise SystemExit(EXIT_FAILED)


@conformance.command("replay")
@click.argument("path", type=click.Path(exists=True, dir_okay=False))
@click.option("--driver", "command", metavar="CMD", help="Driver command (default: the file's).")
def replay_cmd(path: str, command: str | None) -> None:
    """Send a replay file's requests to the driver and the model; show where they differ."""
    from tidelog.conformance.runner import replay

    rows = replay(path, command)
    differing = [r for r in rows if r["differs"] and r["request"].get("op") != "open"]
    for r in rows:
        mark = "!=" if r in differing else "  "
        click.echo(f"{mark} {json.dumps(r['request'])}")
        if r in differing:
            click.echo(f"   expected (model): {json.dumps(r['expected'])}")
            click.echo(f"   actual (driver):  {json.dumps(r['actual'])}")
    if differing:
        click.echo(f"FAILED: first difference at request {rows.index(differing[0]) + 1}")
        raise SystemExit(EXIT_FAILED)
    click.echo(f"no difference in {len(rows)} requests (a failing invariant may need the run)")


@conformance.command("vectors")
@click.option("--out", "out_dir", required=True, type=click.Path(file_okay=False),
              help="Directory to write the vectors and manifest.json into.")
def vectors_cmd(out_dir: str) -> None:
    """Write golden test vectors of the on-disk formats (valid and broken) with a manifest."""
    from tidelog.conformance.vectors import write_vectors

    manifest = write_vectors(out_dir)
    click.echo(f"wrote {len(manifest['vectors'])} vectors and manifest.json to {out_dir}")
