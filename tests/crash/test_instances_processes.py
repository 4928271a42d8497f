"""Real processes on one store of several instances (spec/INSTANCES.md): writers appending at
once each take a slot and every record is read exactly once by the merged read (INST-3,
INST-7, INST-8); a writer SIGKILLed mid-load while the others go on leaves its slot to the
next process, which recovers it with every acknowledged record (INST-3, DUR-2)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections import Counter
from pathlib import Path

import pytest

import tidelog
from tidelog.backends.instances import merged, shared
from tidelog.errors import Locked, NoSuchSubscriber, NoSuchTopic
from tidelog.records import Record

#: What every writer script starts with: argv uri, name, count, batch, go; it opens the store
#: and the topic, prints READY <slot> and waits for the file ``go`` (so every writer holds
#: its slot before any appends).
_START = """
import os, sys, time
import tidelog
from tidelog.errors import NoSuchTopic
uri, name = sys.argv[1], sys.argv[2]
store = tidelog.open(uri)
topic = store.topic("events", durability="fsync")
out = sys.stdout
out.write(f"READY {store.describe()['slot']}\\n")
out.flush()
deadline = time.monotonic() + 60
while not os.path.exists(sys.argv[5]) and time.monotonic() < deadline:
    time.sleep(0.005)
"""
_END = """
store.close()
out.write("DONE\\n")
out.flush()
"""

#: "A <seq> <payload>" per acknowledged record (count 0: forever), then DONE.
WRITER = (
    _START
    + """
count, batch, i = int(sys.argv[3]), int(sys.argv[4]), 0
while count == 0 or i < count:
    payloads = [f"{name}:{i + k}".encode() for k in range(batch)]
    seqs = topic.append_many(payloads) if batch > 1 else [topic.append(payloads[0])]
    out.write("".join(f"A {q} {p.decode()}\\n" for q, p in zip(seqs, payloads)))
    out.flush()
    i += batch
"""
    + _END
)

#: count is the seconds to run; after a drop (no_such_topic) it opens the topic again (a
#: create when it is gone) and goes on; "A <incarnation> <seq> <payload>" per acknowledged
#: record.
REOPENING_WRITER = (
    _START
    + """
end, i = time.monotonic() + float(sys.argv[3]), 0
while time.monotonic() < end:
    try:
        seq = topic.append(f"{name}:{i}".encode())
    except NoSuchTopic:
        topic = store.topic("events", durability="fsync")
        continue
    out.write(f"A {topic.incarnation} {seq} {name}:{i}\\n")
    out.flush()
    i += 1
"""
    + _END
)


class Writer:
    """A writer process, its output drained into ``lines`` so it never blocks on the pipe."""

    def __init__(
        self, uri: str, name: str, count: int, go: Path, batch: int = 1, script: str = WRITER
    ) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-c", script, uri, name, str(count), str(batch), str(go)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        assert self.proc.stdout is not None
        self.lines: list[str] = []
        stdout = self.proc.stdout
        self.drain = threading.Thread(target=lambda: self.lines.extend(stdout), daemon=True)
        self.drain.start()

    def wait_ready(self, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while not self.lines:
            assert self.proc.poll() is None, self.stderr()
            assert time.monotonic() < deadline, "never ready"
            time.sleep(0.01)

    def wait_for(self, n_acked: int, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while len(self.acked()) < n_acked:
            assert self.proc.poll() is None, self.stderr()
            assert time.monotonic() < deadline, f"only {len(self.acked())} acked"
            time.sleep(0.01)

    def finish(self, timeout: float = 120) -> None:
        try:
            self.proc.wait(timeout=timeout)
        finally:
            self.kill()
        assert self.proc.returncode == 0, self.stderr()
        assert self.lines[-1] == "DONE\n"

    def kill(self) -> None:
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=30)
        self.drain.join(timeout=30)

    def slot(self) -> int:
        return int(self.lines[0].split()[1])

    def acked(self) -> list[tuple[int, str]]:
        out = []
        for line in list(self.lines):
            parts = line.split()
            if len(parts) == 3 and parts[0] == "A":
                out.append((int(parts[1]), parts[2]))
        return out

    def stderr(self) -> str:
        assert self.proc.stderr is not None
        return self.proc.stderr.read()[-3000:] if self.proc.poll() is not None else ""


def _merged_all(uri: str) -> list[tuple[int, Record]]:
    with tidelog.open(uri, readonly=True) as view:
        m = merged(view.topic("events", create=False))
        out: list[tuple[int, Record]] = []
        cursor = None
        while True:
            items, cursor = m.read(cursor, 97)
            if not items:
                return out
            for e in items:
                assert isinstance(e.item, Record), e
                out.append((e.instance, e.item))


def test_INST_3_INST_8_processes_append_at_once_and_read_once(tmp_path: Path) -> None:
    """INST-3, INST-7, INST-8: four processes, single fsync appends and batches of 50, each
    in its own slot; the merged read returns every acknowledged record exactly once, each
    instance's in seq order."""
    uri = f"file://{tmp_path / 's'}?instances=4"
    go = tmp_path / "go"
    writers = [
        Writer(uri, "p0", 150, go),
        Writer(uri, "p1", 150, go),
        Writer(uri, "p2", 500, go, batch=50),
        Writer(uri, "p3", 500, go, batch=50),
    ]
    try:
        for w in writers:
            w.wait_ready()
        go.touch()
        for w in writers:
            w.finish()
    finally:
        for w in writers:
            w.kill()
    assert sorted(w.slot() for w in writers) == [0, 1, 2, 3]
    got = _merged_all(uri)
    payloads = Counter(r.payload.decode() for _, r in got)
    expected = {p for w in writers for _, p in w.acked()}
    assert len(expected) == 1300
    assert set(payloads) == expected and set(payloads.values()) == {1}
    for w in writers:
        mine = [(r.seq, r.payload.decode()) for i, r in got if i == w.slot()]
        assert mine == sorted(w.acked())  # its own seqs, in order, as acknowledged


def test_INST_3_a_killed_writers_slot_is_taken_over_with_its_records(tmp_path: Path) -> None:
    """INST-3, DUR-2: a writer SIGKILLed mid-load while another goes on; the next process
    takes its slot (recovering it) and appends after its last seq; every record either
    acknowledged is read once by the merged read, none invented."""
    uri = f"file://{tmp_path / 's'}?instances=2&wal_file_bytes=256KiB&checkpoint_bytes=64KiB"
    go = tmp_path / "go"
    go.touch()
    doomed = Writer(uri, "doomed", 0, go)
    doomed.wait_ready()  # slot 0: the lowest free one the heir takes once both are gone
    steady = Writer(uri, "steady", 400, go)
    try:
        doomed.wait_for(100)
        steady.wait_for(20)
        doomed.kill()  # mid-write: it appends forever
        steady.finish()
        heir = Writer(uri, "heir", 30, go)
        heir.finish()
    finally:
        for w in (doomed, steady):
            w.kill()
    assert heir.slot() == doomed.slot()
    lost_acks = doomed.acked()
    got = _merged_all(uri)
    by_payload = Counter(r.payload.decode() for _, r in got)
    assert set(by_payload.values()) == {1}
    for w in (doomed, steady, heir):
        missing = [p for _, p in w.acked() if p not in by_payload]
        assert not missing, (w, missing[:5])
    invented = [p for p in by_payload if p.split(":")[0] not in ("doomed", "steady", "heir")]
    assert not invented
    heir_seqs = [q for q, _ in heir.acked()]
    assert heir_seqs[0] > max(q for q, _ in lost_acks)  # seqs never reused (TOP-1)


def test_INST_16_INST_17_a_consumer_commits_beside_writer_processes(tmp_path: Path) -> None:
    """INST-15..INST-17: while two writer processes append, a consumer (a read-only store,
    no slot) polls the merged subscriber and commits each batch (requests the writers apply);
    it sees every acknowledged record once, and a new handle afterwards gets nothing."""
    uri = f"file://{tmp_path / 's'}?instances=2"
    go = tmp_path / "go"
    writers = [Writer(uri, "w0", 300, go), Writer(uri, "w1", 300, go)]
    try:
        for w in writers:
            w.wait_ready()
        with tidelog.open(uri, readonly=True) as view:
            sub = merged(view.topic("events", create=False)).subscribe("c")
            go.touch()
            seen: list[str] = []
            deadline = time.monotonic() + 120
            while len(seen) < 600 and time.monotonic() < deadline:
                items, cursor = sub.poll(50, wait_ms=200)
                seen += [e.item.payload.decode() for e in items]
                if items:
                    sub.commit(cursor)
            for w in writers:
                w.finish()
            expected = {p for w in writers for _, p in w.acked()}
            assert sorted(seen) == sorted(expected) and len(seen) == 600
            again = merged(view.topic("events", create=False)).subscribe("c")
            assert again.poll(100).items == []
    finally:
        for w in writers:
            w.kill()


#: argv: uri, go-file. Waits for ``go``, then opens the store (taking a slot), appends one
#: record and prints its slot.
OPENER = textwrap.dedent(
    """
    import os, sys, time
    deadline = time.monotonic() + 60
    while not os.path.exists(sys.argv[2]) and time.monotonic() < deadline:
        time.sleep(0.0005)
    import tidelog
    with tidelog.open(sys.argv[1]) as store:
        store.topic("t").append(b"x")
        print(store.describe()["slot"], flush=True)
    """
)


def test_INST_3_processes_opening_a_new_store_at_once_each_get_a_slot(tmp_path: Path) -> None:
    """INST-2, INST-3: eight processes released at once on a store that does not exist yet
    (its shared part and every instance directory created by whoever comes first) all open
    it, each in its own slot; five rounds, each on a new store."""
    import tidelog as tl  # noqa: F401 - imported first, so the children's start is all I/O

    for round_ in range(5):
        root = tmp_path / f"s{round_}"
        go = tmp_path / f"go{round_}"
        procs = [
            subprocess.Popen(
                [sys.executable, "-c", OPENER, f"file://{root}?instances=8", str(go)],
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            for _ in range(8)
        ]
        try:
            time.sleep(1.0)  # every child imported and waiting
            go.touch()
            outs = [p.communicate(timeout=120) for p in procs]
        finally:
            for p in procs:
                if p.poll() is None:
                    p.kill()
                    p.wait(timeout=30)
        assert [p.returncode for p in procs] == [0] * 8, [err[-1500:] for _, err in outs]
        assert all(0 <= int(out) < 8 for out, _ in outs)


def test_INST_6_INST_18_INST_19_requests_to_a_writer_process(tmp_path: Path) -> None:
    """INST-18, INST-19, INST-6 with another process holding an instance and appending: acks
    of its records and a merged delete up to a cursor are applied by its writer (XPR-2); a
    drop removes its copy while it appends, after which its handle gets no_such_topic
    (TOP-10 across processes), and a re-create is empty in every instance."""
    root = tmp_path / "s"
    uri = f"file://{root}?instances=2"
    go = tmp_path / "go"
    go.touch()
    writer = Writer(uri, "p0", 0, go)
    try:
        writer.wait_ready()
        assert writer.slot() == 0
        writer.wait_for(30)
        with tidelog.open(uri) as store:
            topic = store.topic("events", durability="fsync")
            sub = merged(topic).subscribe("s")
            got = sub.poll(10).items
            assert [e.instance for e in got] == [0] * 10
            assert all(sub.ack(e.instance, e.item.seq) for e in got)
            assert sub.hwm == "10.0"
            cursor = merged(topic).read(None, 20).cursor
            assert cursor == "30.0"  # the 10 acked records were trimmed (SUB-5)
            assert merged(topic).delete(before=cursor) == 20
            first = merged(topic).read(None, 1).items[0]
            assert first.instance == 0 and first.item.seq == 31
            store.drop_topic("events")
            writer.proc.wait(timeout=60)
            assert writer.proc.returncode != 0
            assert "NoSuchTopic" in writer.stderr()
            assert store.topics() == []
            again = store.topic("events")
            assert again.incarnation == 2 and merged(again).read().items == []
    finally:
        writer.kill()
    with tidelog.open(f"file://{root}/instances/0?readonly=true") as view:
        assert view.topics() == []


def test_INST_6_drops_and_re_creates_racing_writer_processes(tmp_path: Path) -> None:
    """INST-6: two writer processes append and re-open the topic after each drop (creating
    it again when it is gone) while this process drops it again and again; at the end the
    merged read holds exactly the records acknowledged under the last incarnation: no record
    of an earlier one survives in any instance, none acknowledged under the last is lost."""
    root = tmp_path / "s"
    uri = f"file://{root}?instances=3"
    go = tmp_path / "go"
    writers = [Writer(uri, f"w{k}", 4, go, script=REOPENING_WRITER) for k in range(2)]
    drops = 0
    try:
        for w in writers:
            w.wait_ready()
        with tidelog.open(uri) as store:
            go.touch()
            while any(w.proc.poll() is None for w in writers):
                time.sleep(0.3)
                try:
                    store.drop_topic("events")
                    drops += 1
                except NoSuchTopic:
                    pass  # dropped, and nobody has created it again yet
            for w in writers:
                w.finish()
            assert drops >= 3
            topic = store.topic("events", durability="fsync")
            last = topic.incarnation
            got = Counter(
                e.item.payload.decode()
                for e in merged(topic).read(None, 1_000_000).items
                if isinstance(e.item, Record)
            )
    finally:
        for w in writers:
            w.kill()
    acked = [line.split() for w in writers for line in w.lines if line.startswith("A ")]
    assert {int(g) for g, _, _ in (a[1:] for a in acked)} >= {1, 2}
    wanted = {p for _, g, _, p in acked if int(g) == last}
    assert set(got) == wanted and set(got.values()) <= {1}


def _subscribers_of(root: Path, i: int) -> list[str]:
    with tidelog.open(f"file://{root}/instances/{i}?readonly=true") as view:
        return view.topic("events", create=False).subscribers()


def test_INST_21_a_stuck_writer_process_is_named_and_its_drop_finished_later(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """INST-21, INST-6: a writer process that never applies requests (no maintenance thread)
    holds instance 0 and appends; a drop here is ``locked`` within R naming instance 0 and
    that process's PID, and leaves the topic gone (dropping); once the process is killed, the
    next drop recovers its instance (XPR-3) and finishes, removing its copy."""
    monkeypatch.setattr(shared, "REQUEST_TIMEOUT_S", 1.0)
    root = tmp_path / "s"
    uri = f"file://{root}?instances=2"
    go = tmp_path / "go"
    go.touch()
    writer = Writer(uri + "&background=false", "p0", 0, go)
    try:
        writer.wait_ready()
        assert writer.slot() == 0
        writer.wait_for(5)
        with tidelog.open(uri) as store:
            store.topic("events")
            with pytest.raises(Locked, match=rf"instance 0 \(held by pid {writer.proc.pid}\)"):
                store.drop_topic("events")
            assert store.topics() == []
            writer.kill()
            store.drop_topic("events")
        assert list((root / "instances" / "0" / "requests").glob("*.req")) == []
        with tidelog.open(f"file://{root}/instances/0?readonly=true") as view:
            assert view.topics() == []
    finally:
        writer.kill()


def test_INST_22_unregister_reaches_a_writer_process_and_its_successor_never_resurrects_it(
    tmp_path: Path,
) -> None:
    """INST-22, INST-15: another process holds instance 0 and appends; a merged subscriber
    registered there is unregistered from here (its writer applies the request); after that
    process is SIGKILLed and a new one takes the slot and opens the topic again, the
    subscriber is still gone from instance 0."""
    root = tmp_path / "s"
    uri = f"file://{root}?instances=2"
    go = tmp_path / "go"
    go.touch()
    first = Writer(uri, "p0", 0, go)
    second: Writer | None = None
    try:
        first.wait_ready()
        assert first.slot() == 0
        first.wait_for(5)
        with tidelog.open(uri) as store:
            sub = merged(store.topic("events", durability="fsync")).subscribe("s")
            assert _subscribers_of(root, 0) == ["s"]
            sub.commit(sub.poll(3).cursor)
            sub.unregister()
            assert _subscribers_of(root, 0) == []
            first.kill()
            second = Writer(uri, "p1", 0, go)
            second.wait_ready()
            assert second.slot() == 0
            second.wait_for(3)
            assert _subscribers_of(root, 0) == []
            with pytest.raises(NoSuchSubscriber):
                sub.poll(1)
    finally:
        first.kill()
        if second is not None:
            second.kill()
