"""The cold tier's manifest and the collection of cold objects (spec/TIERING.md TIER-9,
TIER-10).

Every version is a new object ``<store_id>/manifest/manifest-<v:016x>.json`` (a put is atomic
and durable, TIER-2), so a reader that pinned a version reads exactly what it said. The
collection deletes a version ``cold_grace_ms`` after the next one was written, and an object
only once no version left and not the store's state references it: both derived from the
listing, so a restart loses nothing of it.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

from tidelog.errors import Corrupt, NotFound

from .coldchunk import data_key, idx_key
from .segstore import SegmentStore, redact

if TYPE_CHECKING:
    from ..common.engine import EngineTopic

__all__ = ["Manifests", "manifest_body", "read_manifest", "versions", "FORMAT"]

FORMAT = 1
_NAME = re.compile(r"manifest-([0-9a-f]{16})\.json")


def manifest_key(store_id: str, v: int) -> str:
    return f"{store_id}/manifest/manifest-{v:016x}.json"


def versions(store: SegmentStore, store_id: str) -> list[int]:
    """The manifest versions present, ascending."""
    out = []
    for key in store.list(f"{store_id}/manifest/"):
        m = _NAME.fullmatch(key.rsplit("/", 1)[-1])
        if m:
            out.append(int(m.group(1), 16))
    return sorted(out)


def read_manifest(store: SegmentStore, store_id: str, v: int) -> dict[str, Any]:
    """Version ``v``: ``not_found`` when it is gone (collected, TIER-10), ``corrupt`` when it
    is not a manifest."""
    key = manifest_key(store_id, v)
    if not store.exists(key):
        raise NotFound(
            f"cold tier {redact(store.url)}: manifest version {v} of store {store_id} is gone "
            "(collected after its grace period, TIER-10)"
        )
    raw = store.read_range(key, 0, store.size(key))
    try:
        body = json.loads(raw)
    except ValueError:
        body = None
    if not isinstance(body, dict) or body.get("format") != FORMAT or body.get("manifest") != v:
        raise Corrupt(f"{redact(store.url)}/{key}: not a version {FORMAT} manifest (TIER-9)")
    return body


def manifest_body(topics: Iterable[tuple[EngineTopic, list[int]]]) -> list[dict[str, Any]]:
    """TIER-9's ``topics``: each topic with cold segments, from its state under the lock."""
    out = []
    for t, firsts in topics:
        if not firsts:
            continue
        cold = set(firsts)
        chunks = [c for c in t.log.chunks if c.first_seq in cold]
        dead: list[list[int]] = []
        for c in chunks:
            dead += c.dead_ranges()  # type: ignore[attr-defined]
        log = t.log
        out.append(
            {
                "name": t.name,
                "id": t.tid,
                "incarnation": t.tid,
                "segments": [[c.first_seq, c.first_seq + c.count - 1] for c in chunks],
                "evict_floor": log.evict_floor,
                "dead": dead,
                "losses": [[lo, hi] for lo, hi in log.losses],
            }
        )
    return out


def _dumps(obj: Any) -> bytes:
    return json.dumps(obj, separators=(",", ":"), sort_keys=True, ensure_ascii=False).encode()


class Manifests:
    """The writer's side: the newest version and what it said, and the collection."""

    def __init__(self, store: SegmentStore, store_id: str, grace_ms: int) -> None:
        self.store = store
        self.store_id = store_id
        self.grace_ms = grace_ms
        have = versions(store, store_id)
        self.newest = have[-1] if have else 0
        self.topics: list[dict[str, Any]] | None = None
        if have:
            self.topics = read_manifest(store, store_id, self.newest)["topics"]
        self._written: dict[int, int] = {}  # version -> written_ms (read once)
        self._refs: dict[int, set[str]] = {}  # version -> the object keys it names

    def write(self, topics: list[dict[str, Any]], now_ms: int) -> bool:
        """Version ``newest + 1`` if ``topics`` differs from the newest; whether it wrote."""
        if topics == self.topics or (not topics and self.topics is None):
            return False
        v = self.newest + 1
        body = {
            "format": FORMAT,
            "manifest": v,
            "store_id": self.store_id,
            "written_ms": now_ms,
            "topics": topics,
        }
        self.store.put(manifest_key(self.store_id, v), _dumps(body))
        self.newest, self.topics = v, topics
        self._written[v] = now_ms
        self._refs[v] = _keys(self.store_id, topics)
        return True

    def collect(self, state_keys: set[str], now_ms: int) -> list[str]:
        """TIER-10: delete the versions whose grace is over and the objects nothing left
        references; returns the keys deleted."""
        store, sid = self.store, self.store_id
        have = versions(store, sid)
        gone: list[str] = []
        kept: list[int] = []
        for i, v in enumerate(have):
            nxt = have[i + 1] if i + 1 < len(have) else None
            if nxt is not None and now_ms >= self._written_ms(nxt) + self.grace_ms:
                key = manifest_key(sid, v)
                store.delete(key)
                self._refs.pop(v, None)
                gone.append(key)
            else:
                kept.append(v)
        referenced = set(state_keys)
        for v in kept:
            referenced |= self._refs_of(v)
        for key in store.list(f"{sid}/topics/"):
            if key not in referenced:
                store.delete(key)
                gone.append(key)
        return gone

    def _written_ms(self, v: int) -> int:
        if v not in self._written:
            self._written[v] = int(read_manifest(self.store, self.store_id, v)["written_ms"])
        return self._written[v]

    def _refs_of(self, v: int) -> set[str]:
        if v not in self._refs:
            body = read_manifest(self.store, self.store_id, v)
            self._written[v] = int(body["written_ms"])
            self._refs[v] = _keys(self.store_id, body["topics"])
        return self._refs[v]


def _keys(store_id: str, topics: list[dict[str, Any]]) -> set[str]:
    out = set()
    for topic in topics:
        tid = int(topic["id"])
        for first, _ in topic["segments"]:
            out.add(data_key(store_id, tid, int(first)))
            out.add(idx_key(store_id, tid, int(first)))
    return out


def state_keys(store_id: str, cold: Mapping[int, Iterable[int]]) -> set[str]:
    """The objects the store's state names cold (never collected)."""
    out = set()
    for tid, firsts in cold.items():
        for first in firsts:
            out.add(data_key(store_id, tid, first))
            out.add(idx_key(store_id, tid, first))
    return out
