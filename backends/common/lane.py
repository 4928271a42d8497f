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

__all__ = ["Lane", "Fallback", "OneHook", "RunHook", "make_lane"]

#: append one record: its seq, or None when the general path must take it
Lane = Callable[[bytes], "int | None"]
#: the general path of a record the lane does not take: (payload, tag, node) -> its result
Fallback = Callable[[object, "str | None", "str | None"], "int | None"]
#: the journal's per-topic hook: log record ``seq`` (ts, payload) as a complete op and return the
#: ticket the op waits on (None: nothing to wait for), or FALLBACK for the general path
OneHook = Callable[[int, int, bytes], object]

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
