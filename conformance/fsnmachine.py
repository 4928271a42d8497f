"""The ``forward`` level: the store-and-forward sender of an implementation against
``ForwarderModel`` (spec FSN-1..FSN-8; spec/FORWARD.md SF-10, SF-13).

The machine publishes frames into a slot, opens connections, asks for the frames to send and
feeds back what a receiver would answer (OK, durable ack, error frames, close codes), restarts
the sender cleanly and after a power loss, and after every step compares the sender's
``acked_fsn`` / ``published_fsn`` / halt state with the model's. Sent frames must be exactly the
model's FSNs, each with the payload published under it (FSN-1, FSN-6: replay resumes at
``acked_fsn + 1``).
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any

from hypothesis import event
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from tidelog.model.fsn import ForwarderModel

from .machine import Outcome, _run, fail
from .remote import RemoteSender, RemoteSut

__all__ = ["ForwardMachine", "forward_machine_for"]

STATUSES = (3, 5, 6, 8, 9, 42)  # FSN-7: drop-and-continue (3, 9), halt (5, 6, 8), unknown
CLOSE_CODES = (1000, 1001, 1006, 1011, 1002, 1008)  # FSN-8: the last two are terminal
TABLES = ("a", "b")


def _tables() -> st.SearchStrategy[dict[str, int]]:
    return st.dictionaries(st.sampled_from(TABLES), st.integers(0, 4), max_size=2)


class ForwardMachine(RuleBasedStateMachine):
    link: RemoteSut
    on_start: Callable[[ForwardMachine], None] | None = None

    def __init__(self) -> None:
        if self.on_start is not None:
            self.on_start(self)
        super().__init__()
        self.slot = "f" + uuid.uuid4().hex[:12]
        self.sender: RemoteSender = self.link.sender(self.slot)
        self.model = ForwarderModel()
        self.payloads: dict[int, bytes] = {}
        opened = self.sender.opened
        if (opened["acked_fsn"], opened["published_fsn"]) != (-1, -1):
            fail(f"SF-10: a new slot must start at acked -1, published -1, got {opened}")

    def teardown(self) -> None:
        self.link.dispose(self.slot)

    def listening(self) -> bool:
        return self.model.connected and self.model.halted is None

    def both(self, what: str, model: Callable[[], Any], sut: Callable[[], Any]) -> Outcome:
        expected, actual = _run(model), _run(sut)
        if actual != expected:
            fail(f"{what}: sender {actual!r}, model {expected!r}")
        return expected

    # -- producer -----------------------------------------------------------------------------
    @rule(batch=st.lists(st.binary(max_size=10), min_size=1, max_size=3))
    def publish(self, batch: list[bytes]) -> None:
        """FSN-3: frames get consecutive FSNs from publishedFsn + 1."""
        out = self.both(
            "publish", lambda: self.model.publish(len(batch)), lambda: self.sender.publish(batch)
        )
        for fsn, payload in zip(out.value or (), batch):
            self.payloads[fsn] = payload

    # -- connection ---------------------------------------------------------------------------
    @precondition(lambda self: not self.listening())
    @rule(durable=st.booleans())
    def connect(self, durable: bool) -> None:
        """FSN-1, FSN-6: a connection starts at acked + 1 (refused when connected or halted)."""
        self.both(
            "connect", lambda: self.model.connect(durable), lambda: self.sender.connect(durable)
        )

    @precondition(lambda self: self.listening())
    @rule(limit=st.integers(1, 4))
    def send(self, limit: int) -> None:
        """FSN-1, FSN-6: frames in strict FSN order, each once per connection, resuming at
        ackedFsn + 1 after a reconnect, byte-identical to what was published."""
        expected: list[int] = []
        while len(expected) < limit and (fsn := self.model.next_frame()) is not None:
            expected.append(fsn)
        got = self.sender.send(limit)
        if [f for f, _ in got] != expected:
            fail(f"FSN-1/FSN-6: sent FSNs {[f for f, _ in got]}, model {expected}")
        for fsn, payload in got:
            if payload != self.payloads.get(fsn):
                fail(f"FSN-1: frame {fsn} carried {payload!r}, published {self.payloads[fsn]!r}")
        if expected and self.model.frames_replayed:
            event("forward: replayed frames after a reconnect")

    @precondition(lambda self: self.listening())
    @rule(data=st.data(), tables=_tables())
    def ok(self, data: st.DataObject, tables: dict[str, int]) -> None:
        """FSN-2 (clamped to the frames sent), FSN-4 in durable mode."""
        seq = data.draw(st.integers(-1, self.model.next_wire_seq + 1))
        self.both(
            "ok",
            lambda: self.model.on_ok(seq, tables),
            lambda: self.sender.on_ok(seq, tables),
        )

    @precondition(lambda self: self.listening())
    @rule(tables=_tables())
    def durable_ack(self, tables: dict[str, int]) -> None:
        """FSN-4: watermarks max-merge; the covered head of the queue pops."""
        self.both(
            "durable_ack",
            lambda: self.model.on_durable_ack(tables),
            lambda: self.sender.on_durable_ack(tables),
        )

    @precondition(lambda self: self.listening())
    @rule(data=st.data(), status=st.sampled_from(STATUSES))
    def error(self, data: st.DataObject, status: int) -> None:
        """FSN-7: categories and policies (drop-and-continue advances, halt latches)."""
        seq = data.draw(st.integers(0, max(self.model.next_wire_seq - 1, 0)))
        self.both(
            "error",
            lambda: self.model.on_error(status, seq),
            lambda: self.sender.on_error(status, seq),
        )

    @precondition(lambda self: self.listening())
    @rule(code=st.sampled_from(CLOSE_CODES))
    def close_code(self, code: int) -> None:
        """FSN-8: terminal close codes halt, the others reconnect."""
        self.both(
            "close", lambda: self.model.on_close(code), lambda: self.sender.on_close(code)
        )

    @precondition(lambda self: self.model.halted is None)
    @rule(durable=st.booleans(), limit=st.integers(1, 4), code=st.sampled_from(CLOSE_CODES[:4]))
    def reconnect(self, durable: bool, limit: int, code: int) -> None:
        """FSN-1, FSN-6, FSN-8: the connection drops (a non-terminal close), a new one starts,
        and what it sends first is ackedFsn + 1."""
        if self.model.connected:
            self.close_code(code)
        self.connect(durable)
        self.send(limit)

    @precondition(lambda self: self.model.connected)
    @rule()
    def disconnect(self) -> None:
        self.both("disconnect", self.model.disconnect, self.sender.disconnect)

    # -- restarts -----------------------------------------------------------------------------
    def _restart_model(self, acked: int) -> None:
        """FSN-5 with the segments SF-13 keeps: the active segment survives a full drain."""
        published = self.model.published_fsn
        lo = min(acked + 1, published)
        self.model.restart(
            [(lo, published - lo + 1)] if published >= 0 else [], acked if acked >= 0 else None
        )

    @precondition(lambda self: self.model.published_fsn >= 0)
    @rule()
    def reopen(self) -> None:
        """SF-10, SF-13: a clean restart keeps acked and published exactly (FSNs never reused)."""
        got = self.sender.reopen()
        want = (self.model.acked_fsn, self.model.published_fsn)
        if (got["acked_fsn"], got["published_fsn"]) != want:
            fail(f"SF-10/SF-13: after a clean restart (acked, published) = "
                 f"{(got['acked_fsn'], got['published_fsn'])}, expected {want}")
        self._restart_model(self.model.acked_fsn)

    @precondition(lambda self: self.model.published_fsn >= 0)
    @rule(seed=st.integers(0, 2**31 - 1))
    def crash(self, seed: int) -> None:
        """SF-10, SF-11, FSN-3, FSN-5: after a power loss every published frame is still there
        (append durability) and ackedFsn never exceeds what the receiver confirmed."""
        got = self.sender.crash(seed)
        acked, published = int(got["acked_fsn"]), int(got["published_fsn"])
        if published != self.model.published_fsn:
            fail(f"SF-11: after a power loss published {published}, "
                 f"expected {self.model.published_fsn} (every append was synced)")
        if not -1 <= acked <= self.model.acked_fsn:
            fail(f"FSN-3/FSN-5: after a power loss acked {acked}, "
                 f"but the receiver confirmed only {self.model.acked_fsn}")
        if acked < self.model.acked_fsn:
            event("forward: power loss lost the watermark (at-least-once replay)")
        self._restart_model(acked)

    # -- invariants ---------------------------------------------------------------------------
    @invariant()
    def states_agree(self) -> None:
        got = self.sender.state()
        m = self.model
        want = {
            "acked_fsn": m.acked_fsn,
            "published_fsn": m.published_fsn,
            "connected": m.connected and m.halted is None,
            "halted": m.halted.category if m.halted is not None else None,
        }
        if got != want:
            fail(f"sender state {got}, model {want}")
        m.check_invariants()


def forward_machine_for(
    link: RemoteSut, on_start: Callable[[ForwardMachine], None] | None = None
) -> type[ForwardMachine]:
    return type(
        "ForwardMachineBound",
        (ForwardMachine,),
        {"link": link, "on_start": staticmethod(on_start) if on_start else None},
    )
