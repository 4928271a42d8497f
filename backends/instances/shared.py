"""The shared part of an instances store (spec/INSTANCES.md INST-2, INST-5): ``instances.json``
(identity and count), ``config/<topic>.json`` (a topic's config for every instance), and the
short-lived ``.shared.lock`` that serialises changes to them. Every file is written atomically
(FORMATS.md LAY-3), so a crash leaves it whole or absent. All I/O goes through ``tidelog.fsio``.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from collections.abc import Iterator
from typing import Any, NamedTuple

from tidelog.errors import BadOption, Corrupt, Locked
from tidelog.fsio import FS, Handle, make_dirs, read_whole, replace_file
from tidelog.storedir import Layout

__all__ = [
    "IDENTITY",
    "CONFIG_DIR",
    "INSTANCES_DIR",
    "SHARED_LOCK",
    "LAYOUT",
    "is_instances_root",
    "refuse_plain_open",
    "instance_dir",
    "shared_lock",
    "read_identity",
    "write_identity",
    "read_config",
    "write_config",
    "SharedTopic",
    "read_topic",
    "write_topic",
    "remove_subscribers",
    "LIVE",
    "DROPPING",
    "DROPPED",
    "list_configs",
    "SUBSCRIBERS_DIR",
    "read_subscribers",
    "write_subscriber",
]

IDENTITY = "instances.json"
CONFIG_DIR = "config"
INSTANCES_DIR = "instances"
SUBSCRIBERS_DIR = "subscribers"
SHARED_LOCK = ".shared.lock"
#: INST-6: a topic's states in its shared file
LIVE, DROPPING, DROPPED = "live", "dropping", "dropped"
STATES = (LIVE, DROPPING, DROPPED)
#: how long a change of the shared part waits for another process's change (a few file writes)
LOCK_WAIT_S = 30.0

ROOT_ENTRIES = frozenset(
    {IDENTITY, IDENTITY + ".tmp", CONFIG_DIR, INSTANCES_DIR, SHARED_LOCK, SUBSCRIBERS_DIR}
)


def is_instances_root(fs: FS, root: str) -> bool:
    return fs.exists(os.path.join(root, IDENTITY))


def _is_store(fs: FS, root: str, names: list[str]) -> bool:
    return IDENTITY in names


LAYOUT = Layout("a tidelog instances store", _is_store, ROOT_ENTRIES.__contains__)


def refuse_plain_open(fs: FS, root: str) -> None:
    """INST-1: a root of several instances is never opened as one store (its reader would see
    only part of every topic)."""
    if fs.is_dir(root) and is_instances_root(fs, root):
        n = read_identity(fs, root)["instances"]
        raise BadOption(
            f"{root} is a store of {n} instances: open it with ?instances={n} or "
            "?instances=auto (INST-1)"
        )


def instance_dir(root: str, i: int) -> str:
    return os.path.join(root, INSTANCES_DIR, str(i))


@contextlib.contextmanager
def shared_lock(fs: FS, root: str) -> Iterator[None]:
    """Hold ``.shared.lock`` while the shared part changes (INST-2). Another process holds it
    only for a few file writes, so this waits (up to LOCK_WAIT_S) rather than failing."""
    handle: Handle = fs.open(os.path.join(root, SHARED_LOCK))
    try:
        deadline = time.monotonic() + LOCK_WAIT_S
        delay = 0.001
        while True:
            try:
                handle.lock()
                break
            except Locked:
                if time.monotonic() > deadline:
                    raise Locked(
                        f"{root}: the shared part has been locked by another process for "
                        f"{LOCK_WAIT_S:g} s (INST-2)"
                    ) from None
                time.sleep(delay)
                delay = min(delay * 2, 0.05)
        yield
    finally:
        handle.close()


def _canonical(body: dict[str, Any]) -> bytes:
    return json.dumps(body, separators=(",", ":"), sort_keys=True, ensure_ascii=False).encode()


def _load(fs: FS, path: str, what: str) -> dict[str, Any]:
    raw = read_whole(fs, path)
    try:
        body = json.loads(raw)
    except ValueError:
        body = None
    if not isinstance(body, dict):
        raise Corrupt(f"{path}: {what} is not a JSON object at offset 0 (INST-2)")
    return body


def read_identity(fs: FS, root: str) -> dict[str, Any]:
    path = os.path.join(root, IDENTITY)
    body = _load(fs, path, "the instances identity")
    n = body.get("instances")
    if body.get("version") != 1 or not isinstance(n, int) or not 1 <= n <= 256:
        raise Corrupt(f"{path}: not a version 1 identity with 1..256 instances (INST-2)")
    return body


def write_identity(fs: FS, root: str, n: int) -> dict[str, Any]:
    body = {"instances": n, "store_id": os.urandom(16).hex(), "version": 1}
    replace_file(fs, os.path.join(root, IDENTITY), _canonical(body))
    return body


def _config_path(root: str, name: str) -> str:
    return os.path.join(root, CONFIG_DIR, name + ".json")


class SharedTopic(NamedTuple):
    """A topic's shared file (INST-5, INST-6): its config, shared incarnation and state."""

    config: dict[str, Any]
    incarnation: int
    state: str

    @property
    def live(self) -> bool:
        return self.state == LIVE


def read_topic(fs: FS, root: str, name: str) -> SharedTopic | None:
    """The shared file of topic ``name`` whatever its state (INST-6), or None. A file written
    before incarnations existed is incarnation 1, ``live``."""
    path = _config_path(root, name)
    if not fs.exists(path):
        return None
    body = _load(fs, path, "a topic config")
    config = body.get("config")
    incarnation = body.get("incarnation", 1)
    state = body.get("state", LIVE)
    if (
        body.get("name") != name
        or not isinstance(config, dict)
        or isinstance(incarnation, bool)
        or not isinstance(incarnation, int)
        or incarnation < 1
        or state not in STATES
    ):
        raise Corrupt(f"{path}: not the shared config of topic {name!r} (INST-2, INST-6)")
    return SharedTopic(config, incarnation, state)


def read_config(fs: FS, root: str, name: str) -> dict[str, Any] | None:
    """The shared config of topic ``name`` (its TopicConfig as a dict) while it is ``live``,
    else None (INST-6: a topic that is not live does not exist)."""
    found = read_topic(fs, root, name)
    return found.config if found is not None and found.live else None


def write_topic(
    fs: FS, root: str, name: str, config: dict[str, Any], incarnation: int, state: str
) -> None:
    """Replace the shared file of ``name`` atomically (LAY-3); the caller holds the lock."""
    make_dirs(fs, os.path.join(root, CONFIG_DIR))
    body = {"config": config, "incarnation": incarnation, "name": name, "state": state}
    replace_file(fs, _config_path(root, name), _canonical(body))


def write_config(fs: FS, root: str, name: str, config: dict[str, Any]) -> None:
    write_topic(fs, root, name, config, 1, LIVE)


def list_configs(fs: FS, root: str) -> list[str]:
    """The names of the ``live`` topics, sorted (INST-5, INST-6)."""
    directory = os.path.join(root, CONFIG_DIR)
    if not fs.is_dir(directory):
        return []
    names = sorted(n[:-5] for n in fs.listdir(directory) if n.endswith(".json"))
    return [n for n in names if read_config(fs, root, n) is not None]


def _subscribers_dir(root: str, topic: str) -> str:
    return os.path.join(root, SUBSCRIBERS_DIR, topic)


def read_subscribers(fs: FS, root: str, topic: str) -> dict[str, str]:
    """The merged subscribers of ``topic``: name -> start (INST-15)."""
    directory = _subscribers_dir(root, topic)
    if not fs.is_dir(directory):
        return {}
    out: dict[str, str] = {}
    for entry in sorted(fs.listdir(directory)):
        if entry.endswith(".json"):
            body = _load(fs, os.path.join(directory, entry), "a subscriber")
            start = body.get("start")
            if start not in ("earliest", "latest"):
                raise Corrupt(f"{directory}/{entry}: no valid start (INST-15)")
            out[entry[:-5]] = start
    return out


def remove_subscribers(fs: FS, root: str, topic: str) -> None:
    """INST-6 (3): forget every merged subscriber of ``topic`` (each removal durable)."""
    directory = _subscribers_dir(root, topic)
    if not fs.is_dir(directory):
        return
    for entry in sorted(fs.listdir(directory)):
        fs.unlink(os.path.join(directory, entry))
    fs.fsync_dir(directory)


def write_subscriber(fs: FS, root: str, topic: str, name: str, start: str) -> None:
    directory = _subscribers_dir(root, topic)
    make_dirs(fs, directory)
    replace_file(fs, os.path.join(directory, name + ".json"), _canonical({"start": start}))
