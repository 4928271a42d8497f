"""Output helpers of the ``tidelog`` CLI (tidelog.cli): record lines, JSON shapes, tables.

Kept apart from the commands so cli.py stays about what each command does.
"""

from __future__ import annotations

import base64
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

from rich.console import Console
from rich.table import Table

from tidelog.records import Item, Tombstone

__all__ = [
    "CONFIG_FIRST",
    "console",
    "show",
    "jsonable",
    "ts_text",
    "item_line",
    "item_json",
    "item_end",
    "kv_table",
    "print_inspect",
]

# The topic config keys a person checks first; inspect shows the rest too.
CONFIG_FIRST = ("durability", "cap_records", "cap_bytes", "ttl_ms", "discard", "retention", "trim")


def console() -> Console:
    # Built per command so click's CliRunner (which swaps sys.stdout) captures it; no highlighting
    # because numbers and names should read the same in a terminal and in a pipe.
    return Console(highlight=False)


def show(value: object) -> str:
    if value is None:
        return "none"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, (frozenset, set, list, tuple)):
        return ",".join(sorted(str(v) for v in value))
    return str(value)


def jsonable(value: object) -> object:
    """Plain JSON types with a stable order (sets sorted), for --json output."""
    if isinstance(value, Mapping):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, (frozenset, set)):
        return sorted(jsonable(v) for v in value)  # type: ignore[type-var]
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    return str(value)


def ts_text(ts: int) -> str:
    try:
        when = datetime.fromtimestamp(ts / 1000, UTC)
    except (OverflowError, OSError, ValueError):
        return str(ts)
    return when.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def item_line(item: Item) -> str:
    if isinstance(item, Tombstone):
        return f"TOMBSTONE gap {item.gap_from}..{item.gap_to} (records lost involuntarily)"
    text = item.payload.decode("utf-8", "backslashreplace")
    # One record per line: a raw newline in a payload would read as a second record.
    text = text.replace("\n", "\\n").replace("\r", "\\r")
    return f"{item.seq}\t{ts_text(item.ts)}\t{item.tag or '-'}\t{item.node or '-'}\t{text}"


def item_json(item: Item) -> dict[str, object]:
    if isinstance(item, Tombstone):
        return {"type": "tombstone", "gap_from": item.gap_from, "gap_to": item.gap_to}
    return {
        "type": "record",
        "seq": item.seq,
        "ts": item.ts,
        "tag": item.tag,
        "node": item.node,
        "payload_b64": base64.b64encode(item.payload).decode("ascii"),
    }


def item_end(item: Item) -> int:
    """The read cursor after an item (spec TOP-8: resume after a tombstone's gap_to)."""
    return item.gap_to if isinstance(item, Tombstone) else item.seq


def kv_table(rows: Sequence[tuple[str, object]]) -> Table:
    table = Table(show_header=False, box=None, padding=(0, 2))
    table.add_column(style="bold")
    table.add_column()
    for key, value in rows:
        table.add_row(key, show(value))
    return table


def print_inspect(report: Mapping[str, Any]) -> None:
    out = console()
    # Headings are separate lines, not table titles: rich wraps a title to its table's width.
    out.print(f"store {report['uri']}", style="bold", markup=False)
    out.print(kv_table(list(report["describe"].items())))
    out.print("capabilities", style="bold")
    out.print(kv_table(list(report["capabilities"].items())))
    if not report["topics"]:
        out.print("\nno topics")
    for name, t in report["topics"].items():
        cfg: dict[str, object] = t["config"]
        rows: list[tuple[str, object]] = list(t["state"].items())
        rows += [(k, cfg[k]) for k in CONFIG_FIRST]
        rows += [(k, v) for k, v in cfg.items() if k not in CONFIG_FIRST]
        rows += list(t["describe"].items())
        out.print()
        out.print(f"topic {name}", style="bold", markup=False)
        out.print(kv_table(rows))
        if t["subscribers"]:
            subs = Table("subscriber", "hwm", "lag", box=None, padding=(0, 2))
            for sub, p in t["subscribers"].items():
                subs.add_row(sub, str(p["hwm"]), str(p["lag"]))
            out.print(subs)
        else:
            out.print("  no subscribers")
