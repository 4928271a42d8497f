"""``tidelog demo``: the Spark pipeline (tidelog.adapters.spark.demo), registered on the CLI.

Imported by ``tidelog.cli`` at start-up; pyspark is only imported when the demo runs, so the
CLI works without the ``spark`` extra (``tidelog demo --local`` needs none of it).
"""

from __future__ import annotations

import click
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from tidelog.cli_group import EXIT_FAILED, main

__all__ = ["spark_demo_cmd"]


@main.command("demo")
@click.option(
    "--records",
    default=2000,
    show_default=True,
    type=click.IntRange(min=1),
    help="Bundles to produce (each one tidelog record).",
)
@click.option(
    "--rows",
    default=100,
    show_default=True,
    type=click.IntRange(min=1),
    help="Telemetry rows per bundle (slot 0).",
)
@click.option("--producers", default=4, show_default=True, type=click.IntRange(min=1))
@click.option("--master", default="local[2]", show_default=True, help="Spark master URL.")
@click.option("--data", default="./tidelog-data", show_default=True, help="Store directory.")
@click.option(
    "--out",
    default="./tidelog-demo-out",
    show_default=True,
    help="Parquet output + Spark checkpoint (replaced on every run).",
)
@click.option(
    "--max-per-trigger",
    default=500,
    show_default=True,
    type=click.IntRange(min=1),
    help="Bundles per micro-batch (admission control).",
)
@click.option("--trigger-ms", default=500, show_default=True, type=click.IntRange(min=10))
@click.option("--seed", type=int, help="Seed for the readings.")
@click.option(
    "--cold",
    default=None,
    metavar="URL",
    help="The store's cold tier: a directory or a pyarrow.fs URL (s3://...; spec/TIERING.md).",
)
@click.option("--local", is_flag=True, help="Run the in-process pipeline instead (no Spark).")
@click.pass_context
def spark_demo_cmd(
    ctx: click.Context,
    records: int,
    rows: int,
    producers: int,
    master: str,
    data: str,
    out: str,
    max_per_trigger: int,
    trigger_ms: int,
    seed: int | None,
    cold: str | None,
    local: bool,
) -> None:
    """Producers -> file store (fsync) -> Spark Structured Streaming -> Parquet; verified.

    Producer threads append telemetry Arrow bundles into DATA while Spark starts; a streaming
    query drains slot 0 to Parquet in micro-batches, its commits trim the store, and at the end
    every produced row must be in the Parquet output exactly once (else exit status 1).
    """
    if local:
        # tidelog.cli's `demo-local`, looked up on the group it registered on
        ctx.invoke(main.commands["demo-local"], records=records, producers=producers, seed=seed)
        return
    from tidelog.adapters.spark.demo import DemoConfig, run

    cfg = DemoConfig(
        records=records,
        rows=rows,
        producers=producers,
        master=master,
        data=data,
        out=out,
        max_per_trigger=max_per_trigger,
        trigger_ms=trigger_ms,
        seed=seed,
        cold=cold,
    )
    click.echo(
        f"tidelog demo: {producers} producers -> {records} bundles x {rows} rows -> "
        f"file://{data} -> Spark ({master}) -> Parquet in {out}"
    )
    console = Console(stderr=True)
    columns = (
        TextColumn("{task.description:>14}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
    )
    with Progress(*columns, console=console, refresh_per_second=8) as bar:
        produced = bar.add_task("produced", total=records)
        drained = bar.add_task("spark drained", total=records, start=False)
        status = bar.add_task("starting Spark", total=None)

        def show(kind: str, **kw: object) -> None:
            if kind == "spark":
                bar.update(
                    status, description=f"Spark up {kw['seconds']:.1f}s", total=1, completed=1
                )
                bar.start_task(drained)
            elif kind in ("tick", "drained"):
                bar.update(produced, completed=int(kw["produced"]))  # type: ignore[call-overload]
                bar.update(drained, completed=int(kw["drained"]))  # type: ignore[call-overload]

        result = run(cfg, show)
    width = max(len(k) for k, _ in result.rows)
    for key, value in result.rows:
        click.echo(f"  {key:<{width}}  {value}")
    if result.ok:
        click.echo(
            f"OK: {records} bundles ({records * rows:,} rows) produced, every row in the "
            "Parquet output exactly once, store trimmed"
        )
    else:
        click.echo("FAILED: " + "; ".join(result.problems or ["see above"]))
        raise SystemExit(EXIT_FAILED)
