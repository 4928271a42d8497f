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

import time
from collections.abc import Callable, Sequence
from typing import Any

import xxhash

from tidelog.records import RouterConfig

from ..common.engine import EngineTopic
from ..common.journal import FALLBACK
from ..common.lane import RunHook
from .format import dumps_body
from .format import wal as walfmt
from .format.wal import FrameType
from .wal import WalShard

__all__ = ["WalJournal", "ranges"]

_Effect = tuple[Any, ...]
_yield_gil = time.sleep  # time.sleep(0): release the GIL, take it back after whoever waits


class _ReservingHook(RunHook):
    """``WalJournal.lean``'s hook of an ``ephemeral`` topic, never logged, only reserved
    (DUR-5): the lane calls it only for a reservation step due at ``low`` or an op under way."""

    __slots__ = ("tid", "shard")

    def __init__(
        self, journal: WalJournal, tid: int, shard: WalShard, runs: WalShard | None, low: int
    ) -> None:
        super().__init__(runs, journal, low)
        self.tid = tid
        self.shard = shard

    def __call__(self, seq: int, ts: int, payload: bytes) -> object:
        if self.journal._ops:
            return FALLBACK
        return self._step(seq) if seq >= self.low else None

    def _step(self, seq: int) -> object:
        """The reservation step due at ``seq`` (WAL-12): FALLBACK, or None; moves ``low``."""
        refused, self.low = self.journal._reserve_one(self.tid, self.shard, seq)
        return refused


class _BufferedHook(_ReservingHook):
    """The hook of a ``disk`` or ``memory`` topic, whose records are deferred on the shard:
    the lane calls it for a record that does not continue the open run (a new run), a
    reservation step due at ``low``, or an op under way."""

    __slots__ = ()

    def __call__(self, seq: int, ts: int, payload: bytes) -> object:
        if self.journal._ops:
            return FALLBACK
        if seq >= self.low and (refused := self._step(seq)) is not None:
            return refused
        self.shard.defer(self.tid, ts, False, seq, payload)
        return None


class _MemoryHook(_BufferedHook):
    """A ``memory`` topic reserves nothing (DUR-4): its step only moves ``low`` a long way
    ahead, keeping it a small int (CPython's fast int compare, made by the lane per record)."""

    __slots__ = ()

    def _step(self, seq: int) -> object:
        self.low = seq + (1 << 20)
        return None


class _ManyHook:
    """``WalJournal.lean_many``'s hook (lane.py ``ManyHook``): a batch of records ``first ..``
    as one complete op. Inside another op (never expected: its effects stay in order then), or
    with a seq above the durable ceiling (WAL-12), FALLBACK. A ``disk`` or ``ephemeral`` batch
    reaching ``low`` takes the reservation step for its last seq, as the single lane's hook does
    for one record (``_reserve_one``: covering the last covers the batch). Then the batch is
    framed as ``_encode`` frames one run (``walfmt.encode_run``: one APPEND_BATCH frame,
    WAL-14) and submitted after anything deferred on the shard (``WalShard.submit``), unless
    never logged (``ephemeral``). Returns the ticket of an ``fsync`` batch, else None."""

    __slots__ = ("journal", "tid", "shard", "durable", "logged", "reserves", "low")

    def __init__(self, journal: WalJournal, t: EngineTopic, shard: WalShard) -> None:
        cls = t.config.durability
        self.journal = journal
        self.tid = t.tid
        self.shard = shard
        self.durable = cls == "fsync"
        self.logged = cls != "ephemeral"
        self.reserves = cls in ("disk", "ephemeral")  # DUR-3, DUR-5; fsync and memory: DUR-4
        self.low = 0  # the next seq needing a reservation step (a RunHook's ``low``)

    def __call__(
        self, first: int, ts: int, payloads: list[bytes], sizes: list[int], total: int
    ) -> object:
        journal = self.journal
        if journal._ops:
            return FALLBACK
        shard = self.shard
        if self.reserves:
            last = first + len(payloads) - 1
            if last >= self.low:
                refused, self.low = journal._reserve_one(self.tid, shard, last)
                if refused is not None:
                    return refused
        if not self.logged:
            return None
        gen = shard.gen
        frame = walfmt.encode_run(
            self.tid, first, ts, None, None, payloads, batch_end=True, durable=self.durable,
            seed=gen, sizes=sizes, total=total,
        )  # fmt: skip
        op = shard.submit(frame, gen)
        return [(shard, op)] if self.durable else None


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
        # tid -> (ceiling, shard, end): the newest HEAD_RESERVE placed, maybe not yet synced;
        # it becomes the ceiling once its shard synced its stream up to ``end`` (WAL-12)
        self.ahead: dict[int, tuple[int, WalShard, int]] = {}
        self._ops: dict[int, list[_Effect]] = {}  # shard -> buffered effects of the current op
        self._sync: set[int] = set()  # shards whose part of the op must be synced
        self._reserving: list[tuple[int, int, int]] = []  # (tid, shard, ceiling) of this op
        self._shard_of: dict[int, int] = {}  # tid -> shard (hashing on every op is measurable)
        self._cursor_bodies: dict[str, bytes] = {}  # router name -> its cursor frame's body
        # a lane with a reservation placed ahead and not yet synced yields every so many seqs
        self._yield_every = max(1, head_reserve // 16)

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
        self.ahead.pop(t.tid, None)

    def reserved(self) -> dict[int, int]:
        """Each topic's highest reservation placed, durable or not: the ceiling a checkpoint
        records. The durable ceiling alone is not enough: a reservation placed ahead may be
        synced but not yet taken in (``_ceiling``) when the checkpoint retires the WAL file
        holding it, and the appender takes it in afterwards. Higher than the durable one is
        safe (the snapshot counts only once durable)."""
        out = dict(self.ceilings)
        for tid, (ceiling, _, _) in self.ahead.items():
            out[tid] = max(out.get(tid, 0), ceiling)
        return out

    # -- seq reservations (WAL-12) ---------------------------------------------------------
    def _ceiling(self, tid: int) -> int:
        """The durable ceiling, after taking in the reservation placed ahead once synced."""
        ceiling = self.ceilings.get(tid, 0)
        ahead = self.ahead.get(tid)
        if ahead is not None and ahead[1].synced >= ahead[2]:
            del self.ahead[tid]
            if ahead[0] > ceiling:
                ceiling = self.ceilings[tid] = ahead[0]
        return ceiling

    def _new_ceiling(self, tid: int, first: int, last: int) -> int:
        """The ceiling a HEAD_RESERVE frame sets for an op assigning ``first .. last``: the
        head before the op plus ``head_reserve`` (the op's last seq if higher), so a crash never
        skips more than ``head_reserve`` seqs past the head (DUR-3), and never below one
        already placed ahead."""
        ahead = self.ahead.get(tid)
        return max(last, first - 1 + self.head_reserve, ahead[0] if ahead is not None else 0)

    def _reserve_one(self, tid: int, shard: WalShard, seq: int) -> tuple[object, int]:
        """A lane's reservation step for ``seq`` (engine lock held). Returns FALLBACK when
        ``seq`` is above the durable ceiling (the general path then reserves in its op and
        waits), else None; with the next seq that needs this step. Half of ``head_reserve``
        below the durable ceiling, the next reservation is placed ahead: a batch of its own,
        placed at once (before records still deferred: a reservation depends on no op) and
        synced by the committer at once."""
        ceiling = self._ceiling(tid)
        if seq > ceiling:
            return FALLBACK, 0
        ahead = self.ahead.get(tid)
        if ahead is None:
            low = ceiling - self.head_reserve // 2 + 1
            if seq < low:
                return None, low
            new = self._new_ceiling(tid, seq, seq)
            seed = shard.gen
            frame = walfmt.encode_control(
                FrameType.HEAD_RESERVE, tid, {}, seq=new, batch_end=True, seed=seed
            )
            self.ahead[tid] = (new, shard, shard.place_now(frame, seed))
            shard.nudge()
        # not synced yet: let the committer run. An appender holds the GIL between appends,
        # so the committer gets it back after its write and after its fdatasync only at the
        # interpreter's switch interval (5 ms each): longer than a reservation lasts
        _yield_gil(0)
        return None, min(ceiling + 1, seq + self._yield_every)

    def lean_many(self, t: EngineTopic) -> _ManyHook:
        """The engine's batch lane's per-topic hook (lane.py ``ManyHook``, ``_ManyHook``)."""
        return _ManyHook(self, t, self.shards[self.shard_of(t.tid)])

    def lean(self, t: EngineTopic) -> Callable[[int, int, bytes], object]:
        """The engine lane's per-topic hook (lane.py ``OneHook``): record ``seq`` as a complete
        op, queued on its shard in op order (``WalShard.defer``: framed when placed, WAL-14).
        Returns the ticket the op waits on (fsync), or FALLBACK for the general path: inside
        another op (never expected; its effects stay in order then), or for a seq above the
        durable ceiling (WAL-12). The hooks of ``disk``, ``memory`` and ``ephemeral`` topics are
        ``RunHook``s: the lane does itself what they would do between reservation steps (add
        the record to the open run; for ``ephemeral``, nothing)."""
        tid, cls = t.tid, t.config.durability
        shard = self.shards[self.shard_of(tid)]
        defer = shard.defer
        if cls == "fsync":

            def one_fsync(seq: int, ts: int, payload: bytes) -> object:
                if self._ops:
                    return FALLBACK
                return [(shard, defer(tid, ts, True, seq, payload))]

            return one_fsync
        if cls == "ephemeral":  # never logged, only reserved (DUR-5)
            return _ReservingHook(self, tid, shard, None, 0)
        if cls == "memory":
            return _MemoryHook(self, tid, shard, shard, 0)
        return _BufferedHook(self, tid, shard, shard, 0)

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
        if t.config.durability in ("disk", "ephemeral"):
            tid = t.tid
            last = first_seq + len(payloads) - 1
            ceiling = self._ceiling(tid)
            ahead = self.ahead.get(tid)
            # WAL-12: above the durable ceiling, the op reserves in its own batch and waits for
            # it (which also makes any reservation placed ahead durable: it comes first); half
            # a reservation below it, one is placed ahead in the op, not waited for
            must = last > ceiling
            if must or (ahead is None and last > ceiling - self.head_reserve // 2):
                new = self._new_ceiling(tid, first_seq, last)
                self._control(t, FrameType.HEAD_RESERVE, {}, seq=new)
                shard_no = self.shard_of(tid)
                self._reserving.append((tid, shard_no, new))
                if must:
                    self._sync.add(shard_no)
        if self._logged(t):
            durable = t.config.durability == "fsync"
            self._add(
                t, ("append", t.tid, first_seq, ts, tag, node, payloads, durable, sizes, nbytes)
            )

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
        ops, sync, reserving = self._ops, self._sync, self._reserving
        self._ops, self._sync, self._reserving = {}, set(), []
        ticket: list[tuple[WalShard, int]]
        if len(ops) == 1:  # the common case: one shard, no ordering to arrange
            ((shard_no, effects),) = ops.items()
            shard = self.shards[shard_no]
            pos = shard.submit(_encode(effects, shard.gen), shard.gen)
            ticket = [(shard, pos)] if wait and shard_no in sync else []
        else:
            ticket = []
            order = sorted(ops)
            for k, shard_no in enumerate(order):
                shard = self.shards[shard_no]
                pos = shard.submit(_encode(ops[shard_no], shard.gen), shard.gen)
                must = shard_no in sync
                if must and len(order) > 1 and k < len(order) - 1:
                    # an op spanning shards (dead-lettering): each part is durable before the
                    # next is placed, so no crash keeps a later part without an earlier one
                    shard.wait_synced(pos)
                elif must and wait:
                    ticket.append((shard, pos))
        for tid, shard_no, ceiling in reserving:  # WAL-12: the newest reservation placed
            shard = self.shards[shard_no]
            self.ahead[tid] = (ceiling, shard, shard.submitted)  # durable with this op's batch
            if shard_no not in sync:
                shard.nudge()  # placed ahead of need: synced now, not at the next tick
        return ticket or None

    def wait(self, ticket: object) -> None:
        assert isinstance(ticket, list)
        for shard, pos in ticket:
            shard.wait_synced(pos)


def _encode(effects: list[_Effect], seed: int) -> bytes | bytearray:
    """Frames of one op in one shard, checksums seeded with ``seed`` (the shard's file, WAL-15);
    the last carries BATCH_END (WAL-7). A run of several records is one APPEND_BATCH frame
    (WAL-14): no per-record Python work."""
    frames: list[bytes | bytearray] = []
    n = len(effects)
    for k, e in enumerate(effects):
        last_effect = k == n - 1
        if e[0] == "append":
            _, tid, first_seq, ts, tag, node, payloads, durable, sizes, nbytes = e
            frame = walfmt.encode_run(
                tid, first_seq, ts, tag, node, payloads, batch_end=last_effect,
                durable=durable, seed=seed, sizes=sizes, total=nbytes,
            )  # fmt: skip
            frames.append(frame)
        else:
            _, ftype, tid, body, seq, durable = e
            frames.append(
                walfmt.encode_control(
                    ftype, tid, body, seq=seq, durable=durable, batch_end=last_effect, seed=seed
                )
            )
    return frames[0] if n == 1 else b"".join(frames)  # an append_many: no copy of its frame

