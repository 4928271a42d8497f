"""Process-wide named stores (``memory://NAME``, ``model://NAME``): one instance per name, open
at most once at a time (a second open raises ``locked``, like a directory lock), and reopened by
applying the restart rules (spec DUR-1, DUR-8)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Generic, Protocol, TypeVar

from .backend import StoreOptions
from .clock import Clock
from .errors import Locked
from .names import check_topic_name

__all__ = ["NamedStores"]


class Restartable(Protocol):
    closed: bool
    options: StoreOptions

    def restart(self, clock: Clock) -> None: ...


B = TypeVar("B", bound=Restartable)


class NamedStores(Generic[B]):
    def __init__(self, scheme: str) -> None:
        self.scheme = scheme
        self._stores: dict[str, B] = {}
        self._lock = threading.Lock()

    def open(self, name: str, options: StoreOptions, clock: Clock, create: Callable[[], B]) -> B:
        check_topic_name(name, f"{self.scheme} store name")
        with self._lock:
            store = self._stores.get(name)
            if store is None:
                store = self._stores[name] = create()
                return store
            if not store.closed:
                raise Locked(f"{self.scheme}://{name} is already open in this process")
            store.options = options
            store.restart(clock)
            return store

    def forget(self, name: str) -> None:
        """Discard a named store (tests use this to start clean)."""
        with self._lock:
            self._stores.pop(name, None)

    def __contains__(self, name: object) -> bool:
        return name in self._stores
