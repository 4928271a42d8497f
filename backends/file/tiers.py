"""The hot and cold tiers of a ``file://`` store (spec/TIERING.md).

``Tiers`` belongs to one ``FileBackend`` with a ``cold`` option. It opens each segment a
snapshot names from the tier that holds it (TIER-6: hot preferred), keeps which segments are
cold (the TIER frames and the snapshot's ``"cold"``), fetches cold bytes for reads outside the
store lock (TIER-8), and runs relocation (relocate.py) and the manifest (manifest.py) from the
maintenance thread.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, TypeVar

from tidelog.errors import Corrupt
from tidelog.fsio import FS

from .chunk import SegChunk
from .coldchunk import ColdCache, ColdChunk, data_key, idx_key
from .format import segment as segfmt
from .progressfiles import topic_dir
from .replay import open_chunk
from .segstore import SegmentStore, redact

if TYPE_CHECKING:
    from ..common.engine import EngineTopic
    from ..common.index import TopicLog
    from .qchunk import QsegChunk

__all__ = ["Tiers", "cold_chunk", "hot_pair"]

R = TypeVar("R")
#: a read that finds new cold segments to fetch after each fetch gives up prefetching after
#: this many rounds (it then fetches what is left under the lock: slower, still correct)
_ROUNDS = 8


def hot_pair(fs: FS, root: str, tid: int, first: int) -> tuple[str, str]:
    directory = topic_dir(root, tid)
    return (
        os.path.join(directory, segfmt.data_name(first)),
        os.path.join(directory, segfmt.idx_name(first)),
    )


def cold_chunk(
    store: SegmentStore, cache: ColdCache, store_id: str, tid: int, first: int
) -> ColdChunk:
    """A cold segment from its ``.idx`` object (one ranged read), checked as at open (SEG-4,
    SEG-6)."""
    key = idx_key(store_id, tid, first)
    raw = store.read_range(key, 0, store.size(key))
    try:
        index = segfmt.read_index(raw, topic_id=tid, first_seq=first)
    except Corrupt as exc:
        raise Corrupt(f"{redact(store.url)}/{key}: {exc.message}") from None
    return ColdChunk(store, cache, data_key(store_id, tid, first), index)


class Tiers:
    def __init__(self, fs: FS, root: str, store: SegmentStore, options: Any) -> None:
        self.fs = fs
        self.root = root
        self.store = store
        self.options = options  # FileOptions: the retention bounds, the grace, the cache
        self.cache = ColdCache(options.cold_cache_segments)
        self.cold: dict[int, set[int]] = {}  # tid -> first seqs flipped cold (TIER-5)
        self.store_id = ""  # hex; set once the snapshot is read
        self.manifest: Any = None  # manifest.Manifests, once the store id is known

    # -- opening (TIER-6) -------------------------------------------------------------------
    def open_chunk(self, tid: int, first: int) -> SegChunk | QsegChunk:
        """Hot when both hot files (or the ``.qseg``) exist, else cold when both objects do,
        else what the hot tier says (its ``Corrupt`` names the missing file)."""
        data, idx = hot_pair(self.fs, self.root, tid, first)
        hot = self.fs.exists(data) and self.fs.exists(idx)
        sid = self.store_id
        if (
            not hot
            and self.store.exists(idx_key(sid, tid, first))
            and self.store.exists(data_key(sid, tid, first))
        ):
            self.cold.setdefault(tid, set()).add(first)  # only a flip deletes hot files
            return cold_chunk(self.store, self.cache, sid, tid, first)
        return open_chunk(self.fs, self.root, tid, first)

    def mark_cold(self, tid: int, firsts: Any) -> None:
        """A TIER frame or a snapshot's ``"cold"``: these segments were flipped."""
        self.cold.setdefault(tid, set()).update(int(f) for f in firsts)

    def cold_of(self, t: EngineTopic) -> list[int]:
        """The flipped segments still attached to ``t``, ascending (the snapshot's ``"cold"``:
        a detached one has left, TIER-7)."""
        flipped = self.cold.get(t.tid)
        if not flipped:
            return []
        attached = {c.first_seq for c in t.log.chunks}
        flipped &= attached  # prune: its objects are the collection's now
        return sorted(flipped)

    def prune(self, live: Any) -> None:
        """Forget the cold sets of topics no longer live (dropped: TIER-7)."""
        for tid in [tid for tid in self.cold if tid not in live]:
            del self.cold[tid]

    # -- reads (TIER-8) -----------------------------------------------------------------------
    def around(
        self,
        lock: Any,
        predict: Callable[[], list[ColdChunk]],
        run: Callable[[], R],
    ) -> R:
        """Run ``run`` (an op that takes the lock itself) once the cold chunks ``predict``
        (called under ``lock``) says it will read are loaded: they are fetched with the lock
        released, installed and pinned under it, and unpinned when ``run`` is done."""
        pinned: list[ColdChunk] = []
        try:
            for _ in range(_ROUNDS):
                with lock:
                    need = [c for c in predict() if not c.loaded]
                    for c in need:
                        c.pins += 1
                        pinned.append(c)
                if not need:
                    break
                fetched = [(c, c.fetch()) for c in need]  # no lock held: TIER-8
                with lock:
                    for c, data in fetched:
                        self.cache.install(c, data)
            return run()
        finally:
            if pinned:
                with lock:
                    for c in pinned:
                        c.pins -= 1

    @staticmethod
    def cold_ahead(log: TopicLog, after: int, limit: int, exclude: str | None) -> list[ColdChunk]:
        """Under the lock: the unloaded cold chunks a read of ``limit`` records after ``after``
        reaches, counting the live records of every chunk on the way."""
        out: list[ColdChunk] = []
        want = limit
        for c, i0 in _chunks_from(log, after + 1):
            if want <= 0:
                break
            if isinstance(c, ColdChunk):
                n = c.live_from(i0, exclude)
                if n and not c.loaded:
                    out.append(c)
                want -= n
            else:
                want -= getattr(c, "live", 0)
        return out


def _chunks_from(log: TopicLog, seq: int) -> Iterator[tuple[Any, int]]:
    """(chunk, first slot at or after ``seq``) of the sealed chunks from ``seq`` on."""
    for c in log.chunks:
        end = c.first_seq + c.count
        if end <= seq:
            continue
        yield c, max(seq - c.first_seq, 0)
