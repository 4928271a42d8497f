"""What a task checks before it trusts its view of the store (spec/BUNDLES.md SPK-13..SPK-16).

The driver plans from its view; a task reads from its own process's view, on the executor's
host. When the two differ (a stale copy, a network filesystem's cache, another store at the same
path, no store at all) the task must fail loudly: a short range read without an error is silent
loss once the streaming source acknowledges it (SPK-10). No pyspark here.
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass

from tidelog.backends.instances.shared import refuse_plain_open
from tidelog.errors import StorageError, TidelogError
from tidelog.fsio import OsFS

__all__ = [
    "Planned",
    "StaleView",
    "StoreNotVisible",
    "StagingGone",
    "host",
    "check_visible",
    "another_store",
    "behind",
    "missing_attempt",
]

SUPPORTED = (
    "every executor must see the store's directory at the same path with current bytes: local "
    "mode, or executors on the store's host (spec/BUNDLES.md SPK-13)"
)


class StaleView(TidelogError):
    """A task's view of the store is behind its plan, or is another store (SPK-14, SPK-15)."""

    code = "stale_view"


class StoreNotVisible(StorageError):
    """The store (or a write's staging directory) is not there on this host (SPK-16)."""


class StagingGone(StorageError):
    """A task found its attempt directory gone: the write was aborted (or already committed)
    while the task ran. The task fails; its rows were never visible (SPK-7)."""


@dataclass(frozen=True)
class Planned:
    """What a partition was planned from (SPK-14): the store's id (hex), the topic's
    incarnation and its head_seq in the planner's view."""

    store_id: str
    incarnation: int
    head: int


def host() -> str:
    return socket.gethostname()


def _side(planned: Planned | None) -> str:
    return "driver" if planned is None else "executor"


def check_visible(root: str, planned: Planned | None) -> None:
    """Raise ``StoreNotVisible`` unless ``root`` holds a store on this host. ``planned`` is the
    plan a task reads for (None: the planner itself, on the driver)."""
    if os.path.isdir(os.path.join(root, "meta")):
        return
    # a root of several instances is visible: opening it refuses it, saying why (INST-12)
    refuse_plain_open(OsFS(), root)
    what = "does not exist" if not os.path.isdir(root) else "holds no tidelog store (no meta/)"
    if planned is None:
        raise StoreNotVisible(f"{root} {what} on driver host {host()}: no store to read")
    raise StoreNotVisible(
        f"{root} {what} on executor host {host()}, but the driver planned this read from store "
        f"{planned.store_id} there: {SUPPORTED}"
    )


def another_store(root: str, planned: Planned, store_id: str) -> StaleView:
    return StaleView(
        f"the executor's view of {root} on host {host()} is another store (store_id {store_id}, "
        f"the plan's {planned.store_id}): {SUPPORTED}"
    )


def behind(
    root: str, topic: str, head: int, end: int, waited_ms: int | None, why: str = ""
) -> StaleView:
    waited = "" if waited_ms is None else f" after waiting {waited_ms} ms (freshnessTimeoutMs)"
    return StaleView(
        f"the executor's view of {root} on host {host()} is behind the driver's plan (topic "
        f"{topic!r}: its head {head}, the plan's end {end}{why}){waited}: {SUPPORTED}"
    )


def missing_attempt(directory: str, anchor: str, driver_host: str | None) -> StorageError:
    """The error of a write task that found no attempt directory (SPK-16, SPK-7). ``anchor``:
    the staging directory's parent, which no abort removes; ``driver_host``: where the driver
    created the attempt."""
    here = host()
    if not os.path.isdir(anchor):
        return StoreNotVisible(
            f"staging directory {directory} does not exist on executor host {here} (nor does "
            f"{anchor}); the driver created it on host {driver_host or here}: {SUPPORTED}"
        )
    if driver_host is not None and driver_host != here:
        return StoreNotVisible(
            f"staging directory {directory}, created by the driver on host {driver_host}, does "
            f"not exist on executor host {here}: this host does not see the driver's directory "
            f"({SUPPORTED}), or the write was aborted meanwhile (SPK-7)"
        )
    return StagingGone(f"staging directory {directory} is gone: the write job was aborted (SPK-7)")
