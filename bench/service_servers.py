"""The servers of the service benchmark (``service_cases``): NATS JetStream, Redis and
``tidelog serve``, each in its own process on 127.0.0.1 with its files in the case's temp dir,
started and stopped by PID, every wait bounded.

The peers are the real servers from Debian's packages (``nats-server``, ``redis-server``). When
a binary is missing and the bench runs as root it installs the package with
``apt-get install -y`` (once per process; ``TIDELOG_BENCH_INSTALL_PEERS=0`` turns that off);
otherwise the case raises ``PeerMissing``, an ``ImportError``, which the harness reports as
"not installed" with the reason, as it does for a missing Python peer.

Durability as configured here (and what each acknowledgement means, measured with
``strace -f -e fdatasync,fsync`` on this machine, bench/README.md):

* Redis 7: ``appendonly yes``, ``appendfsync always``: the AOF is fdatasync'ed before the
  replies of an event-loop turn are written (one fdatasync per XADD from one client; one per
  turn, shared by the clients whose commands it read, from several).
* nats-server 2.9.10 (Debian 12): file storage. 2.9 has no ``sync_interval`` option (its
  config parser refuses it: it came with 2.10) and does not fsync per message: a publish is
  acknowledged once ``pwrite`` put it in the page cache, and the message blocks are fsync'ed
  every 2 minutes. So an acknowledged publish survives a crash of nats-server, not power loss.
* tidelog: the topic's durability class (``durability=fsync`` for the durable rows, DUR-1).
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

__all__ = [
    "PeerMissing",
    "ServerProcess",
    "binary",
    "nats_server",
    "redis_server",
    "tidelog_server",
    "INSTALL_ENV",
]

#: bounds on every wait (seconds): a server's start and stop, an apt-get install
START_S, STOP_S, INSTALL_S = 30.0, 10.0, 900.0
#: set to 0 to never install a missing peer (tests do)
INSTALL_ENV = "TIDELOG_BENCH_INSTALL_PEERS"
#: where Debian puts the servers, searched after PATH (a user's PATH often lacks sbin)
EXTRA_DIRS: tuple[str, ...] = ("/usr/sbin", "/usr/bin", "/sbin")
#: bounds the peers are started with: memory they may hold, disk JetStream may fill
NATS_MAX_FILE, NATS_MAX_MEMORY, REDIS_MAX_MEMORY = "4GB", "64MB", "1gb"

_INSTALL_TRIED: dict[str, str | None] = {}  # package -> why the install failed (None: done)


class PeerMissing(ImportError):
    """A peer's server binary is not installed (and was not installed by the bench)."""


def _which(name: str) -> str | None:
    path = os.pathsep.join([os.environ.get("PATH", ""), *EXTRA_DIRS])
    return shutil.which(name, path=path)


def _install(package: str) -> str | None:
    """``apt-get install -y package`` (after an ``apt-get update`` if the first try fails);
    None when it worked, else why not. Tried once per process."""
    if package in _INSTALL_TRIED:
        return _INSTALL_TRIED[package]
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    why: str | None = "apt-get not found"
    if shutil.which("apt-get"):
        sys.stderr.write(f"service bench: installing {package} (apt-get install -y {package})\n")
        for argvs in (
            [["apt-get", "install", "-y", package]],
            [["apt-get", "update"], ["apt-get", "install", "-y", package]],
        ):
            why = None
            for argv in argvs:
                try:
                    done = subprocess.run(argv, env=env, capture_output=True, timeout=INSTALL_S)
                except subprocess.TimeoutExpired:
                    why = f"{' '.join(argv)} took longer than {INSTALL_S:.0f} s"
                    break
                if done.returncode != 0:
                    tail = done.stderr.decode(errors="replace").strip().splitlines()[-1:]
                    why = f"{' '.join(argv)} failed ({done.returncode}): {' '.join(tail)}"
                    break
            if why is None:
                break
    _INSTALL_TRIED[package] = why
    return why


def binary(name: str, package: str) -> str:
    """The path of server binary ``name``; installed from Debian's ``package`` when missing and
    running as root (unless ``TIDELOG_BENCH_INSTALL_PEERS=0``), else ``PeerMissing``."""
    found = _which(name)
    if found:
        return found
    if os.environ.get(INSTALL_ENV, "1") == "0":
        raise PeerMissing(f"{name} not found; not installing it ({INSTALL_ENV}=0)")
    if os.geteuid() != 0:
        raise PeerMissing(
            f"{name} not found; not root, so not installing it (apt-get install {package})"
        )
    why = _install(package)
    found = _which(name)
    if found is None:
        raise PeerMissing(f"{name} not found and not installed: {why or 'no binary after it'}")
    return found


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of process ``pid`` so far, all its threads (``/proc/pid/stat``)."""
    with open(f"/proc/{pid}/stat", encoding="ascii") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class ServerProcess:
    """One server in its own process, its output in ``root/<name>.log``; ready once that log
    matches ``ready`` (whose first group, if any, is the port), stopped by PID."""

    def __init__(
        self, name: str, argv: list[str], root: Path, ready: str, port: int | None = None
    ) -> None:
        self.name = name
        self.log_path = root / f"{name}.log"
        self._log = open(self.log_path, "w+b")  # noqa: SIM115 (closed in stop)
        # cwd: the temp dir, never a checkout (whose ./tidelog `-m` would import instead)
        try:
            self.proc = subprocess.Popen(
                argv, cwd=root, stdout=self._log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL
            )
        except BaseException:
            self._log.close()
            raise
        self.pid = self.proc.pid
        try:
            self.port = self._wait_ready(re.compile(ready), port)
        except BaseException:
            self.stop()
            raise

    def _wait_ready(self, ready: re.Pattern[str], port: int | None) -> int:
        deadline = time.monotonic() + START_S
        while True:
            text = self.log_path.read_text(errors="replace")
            m = ready.search(text)
            if m is not None:
                return int(m.group(1)) if ready.groups else int(port or 0)
            if self.proc.poll() is not None or time.monotonic() > deadline:
                state = (
                    "exited with " + str(self.proc.returncode)
                    if self.proc.poll() is not None
                    else f"not ready in {START_S} s"
                )
                raise RuntimeError(f"{self.name} {state}: {text[-800:]!r}")
            time.sleep(0.005)

    def cpu_s(self) -> float:
        return cpu_seconds(self.pid)

    def log_tail(self, chars: int = 800) -> str:
        return self.log_path.read_text(errors="replace")[-chars:]

    def stop(self) -> None:
        """SIGTERM (a clean stop), SIGKILL if it outlives ``STOP_S``; idempotent."""
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signal.SIGTERM)
            try:
                self.proc.wait(STOP_S)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(self.pid, signal.SIGKILL)
                self.proc.wait(STOP_S)
        self._log.close()

    def __enter__(self) -> ServerProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def nats_server(root: Path) -> ServerProcess:
    """``nats-server`` with JetStream (file storage under ``root/js``) on a free port."""
    exe = binary("nats-server", "nats-server")
    conf = root / "nats.conf"
    conf.write_text(
        'listen: "127.0.0.1:-1"\n'
        f'jetstream {{ store_dir: "{root / "js"}", max_file_store: {NATS_MAX_FILE}, '
        f"max_memory_store: {NATS_MAX_MEMORY} }}\n"
    )
    return ServerProcess(
        "nats-server",
        [exe, "-c", str(conf)],
        root,
        r"client connections on 127\.0\.0\.1:(\d+)[\s\S]*Server is ready",
    )


def redis_server(root: Path) -> ServerProcess:
    """``redis-server`` with the AOF synced on every write (``appendfsync always``), no RDB
    snapshots, files under ``root/redis``. The port is picked free just before the start (a
    race with another process taking it is retried twice)."""
    exe = binary("redis-server", "redis-server")
    data = root / "redis"
    data.mkdir(exist_ok=True)
    for attempt in range(3):
        port = _free_port()
        argv = [
            exe,
            "--bind",
            "127.0.0.1",
            "--port",
            str(port),
            "--dir",
            str(data),
            "--appendonly",
            "yes",
            "--appendfsync",
            "always",
            "--save",
            "",
            "--daemonize",
            "no",
            "--maxmemory",
            REDIS_MAX_MEMORY,
            "--maxmemory-policy",
            "noeviction",
        ]
        try:
            return ServerProcess(
                "redis-server", argv, root, r"Ready to accept connections", port=port
            )
        except RuntimeError as exc:
            if "Address already in use" not in str(exc) or attempt == 2:
                raise
    raise AssertionError("unreachable")


def tidelog_server(root: Path) -> ServerProcess:
    """``tidelog serve`` (the HTTP API under /v0) over a file:// store in ``root/store``."""
    argv = [
        sys.executable,
        "-m",
        "tidelog",
        "serve",
        "--uri",
        f"file://{root / 'store'}",
        "--host",
        "127.0.0.1",
        "--port",
        "0",
    ]
    return ServerProcess("tidelog-serve", argv, root, r"listening on http://127\.0\.0\.1:(\d+)/v0")
