"""Real crashes (CRASH-7, DUR-2, DUR-9): a child process appends to a file store under load and
prints every acknowledged seq; the parent SIGKILLs it at a random moment, reopens the store and
checks that every acknowledged fsync record is present byte-identical, no record was invented,
every invariant holds, and appends continue after the highest seq. Repeated on the same
directory, so each run also recovers what the previous kill left.

CI runs a few kills; ``python3 run.py crash`` runs many (TIDELOG_SIGKILL_RUNS)."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import tidelog
from tidelog.conformance.invariants import check_topic

CHILD = textwrap.dedent(
    """
    import sys, threading
    import tidelog
    uri = sys.argv[1]
    store = tidelog.open(uri)
    durable = store.topic("durable", durability="fsync")
    loose = store.topic("loose", durability="disk")
    sub = durable.subscribe("reader", start="earliest")
    out = sys.stdout
    lock = threading.Lock()

    def payload(seq):
        return (f"{seq}:" * (1 + seq % 7)).encode()

    def writer(i):
        while True:
            head = durable.state().head_seq
            seq = durable.append(payload(head + 1))  # may race: the payload names a guess
            with lock:
                out.write(f"D {seq}\\n")
                out.flush()
            loose.append(b"x" * (seq % 300))

    def reader():
        while True:
            items = sub.poll(50, wait_ms=50)
            for item in items:
                if hasattr(item, "seq"):
                    sub.ack(item.seq)
            if items:
                with lock:
                    out.write(f"H {sub.hwm}\\n")
                    out.flush()

    out.write("READY\\n")
    out.flush()
    for i in range(3):
        threading.Thread(target=writer, args=(i,), daemon=True).start()
    threading.Thread(target=reader, daemon=True).start()
    threading.Event().wait()
    """
)


def _run_and_kill(uri: str, rng: random.Random) -> tuple[set[int], int]:
    proc = subprocess.Popen(
        [sys.executable, "-c", CHILD, uri],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None and proc.stderr is not None
    lines: list[str] = []
    drain = threading.Thread(target=lambda: lines.extend(proc.stdout), daemon=True)
    drain.start()  # keep the pipe empty so the child's writers never block on it
    deadline = time.monotonic() + 30
    while not lines and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.01)
    time.sleep(rng.uniform(0.05, 0.6))
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)
    drain.join(timeout=30)
    err = proc.stderr.read()
    assert lines and lines[0].strip() == "READY", (lines[:3], err[-2000:])
    acked: set[int] = set()
    hwm = 0
    for line in lines[1:]:
        kind, _, value = line.partition(" ")
        if kind == "D" and value.strip().isdigit():
            acked.add(int(value))
        elif kind == "H" and value.strip().isdigit():
            hwm = max(hwm, int(value))
    assert "Traceback" not in err, err
    return acked, hwm


def test_CRASH_7_sigkill_writer_repeatedly(tmp_path: Path) -> None:
    """DUR-2: every fsync append the child saw return survives SIGKILL; recovery never fails."""
    uri = f"file://{tmp_path / 'store'}?wal_file_bytes=256KiB&checkpoint_bytes=64KiB"
    seed = int(os.environ.get("TIDELOG_SEED", "20261122"))
    rng = random.Random(seed)
    all_acked: set[int] = set()
    runs = int(os.environ.get("TIDELOG_SIGKILL_RUNS", "3"))
    for run in range(runs):
        acked, _ = _run_and_kill(uri, rng)
        all_acked |= acked
        with tidelog.open(uri) as store:
            durable = store.topic("durable", create=False)
            st = durable.state()
            check_topic(durable, st)
            check_topic(store.topic("loose", create=False))
            records = {r.seq: r for r in durable.read(0, 10**9) if isinstance(r, tidelog.Record)}
            trimmed_below = durable.subscriber("reader").hwm
            missing = {q for q in all_acked if q not in records and q > trimmed_below}
            assert not missing, (
                f"run {run} (seed {seed}): acknowledged seqs lost: {sorted(missing)[:10]}"
            )
            assert max(all_acked, default=0) <= st.head_seq
            for seq, rec in records.items():
                text = rec.payload.decode()
                parts = [p for p in text.split(":") if p]
                assert parts and all(p == parts[0] for p in parts), f"damaged payload at {seq}"
            assert durable.append(b"after") == st.head_seq + 1
        assert acked or run > 0, "the child acknowledged nothing before being killed"
