"""Per-connection acknowledgement bookkeeping (FSN-1, FSN-2, FSN-4, FSN-7, FWD-5, FWD-6, FWD-7).

One ``ConnState`` per successful upgrade: it pins ``fsn_at_zero`` and counts ``next_wire_seq``,
and turns OK / durable-ack / dropped-error frames into the FSN the trim point may advance to.
The arithmetic is the model's (``ok_ack_target``, ``fsn_of``); this class adds only the
durable queue. A state object is never reused across connections, so an acknowledgement that
arrives for an old connection can never be mapped through a new ``fsn_at_zero`` (the cursor
race FWD-24 rules out).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping

from tidelog.model.fsn import fsn_of, ok_ack_target

__all__ = ["ConnState"]


class ConnState:
    def __init__(self, fsn_at_zero: int, durable: bool, catch_up: int = 0) -> None:
        self.fsn_at_zero = fsn_at_zero
        self.durable = durable
        # FWD-32: the first ``catch_up`` wire sequences are symbol-dictionary catch-up
        # messages; the frame at FSN fsn_at_zero goes out as wire sequence ``catch_up``.
        self.catch_up = catch_up
        self.next_wire_seq = 0
        # (wire_seq, {table: seqTxn}) in arrival order; an entry with no tables is trivially
        # covered (an empty OK, or a frame dropped under DROP_AND_CONTINUE).
        self.pending: deque[tuple[int, dict[str, int]]] = deque()
        self.table_watermarks: dict[str, int] = {}

    def next_fsn(self) -> int:
        return fsn_of(self.fsn_at_zero, self.next_wire_seq - self.catch_up)

    def fsn_sent(self, wire_seq: int) -> int:
        """The FSN of the frame sent as ``wire_seq`` (a data frame, not a catch-up)."""
        return fsn_of(self.fsn_at_zero, wire_seq - self.catch_up)

    def sent(self) -> int:
        """Record one frame sent; returns its wire sequence."""
        wire_seq = self.next_wire_seq
        self.next_wire_seq += 1
        return wire_seq

    def fsn_for(self, sequence: int) -> int | None:
        """The (clamped) FSN a wire sequence from the server stands for (FSN-2); None for a
        catch-up message's sequence (FWD-32)."""
        if 0 <= sequence < self.catch_up:
            return None
        # a negative sequence confirms nothing sent, but is an entry all the same (in durable
        # mode its tables hold back what follows it), as the model takes it (FSN-2, FSN-4)
        data_seq = sequence - self.catch_up if sequence >= 0 else sequence
        sent = max(self.next_wire_seq - self.catch_up, 0)
        return ok_ack_target(self.fsn_at_zero, data_seq, sent)

    def on_ok(self, sequence: int, tables: Mapping[str, int]) -> int | None:
        """The FSN to acknowledge after an OK, or None (FSN-2; in durable mode FSN-4)."""
        target = self.fsn_for(sequence)
        if target is None:
            return None
        if not self.durable:
            return target
        self.pending.append((target - self.fsn_at_zero, dict(tables)))
        return self._drain()

    def on_durable_ack(self, tables: Mapping[str, int]) -> int | None:
        """Max-merge the watermarks and pop every covered head entry (FSN-4, FWD-7)."""
        for name, seq_txn in tables.items():
            self.table_watermarks[name] = max(self.table_watermarks.get(name, seq_txn), seq_txn)
        return self._drain()

    def on_drop(self, sequence: int) -> int | None:
        """A rejected frame under DROP_AND_CONTINUE (FSN-7, FWD-9)."""
        target = self.fsn_for(sequence)
        if target is None:
            return None
        if not self.durable:
            return target
        self.pending.append((target - self.fsn_at_zero, {}))
        return self._drain()

    def _covered(self, tables: Mapping[str, int]) -> bool:
        wm = self.table_watermarks
        return all(name in wm and wm[name] >= seq for name, seq in tables.items())

    def _drain(self) -> int | None:
        top: int | None = None
        while self.pending and self._covered(self.pending[0][1]):
            wire_seq = self.pending.popleft()[0]
            top = wire_seq if top is None else max(top, wire_seq)
        return None if top is None else fsn_of(self.fsn_at_zero, top)
