"""Commands that read create and change nothing (spec/CLI.md CLI-3). In-process through
click's CliRunner; reading beside a live writer process is in test_cli_process.py."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

import tidelog
from tidelog.cli import main


def run(*args: str) -> Result:
    return CliRunner().invoke(main, list(args))


def tree(root: Path) -> dict[str, tuple[int, int, str]]:
    """Every file under root: size, mtime and a digest of its bytes."""
    return {
        str(p.relative_to(root)): (
            p.stat().st_size,
            p.stat().st_mtime_ns,
            hashlib.sha256(p.read_bytes()).hexdigest(),
        )
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


@pytest.mark.parametrize("command", [("inspect",), ("tail", "events"), ("tail", "events", "-f")])
@pytest.mark.parametrize(
    "uri_of",
    [
        lambda d: f"file://{d}/typo",
        lambda d: f"file://{d}/typo?create=true&wal_file_bytes=64KiB",
        lambda d: f"blockdev://{d}/typo.img?size=1MiB",
        lambda d: f"sf://{d}/sf/typo",
    ],
    ids=["file", "file-create", "blockdev-size", "sf"],
)
def test_CLI_3_a_missing_store_is_an_error_and_nothing_is_created(
    tmp_path: Path, command: tuple[str, ...], uri_of: object
) -> None:
    """CLI-3: inspect and tail of a path that does not exist are io_error (exit 2, one stderr
    line naming the path) and create nothing: the parent stays empty (they used to create a
    64 MiB file store, an image or a slot there)."""
    uri = uri_of(tmp_path)  # type: ignore[operator]
    name, *rest = command
    result = run(name, uri, *rest)
    assert result.exit_code == 2, result.output
    assert result.stdout == ""
    assert result.stderr.startswith("tidelog: error: io_error: no ")
    assert "does not exist" in result.stderr and result.stderr.count("\n") == 1
    assert list(tmp_path.iterdir()) == []


def test_CLI_3_inspect_and_tail_write_nothing(tmp_path: Path) -> None:
    """CLI-3, XPR-1: inspect and tail of a closed file store leave every file as it was: no
    lock, no new WAL file, no snapshot, no subscriber progress (inspect lists subscribers
    without registering or resuming them)."""
    root = tmp_path / "store"
    uri = f"file://{root}?wal_file_bytes=64KiB"
    with tidelog.open(uri) as store:
        events = store.topic("events", trim="none")
        events.append_many([b"a", b"b", b"c"])
        events.subscribe("exporter", start="earliest").commit(2)
    before = tree(root)
    result = run("inspect", uri, "--json")
    assert result.exit_code == 0, result.output
    assert '"exporter": {\n' in result.stdout
    result = run("tail", uri, "events")
    assert result.exit_code == 0, result.output
    assert len(result.stdout.splitlines()) == 3
    assert tree(root) == before


def test_CLI_3_a_readonly_false_in_the_uri_does_not_make_inspect_write(tmp_path: Path) -> None:
    """CLI-3, URI-2: the CLI's read-only keyword wins over the URI's query."""
    root = tmp_path / "store"
    with tidelog.open(f"file://{root}?wal_file_bytes=64KiB") as store:
        store.topic("events").append(b"a")
    before = tree(root)
    result = run("inspect", f"file://{root}?readonly=false")
    assert result.exit_code == 0, result.output
    assert tree(root) == before
