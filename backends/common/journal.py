"""What a storage backend hears from the engine: every durable state change, as an *effect*.

The engine decides (caps, backpressure, TTL, dead-lettering...) and then applies effects; each
applied effect is reported here, in order, under the engine lock. A persistent backend turns them
into WAL frames; recovery replays them through the engine's ``apply_*`` methods. Effects never
need re-deciding on replay (an eviction says which seqs went, not why), so recovery does not
depend on state kept elsewhere, such as subscriber progress files.

Subscriber outcomes (acks, rejects, gaps, cursors) are not effects: backends persist subscriber
progress separately (Quiver progress files), at-least-once (spec DUR-9).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from tidelog.records import RouterConfig

    from .engine import EngineTopic

__all__ = ["Journal", "FALLBACK"]

#: Returned by the per-topic hook ``(seq, ts, payload)`` of a journal's optional ``lean(t)``
#: (the engine's lean single append, lane.py) when the record needs the general path;
#: otherwise the hook returns the ticket ``end_op`` would have (or None) after logging the
#: record as a complete op.
FALLBACK: object = object()


class Journal(Protocol):
    def created(self, t: EngineTopic) -> None: ...

    def dropped(self, t: EngineTopic) -> None: ...

    def appended(
        self,
        t: EngineTopic,
        first_seq: int,
        ts: int,
        tag: str | None,
        node: str | None,
        payloads: Sequence[bytes],
        sizes: list[int] | None = None,
        nbytes: int | None = None,
    ) -> None:
        """Records ``first_seq ..`` were appended; ``sizes``: their payloads' lengths, when
        the engine took them (None: not taken); ``nbytes``: their payloads' total size, when
        the engine summed them."""

    def produced(self, t: EngineTopic, pid: str, seq: int) -> None:
        """TOP-11: producer ``pid`` applied sequence ``seq`` (same op as its records)."""

    def evicted(self, t: EngineTopic, through: int, reason: str) -> None:
        """Every live seq <= through was removed involuntarily (the oldest live prefix)."""

    def removed(self, t: EngineTopic, seqs: Sequence[int], fate: str) -> None:
        """Voluntary removal (fate "deleted" or "trimmed") of exactly these live seqs."""

    def registered(self, t: EngineTopic, name: str, base: int) -> None: ...

    def unregistered(self, t: EngineTopic, name: str) -> None: ...

    def delivered(self, t: EngineTopic, seq: int, lease_id: int, count: int, fresh: bool) -> None:
        """A job was leased: its delivery count is now ``count``."""

    def returned(self, t: EngineTopic, seq: int) -> None:
        """A job joined the reclaim freelist."""

    def delayed(self, t: EngineTopic, seq: int, ready_at: int) -> None: ...

    def loss(self, t: EngineTopic, lo: int, hi: int) -> None:
        """Seqs lo..hi above the old head are a loss range (DUR-3 after a crash; RTR-5)."""

    def router_created(self, t: EngineTopic, name: str, config: RouterConfig, cursor: int) -> None:
        """Router ``name`` into ``t`` (its dest, RTR-10) was created with this cursor."""

    def router_moved(self, t: EngineTopic, name: str, cursor: int) -> None:
        """Router ``name``'s cursor moved (the same op as the copies it covers, RTR-10)."""

    def router_dropped(self, t: EngineTopic, name: str) -> None: ...

    def end_op(self, wait: bool) -> object | None:
        """The op's effects are complete: submit them. Returns a ticket to pass to ``wait``
        (outside the engine lock) when the op must not return before they are durable."""

    def wait(self, ticket: object) -> None: ...
