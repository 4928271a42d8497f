"""The model of a store of several instances (spec/INSTANCES.md): one ``ModelStore`` per
instance, the shared topic config (INST-5), slots (INST-3), the merged read and its cursor
(INST-7, INST-8), the caps divided per instance (INST-9) and the merged subscribers
(INST-15..INST-18: one SUB subscriber per instance), drops (INST-6) and deletes (INST-19).

The cursor codec and the cap shares are pure functions the ``file://`` layer uses too, so the
text a reader stores and the share a config gets cannot drift apart; the merge is written here
once more, literally as INST-7 states it (the backend merges with a heap).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any, NamedTuple

from tidelog.backend import StoreOptions, TopicRef
from tidelog.clock import Clock
from tidelog.config import TopicConfig
from tidelog.errors import BadArgument, BadOption, Locked, NoSuchSubscriber, NoSuchTopic
from tidelog.records import Item, Record, Tombstone

from .log import ModelStore

__all__ = [
    "Entry",
    "InstancesModel",
    "MAX_INSTANCES",
    "cursor_text",
    "parse_cursor",
    "share_config",
    "share_options",
    "merge_key",
]

#: INST-1: the largest instance count
MAX_INSTANCES = 256
_CURSOR = re.compile(r"[0-9]+(?:\.[0-9]+)*", re.ASCII)


class Entry(NamedTuple):
    """One item of a merged read: a record or tombstone of instance ``instance`` (INST-7)."""

    instance: int
    item: Item


def cursor_text(positions: Sequence[int]) -> str:
    """INST-8: the positions in decimal joined by ``.``."""
    return ".".join(str(p) for p in positions)


def parse_cursor(text: str | None, n: int) -> list[int]:
    """INST-8: the positions a cursor text names, for a store of ``n`` instances; ``None`` and
    ``""`` are the start. Another length or syntax is ``bad_argument``."""
    if text is None or text == "":
        return [0] * n
    if not isinstance(text, str) or not _CURSOR.fullmatch(text):
        raise BadArgument(f"cursor {text!r} is not {n} positions in decimal joined by '.' (INST-8)")
    positions = [int(p) for p in text.split(".")]
    if len(positions) != n:
        raise BadArgument(
            f"cursor {text!r} has {len(positions)} positions; this store has {n} instances (INST-8)"
        )
    return positions


def merge_key(instance: int, item: Item) -> tuple[int, int, int]:
    """INST-7: a record's key is (ts, instance, seq); a tombstone's (-1, instance, gap_from)."""
    if isinstance(item, Tombstone):
        return (-1, instance, item.gap_from)
    return (item.ts, instance, item.seq)


def share_config(name: str, config: TopicConfig, n: int) -> TopicConfig:
    """INST-9: an instance's copy of a topic holds ``cap // n`` of each cap; a cap below ``n``
    is ``bad_option`` (a share of 0 holds nothing)."""
    out: dict[str, Any] = {}
    for key in ("cap_records", "cap_bytes"):
        cap = getattr(config, key)
        if cap is None:
            continue
        if cap < n:
            raise BadOption(
                f"topic {name!r}: {key}={cap} is below the store's {n} instances; each "
                f"instance holds {key} // {n} (INST-9)"
            )
        out[key] = cap // n
    return replace(config, **out)


def share_options(options: StoreOptions, n: int) -> StoreOptions:
    """INST-9: each instance gets ``max_bytes // n`` of the store's ``max_bytes``."""
    if options.max_bytes is None:
        return options
    if options.max_bytes < n:
        raise BadOption(
            f"option max_bytes={options.max_bytes} is below the store's {n} instances; each "
            f"instance holds max_bytes // {n} (INST-9)"
        )
    return replace(options, max_bytes=options.max_bytes // n)


def _merge(streams: list[list[Item]], positions: list[int], limit: int) -> list[Entry]:
    """INST-7 as written: take the smallest head key until ``limit`` or every stream is
    empty; ``positions`` move to each instance's last item taken (INST-8)."""
    out: list[Entry] = []
    while len(out) < limit:
        heads = [(merge_key(i, s[0]), i) for i, s in enumerate(streams) if s]
        if not heads:
            break
        _, i = min(heads)
        item = streams[i].pop(0)
        out.append(Entry(i, item))
        positions[i] = item.gap_to if isinstance(item, Tombstone) else item.seq
    return out


class InstancesModel:
    """``n`` instances, each a ``ModelStore``; slots held by "processes" (INST-3)."""

    def __init__(self, n: int, clock: Clock, options: StoreOptions | None = None) -> None:
        self.n = n
        self.options = share_options(options or StoreOptions(), n)
        self.stores = [ModelStore(clock, self.options) for _ in range(n)]
        self.configs: dict[str, TopicConfig] = {}  # the shared part (INST-5)
        self.subscribers: dict[str, dict[str, str]] = {}  # topic -> name -> start (INST-15)
        self.held: set[int] = set()
        self.incarnations: dict[str, int] = {}  # INST-6: the shared g, kept after a drop

    # -- slots (INST-3) ---------------------------------------------------------------------
    def take(self) -> int:
        """The lowest free slot, now held; ``locked`` when every one is."""
        free = [i for i in range(self.n) if i not in self.held]
        if not free:
            raise Locked(f"every one of the {self.n} instance slots is held (INST-3)")
        self.held.add(free[0])
        return free[0]

    def release(self, instance: int, clock: Clock) -> None:
        """The holder closed (or died: with fsync topics a crash keeps every acknowledged op,
        DUR-2, so both leave the same state); the next holder restarts the instance."""
        self.held.discard(instance)
        store = self.stores[instance]
        store.close()
        store.restart(clock)

    # -- topics (INST-5, INST-9) ------------------------------------------------------------
    def topic(self, instance: int, name: str, options: Mapping[str, object]) -> TopicRef:
        config = self.configs.get(name)
        if config is None:
            config = TopicConfig.from_options(name, options)
            share = share_config(name, config, self.n)  # refused before the shared file
            self.configs[name] = config
            self.incarnations[name] = self.incarnations.get(name, 0) + 1  # INST-6
        else:
            config.check_matches(name, options)
            share = share_config(name, config, self.n)
        store = self.stores[instance]
        ref = store.open_topic(name, share.to_dict(), True)
        self._register(instance, name)
        return ref

    def _register(self, instance: int, topic: str) -> None:
        """INST-15: the topic's merged subscribers missing in this instance, with their start."""
        store, ref = self.stores[instance], self._ref(instance, topic)
        if ref is None:
            return
        for name, start in sorted(self.subscribers.get(topic, {}).items()):
            if name not in store.subscribers(ref):
                store.subscribe(ref, name, start)

    def topics(self) -> list[str]:
        return sorted(self.configs)

    def drop(self, name: str) -> None:
        """INST-6: the topic leaves every instance and the shared part at once (its merged
        subscribers with it); a re-create is the next incarnation."""
        if name not in self.configs:
            raise NoSuchTopic(f"topic {name!r} does not exist")
        del self.configs[name]
        self.subscribers.pop(name, None)
        for store in self.stores:
            if name in store.topics:
                store.drop_topic(name)

    def delete(
        self, name: str, positions: Sequence[int] | None, tag: str | None, tag_glob: str | None
    ) -> int:
        """INST-19: DEL in every instance holding the topic; with ``positions`` instance i
        deletes only seqs up to p_i."""
        total = 0
        for i, store in enumerate(self.stores):
            ref = self._ref(i, name)
            before = None if positions is None else positions[i] + 1
            if ref is None or before == 1:
                continue
            total += store.delete(ref, before, tag, tag_glob)
        return total

    def settle(self, topic: str, name: str, instance: int, seq: int, op: str) -> bool:
        """INST-18: SUB-3's ack or reject of ``seq`` in ``instance``."""
        store, ref = self.stores[instance], self._ref(instance, topic)
        if ref is None:
            raise BadArgument(f"instance {instance} holds no copy of {topic!r} (INST-18)")
        return store.ack(ref, name, seq) if op == "ack" else store.reject(ref, name, seq)

    def append(self, instance: int, name: str, payloads: Sequence[bytes]) -> list[int]:
        store = self.stores[instance]
        ref = self._ref(instance, name)
        if ref is None:
            raise NoSuchTopic(f"topic {name!r} is not open in instance {instance}")
        return store.append(ref, payloads, None, None)

    def _ref(self, instance: int, name: str) -> TopicRef | None:
        t = self.stores[instance].topics.get(name)
        return None if t is None else TopicRef(name, t.incarnation)

    # -- the merged read (INST-7, INST-8) ---------------------------------------------------
    def read(self, name: str, cursor: str | None, limit: int) -> tuple[list[Entry], str]:
        if limit < 1:
            raise BadArgument(f"limit must be at least 1, got {limit}")
        positions = parse_cursor(cursor, self.n)
        streams: list[list[Item]] = []
        for i, store in enumerate(self.stores):
            ref = self._ref(i, name)
            streams.append([] if ref is None else store.read(ref, positions[i], limit, None))
        return _merge(streams, positions, limit), cursor_text(positions)

    # -- merged subscribers (INST-15..INST-17) -------------------------------------------------
    def subscribe(self, topic: str, name: str, start: str) -> str:
        """Registers ``name`` in every instance holding ``topic``; returns the stored start."""
        stored = self.subscribers.setdefault(topic, {}).setdefault(name, start)
        for i in range(self.n):
            self._register(i, topic)
        return stored

    def unregister(self, topic: str, name: str) -> None:
        """INST-22: gone from the shared part and from every instance at once; a later
        ``subscribe`` of the name starts anew."""
        if name not in self.subscribers.get(topic, {}):
            raise NoSuchSubscriber(f"subscriber {name!r} of topic {topic!r} does not exist")
        del self.subscribers[topic][name]
        for i, store in enumerate(self.stores):
            ref = self._ref(i, topic)
            if ref is not None and name in store.subscribers(ref):
                store.unregister(ref, name)

    def hwms(self, topic: str, name: str) -> list[int | None]:
        out: list[int | None] = []
        for i, store in enumerate(self.stores):
            ref = self._ref(i, topic)
            registered = ref is not None and name in store.subscribers(ref)
            out.append(store.hwm(ref, name) if ref is not None and registered else None)
        return out

    def poll(
        self, topic: str, name: str, session: list[int], limit: int
    ) -> tuple[list[Entry], str]:
        """INST-16: the merged read of the registered instances from max(session, hwm);
        ``session`` moves in place."""
        hwms = self.hwms(topic, name)
        streams: list[list[Item]] = []
        for i, store in enumerate(self.stores):
            hwm = hwms[i]
            ref = self._ref(i, topic)
            if hwm is None or ref is None:
                streams.append([])
                continue
            session[i] = max(session[i], hwm)
            streams.append(store.read(ref, session[i], limit, None))
        return _merge(streams, session, limit), cursor_text(session)

    def commit(self, topic: str, name: str, positions: Sequence[int]) -> None:
        """INST-17: SUB-3's commit of each position in its instance."""
        for i, seq in enumerate(positions):
            store, ref = self.stores[i], self._ref(i, topic)
            if seq <= 0 or ref is None or name not in store.subscribers(ref):
                continue
            store.commit(ref, name, min(seq, store.state(ref).head_seq))

    def records(self, name: str) -> list[tuple[int, Record]]:
        """Every live record of every instance (for exactly-once checks)."""
        out: list[tuple[int, Record]] = []
        for i, store in enumerate(self.stores):
            ref = self._ref(i, name)
            if ref is not None:
                out += [(i, r) for r in store.read(ref, 0, 1 << 62, None) if isinstance(r, Record)]
        return out
