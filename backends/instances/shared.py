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
    "unregistering_subscribers",
    "mark_unregistering",
    "remove_subscriber",
    "REQUEST_TIMEOUT_S",
    "LOCK_MARGIN_S",
    "lock_wait_s",
]

IDENTITY = "instances.json"
CONFIG_DIR = "config"
INSTANCES_DIR = "instances"
SUBSCRIBERS_DIR = "subscribers"
SHARED_LOCK = ".shared.lock"
#: INST-6: a topic's states in its shared file
LIVE, DROPPING, DROPPED = "live", "dropping", "dropped"
STATES = (LIVE, DROPPING, DROPPED)
#: INST-21: R, how long a holder of ``.shared.lock`` waits for other instances' writers to apply
#: one step's XPR-2 requests (their maintenance tick; a hand-off's recovery when nobody holds one)
REQUEST_TIMEOUT_S = 60.0
#: INST-21: W - R, what a waiter for ``.shared.lock`` allows beyond a holder's R (its file writes)
LOCK_MARGIN_S = 30.0
#: INST-22: a subscriber file's state while its unregister is not finished
UNREGISTERING = "unregistering"


def lock_wait_s() -> float:
    """INST-21: W = R + margin, read at each wait (tests shorten R)."""
    return REQUEST_TIMEOUT_S + LOCK_MARGIN_S


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
    """Hold ``.shared.lock`` while the shared part changes (INST-2). A holder keeps it for a
    few file writes and at most one bound R of requests (INST-21), so this waits up to
    W = R + margin: a caller gets ``locked`` here only from a holder stuck outside its
    requests, named by the PID it wrote in the lock file."""
    path = os.path.join(root, SHARED_LOCK)
    handle: Handle = fs.open(path)
    try:
        wait = lock_wait_s()
        deadline = time.monotonic() + wait
        delay = 0.001
        while True:
            try:
                handle.lock()
                break
            except Locked:
                if time.monotonic() > deadline:
                    raise Locked(
                        f"{root}: the shared part has been locked by pid "
                        f"{_holder(handle) or 'unknown'} for {wait:g} s, longer than any "
                        "request it may wait on (INST-21)"
                    ) from None
                time.sleep(delay)
                delay = min(delay * 2, 0.05)
        mark = f"{os.getpid()}\n".encode()  # INST-21: a waiter that gives up names us
        if handle.pread(32, 0) != mark:  # once per process: synced, so no crash state grows
            handle.truncate(0)
            handle.pwrite(mark, 0)
            handle.fsync()
        yield
    finally:
        handle.close()


def _holder(handle: Handle) -> str | None:
    try:
        text = handle.pread(32, 0).decode("ascii", "replace").strip()
    except OSError:
        return None
    return text if text.isdigit() else None


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
    #: INST-6: the instances that may hold a copy of this incarnation (None: a file written
    #: before the list existed, every instance that has a snapshot may)
    copies: tuple[int, ...] | None = None

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
    copies = body.get("copies")
    if (
        body.get("name") != name
        or not isinstance(config, dict)
        or isinstance(incarnation, bool)
        or not isinstance(incarnation, int)
        or incarnation < 1
        or state not in STATES
        or not (copies is None or _instance_list(copies))
    ):
        raise Corrupt(f"{path}: not the shared config of topic {name!r} (INST-2, INST-6)")
    return SharedTopic(config, incarnation, state, None if copies is None else tuple(copies))


def _instance_list(value: object) -> bool:
    return isinstance(value, list) and all(
        isinstance(i, int) and not isinstance(i, bool) and 0 <= i < 256 for i in value
    )


def read_config(fs: FS, root: str, name: str) -> dict[str, Any] | None:
    """The shared config of topic ``name`` (its TopicConfig as a dict) while it is ``live``,
    else None (INST-6: a topic that is not live does not exist)."""
    found = read_topic(fs, root, name)
    return found.config if found is not None and found.live else None


def write_topic(
    fs: FS,
    root: str,
    name: str,
    config: dict[str, Any],
    incarnation: int,
    state: str,
    copies: tuple[int, ...] | None = None,
) -> None:
    """Replace the shared file of ``name`` atomically (LAY-3); the caller holds the lock.
    ``copies`` (INST-6): the instances that may hold a copy; None leaves the list out."""
    make_dirs(fs, os.path.join(root, CONFIG_DIR))
    body: dict[str, Any] = {
        "config": config,
        "incarnation": incarnation,
        "name": name,
        "state": state,
    }
    if copies is not None:
        body["copies"] = sorted(set(copies))
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


def _subscriber_files(fs: FS, root: str, topic: str) -> dict[str, tuple[str, bool]]:
    """name -> (start, unregistering) of every subscriber file of ``topic``."""
    directory = _subscribers_dir(root, topic)
    if not fs.is_dir(directory):
        return {}
    out: dict[str, tuple[str, bool]] = {}
    for entry in sorted(fs.listdir(directory)):
        if entry.endswith(".json"):
            body = _load(fs, os.path.join(directory, entry), "a subscriber")
            start, state = body.get("start"), body.get("state")
            if start not in ("earliest", "latest") or state not in (None, UNREGISTERING):
                raise Corrupt(f"{directory}/{entry}: no valid start and state (INST-15, INST-22)")
            out[entry[:-5]] = (start, state == UNREGISTERING)
    return out


def read_subscribers(fs: FS, root: str, topic: str) -> dict[str, str]:
    """The merged subscribers of ``topic``: name -> start (INST-15); one whose unregister is
    not finished is none (INST-22)."""
    files = _subscriber_files(fs, root, topic)
    return {name: start for name, (start, gone) in files.items() if not gone}


def unregistering_subscribers(fs: FS, root: str, topic: str) -> dict[str, str]:
    """INST-22: name -> start of the subscribers whose unregister a crash or a stuck
    instance left unfinished."""
    files = _subscriber_files(fs, root, topic)
    return {name: start for name, (start, gone) in files.items() if gone}


def mark_unregistering(fs: FS, root: str, topic: str, name: str, start: str) -> None:
    """INST-22 (1): from this durable write on, ``name`` is no subscriber of ``topic``."""
    body = {"start": start, "state": UNREGISTERING}
    replace_file(fs, os.path.join(_subscribers_dir(root, topic), name + ".json"), _canonical(body))


def remove_subscriber(fs: FS, root: str, topic: str, name: str) -> None:
    """INST-22 (3): the subscriber file removed, durably."""
    directory = _subscribers_dir(root, topic)
    fs.unlink(os.path.join(directory, name + ".json"))
    fs.fsync_dir(directory)


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
