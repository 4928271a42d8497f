"""The cold-only reader (spec/TIERING.md TIER-11): the sealed history a store relocated, read
with nothing but the cold URL, through one manifest version (TIER-9), tombstones included.

Each topic becomes a ``TopicLog`` of ``ColdChunk``s with the manifest's floor, dead ranges and
loss ranges, so reads follow exactly the store's own rules (TOP-7, TMB, DEL). ``segments`` and
``read_segment`` are what a reader spread over several processes needs (a Spark driver pins a
version and hands each executor segments to read by ranged reads). Nothing is ever written.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from typing import Any

from tidelog.config import TopicConfig
from tidelog.errors import BadArgument, NoSuchTopic
from tidelog.fsio import OsFS
from tidelog.records import Item

from ..common.index import TopicLog
from .coldchunk import ColdCache, ColdChunk, data_key, idx_key
from .manifest import read_manifest, versions
from .segstore import SegmentStore, open_segment_store, redact
from .tiers import cold_chunk

__all__ = ["ColdView", "open_cold", "cold_url", "COLD_PREFIX"]

#: a location ``cold+URL`` names the cold tier at TIER-1's ``URL`` alone (TIER-12)
COLD_PREFIX = "cold+"


def cold_url(location: str) -> str | None:
    """The cold URL of a ``cold+URL`` location (TIER-12), or None for any other location. A
    relative local path is made absolute (``cold+./dir``)."""
    if location[: len(COLD_PREFIX)].lower() != COLD_PREFIX:
        return None
    url = location[len(COLD_PREFIX) :]
    if "://" not in url and not os.path.isabs(url):
        url = os.path.abspath(url)
    return url


class ColdView:
    """One manifest version of one store's cold tier."""

    def __init__(self, store: SegmentStore, store_id: str, version: int, cache: int = 4) -> None:
        self.store = store
        self.store_id = store_id
        self.manifest = read_manifest(store, store_id, version)  # not_found if collected
        self.version = version
        self.cache = ColdCache(cache)
        self._entries = {t["name"]: t for t in self.manifest["topics"]}
        self._logs: dict[str, TopicLog] = {}
        self._chunks: dict[tuple[int, int], ColdChunk] = {}  # (topic id, first seq) -> chunk

    def topics(self) -> list[str]:
        return sorted(self._entries)

    def entry(self, topic: str) -> dict[str, Any]:
        entry = self._entries.get(topic)
        if entry is None:
            raise NoSuchTopic(
                f"topic {topic!r} has no cold segments in manifest {self.version} of "
                f"{redact(self.store.url)} (TIER-11)"
            )
        return entry

    def head(self, topic: str) -> int:
        """The last seq the cold tier holds of ``topic`` (later ones are not in it)."""
        segments = self.entry(topic)["segments"]
        return int(segments[-1][1]) if segments else 0

    def segments(self, topic: str) -> list[dict[str, Any]]:
        """Each cold segment: first and last seq and its two object keys (TIER-3)."""
        entry = self.entry(topic)
        tid = int(entry["id"])
        return [
            {
                "first_seq": int(lo),
                "last_seq": int(hi),
                "data": data_key(self.store_id, tid, int(lo)),
                "idx": idx_key(self.store_id, tid, int(lo)),
            }
            for lo, hi in entry["segments"]
        ]

    def evict_floor(self, topic: str) -> int:
        """The topic's ``evict_floor`` when the manifest was written (TMB-1)."""
        return int(self.entry(topic)["evict_floor"])

    def check_pinned(self) -> None:
        """``not_found`` when this version has been collected since it was opened (TIER-10):
        a reader that goes on pinning it must not trust objects it may no longer name."""
        read_manifest(self.store, self.store_id, self.version)

    def _chunk(self, entry: dict[str, Any], first: int) -> ColdChunk:
        tid = int(entry["id"])
        chunk = self._chunks.get((tid, first))
        if chunk is None:
            chunk = cold_chunk(self.store, self.cache, self.store_id, tid, first)
            for lo, hi in entry["dead"]:
                chunk.mark_dead(int(lo), int(hi))  # clipped to the chunk
            self._chunks[(tid, first)] = chunk
        return chunk

    def log(self, topic: str, firsts: Iterable[int] | None = None) -> TopicLog:
        """The topic as a ``TopicLog`` of its cold segments (only those starting at ``firsts``,
        for a reader of a seq range that knows which segments cover it: the others' ``.idx``
        are never read), with the manifest's floor and loss ranges (TMB)."""
        if firsts is None and topic in self._logs:
            return self._logs[topic]
        entry = self.entry(topic)
        wanted = None if firsts is None else {int(f) for f in firsts}
        log = TopicLog(topic, TopicConfig())
        chunks = [
            self._chunk(entry, int(lo))
            for lo, _ in entry["segments"]
            if wanted is None or int(lo) in wanted
        ]
        for chunk in chunks:
            log.add_chunk(chunk)
        log.head = log.visible = self.head(topic)
        log.base = log.head + 1
        log.evict_floor = int(entry["evict_floor"])
        log.losses = [(int(lo), int(hi)) for lo, hi in entry["losses"]]
        log.count = sum(c.live for c in chunks)  # TOP-3's totals of what it holds
        log.nbytes = sum(c.nbytes for c in chunks)
        if firsts is None:
            self._logs[topic] = log
        return log

    def read(
        self, topic: str, after: int = 0, limit: int = 1000, exclude_node: str | None = None
    ) -> list[Item]:
        """Records and tombstones after ``after``, up to the last cold seq (TOP-7, TMB)."""
        if limit < 1:
            raise BadArgument(f"limit={limit}: must be at least 1")
        return self.log(topic).read(after, limit, exclude_node)

    def read_segment(self, topic: str, first_seq: int) -> list[Item]:
        """The live records of one cold segment (no tombstones: the caller's plan has the
        floors), for a reader that splits the history by segment."""
        log = self.log(topic)
        for c in log.chunks:
            if c.first_seq == first_seq:
                items: list[Item] = []
                c.records_into(items, 0, c.count - 1, c.count, None)  # type: ignore[attr-defined]
                return items
        raise BadArgument(f"topic {topic!r} has no cold segment from seq {first_seq} (TIER-11)")

    def close(self) -> None:
        for c in self._chunks.values():
            c.close()
        self._chunks, self._logs = {}, {}

    def __enter__(self) -> ColdView:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def open_cold(
    url: str,
    *,
    manifest: int | None = None,
    store_id: str | None = None,
    cache: int = 4,
    mmap: bool = True,
) -> ColdView:
    """TIER-11: the newest manifest (or version ``manifest``, pinned) of the store at ``url``
    (``store_id`` when several stores share it). A local directory's ``.data`` objects are
    mapped when read unless ``mmap`` is false (FLT-9: then read into memory)."""
    store = open_segment_store(url, OsFS(mmap=mmap))
    if store_id is None:
        ids = sorted({key.split("/", 1)[0] for key in store.list("") if "/manifest/" in key})
        if len(ids) != 1:
            raise BadArgument(
                f"cold tier {redact(url)} holds manifests of {len(ids)} stores "
                f"({', '.join(ids) or 'none'}): pass store_id= (TIER-11)"
            )
        store_id = ids[0]
    if manifest is None:
        have = versions(store, store_id)
        if not have:
            raise BadArgument(f"cold tier {redact(url)}: store {store_id} has no manifest yet")
        manifest = have[-1]
    return ColdView(store, store_id, manifest, cache)
