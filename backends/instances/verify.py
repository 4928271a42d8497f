"""``tidelog verify`` of an instances root (spec/INSTANCES.md INST-20, INST-23): the shared part
(identity, topic files, subscriber files), then every instance as a ``file://`` store, its
findings prefixed by the instance, then each instance's copies of the topics against the
shared configs, and the shared lists (a topic's ``copies``, a subscriber's ``unregistering``)
against what the instances hold. Never raises on bad content; refuses nothing it can read."""

from __future__ import annotations

import os
from dataclasses import replace
from typing import Any

from tidelog.clock import SystemClock
from tidelog.config import TopicConfig
from tidelog.errors import TidelogError
from tidelog.fsio import FS
from tidelog.model.instances import share_config
from tidelog.report import ERROR, INFO, WARNING, Problem, Report

from ..file.options import parse_file_options
from ..file.store import FileBackend
from ..file.verify import verify_store
from . import shared
from .backend import _has_snapshot

__all__ = ["is_instances_root", "verify_instances"]


def is_instances_root(fs: FS, path: str) -> bool:
    """``path`` is an instances root: a directory holding ``instances.json`` (INST-2)."""
    try:
        return fs.is_dir(path) and shared.is_instances_root(fs, path)
    except OSError:
        return False


class _Check:
    def __init__(self, fs: FS, root: str) -> None:
        self.fs, self.root = fs, root
        self.report = Report(root)

    def add(self, path: str, rule: str, severity: str, message: str) -> None:
        self.report.problems.append(Problem(path, None, rule, severity, message))

    def read(self, path: str, rule: str, what: Any) -> Any:
        """``what()``, or None with an error when it raises (damage or I/O)."""
        self.report.files_checked += 1
        try:
            return what()
        except (TidelogError, OSError) as exc:
            self.add(path, rule, ERROR, str(exc))
            return None


def _entries(c: _Check, sub: str) -> list[tuple[str, str]]:
    """(name, path) of each entry of the root's directory ``sub``, sorted; none if absent."""
    directory = os.path.join(c.root, sub)
    if not c.fs.is_dir(directory):
        return []
    return [(e, os.path.join(directory, e)) for e in sorted(c.fs.listdir(directory))]


def verify_instances(fs: FS, root: str) -> Report:
    """INST-20: check the instances root ``root``."""
    c = _Check(fs, root)
    identity = c.read(
        os.path.join(root, shared.IDENTITY), "INST-2", lambda: shared.read_identity(fs, root)
    )
    if identity is None:
        return c.report  # without N nothing else can be judged
    n: int = identity["instances"]
    topics = _check_topics(c, n)
    held = _check_instances(c, n, topics)
    _check_listing(c, n, topics, held)
    _check_subscribers(c, topics, held)
    return c.report


#: What one instance holds, as its read-only view shows it: topic -> the subscribers its copy
#: registers; None for an instance that cannot be judged (INST-23).
_Held = dict[str, list[str]]


def _check_topics(c: _Check, n: int) -> dict[str, shared.SharedTopic]:
    """Every shared topic file whole and valid (INST-5, INST-6, INST-9)."""
    fs, root = c.fs, c.root
    out: dict[str, shared.SharedTopic] = {}
    for entry, path in _entries(c, shared.CONFIG_DIR):
        if not entry.endswith(".json"):
            continue  # a .tmp a crash left: the next write replaces it (LAY-3)
        name = entry[:-5]
        found = c.read(path, "INST-5", lambda name=name: shared.read_topic(fs, root, name))
        if found is None:
            continue
        try:
            share_config(name, TopicConfig(**found.config), n)
        except (TypeError, TidelogError) as exc:
            c.add(path, "INST-9", ERROR, f"not a valid topic config: {exc}")
            continue
        out[name] = found
        for problem in _listing_problems(found, n):
            c.add(path, "INST-23", ERROR, f"topic {name!r}: {problem}")
    return out


def _listing_problems(found: shared.SharedTopic, n: int) -> list[str]:
    """INST-23: a ``copies`` list no crash can leave, judged from the file alone."""
    copies = found.copies or ()
    out = [
        f"field copies names instance {i}, not one of the {n} (INST-6)" for i in copies if i >= n
    ]
    if copies and found.state == shared.DROPPED:
        out.append(f"field copies lists {list(copies)} while field state is dropped (INST-6)")
    return out


def _check_listing(
    c: _Check, n: int, topics: dict[str, shared.SharedTopic], held: dict[int, _Held | None]
) -> None:
    """INST-23: each topic's ``copies`` against the copies the instances hold."""
    for name, found in topics.items():
        if found.copies is None or found.state == shared.DROPPED:
            continue  # an earlier version's file; a dropped list is judged by the file alone
        path = os.path.join(c.root, shared.CONFIG_DIR, name + ".json")
        for i in range(n):
            one = held.get(i, {})  # no directory: it holds nothing
            if one is None:
                continue  # cannot be judged (INST-20 reports why)
            has, listed = name in one, i in found.copies
            if has and not listed:
                c.add(
                    path,
                    "INST-23",
                    ERROR,
                    f"topic {name!r}: instance {i} holds a copy but field copies does not list "
                    "it: no crash leaves that, and a drop would never reach the copy (INST-6)",
                )
            elif listed and not has and found.live:
                c.add(
                    path,
                    "INST-23",
                    INFO,
                    f"topic {name!r}: field copies lists instance {i}, which holds no copy: a "
                    "crash between the listing and the copy; the instance's next open of the "
                    "topic makes it (INST-6)",
                )


def _check_subscribers(
    c: _Check, topics: dict[str, shared.SharedTopic], held: dict[int, _Held | None]
) -> None:
    fs, root = c.fs, c.root
    for topic, path in _entries(c, shared.SUBSCRIBERS_DIR):
        subs = c.read(path, "INST-15", lambda t=topic: shared.read_subscribers(fs, root, t))
        if subs is None:
            continue  # an error already
        gone = shared.unregistering_subscribers(fs, root, topic)
        found = topics.get(topic)
        if (subs or gone) and (found is None or not found.live):
            c.add(path, "INST-6", WARNING, f"subscribers of topic {topic!r}, which is not live")
            continue
        for name in sorted(gone):
            _check_unregistering(c, os.path.join(path, name + ".json"), topic, name, held)


def _check_unregistering(
    c: _Check, path: str, topic: str, name: str, held: dict[int, _Held | None]
) -> None:
    """INST-23: a subscriber file left ``unregistering`` (INST-22)."""
    still = [i for i, one in sorted(held.items()) if one and name in one.get(topic, [])]
    what = f"subscriber {name!r} of topic {topic!r}: field state is unregistering (INST-22)"
    then = f"the next subscribe of {name!r} finishes the unregister first (INST-15)"
    if still:
        where = ", ".join(str(i) for i in still)
        c.add(
            path,
            "INST-23",
            WARNING,
            f"{what}, and instances {where} still register it and hold records for it "
            f"(SUB-5): {then}",
        )
    else:
        c.add(path, "INST-23", INFO, f"{what}, no instance registers it any more: {then}")


def _check_instances(
    c: _Check, n: int, topics: dict[str, shared.SharedTopic]
) -> dict[int, _Held | None]:
    """Every instance checked; what each holds (None: it cannot be judged)."""
    fs = c.fs
    held: dict[int, _Held | None] = {}
    for entry, path in _entries(c, shared.INSTANCES_DIR):
        if not (entry.isdigit() and str(int(entry)) == entry and int(entry) < n):
            c.add(path, "INST-2", ERROR, f"not an instance of a store of {n} instances")
            continue
        i = int(entry)
        if not _has_snapshot(fs, path):
            if fs.listdir(path):
                c.add(path, "INST-3", WARNING, f"instance {i} has no snapshot (never created)")
            held[i] = {}  # never created: it holds no copy
            continue
        one = verify_store(fs, path)
        c.report.files_checked += one.files_checked
        for p in one.problems:
            c.report.problems.append(replace(p, message=f"instance {i}: {p.message}"))
        held[i] = _check_copies(c, i, path, n, topics) if one.ok else None
    return held


def _check_copies(
    c: _Check, i: int, path: str, n: int, topics: dict[str, shared.SharedTopic]
) -> _Held | None:
    """Each copy of a topic in instance ``i`` against its shared file (INST-5, INST-6); what
    the instance holds (None: it does not open)."""
    store_options, fopts = parse_file_options({"readonly": True, "background": False})
    try:
        view = FileBackend(c.fs, path, SystemClock(), store_options, fopts)
    except (TidelogError, OSError) as exc:
        c.add(path, "INST-20", ERROR, f"instance {i}: does not open read-only: {exc}")
        return None
    held: _Held = {}
    try:
        for name in view.list_topics():
            ref = view.open_topic(name, {}, False)
            held[name] = view.subscribers(ref)
            found = topics.get(name)
            where = f"instance {i}: topic {name!r}"
            if found is None:
                c.add(path, "INST-5", ERROR, f"{where} has no valid shared config")
            elif found.state == shared.DROPPING:
                c.add(path, "INST-6", WARNING, f"{where} is a copy of a half-dropped topic")
            elif not found.live:
                c.add(path, "INST-6", ERROR, f"{where} is a copy of a dropped topic")
            else:
                want = share_config(name, TopicConfig(**found.config), n)
                got = view.topic_config(ref)
                if got != want:
                    c.add(path, "INST-9", ERROR, f"{where}: its config is not the shared one")
    finally:
        view.close()
    return held
