"""tidelog.model: the executable model of spec/SPEC.md; the test oracle.

Pure Python, no I/O, time only from an injected clock. Reachable as a (slow) backend through
``model://NAME`` so conformance harnesses can run against the reference itself.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping

from tidelog.backend import COMMON_OPTIONS, StoreOptions
from tidelog.clock import Clock
from tidelog.errors import Locked
from tidelog.names import check_topic_name
from tidelog.options import validate_options
from tidelog.uri import URI

from .log import ModelStore, QueueModel, SubModel, TopicModel

__all__ = ["ModelStore", "TopicModel", "SubModel", "QueueModel", "open_backend"]

_named: dict[str, ModelStore] = {}
_named_lock = threading.Lock()


def open_backend(uri: URI, options: Mapping[str, object], clock: Clock) -> ModelStore:
    """``model://`` (fresh) or ``model://NAME`` (survives close/reopen within the process)."""
    opts = StoreOptions(**validate_options(options, COMMON_OPTIONS, where="model://"))
    name = uri.location.strip("/") or None
    if name is None:
        return ModelStore(clock, opts)
    check_topic_name(name, "store name")
    with _named_lock:
        store = _named.get(name)
        if store is None:
            store = _named[name] = ModelStore(clock, opts, name)
            return store
        if not store.closed:
            raise Locked(f"model://{name} is already open in this process")
        store.options = opts
        store.restart(clock)
        return store
