"""``tidelog repair <store>``: the way out of a refused, damaged file:// store (spec/FORMATS.md
REP-1..REP-5) or blockdev:// ring (spec/FORMATS-blockdev.md BDEV-24..BDEV-27), on ``main``.
Opening never repairs (FLT-2); this command quarantines the damage and turns what it made
unreadable into loss ranges (tombstones).

    tidelog repair ./buf --dry-run     # what would be done
    tidelog repair file:///var/lib/app/buf
    tidelog repair blockdev:///var/lib/app/ring.img
    tidelog repair blockdev:///dev/sdb --quarantine-dir /var/backups
"""

from __future__ import annotations

import os
from typing import Any

import click

from tidelog._cli_format import escape
from tidelog.cli_group import EXIT_FAILED, main
from tidelog.cli_open import file_location
from tidelog.errors import BadArgument
from tidelog.fsio import OsFS

__all__ = ["repair_cmd"]


@main.command("repair")
@click.argument("target")
@click.option("--dry-run", is_flag=True, help="Say what would be done; change nothing.")
@click.option(
    "--quarantine-dir",
    metavar="DIR",
    help="blockdev:// only: where the copy of the overwritten bytes goes [default: the image's "
    "directory; for a raw device, the current directory].",
)
def repair_cmd(target: str, dry_run: bool, quarantine_dir: str | None) -> None:
    """Repair a damaged file:// store or blockdev:// ring that opening refuses (`corrupt`).

    Takes the store's lock. Every byte it replaces is first copied: a file:// store's files to
    <store>/quarantine/<UTC time>/, a ring's pages and slots to <image>.quarantine-<UTC time>
    (offset and bytes). Intact records are kept; what the damage made unreadable becomes a
    loss range, so readers get a tombstone and no seq is handed out again. Exits 0 when the
    store verifies clean afterwards, 1 if verify still finds an error, 2 if repair refused
    (nothing left to bound the lost seqs, or no valid snapshot or metadata slot).
    """
    if target.startswith("blockdev://"):
        _repair_ring(target, dry_run, quarantine_dir)
        return
    from tidelog.backends.file.repair import repair_store
    from tidelog.backends.file.verify import verify_store

    if "://" in target and not target.startswith("file://"):
        raise BadArgument(
            f"{target!r}: repair works on file:// stores (and plain paths) and blockdev:// rings"
        )
    if quarantine_dir is not None:
        raise BadArgument("--quarantine-dir is for blockdev:// rings (a store keeps its own)")
    root = file_location(target)
    report = repair_store(OsFS(), root, dry_run=dry_run)
    _show(report.actions, report.quarantine, dry_run, "damaged files copied to")
    if dry_run:
        return
    _fail_on(verify_store(OsFS(), root).errors)


def _repair_ring(target: str, dry_run: bool, quarantine_dir: str | None) -> None:
    from tidelog.backends.blockdev import verify_image
    from tidelog.backends.blockdev.repair import repair_ring

    path = file_location(target)
    where = None if quarantine_dir is None else os.path.abspath(quarantine_dir)
    report = repair_ring(OsFS(), path, dry_run=dry_run, quarantine_dir=where)
    _show(report.actions, report.quarantine, dry_run, "overwritten bytes copied to")
    if dry_run:
        return
    _fail_on(verify_image(OsFS(), path).errors)


def _show(actions: list[str], quarantine: str | None, dry_run: bool, copied: str) -> None:
    verb = "would do" if dry_run else "did"
    for line in actions:
        click.echo(f"{verb}: {escape(line)}")
    if not actions:
        click.echo("nothing to repair")
    if quarantine:
        click.echo(f"{copied} {escape(quarantine)}")


def _fail_on(errors: list[Any]) -> None:
    for p in errors:
        click.echo(escape(str(p)), err=True)
    if errors:
        raise SystemExit(EXIT_FAILED)
