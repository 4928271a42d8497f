"""``tidelog repair <store>``: the way out of a refused, damaged file:// store (spec/FORMATS.md
REP-1..REP-5), on ``main``. Opening never repairs (FLT-2); this command quarantines the damage
and turns what it made unreadable into loss ranges (tombstones).

    tidelog repair ./buf --dry-run     # what would be done
    tidelog repair file:///var/lib/app/buf
"""

from __future__ import annotations

import click

from tidelog._cli_format import escape
from tidelog.cli import EXIT_FAILED, main
from tidelog.cli_open import file_location
from tidelog.errors import BadArgument
from tidelog.fsio import OsFS

__all__ = ["repair_cmd"]


@main.command("repair")
@click.argument("target")
@click.option("--dry-run", is_flag=True, help="Say what would be done; change nothing.")
def repair_cmd(target: str, dry_run: bool) -> None:
    """Repair a damaged file:// store that opening refuses (`corrupt`).

    Takes the store's lock. Every file it replaces or removes is first copied to
    <store>/quarantine/<UTC time>/. Intact records are kept; what the damage made unreadable
    becomes a loss range, so readers get a tombstone and no seq is handed out again. Exits 0
    when the store verifies clean afterwards, 1 if verify still finds an error, 2 if repair
    refused (no valid snapshot, or nothing left to bound a lost WAL's seqs).
    """
    from tidelog.backends.file.repair import repair_store
    from tidelog.backends.file.verify import verify_store

    if "://" in target and not target.startswith("file://"):
        raise BadArgument(f"{target!r}: repair works on file:// stores (and plain paths)")
    root = file_location(target)
    report = repair_store(OsFS(), root, dry_run=dry_run)
    verb = "would do" if dry_run else "did"
    for line in report.actions:
        click.echo(f"{verb}: {escape(line)}")
    if not report.actions:
        click.echo("nothing to repair")
    if report.quarantine:
        click.echo(f"damaged files copied to {escape(report.quarantine)}")
    if dry_run:
        return
    errors = verify_store(OsFS(), root).errors
    for p in errors:
        click.echo(escape(str(p)), err=True)
    if errors:
        raise SystemExit(EXIT_FAILED)
