"""The service rows in the report (``report``): tidelog serve beside each peer, measurement by
measurement, the priority rows, and the service's speed targets (bench/README.md)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .service_cases import BATCH

__all__ = ["annotate", "section", "targets", "TARGETS", "PEERS"]

#: the peers, in the table's order, with what they are
PEERS = {"nats": "NATS JetStream", "redis": "Redis Streams"}
#: the measurements compared side by side: (id suffix, what, the metric, higher is better)
_MEASURES = (
    ("append_c1", "appends/s, 1 client, each answer awaited", "rec_per_s", True),
    ("append_c8", "appends/s, 8 clients, each answer awaited", "rec_per_s", True),
    ("push", "append -> live delivery p50 µs", "p50_us", False),
    ("push", "append -> live delivery p99 µs", "p99_us", False),
    ("push", "of which the append's round trip, p50 µs", "append_p50_us", False),
    (
        "push",
        "event after the append's answer p50 µs (SVC-29's measure)",
        "after_answer_p50_us",
        False,
    ),
    (
        "push",
        "event after the append's answer p99 µs (SVC-29's measure)",
        "after_answer_p99_us",
        False,
    ),
    ("consume", f"consume + ack rec/s (batches of {BATCH})", "rec_per_s", True),
)
_CPU = (
    ("append_c8", "server CPU µs per append, 8 clients", "server_cpu_us_per_rec"),
    ("append_c8", "load generator CPU µs per append, 8 clients", "client_cpu_us_per_rec"),
)

TARGETS = [
    (
        "service_append_c8",
        "service: durable appends from 8 clients >= 1.0x the faster durable peer",
    ),
    ("service_push_p50", "service: append -> SSE p50 <= 1 ms at a fixed moderate rate"),
    ("service_push_p99", "service: append -> SSE p99 <= 5 ms at a fixed moderate rate"),
    (
        "service_priority",
        "service: high-priority push p99 within 2x of idle while "
        "low-priority topics saturate the server",
    ),
]


def _row(rows: list[dict[str, Any]], cid: str) -> dict[str, Any] | None:
    return next((r for r in rows if r["id"] == cid), None)


def _med(row: dict[str, Any] | None, metric: str) -> float | None:
    if row is None or metric not in row["metrics"]:
        return None
    return float(row["metrics"][metric]["median"])


def _ratio(a: float | None, b: float | None) -> float | None:
    return None if a is None or not b else a / b


def annotate(rows: list[dict[str, Any]], compare: Callable[..., None]) -> None:
    """Each tidelog service row gets its ratio to each peer's same row (``x_nats``,
    ``x_redis``: rate ratios, or for the push rows ``x_<peer>_p50`` / ``_p99`` latency ratios,
    higher = slower); the loaded priority row its ratios to the idle one (``x_idle_p50`` /
    ``_p99``). ``compare(row, other, key, latency)`` is ``report``'s. The generic
    ``x_best_peer`` of a fixed-rate row compares rates the case fixes, so it is dropped."""
    for row in rows:
        if not row["id"].startswith("service_tidelog_"):
            continue
        if row["mode"] in ("svc_push", "svc_priority"):
            row.pop("x_best_peer", None)
            row.pop("best_peer", None)
        what = row["id"].removeprefix("service_tidelog_")
        for peer in PEERS:
            other = _row(rows, f"service_{peer}_{what}")
            compare(row, other, f"x_{peer}", row["mode"] == "svc_push")
    loaded = _row(rows, "service_tidelog_prio_loaded")
    if loaded is not None:
        compare(loaded, _row(rows, "service_tidelog_prio_idle"), "x_idle", True)


def _fmt(v: float | None) -> str:
    if v is None:
        return "-"
    return f"{v:,.0f}" if abs(v) >= 100 else f"{v:.2f}"


def section(rows: list[dict[str, Any]]) -> list[str]:
    """The service table: one line per measurement, tidelog and each peer, and tidelog's ratio
    to each; then the priority rows. Empty when no service row ran."""
    if not any(r["id"].startswith("service_") for r in rows):
        return []
    out = [
        "",
        "## the service on 127.0.0.1 (each server in its own process; one asyncio load "
        "generator; medians [min–max])",
        "",
        "| measurement | tidelog serve | "
        + " | ".join(PEERS.values())
        + " | tidelog x "
        + " | x ".join(PEERS)
        + " |",
        "|---|---|" + "---|" * (2 * len(PEERS)),
    ]

    def cell(row: dict[str, Any] | None, metric: str) -> str:
        if row is None or metric not in row["metrics"]:
            return "not measured"
        m = row["metrics"][metric]
        return f"{_fmt(m['median'])} [{_fmt(m['min'])}–{_fmt(m['max'])}]"

    for what, label, metric, higher in (*_MEASURES, *((w, lab, m, False) for w, lab, m in _CPU)):
        mine = _row(rows, f"service_tidelog_{what}")
        peers = [_row(rows, f"service_{p}_{what}") for p in PEERS]
        # a ratio only of positive figures (an event may come before the append's answer)
        ratios = [
            _ratio(a, b) if a is not None and b is not None and a > 0 and b > 0 else None
            for a, b in ((_med(mine, metric), _med(p, metric)) for p in peers)
        ]
        note = "" if higher else " (lower is better)"
        out.append(
            f"| {label}{note} | {cell(mine, metric)} | "
            + " | ".join(cell(p, metric) for p in peers)
            + " | "
            + " | ".join(_fmt(r) + ("x" if r is not None else "") for r in ratios)
            + " |"
        )
    out += [
        "",
        "Durability of an answered append: tidelog `fsync` topic and Redis `appendfsync "
        "always` sync before answering; NATS JetStream 2.9 answers once the message is in "
        "the page cache (no per-message sync in 2.9; its blocks are fsynced every 2 min).",
    ]
    idle, loaded = (
        _row(rows, "service_tidelog_prio_idle"),
        _row(rows, "service_tidelog_prio_loaded"),
    )
    if idle is not None or loaded is not None:
        out += [
            "",
            "Priority (tidelog): a priority 1000 topic's append -> SSE p50 / p99 µs, idle "
            "and while low-priority topics saturate the server:",
            "",
        ]
        out.append(f"- idle: {_fmt(_med(idle, 'p50_us'))} / {_fmt(_med(idle, 'p99_us'))}")
        if loaded is not None:
            m = {
                k: _med(loaded, k)
                for k in (
                    "low_rec_per_s",
                    "server_cpu_share",
                    "low_throttled",
                    "low_events_deferred",
                )
            }
            out.append(
                f"- loaded: {_fmt(_med(loaded, 'p50_us'))} / {_fmt(_med(loaded, 'p99_us'))} "
                f"(**{_fmt(loaded.get('x_idle_p50'))}x / {_fmt(loaded.get('x_idle_p99'))}x** "
                f"idle); low topics {_fmt(m['low_rec_per_s'])} appends/s, server CPU "
                f"{_fmt(m['server_cpu_share'])} cores, {_fmt(m['low_throttled'] or 0.0)} appends "
                f"refused with 429, {_fmt(m['low_events_deferred'] or 0.0)} `deferred` events"
            )
    return out


def targets(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The service targets in ``report``'s form (value, goal, met, detail)."""
    text = dict(TARGETS)
    out: list[dict[str, Any]] = []

    def add(key: str, value: float | None, goal: float, detail: str, le: bool = False) -> None:
        met = None if value is None else (value <= goal if le else value >= goal)
        out.append(
            {
                "id": key,
                "target": text[key],
                "value": value,
                "goal": goal,
                "met": met,
                "detail": detail,
            }
        )

    mine = _med(_row(rows, "service_tidelog_append_c8"), "rec_per_s")
    durable = {
        p: _med(r, "rec_per_s")
        for p in PEERS
        if (r := _row(rows, f"service_{p}_append_c8")) and r["tier"] == "durable"
    }
    others = {
        p: _med(r, "rec_per_s")
        for p in PEERS
        if (r := _row(rows, f"service_{p}_append_c8")) and r["tier"] != "durable"
    }
    best = max((v for v in durable.values() if v), default=None)
    detail = "; ".join(
        [f"x {p} {_fmt(_ratio(mine, v))} (durable)" for p, v in durable.items()]
        + [f"x {p} {_fmt(_ratio(mine, v))} (not durable per message)" for p, v in others.items()]
    )
    add("service_append_c8", _ratio(mine, best), 1.0, detail or "no peer measured")
    push = _row(rows, "service_tidelog_push")
    after = (
        f"after the append's answer: {_fmt(_med(push, 'after_answer_p50_us'))} / "
        f"{_fmt(_med(push, 'after_answer_p99_us'))} µs"
    )
    add(
        "service_push_p50",
        _med(push, "p50_us"),
        1000.0,
        "µs from before the append; " + after,
        le=True,
    )
    add(
        "service_push_p99",
        _med(push, "p99_us"),
        5000.0,
        "µs from before the append; " + after,
        le=True,
    )
    loaded = _row(rows, "service_tidelog_prio_loaded")
    add(
        "service_priority",
        loaded.get("x_idle_p99") if loaded else None,
        2.0,
        f"loaded p99 / idle p99; server CPU {_fmt(_med(loaded, 'server_cpu_share'))} cores",
        le=True,
    )
    return out
