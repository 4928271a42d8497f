"""The cold-only reader (spec/TIERING.md TIER-11): the sealed history a store relocated, read
with nothing but the cold URL, through one manifest version (TIER-9), tombstones included.

Each topic becomes a ``TopicLog`` of ``ColdChunk``s with the manifest's floor, dead ranges and
loss ranges, so reads follow exactly the store's own rules (TOP-7, TMB, DEL). ``segments`` and
``read_segment`` are what a reader spread over several processes needs (a Spark driver pins a
version and hands each executor segments to read by ranged reads). Nothing is ever written.
"""

from __future__ import annotations

from typing import Any

from tidelog.config import TopicConfig
from tidelog.errors import BadArgument, NoSuchTopic
from tidelog.fsio import OsFS
from tidelog.records import Item

from ..common.index import TopicLog
from .coldchunk import ColdCache, data_key, idx_key
from .manifest import read_manifest, versions
from .segstore import SegmentStore, open_segment_store, redact
from .tiers import cold_chunk

__all__ = ["ColdView", "open_cold"]


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

    def topics(self) -> list[str]:
        return sorted(self._entries)

    def _entry(self, topic: str) -> dict[str, Any]:
        entry = self._entries.get(topic)
        if entry is None:
            raise NoSuchTopic(
                f"topic {topic!r} has no cold segments in manifest {self.version} of "
                f"{redact(self.store.url)} (TIER-11)"
            )
        return entry

    def head(self, topic: str) -> int:
        """The last seq the cold tier holds of ``topic`` (later ones are not in it)."""
        segments = self._entry(topic)["segments"]
        return int(segments[-1][1]) if segments else 0

    def segments(self, topic: str) -> list[dict[str, Any]]:
        """Each cold segment: first and last seq and its two object keys (TIER-3)."""
        entry = self._entry(topic)
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

    def _log(self, topic: str) -> TopicLog:
        log = self._logs.get(topic)
        if log is not None:
            return log
        entry = self._entry(topic)
        tid = int(entry["id"])
        log = TopicLog(topic, TopicConfig())
        for lo, _ in entry["segments"]:
            log.add_chunk(cold_chunk(self.store, self.cache, self.store_id, tid, int(lo)))
        for lo, hi in entry["dead"]:
            for c in log.chunks:
                c.mark_dead(int(lo), int(hi))  # type: ignore[attr-defined]
        log.head = log.visible = self.head(topic)
        log.base = log.head + 1
        log.evict_floor = int(entry["evict_floor"])
        log.losses = [(int(lo), int(hi)) for lo, hi in entry["losses"]]
        self._logs[topic] = log
        return log

    def read(
        self, topic: str, after: int = 0, limit: int = 1000, exclude_node: str | None = None
    ) -> list[Item]:
        """Records and tombstones after ``after``, up to the last cold seq (TOP-7, TMB)."""
        if limit < 1:
            raise BadArgument(f"limit={limit}: must be at least 1")
        return self._log(topic).read(after, limit, exclude_node)

    def read_segment(self, topic: str, first_seq: int) -> list[Item]:
        """The live records of one cold segment (no tombstones: the caller's plan has the
        floors), for a reader that splits the history by segment."""
        log = self._log(topic)
        for c in log.chunks:
            if c.first_seq == first_seq:
                items: list[Item] = []
                c.records_into(items, 0, c.count - 1, c.count, None)  # type: ignore[attr-defined]
                return items
        raise BadArgument(f"topic {topic!r} has no cold segment from seq {first_seq} (TIER-11)")

    def close(self) -> None:
        for log in self._logs.values():
            for c in log.chunks:
                c.close()  # type: ignore[attr-defined]
        self._logs = {}

    def __enter__(self) -> ColdView:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def open_cold(
    url: str, *, manifest: int | None = None, store_id: str | None = None, cache: int = 4
) -> ColdView:
    """TIER-11: the newest manifest (or version ``manifest``, pinned) of the store at ``url``
    (``store_id`` when several stores share it)."""
    store = open_segment_store(url, OsFS(mmap=False))
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
