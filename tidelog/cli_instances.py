"""How ``inspect`` and ``tail`` present a store of several instances (spec/INSTANCES.md
INST-13, INST-14): each topic's state per instance, and the merged read with its cursor.

Not a command module: tidelog.cli calls it when the store it opened is an instances store.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import Any

import click

from tidelog import _cli_format as fmt
from tidelog.api import Store, Topic
from tidelog.backends.instances import Entry, InstancesBackend, merged
from tidelog.errors import BadArgument
from tidelog.hooks import hooks, offers

__all__ = ["is_instances", "topic_report", "entry_line", "entry_json", "tail_merged"]


def is_instances(store: Store) -> bool:
    return offers(store, InstancesBackend)


def topic_report(store: Store, name: str) -> dict[str, Any]:
    """INST-13: a topic's shared config, and its state (with the share of its caps in use)
    in each instance that holds it, keyed by instance number."""
    per = hooks(store, InstancesBackend).describe()["per_instance"]
    assert isinstance(per, dict)
    states = {i: p["topics"][name] for i, p in per.items() if name in p["topics"]}
    return {
        "config": store.topic(name, create=False).config.to_dict(),
        "state": states,
        "subscribers": {},
        "describe": {},
    }


def entry_line(entry: Entry) -> str:
    """INST-14: ``tail``'s line of one merged item: its seq field is ``INSTANCE:SEQ``."""
    return f"{entry.instance}:{fmt.item_line(entry.item)}"


def entry_json(entry: Entry) -> dict[str, object]:
    return {"instance": entry.instance, **fmt.item_json(entry.item)}


def tail_merged(
    store: Store,
    handle: Topic,
    cursor: str | None,
    after: int,
    limit: int | None,
    follow: bool,
    interval: float,
    show: Callable[[Entry], str],
) -> None:
    """INST-14: print the merged read from ``cursor`` (CLI-4's loop over INST-7's read); at
    the end, the cursor to resume from goes to stderr."""
    if after:
        raise BadArgument(
            "--after is a seq of one log; a store of several instances resumes from "
            "--cursor (INST-14)"
        )
    m = merged(handle)
    batch, left = 1000, limit
    try:
        while left is None or left > 0:
            want = batch if left is None else min(batch, left)
            items, cursor = m.read(cursor, want)
            if items:
                click.echo("".join(f"{show(e)}\n" for e in items), nl=False)
            if left is not None:
                left -= len(items)
            if len(items) < want:
                if not follow:
                    return
                sys.stdout.flush()
                time.sleep(interval)  # each merged read refreshes every instance (INST-4)
    finally:
        click.echo(f"cursor {cursor}", err=True)
