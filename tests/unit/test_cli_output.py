"""What the `tidelog` command prints (spec/CLI.md): escaped line output (CLI-5), the inspect
report (CLI-7), error lines and exit status (CLI-1, CLI-2), and the README's promises about
them. In-process through click's CliRunner."""

from __future__ import annotations

import re
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner, Result
from hypothesis import given
from hypothesis import strategies as st

import tidelog
from tidelog.backends import memory
from tidelog.cli import main

README = Path(__file__).resolve().parents[2] / "README.md"


def run(*args: str, input: str | None = None) -> Result:
    return CliRunner().invoke(main, list(args), input=input)


@pytest.fixture
def uri() -> Iterator[str]:
    name = f"clitest-{uuid.uuid4().hex[:12]}"
    yield f"memory://{name}"
    memory.forget(name)


def unescape(text: str) -> bytes:
    """The inverse of CLI-5's escapes, written from the rule (not from the code)."""
    out = bytearray()
    i = 0
    named = {"\\": b"\\", "t": b"\t", "n": b"\n", "r": b"\r"}
    while i < len(text):
        ch = text[i]
        if ch != "\\":
            out += ch.encode("utf-8")
            i += 1
            continue
        kind = text[i + 1]
        if kind in named:
            out += named[kind]
            i += 2
        elif kind == "x":
            out.append(int(text[i + 2 : i + 4], 16))
            i += 4
        else:
            width = {"u": 4, "U": 8}[kind]
            out += chr(int(text[i + 2 : i + 2 + width], 16)).encode("utf-8")
            i += 2 + width
    return bytes(out)


def field_bytes(text: str) -> bytes | None:
    return None if text == "-" else unescape(text)


# -- CLI-5: escapes --------------------------------------------------------------------------
# terminal escapes, newline, tab, a literal "\x41", CR, BEL, NUL, DEL, C1 NEL, U+2028, U+202E
# (bidi override), and bytes that are not UTF-8
NASTY = b"a\x1b[31mred\x1b[0m\nsecond\tcol\\x41 \r\x07\x00\x7f" + (
    b"\xc2\x85\xe2\x80\xa8\xe2\x80\xae\xff\xfe"
)


def test_CLI_5_tail_escapes_payload_tag_and_node(uri: str) -> None:
    """CLI-5: terminal escapes, newlines, tabs, C1 controls, line separators and bidi overrides
    in a payload, a tag or a node are escaped: one record is one line of five tab-separated
    fields, nothing reaches the terminal raw, and each field decodes back exactly; a tag that
    is literally "-" is not confused with no tag."""
    tag = "t\nag\x1b]0;title\x07\u202e"
    with tidelog.open(uri) as store:
        events = store.topic("events")
        events.append(NASTY, tag=tag, node="gw\r\n1")
        events.append(b"plain", tag="-")
    result = run("tail", uri, "events")
    assert result.exit_code == 0, result.output
    lines = result.stdout.split("\n")
    assert lines[-1] == "" and len(lines) == 3
    for line in lines[:2]:
        assert line.replace("\t", "").isprintable()
        assert line.count("\t") == 4
    first = lines[0].split("\t")
    assert field_bytes(first[2]) == tag.encode()
    assert field_bytes(first[3]) == b"gw\r\n1"
    assert unescape(first[4]) == NASTY
    second = lines[1].split("\t")
    assert second[2] != "-" and field_bytes(second[2]) == b"-"
    assert second[3] == "-"


@given(payload=st.binary(max_size=64), tag=st.text(min_size=1, max_size=16))
def test_CLI_5_any_payload_and_tag_round_trip_through_one_line(payload: bytes, tag: str) -> None:
    """CLI-5 for arbitrary bytes and any tag the API accepts: one printable line whose
    payload and tag fields decode back to exactly what was appended."""
    try:
        tag.encode("utf-8")
    except UnicodeEncodeError:  # lone surrogates: the API refuses such a tag (TOP-6)
        return
    name = f"clitest-{uuid.uuid4().hex[:12]}"
    try:
        with tidelog.open(f"memory://{name}") as store:
            store.topic("t").append(payload, tag=tag)
        result = run("tail", f"memory://{name}", "t")
    finally:
        memory.forget(name)
    assert result.exit_code == 0, result.output
    (line,) = result.stdout.splitlines()
    assert result.stdout == line + "\n"
    fields = line.split("\t")
    assert len(fields) == 5
    assert all(f.isprintable() for f in fields)
    assert field_bytes(fields[2]) == tag.encode("utf-8")
    assert unescape(fields[4]) == payload


def test_CLI_5_error_lines_are_escaped(tmp_path: Path) -> None:
    """CLI-2, CLI-5: an error message that quotes user input (a path with a terminal escape)
    is one escaped line on stderr; nothing was created at that path (CLI-3)."""
    result = run("inspect", f"file://{tmp_path}/x\x1b[2Jy")
    assert result.exit_code == 2
    assert result.stdout == ""
    assert "\x1b" not in result.stderr
    # a control character in a path is bad_uri before anything is looked up (SPEC.md URI-7)
    assert result.stderr.startswith("tidelog: error: bad_uri: bad file:// path ")
    # the message quotes the path as a repr (its escape as text), which the CLI escapes again
    assert "x\\\\x1b[2Jy" in result.stderr and result.stderr.count("\n") == 1
    assert list(tmp_path.iterdir()) == []


# -- CLI-7: inspect --------------------------------------------------------------------------
def test_CLI_7_inspect_is_aligned_text_without_reprs(tmp_path: Path) -> None:
    """CLI-7: nested backend facts are dotted keys with plain values (no dict or list reprs),
    columns are aligned, and no line ends in blanks."""
    uri = f"file://{tmp_path / 'store'}?wal_file_bytes=256KiB"
    with tidelog.open(uri) as store:
        events = store.topic("events", cap_records=100)
        events.append_many([b"a", b"b", b"c"])
        events.subscribe("exporter", start="earliest").commit(1)
    result = run("inspect", uri)
    assert result.exit_code == 0, result.output
    out = result.stdout
    assert out.startswith(
        f"store file://{tmp_path / 'store'}?wal_file_bytes=256KiB (read-only view)\n"
    )
    assert not re.search(r"[{}\[\]']", out), out
    assert all(line == line.rstrip() for line in out.splitlines())
    assert re.search(r"^  wal\.fdatasyncs\s+\d+$", out, re.M)
    assert re.search(r"^  segments\.events\s+\d+$", out, re.M)
    assert re.search(r"^  durability\s+disk,ephemeral,fsync,memory$", out, re.M)
    assert re.search(r"^  cap_records\s+100$", out, re.M)
    assert re.search(r"^  subscriber\s+hwm\s+lag\n  exporter\s+1\s+2$", out, re.M)
    topic = out[out.index("topic events\n") :].splitlines()[1:]
    rows = topic[: next(i for i, row in enumerate(topic) if row.startswith("  subscriber"))]
    assert len(rows) > 10
    value_columns = {len(re.match(r"  \S+\s+", row).group(0)) for row in rows}  # type: ignore[union-attr]
    assert len(value_columns) == 1


# -- CLI-1, CLI-2, CLI-3: errors and refusals ------------------------------------------------
@pytest.mark.parametrize("target", ["memory://", "memory://named", "model://"])
def test_CLI_3_verify_refuses_a_uri_without_files(
    target: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """CLI-3: `verify memory://` is bad_argument (exit 2, stderr), not a check of the current
    directory."""
    monkeypatch.chdir(tmp_path)
    result = run("verify", target)
    assert result.exit_code == 2
    assert result.stdout == ""
    assert result.stderr.startswith("tidelog: error: bad_argument: ")
    assert "keeps no files" in result.stderr


def test_CLI_1_blockdev_format_refusal_is_an_error_on_stderr(tmp_path: Path) -> None:
    """CLI-1, CLI-2: refusing to reformat a ring is status 2 with one coded line on stderr,
    nothing on stdout (it was status 1 with the refusal on stdout)."""
    path = tmp_path / "r.img"
    assert run("blockdev", "format", str(path), "--size", "64KiB").exit_code == 0
    before = path.read_bytes()
    result = run("blockdev", "format", str(path))
    assert result.exit_code == 2
    assert result.stdout == ""
    assert result.stderr.startswith("tidelog: error: bad_argument: ")
    assert "already holds a ring" in result.stderr and result.stderr.count("\n") == 1
    assert path.read_bytes() == before


def test_CLI_2_errors_go_to_stderr_only(uri: str) -> None:
    """CLI-2: an error prints nothing on stdout and one line on stderr."""
    result = run("tail", uri, "ghost")
    assert result.exit_code == 2
    assert result.stdout == ""
    assert re.fullmatch(r"tidelog: error: no_such_topic: [^\n]+\n", result.stderr)


# -- the README ------------------------------------------------------------------------------
def test_README_documents_exit_status_and_escapes() -> None:
    """CLI-1, CLI-5: the README's command-line section states the exit status scheme and the
    escapes."""
    text = README.read_text()
    section = text[text.index("## Command line") :]
    section = section[: section.index("\n## ", 3)]
    for status in ("`0`", "`1`", "`2`", "`130`"):
        assert status in section
    assert "tidelog: error: CODE: MESSAGE" in section
    assert "\\xNN" in section and "--json" in section


def test_README_spark_example_sets_pyspark_python() -> None:
    """The README's Spark example sets PYSPARK_PYTHON before the session starts: Spark's
    workers run `python3` from PATH otherwise, which may not have tidelog."""
    text = README.read_text()
    blocks = re.findall(r"```python\n(.*?)```", text, re.S)
    block = next(b for b in blocks if "register(spark)" in b)
    env = block.index('os.environ["PYSPARK_PYTHON"] = sys.executable')
    assert env < block.index("getOrCreate()") < block.index("register(spark)")
