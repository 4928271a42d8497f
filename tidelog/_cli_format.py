"""Output helpers of the ``tidelog`` CLI (tidelog.cli): escapes, record lines, JSON shapes,
the inspect report.

Kept apart from the commands so cli.py stays about what each command does.
"""

from __future__ import annotations

import base64
import dataclasses
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

import click

from tidelog.records import Item, RouterConfig, Tombstone

__all__ = [
    "CONFIG_FIRST",
    "escape",
    "escape_bytes",
    "show",
    "jsonable",
    "ts_text",
    "item_line",
    "item_json",
    "item_end",
    "aligned",
    "flat_rows",
    "print_inspect",
]

# The topic config keys a person checks first; inspect shows the rest too.
CONFIG_FIRST = ("durability", "cap_records", "cap_bytes", "ttl_ms", "discard", "retention", "trim")

_NAMED = {"\\": "\\\\", "\t": "\\t", "\n": "\\n", "\r": "\\r"}


def _escape_char(ch: str) -> str:
    named = _NAMED.get(ch)
    if named is not None:
        return named
    cp = ord(ch)
    if 0xDC80 <= cp <= 0xDCFF:  # a byte that is not UTF-8, kept by surrogateescape
        return f"\\x{cp - 0xDC00:02x}"
    if cp < 0x80:
        return f"\\x{cp:02x}"
    return f"\\u{cp:04x}" if cp <= 0xFFFF else f"\\U{cp:08x}"


def escape(text: str) -> str:
    """``text`` with every non-printable character and the backslash escaped (spec/CLI.md
    CLI-5): one line, nothing a terminal would act on, decodable back to the exact text."""
    if text.isprintable() and "\\" not in text:
        return text
    return "".join(ch if ch.isprintable() and ch != "\\" else _escape_char(ch) for ch in text)


def escape_bytes(data: bytes) -> str:
    """Bytes as escaped UTF-8 text; a byte that is not UTF-8 reads ``\\xNN`` (NN >= 80, CLI-5)."""
    return escape(data.decode("utf-8", "surrogateescape"))


def _label(value: str | None) -> str:
    # "-" alone means no label, so a label that is exactly "-" is written escaped (CLI-5).
    if value is None:
        return "-"
    return "\\x2d" if value == "-" else escape(value)


def show(value: object) -> str:
    if value is None:
        return "none"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, (frozenset, set, list, tuple)):
        return ",".join(sorted(show(v) for v in value))
    return escape(str(value))


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
    """One item, one line: seq, time, tag, node, payload separated by tabs (CLI-5)."""
    if isinstance(item, Tombstone):
        return f"TOMBSTONE gap {item.gap_from}..{item.gap_to} (records lost involuntarily)"
    return "\t".join(
        (
            str(item.seq),
            ts_text(item.ts),
            _label(item.tag),
            _label(item.node),
            escape_bytes(item.payload),
        )
    )


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


# ---------------------------------------------------------------------------------------------
# inspect (CLI-7)
# ---------------------------------------------------------------------------------------------
def _is_scalar(value: object) -> bool:
    return value is None or isinstance(value, (bool, int, float, str))


def flat_rows(facts: Mapping[str, Any], prefix: str = "") -> list[tuple[str, str]]:
    """``key, value`` rows: nested mappings as dotted keys, a list of short words on one row
    (``disk,fsync``), any other list one row per element under the same key."""
    rows: list[tuple[str, str]] = []
    for key, value in facts.items():
        name = escape(f"{prefix}{key}")
        if isinstance(value, Mapping) and value:
            rows += flat_rows(value, f"{prefix}{key}.")
        elif isinstance(value, (list, tuple, set, frozenset)) and value:
            items = sorted(value, key=str) if isinstance(value, (set, frozenset)) else value
            words = all(_is_scalar(v) and " " not in str(v) for v in items)
            if words and sum(len(str(v)) + 1 for v in items) <= 60:
                rows.append((name, show(list(items))))
            else:
                rows += [(name, show(v) if _is_scalar(v) else show(jsonable(v))) for v in items]
        elif isinstance(value, (Mapping, list, tuple, set, frozenset)):
            rows.append((name, "none"))
        else:
            rows.append((name, show(value)))
    return rows


def aligned(rows: Sequence[Sequence[str]], indent: str = "  ") -> list[str]:
    """Columns padded to their widest cell, two spaces apart; no trailing blanks."""
    if not rows:
        return []
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]) - 1)]
    lines = []
    for row in rows:
        cells = [cell.ljust(w) for cell, w in zip(row, widths, strict=False)] + [row[-1]]
        lines.append((indent + "  ".join(cells)).rstrip())
    return lines


def _heading(text: str) -> None:
    click.secho(text, bold=True)  # click drops the style when stdout is not a terminal


def print_inspect(report: Mapping[str, Any]) -> None:
    view = " (read-only view)" if report.get("read_only_view") else ""
    _heading(f"store {escape(str(report['uri']))}{view}")
    for line in aligned(flat_rows(report["describe"])):
        click.echo(line)
    _heading("capabilities")
    for line in aligned(flat_rows(report["capabilities"])):
        click.echo(line)
    if not report["topics"]:
        click.echo("\nno topics")
    for name, t in report["topics"].items():
        cfg: dict[str, object] = t["config"]
        facts: dict[str, object] = dict(t["state"])
        facts.update((k, cfg[k]) for k in CONFIG_FIRST)
        facts.update((k, v) for k, v in cfg.items() if k not in CONFIG_FIRST)
        facts.update(t["describe"])
        click.echo()
        _heading(f"topic {escape(name)}")
        for line in aligned(flat_rows(facts)):
            click.echo(line)
        if t["subscribers"]:
            rows = [("subscriber", "hwm", "lag")]
            rows += [(escape(s), str(p["hwm"]), str(p["lag"])) for s, p in t["subscribers"].items()]
            for line in aligned(rows):
                click.echo(line)
        else:
            click.echo("  no subscribers")
    _print_routers(report["routers"])


# The router options (RTR-1) with their defaults: a row names only those set otherwise.
_ROUTER_DEFAULTS = {
    f.name: f.default
    for f in dataclasses.fields(RouterConfig)
    if f.default is not dataclasses.MISSING
}


def _router_rows(routers: Mapping[str, Mapping[str, Any]]) -> list[tuple[str, ...]]:
    """The routers table (CLI-11): name, ``source -> dest``, cursor, lag, ``ok`` or
    ``stalled``, and the options that differ from their defaults (``-`` when none)."""
    rows: list[tuple[str, ...]] = [
        ("router", "source -> dest", "cursor", "lag", "state", "options")
    ]
    for name, r in routers.items():
        options = " ".join(
            f"{key}={show(r[key])}"
            for key, default in _ROUTER_DEFAULTS.items()
            if r[key] != default
        )
        rows.append(
            (
                escape(name),
                f"{escape(r['source'])} -> {escape(r['dest'])}",
                str(r["cursor"]),
                str(r["lag"]),
                "stalled" if r["stalled"] else "ok",
                options or "-",
            )
        )
    return rows


def _print_routers(routers: Mapping[str, Mapping[str, Any]]) -> None:
    if not routers:
        click.echo("\nno routers")
        return
    click.echo()
    _heading("routers")
    for line in aligned(_router_rows(routers)):
        click.echo(line)
