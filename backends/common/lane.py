"""The lean single append: one record without tag or node, on a topic that can neither evict,
refuse for room nor expire anything (no caps, no TTL: ``EngineTopic.lean``), with no router out
of it and no lease or delayed job to expire. Doing only what the spec requires there (TOP-1,
TOP-5, and the durability class through the journal), it is the common case's whole path.

A *lane* is a closure made once per topic handle (``Engine.lane``): what an append would look up
on every call (the store lock, the topic, its tail lists, the journal's per-topic hook) is bound
in it, and what can change is checked on every call (the store closed, the topic dropped, a
router out of it, a lease or delayed job). It returns None when it does not take the record; the
caller then uses ``Backend.append``, which decides and raises as usual.

The record is appended to the topic's tail as ``TopicLog.append`` does for one unlabelled record
(the tail lists are mutated in place, never rebound, so the lane may hold them).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from .journal import FALLBACK

if TYPE_CHECKING:
    from .engine import Engine, EngineTopic

__all__ = ["Lane", "OneHook", "make_lane"]

#: append one record: its seq, or None when the general path must take it
Lane = Callable[[bytes], "int | None"]
#: the journal's per-topic hook: log record ``seq`` (ts, payload) as a complete op and return the
#: ticket the op waits on (None: nothing to wait for), or FALLBACK for the general path
OneHook = Callable[[int, int, bytes], object]

_time_ns = time.time_ns


def make_lane(e: Engine, t: EngineTopic, one: OneHook | None) -> Lane:
    acquire, release = e.lock.acquire, e.lock.release  # not ``with``: no bound methods per call
    log = t.log
    leases, delayed = t.jobs.leases, t.jobs.delayed
    add_payload, add_ts = log.payloads.append, log.tss.append
    limit = e.options.max_record_bytes
    gate = log.gate_visibility  # set when the topic is created (fsync topics), never changed

    def append(payload: bytes) -> int | None:
        if len(payload) > limit:
            return None
        acquire()
        try:
            if e.closed or t.dropped or t.outs or leases or delayed:
                return None
            now = _time_ns() // 1_000_000 if e._wall else e.clock.now_ms()
            last = log.last_ts
            later = last is None or now > last
            ts: int = now if later else last  # type: ignore[assignment]  # TOP-5
            seq = log.head + 1
            ticket = None
            if one is not None:
                ticket = one(seq, ts, payload)
                if ticket is FALLBACK:
                    return None
            # the tail's columns; no label (the open label run is unlabelled), no counter: the
            # count, byte total and change counter follow from the tail and head (index.py,
            # EngineTopic.version)
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
        if ticket is not None or gate:
            e._finish(ticket, [(t, seq)] if gate else [])
        return seq

    return append
