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

from tidelog.clock import Clock
from tidelog.errors import BadOption
from tidelog.fsio import FS, OsFS
from tidelog.model.instances import MAX_INSTANCES, Entry
from tidelog.options import parse_int

from ..file.options import parse_file_options
from .backend import CAPABILITIES, InstancesBackend
from .merged import Merged, MergedRead, MergedSubscriber, merged
from .shared import refuse_plain_open

__all__ = [
    "CAPABILITIES",
    "Entry",
    "InstancesBackend",
    "Merged",
    "MergedRead",
    "MergedSubscriber",
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
