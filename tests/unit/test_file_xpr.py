"""Cross-process access to a file store (spec/FORMATS.md XPR-1..XPR-4): read-only views that
follow the writer, and requests another process hands to the writer."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.ipc as ipc
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import tidelog
from tidelog.backends.file import requests
from tidelog.hooks import Checkpoint, hooks


def stage(path: Path, rows: list[tuple[bytes, str | None, str | None]]) -> str:
    table = pa.table(
        {
            "payload": pa.array([r[0] for r in rows], pa.binary()),
            "tag": pa.array([r[1] for r in rows], pa.string()),
            "node": pa.array([r[2] for r in rows], pa.string()),
        }
    )
    with path.open("wb") as f, ipc.new_stream(f, table.schema) as writer:
        writer.write_table(table)
    return str(path)


def test_XPR_1_read_only_view_follows_the_writer(tmp_path: Path) -> None:
    """XPR-1: no lock taken, nothing written, refresh catches up (also across a checkpoint)."""
    root = tmp_path / "s"
    writer = tidelog.open(f"file://{root}?background=false")
    t = writer.topic("ev")
    t.append_many([b"a", b"b"])

    def files() -> list[tuple[Path, int]]:
        return sorted(
            (p.relative_to(root), p.stat().st_size) for p in root.rglob("*") if p.is_file()
        )

    before = files()
    view = tidelog.open(f"file://{root}?readonly=true")
    vt = view.topic("ev", create=False)
    assert [r.payload for r in vt.read()] == [b"a", b"b"]  # type: ignore[union-attr]
    for bad in (
        lambda: vt.append(b"x"),
        lambda: view.topic("new"),
        lambda: vt.delete(1),
        lambda: view.drop_topic("ev"),
        lambda: vt.subscribe("s"),
    ):
        with pytest.raises(tidelog.ReadOnly):
            bad()
    assert files() == before  # the view wrote nothing (the writer was idle meanwhile)
    t.append(b"c")
    assert vt.state().head_seq == 2  # a view is a snapshot until refreshed
    view.refresh()
    assert vt.state().head_seq == 3
    hooks(writer, Checkpoint).checkpoint()  # new snapshot; WAL retired
    t.append(b"d")
    view.refresh()
    assert [r.payload for r in vt.read()] == [b"a", b"b", b"c", b"d"]  # type: ignore[union-attr]
    view.close()
    writer.close()
    with pytest.raises(tidelog.StorageError, match="not a tidelog store"):
        tidelog.open(f"file://{tmp_path / 'empty'}?readonly=true")


def test_XPR_2_commit_request_applied_by_the_owning_process(tmp_path: Path) -> None:
    """XPR-2: a commit request from another process trims through the owner's subscriber."""
    root = tmp_path / "s"
    with tidelog.open(f"file://{root}?progress_flush_ms=10") as owner:
        t = owner.topic("ev")
        t.append_many([b"1", b"2", b"3", b"4"])
        code = (
            "import sys; from tidelog.backends.file import requests; "
            "print(requests.call(sys.argv[1], {'op': 'commit', 'topic': 'ev', "
            "'subscriber': 'spark', 'seq': 3, 'start': 'earliest'}))"
        )
        out = subprocess.run(
            [sys.executable, "-c", code, str(root)],
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        ).stdout
        assert "'ok': True" in out and "'hwm': 3" in out
        assert t.subscriber("spark").hwm == 3
        assert [r.payload for r in t.read()] == [b"4"]  # type: ignore[union-attr]
        result = requests.call(
            str(root), {"op": "commit", "topic": "nope", "subscriber": "s", "seq": 1}
        )
        assert result == {
            "ok": False,
            "code": "no_such_topic",
            "message": "topic 'nope' does not exist",
        }
    assert not list((root / "requests").glob("*.req"))


def test_XPR_3_requests_apply_without_an_owner(tmp_path: Path) -> None:
    """XPR-3: with no writer running, the requester opens the store and applies its request;
    a request left pending is applied by the next opener."""
    root = tmp_path / "s"
    with tidelog.open(f"file://{root}") as s:
        s.topic("ev").append_many([b"1", b"2"])
    assert requests.call(
        str(root), {"op": "subscribe", "topic": "ev", "subscriber": "x", "start": "earliest"}
    )["ok"]
    rid = requests.submit(
        tidelog.fsio.OsFS(), str(root), {"op": "commit", "topic": "ev", "subscriber": "x", "seq": 2}
    )
    with tidelog.open(f"file://{root}") as s:
        assert s.topic("ev").subscriber("x").hwm == 2
    assert requests.outcome(tidelog.fsio.OsFS(), str(root), rid) == {
        "ok": True,
        "acked": 2,
        "hwm": 2,
    }


def test_XPR_4_staged_ingest_is_atomic_and_idempotent(tmp_path: Path) -> None:
    """XPR-4, TOP-11: staged rows appear together, once per producer sequence."""
    root = tmp_path / "s"
    files = [
        stage(tmp_path / "a.arrow", [(b"x", "t1", None), (b"y", None, "n")]),
        stage(tmp_path / "b.arrow", [(b"z", "t2", None)]),
    ]
    body = {
        "op": "ingest",
        "topic": "ev",
        "config": {"durability": "fsync"},
        "files": files,
        "producer": ["job-7", 1],
    }
    assert requests.call(str(root), body) == {"ok": True, "seqs": [1, 3]}
    assert requests.call(str(root), body) == {"ok": True, "seqs": []}  # a replayed commit
    too_big = dict(body, producer=["job-8", 1], config={"durability": "fsync"})
    with tidelog.open(f"file://{root}") as s:
        s.topic("capped", cap_records=2, discard="reject")
    assert requests.call(str(root), dict(too_big, topic="capped"))["code"] == "too_large"
    with tidelog.open(f"file://{root}") as s:
        got = [(r.payload, r.tag, r.node) for r in s.topic("ev").read()]  # type: ignore[union-attr]
        assert got == [(b"x", "t1", None), (b"y", None, "n"), (b"z", "t2", None)]
        assert s.topic("capped").state().head_seq == 0  # nothing partial
    assert os.path.exists(files[0])  # the requester owns its staged files


def test_XPR_1_view_replays_per_record_labels_of_append_records(tmp_path: Path) -> None:
    """XPR-1, TOP-5: a read-only view replays the writer's WAL; an append_records batch keeps
    each record's own tag and node (regression: every record once got the first one's)."""
    root = tmp_path / "s"
    with tidelog.open(f"file://{root}") as store:
        store.topic("ev").append_records([(b"a", None, "n1"), (b"b", "x", "y"), (b"c", "x", "y")])
        with tidelog.open(f"file://{root}?readonly=true") as view:
            items = view.topic("ev", create=False).read()
    assert [(r.payload, r.tag, r.node) for r in items] == [  # type: ignore[union-attr]
        (b"a", None, "n1"),
        (b"b", "x", "y"),
        (b"c", "x", "y"),
    ]


# -- a view's WAL reads (XPR-1): only what the scan reaches, with the same result ---------------
_SID = bytes(range(16))


@st.composite
def _wal_files(draw: st.DrawFn) -> tuple[bytes, list[int]]:
    """A WAL file (version 2, or 3 with frames seeded by its gen, WAL-15): header, frames of
    mixed sizes (labelled or not), then a tail that is zeros (preallocation), garbage, a torn
    frame, stale frames of an older gen (a recycled file), or FILE_END and stale frames after
    it; and the frame offsets (replay start points)."""
    from tidelog.backends.file.format import wal as walfmt

    version = draw(st.sampled_from((2, 3)))
    gen = 7
    seed = gen if version == 3 else 0
    body = walfmt.encode_header(gen, 0, 1, 0, _SID, version=version)
    starts = []
    for seq in range(1, draw(st.integers(0, 6)) + 1):
        starts.append(len(body))
        size = draw(st.sampled_from((0, 1, 30, 200, 1000)))
        tag = draw(st.sampled_from((None, "t")))
        body += walfmt.encode_append(
            1, seq, 5, tag, None, bytes([seq]) * size, batch_end=True, durable=True, seed=seed
        )
    starts.append(len(body))
    tail = draw(st.sampled_from(("zeros", "garbage", "torn", "stale", "end")))
    frame = walfmt.encode_append(9, 99, 5, None, None, b"x" * 300, batch_end=True, durable=True)
    if tail == "garbage":
        body += draw(st.binary(min_size=1, max_size=40))
    elif tail == "torn":
        frame = walfmt.reseed(frame, seed)
        body += frame[: draw(st.integers(1, len(frame) - 1))]
    elif tail == "stale":  # complete frames of gens before this file's
        body += walfmt.reseed(frame, gen - 1) + walfmt.reseed(frame, gen - 2)
    elif tail == "end":
        body += walfmt.encode_file_end(seed) + walfmt.reseed(frame, seed)
    return body + bytes(draw(st.integers(0, 500))), starts


@given(wal=_wal_files(), chunk=st.integers(1, 700), data=st.data())
@settings(max_examples=300, deadline=None)
def test_XPR_1_a_view_scans_a_wal_file_as_a_whole_file_scan_would(
    tmp_path_factory: pytest.TempPathFactory,
    wal: tuple[bytes, list[int]],
    chunk: int,
    data: st.DataObject,
) -> None:
    """XPR-1: a read-only view reads a WAL file in windows from where it resumes (never the
    whole preallocated file); whatever the window size, frames, end and status are exactly
    those of scanning the whole file (frames longer than a window, torn and garbage tails)."""
    from tidelog.backends.file import recovery
    from tidelog.backends.file.format import wal as walfmt
    from tidelog.fsio import OsFS

    body, starts = wal
    start = data.draw(st.sampled_from(starts))
    path = tmp_path_factory.mktemp("wal") / "w"
    path.write_bytes(body)
    expected = walfmt.scan_file(body, start)
    h = OsFS().open_read(str(path))
    old = recovery._COPY_CHUNK
    recovery._COPY_CHUNK = chunk
    try:
        got, _ = recovery._scan_copied(h, str(path), start, _SID, walfmt.decode_header(body).gen)
    finally:
        recovery._COPY_CHUNK = old
        h.close()
    assert got == expected


def test_XPR_1_view_reads_a_record_longer_than_its_read_window(tmp_path: Path) -> None:
    """XPR-1: a WAL record of several MiB (longer than the 1 MiB read window) reaches a view
    byte for byte, and a refresh after it finds the next record."""
    root = tmp_path / "s"
    big = os.urandom(3 << 20)
    with tidelog.open(f"file://{root}?background=false") as writer:
        t = writer.topic("ev")
        t.append(b"small")
        t.append(big)
        view = tidelog.open(f"file://{root}?readonly=true")
        vt = view.topic("ev", create=False)
        assert [r.payload for r in vt.read()] == [b"small", big]  # type: ignore[union-attr]
        t.append(b"after")
        view.refresh()
        assert [r.payload for r in vt.read(after=2)] == [b"after"]  # type: ignore[union-attr]
        view.close()


def test_XPR_2_two_threads_of_the_owner_never_apply_one_request_twice(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """XPR-2: the maintenance tick and a direct ``apply_requests`` (an instances store's
    drop does one, INST-21) run in two threads of the owner; both listing the same pending
    request made both apply it and write its `.done` through one `.tmp` name, and the loser's
    rename failed with ENOENT and poisoned the store. Here both threads are held after
    listing until the other lists too (or 0.5 s): one applies, the other finds nothing."""
    import threading

    from tidelog.backends.file.store import FileBackend

    root = tmp_path / "s"
    with tidelog.open(f"file://{root}?background=false") as s:
        s.topic("ev").append_many([b"1", b"2", b"3"])
        fs, owner = tidelog.fsio.OsFS(), hooks(s, FileBackend)
        rid = requests.submit(
            fs, str(root), {"op": "commit", "topic": "ev", "subscriber": "x", "seq": 2,
                            "start": "earliest"},
        )  # fmt: skip
        listed = threading.Barrier(2, timeout=0.5)
        real = requests.pending

        def pending(fs_: object, root_: str) -> list[tuple[str, dict[str, object] | None]]:
            out = real(fs_, root_)  # type: ignore[arg-type]
            with contextlib.suppress(threading.BrokenBarrierError):
                listed.wait()
            return out

        monkeypatch.setattr(requests, "pending", pending)
        applied: list[int] = []
        failed: list[BaseException] = []

        def run() -> None:
            try:
                applied.append(owner.apply_requests())
            except BaseException as exc:
                failed.append(exc)

        threads = [threading.Thread(target=run) for _ in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=30)
        assert failed == [] and sorted(applied) == [0, 1], (failed, applied)
        assert owner.failure() is None
        assert s.topic("ev").subscriber("x").hwm == 2
    assert requests.outcome(fs, str(root), rid) == {"ok": True, "acked": 2, "hwm": 2}
