"""Repair of a damaged ring (spec/FORMATS-blockdev.md BDEV-24..BDEV-27): the way out of the
refusal that recovery keeps as its default (BDEV-22, FLT-2).

Recovery refuses a ring whose bytes prove damage; ``repair_ring`` replaces each damaged page by
a LOSS page (BDEV-25): a valid page of the same ring position that holds no entries and names the
seqs the damaged page held, so readers get a tombstone for exactly those and no seq is handed
out again. Every page that reads back intact stays where it is, untouched. A damaged newest slot
is written anew from the older one (BDEV-26). Before anything on the device is overwritten, its
bytes are copied into a quarantine file (BDEV-24), and the repaired ring is first checked in
memory with recovery's own checks (``damage.examine``): repair writes only what makes the ring
open, and refuses (``corrupt``, BDEV-27) where nothing bounds the lost seqs.

Why LOSS pages rather than the ring's involuntary eviction (the floor, BDEV-16): the floor is a
prefix, so a damaged page in the middle would take every intact record older than it along;
a LOSS page keeps them and tombstones only the damaged page's seqs. And it lives where the damage
was: the writer overwrites it in ring order like any page, so nothing else has to remember it.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import posixpath
import struct
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from tidelog.errors import Corrupt, StorageError
from tidelog.fsio import FS, storage_error, write_whole
from tidelog.model.ring import page_seq

from ..common.progress import SubState, add_gap, offline_live_between
from .damage import Examined, body_problem, examine, read_slots
from .device import Geometry, attach
from .format import (
    META_BYTES,
    PAGE_LOSS,
    SLOT_BYTES,
    FormatCorrupt,
    PageHeader,
    Slot,
    checksum,
    decode_entries,
    decode_slot,
    decode_trailer,
    encode_loss_page,
    encode_slot,
    page_capacity,
    slot_index,
    unchecked_slot_ring_id,
)
from .meta import gap_json, gaps_of
from .ring import page_reader

__all__ = ["RingRepairReport", "repair_ring", "read_quarantine", "QUARANTINE_MAGIC"]

QUARANTINE_MAGIC = b"TDLQUAR1"
_RECORD = struct.Struct("<QII")  # offset, length, crc32c of the bytes (BDEV-24)
_MIN_RECORD = 3  # flags, ts delta, payload length: the smallest record entry (BDEV-8)


@dataclass
class RingRepairReport:
    path: str
    actions: list[str] = field(default_factory=list)  # what was (or, dry run, would be) done
    quarantine: str | None = None  # the file holding the overwritten bytes
    losses: list[tuple[int, int]] = field(default_factory=list)  # seqs now behind a tombstone

    @property
    def changed(self) -> bool:
        return bool(self.actions)


@dataclass
class _Plan:
    pages: dict[int, bytes] = field(default_factory=dict)  # page index -> its LOSS page
    slot: tuple[int, bytes] | None = None  # (slot index, the slot written there)
    actions: list[str] = field(default_factory=list)
    losses: list[tuple[int, int]] = field(default_factory=list)


def repair_ring(
    fs: FS, path: str, *, dry_run: bool = False, quarantine_dir: str | None = None
) -> RingRepairReport:
    """Repair the ring at ``path`` (BDEV-24): takes its lock, so no store may hold it. The
    quarantine file goes to ``quarantine_dir``, by default the image's directory (for a raw
    device: the current directory)."""
    if not fs.exists(path):
        err = StorageError(f"no ring image or device at {path}: it does not exist")
        err.errno = errno.ENOENT
        raise err
    try:
        dev = attach(fs, path, size=None, direct="off")
    except StorageError:
        raise
    except OSError as exc:
        raise storage_error(exc, f"opening {path}") from None
    handle = dev.handle

    def pread(size: int, offset: int) -> bytes:
        try:
            return handle.pread(size, offset)
        except OSError as exc:
            raise storage_error(exc, f"reading {path} at offset {offset}") from None

    def write(data: bytes, offset: int) -> None:
        try:
            handle.pwrite(data, offset)
            handle.fdatasync()
        except OSError as exc:
            raise storage_error(exc, f"writing {path} at offset {offset}") from None

    try:
        try:
            device_bytes = handle.size()
        except OSError as exc:
            raise storage_error(exc, f"reading the size of {path}") from None
        plan, geom = _plan(path, device_bytes, pread)
        report = RingRepairReport(path, plan.actions, None, plan.losses)
        if dry_run or (not plan.pages and plan.slot is None):
            return report
        # the slot first (subscribers' gaps before any lost seq reads as a loss), then the
        # pages newest first: a crash part-way leaves a ring that recovery still refuses and a
        # second run repairs the same way
        writes = [(geom.offset(i), plan.pages[i]) for i in sorted(plan.pages, reverse=True)]
        if plan.slot is not None:
            writes.insert(0, (plan.slot[0] * SLOT_BYTES, plan.slot[1]))
        saved = sorted((offset, pread(len(data), offset)) for offset, data in writes)
        where = quarantine_dir or (posixpath.dirname(path) if dev.kind == "image" else os.getcwd())
        report.quarantine = _write_quarantine(fs, path, where, saved)
        for offset, data in writes:
            write(data, offset)
        return report
    finally:
        with contextlib.suppress(OSError):  # every write above was synced: nothing to lose
            handle.close()


# -- planning ------------------------------------------------------------------------------------
def _plan(
    path: str, device_bytes: int, pread: Callable[[int, int], bytes]
) -> tuple[_Plan, Geometry]:
    """What to write, checked in memory with recovery's checks (BDEV-24: afterwards the ring
    opens and verify finds no error), or ``Corrupt`` (BDEV-27)."""
    block = pread(META_BYTES, 0) if device_bytes >= META_BYTES else b""
    found, bad = read_slots(block.ljust(META_BYTES, b"\0"))
    usable = [s for s in found if body_problem(s.body) is None]
    if not usable:
        raise Corrupt(
            f"{path}: no usable metadata slot: the ring id and the topic's config exist nowhere "
            "else, so repair cannot rebuild the ring (BDEV-27); reformat it (format=true)"
        )
    slot = max(usable, key=lambda s: s.generation)
    geom = Geometry(slot.page_size, slot.page_count)
    if device_bytes < geom.ring_bytes:
        raise Corrupt(
            f"{path}: {device_bytes} bytes, but its ring needs {geom.ring_bytes} (truncated image "
            "or wrong device): repair cannot rebuild the missing pages (BDEV-12, BDEV-27)"
        )
    read_page = page_reader(pread, geom)
    if not examine(path, geom, slot, read_page).errors:
        return _Plan(), geom  # the ring opens: nothing to repair
    _other_ring(path, geom, slot, block, bad, read_page)
    survey = _survey(path, geom, slot, read_page)
    for extra in (0, 1):
        plan = _plan_pages(path, geom, slot, survey, extra)
        _plan_slot(path, geom, slot, found, survey, plan)
        check = _check(path, geom, slot, plan, read_page)
        errors = check.errors
        if not errors:
            return plan, geom
        # a slot without a position (BDEV-4) proves its durable head only: one more page
        if extra == 0 and "next" not in slot.body and errors[0].rule == "BDEV-14":
            continue
        break
    p = errors[0]
    where = "" if p.offset is None else f" at byte offset {p.offset}"
    raise Corrupt(
        f"{path}{where}: {p.message} ({p.rule}); repair cannot make this ring consistent (BDEV-27)"
    )


def _survey(
    path: str, geom: Geometry, slot: Slot, read_page: Callable[[int], bytes]
) -> dict[int, tuple[PageHeader, bool]]:
    """Every page that validates (BDEV-7): its trailer, and whether its entries parse."""
    out: dict[int, tuple[PageHeader, bool]] = {}
    n = geom.page_count
    for i in range(n):
        raw = read_page(i)
        h = decode_trailer(raw, slot.ring_id)
        if h is None:
            continue
        if h.page_seq != page_seq(h.lap, i, n):
            raise Corrupt(
                f"{path} at byte offset {geom.offset(i)}: page {i} is numbered {h.page_seq}, "
                f"not the number of lap {h.lap} (RING-1): its checksum matches, so it was "
                "written so; repair cannot place it (BDEV-27)"
            )
        try:
            decode_entries(raw, h)
        except FormatCorrupt:
            out[i] = (h, False)
        else:
            out[i] = (h, True)
    return out


def _frontier(geom: Geometry, slot: Slot, survey: dict[int, tuple[PageHeader, bool]]) -> int:
    """The first ring position (lap * N + index) that nothing proves written (BDEV-22): one
    past the newest valid page, the slot's position (BDEV-4 ``lap``, ``next``) and the pages
    the slot counts since format (``num_pages``)."""
    n = geom.page_count
    newest = max((h.lap * n + i for i, (h, _) in survey.items()), default=-1)
    body = slot.body
    at = int(body["lap"]) * n + int(body["next"]) if "next" in body else 0
    return max(newest + 1, at, slot.num_pages)


def _plan_pages(
    path: str,
    geom: Geometry,
    slot: Slot,
    survey: dict[int, tuple[PageHeader, bool]],
    extra: int,
) -> _Plan:
    """BDEV-25: the ring positions below the frontier ``w`` back to ``w − N + 1`` were written
    (position ``w − N``, where the next write goes, may be torn: recovery handles it); every
    one of them that does not hold its page intact gets a LOSS page."""
    n = geom.page_count
    w = _frontier(geom, slot, survey) + extra
    known: dict[int, PageHeader] = {}  # position -> a trailer that validates there
    damaged: dict[int, str] = {}  # position -> why
    for i in range(n):
        pos = w - 1 - (w - 1 - i) % n
        if pos < 0:
            continue  # never written
        got = survey.get(i)
        if got is None:
            if pos > w - n:
                damaged[pos] = "does not validate, but a later write proves it was written"
            continue
        h, readable = got
        if h.lap * n + i != pos:
            damaged[pos] = (
                f"holds a page of lap {h.lap}, but lap {pos // n} was written there (a write "
                "that never reached the device)"
            )
        elif not readable:
            known[pos] = h
            damaged[pos] = "its checksum matches, but its entries do not parse (BDEV-8)"
        else:
            known[pos] = h
    plan = _Plan()
    maxrec = page_capacity(geom.page_size) // _MIN_RECORD
    durable = int((slot.body.get("state") or {}).get("head", 0))
    for run in _runs(sorted(damaged), known):
        a, b = run[0], run[-1]
        prev = known.get(a - 1)
        prev_end = 0 if a == 0 else (prev.last_seq if prev is not None else None)
        nxt = known.get(b + 1)
        exact = known.get(a)
        if exact is not None:  # its trailer validates: its seqs are known
            lo, hi = exact.first_seq, exact.last_seq
        elif prev_end is not None and nxt is not None:
            lo, hi = prev_end + 1, nxt.first_seq - 1
        elif prev_end is not None:  # the newest pages: as many seqs as they could hold
            lo, hi = prev_end + 1, max(prev_end + len(run) * maxrec, durable)
        elif nxt is not None:  # the oldest pages: what lies below goes below the floor
            lo, hi = nxt.first_seq, nxt.first_seq - 1
        else:
            raise Corrupt(
                f"{path} at byte offset {geom.offset(a % n)}: pages {a % n}..{b % n} are "
                "damaged and no readable page before or after them bounds the seqs they held "
                "(BDEV-27)"
            )
        _loss_pages(path, geom, slot, run, (lo, hi), exact or prev, plan)
        what = "; ".join(f"page {p % n} (offset {geom.offset(p % n)}) {damaged[p]}" for p in run)
        lost = f"seqs {lo}..{hi} lost (readers get a tombstone)" if lo <= hi else "no seq lost"
        plan.actions.append(f"{what}: replaced by a LOSS page; {lost} (BDEV-25)")
        if lo <= hi:
            plan.losses.append((lo, hi))
    return plan


def _runs(positions: list[int], known: dict[int, PageHeader]) -> list[list[int]]:
    """Runs of consecutive damaged positions; a damaged page whose trailer validates (its seqs
    are known) is a run of its own."""
    out: list[list[int]] = []
    for p in positions:
        if out and out[-1][-1] + 1 == p and p not in known and out[-1][-1] not in known:
            out[-1].append(p)
        else:
            out.append([p])
    return out


def _loss_pages(
    path: str,
    geom: Geometry,
    slot: Slot,
    run: list[int],
    seqs: tuple[int, int],
    basis: PageHeader | None,
    plan: _Plan,
) -> None:
    """LOSS pages for the positions of ``run``: the first names every lost seq, the others none
    (so the writer's overwrite of the first puts them all behind it, BDEV-16)."""
    n = geom.page_count
    lo, hi = seqs
    count = max(0, hi - lo + 1)
    if count >= 1 << 32:
        raise Corrupt(f"{path}: {count} lost seqs do not fit one LOSS page (BDEV-27)")
    for k, pos in enumerate(run):
        lap, i = divmod(pos, n)
        header = PageHeader(
            first_seq=lo if k == 0 else lo + count,
            floor=basis.floor if basis is not None else 1,
            min_hwm=0,
            meta_gen=basis.meta_gen if basis is not None else slot.generation,
            count=count if k == 0 else 0,
            used=0,
            page_seq=page_seq(lap, i, n),
            flags=PAGE_LOSS,
            lap=lap,
        )
        plan.pages[i] = encode_loss_page(geom.page_size, slot.ring_id, header)


def _plan_slot(
    path: str,
    geom: Geometry,
    slot: Slot,
    found: list[Slot],
    survey: dict[int, tuple[PageHeader, bool]],
    plan: _Plan,
) -> None:
    """BDEV-26: the slot repair writes, from the newest usable one, with a generation above
    every one seen, never over the usable slot (a torn write must leave it, BDEV-2). Written
    when pages are replaced (each subscriber gets its gap for the lost seqs, SUB-7, once: the
    gap is progress like any other) and when a page was written after a slot generation newer
    than the usable slot (or a newer slot's body cannot be used): that slot is damaged."""
    gens = [s.generation for s in found] + [h.meta_gen for h, _ in survey.values()]
    top = max(gens)
    if top <= slot.generation and not plan.losses:
        return
    gen = top + 1
    if slot_index(gen) == slot_index(slot.generation):
        gen += 1
    looped = slot.looped or any(h.lap >= 1 for h, _ in survey.values())
    body, told = _with_gaps(slot.body, plan.losses)
    new = Slot(gen, slot.ring_id, geom.page_size, geom.page_count, slot.num_pages, looped, body)
    index = slot_index(gen)
    plan.slot = (index, encode_slot(new))
    where = f"metadata slot {index} (offset {index * SLOT_BYTES})"
    if top > slot.generation:
        plan.actions.append(
            f"{where} is damaged: generation {top} was written, the newest usable slot is "
            f"generation {slot.generation}; rewritten from it as generation {gen} (what only "
            "the damaged slot held is lost: subscriber progress and registrations, the floor "
            "since, the write counters) (BDEV-26)"
        )
    else:
        plan.actions.append(f"{where} written as generation {gen} (BDEV-26)")
    if told:
        plan.actions.append(
            "subscribers " + ", ".join(repr(n) for n in told) + " get a gap for the lost seqs "
            "(SUB-7)"
        )


def _with_gaps(
    body: dict[str, Any], losses: list[tuple[int, int]]
) -> tuple[dict[str, Any], list[str]]:
    """The slot body with every subscriber's gaps covering the lost seqs above its hwm (SUB-7:
    they were unresolved for it), and the names of those subscribers. Without the log, a seq
    counts as live unless the slot has it below the floor or trimmed, or it is lost."""
    subs = {name: dict(sub) for name, sub in (body.get("subs") or {}).items()}
    state = body.get("state") or {}
    trimmed = [(int(lo), int(hi)) for lo, hi in state.get("trimmed", [])]
    between = offline_live_between(int(state.get("floor", 1)), [*trimmed, *losses])
    told = []
    for name, sub in sorted(subs.items()):
        s = SubState(int(sub["base"]), int(sub["hwm"]), 0, gaps=gaps_of(sub.get("gap")))
        for lo, hi in losses:
            if hi > s.hwm:
                add_gap(s, max(lo, s.hwm + 1), hi, between)
        if gap_json(s.gaps) != sub.get("gap"):
            sub["gap"] = gap_json(s.gaps)
            told.append(name)
    return {**body, "subs": subs}, told


def _other_ring(
    path: str,
    geom: Geometry,
    slot: Slot,
    block: bytes,
    bad: list[tuple[int, FormatCorrupt]],
    read_page: Callable[[int], bytes],
) -> None:
    """A damaged slot that names another ring id under which pages validate held a newer
    incarnation (drop_topic draws a new ring id, RING-5): its config is gone (BDEV-27)."""
    for i, _ in bad:
        other = unchecked_slot_ring_id(block[i * SLOT_BYTES : (i + 1) * SLOT_BYTES])
        if other is None or other == slot.ring_id:
            continue
        for k in range(geom.page_count):
            if decode_trailer(read_page(k), other) is not None:
                raise Corrupt(
                    f"{path} at byte offset {i * SLOT_BYTES}: metadata slot {i} is damaged and "
                    f"names ring id {other:016x}, under which page {k} validates: the ring's "
                    "newest incarnation is described only there, so repair cannot rebuild it "
                    "(BDEV-27)"
                )


def _check(
    path: str, geom: Geometry, slot: Slot, plan: _Plan, read_page: Callable[[int], bytes]
) -> Examined:
    """Recovery's checks on the ring as it will be after ``plan`` (BDEV-24)."""

    def view(i: int) -> bytes:
        page = plan.pages.get(i)
        return page if page is not None else read_page(i)

    after = slot
    if plan.slot is not None:
        index, raw = plan.slot
        after = decode_slot(raw, index)
    return examine(path, geom, after, view)


# -- quarantine (BDEV-24) -----------------------------------------------------------------------
def _write_quarantine(fs: FS, path: str, where: str, saved: list[tuple[int, bytes]]) -> str:
    """``<where>/<device name>.quarantine-<UTC time>``: the bytes repair overwrites, written and
    synced (under a temporary name, then renamed) before the device is touched."""
    if not fs.is_dir(where):
        raise StorageError(f"quarantine directory {where} does not exist")
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    base = posixpath.join(where, f"{posixpath.basename(path)}.quarantine-{stamp}")
    dest, k = base, 1
    while fs.exists(dest):
        k += 1
        dest = f"{base}-{k}"
    head = json.dumps({"device": path, "created": stamp, "rule": "BDEV-24"}).encode()
    parts = [QUARANTINE_MAGIC, struct.pack("<I", len(head)), head]
    for offset, data in saved:
        parts += [_RECORD.pack(offset, len(data), checksum(data)), data]
    tmp = dest + ".tmp"
    try:
        write_whole(fs, tmp, b"".join(parts))
        fs.rename(tmp, dest)
        fs.fsync_dir(where)
    except OSError as exc:
        raise storage_error(exc, f"writing the quarantine file {dest}") from None
    return dest


def read_quarantine(data: bytes) -> tuple[dict[str, object], list[tuple[int, bytes]]]:
    """(header, [(device offset, bytes), ...]) of a quarantine file (BDEV-24); ``Corrupt`` if
    it is not one or a record's checksum fails."""
    if data[:8] != QUARANTINE_MAGIC or len(data) < 12:
        raise Corrupt("not a tidelog ring quarantine file (BDEV-24)")
    (size,) = struct.unpack_from("<I", data, 8)
    header = json.loads(data[12 : 12 + size])
    pos, out = 12 + size, []
    while pos < len(data):
        offset, length, crc = _RECORD.unpack_from(data, pos)
        chunk = data[pos + _RECORD.size : pos + _RECORD.size + length]
        if len(chunk) != length or checksum(chunk) != crc:
            raise Corrupt(f"quarantine record at byte {pos} is damaged (BDEV-24)")
        out.append((offset, chunk))
        pos += _RECORD.size + length
    return header, out
