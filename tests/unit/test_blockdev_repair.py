"""``tidelog repair blockdev://...``: the documented way out of a ring that recovery refuses as
damaged (spec/FORMATS-blockdev.md BDEV-24..BDEV-27; BDEV-22 and SPEC FLT-2 keep the refusal the
default). The seeded fuzzer in test_blockdev_damage.py repairs every case it refuses; these are
the exact cases: a damaged page in the middle of the live records, the newest pages, a damaged
newest slot, each refusal BDEV-22's regression tests pin, the refusals of repair itself, a crash
at every point of a repair, and the command line."""

from __future__ import annotations

import contextlib
import dataclasses
from pathlib import Path

import pytest
from click.testing import CliRunner

import tidelog
from tidelog.backends.blockdev import open_store, verify_image
from tidelog.backends.blockdev.format import (
    PAGE_LOSS,
    SLOT_BYTES,
    decode_slot,
    decode_trailer,
    encode_page,
    encode_slot,
    slot_index,
)
from tidelog.backends.blockdev.repair import read_quarantine, repair_ring
from tidelog.cli import main
from tidelog.clock import FakeClock
from tidelog.conformance.crashfs import RecordingFS
from tidelog.errors import Corrupt, Locked, StorageError
from tidelog.fsio import OsFS
from tidelog.hooks import Abandon, hooks
from tidelog.records import Record, Tombstone

PAGE = 512
MOST = (PAGE - 64) // 3  # records a 512-byte page could hold (BDEV-25's bound)


def ring(path: Path, pages: int = 8) -> tidelog.Store:
    return tidelog.open(
        f"blockdev://{path}?size={4096 + pages * PAGE}&page_size={PAGE}&topic=t",
        clock=FakeClock(1000),
    )


def payload(seq: int) -> bytes:
    return b"r%03d-" % seq + b"x" * (seq % 50)


def append(t: tidelog.Topic, n: int = 1) -> None:
    for _ in range(n):
        seq = t.state().head_seq + 1
        assert t.append(payload(seq)) == seq


def page_off(i: int) -> int:
    return 4096 + i * PAGE


def flip(path: Path, offset: int) -> bytes:
    """Flip one bit at ``offset``; return the image as it was before."""
    image = path.read_bytes()
    damaged = bytearray(image)
    damaged[offset] ^= 0x10
    path.write_bytes(bytes(damaged))
    return image


def read_all(path: Path) -> tuple[list[Record | Tombstone], int]:
    with tidelog.open(f"blockdev://{path}") as store:
        t = store.topic("t", create=False)
        return list(t.read(0, 10_000)), t.state().head_seq


def records(items: list[Record | Tombstone]) -> dict[int, bytes]:
    return {r.seq: r.payload for r in items if isinstance(r, Record)}


def tombstones(items: list[Record | Tombstone]) -> list[tuple[int, int]]:
    return [(i.gap_from, i.gap_to) for i in items if isinstance(i, Tombstone)]


def refused(path: Path, offset: int) -> None:
    with pytest.raises(Corrupt, match=f"byte offset {offset}:"):
        tidelog.open(f"blockdev://{path}").close()


def repaired(path: Path, **kw: object) -> list[str]:
    """Repair; check BDEV-24: the quarantine file holds exactly the bytes that changed, verify
    finds no error afterwards, and a second run finds nothing to do. Returns the actions."""
    before = path.read_bytes()
    report = repair_ring(OsFS(), str(path), **kw)  # type: ignore[arg-type]
    assert report.changed and report.quarantine is not None
    header, saved = read_quarantine(Path(report.quarantine).read_bytes())
    assert header["device"] == str(path) and header["rule"] == "BDEV-24"
    undone = bytearray(path.read_bytes())
    for offset, data in saved:
        assert before[offset : offset + len(data)] == data
        undone[offset : offset + len(data)] = data
    assert bytes(undone) == before  # nothing changed that was not copied first
    assert verify_image(OsFS(), str(path)).errors == []
    assert not repair_ring(OsFS(), str(path)).changed
    return report.actions


def slot_body(path: Path) -> dict[str, object]:
    image = path.read_bytes()
    slots = []
    for i in (0, 1):
        with contextlib.suppress(Corrupt):
            slots.append(decode_slot(image[i * SLOT_BYTES : (i + 1) * SLOT_BYTES], i))
    return max(slots, key=lambda s: s.generation).body


# -- the cases -----------------------------------------------------------------------------
def test_BDEV_25_a_damaged_page_in_the_middle_of_the_live_range(tmp_path: Path) -> None:
    """BDEV-24, BDEV-25, BDEV-26, TMB-2, SUB-7: page 2 (seq 3) of six is damaged, records on
    both sides. --dry-run says what would be done and writes nothing; repair keeps every other
    record, turns exactly seq 3 into a tombstone, gives the subscriber its gap once, and the
    ring goes on at seq 7 (no seq handed out again)."""
    path = tmp_path / "r.img"
    with ring(path) as store:
        t = store.topic("t", durability="fsync", trim="none")
        sub = t.subscribe("s", start="earliest")
        append(t, 6)
        sub.commit(2)
    flip(path, page_off(2) + 7)
    refused(path, page_off(2))
    image = path.read_bytes()
    dry = repair_ring(OsFS(), str(path), dry_run=True)
    assert dry.losses == [(3, 3)] and dry.quarantine is None
    assert "page 2 (offset 5120)" in dry.actions[0] and "seqs 3..3 lost" in dry.actions[0]
    assert path.read_bytes() == image and list(tmp_path.iterdir()) == [path]
    actions = repaired(path)
    assert actions == dry.actions
    items, head = read_all(path)
    assert records(items) == {q: payload(q) for q in (1, 2, 4, 5, 6)}
    assert tombstones(items) == [(3, 3)] and head == 6
    with tidelog.open(f"blockdev://{path}") as store:
        t = store.topic("t")
        s = t.subscribe("s")
        assert s.poll(10) == [Tombstone(3, 3), *[r for r in items if isinstance(r, Record)][2:]]
        s.commit(6)
        assert t.append(b"next") == 7
    with tidelog.open(f"blockdev://{path}") as store:  # the gap was delivered: not again
        got = store.topic("t").subscribe("s").poll(10)
        assert [(r.seq, r.payload) for r in got if isinstance(r, Record)] == [(7, b"next")]
        assert len(got) == 1


def test_BDEV_26_BDEV_29_SUB_7_two_damaged_pages_with_a_live_record_between(
    tmp_path: Path,
) -> None:
    """BDEV-26, BDEV-29, SUB-4, SUB-7: pages 2 and 4 (seqs 3 and 5) are damaged with seq 4
    live between them: repair gives the subscriber two gaps, stored as a list of pairs; its poll
    returns 1, 2, Tombstone(3, 3), 4, Tombstone(5, 5), 6. Progress the engine writes keeps both
    (the slot's list form read and written again), and a clean reopen redelivers from the hwm
    with the gaps still pending (one merged gap returned Tombstone(3, 5), over the live 4)."""
    path = tmp_path / "r.img"
    with ring(path) as store:
        t = store.topic("t", durability="fsync", trim="none")
        t.subscribe("s", start="earliest")
        append(t, 6)
    flip(path, page_off(2) + 7)
    flip(path, page_off(4) + 7)
    repaired(path)
    subs = slot_body(path)["subs"]
    assert isinstance(subs, dict) and subs["s"]["gap"] == [[3, 3], [5, 5]]
    want = [1, 2, (3, 3), 4, (5, 5), 6]
    with tidelog.open(f"blockdev://{path}") as store:
        s = store.topic("t").subscribe("s")
        s.ack(1)
        s.flush()  # the engine writes the slot: both gaps still pending
        subs = slot_body(path)["subs"]
        assert isinstance(subs, dict) and subs["s"]["gap"] == [[3, 3], [5, 5]]
    with tidelog.open(f"blockdev://{path}") as store:
        s = store.topic("t").subscribe("s")
        got = s.poll(10)
        assert [i.seq if isinstance(i, Record) else (i.gap_from, i.gap_to) for i in got] == want[1:]
        s.ack(2)
        s.ack(4)
        assert s.hwm == 5  # over the lost 5 (SUB-2)
        s.ack(6)
        assert s.hwm == 6


def test_BDEV_25_damaged_newest_pages_lose_as_many_seqs_as_they_could_hold(
    tmp_path: Path,
) -> None:
    """BDEV-25, BDEV-22 (c): a memory-class ring whose full page 1 (seqs 4..6) was written and
    synced before a slot (a registration), then damaged. Nothing readable follows it, so the
    loss range runs from seq 4 to the most the page could hold: seqs 4..6 were on the device and
    are never handed out again (bounding the loss by the slot's older durable head would have)."""
    path = tmp_path / "r.img"
    store = ring(path)
    t = store.topic("t", durability="memory")
    for _ in range(7):  # 140-byte records, three per page: pages 0 and 1 fill and are written
        t.append(b"m" * 140)
    t.subscribe("s")  # a slot after pages 0 and 1 while record 7 is only in memory
    hooks(store, Abandon).abandon()
    flip(path, page_off(1) + 100)
    refused(path, page_off(1))
    repaired(path)
    items, head = read_all(path)
    assert sorted(records(items)) == [1, 2, 3]
    assert tombstones(items) == [(4, 3 + MOST)] and head == 3 + MOST


@pytest.mark.parametrize("how", ["close", "store_flush", "subscriber_flush"])
def test_BDEV_25_head_page_proven_durable(tmp_path: Path, how: str) -> None:
    """BDEV-22's first regression, repaired: the head page (seq 5, acknowledged under fsync) is
    damaged and a later slot proves it written. Seqs 1..4 stay; 5 and what the page could have
    held become the tombstone; the subscriber (hwm 3) gets a gap over them."""
    path = tmp_path / "r.img"
    store = ring(path)
    t = store.topic("t", durability="fsync", trim="none")
    sub = t.subscribe("s")
    append(t, 4)
    sub.commit(3)
    append(t)  # seq 5, alone in page 4
    {"close": store.close, "store_flush": store.flush, "subscriber_flush": sub.flush}[how]()
    hooks(store, Abandon).abandon()
    flip(path, page_off(4) + 3)
    refused(path, page_off(4))
    actions = repaired(path)
    assert any("subscribers 's' get a gap" in a for a in actions)
    items, head = read_all(path)
    assert records(items) == {q: payload(q) for q in (1, 2, 3, 4)}
    assert tombstones(items) == [(5, 4 + MOST)] and head == 4 + MOST
    subs = slot_body(path)["subs"]
    assert isinstance(subs, dict) and subs["s"]["gap"] == [5, 4 + MOST]


@pytest.mark.parametrize(("page", "lost"), [(0, (1, 1)), (2, (3, 3)), (5, (6, 5 + MOST))])
def test_BDEV_25_current_lap_holes(tmp_path: Path, page: int, lost: tuple[int, int]) -> None:
    """BDEV-22 (a)'s refusals, repaired: the first page (nothing before it: seqs start at 1),
    a middle one (exactly its seq) and the head page of a closed ring (the newest: up to what
    it could hold)."""
    path = tmp_path / "r.img"
    with ring(path) as store:
        append(store.topic("t", durability="fsync"), 6)
    flip(path, page_off(page) + PAGE - 10)  # the trailer's magic
    refused(path, page_off(page))
    repaired(path)
    items, head = read_all(path)
    assert tombstones(items) == [lost]
    assert records(items) == {q: payload(q) for q in range(1, 7) if not lost[0] <= q <= lost[1]}
    assert head == max(6, lost[1])


def test_BDEV_25_previous_lap_pages(tmp_path: Path) -> None:
    """BDEV-22 (b)'s refusals, repaired: after a wrap, damaged pages 4 and 7 of the previous
    lap (seqs 5 and 8) become tombstones for exactly those seqs; the older records stay
    (the floor would have taken seq 4 with them)."""
    path = tmp_path / "r.img"
    store = ring(path)
    append(store.topic("t", durability="fsync"), 11)  # lap 1: pages 0..2; lap 0: pages 3..7
    hooks(store, Abandon).abandon()
    flip(path, page_off(4) + 6)
    flip(path, page_off(7) + 6)
    refused(path, page_off(4))
    repaired(path)
    items, head = read_all(path)
    assert tombstones(items) == [(1, 3), (5, 5), (8, 8)] and head == 11  # 1..3: overwritten
    assert records(items) == {q: payload(q) for q in (4, 6, 7, 9, 10, 11)}


def test_BDEV_26_damaged_newest_slot_with_pages_after_it(tmp_path: Path) -> None:
    """BDEV-26, BDEV-22 (d): the newest slot (a registration) is damaged and a page written
    after it names its generation. Repair writes a slot from the older one with a generation
    above every one seen, over the damaged slot (never over the usable one), and says what only
    the damaged slot held is gone: here the registration. Every record stays."""
    path = tmp_path / "r.img"
    store = ring(path)
    t = store.topic("t", durability="fsync")
    append(t, 3)
    t.subscribe("s")
    append(t)  # page 3 carries the registration's generation
    hooks(store, Abandon).abandon()
    image = path.read_bytes()
    gens = [decode_slot(image[i * SLOT_BYTES : (i + 1) * SLOT_BYTES], i).generation for i in (0, 1)]
    damaged = slot_index(max(gens)) * SLOT_BYTES
    flip(path, damaged + 60)
    refused(path, damaged)
    actions = repaired(path)
    assert actions[0].startswith(f"metadata slot {damaged // SLOT_BYTES} (offset {damaged})")
    assert "registrations" in actions[0]
    image = path.read_bytes()
    new = decode_slot(image[damaged : damaged + SLOT_BYTES], damaged // SLOT_BYTES)
    assert new.generation == max(gens) + 2  # above every generation, in the damaged one's slot
    items, head = read_all(path)
    assert records(items) == {q: payload(q) for q in (1, 2, 3, 4)} and head == 4
    with tidelog.open(f"blockdev://{path}") as store:
        assert store.topic("t").subscribers() == []


def test_BDEV_25_slot_without_a_position(tmp_path: Path) -> None:
    """BDEV-25, BDEV-4: a slot written before slots recorded their position proves only its
    durable head (seq 5); with the head page damaged, repair takes the page after the newest
    readable one as written and bounds the loss by it."""
    path = tmp_path / "r.img"
    with ring(path) as store:
        append(store.topic("t", durability="fsync"), 5)
    image = bytearray(path.read_bytes())
    gens = [decode_slot(image[i * SLOT_BYTES : (i + 1) * SLOT_BYTES], i) for i in (0, 1)]
    slot = max(gens, key=lambda s: s.generation)
    off = slot_index(slot.generation) * SLOT_BYTES
    body = {k: v for k, v in slot.body.items() if k not in ("next", "lap")}
    image[off : off + SLOT_BYTES] = encode_slot(dataclasses.replace(slot, body=body))
    path.write_bytes(bytes(image))
    flip(path, page_off(4) + 3)
    with pytest.raises(Corrupt, match=r"seq 5 as written"):
        tidelog.open(f"blockdev://{path}")
    repaired(path)
    items, head = read_all(path)
    assert records(items) == {q: payload(q) for q in (1, 2, 3, 4)}
    assert tombstones(items) == [(5, 4 + MOST)] and head == 4 + MOST


def test_BDEV_25_a_loss_overwritten_by_the_writer_stays_a_tombstone(tmp_path: Path) -> None:
    """BDEV-25, BDEV-4, TMB-3: after repair the writer wraps and overwrites the LOSS page, and
    the store closes right then (the lost seq is above the floor, nothing live is below it).
    The slot must not record the lost seq as trimmed: a reopen would read it silently (it used
    to: the slot's trimmed ranges covered every seq that was not live)."""
    path = tmp_path / "r.img"
    with ring(path) as store:
        append(store.topic("t", durability="fsync"), 6)
    flip(path, page_off(2) + 7)
    repaired(path)
    with tidelog.open(f"blockdev://{path}") as store:
        t = store.topic("t")
        append(t, 5)  # pages 6, 7, then 0, 1 and 2 (the LOSS page) of the next lap
        assert store.describe()["next_page"] == 3
    items, head = read_all(path)
    assert head == 11 and items[0] == Tombstone(1, 3)
    assert records(items) == {q: payload(q) for q in range(4, 12)}
    assert (slot_body(path)["state"] or {})["trimmed"] == []  # type: ignore[index]


# -- refusals (BDEV-27) --------------------------------------------------------------------
def test_BDEV_27_no_usable_slot_is_refused(tmp_path: Path) -> None:
    """BDEV-27: with both slots damaged nothing names the ring id or the topic's config:
    repair refuses, writes nothing, leaves no quarantine file."""
    path = tmp_path / "r.img"
    with ring(path) as store:
        append(store.topic("t"), 3)
    flip(path, 60)
    flip(path, SLOT_BYTES + 60)
    image = path.read_bytes()
    with pytest.raises(Corrupt, match=r"no usable metadata slot.*\(BDEV-27\)"):
        repair_ring(OsFS(), str(path))
    assert path.read_bytes() == image and list(tmp_path.iterdir()) == [path]


def test_BDEV_27_nothing_bounds_the_lost_seqs(tmp_path: Path) -> None:
    """BDEV-27: a wrapped ring whose every page is damaged: no readable page before or after
    them tells which seqs they held, so repair refuses at the first of them."""
    path = tmp_path / "r.img"
    with ring(path) as store:
        append(store.topic("t"), 11)
    damaged = bytearray(path.read_bytes())
    for i in range(8):
        damaged[page_off(i) + PAGE - 10] ^= 1
    path.write_bytes(bytes(damaged))
    with pytest.raises(Corrupt, match=r"no readable page before or after them.*\(BDEV-27\)"):
        repair_ring(OsFS(), str(path))
    assert path.read_bytes() == bytes(damaged)


def test_BDEV_27_a_page_numbered_for_another_lap_is_refused(tmp_path: Path) -> None:
    """BDEV-27, RING-1: a page whose checksum matches but whose number is not its lap's was
    written so (no bit flip makes a valid CRC): repair cannot place it and refuses."""
    path = tmp_path / "r.img"
    with ring(path) as store:
        append(store.topic("t"), 6)
    image = bytearray(path.read_bytes())
    ring_id = decode_slot(bytes(image[:SLOT_BYTES]), 0).ring_id
    raw = bytes(image[page_off(2) : page_off(3)])
    h = decode_trailer(raw, ring_id)
    assert h is not None and not h.flags & PAGE_LOSS
    wrong = dataclasses.replace(h, page_seq=8 - 2)  # lap 1's number for page 2
    image[page_off(2) : page_off(3)] = encode_page(PAGE, ring_id, raw[: h.used], wrong)
    path.write_bytes(bytes(image))
    with pytest.raises(Corrupt):
        tidelog.open(f"blockdev://{path}")
    with pytest.raises(Corrupt, match=r"offset 5120: page 2 is numbered 6.*\(BDEV-27\)"):
        repair_ring(OsFS(), str(path))


def test_BDEV_24_repair_takes_the_lock_and_leaves_a_ring_that_opens_alone(tmp_path: Path) -> None:
    """BDEV-24, BDEV-11: repair beside an open store is `locked`; a ring that opens is not
    touched (nothing to repair); a missing image is io_error and nothing is created."""
    path = tmp_path / "r.img"
    store = ring(path)
    append(store.topic("t"), 3)
    with pytest.raises(Locked):
        repair_ring(OsFS(), str(path))
    store.close()
    image = path.read_bytes()
    report = repair_ring(OsFS(), str(path))
    assert not report.changed and report.quarantine is None and path.read_bytes() == image
    with pytest.raises(StorageError, match="does not exist"):
        repair_ring(OsFS(), str(tmp_path / "missing.img"))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r.img"]


# -- a crash at every point of a repair ------------------------------------------------------
def test_BDEV_24_a_crash_at_any_point_of_a_repair(tmp_path: Path) -> None:
    """BDEV-24: a power loss at every point of a repair (torn sectors included) leaves a ring
    that recovery refuses or that opens repaired; repairing it again gives the same records:
    seqs 1, 2, 4..6 intact, seq 3 behind a tombstone, nothing handed out again."""
    fs = RecordingFS()
    path = "/r.img"
    store = open_store(fs, path, FakeClock(1000), size=4096 + 8 * PAGE, page_size=PAGE, topic="t")
    append(store.topic("t", durability="fsync"), 6)
    store.close()
    h = fs.open(path, create=False)
    raw = bytearray(h.pread(PAGE, page_off(2)))
    raw[7] ^= 0x10
    h.pwrite(bytes(raw), page_off(2))
    h.fsync()
    h.close()
    start = len(fs.history)
    repair_ring(fs, path)
    states = 0
    for at in range(start, len(fs.history) + 1):
        for state in fs.crash_states(at=at, torn="garbage", mode="sample", seed=at, limit=40):
            states += 1
            try:
                open_store(state, path).close()
            except Corrupt:
                assert repair_ring(state, path).changed, state.description
            recovered = open_store(state, path)
            try:
                t = recovered.topic("t", create=False)
                items = list(t.read(0, 100))
                assert records(items) == {q: payload(q) for q in (1, 2, 4, 5, 6)}, state
                assert tombstones(items) == [(3, 3)] and t.state().head_seq == 6
            finally:
                recovered.close()
    assert states > 10


# -- the command line ----------------------------------------------------------------------
def test_BDEV_24_the_repair_command(tmp_path: Path) -> None:
    """BDEV-24, CLI-1: `tidelog repair blockdev://...` says what it would do with --dry-run
    (exit 0, nothing written), repairs (exit 0: verify finds no error) naming the quarantine
    file in --quarantine-dir, finds nothing to do the second time; a refusal is exit 2 with
    `corrupt` on stderr; --quarantine-dir is refused for a file:// store."""
    path = tmp_path / "r.img"
    with ring(path) as store:
        append(store.topic("t"), 6)
    flip(path, page_off(2) + 7)
    image = path.read_bytes()
    uri = f"blockdev://{path}"
    run = CliRunner()
    result = run.invoke(main, ["repair", uri, "--dry-run"])
    assert result.exit_code == 0, result.output
    assert result.stdout.startswith("would do: page 2 (offset 5120)")
    assert path.read_bytes() == image
    keep = tmp_path / "kept"
    keep.mkdir()
    result = run.invoke(main, ["repair", uri, "--quarantine-dir", str(keep)])
    assert result.exit_code == 0, result.output
    [copy] = list(keep.iterdir())
    assert copy.name.startswith("r.img.quarantine-")
    assert f"overwritten bytes copied to {copy}" in result.stdout
    assert run.invoke(main, ["repair", uri]).stdout == "nothing to repair\n"
    assert run.invoke(main, ["verify", str(path), "--json"]).exit_code == 0
    flip(path, 60)
    flip(path, SLOT_BYTES + 60)
    result = run.invoke(main, ["repair", uri])
    assert result.exit_code == 2 and result.stderr.startswith("tidelog: error: corrupt: ")
    result = run.invoke(main, ["repair", f"file://{tmp_path}/s", "--quarantine-dir", "x"])
    assert result.exit_code == 2 and "bad_argument" in result.stderr
    assert result.stderr.count("\n") == 1
