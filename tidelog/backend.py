"""The contract between the public API (tidelog.api) and a backend.

The public classes validate and normalise every argument once, then call a Backend with clean
values, so every backend (and the model, which implements this same interface) sees identical
input and raises identical errors. A backend owns the semantics of spec/SPEC.md; the
``tidelog.backends.common`` engine implements them once for backends that only differ in storage.
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from .config import DURABILITY_CLASSES, TopicConfig
from .errors import NotAvailable
from .options import parse_size
from .records import Item, Lease, RouterConfig, RouterInfo, TopicState

__all__ = ["Backend", "Capabilities", "TopicRef", "COMMON_OPTIONS", "StoreOptions"]


@dataclass(frozen=True)
class Capabilities:
    """What a backend guarantees (spec CAP-1, CAP-2)."""

    persistent: bool = False
    crash_safe: bool = False
    deletes: bool = True
    subscribers: bool = True
    queue: bool = True
    multi_topic: bool = True
    exact_progress: bool = True
    routers: bool = False  # RTR-*: Store.router (section 16)
    durability: frozenset[str] = field(default_factory=lambda: frozenset(DURABILITY_CLASSES))

    def to_dict(self) -> dict[str, object]:
        out: dict[str, object] = {f: getattr(self, f) for f in self.__dataclass_fields__}
        out["durability"] = sorted(self.durability)
        return out


@dataclass(frozen=True)
class TopicRef:
    """Opaque handle a backend issues for one incarnation of a topic (spec TOP-10)."""

    name: str
    incarnation: int


@dataclass(frozen=True)
class StoreOptions:
    """Options every backend accepts (spec URI-5)."""

    max_record_bytes: int = 64 << 20
    max_bytes: int | None = None


#: URI-6: a payload length is a u32 in WAL/segment frames and an i32 in SF frames
MAX_RECORD_BYTES = 1 << 30

COMMON_OPTIONS: dict[str, Any] = {
    "max_record_bytes": lambda k, v: parse_size(k, v, maximum=MAX_RECORD_BYTES),
    "max_bytes": lambda k, v: parse_size(k, v),
}


class Backend(ABC):
    """A store implementation. Arguments arrive validated by tidelog.api."""

    capabilities: Capabilities

    # -- store -------------------------------------------------------------------------------
    @abstractmethod
    def open_topic(self, name: str, options: Mapping[str, object], create: bool) -> TopicRef: ...

    @abstractmethod
    def topic_config(self, ref: TopicRef) -> TopicConfig: ...

    @abstractmethod
    def list_topics(self) -> list[str]: ...

    @abstractmethod
    def drop_topic(self, name: str) -> None: ...

    @abstractmethod
    def flush(self) -> None: ...

    @abstractmethod
    def close(self) -> None: ...

    # -- topic log ---------------------------------------------------------------------------
    @abstractmethod
    def append(
        self,
        ref: TopicRef,
        payloads: Sequence[bytes],
        tag: str | None,
        node: str | None,
        producer: tuple[str, int] | None = None,
    ) -> list[int]: ...

    def lane(self, ref: TopicRef) -> Callable[[bytes], int | None] | None:
        """Optional: a callable appending one record without tag or node to this topic and
        returning its seq, on a lean path that does only what the common case needs; it
        returns None for "not here", and the caller uses ``append`` (which checks and raises as
        usual). Asked once per topic handle; None: never here. The default has none."""
        return None

    def append_records(
        self,
        ref: TopicRef,
        records: Sequence[tuple[bytes, str | None, str | None]],
        producer: tuple[str, int] | None = None,
    ) -> list[int]:
        """One atomic append of records with their own tag and node (TOP-6)."""
        raise NotAvailable("this backend cannot append records with per-record labels")

    @abstractmethod
    def read(
        self, ref: TopicRef, after: int, limit: int, exclude_node: str | None
    ) -> list[Item]: ...

    @abstractmethod
    def state(self, ref: TopicRef) -> TopicState: ...

    # -- capability-gated operations (CAP-1, REG-4) --------------------------------------------
    # tidelog.api calls these only when the store claims the capability (``deletes``,
    # ``subscribers``, ``queue``, ``routers``) and refuses them itself otherwise, so a backend
    # lacking one leaves its methods out; the defaults raise should one be called all the same.
    def _not_implemented(self, op: str) -> NotAvailable:
        return NotAvailable(f"{type(self).__name__} does not implement {op} (CAP-1)")

    def delete(
        self, ref: TopicRef, before_seq: int | None, tag: str | None, tag_glob: str | None
    ) -> int:
        raise self._not_implemented("delete")

    # -- durable subscribers -----------------------------------------------------------------
    def subscribe(self, ref: TopicRef, name: str, start: str) -> None:
        raise self._not_implemented("subscribe")

    def subscribers(self, ref: TopicRef) -> list[str]:
        """The topic's subscribers: none where the backend has no subscribers."""
        return []

    def poll(self, ref: TopicRef, name: str, limit: int) -> list[Item]:
        raise self._not_implemented("poll")

    def ack(self, ref: TopicRef, name: str, seq: int) -> bool:
        raise self._not_implemented("ack")

    def reject(self, ref: TopicRef, name: str, seq: int) -> bool:
        raise self._not_implemented("reject")

    def commit(self, ref: TopicRef, name: str, seq: int) -> int:
        raise self._not_implemented("commit")

    def hwm(self, ref: TopicRef, name: str) -> int:
        raise self._not_implemented("hwm")

    def flush_subscriber(self, ref: TopicRef, name: str) -> None:
        raise self._not_implemented("flush_subscriber")

    def unregister(self, ref: TopicRef, name: str) -> None:
        raise self._not_implemented("unregister")

    # -- queue mode --------------------------------------------------------------------------
    def claim(self, ref: TopicRef, node: str, limit: int, lease_ms: int | None) -> list[Lease]:
        raise self._not_implemented("claim")

    def complete(self, ref: TopicRef, seq: int, lease_id: int) -> None:
        raise self._not_implemented("complete")

    def release(self, ref: TopicRef, seq: int, lease_id: int) -> None:
        raise self._not_implemented("release")

    def nack(self, ref: TopicRef, seq: int, lease_id: int, delay_ms: int) -> None:
        raise self._not_implemented("nack")

    # -- routers (RTR, capability ``routers``) ----------------------------------------------------
    def router(self, name: str, config: RouterConfig) -> RouterInfo:
        raise self._not_implemented("router")

    def list_routers(self) -> list[RouterInfo]:
        """Every router, in name order: none where the backend has no routers."""
        return []

    def drop_router(self, name: str) -> bool:
        raise self._not_implemented("drop_router")

    # -- change notification (optional) ------------------------------------------------------
    def changes(self, ref: TopicRef) -> int:
        """A counter that moves whenever the topic changes (used with ``wait``)."""
        return 0

    def wait(self, ref: TopicRef, since: int, timeout: float) -> None:
        """Block until ``changes(ref) != since`` or ``timeout`` seconds pass (spec CON-3).

        The default polls; backends with a condition variable override it. Waking early is
        always allowed: callers re-check.
        """
        time.sleep(min(max(timeout, 0.0), 0.005))

    def watch(self, fn: Callable[[str | None], None]) -> bool:
        """Optional: call ``fn(topic name)`` whenever that topic's ``changes`` counter moves, and
        ``fn(None)`` when the store closes; True if this backend will. ``fn`` runs on the
        thread that made the change, possibly under the store's lock: it must return at once and
        never call the store. False (the default): the caller polls ``changes`` instead."""
        return False

    def refresh(self) -> None:  # noqa: B027 - an optional hook: most backends have nothing to do
        """A read-only view catches up with what other processes wrote (XPR-1); no-op here."""

    # -- introspection (optional) --------------------------------------------------------------
    def describe(self) -> dict[str, object]:
        """Backend-specific facts for ``tidelog inspect`` (files, sizes, counters)."""
        return {}
