"""``tidelog verify`` of a cold tier (spec/TIERING.md TIER-14): every cold segment object checked
as a hot segment is (SEG-1..SEG-17, the same code over the object's bytes), every object a
manifest version or the store's state names present and holding the seq range the manifest
says, and objects nothing names reported as orphans (information, not damage).

Findings are located: ``<cold URL, redacted>/<key>`` and a byte offset where one applies.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from tidelog.errors import TidelogError
from tidelog.fsio import OsFS
from tidelog.report import INFO

from .coldchunk import data_key, idx_key
from .manifest import manifest_key, read_manifest, versions
from .segstore import SegmentStore, open_segment_store, redact

if TYPE_CHECKING:
    from .verify import _Ctx

__all__ = ["CheckBytes", "check_cold_tier"]

#: verify's check of one segment's bytes (its ``check_segment_bytes``), handed in by the caller so
#: this module never imports verify (which imports this one)
CheckBytes = Callable[["_Ctx", str, str, bytes, bytes, int, int], "int | None"]

#: (topic id, first seq) -> who names the segment: (manifest version or None for the
#: store's state, the last seq that namer says)
_Namers = dict[tuple[int, int], list[tuple[int | None, int | None]]]


def check_cold_tier(
    ctx: _Ctx, url: str, store_id: str | None, state: dict[int, set[int]], check: CheckBytes
) -> None:
    """TIER-14 over the stores under ``url`` (only ``store_id`` when given, whose state names
    the segments ``state`` holds cold)."""
    shown = redact(url)
    try:
        store = open_segment_store(url, OsFS(mmap=False))
        keys = store.list("")
    except TidelogError as exc:
        ctx.error(shown, None, "TIER-1", exc.message)
        return
    ids = sorted({key.split("/", 1)[0] for key in keys})
    if store_id is not None:
        ids = [store_id]
    for sid in ids:
        mine = [key for key in keys if key.startswith(f"{sid}/")]
        _check_store(ctx, store, sid, mine, state if sid == store_id else {}, check)


def _check_store(
    ctx: _Ctx,
    store: SegmentStore,
    sid: str,
    keys: list[str],
    state: dict[int, set[int]],
    check: CheckBytes,
) -> None:
    shown = redact(store.url)
    present = set(keys)
    namers: _Namers = {}
    for v in versions(store, sid):
        key = manifest_key(sid, v)
        try:
            body = read_manifest(store, sid, v)
        except TidelogError as exc:
            ctx.error(f"{shown}/{key}", None, "TIER-9", exc.message)
            continue
        ctx.report.files_checked += 1
        if body.get("store_id") != sid:
            ctx.error(f"{shown}/{key}", None, "TIER-9", f"store_id {body.get('store_id')!r} "
                      f"under store {sid}")  # fmt: skip
        for topic in body.get("topics", []):
            for lo, hi in topic.get("segments", []):
                namers.setdefault((int(topic["id"]), int(lo)), []).append((v, int(hi)))
    if not namers and not state and any("/topics/" in key for key in keys):
        ctx.warn(f"{shown}/{sid}/manifest/", None, "TIER-9", "no manifest: a cold-only reader "
                 "cannot read this store's segments")  # fmt: skip
    for tid, firsts in state.items():
        for first in firsts:
            namers.setdefault((tid, first), []).append((None, None))
    named: set[str] = set()
    for (tid, first), who in sorted(namers.items()):
        pair = (data_key(sid, tid, first), idx_key(sid, tid, first))
        named.update(pair)
        _check_segment(ctx, store, present, tid, first, pair, who, check)
    for key in keys:
        if key.startswith(f"{sid}/topics/") and key not in named:
            why = "orphan: no manifest version and not the store's state names it; the collection"
            ctx.add(INFO, f"{shown}/{key}", None, "TIER-10", f"{why} deletes it (not damage)")


def _who(who: list[tuple[int | None, int | None]]) -> str:
    versions_ = [str(v) for v, _ in who if v is not None]
    out = [f"manifest version(s) {', '.join(versions_)}"] if versions_ else []
    if any(v is None for v, _ in who):
        out.append("the store's state (cold)")
    return " and ".join(out)


def _check_segment(
    ctx: _Ctx,
    store: SegmentStore,
    present: set[str],
    tid: int,
    first: int,
    pair: tuple[str, str],
    who: list[tuple[int | None, int | None]],
    check: CheckBytes,
) -> None:
    shown = redact(store.url)
    missing = [key for key in pair if key not in present]
    for key in missing:
        ctx.error(f"{shown}/{key}", None, "TIER-10", f"missing: named by {_who(who)}; a reader "
                  "of it fails (never fewer rows), but the records are gone")  # fmt: skip
    if missing:
        return
    data_path, idx_path = (f"{shown}/{key}" for key in pair)
    got: list[bytes] = []
    for key in pair:
        try:
            got.append(store.read_range(key, 0, store.size(key)))
        except TidelogError as exc:
            ctx.error(f"{shown}/{key}", None, "TIER-2", exc.message)
            return
    ctx.report.files_checked += 2
    last: int | None = None
    with ctx.guard(data_path, "SEG-1"):
        last = check(ctx, data_path, idx_path, got[0], got[1], tid, first)
    for v, hi in who:
        if v is not None and last is not None and hi != last:
            ctx.error(data_path, None, "TIER-9", f"manifest version {v} says seqs {first}..{hi}, "
                      f"the segment holds {first}..{last}")  # fmt: skip
