"""Routers in the engine (spec/SPEC.md section 16, RTR): topic -> topic forwarding with a durable
cursor, for every backend built on the engine.

A router's config and cursor belong to its dest topic (RTR-10): their effects are logged on dest,
so the copies a forwarding step appends to dest and the cursor advance over them are one op of
dest (one WAL batch in the file backend, WAL-7) and a crash keeps both or neither. Forwarding
runs inside the op that makes a source seq forwardable (RTR-8): at the op's start, after its lazy
time effects, and at its end; for a topic whose reads wait for durability (an ``fsync`` topic in
the file backend) it runs once the op's records are readable, as one more op. A router reads its
source as any reader does (RTR-4), so it copies only what readers of the source can see.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from tidelog.errors import (
    Backpressure,
    ReadOnly,
    StoreFull,
    TooLarge,
    TopicFull,
)
from tidelog.model.router import check_new, passes
from tidelog.names import check_topic_name
from tidelog.records import RouterConfig, RouterInfo, Tombstone

if TYPE_CHECKING:
    from .engine import Engine, EngineTopic

__all__ = ["Routing", "REFUSED"]

#: dest refusals a later op may lift (RTR-6): the router stops before the record
REFUSED = (TopicFull, Backpressure, StoreFull)
_BATCH = 1024  # source items read per step: bounds the memory one forwarding step holds
Copy = tuple[bytes, str | None, str | None]  # payload, tag, node


class Routing:
    """The routers of one engine: it works on the engine's topics and effects, under its lock
    (``Engine.routing``)."""

    def __init__(self, engine: Engine) -> None:
        self.e = engine

    # -- effects: live ops and replay alike -----------------------------------------------------
    def apply_create(self, dst: EngineTopic, name: str, config: RouterConfig, cursor: int) -> None:
        self.e.routers[name] = config
        dst.cursors[name] = cursor
        self.count_outs()
        if self.e.journal is not None:
            self.e.journal.router_created(dst, name, config, cursor)

    def apply_cursor(self, dst: EngineTopic, name: str, cursor: int) -> None:
        dst.cursors[name] = cursor
        if self.e.journal is not None:
            self.e.journal.router_moved(dst, name, cursor)

    def apply_drop(self, dst: EngineTopic, name: str) -> None:
        if self.e.journal is not None:
            self.e.journal.router_dropped(dst, name)
        dst.cursors.pop(name, None)
        r = self.e.routers.pop(name, None)
        self.count_outs()
        src = self.e.topics.get(r.source) if r is not None else None
        if src is not None and src.config.trim == "acked" and src.progress.subs:
            self.e._settle(src)  # RTR-7, SUB-5: its hold is gone

    def count_outs(self) -> None:
        """Each topic's number of routers out of it (lanes, lane.py, leave those alone)."""
        for t in self.e.topics.values():
            t.outs = 0
        for r in self.e.routers.values():
            src = self.e.topics.get(r.source)
            if src is not None:
                src.outs += 1

    # -- the API (RTR-1, RTR-2, RTR-9, RTR-12) --------------------------------------------------
    def create(self, name: str, config: RouterConfig) -> RouterInfo:
        e = self.e
        if e.readonly:
            raise ReadOnly(f"cannot create router {name!r}: the store is read-only")
        with e.lock:
            e._check_open()
            check_topic_name(name, "router name")
            if not check_new(name, config, e.routers.get(name), e.topics, e.routers.values()):
                return self.info(name)
            now = e.clock.now_ms()
            src, dst = e.topics[config.source], e.topics[config.dest]
            e._tick(src, now)
            e._tick(dst, now)
            self.apply_create(dst, name, config, src.log.head)  # RTR-3
            info = self.info(name)
            ticket, touched = e._end_op(True)
        e._finish(ticket, touched)
        return info

    def infos(self) -> list[RouterInfo]:
        with self.e.lock:
            self.e._check_open()
            return [self.info(name) for name in sorted(self.e.routers)]

    def drop(self, name: str) -> bool:
        if self.e.readonly:
            raise ReadOnly(f"cannot drop router {name!r}: the store is read-only")
        with self.e.lock:
            self.e._check_open()
            r = self.e.routers.get(name)
            if r is None:
                return False
            self.apply_drop(self.e.topics[r.dest], name)
            ticket, touched = self.e._end_op(True)
        self.e._finish(ticket, touched)
        return True

    def drop_of(self, topic: str) -> None:
        """RTR-12: before ``topic`` is dropped, every router from or into it goes."""
        for name, r in sorted(self.e.routers.items()):
            if topic in (r.source, r.dest):
                self.apply_drop(self.e.topics[r.dest], name)

    def _outs(self, src: EngineTopic) -> list[tuple[str, int]]:
        """(name, cursor) of every router out of ``src``, in name order."""
        e = self.e
        return [
            (name, e.topics[r.dest].cursors[name])
            for name, r in sorted(e.routers.items())
            if r.source == src.name and r.dest in e.topics
        ]

    def holds(self, src: EngineTopic) -> list[int]:
        """RTR-7: the cursors that hold ``src``'s records from ack-trimming."""
        return [cursor for _, cursor in self._outs(src)]

    def backpressure(self, src: EngineTopic, victims: Sequence[int]) -> None:
        """RTR-7: under ``retention="backpressure"`` a router holds its source like a subscriber
        whose hwm is its cursor: evicting a seq it has not dealt with is refused."""
        for name, cursor in self._outs(src):
            if victims[-1] > cursor:
                raise Backpressure(
                    f"topic {src.name!r} is full and router {name!r} has not forwarded seq "
                    f"{max(cursor + 1, victims[0])}"
                )

    def info(self, name: str) -> RouterInfo:
        r = self.e.routers[name]
        cursor = self.e.topics[r.dest].cursors[name]
        return RouterInfo(name, r, cursor, self.e.topics[r.source].log.head - cursor)

    def resume(self, now: int) -> None:
        """RTR-11: after a restart or a recovery, lower every cursor above what its source's
        readers see (a source that lost records it had forwarded, DUR-4), then forward."""
        for name, r in sorted(self.e.routers.items()):
            src, dst = self.e.topics[r.source], self.e.topics[r.dest]
            if dst.cursors[name] > src.log.head:
                self.apply_cursor(dst, name, src.log.head)
        self.pump(now)

    # -- forwarding (RTR-4..RTR-8) ----------------------------------------------------------------
    def pump(self, now: int) -> None:
        """RTR-8: passes over the routers in name order until none advances, at most as many
        passes as there are routers (a cycle that feeds itself goes on at the next op). Under
        the lock, inside an op: its effects join the op's."""
        if not self.e.routers or self.e.readonly:
            return
        for _ in range(len(self.e.routers)):
            advanced = False
            for name in sorted(self.e.routers):
                advanced = self._forward(name, now) or advanced
            if not advanced:
                return

    def _forward(self, name: str, now: int) -> bool:
        """Deal with the source items above the cursor, up to the source's head when the call
        starts (RTR-4); True if the cursor advanced."""
        r = self.e.routers[name]
        src, dst = self.e.topics[r.source], self.e.topics[r.dest]
        self.e._tick(src, now)
        self.e._tick(dst, now)
        start = cur = dst.cursors[name]
        end = src.log.head  # records in flight too: an op's copies join the op (RTR-8)
        while cur < end:
            items = src.log.read(cur, _BATCH, None, end)
            copies: list[tuple[int, Copy]] = []  # (source seq, copy) not yet appended
            dealt = cur  # every source seq <= dealt is dealt with once ``copies`` are in
            stopped = False
            for item in items:
                if isinstance(item, Tombstone):
                    stopped, cur = self._copy(dst, copies, cur, dealt, now)
                    copies = []
                    if stopped:
                        break
                    hi = min(item.gap_to, end)
                    self.e.apply_loss(dst, dst.log.head + 1, dst.log.head + hi - item.gap_from + 1)
                    self.e._settle(dst)
                    cur = dealt = hi  # RTR-5: one dest seq per source seq the tombstone covers
                    continue
                if item.seq > end:
                    break
                dealt = item.seq
                if passes(item.tag, item.node, r.filter_tag, r.exclude_node):
                    copy_ = (
                        item.payload,
                        item.tag if r.preserve_tag else None,
                        item.node if r.preserve_node else None,
                    )
                    copies.append((item.seq, copy_))
            if not stopped:
                stopped, cur = self._copy(dst, copies, cur, dealt, now)
            if stopped:
                break
            if len(items) < _BATCH or dealt >= end:
                cur = end  # the read reached the head: what follows was removed voluntarily
        if cur != start:
            self.apply_cursor(dst, name, cur)  # RTR-10: with the copies, one op of dest
            self.e._forwarded = True
            if src.config.trim == "acked" and src.progress.subs:
                self.e._settle(src)  # RTR-7: the hold moved
        return cur > start

    def _copy(
        self, dst: EngineTopic, copies: list[tuple[int, Copy]], cur: int, dealt: int,
        now: int,
    ) -> tuple[bool, int]:  # fmt: skip
        """Append ``copies`` to dest one by one, as the model does (RTR-4, RTR-6): each may
        evict, and what an eviction resolves may be trimmed before the next (SUB-5). All at once
        where nothing can evict or be refused for room (no caps), which gives the same state.
        Returns (stopped by a refusal, the new cursor): ``dealt`` when all went in, else the
        seq before the refused copy."""
        if not copies:
            return False, max(cur, dealt)
        cfg = dst.config
        if cfg.cap_records is None and cfg.cap_bytes is None and self.e.options.max_bytes is None:
            try:
                self.e._append_records(dst, [c for _, c in copies], now)
                return False, dealt
            except TooLarge:
                pass  # nothing changed (ERR-2): one by one, to find the copy it cannot hold
        for seq, copy_ in copies:
            try:
                self.e._append_records(dst, [copy_], now)
            except TooLarge:  # dest can never hold it: a one-seq loss range (RTR-6)
                self.e.apply_loss(dst, dst.log.head + 1, dst.log.head + 1)
                self.e._settle(dst)
            except REFUSED:
                return True, seq - 1  # retried when forwarding next runs (RTR-6, RTR-8)
        return False, dealt
