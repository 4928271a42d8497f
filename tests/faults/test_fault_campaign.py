"""The long, seeded fault campaign (nox session `faults`; collected only with
TIDELOG_FAULT_CAMPAIGN=1, see conftest.py). Spec/SPEC.md FLT-3..FLT-8, checked as faultrun.py says.

1. Seeded random workloads (TIDELOG_FAULT_WORKLOADS, default 24) through the fault-injecting FS:
   every I/O call x every fault, plus TIDELOG_FAULT_RANDOM runs (default 40) with faults at
   random (rate 2-10%, several per run), each recovering the durable image, the volatile image
   and TIDELOG_FAULT_SAMPLES (default 4) more crash states of the end.
2. The same checks through real mechanisms around an unmodified process (fault_worker.py):
   strace's ``--inject`` (EIO or ENOSPC at the n-th call of a syscall on the store's files) and
   libfiu (``fiu-run -x``: the n-th call of a POSIX wrapper fails, or a pwrite comes back short),
   TIDELOG_FAULT_REAL runs (default 60) each. A tool that is missing and cannot be installed
   (apt-get install strace / fiu-utils) skips only its part, with the reason printed. What these
   cannot do: drop unsynced pages after a failed sync (the page cache keeps them: the op that
   raised may then be present, FLT-5), or fail reads under a mapping (FLT-9).
3. A real full disk (an 8 MiB tmpfs; needs root, else skipped with the reason printed).

The workload seeds are TIDELOG_FAULT_SEED + 0, 1, ... (default: the run's Hypothesis seed).
"""

from __future__ import annotations

import contextlib
import gc
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from faultrun import (
    ROOT,
    Campaign,
    Step,
    Tally,
    check_results,
    encode,
    recover_and_compare,
)
from test_file_faults import WORKLOADS

import tidelog
from tidelog.conformance.crashfs import RecordingFS
from tidelog.conformance.faultfs import Fault
from tidelog.errors import StorageError

WORKLOADS_N = int(os.environ.get("TIDELOG_FAULT_WORKLOADS", "24"))
RANDOM_N = int(os.environ.get("TIDELOG_FAULT_RANDOM", "40"))
SAMPLES = int(os.environ.get("TIDELOG_FAULT_SAMPLES", "4"))
REAL_N = int(os.environ.get("TIDELOG_FAULT_REAL", "60"))
WORKER = Path(__file__).with_name("fault_worker.py")
RUN_TIMEOUT_S = 120


def _seed(request: pytest.FixtureRequest) -> int:
    env = os.environ.get("TIDELOG_FAULT_SEED")
    if env:
        return int(env)
    seed = request.config.getoption("hypothesis_seed", default=None)
    return int(seed) if seed is not None else 0


def random_workload(seed: int) -> list[Step]:
    """A small seeded workload: fsync and disk topics, appends, batches, a subscriber's acks and
    progress, checkpoints, flushes, a reopen."""
    rng = random.Random(seed)
    steps: list[Step] = [("open",), ("create", "f", {"durability": "fsync"})]
    topics = ["f"]
    if rng.random() < 0.6:
        steps += [("create", "d", {"durability": "disk", "trim": "acked"})]
        steps += [("subscribe", "d", "s", "earliest")]
        topics.append("d")
    acked = 0
    for _ in range(rng.randint(5, 12)):
        t = rng.choice(topics)
        kind = rng.random()
        if kind < 0.35:
            steps.append(("append", t, rng.randbytes(rng.choice([1, 50, 700, 3000])), None))
        elif kind < 0.55:
            n = rng.randint(2, 6)
            steps.append(("append_many", t, [rng.randbytes(rng.randint(0, 400)) for _ in range(n)]))
        elif kind < 0.65 and "d" in topics:
            acked += 1
            steps += [("ack", "d", "s", acked), ("flush_sub", "d", "s")]
        elif kind < 0.8:
            steps.append(("checkpoint",))
        elif kind < 0.9:
            steps.append(("flush",))
        else:
            steps += [("close",), ("open",)]
    return [*steps, ("close",)]


@pytest.mark.parametrize("index", range(WORKLOADS_N))
def test_FLT_seeded_random_workloads_every_call_every_fault(
    index: int, request: pytest.FixtureRequest
) -> None:
    """FLT-3..FLT-8 on a seeded random workload: every call x fault, then random faults."""
    seed = _seed(request) + index
    campaign = Campaign(random_workload(seed))
    tally = Tally()
    for at, fault in campaign.cases():
        campaign.run_case([Fault(fault, at=at)], tally, samples=SAMPLES, seed=seed)
    for r in range(RANDOM_N):
        rate = random.Random(f"{seed}:{r}").choice([0.02, 0.05, 0.1])
        campaign.run_case([], tally, samples=SAMPLES, seed=seed * 1000 + r, rate=rate)
    tally.report(f"campaign/seed-{seed}")
    tally.check()


# -- real mechanisms ---------------------------------------------------------------------------
def _real_campaign(
    tool: str, package: str, name: str, request: pytest.FixtureRequest
) -> tuple[Campaign, random.Random]:
    """Workload ``name``'s campaign and a seeded choice of faults for runs under ``tool``;
    skipped, with the reason printed, when the tool is missing (the nox session installs it
    when it can)."""
    if not shutil.which(tool):
        reason = f"{tool} is missing (apt-get install {package} failed or was not possible)"
        print(f"real faults by {tool}: NOT RUN: {reason}")
        pytest.skip(reason)
    steps, options = WORKLOADS[name]
    return Campaign(steps, options), random.Random(f"{_seed(request)}:{tool}:{name}")


def _run(cmd: list[str], tmp: Path) -> subprocess.CompletedProcess[str]:
    """Run ``cmd`` in a session of its own, killed (the whole group, by its id) after the
    time limit."""
    # PYTHONSAFEPATH (the nox sessions) keeps the script's folder off sys.path: name it
    path = os.pathsep.join(p for p in (str(WORKER.parent), os.environ.get("PYTHONPATH")) if p)
    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1", "PYTHONPATH": path}
    proc = subprocess.Popen(
        cmd, cwd=tmp, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        start_new_session=True,
    )  # fmt: skip
    try:
        out, err = proc.communicate(timeout=RUN_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        raise AssertionError(f"{cmd[:6]} did not finish in {RUN_TIMEOUT_S}s") from None
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)


def _worker(campaign: Campaign, tmp: Path, prefix: list[str], fiu: Any = None) -> Path:
    """Run the worker on a fresh store under ``prefix``; returns its results file."""
    case = tmp / "case.json"
    body = {
        "steps": [encode(s) for s in campaign.steps],
        "baseline": campaign.baseline,
        "options": campaign.options,
    }
    case.write_text(json.dumps({**body, "fiu": fiu}))
    results = tmp / "results.jsonl"
    shutil.rmtree(tmp / "store", ignore_errors=True)
    got = _run([*prefix, sys.executable, str(WORKER), str(tmp / "store"), str(case),
                str(results)], tmp)  # fmt: skip
    assert got.returncode in (0, 3), f"worker exit {got.returncode}: {got.stderr[-2000:]}"
    return results


def _check_real(campaign: Campaign, tmp: Path, results_path: Path, tally: Tally, what: str) -> None:
    """FLT-3/FLT-4 on the worker's results, then recover what the process left on disk."""
    tally.cases += 1
    lines = [json.loads(x) for x in results_path.read_text().splitlines()]
    untyped = [x["untyped"] for x in lines if "untyped" in x]
    if untyped:
        tally.problems.append(f"{what}: {untyped[0]}")
        return
    results = [x["result"] for x in lines if "result" in x]
    base = campaign.baseline
    diverged = next((k for k, r in enumerate(results) if r != base[k]), None)
    problems = check_results(campaign.steps, base, results, diverged)
    tally.injected += 1  # one fault armed per run: it fired, or the run had no such call
    if diverged is None:
        tally.absorbed += 1
        acked, in_flight = len(results), None
    else:
        acked = diverged
        in_flight = diverged + 1 if campaign.steps[diverged][0] != "open" else None
    if not (tmp / "store").exists():
        # the fault failed the store's first open, which removes what it created (URI-8):
        # nothing can have been acknowledged
        if acked:
            problems.append(f"the store is gone, yet {acked} ops were acknowledged")
        else:
            tally.states += 1
        if problems:
            tally.problems.append(f"{what}: results {results}:\n  " + "\n  ".join(problems))
        return
    state = RecordingFS.from_directory(str(tmp / "store"), at=ROOT)
    models = campaign.models
    try:
        recover_and_compare(
            state,
            models.after(acked),
            models.after(in_flight) if in_flight is not None else None,
            campaign.options,
        )
    except AssertionError as exc:
        problems.append(f"recovery: {exc}")
    tally.states += 1
    if problems:
        tally.problems.append(f"{what}: results {results}:\n  " + "\n  ".join(problems))


_STRACE_CALLS = {
    "pwrite64": ("EIO", "ENOSPC"),
    # os.pwritev's system call (CPython calls pwritev2): a WAL chunk written with the SYNCED
    # frame due before it, and segment pieces
    "pwritev2": ("EIO", "ENOSPC"),
    "fdatasync": ("EIO",),
    "fsync": ("EIO",),
    "sync_file_range": ("EIO",),  # a segment's write-out (SEG-20)
    "openat": ("EIO", "ENOSPC"),
    "fallocate": ("ENOSPC", "EIO"),
    "ftruncate": ("EIO",),
    "rename": ("EIO",),
    "unlink": ("EIO",),
    "mkdir": ("EIO", "ENOSPC"),
    "pread64": ("EIO",),
}
_LINE = re.compile(r"^(\d+) +(\w+)\((.*)$")  # strace pads a short pid with spaces


def _strace_targets(campaign: Campaign, tmp: Path) -> list[tuple[str, int]]:
    """(syscall, n): the n-th call of the syscall by the worker's main thread that touches the
    store, for every such call of a baseline run under strace."""
    log = tmp / "strace.log"
    names = ",".join(_STRACE_CALLS)
    _worker(campaign, tmp, ["strace", "-f", "-qq", "-y", "-e", f"trace={names}", "-o", str(log)])
    store = str(tmp / "store")
    seen: dict[str, int] = {}
    out = []
    main = None
    for line in log.read_text().splitlines():
        m = _LINE.match(line)
        if m is None:
            continue
        pid, call, args = m.groups()
        main = main or pid
        if pid != main or call not in _STRACE_CALLS:
            continue
        seen[call] = seen.get(call, 0) + 1
        if store in args:
            out.append((call, seen[call]))
    return out


@pytest.mark.parametrize("name", sorted(WORKLOADS))
def test_FLT_real_faults_by_strace_inject(
    name: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """FLT-3, FLT-4, FLT-5 through strace's syscall fault injection on an unmodified process:
    EIO or ENOSPC at one call of each kind that touches the store, then at a seeded choice
    of those calls."""
    campaign, rng = _real_campaign("strace", "strace", name, request)
    targets = _strace_targets(campaign, tmp_path)
    assert targets, "strace saw no call on the store"
    tally = Tally()
    # every kind of call the store makes is hit at least once (the rare ones too: a vectored
    # write, a write-out), then seeded choices among all the calls
    kinds = sorted({call for call, _ in targets})
    picks = [rng.choice([t for t in targets if t[0] == kind]) for kind in kinds]
    picks += [rng.choice(targets) for _ in range(min(REAL_N, len(targets) * 2) - len(picks))]
    for call, n in picks:
        error = rng.choice(_STRACE_CALLS[call])
        inject = f"inject={call}:error={error}:when={n}"
        prefix = ["strace", "-f", "-qq", "-o", "/dev/null", "-e", f"trace={call}", "-e", inject]
        results = _worker(campaign, tmp_path, prefix)
        _check_real(campaign, tmp_path, results, tally, f"strace {inject}")
    tally.report(f"real/strace/{name}")
    tally.check()


#: libfiu 1.1 wraps pwritev, not the pwritev2 that CPython's os.pwritev calls, so vectored
#: writes have no point here (the strace campaign injects into pwritev2)
_FIU_POINTS = {
    "posix/io/rw/pwrite": ("EIO", "ENOSPC"),
    "posix/io/rw/pwrite/reduce": ("EIO",),  # a short write: the writer must write the rest
    "posix/io/rw/pread": ("EIO",),
    "posix/io/sync/fdatasync": ("EIO",),
    "posix/io/sync/fsync": ("EIO",),
    "linux/io/sync_file_range": ("EIO",),  # a segment's write-out (SEG-20)
    "posix/io/oc/open": ("EIO", "ENOSPC"),
    "posix/io/rw/ftruncate": ("EIO",),
    "posix/io/dir/rename": ("EIO",),
    "posix/io/dir/unlink": ("EIO",),
}


@pytest.mark.parametrize("name", sorted(WORKLOADS))
def test_FLT_real_faults_by_libfiu(
    name: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """FLT-3, FLT-4, FLT-5 through libfiu's POSIX wrappers (fiu-run -x) on an unmodified
    process: the n-th call of a wrapper fails (EIO, ENOSPC) or a pwrite comes back short."""
    campaign, rng = _real_campaign("fiu-run", "fiu-utils", name, request)
    counts: dict[str, int] = {}
    for point in _FIU_POINTS:  # how many calls each point sees in a run without faults
        results = _worker(campaign, tmp_path, ["fiu-run", "-x"], fiu=[point, 0, 0])
        last = json.loads(results.read_text().splitlines()[-1])
        counts[point] = last["fiu_calls"]
    points = [p for p in _FIU_POINTS if counts[p]]
    tally = Tally()
    for _ in range(REAL_N):
        point = rng.choice(points)
        n = rng.randint(1, counts[point])
        error = rng.choice(_FIU_POINTS[point])
        code = {"EIO": 5, "ENOSPC": 28}[error]
        results = _worker(campaign, tmp_path, ["fiu-run", "-x"], fiu=[point, n, code])
        _check_real(campaign, tmp_path, results, tally, f"fiu {point} #{n} {error}")
    tally.report(f"real/libfiu/{name}")
    tally.check()


def test_FLT_8_a_real_full_disk(tmp_path: Path) -> None:
    """FLT-8, FLT-4, FLT-7 on a real 8 MiB file system (tmpfs; needs root): the store is
    created with a WAL file reserved short (64 MiB does not fit), appends fill the disk until
    one raises io_error "disk full", close releases everything, a reopen refuses cleanly (no
    file left behind) and a read-only view reads every acknowledged record."""
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=8m", "tmpfs", str(mnt)], capture_output=True, text=True
    )
    if mounted.returncode != 0:
        reason = f"cannot mount a small tmpfs here: {mounted.stderr.strip()}"
        print(f"real full disk: NOT RUN: {reason}")
        pytest.skip(reason)
    gc.disable()  # what a failed open leaves held must not depend on when a collection runs
    try:
        uri = f"file://{mnt}/s"
        store = tidelog.open(uri, background=False)
        (wal,) = os.listdir(mnt / "s" / "wal")
        assert os.stat(mnt / "s" / "wal" / wal).st_size < 8 << 20
        t = store.topic("t", durability="fsync")
        acked = 0
        with pytest.raises(StorageError) as full:
            while acked < 1000:
                t.append(b"x" * 100_000)
                acked += 1
        assert "disk full" in str(full.value) and acked > 10
        with pytest.raises(StorageError):
            store.close()
        with pytest.raises(StorageError) as refused:
            tidelog.open(uri, background=False)
        assert "disk full" in str(refused.value)
        # FLT-7: nothing held, though the refusal (and its traceback) is still alive here and
        # no collection has run
        assert _held_under(mnt) == ([], []), "a refused open left files open or mapped"
        assert os.listdir(mnt / "s" / "wal") == [wal]
        view = tidelog.open(uri, readonly=True)
        try:
            assert len(view.topic("t", create=False).read(0, 10_000)) >= acked
        finally:
            view.close()
    finally:
        gc.enable()
        gc.collect()  # a leak the assertion found must not keep the file system mounted
        subprocess.run(["umount", str(mnt)], check=True)


def _held_under(root: Path) -> tuple[list[str], list[str]]:
    """This process's open descriptors and file maps of files under ``root``."""
    fds = []
    for fd in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):  # the listing's own descriptor is gone already
            target = os.readlink(f"/proc/self/fd/{fd}")
            if target.startswith(f"{root}/"):
                fds.append(target)
    with open("/proc/self/maps", encoding="utf-8") as f:
        maps = [line.split()[-1] for line in f if f" {root}/" in line]
    return fds, maps
