"""The file backend's Journal: engine effects -> WAL frames, one batch per op per shard.

Effects are buffered while an op runs and encoded at ``end_op``, where the last frame of the op
in each shard gets BATCH_END: replay applies an op only if its whole batch is present (WAL-7), so
a crash never leaves half an op.

Durability per class (spec §7): ``fsync`` ops wait until their frames are synced; ``disk`` and
``memory`` ops are acknowledged once placed and the shard's committer writes and syncs them
within ``commit_interval_ms``; ``ephemeral`` records are never logged (only the topic's
existence, subscribers and head). ``disk`` and ``ephemeral`` topics reserve seqs ahead with
HEAD_RESERVE frames made durable before the seqs are used, so after a crash the head never
regresses (DUR-3, DUR-5): a crash can lose records but never hand out their seqs again.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import xxhash

from tidelog.records import RouterConfig

from ..common.engine import EngineTopic
from ..common.journal import FALLBACK
from .format import dumps_body
from .format import wal as walfmt
from .format.wal import FrameType
from .wal import WalShard

__all__ = ["WalJournal", "ranges"]

_Effect = tuple[Any, ...]


def ranges(seqs: Sequence[int]) -> list[list[int]]:
    """Ascending seqs as [[lo, hi], ...] runs (REMOVE bodies stay small for prefix deletes)."""
    out: list[list[int]] = []
    for q in seqs:
        if out and out[-1][1] + 1 == q:
            out[-1][1] = q
        else:
            out.append([q, q])
    return out


class WalJournal:
    def __init__(self, shards: list[WalShard], head_reserve: int) -> None:
        self.shards = shards
        self.head_reserve = head_reserve
        self.ceilings: dict[int, int] = {}  # tid -> highest seq reserved durably
        self._ops: dict[int, list[_Effect]] = {}  # shard -> buffered effects of the current op
        self._sync: set[int] = set()  # shards whose part of the op must be synced
        self._shard_of: dict[int, int] = {}  # tid -> shard (hashing on every op is measurable)
        # tid -> (shard, class) for append_one, which must not look either up the long way
        self._lean: dict[int, tuple[WalShard, str]] = {}
        self._cursor_bodies: dict[str, bytes] = {}  # router name -> its cursor frame's body

    def shard_of(self, tid: int) -> int:
        shard = self._shard_of.get(tid)
        if shard is None:
            shard = xxhash.xxh3_64_intdigest(tid.to_bytes(8, "little")) % len(self.shards)
            self._shard_of[tid] = shard
        return shard

    # -- effects ---------------------------------------------------------------------------
    def _add(self, t: EngineTopic, effect: _Effect) -> None:
        shard = self.shard_of(t.tid)
        self._ops.setdefault(shard, []).append(effect)
        if t.config.durability == "fsync":
            self._sync.add(shard)

    def _control(
        self, t: EngineTopic, ftype: FrameType, body: dict[str, Any] | bytes, seq: int = 0
    ) -> None:
        self._add(t, ("control", int(ftype), t.tid, body, seq, t.config.durability == "fsync"))

    def _logged(self, t: EngineTopic) -> bool:
        return t.config.durability != "ephemeral"

    def created(self, t: EngineTopic) -> None:
        body = {"name": t.name, "incarnation": t.tid, "config": t.config.to_dict()}
        self._control(t, FrameType.TOPIC_CREATE, body)
        self._sync.add(self.shard_of(t.tid))  # topics exist durably once created

    def dropped(self, t: EngineTopic) -> None:
        self._control(t, FrameType.TOPIC_DROP, {})
        self._sync.add(self.shard_of(t.tid))
        self.ceilings.pop(t.tid, None)
        self._lean.pop(t.tid, None)

    def append_one(self, t: EngineTopic, seq: int, ts: int, payload: bytes) -> object:
        """The engine's lean single append (no tag, no node) as a complete op, queued on its
        shard in op order (``WalShard.defer``: framed when placed, WAL-14). Returns the ticket
        an fsync op waits on (None for the other classes), or FALLBACK when the general path
        must run (a seq above the reserved ceiling needs a HEAD_RESERVE first, WAL-12)."""
        if self._ops:
            return FALLBACK  # never under the engine lock between ops; stay ordered if it were
        lean = self._lean.get(t.tid)
        if lean is None:
            lean = self._lean[t.tid] = (self.shards[self.shard_of(t.tid)], t.config.durability)
        shard, cls = lean
        if cls == "fsync":
            return [(shard, shard.defer(t.tid, ts, True, seq, payload))]
        if cls != "memory" and seq > self.ceilings.get(t.tid, 0):
            return FALLBACK  # disk, ephemeral: reserve seqs durably first
        if cls != "ephemeral":  # ephemeral records are never logged
            shard.defer(t.tid, ts, False, seq, payload)
        return None

    def appended(
        self,
        t: EngineTopic,
        first_seq: int,
        ts: int,
        tag: str | None,
        node: str | None,
        payloads: Sequence[bytes],
    ) -> None:
        last = first_seq + len(payloads) - 1
        if t.config.durability in ("disk", "ephemeral") and last > self.ceilings.get(t.tid, 0):
            ceiling = last + self.head_reserve
            self.ceilings[t.tid] = ceiling
            self._control(t, FrameType.HEAD_RESERVE, {}, seq=ceiling)
            self._sync.add(self.shard_of(t.tid))  # the reservation must be durable first
        if self._logged(t):
            durable = t.config.durability == "fsync"
            self._add(t, ("append", t.tid, first_seq, ts, tag, node, payloads, durable))

    def produced(self, t: EngineTopic, pid: str, seq: int) -> None:
        if self._logged(t):
            self._control(t, FrameType.PRODUCER, {"pid": pid, "seq": seq})

    def evicted(self, t: EngineTopic, through: int, reason: str) -> None:
        if self._logged(t):
            self._control(t, FrameType.EVICT, {"reason": reason}, seq=through)

    def removed(self, t: EngineTopic, seqs: Sequence[int], fate: str) -> None:
        if self._logged(t):
            self._control(t, FrameType.REMOVE, {"fate": fate, "ranges": ranges(seqs)})

    def registered(self, t: EngineTopic, name: str, base: int) -> None:
        self._control(t, FrameType.SUB_REGISTER, {"name": name, "base": base})

    def unregistered(self, t: EngineTopic, name: str) -> None:
        self._control(t, FrameType.SUB_UNREGISTER, {"name": name})

    def delivered(self, t: EngineTopic, seq: int, lease_id: int, count: int, fresh: bool) -> None:
        if self._logged(t):
            body = {
                "op": "delivered",
                "seq": seq,
                "lease_id": lease_id,
                "count": count,
                "fresh": fresh,
            }
            self._control(t, FrameType.QUEUE, body)

    def returned(self, t: EngineTopic, seq: int) -> None:
        if self._logged(t):
            self._control(t, FrameType.QUEUE, {"op": "returned", "seq": seq})

    def delayed(self, t: EngineTopic, seq: int, ready_at: int) -> None:
        if self._logged(t):
            self._control(t, FrameType.QUEUE, {"op": "delayed", "seq": seq, "ready_at": ready_at})

    def loss(self, t: EngineTopic, lo: int, hi: int) -> None:
        """Recovery found seqs lo..hi lost (DUR-3): log it so a second crash keeps it."""
        self._control(t, FrameType.LOSS, {"lo": lo}, seq=hi)
        self._sync.add(self.shard_of(t.tid))

    def router_created(self, t: EngineTopic, name: str, config: RouterConfig, cursor: int) -> None:
        body = {"op": "create", "name": name, "config": config.to_dict()}
        self._control(t, FrameType.ROUTER, body, seq=cursor)
        self._sync.add(self.shard_of(t.tid))  # routers exist durably once created (RTR-11)

    def router_moved(self, t: EngineTopic, name: str, cursor: int) -> None:
        body = self._cursor_bodies.get(name)
        if body is None:  # encoded once per router: one of these goes with every copy op
            body = self._cursor_bodies[name] = dumps_body({"op": "cursor", "name": name})
        self._control(t, FrameType.ROUTER, body, seq=cursor)
        if t.config.durability == "ephemeral":
            # its copies are never logged: a cursor older than the op would copy records a
            # crash took from dest a second time (RTR-11)
            self._sync.add(self.shard_of(t.tid))

    def router_dropped(self, t: EngineTopic, name: str) -> None:
        self._control(t, FrameType.ROUTER, {"op": "drop", "name": name})
        self._sync.add(self.shard_of(t.tid))

    def tiered(self, t: EngineTopic, firsts: Sequence[int]) -> None:
        """TIER-5: these sealed segments of ``t`` are in the cold tier now (the flip)."""
        self._control(t, FrameType.TIER, {"op": "cold", "segments": list(firsts)})
        self._sync.add(self.shard_of(t.tid))

    # -- ending an op ----------------------------------------------------------------------
    def end_op(self, wait: bool) -> list[tuple[WalShard, int]] | None:
        if not self._ops:
            return None
        ops, sync = self._ops, self._sync
        self._ops, self._sync = {}, set()
        if len(ops) == 1:  # the common case: one shard, no ordering to arrange
            ((shard_no, effects),) = ops.items()
            shard = self.shards[shard_no]
            pos = shard.submit(_encode(effects, shard.gen), shard.gen)
            return [(shard, pos)] if wait and shard_no in sync else None
        ticket: list[tuple[WalShard, int]] = []
        order = sorted(ops)
        for k, shard_no in enumerate(order):
            shard = self.shards[shard_no]
            pos = shard.submit(_encode(ops[shard_no], shard.gen), shard.gen)
            must = shard_no in sync
            if must and len(order) > 1 and k < len(order) - 1:
                # an op spanning shards (dead-lettering): each part is durable before the next
                # is placed, so no crash keeps a later part without an earlier one
                shard.wait_synced(pos)
            elif must and wait:
                ticket.append((shard, pos))
        return ticket or None

    def wait(self, ticket: object) -> None:
        assert isinstance(ticket, list)
        for shard, pos in ticket:
            shard.wait_synced(pos)


def _encode(effects: list[_Effect], seed: int) -> bytes:
    """Frames of one op in one shard, checksums seeded with ``seed`` (the shard's file, WAL-15);
    the last carries BATCH_END (WAL-7). A run of several records is one APPEND_BATCH frame
    (WAL-14): no per-record Python work."""
    frames: list[bytes] = []
    n = len(effects)
    for k, e in enumerate(effects):
        last_effect = k == n - 1
        if e[0] == "append":
            _, tid, first_seq, ts, tag, node, payloads, durable = e
            if len(payloads) == 1:
                frame = walfmt.encode_append(
                    tid, first_seq, ts, tag, node, payloads[0], batch_end=last_effect,
                    durable=durable, seed=seed,
                )  # fmt: skip
            else:
                frame = walfmt.encode_append_batch(
                    tid, first_seq, ts, tag, node, payloads, batch_end=last_effect,
                    durable=durable, seed=seed,
                )  # fmt: skip
            frames.append(frame)
        else:
            _, ftype, tid, body, seq, durable = e
            frames.append(
                walfmt.encode_control(
                    ftype, tid, body, seq=seq, durable=durable, batch_end=last_effect, seed=seed
                )
            )
    return b"".join(frames)
