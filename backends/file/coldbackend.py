"""``tidelog.open("cold+URL")``: a read-only store over a cold tier alone (spec/TIERING.md
TIER-12).

A thin ``Backend`` over the cold-only reader (coldread.py, TIER-11): one manifest version, its
topics, reads with their tombstones, states; every write is ``read_only`` and every other op
``not_available`` (its capabilities say none, CAP-1). ``refresh()`` moves to the newest version
unless one was pinned.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence
from typing import Any
from urllib.parse import urlencode

from tidelog.backend import Backend, Capabilities, TopicRef
from tidelog.clock import Clock
from tidelog.config import TopicConfig
from tidelog.errors import BadOption, NoSuchTopic, ReadOnly
from tidelog.options import parse_int
from tidelog.records import Item, TopicState
from tidelog.uri import URI

from .coldread import COLD_PREFIX, ColdView, open_cold
from .segstore import redact

__all__ = ["ColdBackend", "open_backend", "CAPABILITIES", "inner_url"]

#: nothing but reads: the api refuses deletes, subscribers, queues and routers (CAP-1)
CAPABILITIES = Capabilities(
    persistent=True,
    crash_safe=True,
    deletes=False,
    subscribers=False,
    queue=False,
    routers=False,
    durability=frozenset({"fsync"}),
)
#: tidelog's own options of a cold+URL store; any other query key belongs to the cold URL
OWN_OPTIONS = ("manifest", "store_id", "cold_cache_segments", "readonly")


def inner_url(uri: URI) -> str:
    """TIER-1's cold URL inside a ``cold+URL`` store URI, with the URI's query minus tidelog's
    own options (TIER-12)."""
    scheme = uri.scheme[len(COLD_PREFIX) :]
    query = {k: v for k, v in uri.options.items() if k not in OWN_OPTIONS}
    tail = f"?{urlencode(query)}" if query else ""
    if scheme == "file" and not query:
        return f"file://{uri.location}"
    return f"{scheme}://{uri.location}{tail}"


class ColdBackend(Backend):
    capabilities = CAPABILITIES

    def __init__(self, url: str, manifest: int | None, store_id: str | None, cache: int) -> None:
        self.url = url
        self.pinned = manifest
        self.cache = cache
        self.lock = threading.Lock()
        self.view: ColdView = open_cold(url, manifest=manifest, store_id=store_id, cache=cache)
        self.closed = False

    def _refused(self, what: str) -> ReadOnly:
        return ReadOnly(
            f"cold tier {redact(self.url)} is read-only: {what} (TIER-12; write to the store "
            "that relocated to it)"
        )

    # -- store -------------------------------------------------------------------------------
    def open_topic(self, name: str, options: Mapping[str, object], create: bool) -> TopicRef:
        with self.lock:
            if name not in self.view.topics():
                if create:
                    raise self._refused(f"cannot create topic {name!r}")
                raise NoSuchTopic(
                    f"topic {name!r} has no cold segments in manifest {self.view.version} of "
                    f"{redact(self.url)} (TIER-12)"
                )
            return TopicRef(name, int(self.view.entry(name)["incarnation"]))

    def topic_config(self, ref: TopicRef) -> TopicConfig:
        return TopicConfig()

    def list_topics(self) -> list[str]:
        with self.lock:
            return self.view.topics()

    def drop_topic(self, name: str) -> None:
        raise self._refused(f"cannot drop topic {name!r}")

    def flush(self) -> None:
        pass

    def close(self) -> None:
        with self.lock:
            if not self.closed:
                self.closed = True
                self.view.close()

    def refresh(self) -> None:
        """The newest manifest version, unless one was pinned (TIER-12)."""
        if self.pinned is not None:
            return
        with self.lock:
            newest = open_cold(self.url, store_id=self.view.store_id, cache=self.cache)
            if newest.version == self.view.version:
                newest.close()
                return
            self.view.close()
            self.view = newest

    def describe(self) -> dict[str, object]:
        return {
            "cold": redact(self.url),
            "store_id": self.view.store_id,
            "manifest": self.view.version,
            "written_ms": self.view.manifest["written_ms"],
        }

    # -- topic log ---------------------------------------------------------------------------
    def append(
        self,
        ref: TopicRef,
        payloads: Sequence[bytes],
        tag: str | None,
        node: str | None,
        producer: tuple[str, int] | None = None,
    ) -> list[int]:
        raise self._refused(f"cannot append to topic {ref.name!r}")

    def append_records(
        self,
        ref: TopicRef,
        records: Sequence[tuple[bytes, str | None, str | None]],
        producer: tuple[str, int] | None = None,
    ) -> list[int]:
        raise self._refused(f"cannot append to topic {ref.name!r}")

    def read(self, ref: TopicRef, after: int, limit: int, exclude_node: str | None) -> list[Item]:
        with self.lock:
            return self.view.read(ref.name, after, limit, exclude_node)

    def state(self, ref: TopicRef) -> TopicState:
        with self.lock:
            log = self.view.log(ref.name)
            return TopicState(log.head, log.earliest, log.evict_floor, log.count, log.nbytes)


def open_backend(uri: URI, options: dict[str, Any], clock: Clock) -> ColdBackend:
    """The factory of ``cold+<scheme>`` (TIER-12): options ``manifest`` (pin a version),
    ``store_id``, ``cold_cache_segments``; ``readonly`` may only be true."""
    unknown = sorted(k for k in options if k not in OWN_OPTIONS and k not in uri.options)
    if unknown:
        raise BadOption(
            f"unknown option(s) {', '.join(unknown)} of a cold+ store; known: "
            f"{', '.join(OWN_OPTIONS)} (the URL's own query keys go to the cold tier, TIER-12)"
        )
    readonly = str(options.get("readonly", "true")).lower()
    if readonly not in ("true", "1", "yes"):
        raise BadOption(f"readonly={options['readonly']!r}: a cold+ store is read-only (TIER-12)")
    manifest = options.get("manifest")
    store_id = options.get("store_id")
    cache = options.get("cold_cache_segments", 4)
    return ColdBackend(
        inner_url(uri),
        None if manifest is None else parse_int("manifest", manifest, minimum=1),
        None if store_id is None else str(store_id).lower(),
        parse_int("cold_cache_segments", cache, minimum=1, maximum=1024),
    )
