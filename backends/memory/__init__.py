"""tidelog.backends.memory: the in-memory backend (``memory://`` and ``memory://NAME``).

The engine's structures are the whole store; nothing touches disk. ``memory://`` is a fresh store
per open. ``memory://NAME`` is shared by name within the process: close and reopen it and the
restart rules of spec DUR-1 apply (ephemeral records lost, leases ended, cursors reset), exactly as
a persistent backend would after a clean restart. Nothing survives the process (CAP: not
persistent), so the crash rules DUR-2..DUR-6 do not bind it.
"""

from __future__ import annotations

from collections.abc import Mapping

from tidelog import registry
from tidelog.backend import COMMON_OPTIONS, StoreOptions
from tidelog.clock import Clock
from tidelog.named import NamedStores
from tidelog.options import validate_options
from tidelog.uri import URI

from ..common import Engine

__all__ = ["MemoryBackend", "open_backend", "forget", "dispose", "CAPABILITIES"]

#: declared once, in the scheme's registry entry (REG-1)
CAPABILITIES = registry.builtin_capabilities("memory")


class MemoryBackend(Engine):
    INLINE = True  # nothing here touches a disk (Engine.begin_inline)

    def __init__(self, clock: Clock, options: StoreOptions, name: str | None) -> None:
        super().__init__(clock, options, CAPABILITIES)
        self.name = name

    def describe(self) -> dict[str, object]:
        out = super().describe()
        out.update({"backend": "memory", "name": self.name})
        return out


_named: NamedStores[MemoryBackend] = NamedStores("memory")
forget = _named.forget


def dispose(uri: URI) -> None:
    """Forget the store ``memory://NAME`` names (the descriptor's ``dispose``, REG-5)."""
    forget(uri.location.strip("/"))


def open_backend(uri: URI, options: Mapping[str, object], clock: Clock) -> MemoryBackend:
    opts = StoreOptions(**validate_options(options, COMMON_OPTIONS, where="memory://"))
    name = uri.location.strip("/") or None
    if name is None:
        return MemoryBackend(clock, opts, None)
    return _named.open(name, opts, clock, lambda: MemoryBackend(clock, opts, name))
