"""Damaged SF slots: torn or damaged, told apart by proof (spec/FORWARD.md SF-17, SF-18, SF-20;
SPEC FLT-1, FLT-2).

A slot written through ``Slot`` and closed cleanly is damaged in one place (a bit flip, a zeroed
range, a truncation) in each of its files -- every segment, ``.ack-watermark`` and
``.tidelog-sync`` -- and opened again. The rule, for every case:

- recovery either refuses with ``Corrupt`` naming a file of the slot and a byte offset, having
  written nothing, or it opens and every frame of the undamaged slot is there under the same
  FSN with the same payload (record by record), ``publishedFsn`` is the same (so the next append
  reuses no FSN) and ``ackedFsn`` is not above the undamaged slot's (no frame skipped);
- ``tidelog verify`` reports an error exactly when open refuses;
- a read-only view (SF-21) refuses exactly when open does, with the same message, else it shows
  the same frames, ``ackedFsn`` and ``publishedFsn``, and it writes nothing.

A record's ``ts`` is not compared: it is the segment's createdMicros, informational, and damage
to a sealed segment's createdMicros is one of the residuals SF-18 lists.

The seeded fuzzer prints its counts; every failing case it found while SF-18 was written is kept
below as an explicit regression test.
"""

from __future__ import annotations

import os
import posixpath
import random
from collections.abc import Callable
from dataclasses import dataclass

import pytest
from damage_report import report

from tidelog.backends.sf import format as fmt
from tidelog.backends.sf.recovery import SYNC_FILE, WATERMARK_FILE, examine
from tidelog.backends.sf.slot import Slot
from tidelog.backends.sf.view import SlotView
from tidelog.conformance.crashfs import RecordingFS
from tidelog.errors import Corrupt
from tidelog.verify import verify_slot

SF_DIR = "/sf"
SENDER = "a"
SLOT = posixpath.join(SF_DIR, SENDER)
SEED = int(os.environ.get("TIDELOG_SF_DAMAGE_SEED", "20261127"))
CASES = int(os.environ.get("TIDELOG_SF_DAMAGE_CASES", "600"))


def payload(fsn: int) -> bytes:
    return f"frame-{fsn}:".encode() + bytes([97 + fsn % 26]) * (fsn % 11)


def image(tree: dict[str, bytes | None]) -> RecordingFS:
    """A durable RecordingFS holding exactly ``tree`` (path -> bytes, None for a directory)."""
    fs = RecordingFS()
    for path, data in sorted(tree.items()):
        if data is None:
            fs.mkdir(path)
        else:
            h = fs.open(path)
            h.pwrite(data, 0)
            h.close()
    fs.settle()
    return fs


def slot_files(tree: dict[str, bytes | None]) -> dict[str, bytes]:
    """The slot's files, without the lock files (open rewrites ``.lock.pid``)."""
    return {
        p: d
        for p, d in tree.items()
        if d is not None and p.startswith(SLOT + "/") and not p.endswith((".lock", ".lock.pid"))
    }


@dataclass
class Reference:
    tree: dict[str, bytes | None]
    frames: dict[int, bytes]  # FSN -> payload of every frame on disk
    acked: int
    published: int


def build(durability: str, *, frames: int = 14, ack: int = 4, close: bool = True) -> Reference:
    """A slot of several small segments, acknowledged (watermark, trim) through ``ack``."""
    fs = RecordingFS(dirs=[SF_DIR])
    slot = Slot.open(SF_DIR, SENDER, fs=fs, max_bytes=128, durability=durability, slot_format=1)
    for i in range(frames):
        assert slot.append(payload(i)) == i
        if durability == "flush" and i % 5 == 4:
            slot.flush()
    slot.acknowledge(ack)
    slot.apply_acks()
    if durability == "flush":
        slot.flush()
    lowest, published, acked = slot.lowest_fsn(), slot.published_fsn, slot.acked_fsn
    if close:
        slot.close()
        tree = fs.tree()
    else:  # the process dies: everything it wrote is on disk, nothing of close's is
        state = list(fs.crash_states(mode="sample", seed=0, limit=2))[-1]
        tree = state.tree()
    return Reference(tree, {f: payload(f) for f in range(lowest, published + 1)}, acked, published)


@dataclass
class Outcome:
    refused: Corrupt | None
    frames: dict[int, bytes]
    acked: int
    published: int
    verify_errors: list[str]


def frames_of(slot: Slot | SlotView) -> dict[int, bytes]:
    lowest = slot.lowest_fsn()
    got = slot.read(lowest, 10_000, 1 << 30) if slot.published_fsn >= lowest else []
    return {lowest + i: p for i, p in enumerate(got)}


def view_of(fs: RecordingFS) -> tuple[Corrupt | None, dict[int, bytes], int, int]:
    """What a read-only view sees (SF-21), checking it wrote nothing, the lock files included."""
    before = fs.tree()
    try:
        view = SlotView(fs, SLOT, tries=1)  # nothing else writes: one scan decides
    except Corrupt as exc:
        assert fs.tree() == before, "a refusing view wrote to the slot (SF-21)"
        return exc, {}, -2, -2
    with view:
        seen = frames_of(view), view.acked_fsn, view.published_fsn
    assert fs.tree() == before, "a view wrote to the slot (SF-21)"
    return None, *seen


def reopen(tree: dict[str, bytes | None], durability: str = "append") -> Outcome:
    """Open the (damaged) slot as the product would; verify it first and read it through a
    read-only view, which must say what the writer's recovery says (SF-21)."""
    fs = image(tree)
    report = verify_slot(fs, SLOT)
    refused, seen, acked, published = view_of(fs)
    before = slot_files(fs.tree())
    try:
        slot = Slot.open(SF_DIR, SENDER, fs=fs, max_bytes=128, durability=durability, slot_format=1)
    except Corrupt as exc:
        assert slot_files(fs.tree()) == before, "a refusing recovery wrote to the slot (FLT-2)"
        assert refused is not None and refused.message == exc.message, "the view disagrees"
        return Outcome(exc, {}, -2, -2, [str(p) for p in report.errors])
    try:
        frames = frames_of(slot)
        assert refused is None, f"a view refused what recovery opens: {refused}"
        assert (seen, acked, published) == (frames, slot.acked_fsn, slot.published_fsn)
        nxt = slot.append(b"after the damage")
        assert nxt == slot.published_fsn and slot.read(nxt) == [b"after the damage"]
        return Outcome(None, frames, slot.acked_fsn, nxt - 1, [str(p) for p in report.errors])
    finally:
        slot.close()


def check(ref: Reference, damaged: dict[str, bytes | None], what: str) -> str:
    """The rule of the module docstring; returns "refused", "intact" or "same"."""
    out = reopen(damaged)
    if out.refused is not None:
        msg = out.refused.message
        assert out.verify_errors, f"{what}: open refused ({msg}) but verify reports no error"
        assert SLOT in msg and "offset" in msg, f"{what}: refusal names no file/offset: {msg}"
        return "refused"
    assert not out.verify_errors, f"{what}: open succeeded but verify says {out.verify_errors}"
    assert out.frames == ref.frames, (
        f"{what}: frames differ: lost {sorted(set(ref.frames) - set(out.frames))}, "
        f"changed {sorted(f for f in out.frames if ref.frames.get(f) != out.frames[f])}"
    )
    assert out.published == ref.published, f"{what}: publishedFsn {out.published} (SF-20)"
    assert out.acked <= ref.acked, f"{what}: ackedFsn {out.acked} > {ref.acked}: frames skipped"
    return "intact" if damaged != ref.tree else "same"


# --- damage kinds ---------------------------------------------------------------------------
def flip(data: bytes, rng: random.Random) -> tuple[bytes, str]:
    i = rng.randrange(len(data))
    bit = 1 << rng.randrange(8)
    return data[:i] + bytes([data[i] ^ bit]) + data[i + 1 :], f"flip bit {bit:#x} at {i}"


def zero(data: bytes, rng: random.Random) -> tuple[bytes, str]:
    i = rng.randrange(len(data))
    n = rng.randint(1, 64)
    return data[:i] + bytes(min(n, len(data) - i)) + data[i + n :], f"zero {n} bytes at {i}"


def truncate(data: bytes, rng: random.Random) -> tuple[bytes, str]:
    n = rng.randrange(len(data))
    return data[:n], f"truncate to {n}"


Damage = Callable[[bytes, random.Random], tuple[bytes, str]]
DAMAGE: list[Damage] = [flip, zero, truncate]


def damaged_copy(
    ref: Reference, path: str, kind: Damage, rng: random.Random
) -> tuple[dict[str, bytes | None], str]:
    data = ref.tree[path]
    assert data is not None
    # Half the cases aim at the bytes that matter (headers, frames, records), not the zero tail.
    live = len(data.rstrip(b"\0")) or len(data)
    target = data[:live] if rng.random() < 0.5 else data
    new, how = kind(target, rng)
    if len(target) < len(data) and kind is not truncate:
        new += data[live:]
    return {**ref.tree, path: new}, f"{posixpath.basename(path)}: {how}"


@pytest.mark.parametrize("durability", ["append", "flush"])
def test_SF_18_seeded_damage_in_every_file_is_refused_or_harmless(durability: str) -> None:
    """SF-18, SF-20, FLT-2: one damage in one file of a cleanly closed slot: Corrupt naming file
    and offset (and verify says so), or every frame intact, no FSN reused, nothing skipped."""
    ref = build(durability)
    files = sorted(slot_files(ref.tree))
    assert any(p.endswith(".sfa") for p in files) and SLOT + "/" + SYNC_FILE in files
    assert SLOT + "/" + WATERMARK_FILE in files
    rng = random.Random(f"{SEED}:{durability}")
    counts = {"refused": 0, "intact": 0, "same": 0}
    per_file: dict[str, int] = {}
    for case in range(CASES):
        path = files[case % len(files)]
        kind = DAMAGE[(case // len(files)) % len(DAMAGE)]
        damaged, what = damaged_copy(ref, path, kind, rng)
        counts[check(ref, damaged, f"seed {SEED} case {case}: {what}")] += 1
        per_file[posixpath.basename(path)] = per_file.get(posixpath.basename(path), 0) + 1
    assert counts["refused"] > CASES // 10 and counts["intact"] > CASES // 10
    print(f"SF damage ({durability}): cases per file {per_file}")
    report(f"SF slot damage ({durability})", SEED, counts, 0)


# --- the reported cases -----------------------------------------------------------------------
def segments(tree: dict[str, bytes | None]) -> list[str]:
    return sorted(p for p in slot_files(tree) if p.endswith(".sfa"))


def frame_offsets(data: bytes) -> list[int]:
    return list(fmt.scan_frames(data).offsets)


@pytest.mark.parametrize("durability", ["append", "flush"])
def test_SF_18_one_damaged_byte_before_valid_frames_in_the_last_segment_refuses(
    durability: str,
) -> None:
    """SF-18 item 2: one damaged byte in a frame of the last segment, valid frames after it.
    Recovery used to take it for a torn tail, zero the rest of the segment on disk and hand the
    FSNs out again while verify only warned. Now: Corrupt naming the file and the frame's offset,
    nothing written, verify reports the same error."""
    ref = build(durability, frames=7, ack=0)  # one segment holds them all? no: a few
    last = segments(ref.tree)[-1]
    data = ref.tree[last]
    assert data is not None
    offs = frame_offsets(data)
    assert len(offs) >= 2, "the last segment needs a frame followed by another"
    bad = bytearray(data)
    bad[offs[0] + 9] ^= 0x01  # a payload byte of the first frame; the next one stays valid
    out = reopen({**ref.tree, last: bytes(bad)})
    assert out.refused is not None
    assert f"{last} at offset {offs[0]}" in out.refused.message and "SF-18" in out.refused.message
    assert any(f"@ {offs[0]}: [SF-18]" in e for e in out.verify_errors), out.verify_errors


def test_SF_18_damage_in_an_append_session_that_died_is_proven_by_the_next_frame() -> None:
    """SF-18 item 3: the process died (no close record); under sf_durability=append the sync
    record's flag says every frame was synced before the next was written, so a bad frame
    followed by a valid one is damage, while a bad last frame is still a torn tail."""
    ref = build("append", frames=7, ack=0, close=False)
    last = segments(ref.tree)[-1]
    data = ref.tree[last]
    assert data is not None
    offs = frame_offsets(data)
    assert len(offs) >= 2
    rec, _ = examine(image(ref.tree), SLOT)
    assert rec is not None and rec.sync.newest is not None and rec.sync.newest.append
    assert rec.sync.newest.synced_end < offs[-1]  # the session's frames are past the record
    bad = bytearray(data)
    bad[offs[-2] + 9] ^= 0x01
    out = reopen({**ref.tree, last: bytes(bad)})
    assert out.refused is not None and f"offset {offs[-2]}" in out.refused.message
    assert "valid frame follows" in out.refused.message
    torn = bytearray(data)
    torn[offs[-1] + 9] ^= 0x01  # the last frame: nothing vouches for it (a residual, SF-18)
    out = reopen({**ref.tree, last: bytes(torn)})
    assert out.refused is None and not out.verify_errors
    assert max(out.frames) == max(ref.frames) - 1


def test_SF_18_the_unsynced_window_of_flush_stays_a_torn_tail() -> None:
    """SF-18, SF-11: under flush, frames after the last flush may legitimately survive a power
    loss behind a torn one, so a bad frame there is a torn tail (a warning) and recovery keeps
    what the last flush covered; SF-20: those FSNs are handed out again."""
    fs = RecordingFS(dirs=[SF_DIR])
    slot = Slot.open(SF_DIR, SENDER, fs=fs, max_bytes=4096, durability="flush", slot_format=1)
    for i in range(3):
        slot.append(payload(i))
    slot.flush()
    for i in range(3, 6):
        slot.append(payload(i))
    tree = list(fs.crash_states(mode="sample", seed=0, limit=2))[-1].tree()  # all persisted
    seg = segments(tree)[-1]
    data = tree[seg]
    assert data is not None
    offs = frame_offsets(data)
    bad = bytearray(data)
    bad[offs[3] + 9] ^= 0x01  # the first unflushed frame; two valid frames follow it
    out = reopen({**tree, seg: bytes(bad)}, durability="flush")
    assert out.refused is None and not out.verify_errors
    assert sorted(out.frames) == [0, 1, 2] and out.published == 2
    bad[offs[1] + 9] ^= 0x01  # a flushed frame: the sync record proves it durable
    out = reopen({**tree, seg: bytes(bad)}, durability="flush")
    assert out.refused is not None and f"offset {offs[1]}" in out.refused.message


def test_SF_18_a_truncated_active_segment_is_not_unborn() -> None:
    """SF-8, SF-18: the sync record names the active segment, so truncating it to nothing (or
    zeroing it) is damage, not an unborn segment to delete (which would restart the FSNs)."""
    ref = build("append", frames=5, ack=0)
    last = segments(ref.tree)[-1]
    for content in (b"", bytes(len(ref.tree[last] or b""))):
        out = reopen({**ref.tree, last: content})
        assert out.refused is not None and "all zero" in out.refused.message, content[:1]


def test_SF_18_an_all_zero_segment_below_a_live_one_is_damage() -> None:
    """SF-8, SF-18: segments are created in generation order, so only the newest can be unborn;
    a zeroed lowest segment would otherwise vanish as if trimmed."""
    ref = build("append", frames=14, ack=-1)
    first = segments(ref.tree)[0]
    out = reopen({**ref.tree, first: bytes(len(ref.tree[first] or b""))})
    assert out.refused is not None and "below a live segment" in out.refused.message


def test_SF_18_a_rewritten_base_seq_of_the_active_segment_is_damage() -> None:
    """SF-18: a single-segment slot has no neighbour to check its baseSeq against; the sync
    record does (a changed baseSeq would renumber every frame)."""
    ref = build("append", frames=3, ack=-1)
    (only,) = segments(ref.tree)
    data = ref.tree[only]
    assert data is not None
    out = reopen({**ref.tree, only: data[:8] + (5).to_bytes(8, "little") + data[16:]})
    assert out.refused is not None and "baseSeq 5" in out.refused.message


def test_SF_17_a_raised_watermark_is_caught_by_its_check() -> None:
    """SF-17, SF-10: damage that raises the watermark's FSN (magic and reserved word intact) is
    undone by the watermark check: recovery trusts the smaller, skipping nothing."""
    ref = build("append", frames=14, ack=4)
    wm = SLOT + "/" + WATERMARK_FILE
    out = reopen({**ref.tree, wm: fmt.encode_watermark(ref.published - 1)})
    assert out.refused is None and out.acked == ref.acked == 4


def test_SF_17_one_damaged_copy_of_the_sync_record_falls_back_to_the_other() -> None:
    """SF-17: a torn write can spoil one copy; the other still proves its sync point. Both
    copies spoiled cannot come from a power loss: damage, refused, and verify says so."""
    ref = build("append", frames=6, ack=-1)
    path = SLOT + "/" + SYNC_FILE
    data = ref.tree[path]
    assert data is not None
    one = bytearray(data)
    one[40] ^= 0xFF
    assert reopen({**ref.tree, path: bytes(one)}).refused is None
    one[4096 + 40] ^= 0xFF
    out = reopen({**ref.tree, path: bytes(one)})
    assert out.refused is not None and SYNC_FILE in out.refused.message


def test_SF_18_found_zeroed_created_micros_and_first_frame_of_the_active_segment() -> None:
    """Found by the fuzzer (seed 20261127 case 69, append): 33 zero bytes from offset 10 of the
    active segment spoil its createdMicros and its first frame. Taking the segment for one
    another client recreated dropped the sync record's claim and the frame with it; the claim
    holds (SF-18 item 2), so recovery refuses, and verify warns about createdMicros too."""
    ref = build("append")
    last = segments(ref.tree)[-1]
    data = ref.tree[last]
    assert data is not None
    out = reopen({**ref.tree, last: data[:10] + bytes(33) + data[43:]})
    assert out.refused is not None and f"{last} at offset 24" in out.refused.message
    report = verify_slot(image({**ref.tree, last: data[:10] + bytes(33) + data[43:]}), SLOT)
    assert {(p.rule, p.offset) for p in report.warnings} >= {("SF-17", 16)}
