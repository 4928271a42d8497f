"""Value types returned by the API: records, tombstones, leases, topic state, routers.

They are NamedTuples: immutable, cheap to build on the read hot path, comparable with ``==`` (the
stateful suite compares backend and model results directly) and easy to turn into JSON.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

__all__ = ["Record", "Tombstone", "Lease", "TopicState", "Item", "RouterConfig", "RouterInfo"]


class Record(NamedTuple):
    """One live record (spec TOP-5)."""

    seq: int
    ts: int
    tag: str | None
    node: str | None
    payload: bytes


class Tombstone(NamedTuple):
    """Seqs ``gap_from..gap_to`` (inclusive) may have been lost to the reader (spec TMB)."""

    gap_from: int
    gap_to: int


class Lease(NamedTuple):
    """A claimed queue job (spec QUE-1, QUE-6)."""

    seq: int
    lease_id: int
    deadline_ms: int
    deliveries: int
    record: Record


@dataclass(frozen=True, slots=True)
class TopicState:
    """Observable floors and totals of a topic (spec TOP-2, TOP-3). A dataclass, not a
    NamedTuple, because its ``count`` field would shadow ``tuple.count``."""

    head_seq: int
    earliest_seq: int
    evict_floor: int
    count: int
    bytes: int

    def to_dict(self) -> dict[str, int]:
        return {f: getattr(self, f) for f in self.__slots__}


Item = Record | Tombstone


@dataclass(frozen=True)
class RouterConfig:
    """What ``Store.router`` fixes at creation (spec RTR-1, RTR-2)."""

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

    def to_dict(self) -> dict[str, object]:
        return {f: getattr(self, f) for f in self.__dataclass_fields__}


@dataclass(frozen=True)
class RouterInfo:
    """One router as ``Store.router`` and ``Store.routers`` report it (spec RTR-1): ``cursor``
    is the highest source seq it has dealt with, ``lag`` how many source seqs it has not."""

    name: str
    config: RouterConfig
    cursor: int
    lag: int

    def to_dict(self) -> dict[str, object]:
        return {"name": self.name, **self.config.to_dict(), "cursor": self.cursor, "lag": self.lag}
