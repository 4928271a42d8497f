"""The merged read of INST-7: each instance's stream of items, merged by key with a heap; the
positions of INST-8 advanced over what is taken."""

from __future__ import annotations

import heapq
from collections.abc import Sequence

from tidelog.model.instances import Entry, merge_key
from tidelog.records import Item, Tombstone

__all__ = ["merge"]


def merge(streams: Sequence[Sequence[Item]], positions: list[int], limit: int) -> list[Entry]:
    """At most ``limit`` entries: repeatedly the stream head with the smallest key (INST-7).
    ``positions`` (one per stream) is advanced in place to the last item taken of each."""
    heap = [(merge_key(i, s[0]), i, 0) for i, s in enumerate(streams) if s]
    heapq.heapify(heap)
    out: list[Entry] = []
    while heap and len(out) < limit:
        _, i, k = heapq.heappop(heap)
        item = streams[i][k]
        out.append(Entry(i, item))
        positions[i] = item.gap_to if isinstance(item, Tombstone) else item.seq
        if k + 1 < len(streams[i]):
            heapq.heappush(heap, (merge_key(i, streams[i][k + 1]), i, k + 1))
    return out
