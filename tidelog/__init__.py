"""tidelog: a durable, crash-safe, sequence-numbered store-and-forward log.

    import tidelog
    with tidelog.open("memory://") as store:
        events = store.topic("events", cap_records=1000)
        seq = events.append(b"hello", tag="sensor-7")
        items = events.read(after=0)

See spec/SPEC.md for the guarantees; every rule there has an id the code and tests cite.
"""

from __future__ import annotations

from typing import Any

from . import registry
from .api import Store, Subscriber, Topic
from .backend import Backend, Capabilities, TopicRef
from .clock import Clock, FakeClock, SystemClock
from .config import DURABILITY_CLASSES, TopicConfig
from .errors import *  # noqa: F403 - the hierarchy is public API
from .errors import __all__ as _errors_all
from .records import Item, Lease, Record, RouterConfig, RouterInfo, Tombstone, TopicState
from .uri import URI, parse_uri

__version__ = "0.1.0"


def open(uri: str | URI, *, clock: Clock | None = None, **options: Any) -> Store:  # noqa: A001
    """Open a store by URI (spec URI-1, URI-2).

    Options come from the URI query and from keyword arguments (keywords win). Every option is
    validated before anything is created.
    """
    parsed = parse_uri(uri)
    merged: dict[str, object] = dict(parsed.options)
    merged.update(options)
    described = registry.descriptor(parsed.scheme)
    factory = described.tool("factory")
    backend = factory(parsed, merged, clock if clock is not None else SystemClock())
    return Store(backend, parsed.render(), described)


__all__ = [
    "open",
    "Store",
    "Topic",
    "Subscriber",
    "Record",
    "Tombstone",
    "RouterConfig",
    "RouterInfo",
    "Lease",
    "TopicState",
    "TopicConfig",
    "Item",
    "Backend",
    "Capabilities",
    "TopicRef",
    "Clock",
    "SystemClock",
    "FakeClock",
    "URI",
    "parse_uri",
    "DURABILITY_CLASSES",
    "registry",
    *_errors_all,
]
