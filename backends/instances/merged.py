"""The merged view of a topic of an instances store (spec/INSTANCES.md): the merged read
(INST-7, INST-8) and the merged subscriber (INST-15..INST-17)."""

from __future__ import annotations

import time
from typing import NamedTuple

from tidelog.api import Topic
from tidelog.errors import BadArgument, Closed
from tidelog.hooks import hooks
from tidelog.model.instances import Entry, cursor_text, parse_cursor
from tidelog.names import check_label, check_subscriber_name
from tidelog.records import Item

from .backend import InstancesBackend
from .merge import merge

__all__ = ["Merged", "MergedRead", "MergedSubscriber", "merged"]


def _check_int(value: object, what: str, lowest: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < lowest:
        raise BadArgument(f"{what} must be an integer of at least {lowest}, got {value!r}")


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
        self._live()
        _check_int(limit, "limit", 1)
        _check_int(wait_ms, "wait_ms", 0)
        if cursor is not None and not isinstance(cursor, str):
            raise BadArgument(f"cursor must be a string or None, got {cursor!r} (INST-8)")
        name, g = self._topic.name, self._topic.incarnation
        if wait_ms > 0:
            items, text = self._backend.merged_wait(name, cursor, limit, wait_ms, g)
        else:
            items, text = self._backend.merged_read(name, cursor, limit, g)
        return MergedRead(items, text)

    def read_instance(self, instance: int, after: int, limit: int) -> list[Item]:
        """Instance ``instance``'s own stream of the merged read (INST-7): the items of
        ``read(after=after)`` on its copy of the topic, without refreshing the views (see
        ``head_seq``); empty where the instance does not hold the topic (yet). Like a merged
        read it checks afterwards that the topic is still ``live`` at the handle's incarnation
        (INST-6, else ``no_such_topic``): a copy of a later incarnation is never read as this
        one (FORWARD.md FWD-35)."""
        backend = self._live()
        self._check_instance(instance)
        _check_int(after, "after", 0)
        _check_int(limit, "limit", 1)
        positions: list[int | None] = [None] * backend.n
        positions[instance] = after
        items = backend._streams(self._topic.name, positions, limit)[instance]
        backend.check_live(self._topic._ref)
        return items

    def head_seq(self, instance: int, *, refresh: bool = True) -> int:
        """The seq of the last record instance ``instance`` holds of the topic (0: none, or no
        copy of the topic there yet); ``refresh`` first catches up every view (INST-4)."""
        backend = self._live()
        self._check_instance(instance)
        if refresh:
            backend.refresh()
        found = backend._ref(instance, self._topic.name)
        head = 0 if found is None else found[0].state(found[1]).head_seq
        backend.check_live(self._topic._ref)  # INST-6: not the head of a later incarnation
        return head

    def _check_instance(self, instance: int) -> None:
        if isinstance(instance, bool) or not isinstance(instance, int):
            raise BadArgument(f"instance must be an integer, got {instance!r}")
        if not 0 <= instance < self._backend.n:
            raise BadArgument(
                f"instance {instance} is not one of the store's {self._backend.n} (INST-1)"
            )

    def subscribe(self, name: str, start: str = "earliest") -> MergedSubscriber:
        """Register (or resume) the durable subscriber ``name`` in every instance (INST-15)."""
        self._live()
        check_subscriber_name(name)
        if start not in ("earliest", "latest"):
            raise BadArgument(f"start must be earliest or latest, got {start!r} (INST-15)")
        topic = self._topic
        stored = self._backend.sub_register(topic.name, name, start, topic.incarnation)
        return MergedSubscriber(self, name, stored)

    def delete(
        self, before: str | None = None, *, tag: str | None = None, tag_glob: str | None = None
    ) -> int:
        """INST-19: DEL's delete in every instance; ``before`` is a cursor (INST-8): instance
        ``i`` deletes only records with seqs up to its position ``p_i``. Returns how many
        records were removed in all."""
        backend = self._live()
        if before is None and tag is None and tag_glob is None:
            raise BadArgument("delete needs before, tag or tag_glob (DEL-6, INST-19)")
        if tag is not None and tag_glob is not None:
            raise BadArgument("delete takes tag or tag_glob, not both (DEL-6)")
        if before is not None and not isinstance(before, str):
            raise BadArgument(f"before must be a cursor text, got {before!r} (INST-8, INST-19)")
        check_label(tag, "tag")
        check_label(tag_glob, "tag_glob")
        positions = None if before is None else parse_cursor(before, backend.n)
        return backend.merged_delete(self._topic._ref, positions, tag, tag_glob)

    def _live(self) -> InstancesBackend:
        if self._topic.store.closed:
            raise Closed(f"store {self._topic.store.uri} is closed")
        return self._backend


def merged(topic: Topic) -> Merged:
    """``topic`` read across every instance (INST-7); ``not_available`` for a topic of a store
    that is not an instances store."""
    return Merged(topic)


class MergedSubscriber:
    """One durable subscriber per instance, consumed through the merged read (INST-16) and
    committed by cursor (INST-17). The session positions are this handle's own."""

    __slots__ = ("_merged", "_name", "_start", "_session")

    def __init__(self, merged: Merged, name: str, start: str) -> None:
        self._merged = merged
        self._name = name
        self._start = start
        self._session = [0] * merged.instances

    @property
    def name(self) -> str:
        return self._name

    def _positions(self) -> list[int | None]:
        m = self._merged
        hwms = m._live().sub_hwms(m._topic.name, self._name)
        return [None if h is None else max(h, s) for h, s in zip(hwms, self._session)]

    def poll(self, max: int = 100, *, wait_ms: int = 0) -> MergedRead:
        """The merged read after each instance's max(session, hwm), of the instances that
        registered the subscriber (INST-16)."""
        _check_int(max, "max", 1)
        _check_int(wait_ms, "wait_ms", 0)
        backend = self._merged._live()
        deadline = time.monotonic() + wait_ms / 1000.0
        delay = 0.002
        while True:
            positions = self._positions()
            topic = self._merged._topic
            streams = backend._streams(topic.name, positions, max)
            moved = [0 if p is None else p for p in positions]
            items = merge(streams, moved, max)
            backend.check_live(topic._ref)  # INST-6: never a result mixing incarnations
            for i, p in enumerate(positions):
                if p is not None:
                    self._session[i] = moved[i]
            left = deadline - time.monotonic()
            if items or left <= 0:
                return MergedRead(items, cursor_text(moved))
            time.sleep(min(delay, left))
            delay = min(delay * 2, 0.05)

    def commit(self, cursor: str) -> None:
        """Commit each instance's position of ``cursor``, durably (INST-17)."""
        m = self._merged
        backend = m._live()
        if not isinstance(cursor, str):
            raise BadArgument(f"cursor must be a string, got {cursor!r} (INST-8)")
        positions = parse_cursor(cursor, m.instances)
        topic = m._topic
        backend.sub_commit(topic.name, self._name, self._start, positions, topic.incarnation)

    def ack(self, instance: int, seq: int) -> bool:
        """SUB-3's ``ack`` of record ``seq`` of ``instance`` (an ``Entry``'s two fields), in
        that instance and durable there (INST-18)."""
        return self._settle(instance, seq, "ack")

    def reject(self, instance: int, seq: int) -> bool:
        """SUB-3's ``reject`` of record ``seq`` of ``instance``, durable there (INST-18)."""
        return self._settle(instance, seq, "reject")

    def _settle(self, instance: int, seq: int, op: str) -> bool:
        m = self._merged
        backend = m._live()
        _check_int(instance, "instance", 0)
        _check_int(seq, "seq", 1)
        return backend.sub_settle(m._topic._ref, self._name, instance, seq, op)

    def unregister(self) -> None:
        """Remove the subscriber from every instance and the shared part (INST-22): its
        records are no longer held for it, and a re-open never registers it again."""
        m = self._merged
        m._live().sub_unregister(m._topic._ref, self._name)

    @property
    def hwm(self) -> str:
        """The instances' hwms as a cursor text (0 where not registered, INST-17)."""
        m = self._merged
        backend = m._live()
        hwms = backend.sub_hwms(m._topic.name, self._name)
        backend.check_live(m._topic._ref)  # INST-6: not the hwms of a later incarnation
        return cursor_text([0 if h is None else h for h in hwms])
