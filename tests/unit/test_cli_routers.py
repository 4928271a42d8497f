"""`tidelog inspect` shows routers (spec/CLI.md CLI-11; SPEC RTR-1): name, source -> dest,
options, cursor, lag and which are stalled, in text and --json, on memory://NAME and on a file://
store through its read-only view (closed, reopened, or held by a writer)."""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

import tidelog
from tidelog.backends import memory
from tidelog.cli import main


@pytest.fixture
def uri() -> Iterator[str]:
    name = f"clirouters-{uuid.uuid4().hex[:12]}"
    yield f"memory://{name}"
    memory.forget(name)


def run(*args: str) -> Result:
    return CliRunner().invoke(main, list(args))


def populate(store: tidelog.Store) -> None:
    """Routers `fan` (events -> copy, defaults) and `narrow` (events -> full, a filter and
    preserve_node off) into a dest capped at 2 records that rejects: after 5 appends `fan` has
    forwarded all of them and `narrow` is stalled at cursor 2 (RTR-6); `other` -> `side`."""
    events = store.topic("events")
    store.topic("copy")
    store.topic("full", cap_records=2, discard="reject")
    store.topic("other")
    store.topic("side")
    store.router("fan", "events", "copy")
    store.router("narrow", "events", "full", filter_tag="s*", preserve_node=False)
    store.router("side", "other", "side")
    events.append_many([b"1", b"2", b"3", b"4", b"5"], tag="s1")


def routers_section(out: str) -> list[str]:
    return out[out.index("\nrouters\n") + 1 :].splitlines()


def test_CLI_11_inspect_text_lists_routers_and_marks_the_stalled_one(uri: str) -> None:
    """CLI-11: a `routers` section after the topics: one aligned row per router in name order
    with source -> dest, cursor, lag, ok/stalled and only the options set otherwise."""
    with tidelog.open(uri) as store:
        populate(store)
    result = run("inspect", uri)
    assert result.exit_code == 0, result.output
    out = result.stdout
    assert out.index("topic side") < out.index("\nrouters\n")
    assert routers_section(out) == [
        "routers",
        "  router  source -> dest  cursor  lag  state    options",
        "  fan     events -> copy  5       0    ok       -",
        "  narrow  events -> full  2       3    stalled  filter_tag=s* preserve_node=no",
        "  side    other -> side   0       0    ok       -",
    ]
    assert "no routers" not in out


def test_CLI_11_inspect_json_has_every_router_field_and_stalled(uri: str) -> None:
    """CLI-11: --json "routers" maps each name to its creation arguments (RTR-1), cursor, lag
    (head_seq(source) - cursor) and stalled (lag > 0)."""
    with tidelog.open(uri) as store:
        populate(store)
    result = run("inspect", uri, "--json")
    assert result.exit_code == 0, result.output
    routers = json.loads(result.stdout)["routers"]
    assert list(routers) == ["fan", "narrow", "side"]
    assert routers["narrow"] == {
        "source": "events",
        "dest": "full",
        "filter_tag": "s*",
        "exclude_node": None,
        "preserve_tag": True,
        "preserve_node": False,
        "allow_cycle": False,
        "cursor": 2,
        "lag": 3,
        "stalled": True,
    }
    assert routers["fan"]["cursor"] == 5 and routers["fan"]["lag"] == 0
    assert routers["fan"]["stalled"] is False


def test_CLI_11_topic_option_keeps_the_routers_into_or_out_of_it(uri: str) -> None:
    """CLI-11: with --topic, only routers whose source or dest is that topic are shown."""
    with tidelog.open(uri) as store:
        populate(store)
    for topic, names in (("events", ["fan", "narrow"]), ("side", ["side"]), ("copy", ["fan"])):
        result = run("inspect", uri, "--topic", topic, "--json")
        assert result.exit_code == 0, result.output
        assert list(json.loads(result.stdout)["routers"]) == names
    with tidelog.open(uri) as store:
        store.topic("lonely")
    result = run("inspect", uri, "--topic", "lonely")
    assert result.exit_code == 0, result.output
    assert result.stdout.endswith("\nno routers\n")


def test_CLI_11_no_routers_line_and_empty_json(uri: str) -> None:
    """CLI-11: a store without routers says `no routers`; --json has an empty mapping."""
    with tidelog.open(uri) as store:
        store.topic("events").append(b"x")
    result = run("inspect", uri)
    assert result.exit_code == 0, result.output
    assert result.stdout.endswith("  no subscribers\n\nno routers\n")
    assert json.loads(run("inspect", uri, "--json").stdout)["routers"] == {}


def test_CLI_11_CLI_5_router_options_are_escaped(uri: str) -> None:
    """CLI-11, CLI-5: a filter glob or node holding control characters is one escaped cell;
    --json keeps it exact."""
    with tidelog.open(uri) as store:
        store.topic("a")
        store.topic("b")
        store.router("r", "a", "b", filter_tag="x\x1b[2J*", exclude_node="n\tq")
    result = run("inspect", uri)
    assert result.exit_code == 0, result.output
    assert "\x1b" not in result.stdout
    assert routers_section(result.stdout)[2] == (
        "  r       a -> b          0       0    ok     filter_tag=x\\x1b[2J* exclude_node=n\\tq"
    )
    routers = json.loads(run("inspect", uri, "--json").stdout)["routers"]
    assert routers["r"]["filter_tag"] == "x\x1b[2J*" and routers["r"]["exclude_node"] == "n\tq"


def test_CLI_11_file_store_reopened_shows_stored_cursors(tmp_path: Path) -> None:
    """CLI-11, RTR-10, RTR-11: a file:// store closed and reopened by inspect's read-only view
    shows every router with the cursor it had at close, the stalled one still stalled; after the
    writer reopens and dest makes room for two copies, inspect shows it moved on by two."""
    uri = f"file://{tmp_path / 'store'}"
    with tidelog.open(uri) as store:
        populate(store)
    result = run("inspect", uri, "--json")
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert report["read_only_view"] is True
    got = {n: (r["cursor"], r["lag"], r["stalled"]) for n, r in report["routers"].items()}
    assert got == {"fan": (5, 0, False), "narrow": (2, 3, True), "side": (0, 0, False)}
    text = run("inspect", uri).stdout
    assert re.search(r"^  narrow\s+events -> full\s+2\s+3\s+stalled\s", text, re.M)
    with tidelog.open(uri) as store:
        # room for two copies in dest: the retry forwards two of the three (RTR-6, RTR-8)
        store.topic("full").delete(before_seq=3)
        assert (store.routers()[1].cursor, store.routers()[1].lag) == (4, 1)
    narrow = json.loads(run("inspect", uri, "--json").stdout)["routers"]["narrow"]
    assert (narrow["cursor"], narrow["lag"], narrow["stalled"]) == (4, 1, True)
    text = run("inspect", uri).stdout
    assert re.search(r"^  narrow\s+events -> full\s+4\s+1\s+stalled\s", text, re.M)


def test_CLI_11_file_store_held_by_a_writer(tmp_path: Path) -> None:
    """CLI-11, CLI-3: beside an open writer (its lock held) inspect reads the routers through
    the read-only view: what the writer had made durable, its cursors and lag included."""
    uri = f"file://{tmp_path / 'store'}"
    with tidelog.open(uri) as store:
        populate(store)
        store.flush()
        result = run("inspect", uri, "--json")
        assert result.exit_code == 0, result.output
        routers = json.loads(result.stdout)["routers"]
        assert routers["fan"]["cursor"] == 5 and routers["narrow"]["stalled"] is True
        assert store.routers()[1].lag == 3  # the view changed nothing


def test_CLI_11_RTR_13_a_ring_without_routers_says_so(tmp_path: Path) -> None:
    """CLI-11, RTR-13: a blockdev:// ring cannot hold routers; inspect says `no routers`."""
    uri = f"blockdev://{tmp_path / 'ring.img'}?size=264KiB&page_size=4096&topic=events"
    with tidelog.open(uri) as store:
        assert store.capabilities.routers is False
        store.topic("events").append(b"x")
    result = run("inspect", uri)
    assert result.exit_code == 0, result.output
    assert result.stdout.endswith("\nno routers\n")
    assert json.loads(run("inspect", uri, "--json").stdout)["routers"] == {}
