"""Routers in the executable model (spec/SPEC.md section 16, RTR): their fixed configuration,
what a router reports, and the pure rules forwarding is built from, with contracts CrossHair
checks (``nox -s crosshair``).

The forwarding itself lives in ``tidelog.model.log.ModelStore`` (it appends to topics); the
cursor lives in the dest topic's state (``TopicModel.cursors``), so a copy and the cursor
advance over it are one entry of dest's history (RTR-10).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from fnmatch import fnmatchcase

__all__ = ["RouterConfig", "RouterInfo", "passes", "closes_cycle", "fan_in_source"]


@dataclass(frozen=True)
class RouterConfig:
    """What ``Store.router`` fixes at creation (RTR-1, RTR-2)."""

    source: str
    dest: str
    filter_tag: str | None = None
    exclude_node: str | None = None
    preserve_tag: bool = True
    preserve_node: bool = True
    allow_cycle: bool = False

    def mismatch(self, other: RouterConfig) -> tuple[str, object, object] | None:
        """RTR-2: the first key where ``other`` differs from this stored config, if any."""
        for key in self.__dataclass_fields__:
            if getattr(self, key) != getattr(other, key):
                return key, getattr(self, key), getattr(other, key)
        return None


@dataclass(frozen=True)
class RouterInfo:
    """One router as ``Store.router`` and ``Store.routers`` report it (RTR-1)."""

    name: str
    config: RouterConfig
    cursor: int
    lag: int


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
