"""The lean single append: one record without tag or node, on a topic that can neither evict,
refuse for room nor expire anything (no caps, no TTL: ``EngineTopic.lean``), with no router out
of it and no lease or delayed job to expire. Doing only what the spec requires there (TOP-1,
TOP-5, and the durability class through the journal), it is the common case's whole path.

A *lane* is a closure made once per topic handle (``Engine.lane``): what an append would look up
on every call (the store lock, the topic, its tail lists, the journal's per-topic hook) is bound
in it, and what can change is checked on every call (the store closed, the topic dropped, a
router out of it, a lease or delayed job). A record it does not take (a tag or node, a payload
not of type bytes or too long, any of those changes) goes to its *fallback*, the caller's general
path (``Backend.append``, which decides and raises as usual), whose result it returns: made with
the API's general append as fallback (``Engine.append_lane``), the lane is the topic handle's
``append`` itself, one Python frame per append. ``Engine.lane``'s lanes (``Backend.lane``) take
only a payload and return None for "not here".

The record is appended to the topic's tail as ``TopicLog.append`` does for one unlabelled record
(the tail lists are mutated in place, never rebound, so the lane may hold them).

*The batch lane* (``make_many_lane``, a topic handle's ``append_many``) is the same idea for a
batch: on the same lean topics and under the same per-call checks, a list of ``bytes`` without
labels or producer is one op that the journal's batch hook logs (``ManyHook``: framed and
submitted at once, one APPEND_BATCH frame, WAL-14) and ``TopicLog.append`` adds to the tail.
It saves the general op's layers (resolving the ref, the op closure, the effect list, the
caps and labels of each run), not a pass over the payloads: those (type, lengths, their sum)
it takes once, as the general path does.

*Open runs*: a ``disk`` or ``memory`` topic's record is deferred on its WAL shard, where
consecutive records of one topic sharing a ts form the shard's open run (one APPEND_BATCH frame
when placed, WAL-14). Its journal hook is then a ``RunHook``, and the lane extends that run
itself, without calling the hook, while the hook would do only that: the record's seq is below
the hook's next reservation step (``RunHook.low``, WAL-12), no journal op is under way, the
shard's open run is still the list the lane's last record went into (``is``: nobody placed or
closed it since, so it is this topic's), this record has that run's ts and next seq, and the
shard has not failed (the run's ts and next seq are read from the shard, ``_run_ts`` and
``_run_next``). It keeps the shard's counters as ``WalShard.defer`` does (``_run_next``,
``ops``). An ``ephemeral`` topic's hook is a ``RunHook`` without runs: below its reservation
step, with no op under way, it would do nothing, and is not called. The run cannot be placed
or closed while the lane checks and extends it: every placing (``submit``, ``_place_deferred``
of the committer, a flush or a leader, ``position``, ``close``) holds the shard's ``outer``
lock, which is the engine lock the lane holds.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from .journal import FALLBACK

if TYPE_CHECKING:
    from .engine import Engine, EngineTopic

__all__ = [
    "Lane", "Fallback", "OneHook", "RunHook", "make_lane",
    "ManyHook", "ManyFallback", "make_many_lane",
]  # fmt: skip

#: append one record: its seq, or None when the general path must take it
Lane = Callable[[bytes], "int | None"]
#: the general path of a record the lane does not take: (payload, tag, node) -> its result
Fallback = Callable[[object, "str | None", "str | None"], "int | None"]
#: the journal's per-topic hook: log record ``seq`` (ts, payload) as a complete op and return the
#: ticket the op waits on (None: nothing to wait for), or FALLBACK for the general path
OneHook = Callable[[int, int, bytes], object]

#: the journal's per-topic hook of the batch lane: log records ``first ..`` (ts, payloads, their
#: lengths and total) as one complete op and return the ticket the op waits on (None: nothing to
#: wait for), or FALLBACK for the general path
ManyHook = Callable[[int, int, "list[bytes]", "list[int]", int], object]
#: the general path of a batch the batch lane does not take: (payloads, tag, node, producer)
ManyFallback = Callable[[object, "str | None", "str | None", object], "list[int]"]

_time_ns = time.time_ns


class RunHook:
    """A journal's ``OneHook`` that tells the lane when a record needs nothing of it but what
    the lane can do itself (module docstring): below seq ``low`` (its next reservation step,
    kept by the hook), with no journal op under way (``journal._ops`` empty), a record of a
    class never logged needs nothing (``runs`` None: ``ephemeral``), and one that continues the
    open run of ``runs`` (a ``WalShard``: ``_run``, the list; ``_run_next``; ``ops``;
    ``failed``) is added to it."""

    __slots__ = ("runs", "journal", "low")

    def __init__(self, runs: Any, journal: Any, low: int) -> None:
        self.runs = runs
        self.journal = journal
        self.low = low

    def __call__(self, seq: int, ts: int, payload: bytes) -> object:
        raise NotImplementedError  # each journal's hook is its own


class _NoRuns:
    """The runs of a lane whose hook has none (not a ``RunHook``, or one of a class never
    logged): its open run is never the lane's, so the extension check fails at its first
    test."""

    __slots__ = ("_run",)

    def __init__(self) -> None:
        self._run = None


_NO_RUNS = _NoRuns()


def _decline(payload: object, tag: str | None, node: str | None) -> None:
    """``Backend.lane``'s fallback: "not here", the caller takes the record."""
    return None


def make_lane(
    e: Engine, t: EngineTopic, one: OneHook | None, fallback: Fallback = _decline
) -> Callable[..., int | None]:
    """The lane of topic ``t``: ``append(payload, *, tag=None, node=None)``."""
    acquire, release = e.lock.acquire, e.lock.release  # not ``with``: no bound methods per call
    log = t.log
    leases, delayed = t.jobs.leases, t.jobs.delayed
    add_payload, add_ts = log.payloads.append, log.tss.append
    limit = e.options.max_record_bytes
    gate = log.gate_visibility  # set when the topic is created (fsync topics), never changed
    # the hook's next reservation step, taken after each call of a RunHook (-1: not one, never
    # passed; 0: the hook's first call is ahead), and the open run the lane's last record went
    # into (a fresh list is never the shard's); its ts and next seq are the shard's
    low = -1
    run: list[bytes] = []
    # the hook's runs; _NO_RUNS: it has none (not a RunHook, or a RunHook of a class never
    # logged, which needs nothing below ``low``)
    runs: Any = _NO_RUNS
    journal: Any = None
    if isinstance(one, RunHook):
        journal, low = one.journal, 0
        if one.runs is not None:
            runs = one.runs

    def append(payload: bytes, *, tag: str | None = None, node: str | None = None) -> int | None:
        nonlocal low, run
        if tag is not None or node is not None or type(payload) is not bytes:
            return fallback(payload, tag, node)
        if len(payload) > limit:
            return fallback(payload, tag, node)
        seq: int | None = None
        acquire()
        try:
            if not (e.closed or t.dropped or t.outs or leases or delayed):
                now = _time_ns() // 1_000_000 if e._wall else e.clock.now_ms()
                last = log.last_ts
                later = last is None or now > last
                ts: int = now if later else last  # type: ignore[assignment]  # TOP-5
                seq = log.head + 1
                ticket = None
                if one is not None:
                    if (
                        run is runs._run
                        and seq == runs._run_next
                        and ts == runs._run_ts
                        and seq < low
                        and not journal._ops
                        and runs.failed is None
                    ):  # the hook would only extend the open run (module docstring)
                        run.append(payload)
                        runs._run_next = seq + 1
                        runs.ops += 1
                    elif not (runs is _NO_RUNS and seq < low and not journal._ops):
                        ticket = one(seq, ts, payload)
                        if low >= 0:  # a RunHook
                            low = one.low  # type: ignore[attr-defined]
                            if ticket is None and runs is not _NO_RUNS:  # seq ends the open run
                                run = runs._run
                if ticket is FALLBACK:
                    seq = None
                else:
                    # the tail's columns; no label (the open label run is unlabelled), no
                    # counter: the count, byte total and change counter follow from the tail
                    # and head (index.py, EngineTopic.version)
                    add_payload(payload)
                    add_ts(ts)
                    log.head = seq
                    if not gate:
                        log.visible = seq
                    if later:
                        log.last_ts = ts
                    if e._waiters:
                        e._notify(t.name)
        finally:
            release()
        if seq is None:  # not taken: nothing changed
            return fallback(payload, tag, node)
        if ticket is not None or gate:
            e._finish(ticket, [(t, seq)] if gate else [])
        return seq

    return append


def make_many_lane(
    e: Engine, t: EngineTopic, many: ManyHook | None, fallback: ManyFallback
) -> Callable[..., list[int]]:
    """The batch lane of topic ``t``: ``append_many(payloads, *, tag=None, node=None,
    producer=None)``. It takes a non-empty list of ``bytes`` without labels or producer, none
    longer than ``max_record_bytes``, while the topic stays lean as the single lane checks it
    (``make_lane``), and does for it what the general path does for one run of records
    (TOP-6: one atomic append, consecutive seqs, one ts by TOP-5): the journal's hook ``many``
    logs it as one op (one APPEND_BATCH frame, WAL-14; the hook decides a reservation step,
    WAL-12, or sends it to the fallback), then the tail takes it as ``TopicLog.append`` does.
    ``many`` None: nothing is logged (a store without a journal). Everything else, and what the
    hook returns FALLBACK for, goes to ``fallback`` with the batch (a copy of the caller's
    list: what was checked is what is stored, whatever the caller's other threads do to
    theirs)."""
    acquire, release = e.lock.acquire, e.lock.release
    log = t.log
    leases, delayed = t.jobs.leases, t.jobs.delayed
    limit = e.options.max_record_bytes
    gate = log.gate_visibility  # set when the topic is created (fsync topics), never changed
    tail_append = log.append

    def append_many(
        payloads: object,
        *,
        tag: str | None = None,
        node: str | None = None,
        producer: tuple[str, int] | None = None,
    ) -> list[int]:
        if tag is not None or node is not None or producer is not None:
            return fallback(payloads, tag, node, producer)
        if type(payloads) is not list:
            return fallback(payloads, tag, node, producer)
        data: list[bytes] = payloads.copy()
        n = len(data)
        # a count by identity: no hashing; an empty batch is the general path's to answer
        if not n or list(map(type, data)).count(bytes) != n:
            return fallback(data, tag, node, producer)
        sizes = list(map(len, data))  # once: the tail's byte total and the frame's lengths
        total = sum(sizes)
        if total > limit and max(sizes) > limit:  # too_large: the general path refuses it
            return fallback(data, tag, node, producer)
        seqs: list[int] | None = None
        ticket = None
        acquire()
        try:
            if not (e.closed or t.dropped or t.outs or leases or delayed):
                now = _time_ns() // 1_000_000 if e._wall else e.clock.now_ms()
                last = log.last_ts
                ts: int = now if last is None or now > last else last  # TOP-5
                if many is not None:
                    ticket = many(log.head + 1, ts, data, sizes, total)
                if ticket is not FALLBACK:
                    seqs = tail_append(data, None, None, ts, total)
                    if e._waiters:
                        e._notify(t.name)
        finally:
            release()
        if seqs is None:  # not taken: nothing changed
            return fallback(data, tag, node, producer)
        if ticket is not None or gate:
            e._finish(ticket, [(t, seqs[-1])] if gate else [])
        return seqs

    return append_many
