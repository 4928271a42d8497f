"""tidelog's store-and-forward sending side without the socket, for the ``forward`` level
(spec/CONFORMANCE.md §1, FSN-1..FSN-8; spec/FORWARD.md SF-10, SF-12, SF-13).

``SlotSender`` is the bookkeeping ``tidelog.forward``'s I/O loop does per connection, driven by
explicit events instead of a WebSocket: frames live in a real SF slot (``tidelog.backends.sf.Slot``:
segments, rotation, watermark, trim, recovery), each connection is a ``ConnState`` (the class
the I/O loop uses to map wire sequences to FSNs), and error frames and close codes are routed by
the same policy functions (``tidelog.model.fsn``). The conformance driver serves it as the
``sf_*`` requests; the oracle is ``ForwarderModel``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from tidelog.backends.sf.slot import Slot
from tidelog.errors import BadArgument
from tidelog.forward.ackstate import ConnState
from tidelog.fsio import FS
from tidelog.model.fsn import close_code_is_terminal, effective_policy, status_category

__all__ = ["SlotSender", "SEGMENT_BYTES"]

#: small segments, so a few frames rotate, seal and trim them (SF-12, SF-13)
SEGMENT_BYTES = 160


class SlotSender:
    def __init__(
        self,
        fs: FS,
        sf_dir: str,
        slot: str,
        *,
        conn_factory: Callable[[int, bool], ConnState] = ConnState,
    ) -> None:
        self.slot = Slot.open(
            sf_dir,
            slot,
            fs=fs,
            max_bytes=SEGMENT_BYTES,
            max_total_bytes=1 << 20,
            durability="append",
        )
        self.conn_factory = conn_factory
        self.conn: ConnState | None = None
        self.halted: str | None = None

    @property
    def closed(self) -> bool:
        return self.slot.closed

    def state(self) -> dict[str, object]:
        return {
            "acked_fsn": self.slot.acked_fsn,
            "published_fsn": self.slot.published_fsn,
            "connected": self.conn is not None and self.halted is None,
            "halted": self.halted,
        }

    # -- producer --------------------------------------------------------------------------
    def publish(self, payloads: list[bytes]) -> list[int]:
        return [self.slot.append(p) for p in payloads]

    # -- connection ------------------------------------------------------------------------
    def connect(self, durable: bool) -> None:
        if self.halted is not None:
            raise BadArgument(f"halted on {self.halted}; restart to resume")
        if self.conn is not None:
            raise BadArgument("already connected")
        self.conn = self.conn_factory(self.slot.acked_fsn + 1, durable)  # FSN-1, FSN-6

    def send(self, limit: int) -> list[tuple[int, bytes]]:
        """Up to ``limit`` frames, in strict FSN order (FSN-1)."""
        out: list[tuple[int, bytes]] = []
        conn = self.conn
        while conn is not None and self.halted is None and len(out) < limit:
            fsn = conn.next_fsn()
            if fsn > self.slot.published_fsn:
                break
            (payload,) = self.slot.read(fsn, 1)
            conn.sent()
            out.append((fsn, payload))
        return out

    def _listening(self) -> ConnState | None:
        return self.conn if self.halted is None else None

    def on_ok(self, sequence: int, tables: Mapping[str, int]) -> None:
        conn = self._listening()
        if conn is not None:
            self._advance(conn.on_ok(sequence, tables))  # FSN-2, FSN-4

    def on_durable_ack(self, tables: Mapping[str, int]) -> None:
        conn = self._listening()
        if conn is not None:
            self._advance(conn.on_durable_ack(tables))  # FSN-4

    def on_error(self, status: int, sequence: int) -> None:
        conn = self._listening()
        if conn is None:
            return
        category = status_category(status)  # FSN-7
        if effective_policy(category) == "HALT":
            self.halted = category
            return
        self._advance(conn.on_drop(sequence))

    def on_close(self, code: int) -> None:
        if self._listening() is None:
            return
        self.conn = None
        if close_code_is_terminal(code):  # FSN-8
            self.halted = "PROTOCOL_VIOLATION"

    def disconnect(self) -> None:
        self.conn = None

    def _advance(self, target: int | None) -> None:
        if target is None:
            return
        target = min(target, self.slot.published_fsn)  # FSN-3
        if target > self.slot.acked_fsn:
            self.slot.acknowledge(target)
            self.slot.apply_acks()  # persist the watermark, then trim (SF-12)

    def close(self) -> None:
        self.conn = None
        self.slot.close()
