"""Torn or damaged (FORMATS-blockdev BDEV-22; SPEC FLT-1, FLT-2): what a ring's bytes prove.

A power loss leaves at most one defect on a ring, in the item being written: the writer issues
one page or slot at a time, each synced before the next (BDEV-14). Anything written after an item
proves that item was durable, so a defect in it is damage, not a torn write. ``examine`` runs
every check recovery makes before it uses a ring and returns each finding as a ``Problem`` with
its byte offset and rule: recovery raises the first error as ``Corrupt`` and keeps the warnings,
``verify_image`` reports them all. One code path, so verify says exactly what recovery does.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from tidelog.config import TopicConfig
from tidelog.errors import Corrupt, TidelogError
from tidelog.model.ring import page_seq
from tidelog.report import ERROR, WARNING, Problem

from .device import Geometry
from .format import SLOT_BYTES, FormatCorrupt, Slot, decode_slot, slot_index
from .meta import gaps_of
from .ring import Assembled, RingScan, assemble, scan_ring

__all__ = ["Examined", "examine", "read_slots", "slot_warnings", "corrupt_from", "body_problem"]

_LAP_MOD = 1 << 32  # the trailer keeps the lap mod 2**32 (BDEV-7)


@dataclass
class Examined:
    scan: RingScan | None = None
    asm: Assembled | None = None
    problems: list[Problem] = field(default_factory=list)

    @property
    def errors(self) -> list[Problem]:
        return [p for p in self.problems if p.severity == ERROR]


def corrupt_from(problem: Problem) -> Corrupt:
    """The error recovery raises for a finding: device, byte offset, rule (FLT-2)."""
    where = "" if problem.offset is None else f" at byte offset {problem.offset}"
    return Corrupt(f"{problem.path}{where}: {problem.message} ({problem.rule})")


def read_slots(block: bytes) -> tuple[list[Slot], list[tuple[int, FormatCorrupt]]]:
    """The valid slots of a metadata block and, for the others, why not (BDEV-3, BDEV-4)."""
    found: list[Slot] = []
    bad: list[tuple[int, FormatCorrupt]] = []
    for i in (0, 1):
        try:
            found.append(decode_slot(block[i * SLOT_BYTES : (i + 1) * SLOT_BYTES], i))
        except FormatCorrupt as exc:
            bad.append((i, exc))
    return found, bad


def slot_warnings(
    path: str, found: list[Slot], bad: list[tuple[int, FormatCorrupt]]
) -> list[Problem]:
    """An invalid slot next to a valid one: a torn slot write, an older slot damaged (nothing
    lost: the newer one supersedes it), or a newer one damaged with nothing written after it
    (indistinguishable from the torn write, BDEV-22). Page proofs catch the rest (``examine``)."""
    if not found:
        return []
    newest = max(found, key=lambda s: s.generation)
    return [
        Problem(
            path,
            i * SLOT_BYTES,
            "BDEV-22",
            WARNING,
            f"metadata slot {i} does not validate ({err.detail}): recovery uses slot "
            f"{slot_index(newest.generation)} (generation {newest.generation}); a torn slot "
            "write, or damage to a slot that loses nothing or that no later write proves",
        )
        for i, err in bad
        if "all zeros" not in err.detail
    ]


def examine(path: str, geom: Geometry, slot: Slot, read_page: Callable[[int], bytes]) -> Examined:
    """Every check of BDEV-22 (and the refusals of BDEV-4, BDEV-10, BDEV-14, RING-4/5) on the
    ring ``slot`` describes. Stops before assembly when the pages already prove damage."""
    out = Examined()
    slot_off = slot_index(slot.generation) * SLOT_BYTES

    def error(offset: int | None, rule: str, message: str) -> None:
        out.problems.append(Problem(path, offset, rule, ERROR, message))

    bad_body = body_problem(slot.body)
    if bad_body is not None:
        error(slot_off, "BDEV-4", f"metadata slot generation {slot.generation}: {bad_body}")
        return out
    try:
        scan = scan_ring(read_page, geom, slot.ring_id)
    except FormatCorrupt as exc:
        error(_page_offset(geom, exc.page), exc.rule, exc.detail)
        return out
    out.scan = scan
    _page_proofs(path, geom, slot, scan, out.problems)
    if out.errors:
        return out
    try:
        asm = assemble(scan)
    except FormatCorrupt as exc:
        error(_page_offset(geom, exc.page), exc.rule, exc.detail)
        return out
    out.asm = asm
    if asm.abandoned:
        out.problems.append(Problem(path, None, "BDEV-10", WARNING, "; ".join(asm.notes)))
    body = slot.body
    if (asm.records or asm.marks) and body.get("config") is None:
        error(slot_off, "BDEV-4", "ring pages hold records but the metadata names no topic")
    durable = int((body.get("state") or {}).get("head", 0))
    if durable > asm.head_seq:
        error(
            geom.offset(scan.next_index),
            "BDEV-14",
            f"the metadata slot (generation {slot.generation}) records seq {durable} as "
            f"written, but the ring ends at seq {asm.head_seq}: the page after the head was "
            "written before that slot (BDEV-22)",
        )
    return out


def _page_offset(geom: Geometry, page: int | None) -> int | None:
    return None if page is None else geom.offset(page)


def _page_proofs(path: str, geom: Geometry, slot: Slot, scan: RingScan, out: list[Problem]) -> None:
    """BDEV-22 (a)-(d), then the warning for the residual case (the page after the head)."""
    n, seqs, head = geom.page_count, scan.seqs, scan.head

    def error(index: int, message: str, offset: int | None = None) -> None:
        out.append(
            Problem(
                path, geom.offset(index) if offset is None else offset, "BDEV-22", ERROR, message
            )
        )

    if head is None:  # an empty ring: pages 0 and 1 do not validate (RING-5)
        parity, h, lap, wrapped = 0, -1, 0, False
        later = min(scan.headers, default=None)
        if later is not None:  # (a) a page of this ring after them was written later
            error(0, f"pages 0 and 1 do not validate, but page {later} of this ring does")
        if slot.num_pages:
            error(
                0,
                f"the metadata says {slot.num_pages} pages were written, but pages 0 and 1 "
                "do not validate (RING-5)",
            )
    else:
        parity, h = head.parity, head.index
        lap = scan.headers[h].lap
        wrapped = parity == 1 or lap >= 1 or slot.looped
        # (a) the head's lap holds pages start..last, with no invalid page among them
        current = [i for i in range(n) if seqs[i] == page_seq(parity, i, n)]
        start = 0 if current[0] == 0 else 1  # 1: page 0 of the next lap is the torn write
        last = current[-1]
        if current != list(range(start, last + 1)):
            hole = next(i for i in range(start, last + 1) if i not in current)
            error(
                hole,
                f"page {hole} does not validate, but page {last}, written after it in "
                "the same lap, does",
            )
        # (b) after a wrap, the previous lap's pages beyond the one being overwritten
        elif wrapped:
            for i in range(h + 2, n):
                if seqs[i] != page_seq(1 - parity, i, n):
                    error(
                        i,
                        f"page {i} does not validate as a page of the previous lap, which "
                        f"was written before pages 0..{h} of this one",
                    )
                    break
    nxt = scan.next_index
    next_lap = lap + (1 if head is not None and nxt == 0 else 0)
    # (c) the newest slot was queued after every page before its position
    ahead = _slot_ahead(slot, next_lap, nxt, n)
    if ahead > 0:
        error(
            nxt,
            f"the metadata slot (generation {slot.generation}) was written after "
            f"{ahead} more page(s) than the ring holds: page {nxt}, after the head, was "
            "written and synced before it",
        )
    # (d) a page names a slot generation newer than every valid slot
    if scan.headers:
        at, top = max(scan.headers.items(), key=lambda kv: kv[1].meta_gen)
        if top.meta_gen > slot.generation:
            off = slot_index(top.meta_gen) * SLOT_BYTES
            error(
                at,
                f"page {at} was written after metadata slot generation {top.meta_gen}, "
                f"but the newest valid slot is generation {slot.generation}: the slot at "
                f"offset {off} is damaged",
                offset=off,
            )
    if any(p.severity == ERROR for p in out) or nxt in scan.headers:
        return
    meant = scan.after_head
    began = wrapped or (
        meant is not None
        and meant.page_seq == page_seq(next_lap, nxt, n)
        and meant.lap == next_lap % _LAP_MOD
    )
    if began:
        out.append(
            Problem(
                path,
                geom.offset(nxt),
                "BDEV-22",
                WARNING,
                f"page {nxt}, after the head, does not validate: a torn last write, or damage "
                "that nothing written after it can prove; recovery discards it and writes there "
                "next (if its write had completed, its records are lost: seqs above the head are "
                "assigned again, older ones lie below the floor, behind a tombstone)",
            )
        )


def _slot_ahead(slot: Slot, lap: int, index: int, n: int) -> int:
    """How many pages the slot's recorded position (BDEV-4 ``lap``, ``next``) is past the
    page after the head, at lap ``lap`` (mod 2**32, as trailers keep it); <= 0 when it is not.
    A slot without a position (written by an earlier version) proves nothing."""
    body = slot.body
    if "next" not in body:
        return 0
    laps = (int(body["lap"]) - lap) % _LAP_MOD
    if laps >= _LAP_MOD // 2:
        laps -= _LAP_MOD
    return laps * n + int(body["next"]) - index


def body_problem(body: dict[str, Any]) -> str | None:
    """Why recovery could not use a slot body whose CRC matched (BDEV-4), or None."""
    try:
        _check_body(body)
    except (TypeError, ValueError, KeyError, AttributeError, TidelogError) as exc:
        return f"body cannot be used: {exc}"
    return None


def _int(value: object, what: str) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise ValueError(f"{what} is {value!r}, not a count")
    return value


def _check_body(body: dict[str, Any]) -> None:
    if not isinstance(body.get("topic"), str):
        raise ValueError("no topic binding")
    _int(body.get("incarnations", 0), "incarnations")
    _int(body.get("tid", 0), "tid")
    for key in ("lap", "next"):
        if key in body:
            _int(body[key], key)
    config = body.get("config")
    if config is not None:
        TopicConfig(**config)
    state = body.get("state") or {}
    _int(state.get("head", 0), "head")
    _int(state.get("floor", 1), "floor")
    if state.get("last_ts") is not None and not isinstance(state["last_ts"], int):
        raise ValueError(f"last_ts is {state['last_ts']!r}")
    for lo, hi in state.get("trimmed", []):
        _int(lo, "trimmed range"), _int(hi, "trimmed range")
    for name, sub in (body.get("subs") or {}).items():
        if not isinstance(name, str):
            raise ValueError(f"subscriber name {name!r}")
        _int(sub["base"], "base"), _int(sub["hwm"], "hwm")
        gaps_of(sub.get("gap"))  # BDEV-29
        for q in [*sub.get("acked", []), *sub.get("rejected", [])]:
            _int(q, "outcome")
