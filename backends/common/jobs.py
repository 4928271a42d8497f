"""Queue-mode state of one topic (spec QUE): leases, reclaim freelist, delivery
counts, delayed nacks. Expiry is lazy: heaps ordered by deadline let each op find what is due in
O(log n) without timers (QUE-5).
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field

__all__ = ["JobQueue"]


@dataclass
class JobQueue:
    claim_cursor: int = 0
    next_lease_id: int = 1
    leases: dict[int, tuple[int, str, int]] = field(default_factory=dict)  # seq -> id,node,deadline
    deliveries: dict[int, int] = field(default_factory=dict)
    free: set[int] = field(default_factory=set)
    delayed: dict[int, int] = field(default_factory=dict)  # seq -> ready_at
    _lease_heap: list[tuple[int, int, int]] = field(default_factory=list)  # deadline, seq, id
    _delay_heap: list[tuple[int, int]] = field(default_factory=list)  # ready_at, seq

    def grant(self, seq: int, node: str, deadline: int) -> tuple[int, int]:
        """Lease ``seq``; returns (lease_id, deliveries) (QUE-1, QUE-6)."""
        lease_id = self.next_lease_id
        self.next_lease_id += 1
        self.leases[seq] = (lease_id, node, deadline)
        heapq.heappush(self._lease_heap, (deadline, seq, lease_id))
        n = self.deliveries.get(seq, 0) + 1
        self.deliveries[seq] = n
        return lease_id, n

    def end_lease(self, seq: int, lease_id: int) -> bool:
        """End a valid lease; False if ``lease_id`` is not the current lease on ``seq``."""
        held = self.leases.get(seq)
        if held is None or held[0] != lease_id:
            return False
        del self.leases[seq]
        return True

    def delay(self, seq: int, ready_at: int) -> None:
        self.delayed[seq] = ready_at
        heapq.heappush(self._delay_heap, (ready_at, seq))

    def expired(self, now: int) -> list[int]:
        """Seqs whose lease deadline has passed, ended, ascending by seq (QUE-5)."""
        out = []
        heap = self._lease_heap
        while heap and heap[0][0] <= now:
            _, seq, lease_id = heapq.heappop(heap)
            if self.end_lease(seq, lease_id):
                out.append(seq)
        out.sort()
        return out

    def ready(self, now: int) -> list[int]:
        """Seqs whose nack delay has elapsed, removed from ``delayed``, ascending by seq."""
        out = []
        heap = self._delay_heap
        while heap and heap[0][0] <= now:
            ready_at, seq = heapq.heappop(heap)
            if self.delayed.get(seq) == ready_at:
                del self.delayed[seq]
                out.append(seq)
        out.sort()
        return out

    def end_all_leases(self) -> list[int]:
        """QUE-8: at restart every outstanding lease ends; ascending by seq."""
        out = sorted(self.leases)
        self.leases.clear()
        self._lease_heap.clear()
        return out
