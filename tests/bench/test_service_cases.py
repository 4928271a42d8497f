"""The service cases of the benchmark (bench/service_cases.py) run in a tiny mode: tidelog serve,
and each peer whose server and client are installed, get every row with sane figures, checked
against the servers (answered appends stored, consumed records acknowledged); a peer that is not
installed is reported as not measured with the reason, never silently dropped; every server and
load process is gone afterwards. Nothing here checks a speed, and nothing installs a package."""

from __future__ import annotations

import asyncio
import importlib.util
import json
import os
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from tidelog.bench import service_cases, service_servers
from tidelog.bench.measure import Ctx
from tidelog.bench.service_clients import Driver, Live
from tidelog.cli import main

TINY = ["--seconds", "0.01", "--repeats", "1", "--sizes", "100", "--no-plot", "--no-isolated"]
#: system -> (its server binary, its Python client module)
SYSTEMS = {
    "tidelog": (None, None),
    "nats": ("nats-server", "nats"),
    "redis": ("redis-server", "redis"),
}
MEASURES = ("append_c1", "append_c8", "push", "consume")
PRIORITY = ("service_tidelog_prio_idle", "service_tidelog_prio_loaded")


def _installed(system: str) -> bool:
    exe, client = SYSTEMS[system]
    if exe is None or client is None:
        return True
    return service_servers._which(exe) is not None and importlib.util.find_spec(client) is not None


def _bench(tmp: Path, *only: str) -> tuple[dict[str, Any], str]:
    out = tmp / "out"
    args = ["bench", *(x for o in only for x in ("--only", o)), *TINY, "--dir", str(tmp),
            "--out", str(out)]  # fmt: skip
    result = CliRunner().invoke(main, args, catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return json.loads((out / "results.json").read_text()), (out / "table.md").read_text()


def _processes_under(path: Path) -> list[str]:
    """Processes whose command line or working directory is under ``path``."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
            cwd = os.readlink(f"/proc/{pid}/cwd")
        except OSError:  # gone meanwhile, or not ours to read
            continue
        if str(path) in cmd or cwd.startswith(str(path)):
            found.append(f"{pid}: {cmd}")
    return found


@pytest.fixture(scope="module")
def bench(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, Any], str, Path]:
    tmp = tmp_path_factory.mktemp("svcbench")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(service_servers.INSTALL_ENV, "0")
        data, table = _bench(tmp, "service")
    return data, table, tmp


def _rows(data: dict[str, Any]) -> dict[str, dict[str, float]]:
    return {r["id"]: {k: v["median"] for k, v in r["metrics"].items()} for r in data["rows"]}


def test_every_installed_system_has_every_row_and_a_missing_one_says_why(
    bench: tuple[dict[str, Any], str, Path],
) -> None:
    """tidelog always runs; a peer has all its rows when its server binary and client are
    installed, else every one of its cases is listed as not installed with the reason; no
    server or load process outlives the run and no file is left behind."""
    data, _, tmp = bench
    rows = _rows(data)
    expected = {f"service_{s}_{m}" for s in SYSTEMS if _installed(s) for m in MEASURES}
    assert set(rows) == expected | set(PRIORITY)
    for system, (exe, _) in SYSTEMS.items():
        if _installed(system):
            continue
        for m in MEASURES:
            why = data["unavailable"][f"service_{system}_{m}@100"]
            assert why.startswith("not installed: "), why
            assert exe in why or system in why, why
    assert set(data["unavailable"]) == {
        f"service_{s}_{m}@100" for s in SYSTEMS if not _installed(s) for m in MEASURES
    }
    assert _processes_under(tmp) == []
    assert sorted(p.name for p in tmp.iterdir()) == ["out"]


def test_append_rows(bench: tuple[dict[str, Any], str, Path]) -> None:
    """Each client made at least three appends (every answered one checked stored by the case);
    a positive rate; per-request p50 <= p99; CPU figures present and not negative."""
    rows = _rows(bench[0])
    for cid, m in rows.items():
        if "_append_c" not in cid:
            continue
        clients = int(cid.rsplit("_c", 1)[1])
        assert m["clients"] == clients
        assert m["records"] >= 3 * clients and m["rec_per_s"] > 0, (cid, m)
        assert 0 < m["p50_us"] <= m["p99_us"], (cid, m)
        assert m["server_cpu_us_per_rec"] >= 0 and m["client_cpu_us_per_rec"] > 0, (cid, m)


def test_push_rows(bench: tuple[dict[str, Any], str, Path]) -> None:
    """MIN_SAMPLES records, each delivered once; paced (never above RATE);
    0 < min <= p50 <= p99 <= max from before the append to the event; the event measured from
    the append's answer is never later than from before its request (same sample, less)."""
    rows = _rows(bench[0])
    push = {cid: m for cid, m in rows.items() if cid.endswith("_push") or "_prio_" in cid}
    assert {"service_tidelog_push", *PRIORITY} <= set(push)
    for cid, m in push.items():
        assert m["records"] == service_cases.MIN_SAMPLES and m["duplicates"] == 0, (cid, m)
        assert 0 < m["rec_per_s"] <= service_cases.RATE * 1.05, (cid, m)
        assert 0 < m["min_us"] <= m["p50_us"] <= m["p99_us"] <= m["max_us"], (cid, m)
        assert 0 < m["append_p50_us"] <= m["append_p99_us"], (cid, m)
        assert m["after_answer_p50_us"] <= m["p50_us"], (cid, m)
        assert m["after_answer_p99_us"] <= m["p99_us"], (cid, m)
        assert 0 <= m["before_answer_share"] <= 1, (cid, m)


def test_consume_rows(bench: tuple[dict[str, Any], str, Path]) -> None:
    """The prefill is the bounded minimum; the consumer took at least three batches (or all),
    and the server shows exactly that many acknowledged (checked by the case)."""
    rows = _rows(bench[0])
    ctx = Ctx("", 0.01, 100, True)
    for cid, m in rows.items():
        if not cid.endswith("_consume"):
            continue
        assert m["prefill"] == service_cases.prefill_count(ctx) == service_cases.PREFILL_MIN
        assert m["batch"] == service_cases.BATCH and m["rec_per_s"] > 0
        assert m["records"] == m["prefill"] if m["drained"] else m["records"] >= 3 * m["batch"]


def test_priority_rows(bench: tuple[dict[str, Any], str, Path]) -> None:
    """Idle: nothing appended to the low-priority topics. Loaded: they took appends and their
    streams received records while the high-priority topic was measured; the server worked."""
    rows = _rows(bench[0])
    idle, loaded = rows["service_tidelog_prio_idle"], rows["service_tidelog_prio_loaded"]
    assert idle["low_rec_per_s"] == 0
    assert loaded["low_rec_per_s"] > 0 and loaded["low_events"] > 0, loaded
    assert loaded["low_throttled"] >= 0 and loaded["server_cpu_share"] > 0, loaded


def test_service_section_and_targets(bench: tuple[dict[str, Any], str, Path]) -> None:
    """The table's service section has a line per measurement with tidelog's figure and its
    ratio to every measured peer ("not measured" for a missing one), the priority lines, and
    the service targets measured (met or not)."""
    data, table, _ = bench
    assert "## the service on 127.0.0.1" in table
    lines = [x for x in table.splitlines() if x.startswith("| appends/s, 8 clients")]
    assert len(lines) == 1
    assert ("not measured" in lines[0]) == (not all(map(_installed, SYSTEMS))), lines[0]
    rows = {r["id"]: r for r in data["rows"]}
    for peer in ("nats", "redis"):
        if _installed(peer):
            assert rows["service_tidelog_append_c8"]["x_" + peer] > 0
            assert rows["service_tidelog_push"]["x_" + peer + "_p99"] > 0
    assert "x_best_peer" not in rows["service_tidelog_push"]
    assert rows["service_tidelog_prio_loaded"]["x_idle_p99"] > 0
    assert "- loaded: " in table and "- idle: " in table
    targets = {t["id"]: t for t in data["targets"]}
    for key in ("service_push_p50", "service_push_p99", "service_priority"):
        assert targets[key]["met"] in (True, False), targets[key]
    assert (targets["service_append_c8"]["met"] is None) == (not _installed("redis"))


def test_missing_peers_are_reported_not_dropped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With neither server findable and installing off, every peer case is reported as not
    installed with why (no row, nothing started), and the table's "not measured" list says
    so."""
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    monkeypatch.setattr(service_servers, "EXTRA_DIRS", ())
    monkeypatch.setenv(service_servers.INSTALL_ENV, "0")
    for system in ("nats", "redis"):  # past the client check, whether or not it is installed
        start, driver, _ = service_cases.SYSTEMS[system]
        monkeypatch.setitem(service_cases.SYSTEMS, system, (start, driver, None))
    data, table = _bench(tmp_path, "service_nats", "service_redis")
    assert data["rows"] == []
    for system in ("nats", "redis"):
        for m in MEASURES:
            why = data["unavailable"][f"service_{system}_{m}@100"]
            assert why == (f"not installed: {system}-server not found; not installing it "
                           f"({service_servers.INSTALL_ENV}=0)")  # fmt: skip
            assert f"- service_{system}_{m}@100: {why}" in table
    assert "## the service" not in table  # no row to show: the list above says why


def test_a_missing_client_library_is_reported_before_any_server_starts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def no_server(root: Path) -> service_servers.ServerProcess:
        raise AssertionError("a server was started for a peer without its client")

    monkeypatch.setitem(
        service_cases.SYSTEMS, "redis", (no_server, "RedisDriver", "no_such_redis_client")
    )
    data, _ = _bench(tmp_path, "service_redis_push")
    assert data["unavailable"] == {
        "service_redis_push@100": "not installed: no_such_redis_client (the redis client; "
        "pip install 'tidelog[bench]')"
    }


def test_a_missing_server_is_installed_only_as_root(monkeypatch: pytest.MonkeyPatch) -> None:
    """Not root: no install is tried. Root (and allowed): apt-get is asked once per package and
    its failure is the reason given."""
    tried: list[str] = []

    def fake_install(package: str) -> str | None:
        tried.append(package)
        return "apt-get install -y p failed (100): E: Unable to locate package p"

    monkeypatch.setenv("PATH", "/nonexistent")
    monkeypatch.setattr(service_servers, "EXTRA_DIRS", ())
    monkeypatch.setattr(service_servers, "_install", fake_install)
    monkeypatch.delenv(service_servers.INSTALL_ENV, raising=False)
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    with pytest.raises(service_servers.PeerMissing, match=r"not root, so not installing it"):
        service_servers.binary("no-such-server", "p")
    assert tried == []
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    with pytest.raises(ImportError, match=r"not found and not installed: apt-get install -y p"):
        service_servers.binary("no-such-server", "p")
    assert tried == ["p"]


class _Srv:
    """A stand-in server for the case functions: no process, no CPU."""

    port = 0

    def cpu_s(self) -> float:
        return 0.0


class _FakeDriver(Driver):
    """An in-process stand-in that answers every append and can lose some: every
    ``lose_every``-th append is not stored, index ``drop`` never reaches the live stream, a
    batch's ack covers one record less than it should when ``short_ack``."""

    name = "fake"

    def __init__(self, lose_every: int = 0, drop: int = -1, short_ack: bool = False) -> None:
        super().__init__(0, "t")
        self.lose_every, self.drop, self.short_ack = lose_every, drop, short_ack
        self.appended = 0
        self.on_payload: Any = None

    async def setup(self) -> None:
        pass

    async def appender(self) -> tuple[Any, Any]:
        async def append(data: bytes) -> None:
            self.appended += 1
            if self.on_payload is not None and int.from_bytes(data[:8], "big") != self.drop:
                self.on_payload(data)

        return append, lambda: None

    async def stored(self) -> int:
        return self.appended - (self.appended // self.lose_every if self.lose_every else 0)

    async def live(self, on_payload: Any) -> Live:
        self.on_payload = on_payload
        return Live(lambda: None)

    async def prefill(self, n: int, data: bytes) -> None:
        self.appended = n

    async def consumer(self, batch: int) -> tuple[Any, Any]:
        async def fetch() -> int:
            return batch

        async def ack() -> int:
            return batch - 1 if self.short_ack else batch

        return fetch, ack


def test_an_answered_append_that_is_not_stored_fails_the_case() -> None:
    ctx = Ctx("", 0.01, 100, True)
    with pytest.raises(RuntimeError, match=r"fake: \d+ appends answered, \d+ stored"):
        asyncio.run(service_cases._append_rate(ctx, _FakeDriver(lose_every=10), _Srv(), 2))
    m = asyncio.run(service_cases._append_rate(ctx, _FakeDriver(), _Srv(), 2))
    assert m["records"] >= 6 and m["clients"] == 2


def test_a_record_the_live_stream_never_gets_fails_the_case(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(service_cases, "STUCK_S", 0.2)
    ctx = Ctx("", 0.0, 100, True)
    total = service_cases.WARM + service_cases.MIN_SAMPLES
    drv = _FakeDriver(drop=service_cases.WARM + 5)
    with pytest.raises(RuntimeError, match=rf"fake: 1 of {total} records not delivered within"):
        asyncio.run(service_cases._push(ctx, drv, _Srv()))
    m = asyncio.run(service_cases._push(ctx, _FakeDriver(), _Srv()))
    assert m["records"] == service_cases.MIN_SAMPLES and m["duplicates"] == 0


def test_a_short_acknowledgement_fails_the_consume_case() -> None:
    ctx = Ctx("", 0.01, 100, True)
    with pytest.raises(RuntimeError, match=r"fake: 99 records acknowledged of a batch of 100"):
        asyncio.run(service_cases._consume(ctx, _FakeDriver(short_ack=True), _Srv()))
