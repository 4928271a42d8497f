"""`tidelog append` in batches (spec/CLI.md CLI-6): one sync per batch, not per line, with the
results of one append per line. In-process through click's CliRunner; the slow-input and
terminal cases run as processes in test_cli_process.py."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

import tidelog
from tidelog import fsio
from tidelog.cli import main

# Small WAL files, no background committer: the syncs counted are the ones appends wait for.
SMALL = "wal_file_bytes=256KiB"


def run(*args: str, input: str | bytes | None = None) -> Result:
    return CliRunner().invoke(main, list(args), input=input)


def payloads(uri: str, topic: str) -> list[bytes]:
    with tidelog.open(uri) as store:
        items = store.topic(topic, create=False).read(limit=100_000)
        return [r.payload for r in items if isinstance(r, tidelog.Record)]


def test_CLI_6_stdin_lines_share_syncs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """CLI-6: 3000 stdin lines into an `fsync` topic cost a few syncs, not one per line (it
    was 3000 appends, each waiting for its own sync); every line is a record, every seq is
    printed once, in order."""
    syncs = 0
    lock = threading.Lock()
    real_fdatasync = fsio._OsHandle.fdatasync
    real_fsync = fsio._OsHandle.fsync

    def count(real):  # type: ignore[no-untyped-def]
        def counted(self: object) -> None:
            nonlocal syncs
            with lock:
                syncs += 1
            real(self)

        return counted

    monkeypatch.setattr(fsio._OsHandle, "fdatasync", count(real_fdatasync))
    monkeypatch.setattr(fsio._OsHandle, "fsync", count(real_fsync))
    uri = f"file://{tmp_path / 'store'}?{SMALL}"
    lines = [f"line {i}" for i in range(3000)]
    result = run("append", uri, "events", input="".join(f"{x}\n" for x in lines))
    assert result.exit_code == 0, result.output
    assert result.stdout.split() == [str(i) for i in range(1, 3001)]
    assert syncs < 60, syncs  # open, three batches, close: far below one per line
    assert payloads(uri, "events") == [x.encode() for x in lines]


def test_CLI_6_a_capped_topic_gets_what_one_append_per_line_gives(tmp_path: Path) -> None:
    """CLI-6, RET-5: batches never exceed the topic's cap (a batch above cap_records would be
    too_large), so a `discard="old"` topic capped at 2 takes all 5 lines and keeps the last 2."""
    uri = f"file://{tmp_path / 'store'}?{SMALL}"
    with tidelog.open(uri) as store:
        store.topic("capped", cap_records=2)
    result = run("append", uri, "capped", input="a\nb\nc\nd\ne\n")
    assert result.exit_code == 0, result.output
    assert result.stdout.split() == ["1", "2", "3", "4", "5"]
    assert payloads(uri, "capped") == [b"d", b"e"]  # after Tombstone(1, 3): evicted (TMB-1)


def test_CLI_6_a_refused_batch_falls_back_to_one_record_at_a_time(tmp_path: Path) -> None:
    """CLI-6, RET-3, ERR-2: on a `discard="reject"` topic with room for 3, five lines append
    the first three (their seqs printed) and then fail with topic_full, as one append per line
    would; the batch of five was refused whole, so nothing else was stored."""
    uri = f"file://{tmp_path / 'store'}?{SMALL}"
    with tidelog.open(uri) as store:
        store.topic("strict", cap_records=5, discard="reject").append_many([b"x", b"y"])
    result = run("append", uri, "strict", input="a\nb\nc\nd\ne\n")
    assert result.exit_code == 2
    assert result.stdout.split() == ["3", "4", "5"]
    assert result.stderr.startswith("tidelog: error: topic_full: ")
    assert payloads(uri, "strict") == [b"x", b"y", b"a", b"b", b"c"]


def test_CLI_6_a_line_over_max_record_bytes_stops_after_the_lines_before_it(
    tmp_path: Path,
) -> None:
    """CLI-6, RET-5: a line longer than max_record_bytes is too_large after the lines before it
    were appended; nothing after it is read or stored."""
    uri = f"file://{tmp_path / 'store'}?{SMALL}&max_record_bytes=100"
    result = run("append", uri, "events", input=b"a\nb\n" + b"z" * 300_000 + b"\nc\n")
    assert result.exit_code == 2
    assert result.stdout.split() == ["1", "2"]
    assert result.stderr.startswith("tidelog: error: too_large: ")
    assert payloads(uri, "events") == [b"a", b"b"]


def test_CLI_6_arguments_empty_lines_and_a_last_line_without_newline(tmp_path: Path) -> None:
    """CLI-6: every argument is one record; on stdin an empty line is an empty record and a
    last line without `\\n` is a record too."""
    uri = f"file://{tmp_path / 'store'}?{SMALL}"
    result = run("append", uri, "events", "one", "twö")
    assert result.exit_code == 0, result.output
    assert result.stdout.split() == ["1", "2"]
    result = run("append", uri, "events", input=b"x\n\nlast")
    assert result.exit_code == 0, result.output
    assert result.stdout.split() == ["3", "4", "5"]
    assert payloads(uri, "events") == [b"one", "twö".encode(), b"x", b"", b"last"]
