"""``tidelog blockdev format|verify``: flash rings (spec/FORMATS-blockdev.md), on ``main``.

    tidelog blockdev format ring.img --size 64MiB --page-size 4096 --topic events
    tidelog blockdev format /dev/sdb --topic events --force     # a raw device: its own size
    tidelog blockdev verify ring.img [--json]

``inspect`` already works on a ring (``tidelog inspect blockdev:///path/ring.img``): it shows the
geometry, the head, the write amplification and the I/O counters (BDEV-19).
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import click

import tidelog
from tidelog._cli_format import escape
from tidelog.backends.blockdev import verify_image
from tidelog.cli_group import EXIT_FAILED, main
from tidelog.cli_open import file_location
from tidelog.errors import BadArgument
from tidelog.fsio import OsFS

__all__ = ["blockdev_group"]


@main.group("blockdev")
def blockdev_group() -> None:
    """Flash page rings on raw block devices or image files (blockdev://)."""


@blockdev_group.command("format")
@click.argument("target")
@click.option("--size", help="Image size to create, e.g. 64MiB (a raw device has its own).")
@click.option("--page-size", help="Page size, a multiple of 512 [default: 4096].")
@click.option("--topic", help="Topic the ring is bound to [default: default].")
@click.option("--force", is_flag=True, help="Format even if TARGET holds a ring or other data.")
def format_cmd(
    target: str, size: str | None, page_size: str | None, topic: str | None, force: bool
) -> None:
    """Format TARGET (an image file, created if missing, or a raw device) as an empty ring.

    Without --force, only a missing, empty or all-zero image is formatted (BDEV-11); anything
    else is left untouched and refused (exit 2).
    """
    path = file_location(target)
    given = {"size": size, "page_size": page_size, "topic": topic}
    options: dict[str, Any] = {k: v for k, v in given.items() if v is not None}
    if force:
        options["format"] = True
    with tidelog.open(f"blockdev://{path}", **options) as store:
        facts = store.describe()
    if not force and not facts.get("formatted"):
        raise BadArgument(f"{path} already holds a ring; nothing written (--force reformats it)")
    click.echo(
        f"formatted {path}: {facts['page_count']} pages of {facts['page_size']} bytes, "
        f"topic {facts['topic_binding']!r}, ring id {facts['ring_id']}"
    )


@blockdev_group.command("verify")
@click.argument("target")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable JSON.")
def verify_cmd(target: str, as_json: bool) -> None:
    """Check a ring's metadata, pages and records offline (writes nothing, BDEV-21).

    Exits 1 if any problem is an error (warnings, such as a torn last page that recovery
    skips, exit 0).
    """
    report = verify_image(OsFS(), file_location(target))
    if as_json:
        body = {
            "root": report.root,
            "ok": report.ok,
            "files_checked": report.files_checked,
            "problems": [dataclasses.asdict(p) for p in report.problems],
        }
        click.echo(json.dumps(body, indent=2))
    else:
        for p in report.problems:
            click.echo(escape(str(p)))
        verdict = "OK" if report.ok else "FAILED"
        click.echo(f"{verdict}: {len(report.errors)} errors, {len(report.warnings)} warnings")
    if not report.ok:
        raise SystemExit(EXIT_FAILED)
