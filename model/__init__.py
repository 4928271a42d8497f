"""tidelog.model: the executable model of spec/SPEC.md; the test oracle.

Pure Python, no I/O, time only from an injected clock. Reachable as a (slow) backend through
``model://NAME`` so conformance harnesses can run against the reference itself.
"""

from __future__ import annotations

from collections.abc import Mapping

from tidelog.backend import COMMON_OPTIONS, StoreOptions
from tidelog.clock import Clock
from tidelog.named import NamedStores
from tidelog.options import validate_options
from tidelog.uri import URI

from .log import ModelStore, QueueModel, SubModel, TopicModel

__all__ = [
    "ModelStore",
    "TopicModel",
    "SubModel",
    "QueueModel",
    "open_backend",
    "forget",
    "dispose",
]

_named: NamedStores[ModelStore] = NamedStores("model")
forget = _named.forget


def dispose(uri: URI) -> None:
    """Forget the store ``model://NAME`` names (the descriptor's ``dispose``, REG-5)."""
    forget(uri.location.strip("/"))


def open_backend(uri: URI, options: Mapping[str, object], clock: Clock) -> ModelStore:
    """``model://`` (fresh) or ``model://NAME`` (survives close/reopen within the process)."""
    opts = StoreOptions(**validate_options(options, COMMON_OPTIONS, where="model://"))
    name = uri.location.strip("/") or None
    if name is None:
        return ModelStore(clock, opts)
    return _named.open(name, opts, clock, lambda: ModelStore(clock, opts, name))
