"""Examples the stateful suites found, kept as explicit regression tests: each scenario runs
against the model and every backend, and the full observable state must agree."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from pathlib import Path

import pytest

import tidelog
from tidelog import FakeClock

Scenario = Callable[[Callable[[], tidelog.Store]], tidelog.Store]


def observe(store: tidelog.Store) -> dict[str, object]:
    out: dict[str, object] = {}
    for name in store.topics():
        t = store.topic(name, create=False)
        subs = {s: t.subscriber(s).hwm for s in t.subscribers()}
        out[name] = (t.state(), t.read(0, 10**6), subs)
    return out


def run(scenario: Scenario, uri: str, clock: FakeClock) -> dict[str, object]:
    stores: list[tidelog.Store] = []

    def reopen() -> tidelog.Store:
        if stores:
            stores[-1].close()
        stores.append(tidelog.open(uri, clock=clock))
        return stores[-1]

    final = scenario(reopen)
    try:
        return observe(final)
    finally:
        final.close()


def compare(scenario: Scenario, tmp_path: Path) -> None:
    name = "r" + uuid.uuid4().hex[:10]
    results: dict[str, dict[str, object]] = {}
    for uri in (
        f"model://{name}",
        f"memory://{name}",
        f"file://{tmp_path / name}",
        f"file://{tmp_path / name}-bg?checkpoint_bytes=4KiB&progress_flush_ms=5",
    ):
        results[uri] = run(scenario, uri, FakeClock(1_000_000))
    expected = results[f"model://{name}"]
    for uri, got in results.items():
        assert got == expected, f"{uri} differs from the model"


def test_ephemeral_topic_with_its_last_record_deleted_survives_a_clean_restart(
    tmp_path: Path,
) -> None:
    """DUR-1, DUR-5: a clean restart applies the ephemeral rule exactly (only live records are
    lost); the conservative crash rule (everything lost) must not be used after a clean close.
    Found by the file stateful suite."""

    def scenario(reopen: Callable[[], tidelog.Store]) -> tidelog.Store:
        store = reopen()
        t = store.topic("t1", durability="ephemeral")
        t.append(b"x")
        t.delete(2)
        return reopen()

    compare(scenario, tmp_path)


def test_lease_held_at_restart_is_dead_lettered_and_readable(tmp_path: Path) -> None:
    """QUE-7, QUE-8, DUR-2: a job leased when the store closed returns at reopen; at its
    delivery limit it moves to the dead-letter topic, whose (fsync) record must be readable at
    once. Found by the file stateful suite."""

    def scenario(reopen: Callable[[], tidelog.Store]) -> tidelog.Store:
        store = reopen()
        t = store.topic("t0", durability="fsync", max_deliveries=1, dead_letter="dlq", lease_ms=5)
        t.append_many([b""])
        t.claim("n0")
        return reopen()

    compare(scenario, tmp_path)


@pytest.mark.parametrize("scheme", ["memory", "model"])
def test_dead_letter_append_during_claim_is_readable(scheme: str) -> None:
    """QUE-7, TOP-7: a dead-letter move during claim on an fsync topic is visible to readers
    of the dead-letter topic as soon as claim returns."""
    with tidelog.open(f"{scheme}://", clock=FakeClock()) as store:
        t = store.topic("jobs", max_deliveries=1, dead_letter="dead")
        t.append(b"p")
        (lease,) = t.claim("w")
        t.release(lease.seq, lease.lease_id)
        assert [r.payload for r in store.topic("dead").read()] == [b"p"]  # type: ignore[union-attr]
