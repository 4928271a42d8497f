"""Conformance levels (spec/CONFORMANCE.md §1): what each one adds, the spec rules it binds,
and which implementations it applies to.

A level applies when the implementation claims what it needs (its ``Store.capabilities``, spec
CAP, and what its driver says it can do in ``hello``). A level that does not apply is reported
``n/a`` and never counted as passed; for the capability-gated ones the runner checks instead that
the implementation refuses the level's operations with ``not_available`` (CAP-1).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from tidelog.backend import Capabilities

__all__ = ["Level", "LEVELS", "ORDER", "applies", "level_caps"]


@dataclass(frozen=True)
class Level:
    name: str
    title: str
    binds: str  # spec rule ids (families with *)
    needs: str  # what the implementation must claim, in words


ORDER = ("log", "subscribers", "queue", "routers", "crash", "ring", "forward")

LEVELS: dict[str, Level] = {
    "log": Level(
        "log",
        "log only: topics, reads, tombstones, deletes, retention, errors, clean restart",
        "TOP-1..TOP-11 TMB-1..TMB-5 DEL-1..DEL-6 RET-1..RET-7 ERR-1 ERR-2 DUR-1 DUR-7 DUR-8 "
        "CAP-1 CAP-2",
        "every implementation (DEL-* only with capability deletes)",
    ),
    "subscribers": Level(
        "subscribers",
        "+ durable subscribers and the high-water mark",
        "SUB-1..SUB-9",
        "capability subscribers",
    ),
    "queue": Level(
        "queue",
        "+ queue mode: leases, reclaim, dead letter",
        "QUE-1..QUE-8",
        "capability queue",
    ),
    "routers": Level(
        "routers",
        "+ routers: topic -> topic forwarding with durable cursors",
        "RTR-1..RTR-12",
        "capability routers",
    ),
    "crash": Level(
        "crash",
        "+ crash safety: power loss between and inside operations (and inside forwarding)",
        "DUR-2..DUR-6 DUR-9 CRASH-7 (with capability routers also RTR-10 RTR-11)",
        "capability crash_safe, and a driver that can crash (hello.crash)",
    ),
    "ring": Level(
        "ring",
        "+ at-least-once ring: page-number head detection, overwrite as eviction, laps",
        "RING-1..RING-6 BDEV-16 (and every rule above, across ring laps)",
        "the ring_head request; the stateful part runs when the store is a ring",
    ),
    "forward": Level(
        "forward",
        "+ store-and-forward: FSN bookkeeping of the sending side over a durable slot",
        "FSN-1..FSN-8 SF-10 SF-13",
        "the sf_* requests",
    ),
}


def applies(level: str, caps: Capabilities, hello: dict[str, Any]) -> str | None:
    """None when ``level`` applies; else the reason it does not."""
    ops = set(hello.get("ops") or ())
    if level == "subscribers" and not caps.subscribers:
        return "capability subscribers is False"
    if level == "queue" and not caps.queue:
        return "capability queue is False"
    if level == "routers" and not caps.routers:
        return "capability routers is False"
    if level == "crash":
        if not caps.crash_safe:
            return "capability crash_safe is False"
        if "between" not in (hello.get("crash") or ()):
            return "the driver cannot simulate a crash"
    if level == "ring" and "ring_head" not in ops:
        return "the driver has no ring_head request"
    if level == "forward" and "sf_open" not in ops:
        return "the driver has no store-and-forward (sf_*) requests"
    return None


def level_caps(level: str, caps: Capabilities) -> Capabilities:
    """The capabilities a level exercises: each level switches off the rule families of the
    levels it does not include (CNF-1), so a defect fails the level binding its rule. Routers
    run in the ``routers`` level and, where they meet power loss (RTR-10, RTR-11), in
    ``crash``."""
    if level == "log":
        return replace(caps, subscribers=False, queue=False, routers=False)
    if level in ("subscribers", "ring"):
        return replace(caps, queue=False, routers=False)
    if level == "queue":
        return replace(caps, routers=False)
    if level in ("crash", "routers"):
        return replace(caps, queue=False)
    return caps
