"""Routers in the executable model (spec/SPEC.md section 16, RTR): the pure rules forwarding is
built from, with contracts CrossHair checks (``nox -s crosshair``). Their fixed configuration and
what a router reports are public types (``tidelog.records``), re-exported here.

The forwarding itself lives in ``tidelog.model.log.ModelStore`` (it appends to topics); the
cursor lives in the dest topic's state (``TopicModel.cursors``), so a copy and the cursor
advance over it are one entry of dest's history (RTR-10).
"""

from __future__ import annotations

from collections.abc import Container, Iterable
from fnmatch import fnmatchcase

from tidelog.errors import BadArgument, ConfigMismatch, NoSuchTopic, RouterFanIn
from tidelog.records import RouterConfig, RouterInfo

__all__ = [
    "RouterConfig", "RouterInfo", "passes", "closes_cycle", "fan_in_source", "check_new",
]  # fmt: skip


def passes(
    tag: str | None, node: str | None, filter_tag: str | None, exclude_node: str | None
) -> bool:
    """RTR-4: whether a live record with ``tag``/``node`` passes a router's filter.

    post: filter_tag is not None or exclude_node is not None or __return__
    post: not __return__ or exclude_node is None or node != exclude_node
    post: not __return__ or filter_tag is None or tag is not None
    """
    if exclude_node is not None and node == exclude_node:
        return False
    return filter_tag is None or (tag is not None and fnmatchcase(tag, filter_tag))


def closes_cycle(edges: Iterable[tuple[str, str]], source: str, dest: str) -> bool:
    """RTR-9: whether a new router ``source -> dest`` closes a cycle with ``edges``.

    post: source != dest or __return__
    """
    succ: dict[str, set[str]] = {}
    for a, b in edges:
        succ.setdefault(a, set()).add(b)
    seen: set[str] = set()
    todo = [dest]
    while todo:
        node = todo.pop()
        if node == source:
            return True
        if node not in seen:
            seen.add(node)
            todo.extend(succ.get(node, ()))
    return False


def fan_in_source(edges: Iterable[tuple[str, str]], source: str, dest: str) -> str | None:
    """RTR-9: another source already feeding ``dest``, if any (a router from it is refused).

    post: __return__ is None or __return__ != source
    """
    others = sorted(a for a, b in edges if b == dest and a != source)
    return others[0] if others else None


def check_new(
    name: str,
    config: RouterConfig,
    old: RouterConfig | None,
    topics: Container[str],
    routers: Iterable[RouterConfig],
) -> bool:
    """RTR-1, RTR-2, RTR-9: whether ``Store.router(name, config)`` creates a router (True) or
    opens the stored one ``old`` (False); raises what it must refuse with, changing nothing."""
    if old is not None:
        diff = old.mismatch(config)
        if diff is not None:
            key, stored, given = diff
            raise ConfigMismatch(
                f"router {name!r} exists with {key}={stored!r}; got {key}={given!r} "
                "(config is fixed at creation, RTR-2)"
            )
        return False
    source, dest = config.source, config.dest
    for topic in (source, dest):
        if topic not in topics:
            raise NoSuchTopic(f"topic {topic!r} does not exist (router {name!r})")
    edges = [(r.source, r.dest) for r in routers]
    other = fan_in_source(edges, source, dest)
    if other is not None:
        raise RouterFanIn(
            f"topic {dest!r} already receives from {other!r}; a router from "
            f"{source!r} into it is refused (RTR-9, router_dest_fan_in)"
        )
    if not config.allow_cycle and closes_cycle(edges, source, dest):
        raise BadArgument(
            f"router {name!r} {source!r} -> {dest!r} closes a cycle of routers; "
            "pass allow_cycle=True to permit it (RTR-9)"
        )
    return True
