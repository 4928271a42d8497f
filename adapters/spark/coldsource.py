"""Spark over a cold tier alone: ``cold+URL`` locations (spec/BUNDLES.md SPK-31..SPK-33). No
pyspark here.

The planner pins one manifest version (spec/TIERING.md TIER-9, TIER-11) and plans a topic's
partitions from its cold segments; each partition carries the version, the store id and the
segments (their object keys) covering its seq range, so an executor reads exactly those objects
by ranged reads through the cold tier's filesystem (pyarrow.fs, or a local directory), with no
hot store anywhere. Records come column by column from the fetched segments (fastread, as a hot
sealed segment's), tombstones and everything else through the same ``TopicLog.read`` a store
uses (reading's item path), so a cold read returns what a read of the store did when the
manifest was written.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, NamedTuple

import pyarrow as pa

from tidelog.backends.file.coldread import ColdView, cold_url, open_cold
from tidelog.backends.file.segstore import redact
from tidelog.errors import BadOption

from . import fastread, reading
from .columns import log_batch
from .options import SourceOptions

__all__ = [
    "ColdPlan",
    "is_cold",
    "check_cold",
    "refuse",
    "plan_partitions",
    "read_cold",
]


def is_cold(location: str) -> bool:
    """Whether a store location names a cold tier alone (SPK-31)."""
    return cold_url(location) is not None


@dataclass(frozen=True)
class ColdPlan:
    """What an executor needs to read a partition of a cold tier (SPK-32): the pinned manifest
    version of store ``store_id`` and the first seqs of the segments covering its range (their
    object keys follow from TIER-3)."""

    store_id: str
    version: int
    segments: tuple[int, ...]


def shown(opts: SourceOptions) -> str:
    return redact(opts.root)


def check_cold(opts: SourceOptions) -> None:
    """SPK-31: what a cold tier does not offer is ``bad_option`` at planning time."""
    if not is_cold(opts.root):
        if opts.store_id is not None or opts.manifest is not None:
            raise BadOption(
                "options storeId and manifest pin a cold tier's manifest: they go with a "
                "cold+URL location only (SPK-31)"
            )
        return
    if opts.slot is not None:
        raise BadOption(
            f"option slot={opts.slot}: slot reads of a cold tier ({shown(opts)}) are not "
            "supported; read the log columns (SPK-31)"
        )
    if opts.cold is not None:
        raise BadOption(
            f"option cold: {shown(opts)} is a cold tier already; option cold names the cold "
            "tier of a file:// store (SPK-30, SPK-31)"
        )


def refuse(opts: SourceOptions, what: str) -> None:
    """SPK-31: a cold tier is read-only and sealed: writes and streaming reads are refused."""
    if is_cold(opts.root):
        raise BadOption(
            f"{shown(opts)} is a cold tier, which Spark reads in batch only: {what} is not "
            "supported (SPK-31); stream from the store's file:// path or its service"
        )


# -- the driver (SPK-32) ------------------------------------------------------------------------
def _open(opts: SourceOptions) -> ColdView:
    url = cold_url(opts.root)
    assert url is not None
    return open_cold(url, manifest=opts.manifest, store_id=opts.store_id, cache=_cache(opts))


def _cache(opts: SourceOptions) -> int:
    return opts.cold_cache_segments or 4


class Bounds(NamedTuple):
    lo: int
    hi: int


def seq_bounds(opts: SourceOptions, view: ColdView) -> Bounds:
    """SPK-32: ``fromSeq..toSeq``, by default the pinned manifest's ``evict_floor`` .. the
    topic's last cold seq (the cold tier holds nothing later, TIER-9)."""
    head = view.head(opts.topic)  # no_such_topic when the version has none of it
    lo = view.evict_floor(opts.topic) if opts.from_seq is None else opts.from_seq
    hi = head if opts.to_seq is None else min(opts.to_seq, head)
    return Bounds(lo, hi)


def plan_partitions(opts: SourceOptions) -> list[tuple[int, int, ColdPlan]]:
    """SPK-32: the pinned version's ranges ``(lo, hi, plan)``, cut as SPK-3 cuts a store's
    (evenly, by volume: a scan lasts as long as its longest task, and cold segments are as
    long as the checkpoints that sealed them made them), or ``partitionRecords`` seqs each
    when given; each names the segments overlapping it."""
    with _open(opts) as view:
        lo, hi = seq_bounds(opts, view)
        if lo > hi:
            return []
        segments = view.segments(opts.topic)
        if opts.partition_records:
            ranges = reading.split(lo, hi, opts.partition_records)
        else:
            volume = (hi - lo + 1) * _seq_bytes(view, segments, lo)
            ranges = reading.split_even(lo, hi, reading.task_count(opts, volume))
        out = []
        for a, b in ranges:
            covering = tuple(
                s["first_seq"] for s in segments if s["first_seq"] <= b and s["last_seq"] >= a
            )
            out.append((a, b, ColdPlan(view.store_id, view.version, covering)))
        return out


def _seq_bytes(view: ColdView, segments: list[dict[str, Any]], lo: int) -> float:
    """SPK-32's bytes per seq: the first segment in range's ``.data`` object size over its
    seqs (one size request, not one per segment of a long history)."""
    first = next((s for s in segments if s["last_seq"] >= lo), None)
    if first is None:  # no segment in range: nothing to read but tombstones
        return 1.0
    size = view.store.size(first["data"])
    return max(size / (int(first["last_seq"]) - int(first["first_seq"]) + 1), 1.0)


# -- the executors (SPK-33) ---------------------------------------------------------------------
_views: dict[tuple[str, str, int], ColdView] = {}
_views_lock = threading.Lock()
_VIEWS = 4  # pinned versions a worker process keeps open


def _pinned(opts: SourceOptions, plan: ColdPlan) -> ColdView:
    """This process's view of the plan's version (opened once per worker process: the
    manifest and the ``.idx`` objects of the segments read are kept), checked still to exist
    before every task (TIER-10: ``not_found`` naming the version once it is collected)."""
    key = (opts.root, plan.store_id, plan.version)
    with _views_lock:
        view = _views.get(key)
        if view is None:
            url = cold_url(opts.root)
            assert url is not None
            view = open_cold(url, manifest=plan.version, store_id=plan.store_id,
                             cache=_cache(opts))  # fmt: skip
            while len(_views) >= _VIEWS:  # older pins of a long-lived worker go first
                _views.pop(next(iter(_views))).close()
            _views[key] = view
        else:
            view.check_pinned()
        return view


class _LogTopic:
    """A cold topic's ``TopicLog`` as reading's item path reads a topic (``read``,
    ``state().head_seq``)."""

    def __init__(self, log: Any) -> None:
        self.log = log

    def topic(self, name: str, create: bool = False) -> _LogTopic:
        return self

    def read(self, after: int, limit: int) -> list[Any]:
        return list(self.log.read(after, limit, None))

    def state(self) -> Any:
        return self

    @property
    def head_seq(self) -> int:
        return int(self.log.head)


def read_cold(opts: SourceOptions, lo: int, hi: int, plan: ColdPlan) -> Iterator[pa.RecordBatch]:
    """Seqs ``lo..hi`` of the plan's segments as ``log_schema`` batches (SPK-33): live runs of
    segments column by column (fastread: every record verified, SEG-12), the rest (tombstones,
    ts filters) through ``TopicLog.read``. A missing object is ``io_error`` (TIER-2), a
    collected version ``not_found`` (TIER-10): never fewer rows."""
    view = _pinned(opts, plan)
    log = view.log(opts.topic, plan.segments)
    rows = opts.tombstones == "rows"
    resume = lo
    fast = opts.from_ts is None and opts.to_ts is None and fastread.available()
    if fast and lo >= log.evict_floor and not any(a <= hi and b >= lo for a, b in log.losses):
        runs, resume = fastread.chunk_ranges(log, lo, min(hi, log.head))
        for chunk, i0, i1 in runs:
            yield from fastread.read_chunk(opts.topic, chunk, i0, i1, opts.batch_records, rows)
    if resume <= hi:
        source: Any = _LogTopic(log)
        for items in reading._items(opts, resume, hi, opts.batch_records, store=source):
            yield log_batch(opts.topic, items, rows)
