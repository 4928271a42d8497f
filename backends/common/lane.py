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
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from .journal import FALLBACK

if TYPE_CHECKING:
    from .engine import Engine, EngineTopic

__all__ = ["Lane", "Fallback", "OneHook", "make_lane"]

#: append one record: its seq, or None when the general path must take it
Lane = Callable[[bytes], "int | None"]
#: the general path of a record the lane does not take: (payload, tag, node) -> its result
Fallback = Callable[[object, "str | None", "str | None"], "int | None"]
#: the journal's per-topic hook: log record ``seq`` (ts, payload) as a complete op and return the
#: ticket the op waits on (None: nothing to wait for), or FALLBACK for the general path
OneHook = Callable[[int, int, bytes], object]

_time_ns = time.time_ns


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

    def append(payload: bytes, *, tag: str | None = None, node: str | None = None) -> int | None:
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
                    ticket = one(seq, ts, payload)
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
