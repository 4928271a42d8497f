"""tidelog.backends.memory: the in-memory backend (``memory://`` and ``memory://NAME``).

The engine's structures are the whole store; nothing touches disk. ``memory://`` is a fresh store
per open. ``memory://NAME`` is shared by name within the process: close and reopen it and the
restart rules of spec DUR-1 apply (ephemeral records lost, leases ended, cursors reset), exactly as
a persistent backend would after a clean restart. Nothing survives the process (CAP: not
persistent), so the crash rules DUR-2..DUR-6 do not bind it.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping

from tidelog.backend import COMMON_OPTIONS, Capabilities, StoreOptions
from tidelog.clock import Clock
from tidelog.errors import Locked
from tidelog.names import check_topic_name
from tidelog.options import validate_options
from tidelog.uri import URI

from ..common import Engine

__all__ = ["MemoryBackend", "open_backend", "CAPABILITIES"]

CAPABILITIES = Capabilities(persistent=False, crash_safe=False)

_named: dict[str, MemoryBackend] = {}
_named_lock = threading.Lock()


class MemoryBackend(Engine):
    def __init__(self, clock: Clock, options: StoreOptions, name: str | None) -> None:
        super().__init__(clock, options, CAPABILITIES)
        self.name = name

    def describe(self) -> dict[str, object]:
        out = super().describe()
        out.update({"backend": "memory", "name": self.name})
        return out


def open_backend(uri: URI, options: Mapping[str, object], clock: Clock) -> MemoryBackend:
    opts = StoreOptions(**validate_options(options, COMMON_OPTIONS, where="memory://"))
    name = uri.location.strip("/") or None
    if name is None:
        return MemoryBackend(clock, opts, None)
    check_topic_name(name, "memory store name")
    with _named_lock:
        store = _named.get(name)
        if store is None:
            store = _named[name] = MemoryBackend(clock, opts, name)
            return store
        if not store.closed:
            raise Locked(f"memory://{name} is already open in this process")
        store.options = opts
        store.restart(clock)
        return store


def forget(name: str) -> None:
    """Discard a named in-memory store (tests use this to start clean)."""
    with _named_lock:
        _named.pop(name, None)
