"""A sealed segment in the cold tier as a chunk of the topic log (spec/TIERING.md TIER-8).

A ``ColdChunk`` is a ``SegChunk`` whose ``.data`` is not there until read: its index, label
runs, size and dead map are in memory (so floors, caps, TTL and tag deletes need no cold I/O),
and its ``.data`` bytes are fetched by one ranged read when a read needs them (``read_view``: a
local directory's object mapped, an object store's bytes in pyarrow's buffer, no further copy),
then checked exactly as a hot segment's (SEG-1, SEG-3 at load; SEG-12 on every read). Loaded
bytes sit in a ``ColdCache`` of bounded size; the store fetches them outside its lock before a
read runs (tiers.py), so a read under the lock finds them there.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

from tidelog.errors import Corrupt

from .chunk import SegChunk
from .format import segment as segfmt
from .format.segment import SegmentIndex
from .segstore import SegmentStore, redact

__all__ = ["ColdChunk", "ColdCache", "data_key", "idx_key", "topic_prefix"]


def topic_prefix(store_id: str, tid: int) -> str:
    """TIER-3: a topic's cold directory under the cold URL."""
    return f"{store_id}/topics/{tid:016x}/"


def data_key(store_id: str, tid: int, first: int) -> str:
    return topic_prefix(store_id, tid) + segfmt.data_name(first)


def idx_key(store_id: str, tid: int, first: int) -> str:
    return topic_prefix(store_id, tid) + segfmt.idx_name(first)


class ColdCache:
    """The cold chunks whose ``.data`` is in memory: at most ``capacity``, least recently
    loaded first out, never one a running read pinned (TIER-8). Used under the owner's lock."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.loaded: OrderedDict[int, ColdChunk] = OrderedDict()  # id(chunk) -> chunk
        self.fetches = 0  # objects fetched (tests, describe)

    def install(self, chunk: ColdChunk, data: bytes | memoryview) -> None:
        if chunk.loaded:
            self.loaded.move_to_end(id(chunk))
            return
        chunk.load(data)
        self.loaded[id(chunk)] = chunk
        for key in list(self.loaded):
            if len(self.loaded) <= self.capacity:
                break
            old = self.loaded[key]
            if not old.pins:
                del self.loaded[key]
                old.unload()

    def forget(self, chunk: ColdChunk) -> None:
        self.loaded.pop(id(chunk), None)


class ColdChunk(SegChunk):
    """A segment of topic ``tid`` in ``store`` (TIER-3 keys), described by ``index``."""

    def __init__(
        self, store: SegmentStore, cache: ColdCache, key: str, index: SegmentIndex
    ) -> None:
        self.store = store
        self.cache = cache
        self.key = key  # its .data object
        self.path = f"{redact(store.url)}/{key}"  # named in Corrupt messages
        self.index = index
        self.data: Any = None
        self._src = None
        self._copy = False
        self.pins = 0
        self.first_seq = index.first_seq
        self.count = index.count
        self.by_run = index.version == segfmt.IDX_VERSION_RUNS
        if index.runs is None:  # a version-1 index: its label runs are in the frames
            self.load(self.fetch())
            self.runs = self._runs_from_frames()
            self.unload()
        else:
            self.runs = index.runs
        self._init_dead()
        self._measure()

    @property
    def loaded(self) -> bool:
        return self.data is not None

    def fetch(self) -> memoryview:
        """The ``.data`` object's bytes, by one ranged read of its whole size (TIER-2: never
        short; TIER-8: mapped from a local directory unless ``mmap=false``). Called without any
        store lock (tiers.py), or by a view of its own."""
        data = self.store.read_view(self.key, 0, self.index.data_size)
        self.cache.fetches += 1
        return data

    def load(self, data: bytes | memoryview) -> None:
        """The fetched bytes become this chunk's ``.data``, checked at once as a hot segment's
        are at open (SEG-1, SEG-3, SEG-17)."""
        self.data = memoryview(data)
        self._src = data
        try:
            self._check_data()
        except Corrupt:
            self.unload()
            raise

    def unload(self) -> None:
        self.data = None
        self._src = None

    def _need(self) -> None:
        """A read under the lock met this chunk unloaded (TIER-8's exception: an op that reads
        payloads on its own): fetch now."""
        if self.data is None:
            self.cache.install(self, self.fetch())

    # -- what needs the .data bytes ------------------------------------------------------
    def record(self, i: int) -> Any:
        self._need()
        return super().record(i)

    def records_into(self, items: list[Any], i0: int, i1: int, limit: int, exclude: Any) -> Any:
        if len(items) < limit:  # a read that is full already takes nothing from here
            self._need()
        return super().records_into(items, i0, i1, limit, exclude)

    def verify_slots(self, i0: int, i1: int) -> list[tuple[int, int, int]]:
        self._need()
        return super().verify_slots(i0, i1)

    def live_from(self, i0: int, exclude: str | None) -> int:
        """Live slots from ``i0`` on whose node is not ``exclude`` (a read's prediction of how
        many records this chunk gives it, tiers.py)."""
        if exclude is None:
            return self.count - i0 - self.dead.count(1, i0)
        runs, n = self.runs, 0
        bounds = [*runs.firsts, self.count]
        for a, b, node in zip(bounds, bounds[1:], runs.nodes, strict=False):
            if b <= i0 or node == exclude:
                continue
            a = max(a, i0)
            n += b - a - self.dead.count(1, a, b)
        return n

    def files(self) -> list[str]:
        """No hot file: its objects are collected with the manifests (TIER-10)."""
        return []

    def close(self) -> None:
        self.cache.forget(self)
        self.unload()
