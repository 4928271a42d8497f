"""tidelog.backends.instances: several writer processes on one ``file://`` store
(spec/INSTANCES.md).

``tidelog.open("file:///dir?instances=4")`` (or ``instances=auto``) takes a free instance slot
and writes only there (INST-3); ``merged(topic)`` reads the topic as the union of every
instance's log with a resumable cursor (INST-7, INST-8)::

    with tidelog.open("file:///var/lib/app/buf?instances=auto") as store:
        events = store.topic("events")
        events.append(b"...")                 # a seq of this process's instance
        items, cursor = merged(events).read(cursor=None, limit=500)
        for entry in items:                   # Entry(instance, Record | Tombstone)
            ...
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import NamedTuple

from tidelog.api import Topic
from tidelog.clock import Clock
from tidelog.errors import BadArgument, BadOption, Closed
from tidelog.fsio import FS, OsFS
from tidelog.hooks import hooks
from tidelog.model.instances import MAX_INSTANCES, Entry
from tidelog.options import parse_int

from ..file.options import parse_file_options
from .backend import CAPABILITIES, InstancesBackend
from .shared import refuse_plain_open

__all__ = [
    "CAPABILITIES",
    "Entry",
    "InstancesBackend",
    "Merged",
    "MergedRead",
    "merged",
    "open_instances",
    "parse_instances",
    "refuse_plain_open",
]


def parse_instances(key: str, value: object) -> int | None:
    """INST-1: an integer 1..MAX_INSTANCES, or ``auto`` (None: the stored count, else
    ``os.cpu_count()``)."""
    if isinstance(value, str) and value.strip().lower() == "auto":
        return None
    try:
        return parse_int(key, value, minimum=1, maximum=MAX_INSTANCES)
    except BadOption as exc:
        raise BadOption(f"{exc.message}; or instances=auto (INST-1)") from None


def open_instances(
    fs: FS | None, root: str, clock: Clock, options: Mapping[str, object]
) -> InstancesBackend:
    """The instances store at ``root``; ``options`` hold ``instances`` and ``file://``'s
    options, all checked before anything is created (INST-1, URI-2)."""
    rest = dict(options)
    count = parse_instances("instances", rest.pop("instances"))
    store_options, file_options = parse_file_options(rest)
    fs = fs if fs is not None else OsFS(mmap=file_options.mmap)
    return InstancesBackend(fs, root, clock, count, store_options, file_options)


class MergedRead(NamedTuple):
    """What a merged read returns: the entries and the cursor after them (INST-7, INST-8)."""

    items: list[Entry]
    cursor: str


class Merged:
    """A topic of an instances store as the union of its instances' logs (INST-7)."""

    __slots__ = ("_topic", "_backend")

    def __init__(self, topic: Topic) -> None:
        self._topic = topic
        self._backend = hooks(topic.store, InstancesBackend)

    @property
    def instances(self) -> int:
        return self._backend.n

    def read(self, cursor: str | None = None, limit: int = 1000, *, wait_ms: int = 0) -> MergedRead:
        """Up to ``limit`` entries after ``cursor`` (None: from the start), in INST-7's order,
        and the cursor to read on from (INST-8). With ``wait_ms`` an empty result waits up to
        that long for something to arrive (CON-3)."""
        if self._topic.store.closed:
            raise Closed(f"store {self._topic.store.uri} is closed")
        for value, what, lowest in ((limit, "limit", 1), (wait_ms, "wait_ms", 0)):
            if isinstance(value, bool) or not isinstance(value, int) or value < lowest:
                raise BadArgument(f"{what} must be an integer of at least {lowest}, got {value!r}")
        if cursor is not None and not isinstance(cursor, str):
            raise BadArgument(f"cursor must be a string or None, got {cursor!r} (INST-8)")
        name = self._topic.name
        if wait_ms > 0:
            items, text = self._backend.merged_wait(name, cursor, limit, wait_ms)
        else:
            items, text = self._backend.merged_read(name, cursor, limit)
        return MergedRead(items, text)


def merged(topic: Topic) -> Merged:
    """``topic`` read across every instance (INST-7); ``not_available`` for a topic of a store
    that is not an instances store."""
    return Merged(topic)
