"""A real Spark standalone cluster on 127.0.0.1 for tests: one master and N workers started from
pyspark's own ``spark-class`` (no Spark distribution needed), small (one core and little memory
per worker: the CI machine has two cores), and every process it started killed by PID at the
end, descendants included (executor JVMs, pyspark's Python daemon, which puts itself in a process
group of its own, and its workers), also when starting fails.

Drivers run in subprocesses (``cluster_driver.py``): a test process has at most one
SparkContext, and the ``spark`` fixture's local session may already be it.
"""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = [
    "Driver",
    "StandaloneCluster",
    "free_port",
    "kill_tree",
    "spark_class",
    "standalone_cluster",
]

START_TIMEOUT_S = 120.0  # JVM start-up on a loaded 2-core machine: usually 5-15 s
DAEMON_MEMORY = "256m"  # the master's and workers' own JVMs
WORKER_MEMORY = "1g"  # what a worker offers executors (an executor takes spark.executor.memory)


def spark_class() -> Path:
    import pyspark

    return Path(pyspark.__file__).parent / "bin" / "spark-class"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _children() -> dict[int, list[int]]:
    """Parent pid -> child pids, from /proc."""
    out: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            continue
        ppid = int(stat[stat.rindex(b")") + 2 :].split()[1])
        out.setdefault(ppid, []).append(int(entry))
    return out


def descendants(pid: int) -> list[int]:
    tree = _children()
    found: list[int] = []
    todo = [pid]
    while todo:
        for child in tree.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def kill_tree(proc: subprocess.Popen[Any], timeout: float = 30.0) -> None:
    """SIGKILL ``proc``, its process group and every descendant, by PID; wait for ``proc``.
    Descendants are collected before the kill (a killed parent orphans them) and again
    after, until none is left or ``timeout`` passes."""
    deadline = time.monotonic() + timeout
    victims = set(descendants(proc.pid))
    while True:
        for pid in [proc.pid, *victims]:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)  # started with start_new_session: pgid == pid
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=max(0.1, deadline - time.monotonic()))
        alive = {p for p in victims if os.path.exists(f"/proc/{p}") and not _zombie(p)}
        if not alive or time.monotonic() > deadline:
            return
        victims = alive | {d for p in alive for d in descendants(p)}
        time.sleep(0.05)


def _zombie(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return True
    return stat[stat.rindex(b")") + 2 :].split()[0] == b"Z"


@dataclass
class StandaloneCluster:
    """``start()`` it, run drivers against ``master_url``, ``stop()`` it (kills everything)."""

    work: Path
    workers: int = 2
    cores: int = 1
    procs: dict[str, subprocess.Popen[Any]] = field(default_factory=dict)
    master_url: str = ""
    ui_url: str = ""

    def env(self) -> dict[str, str]:
        """The environment of every Spark process of the cluster (and of its drivers)."""
        return dict(
            os.environ,
            SPARK_LOCAL_IP="127.0.0.1",
            SPARK_DAEMON_MEMORY=DAEMON_MEMORY,
            SPARK_LOCAL_DIRS=str(self.work / "local"),
            SPARK_WORKER_DIR=str(self.work / "worker"),
            SPARK_CONF_DIR=str(self.work / "conf"),  # none: pyspark's package has no conf/
            PYSPARK_PYTHON=sys.executable,
            PYTHONSAFEPATH="1",  # executors' Python workers import the installed tidelog
        )

    def _spawn(
        self, name: str, *args: str, binds: Sequence[tuple[Path, Path]] = ()
    ) -> subprocess.Popen[Any]:
        """``spark-class args``; with ``binds`` (source, target) in a mount namespace of its
        own where each source is bind-mounted over its target: what this process and its
        children (executors, Python workers) see there, and nothing else does (root only)."""
        command = ["bash", str(spark_class()), *args]
        if binds:
            mounts = " && ".join(f"mount --bind {shlex.quote(str(s))} {shlex.quote(str(t))}"
                                 for s, t in binds)  # fmt: skip
            # unshare and sh exec what follows: the pid stays the worker's (kill_tree)
            command = ["unshare", "-m", "--propagation", "private", "sh", "-c",
                       f'{mounts} && exec "$@"', "sh", *command]  # fmt: skip
        with open(self.work / f"{name}.log", "ab") as log:  # the child keeps its own copy
            proc = subprocess.Popen(
                command,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=self.env(),
                cwd=self.work,
                start_new_session=True,  # its own process group: killed as one (kill_tree)
            )
        self.procs[name] = proc
        return proc

    def start(self, workers: bool = True) -> None:
        """The master, then (unless not ``workers``) the workers, each ALIVE."""
        for sub in ("local", "worker", "conf"):
            (self.work / sub).mkdir(parents=True, exist_ok=True)
        port, ui = free_port(), free_port()
        self.master_url = f"spark://127.0.0.1:{port}"
        self.ui_url = f"http://127.0.0.1:{ui}"
        self._spawn(
            "master",
            "org.apache.spark.deploy.master.Master",
            "--host", "127.0.0.1", "--port", str(port), "--webui-port", str(ui),
        )  # fmt: skip
        self.wait(lambda s: s.get("status") == "ALIVE", "the master to be ALIVE")
        if not workers:
            return
        for i in range(self.workers):
            self.start_worker(i)
        self.wait_workers(self.workers)

    def start_worker(
        self, i: int, binds: Sequence[tuple[Path, Path]] = ()
    ) -> subprocess.Popen[Any]:
        """Worker ``i`` (again, after ``kill_worker(i)``), on fresh ports; ``binds`` as
        ``_spawn``'s (a host whose view of a path differs)."""
        return self._spawn(
            f"worker{i}",
            "org.apache.spark.deploy.worker.Worker",
            "--host", "127.0.0.1", "--port", str(free_port()),
            "--webui-port", str(free_port()),
            "--cores", str(self.cores), "--memory", WORKER_MEMORY,
            "--work-dir", str(self.work / "worker" / str(i)),
            self.master_url,
            binds=binds,
        )  # fmt: skip

    def kill_worker(self, i: int) -> None:
        """SIGKILL worker ``i`` with its executors and their Python workers (a lost host)."""
        kill_tree(self.procs.pop(f"worker{i}"))

    def state(self) -> dict[str, Any]:
        with urllib.request.urlopen(f"{self.ui_url}/json/", timeout=5) as r:
            return dict(json.load(r))

    def wait_workers(self, n: int) -> None:
        self.wait(lambda s: s.get("aliveworkers", 0) >= n, f"{n} ALIVE workers")

    def wait(self, ready: Any, what: str, timeout: float = START_TIMEOUT_S) -> None:
        deadline = time.monotonic() + timeout
        while True:
            for name, proc in self.procs.items():
                if proc.poll() is not None:
                    raise RuntimeError(f"spark {name} exited ({proc.returncode}):\n{self.logs()}")
            with contextlib.suppress(OSError, ValueError):
                if ready(self.state()):
                    return
            if time.monotonic() > deadline:
                raise TimeoutError(f"waited {timeout:g} s for {what}:\n{self.logs()}")
            time.sleep(0.5)

    def logs(self, tail: int = 4000) -> str:
        out = []
        for path in sorted(self.work.glob("*.log")):
            out.append(f"--- {path.name}\n{path.read_text(errors='replace')[-tail:]}")
        return "\n".join(out)

    def stop(self) -> None:
        for name in list(self.procs):
            kill_tree(self.procs.pop(name))


@contextlib.contextmanager
def standalone_cluster(work: Path, workers: int = 2) -> Iterator[StandaloneCluster]:
    cluster = StandaloneCluster(work, workers=workers)
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop()


class Driver:
    """``cluster_driver.py`` in its own process group against ``cluster`` (its JVM is its
    child); ``result()`` waits a bounded time, else kills it and everything under it."""

    def __init__(self, cluster: StandaloneCluster, *args: object) -> None:
        self.out = cluster.work / f"driver-{time.monotonic_ns()}.log"
        script = Path(__file__).with_name("cluster_driver.py")
        with open(self.out, "wb") as log:
            self.proc = subprocess.Popen(
                [sys.executable, str(script), cluster.master_url, *map(str, args)],
                stdout=subprocess.PIPE,
                stderr=log,
                stdin=subprocess.DEVNULL,
                env=cluster.env(),
                cwd=cluster.work,
                start_new_session=True,
            )

    def result(self, timeout: float) -> tuple[int, list[dict[str, Any]]]:
        """(exit status, the JSON lines it printed, one per step); a driver still running
        after ``timeout`` seconds is killed and the test fails with its log."""
        try:
            stdout, _ = self.proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise TimeoutError(f"driver still running after {timeout:g} s:\n{self.log()}") from None
        finally:
            kill_tree(self.proc)  # whatever it left behind (its JVM, Python workers)
        steps = []
        for line in stdout.decode(errors="replace").splitlines():
            with contextlib.suppress(ValueError):
                steps.append(dict(json.loads(line)))
        if self.proc.returncode:
            steps.append({"failed": self.log()})
        return self.proc.returncode, steps

    def kill(self) -> None:
        kill_tree(self.proc)

    def log(self, tail: int = 6000) -> str:
        return self.out.read_text(errors="replace")[-tail:]
