"""Sealing the tails in memory from their WAL frames, in the seal worker process or in the writer
(spec/FORMATS-wal-tail.md WTAIL-6..WTAIL-9): the same records as sealing from memory, what a
changed frame, a dead worker, a full disk and a killed writer do."""

from __future__ import annotations

import gc
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import tidelog
from tidelog.backends.file import sealer
from tidelog.backends.file.checkpoint import SealRange
from tidelog.backends.file.format import wal as walfmt
from tidelog.clock import FakeClock
from tidelog.errors import Corrupt, Locked, StorageError
from tidelog.fsio import OsFS
from tidelog.records import Record, Tombstone

# every checkpoint after the first seals from the WAL; small segments and WAL files, so ranges
# are cut at both
LOCATE = "background=false&seal_worker_bytes=0&segment_max_records=700&wal_file_bytes=256KiB"


def _workload(store: tidelog.Store, rounds: int) -> None:
    """Batches, single appends, labels, removals and a bundle-free mix of classes, with a
    checkpoint after each round."""
    t = store.topic("t", durability="disk")
    u = store.topic("u", durability="fsync")
    m = store.topic("m", durability="memory")
    for r in range(rounds):
        seqs = t.append_many([b"batch-%d-%d" % (r, i) for i in range(1000)])
        for i in range(300):
            u.append(b"single-%d-%d" % (r, i) * (1 + i % 7))
        m.append_many([b"tagged-%d" % r] * 40, tag=f"tag{r}", node="n1")
        m.append_records([(b"rec-%d" % i, f"k{i % 3}", None) for i in range(20)])
        t.delete(before_seq=seqs[500])  # a dead prefix ending inside a batch's frame
        m.delete(tag=f"tag{r}") if r % 2 else None  # dead slots inside the tail
        store._backend.checkpoint()  # type: ignore[attr-defined]


def _records(topic: tidelog.Topic) -> list[Record]:
    return [r for r in topic.read(0, 1 << 20) if isinstance(r, Record)]


def _contents(store: tidelog.Store) -> dict[str, list[Any]]:
    """Each topic's records and its totals (TOP-2: count and bytes, which the swap of sealed
    segments for the tail keeps from the segments' own lengths)."""
    return {
        name: [store.topic(name).state().to_dict()]
        + [(r.seq, r.tag, r.node, r.payload) for r in _records(store.topic(name))]
        for name in ("t", "u", "m")
    }


def _close_and_reopen(store: tidelog.Store, root: Path, t_records: int = 500) -> None:
    """Close ``store`` and open it again: the same records (``t_records`` of ``t`` left)."""
    expected = _contents(store)
    store.close()
    again = tidelog.open(f"file://{root}?background=false")
    try:
        assert _contents(again) == expected and len(expected["t"]) == t_records + 1
    finally:
        again.close()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


@pytest.fixture()
def jobs() -> Iterator[list[int]]:
    """The seal worker's jobs, each as its number of ranges."""
    calls: list[int] = []
    run = sealer.SealWorker.run

    def counted(self: sealer.SealWorker, job: sealer.SealJob) -> Any:
        calls.append(len(job.ranges))
        return run(self, job)

    sealer.SealWorker.run = counted  # type: ignore[method-assign]
    try:
        yield calls
    finally:
        sealer.SealWorker.run = run  # type: ignore[method-assign]


def test_WTAIL_6_WTAIL_8_checkpoints_seal_in_the_worker(tmp_path: Path, jobs: list[int]) -> None:
    """The same workload on a store sealing from memory and on one sealing from the WAL in the
    worker (from its first checkpoint: a new store holds no record it did not append): the
    same records and totals before and after a reopen, and the worker ends with the store."""
    plain = tidelog.open(f"file://{tmp_path}/plain?background=false&seal_worker=false")
    located = tidelog.open(f"file://{tmp_path}/located?{LOCATE}")
    backend: Any = located._backend
    _workload(plain, 4)
    _workload(located, 4)
    assert jobs == [3, 3, 3, 3]
    pid = backend._sealer.pid
    assert pid is not None and _alive(pid) and backend.warnings == []
    # FLT-6: describe() names the worker while it runs, and none on a store without one
    assert located.describe()["checkpoint"]["seal_worker_pid"] == pid  # type: ignore[index]
    assert plain.describe()["checkpoint"]["seal_worker_pid"] is None  # type: ignore[index]
    assert _contents(plain) == _contents(located)
    expected = _contents(plain)
    plain.close()
    located.close()
    assert not _alive(pid)  # WTAIL-8: close waits for it
    again = tidelog.open(f"file://{tmp_path}/located?background=false")
    try:
        assert _contents(again) == expected
    finally:
        again.close()


def test_WTAIL_6_after_a_crash_recovered_topics_seal_from_memory_first(
    tmp_path: Path, jobs: list[int]
) -> None:
    """Reopened after a crash, a topic whose records replay located in the WAL (WTAIL-1) is
    sealed in the writer at the first checkpoint (WTAIL-4, its records in memory with them);
    the others, and from the second checkpoint on every topic, in the worker."""
    store = tidelog.open(f"file://{tmp_path}/s?{LOCATE}")
    _workload(store, 1)
    store.topic("t").append_many([b"unsealed-%d" % i for i in range(100)])
    store.flush()
    store._backend.abandon()  # type: ignore[attr-defined]  # the process dies here
    jobs.clear()
    store = tidelog.open(f"file://{tmp_path}/s?{LOCATE}")
    backend: Any = store._backend
    for round_ in range(2):
        store.topic("t").append_many([b"after-%d" % round_] * 10)
        store.topic("u").append(b"after-%d" % round_)
        backend.checkpoint()
    assert jobs == [1, 2]  # u alone, then t and u
    payloads = [r.payload for r in _records(store.topic("t"))]
    assert (
        payloads[-120:]
        == [b"unsealed-%d" % i for i in range(100)] + [b"after-0"] * 10 + [b"after-1"] * 10
    )
    _close_and_reopen(store, tmp_path / "s", 620)


def test_WTAIL_6_RTR_5_a_loss_in_the_tail_is_sealed_from_memory(tmp_path: Path) -> None:
    """Found by the conformance routers level on the recording FS with seal_worker_bytes=0
    (seed 33): a router's copy too large for its full dest (cap 4 B, backpressure) is a loss
    (RTR-5): the dest's head is raised over a seq no APPEND frame carries. Sealing that tail
    from the WAL failed the close with Corrupt (WTAIL-7); it is sealed from memory instead."""
    clock = FakeClock(1_000_000)
    store = tidelog.open(f"file://{tmp_path}/s?{LOCATE}", clock=clock)
    cfg: dict[str, Any] = dict(
        durability="disk", ttl_ms=5, discard="old", retention="backpressure", trim="acked"
    )
    source = store.topic("t0", **cfg)
    store.topic("t1", cap_bytes=4, **cfg)
    store.router("r0", source="t0", dest="t1")
    for n in range(1, 5):
        source.append(bytes([n]) * n)
    source.append(b"x" * 8)  # its copy cannot fit: seq 5 of t1 is lost
    items = store.topic("t1").read(0, 100)
    assert items[-1] == Tombstone(5, 5)
    store.close()
    again = tidelog.open(f"file://{tmp_path}/s?background=false", clock=clock)
    try:
        assert again.topic("t1").read(0, 100) == items
        assert [r.payload for r in _records(again.topic("t0"))][-1] == b"x" * 8
    finally:
        again.close()


def test_WTAIL_6_small_checkpoints_and_the_option_keep_sealing_in_memory(tmp_path: Path) -> None:
    """Below ``seal_worker_bytes`` of WAL since the last checkpoint, or with
    ``seal_worker=false``, no worker is started."""
    for query in ("background=false", "background=false&seal_worker=false&seal_worker_bytes=0"):
        store = tidelog.open(f"file://{tmp_path}/{len(query)}?{query}")
        _workload(store, 3)
        assert store._backend._sealer is None  # type: ignore[attr-defined]
        store.close()
    with pytest.raises(tidelog.BadOption, match="seal_worker_bytes"):
        tidelog.open(f"file://{tmp_path}/x?seal_worker_bytes=65GiB")


def test_WTAIL_6_segments_sealed_from_the_wal_are_swapped_in_undecoded(tmp_path: Path) -> None:
    """The swap never decodes a WAL-sealed segment's index (its columns: milliseconds of GIL
    per 100k records that appenders would wait for): a tail the lane's single appends left
    unfolded is folded from its payloads, and a batch folds what the lane appended before it.
    The topic's totals agree either way (TOP-2)."""
    store = tidelog.open(f"file://{tmp_path}/s?{LOCATE}")
    try:
        t = store.topic("t", durability="fsync")
        log = store._backend.topics["t"].log  # type: ignore[attr-defined]
        t.append_many([b"x" * 10] * 5)
        store._backend.checkpoint()  # type: ignore[attr-defined]  # then: sealed from the WAL
        expect = 50
        for r in range(3):
            for i in range(40):
                t.append(b"single-%d-%d" % (r, i))  # the lane: not folded
                expect += len(b"single-%d-%d" % (r, i))
            assert log._folded < len(log.payloads)
            batch = [b"y%d-%d" % (r, i) for i in range(700)]
            t.append_many(batch)
            expect += sum(map(len, batch))
            assert log._folded == len(log.payloads)  # the batch folded the lane's records
        t.append(b"last")  # left unfolded for the swap to fold
        expect += 4
        store._backend.checkpoint()  # type: ignore[attr-defined]
        sealed = log.chunks
        assert len(sealed) >= 3
        assert all(c.index._columns is None for c in sealed[1:])  # the WAL-sealed ones
        state = t.state()
        assert (state.count, state.bytes) == (5 + 3 * 740 + 1, expect)
    finally:
        store.close()
    again = tidelog.open(f"file://{tmp_path}/s?background=false")
    try:
        state = again.topic("t").state()
        assert (state.count, state.bytes) == (5 + 3 * 740 + 1, expect)
    finally:
        again.close()


def test_WTAIL_7_slots_dead_at_the_capture_are_sealed_as_empty_placeholders(
    tmp_path: Path,
) -> None:
    """A record removed while in the tail is not written into the segment sealed from the
    WAL (its slot an empty placeholder), however the WAL files cut the range into chunks; the
    removal holds after reopening."""
    root = tmp_path / "s"
    store = tidelog.open(f"file://{root}?{LOCATE}")
    secret = b"SECRET-%d-"
    try:
        t = store.topic("t", durability="fsync")
        t.append(b"first")
        store._backend.checkpoint()  # type: ignore[attr-defined]  # then: sealed from the WAL
        for r in range(6):  # 6 x ~60 KiB: several 256 KiB WAL files
            t.append_many([b"keep-%d-%d" % (r, i) * 20 for i in range(300)])
            t.append_many([secret % r * 50] * 3, tag=f"gone{r}")
        for r in range(6):
            assert t.delete(tag=f"gone{r}") == 3
        store._backend.checkpoint()  # type: ignore[attr-defined]
        assert store._backend._sealer is not None  # type: ignore[attr-defined]
    finally:
        store.close()
    data = b"".join(p.read_bytes() for p in root.rglob("seg-*.data"))
    assert b"keep-5-299" in data and b"SECRET-" not in data
    again = tidelog.open(f"file://{root}?background=false")
    try:
        got = _records(again.topic("t"))
        assert len(got) == 1 + 6 * 300 and not any(b"SECRET" in r.payload for r in got)
    finally:
        again.close()


def test_WTAIL_7_a_frame_changed_under_the_store_fails_the_checkpoint(tmp_path: Path) -> None:
    """A byte of a frame to seal flipped in the WAL file: the range is not found whole, the
    checkpoint fails with Corrupt naming WTAIL-7 and writes no snapshot; once the byte is
    back, a reopen has every record."""
    store = tidelog.open(f"file://{tmp_path}/s?{LOCATE}")
    backend: Any = store._backend
    _workload(store, 1)
    t = store.topic("t")
    t.append_many([b"to-seal-%d" % i for i in range(50)])
    store.flush()
    snapshot = backend.snapshot_n
    shard = backend.shards[0]
    path = os.path.join(shard.dir, sorted(os.listdir(shard.dir))[-1])
    with open(path, "rb") as f:
        image = f.read()
    at = image.rindex(b"to-seal-25")
    with open(path, "r+b") as f:
        f.seek(at)
        f.write(b"X")
    with pytest.raises(Corrupt, match="WTAIL-7"):
        backend.checkpoint()
    assert backend.snapshot_n == snapshot
    with pytest.raises(StorageError):
        t.append(b"poisoned")  # FLT-6
    with open(path, "r+b") as f:
        f.seek(at)
        f.write(b"t")
    with pytest.raises(StorageError):
        store.close()
    again = tidelog.open(f"file://{tmp_path}/s?background=false")
    try:
        seqs = [r.payload for r in _records(again.topic("t"))]
        assert seqs[-50:] == [b"to-seal-%d" % i for i in range(50)]
    finally:
        again.close()


def test_WTAIL_7_a_failed_seal_leaves_no_wal_file_mapped(tmp_path: Path) -> None:
    """``seal_wal`` (the writer's, or the worker's) given a range that a frame overruns (its
    records go past the captured head): Corrupt naming WTAIL-7, and no WAL file stays mapped
    while the error is alive, with no garbage collection run (FLT-7: nothing of the failure
    holds a view of the map)."""
    store = tidelog.open(f"file://{tmp_path}/s?background=false")
    t = store.topic("t", durability="disk")
    t.append_many([b"r%d" % i for i in range(50)])  # one APPEND_BATCH frame: seqs 1..50
    store.flush()
    tid = store._backend.topics["t"].tid  # type: ignore[attr-defined]
    wal = tmp_path / "s" / "wal"
    (name,) = [n for n in os.listdir(wal) if n.endswith(".log")]
    job = sealer.SealJob(
        str(tmp_path / "s"),
        ((str(wal / name), walfmt.HEADER_SIZE, None),),
        (SealRange(tid, 1, 10, False),),
        (100_000, 1 << 26),
    )
    gc.disable()
    try:
        with pytest.raises(Corrupt, match="WTAIL-7") as failed:
            sealer.seal_wal(OsFS(), job)
        with open("/proc/self/maps", encoding="utf-8") as f:
            mapped = [line.split()[-1] for line in f if f" {wal}/" in line]
        assert mapped == [] and "1..50" in failed.value.message
    finally:
        gc.enable()
    store.close()


def test_WTAIL_9_a_worker_killed_between_checkpoints_is_started_again(tmp_path: Path) -> None:
    """The worker SIGKILLed between checkpoints: the next one starts a new worker, without
    a warning, and nothing is lost."""
    store = tidelog.open(f"file://{tmp_path}/s?{LOCATE}")
    backend: Any = store._backend
    _workload(store, 2)
    first = backend._sealer.pid
    os.kill(first, signal.SIGKILL)
    _workload(store, 1)
    second = backend._sealer.pid
    assert second not in (None, first) and _alive(second) and backend.warnings == []
    _close_and_reopen(store, tmp_path / "s")


def test_WTAIL_9_a_worker_dying_in_a_job_leaves_it_to_the_writer(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A worker that dies once it has its job (a command that reads a byte and exits): the
    writer seals in its place, with a warning naming WTAIL-9, and loses nothing; the next
    checkpoint starts a real worker again."""
    store = tidelog.open(f"file://{tmp_path}/s?{LOCATE}")
    backend: Any = store._backend
    real = list(sealer.WORKER)
    dying = [sys.executable, "-c", "import sys; sys.stdin.buffer.read(1); sys.exit(3)"]
    monkeypatch.setattr(sealer, "WORKER", dying)
    _workload(store, 1)
    (warning,) = backend.warnings
    assert "WTAIL-9" in warning and "EOFError" in warning, warning
    monkeypatch.setattr(sealer, "WORKER", real)
    _workload(store, 1)
    assert backend.warnings == [warning] and _alive(backend._sealer.pid)
    _close_and_reopen(store, tmp_path / "s")


def test_WTAIL_9_a_worker_that_cannot_start_is_tried_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No interpreter at the worker's command: one warning, the writer seals every checkpoint
    itself, and nothing is lost."""
    monkeypatch.setattr(sealer, "WORKER", [str(tmp_path / "no-such-python"), "-c", "pass"])
    store = tidelog.open(f"file://{tmp_path}/s?{LOCATE}")
    backend: Any = store._backend
    _workload(store, 3)
    (warning,) = backend.warnings
    assert "cannot start" in warning and "WTAIL-9" in warning, warning
    _close_and_reopen(store, tmp_path / "s")


def test_WTAIL_9_a_worker_that_never_answers_is_given_up_after_three_jobs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A worker that exits at once (as one that cannot import tidelog would): three
    checkpoints warn and seal in the writer, the third says it is not tried again, and later
    ones start no process; nothing is lost."""
    monkeypatch.setattr(sealer, "WORKER", [sys.executable, "-c", "raise SystemExit(1)"])
    store = tidelog.open(f"file://{tmp_path}/s?{LOCATE}")
    backend: Any = store._backend
    _workload(store, 5)
    assert len(backend.warnings) == 3 and "not tried again" in backend.warnings[-1]
    assert backend._sealer.unstartable and backend._sealer.pid is None
    _close_and_reopen(store, tmp_path / "s")


def test_WTAIL_9_garbage_from_the_worker_is_no_answer(tmp_path: Path) -> None:
    """An answer that is not one stops the worker and leaves the job to the writer."""
    worker = sealer.SealWorker(None)
    assert sealer._answer(("ok", "not a SealAnswer"), worker) is None
    assert worker.why.startswith("not an answer")
    with pytest.raises(OSError) as full:
        sealer._answer(("oserror", 28, "No space left on device", "/x/seg.data"), worker)
    assert full.value.errno == 28 and full.value.filename == "/x/seg.data"
    with pytest.raises(Corrupt, match="WTAIL-7"):
        sealer._answer(("error", "Corrupt", "seqs 3..4 (WTAIL-7)"), worker)


def test_WTAIL_8_the_worker_holds_the_lock_until_it_ends(tmp_path: Path) -> None:
    """A writer SIGKILLed while its worker is stopped mid-life: the store stays locked (the
    worker may still write) until the worker ends, which it does by itself once it runs again
    (its pipe closed with the writer); then the store opens with every acknowledged record."""
    root = tmp_path / "s"
    script = textwrap.dedent(
        f"""
        import sys, tidelog
        s = tidelog.open("file://{root}?{LOCATE}")
        t = s.topic("t", durability="fsync")
        for r in range(3):
            t.append_many([b"r%d-%d" % (r, i) for i in range(1000)])
            s._backend.checkpoint()
        t.append(b"last")
        print(s._backend._sealer.pid, flush=True)
        sys.stdin.readline()
        """
    )
    writer = subprocess.Popen(
        [sys.executable, "-c", script], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    worker = 0
    try:
        assert writer.stdout is not None
        worker = int(writer.stdout.readline())
        os.kill(worker, signal.SIGSTOP)
        writer.kill()
        writer.wait(timeout=30)
        with pytest.raises(Locked):
            tidelog.open(f"file://{root}?background=false")
        os.kill(worker, signal.SIGCONT)
        deadline = time.monotonic() + 30
        while _alive(worker) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not _alive(worker)
        store = tidelog.open(f"file://{root}?background=false")
        try:
            payloads = [r.payload for r in _records(store.topic("t"))]
            assert len(payloads) == 3001 and payloads[-1] == b"last"
        finally:
            store.close()
    finally:
        writer.kill()
        writer.wait(timeout=30)
        if worker and _alive(worker):
            os.kill(worker, signal.SIGKILL)


def test_WTAIL_9_a_full_disk_in_the_worker_fails_the_checkpoint_as_io_error(
    tmp_path: Path,
) -> None:
    """A real full disk (8 MiB tmpfs; needs root): the worker's segment write gets ENOSPC,
    the checkpoint fails as the writer's own would (io_error, "disk full", the store
    poisoned, FLT-6), and once there is room again a reopen has every acknowledged record."""
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=8m", "tmpfs", str(mnt)], capture_output=True, text=True
    )
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs here: {mounted.stderr.strip()}")
    try:
        uri = f"file://{mnt}/s?{LOCATE}&wal_recycle=0"
        store = tidelog.open(uri)
        t = store.topic("t", durability="fsync")
        t.append_many([b"first"] * 10)
        store._backend.checkpoint()  # type: ignore[attr-defined]
        acked = t.append_many([b"y" * 1000] * 900)
        filler = mnt / "filler"
        with open(filler, "wb") as f:  # the rest of the disk, but for a few KiB
            try:
                while True:
                    f.write(b"\0" * 65536)
                    f.flush()
            except OSError:
                pass
        with pytest.raises(StorageError) as full:
            store._backend.checkpoint()  # type: ignore[attr-defined]
        assert "disk full" in str(full.value)
        assert store._backend._sealer is not None  # type: ignore[attr-defined]
        with pytest.raises(StorageError):
            store.close()
        filler.unlink()
        again = tidelog.open(f"file://{mnt}/s?background=false")
        try:
            got = _records(again.topic("t"))
            assert [r.seq for r in got][-len(acked) :] == acked and len(got) == 910
        finally:
            again.close()
    finally:
        subprocess.run(["umount", str(mnt)], check=True)


def test_WTAIL_7_WAL_15_a_range_over_several_wal_files(tmp_path: Path) -> None:
    """A tail whose frames span WAL files (256 KiB each here) is sealed as segments cut at
    each file's end too; the first WAL file it starts in is read from the last checkpoint's
    offset, not its start."""
    store = tidelog.open(
        f"file://{tmp_path}/s?background=false&seal_worker_bytes=0&wal_file_bytes=256KiB"
    )
    backend: Any = store._backend
    t = store.topic("t", durability="disk")
    t.append_many([b"a" * 100] * 100)
    backend.checkpoint()
    t.append_many([b"b" * 100] * 100)
    gen = backend.shards[0].gen
    for _ in range(8):
        t.append_many([b"c" * 1000] * 100)
    assert backend.shards[0].gen >= gen + 2
    backend.checkpoint()
    (topic,) = os.listdir(tmp_path / "s" / "topics")
    firsts = sorted(
        int(name[4:-4]) for name in os.listdir(tmp_path / "s" / "topics" / topic)
        if name.startswith("seg-") and name.endswith(".idx")
    )  # fmt: skip
    assert len(firsts) >= 3, firsts  # the first checkpoint's, then one per WAL file at least
    payloads = [r.payload for r in _records(t)]
    assert payloads == [b"a" * 100] * 100 + [b"b" * 100] * 100 + [b"c" * 1000] * 800
    store.close()
