"""``tidelog bench``: the benchmark harness of ``tidelog.bench`` (bench/ in the source tree).

    tidelog bench --quick            # under two minutes: every case, short runs
    tidelog bench                    # full mode (under fifteen minutes on a 2-core VM)
    tidelog bench --only tl_file --no-isolated --dir /mnt/disk-to-test

Peers (sqlite3 is always there; persist-queue, diskcache, queuelib, litequeue, lmdb) and the
plot (matplotlib) come with the ``bench`` extra: ``pip install 'tidelog[bench]'``. A peer that
is not installed is reported as not measured, never silently dropped.
"""

from __future__ import annotations

import click

from tidelog.cli_group import main

__all__ = ["bench_cmd"]


@main.command(
    "bench",
    context_settings={"ignore_unknown_options": True, "help_option_names": []},
    add_help_option=False,
)
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
def bench_cmd(args: tuple[str, ...]) -> None:
    """Benchmarks against the machine's limits and the Python peers (--help for options)."""
    from tidelog.bench.harness import main as bench_main

    raise SystemExit(bench_main(list(args)))
