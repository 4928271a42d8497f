"""What tests, the conformance kit, the benchmark and adapters may ask of a backend beyond the
``tidelog.Backend`` interface (spec REG-5), and the one way to ask: ``hooks(store, Protocol)``.

Each hook is a small ``typing.Protocol``; a backend offers it by having the member, and its
descriptor names it in ``hooks`` (``tidelog.registry``) so a caller can ask before opening a
store. ``hooks(store, Abandon)`` returns the store's backend typed as that protocol, or raises
``not_available`` naming the store and the hook. Code that deliberately reaches one backend's
own internals passes that backend's class instead (``hooks(store, FileBackend)``): the import
says which backend it depends on.

Not public API (docs/backends.md: for backend authors and tidelog's own tests).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol, TypeVar, cast, runtime_checkable

from .errors import NotAvailable

if TYPE_CHECKING:
    from .api import Store

__all__ = [
    "Abandon",
    "Checkpoint",
    "EngineTopics",
    "IoCounters",
    "RingEvictions",
    "PROTOCOLS",
    "hooks",
    "offers",
]

T = TypeVar("T")


@runtime_checkable
class Abandon(Protocol):
    """``abandon()``: the process dies now. Nothing more is written, the lock is released as
    the kernel would release it; the next open recovers (crash tests, CRASH-*)."""

    def abandon(self) -> None: ...


@runtime_checkable
class Checkpoint(Protocol):
    """``checkpoint()``: write a checkpoint now instead of when the backend would (so a test or
    the benchmark controls when it happens)."""

    def checkpoint(self) -> object: ...


class TopicLogView(Protocol):
    """What the engine keeps of one topic's log that readers may look at."""

    @property
    def chunks(self) -> Sequence[Any]: ...

    @property
    def visible(self) -> int: ...

    @property
    def losses(self) -> Sequence[tuple[int, int]]: ...


class EngineTopicView(Protocol):
    @property
    def log(self) -> TopicLogView: ...


@runtime_checkable
class EngineTopics(Protocol):
    """``topics``: the engine's open topics by name (``tidelog.backends.common``), for readers
    that serve sealed chunks column by column (the Spark adapter, SPK-3)."""

    @property
    def topics(self) -> Mapping[str, EngineTopicView]: ...


@runtime_checkable
class IoCounters(Protocol):
    """``io_stats()``: what the store wrote to its device since it was opened (BDEV-19)."""

    def io_stats(self) -> dict[str, object]: ...


class RingEvictionView(Protocol):
    @property
    def topic(self) -> str: ...

    @property
    def through(self) -> int: ...

    @property
    def head(self) -> int: ...


@runtime_checkable
class RingEvictions(Protocol):
    """``ring_evictions``: live records evicted by ring overwrite since open, in order
    (BDEV-16)."""

    @property
    def ring_evictions(self) -> Sequence[RingEvictionView]: ...


#: hook name (as a descriptor declares it) -> its protocol
PROTOCOLS: Mapping[str, type] = {
    "abandon": Abandon,
    "checkpoint": Checkpoint,
    "topics": EngineTopics,
    "io_stats": IoCounters,
    "ring_evictions": RingEvictions,
}


def offers(store: Store, kind: type) -> bool:
    """Whether ``store``'s backend offers hook ``kind`` (or is an instance of class ``kind``)."""
    return isinstance(store._backend, kind)


# ``kind`` is typed as a callable returning T, not ``type[T]``: mypy refuses a Protocol where a
# concrete ``type[T]`` is expected, and a class is a callable returning its instances.
def hooks(store: Store, kind: Callable[..., T]) -> T:
    """``store``'s backend as ``kind``: a hook protocol of this module, or a backend class;
    ``not_available`` when the backend is not one."""
    backend = store._backend
    if not isinstance(kind, type) or not isinstance(backend, kind):
        name = getattr(kind, "__name__", repr(kind))
        raise NotAvailable(f"{store.uri}: its backend does not offer {name} (REG-5)")
    return cast(T, backend)
