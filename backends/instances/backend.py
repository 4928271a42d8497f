"""A store of several instances (spec/INSTANCES.md): this process's own instance is a
``FileBackend`` writer taken from the first free slot (INST-3); every other instance is read
through a read-only view (XPR-1) refreshed before each merged read (INST-7). Nothing here
touches the WAL or segments: each instance is a complete ``file://`` store.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from typing import Any

from tidelog import dirlock, storedir
from tidelog.backend import Backend, Capabilities, StoreOptions, TopicRef
from tidelog.clock import Clock
from tidelog.config import DURABILITY_CLASSES, TopicConfig
from tidelog.errors import (
    ERROR_CODES,
    BadArgument,
    BadOption,
    BadURI,
    Closed,
    Corrupt,
    Locked,
    NoSuchSubscriber,
    NoSuchTopic,
    NotAvailable,
    ReadOnly,
    StorageError,
)
from tidelog.fsio import FS, io_errors, make_dirs
from tidelog.model.instances import (
    Entry,
    cursor_text,
    parse_cursor,
    share_config,
    share_options,
)
from tidelog.records import Item, TopicState

from ..file import requests
from ..file.format import snapshot as snapfmt
from ..file.options import FileOptions
from ..file.progressfiles import read_progress
from ..file.store import FileBackend
from . import shared
from .merge import merge

__all__ = ["InstancesBackend", "CAPABILITIES"]

#: INST-10: deletes reach other instances through XPR-2 (INST-19); queue and routers need
#: writes into other instances on every op and are not claimed
CAPABILITIES = Capabilities(
    persistent=True,
    crash_safe=True,
    deletes=True,
    subscribers=False,
    queue=False,
    multi_topic=True,
    exact_progress=True,
    routers=False,
    durability=frozenset(DURABILITY_CLASSES),
)


def _has_snapshot(fs: FS, directory: str) -> bool:
    meta = os.path.join(directory, "meta")
    return fs.is_dir(meta) and any(snapfmt.parse_file_name(n) is not None for n in fs.listdir(meta))


def _outcome(result: dict[str, Any], fine: tuple[str, ...]) -> None:
    """An XPR-2 outcome: ok, or an error code the caller expects, else raised with its code
    (INST-15)."""
    if result.get("ok") or result.get("code") in fine:
        return
    cls = ERROR_CODES.get(str(result.get("code")), StorageError)
    raise cls(f"{result.get('message')} (an XPR-2 request, INST-15)")


class InstancesBackend(Backend):
    capabilities = CAPABILITIES

    def __init__(
        self,
        fs: FS,
        root: str,
        clock: Clock,
        count: int | None,
        options: StoreOptions,
        fopts: FileOptions,
    ) -> None:
        self.fs, self.root, self.clock, self.fopts = fs, root, clock, fopts
        self.readonly = fopts.readonly
        self.closed = False
        self.lock = threading.Lock()  # the views and the config cache
        self.own: FileBackend | None = None
        self.slot: int | None = None
        self.views: dict[int, FileBackend] = {}
        self.configs: dict[str, tuple[int, TopicConfig]] = {}  # name -> (g, shared config)
        self.locals: dict[TopicRef, TopicRef] = {}  # (name, g) -> the own instance's copy
        if fs.is_dir(os.path.join(root, "meta")):
            raise BadOption(
                f"{root} is a single-instance store: open it without the instances option (INST-1)"
            )
        if self.readonly:
            with io_errors(f"opening the instances of {root} read-only"):
                if not shared.is_instances_root(fs, root):
                    raise StorageError(f"{root} is not a tidelog instances store (INST-4)")
                self.n = self._check_count(shared.read_identity(fs, root)["instances"], count)
                self.options = share_options(options, self.n)
                self._open_views()
            return
        with io_errors(f"opening the instances of {root}"):
            creation = self._prepare_root()
            fresh = not creation.was_store and not fs.listdir(root)
            try:
                with shared.shared_lock(fs, root):
                    if shared.is_instances_root(fs, root):
                        n = shared.read_identity(fs, root)["instances"]
                        self.n = self._check_count(n, count)
                        self.options = share_options(options, self.n)
                    else:  # checked before the identity is written (URI-2)
                        self.n = count if count is not None else (os.cpu_count() or 1)
                        self.options = share_options(options, self.n)
                        shared.write_identity(fs, root, self.n)
                self._take_slot()
            except BaseException:
                creation.owned = fresh
                creation.undo()  # URI-8: a failed creation leaves nothing behind
                raise

    def _prepare_root(self) -> storedir.Creation:
        """URI-8's check and creation of the root. Workers started together open a new store
        at once: when another one made the root between this one's check and its mkdir, the
        check is made again (it is a directory now), not refused."""
        fs, root = self.fs, self.root
        try:
            return storedir.prepare(fs, root, shared.LAYOUT, self.fopts.create)
        except (BadURI, StorageError):
            if not fs.is_dir(root):
                raise
            return storedir.prepare(fs, root, shared.LAYOUT, self.fopts.create)

    def _check_count(self, stored: int, count: int | None) -> int:
        if count is not None and count != stored:
            raise BadOption(
                f"option instances={count}: the store at {self.root} has {stored} instances, "
                f"fixed at creation (pass instances={stored} or auto; INST-1)"
            )
        return stored

    # -- slots (INST-3) and views (INST-4) --------------------------------------------------
    def _take_slot(self) -> None:
        make_dirs(self.fs, os.path.join(self.root, shared.INSTANCES_DIR))
        fopts = replace(self.fopts, create="true")
        holders: list[str] = []
        for i in range(self.n):
            directory = shared.instance_dir(self.root, i)
            self._ensure_dir(directory)
            try:
                self.own = FileBackend(self.fs, directory, self.clock, self.options, fopts)
            except Locked:
                holders.append(f"{i}: pid {dirlock.holder(self.fs, directory) or 'unknown'}")
                continue
            self.slot = i
            return
        raise Locked(
            f"every one of the {self.n} instance slots of {self.root} is held "
            f"({', '.join(holders)}); INST-3"
        )

    def _ensure_dir(self, directory: str) -> None:
        """INST-2: an instance directory is made under ``.shared.lock``, so openers racing for
        a new slot never see it half made (a check that finds it missing, then an existing
        entry, was a URI-8 refusal); one made meanwhile by anyone is fine."""
        if self.fs.is_dir(directory):
            return
        with shared.shared_lock(self.fs, self.root):
            if not self.fs.is_dir(directory):
                with contextlib.suppress(FileExistsError):
                    self.fs.mkdir(directory)
                self.fs.fsync_dir(os.path.dirname(directory))

    def _open_views(self) -> None:
        """A view of every other instance that has a snapshot and none yet (INST-4)."""
        view_opts = replace(self.fopts, readonly=True, background=False, create="false")
        for i in range(self.n):
            if i == self.slot or i in self.views:
                continue
            directory = shared.instance_dir(self.root, i)
            if not _has_snapshot(self.fs, directory):
                continue
            try:
                self.views[i] = FileBackend(self.fs, directory, self.clock, self.options, view_opts)
            except StorageError:
                continue  # raced with its creation: the next refresh opens it

    def refresh(self) -> None:
        """INST-4: every view catches up, and instances created since get one."""
        with self.lock:
            self._check_open()
            for view in self.views.values():
                view.refresh()
            with io_errors(f"refreshing the instances of {self.root}"):
                self._open_views()

    def _check_open(self) -> None:
        if self.closed:
            raise Closed(f"store {self.root} is closed")

    def _writer(self) -> FileBackend:
        self._check_open()
        if self.own is None:
            raise ReadOnly("this instances store was opened read-only (readonly=true, INST-4)")
        return self.own

    # -- topics (INST-5, INST-6) ------------------------------------------------------------
    def _shared_topic(self, name: str) -> shared.SharedTopic | None:
        with io_errors(f"reading the config of topic {name!r} in {self.root}"):
            return shared.read_topic(self.fs, self.root, name)

    def open_topic(self, name: str, options: Mapping[str, object], create: bool) -> TopicRef:
        """INST-5, INST-6: the ref carries the shared incarnation; the own instance's copy is
        made only under ``.shared.lock`` while the shared file is ``live``."""
        self._check_open()
        found = self._shared_topic(name)
        if self.readonly:
            if found is None or not found.live:
                if create:
                    raise ReadOnly(f"cannot create topic {name!r}: the store is read-only")
                raise NoSuchTopic(f"topic {name!r} does not exist")
            self._config(name, found.config).check_matches(name, options)
            return TopicRef(name, found.incarnation)
        own = self._writer()
        if found is not None and found.live:
            self._config(name, found.config).check_matches(name, options)
            try:
                local = own.open_topic(name, {}, False)
            except NoSuchTopic:
                pass
            else:
                again = self._shared_topic(name)  # a drop and a new incarnation meanwhile
                if again == found:
                    return self._opened(name, found, local, locked=False)
        elif not create:
            raise NoSuchTopic(f"topic {name!r} does not exist")
        with (
            io_errors(f"creating topic {name!r} in {self.root}"),
            shared.shared_lock(self.fs, self.root),
        ):
            found = shared.read_topic(self.fs, self.root, name)
            if found is None or not found.live:
                if not create:
                    raise NoSuchTopic(f"topic {name!r} does not exist")
                config = TopicConfig.from_options(name, options)
                share_config(name, config, self.n)  # refused before anything is written
                if found is not None and found.state == shared.DROPPING:
                    self._finish_drop(name, found)  # a crash left it half dropped (INST-6)
                g = 1 if found is None else found.incarnation + 1
                found = shared.SharedTopic(config.to_dict(), g, shared.LIVE, ())
            config = self._config(name, found.config)
            config.check_matches(name, options)
            slot = self.slot
            assert slot is not None  # _writer() above: a writer holds its slot
            if found.copies is not None and slot not in found.copies:
                # INST-6: listed before the copy is made, so a drop reaches every copy
                found = found._replace(copies=(*found.copies, slot))
                shared.write_topic(
                    self.fs,
                    self.root,
                    name,
                    found.config,
                    found.incarnation,
                    found.state,
                    found.copies,
                )
            local = own.open_topic(name, share_config(name, config, self.n).to_dict(), True)
            return self._opened(name, found, local, locked=True)

    def _opened(
        self, name: str, found: shared.SharedTopic, local: TopicRef, locked: bool
    ) -> TopicRef:
        """The own copy ``local`` of ``name`` at shared incarnation ``found``: its merged
        subscribers registered (INST-15), remembered for this incarnation's handles."""
        own = self._writer()
        with io_errors(f"reading the subscribers of topic {name!r} in {self.root}"):
            missing = set(shared.read_subscribers(self.fs, self.root, name))
            missing -= set(own.subscribers(local))
            if missing and locked:
                self._register_own(name, local)
            elif missing:  # INST-22: registered only under the lock, never after an unregister
                with shared.shared_lock(self.fs, self.root):
                    if shared.read_topic(self.fs, self.root, name) == found:
                        self._register_own(name, local)
        ref = TopicRef(name, found.incarnation)
        with self.lock:
            self.configs[name] = (found.incarnation, self._config(name, found.config))
            self.locals[ref] = local
        return ref

    def _register_own(self, name: str, local: TopicRef) -> None:
        """INST-15 in the own instance, under ``.shared.lock``: every merged subscriber the
        shared part has, after the instance's pending requests (INST-21)."""
        own = self._writer()
        own.apply_requests()
        have = own.subscribers(local)
        for sub, start in shared.read_subscribers(self.fs, self.root, name).items():
            if sub not in have:
                own.subscribe(local, sub, start)
                own.flush_subscriber(local, sub)  # its progress file: other processes see it

    def _local(self, ref: TopicRef) -> TopicRef:
        """The own instance's copy behind a handle of shared incarnation ``ref.incarnation``:
        gone once the topic was dropped (TOP-10, INST-6)."""
        local = self.locals.get(ref)
        if local is None:
            raise NoSuchTopic(f"topic {ref.name!r} was dropped (TOP-10, INST-6)")
        return local

    def check_live(self, ref: TopicRef) -> None:
        """INST-6: the topic is still ``live`` at the handle's incarnation, else
        ``no_such_topic``; a merged read checks this after reading the instances."""
        found = self._shared_topic(ref.name)
        if found is None or not found.live or found.incarnation != ref.incarnation:
            raise NoSuchTopic(f"topic {ref.name!r} was dropped (TOP-10, INST-6)")

    def _config(self, name: str, stored: dict[str, Any]) -> TopicConfig:
        try:
            return TopicConfig(**stored)
        except TypeError:
            raise Corrupt(f"{self.root}: the shared config of topic {name!r} is not one") from None

    def topic_config(self, ref: TopicRef) -> TopicConfig:
        """The topic's shared config (its caps undivided, INST-9)."""
        self._check_open()
        with self.lock:
            cached = self.configs.get(ref.name)
        if cached is not None and cached[0] == ref.incarnation:
            return cached[1]
        found = self._shared_topic(ref.name)
        if found is None or not found.live or found.incarnation != ref.incarnation:
            raise NoSuchTopic(f"topic {ref.name!r} does not exist")
        return self._config(ref.name, found.config)

    def list_topics(self) -> list[str]:
        self._check_open()
        with io_errors(f"listing the topics of {self.root}"):
            return shared.list_configs(self.fs, self.root)

    def drop_topic(self, name: str) -> None:
        """INST-6: ``dropping``, every instance's copy dropped, the merged subscribers
        forgotten, ``dropped``; all under ``.shared.lock``."""
        self._check_open()
        self._writer()
        with (
            io_errors(f"dropping topic {name!r} in {self.root}"),
            shared.shared_lock(self.fs, self.root),
        ):
            found = shared.read_topic(self.fs, self.root, name)
            if found is None or found.state == shared.DROPPED:
                raise NoSuchTopic(f"topic {name!r} does not exist")
            if found.live:
                found = found._replace(state=shared.DROPPING)
                shared.write_topic(self.fs, self.root, name, *found)
            self._finish_drop(name, found)

    def _finish_drop(self, name: str, found: shared.SharedTopic) -> None:
        """INST-6 steps (2) to (4); the caller holds ``.shared.lock`` and the state is
        ``dropping``. Every step may be done again after a crash."""
        own = self._writer()
        own.apply_requests()  # INST-21: none left behind overtakes this drop or what follows
        if name in own.list_topics():
            own.drop_topic(name)
            own.flush()  # durable before the state says dropped
        targets = self._targets(found)
        results = self._round({i: {"op": "drop", "topic": name} for i in targets}, "drop")
        for result in results.values():
            _outcome(result, ("no_such_topic",))
        with self.lock:
            for ref in [r for r in self.locals if r.name == name]:
                del self.locals[ref]
            self.configs.pop(name, None)
        shared.remove_subscribers(self.fs, self.root, name)
        shared.write_topic(
            self.fs, self.root, name, found.config, found.incarnation, shared.DROPPED, ()
        )

    def _targets(self, found: shared.SharedTopic) -> list[int]:
        """INST-6: the other instances that may hold a copy of ``found``'s incarnation, for a
        caller holding ``.shared.lock`` (no copy is made meanwhile): those its file lists,
        or, for a file from before the list, every one that has a snapshot."""
        if found.copies is not None:
            return [i for i in found.copies if i != self.slot and i < self.n]
        return [
            i
            for i in range(self.n)
            if i != self.slot and _has_snapshot(self.fs, shared.instance_dir(self.root, i))
        ]

    def _request(self, i: int, body: dict[str, Any]) -> dict[str, Any]:
        """An XPR-2 request to instance ``i`` (INST-21's bound)."""
        return self._round({i: body}, str(body.get("op")))[i]

    def _round(self, bodies: dict[int, dict[str, Any]], what: str) -> dict[int, dict[str, Any]]:
        """INST-21: one step's XPR-2 requests, submitted to every instance at once through
        this store's file system, each applied by the instance's writer or here when nobody
        holds it (XPR-3's hand-off), all within one bound R; an instance that has not applied
        its request by then is ``locked`` naming it and its holder's PID."""
        handoff = replace(self.fopts, readonly=False, background=False, create="false")
        deadline = time.monotonic() + shared.REQUEST_TIMEOUT_S
        ids = {
            i: requests.submit(self.fs, shared.instance_dir(self.root, i), body)
            for i, body in bodies.items()
        }
        results: dict[int, dict[str, Any]] = {}
        delay = 0.005
        while True:
            for i, rid in ids.items():
                if i in results:
                    continue
                directory = shared.instance_dir(self.root, i)
                result = requests.outcome(self.fs, directory, rid)
                if result is None:
                    try:  # opening it applies every pending request (XPR-3)
                        FileBackend(self.fs, directory, self.clock, self.options, handoff).close()
                    except Locked:
                        continue  # its holder's maintenance tick applies the request
                    result = requests.outcome(self.fs, directory, rid)
                if result is not None:
                    results[i] = result
            if len(results) == len(ids):
                return results
            if time.monotonic() > deadline:
                stuck = ", ".join(
                    f"instance {i} (held by pid "
                    f"{dirlock.holder(self.fs, shared.instance_dir(self.root, i)) or 'unknown'})"
                    for i in ids
                    if i not in results
                )
                raise Locked(
                    f"{self.root}: {stuck} did not apply the {what} request within "
                    f"{shared.REQUEST_TIMEOUT_S:g} s: is its holder stuck? (INST-21, XPR-2)"
                )
            time.sleep(delay)
            delay = min(delay * 2, 0.1)

    # -- the own instance (INST-10) ---------------------------------------------------------
    def append(
        self,
        ref: TopicRef,
        payloads: Sequence[bytes],
        tag: str | None,
        node: str | None,
        producer: tuple[str, int] | None = None,
    ) -> list[int]:
        own = self._writer()
        return own.append(self._local(ref), payloads, tag, node, producer)

    def lane(self, ref: TopicRef) -> Callable[[bytes], int | None] | None:
        """The own instance's lane (INST-10): it checks that instance's store is open on every
        call, which close() closes right after this one (an append racing it is flushed)."""
        own = self.own
        if own is None or self.closed or ref not in self.locals:
            return None
        return own.lane(self.locals[ref])

    def append_records(
        self,
        ref: TopicRef,
        records: Sequence[tuple[bytes, str | None, str | None]],
        producer: tuple[str, int] | None = None,
    ) -> list[int]:
        own = self._writer()
        return own.append_records(self._local(ref), records, producer)

    def read(self, ref: TopicRef, after: int, limit: int, exclude_node: str | None) -> list[Item]:
        self._check_open()
        raise NotAvailable(
            f"topic {ref.name!r} of an instances store: a seq names a record only within its "
            "instance; read the whole topic with tidelog.backends.instances.merged(topic) "
            "(INST-7, INST-10)"
        )

    def state(self, ref: TopicRef) -> TopicState:
        """The own instance's state of the topic (INST-10)."""
        self._check_open()
        if self.own is None:
            raise NotAvailable(
                f"topic {ref.name!r}: a read-only instances store has no own instance; "
                "describe() has every instance's state (INST-10)"
            )
        return self.own.state(self._local(ref))

    def changes(self, ref: TopicRef) -> int:
        local = self.locals.get(ref)
        return 0 if self.own is None or local is None else self.own.changes(local)

    def flush(self) -> None:
        self._check_open()
        if self.own is not None:
            self.own.flush()

    def close(self) -> None:
        with self.lock:
            if self.closed:
                return
            self.closed = True
            views, self.views = list(self.views.values()), {}
        first: BaseException | None = None
        for backend in [*views, *([self.own] if self.own is not None else [])]:
            try:
                backend.close()
            except BaseException as exc:  # close every one (FLT-4), then raise the first
                first = first or exc
        if first is not None:
            raise first

    def abandon(self) -> None:
        """The process dies now: the own instance is left as a kill leaves it (crash tests)."""
        with self.lock:
            self.closed = True
            views, self.views = list(self.views.values()), {}
        for view in views:
            view.close()
        if self.own is not None:
            self.own.abandon()

    # -- the merged read (INST-7, INST-8) ---------------------------------------------------
    def merged_read(
        self, name: str, cursor: str | None, limit: int, incarnation: int | None = None
    ) -> tuple[list[Entry], str]:
        """INST-7; with ``incarnation`` (the handle's shared one) the topic must still be
        ``live`` at it after the instances were read, else ``no_such_topic`` (INST-6)."""
        positions = parse_cursor(cursor, self.n)
        self.refresh()
        entries = merge(self._streams(name, positions, limit), positions, limit)
        if incarnation is not None:
            self.check_live(TopicRef(name, incarnation))
        return entries, cursor_text(positions)

    def _backend(self, i: int) -> FileBackend | None:
        return self.own if i == self.slot else self.views.get(i)

    def _ref(self, i: int, name: str) -> tuple[FileBackend, TopicRef] | None:
        backend = self._backend(i)
        if backend is None:
            return None
        try:
            return backend, backend.open_topic(name, {}, False)
        except NoSuchTopic:
            return None

    def _streams(self, name: str, positions: Sequence[int | None], limit: int) -> list[list[Item]]:
        """Each instance's items after its position (None: it contributes nothing)."""
        streams: list[list[Item]] = []
        for i, after in enumerate(positions):
            found = None if after is None else self._ref(i, name)
            if found is None or after is None:
                streams.append([])
                continue
            backend, ref = found
            streams.append(backend.read(ref, after, limit, None))
        return streams

    def _copies(self, ref: TopicRef) -> dict[int, int]:
        """The local incarnation of each other instance's copy of the topic of handle ``ref``
        (views refreshed, then INST-6's check: every copy seen belongs to ``ref``'s
        incarnation). A request carries it, so its writer refuses it on a newer copy."""
        self.refresh()
        with self.lock:
            others = [i for i in range(self.n) if i != self.slot]
            copies = {i: found[1].incarnation for i in others if (found := self._ref(i, ref.name))}
        self.check_live(ref)
        return copies

    def _route(
        self,
        ref: TopicRef,
        i: int,
        copies: dict[int, int],
        body: dict[str, Any],
        fine: tuple[str, ...] = (),
    ) -> dict[str, Any] | None:
        """An XPR-2 request about topic ``ref`` to instance ``i``'s copy; None when the
        instance has no copy (INST-17: skipped)."""
        if i not in copies:
            return None
        full = {**body, "topic": ref.name, "incarnation": copies[i]}
        with io_errors(f"a request to instance {i} of {self.root}"):
            result = self._request(i, full)
        _outcome(result, fine)
        return result

    # -- deletes (INST-19) ------------------------------------------------------------------
    def delete(
        self, ref: TopicRef, before_seq: int | None, tag: str | None, tag_glob: str | None
    ) -> int:
        """INST-19: ``Topic.delete`` by tag or glob deletes in every instance; a seq names a
        record only within its instance, so ``before_seq`` is refused (use the merged
        delete with a cursor)."""
        self._check_open()
        if before_seq is not None:
            raise BadArgument(
                f"delete(before_seq={before_seq}) on topic {ref.name!r} of an instances store: "
                "a seq names a record only within its instance; use "
                "merged(topic).delete(before=cursor) (INST-19)"
            )
        return self.merged_delete(ref, None, tag, tag_glob)

    def merged_delete(
        self,
        ref: TopicRef,
        positions: Sequence[int] | None,
        tag: str | None,
        tag_glob: str | None,
    ) -> int:
        """INST-19: DEL in each instance (``positions``: instance i deletes seqs up to p_i),
        each durable in its instance before this returns; the number removed in all."""
        own, local = self._writer(), self._local(ref)
        copies = self._copies(ref)
        total = 0
        for i in range(self.n):
            before = None if positions is None else positions[i] + 1
            if before == 1:
                continue  # nothing at or below position 0
            if i == self.slot:
                total += own.delete(local, before, tag, tag_glob)
                own.flush()
                continue
            body = {"op": "delete", "before_seq": before, "tag": tag, "tag_glob": tag_glob}
            result = self._route(ref, i, copies, body)
            total += 0 if result is None else int(result.get("deleted", 0))
        return total

    # -- merged subscribers (INST-15..INST-18) ----------------------------------------------
    def sub_register(self, name: str, sub: str, start: str, incarnation: int | None = None) -> str:
        """INST-15: the shared record first, then every instance; returns the stored start."""
        self._check_open()
        with (
            io_errors(f"registering subscriber {sub!r} of {name!r} in {self.root}"),
            shared.shared_lock(self.fs, self.root),
        ):
            if incarnation is not None:
                self.check_live(TopicRef(name, incarnation))  # no drop meanwhile
            topic = shared.read_topic(self.fs, self.root, name)
            if topic is None or not topic.live:
                raise NoSuchTopic(f"topic {name!r} does not exist")
            if sub in shared.unregistering_subscribers(self.fs, self.root, name):
                self._finish_unregister(topic, name, sub)  # INST-22: never resumed
            stored = shared.read_subscribers(self.fs, self.root, name)
            if sub not in stored:
                shared.write_subscriber(self.fs, self.root, name, sub, start)
                stored[sub] = start
            start = stored[sub]
            # under the lock: a drop (INST-6) cannot come between the record and these
            if self.own is not None:
                self.own.apply_requests()  # INST-21: none left behind overtakes these
                found = self._ref(self.slot, name) if self.slot is not None else None
                if found is not None:
                    found[0].subscribe(found[1], sub, start)
                    found[0].flush_subscriber(found[1], sub)
            body = {"op": "subscribe", "topic": name, "subscriber": sub, "start": start}
            bodies = {i: body for i in self._targets(topic)}
            for result in self._round(bodies, "subscribe").values():
                _outcome(result, ("no_such_topic",))
        return start

    def sub_unregister(self, ref: TopicRef, sub: str) -> None:
        """INST-22: the shared record marked first, then every instance's registration
        removed (each durable), then the record; all under ``.shared.lock``."""
        self._check_open()
        with (
            io_errors(f"unregistering subscriber {sub!r} of {ref.name!r} in {self.root}"),
            shared.shared_lock(self.fs, self.root),
        ):
            self.check_live(ref)
            topic = shared.read_topic(self.fs, self.root, ref.name)
            assert topic is not None  # live, checked above
            start = shared.read_subscribers(self.fs, self.root, ref.name).get(sub)
            if start is None:
                raise NoSuchSubscriber(
                    f"subscriber {sub!r} of topic {ref.name!r} does not exist (INST-22)"
                )
            shared.mark_unregistering(self.fs, self.root, ref.name, sub, start)
            self._finish_unregister(topic, ref.name, sub)

    def _finish_unregister(self, topic: shared.SharedTopic, name: str, sub: str) -> None:
        """INST-22 steps (2) and (3); the caller holds ``.shared.lock`` and the record says
        ``unregistering``. Every step may be done again after a crash."""
        if self.own is not None:
            own = self.own
            own.apply_requests()  # INST-21: none left behind overtakes this
            found = self._ref(self.slot, name) if self.slot is not None else None
            if found is not None and sub in own.subscribers(found[1]):
                own.unregister(found[1], sub)
                own.flush()  # durable before the record goes
        body = {"op": "unregister", "topic": name, "subscriber": sub}
        bodies = {i: body for i in self._targets(topic)}
        for result in self._round(bodies, "unregister").values():
            _outcome(result, ("no_such_topic", "no_such_subscriber"))
        shared.remove_subscriber(self.fs, self.root, name, sub)

    def check_subscriber(self, name: str, sub: str) -> None:
        """INST-22: ``no_such_subscriber`` once the merged subscriber was unregistered."""
        with io_errors(f"reading the subscribers of topic {name!r} in {self.root}"):
            registered = sub in shared.read_subscribers(self.fs, self.root, name)
        if not registered:
            raise NoSuchSubscriber(
                f"subscriber {sub!r} of topic {name!r} was unregistered (INST-22)"
            )

    def sub_hwms(self, name: str, sub: str) -> list[int | None]:
        """Each instance's hwm of ``sub`` (None where it is not registered), views refreshed."""
        self.check_subscriber(name, sub)
        self.refresh()
        out: list[int | None] = []
        for i in range(self.n):
            found = self._ref(i, name)
            if found is None:
                out.append(None)
                continue
            backend, ref = found
            hwm = backend.hwm(ref, sub) if sub in backend.subscribers(ref) else None
            if i != self.slot:
                # a view replays the WAL, not progress files (PRG-9): read the file as well,
                # so a commit another process made durable shows
                with io_errors(f"reading the progress of {sub!r} in instance {i}"):
                    written = read_progress(
                        self.fs, shared.instance_dir(self.root, i), ref.incarnation, sub
                    )
                if written is not None:
                    hwm = max(hwm or 0, written.hwm)
            out.append(hwm)
        return out

    def sub_commit(
        self,
        name: str,
        sub: str,
        start: str,
        positions: Sequence[int],
        incarnation: int | None = None,
    ) -> None:
        """INST-17: commit each position, durably, in its instance. A commit never registers
        the subscriber (INST-22: it could outlive an unregister)."""
        self._check_open()
        self.check_subscriber(name, sub)
        ref = None if incarnation is None else TopicRef(name, incarnation)
        copies = None if ref is None else self._copies(ref)
        for i, seq in enumerate(positions):
            if seq <= 0:
                continue
            if i == self.slot:
                found = self._ref(i, name)
                if found is None or sub not in found[0].subscribers(found[1]):
                    continue
                backend, local = found if ref is None else (found[0], self._local(ref))
                backend.commit(local, sub, min(seq, backend.state(local).head_seq))
                backend.flush_subscriber(local, sub)
                continue
            body = {"op": "commit", "topic": name, "subscriber": sub, "seq": seq}
            if ref is not None and copies is not None:
                self._route(ref, i, copies, body, ("no_such_subscriber",))
                continue
            directory = shared.instance_dir(self.root, i)
            with io_errors(f"committing subscriber {sub!r} of {name!r} in {directory}"):
                _outcome(self._request(i, body), ("no_such_topic", "no_such_subscriber"))

    def sub_settle(self, ref: TopicRef, sub: str, instance: int, seq: int, op: str) -> bool:
        """INST-18: SUB-3's ``ack`` or ``reject`` of ``seq`` in ``instance``, durable in it
        (its own directly, another's through an XPR-2 request) before this returns."""
        self._check_open()
        self.check_subscriber(ref.name, sub)
        if not 0 <= instance < self.n:
            raise BadArgument(
                f"instance {instance} is not one of this store's {self.n} instances (INST-18)"
            )
        if instance == self.slot:
            own, local = self._writer(), self._local(ref)
            done = own.ack(local, sub, seq) if op == "ack" else own.reject(local, sub, seq)
            own.flush_subscriber(local, sub)
            return done
        copies = self._copies(ref)
        if instance not in copies:
            raise BadArgument(
                f"seq {seq} of instance {instance}: it holds no copy of topic {ref.name!r} "
                "(INST-18)"
            )
        result = self._route(ref, instance, copies, {"op": op, "subscriber": sub, "seq": seq})
        return bool(result is not None and result.get("done"))

    def merged_wait(
        self,
        name: str,
        cursor: str | None,
        limit: int,
        wait_ms: int,
        incarnation: int | None = None,
    ) -> Any:
        """CON-3 for the merged read: an empty result is retried until ``wait_ms`` pass
        (other instances change in other processes: this polls, backing off to 50 ms)."""
        deadline = time.monotonic() + wait_ms / 1000.0
        delay = 0.002
        while True:
            entries, text = self.merged_read(name, cursor, limit, incarnation)
            left = deadline - time.monotonic()
            if entries or left <= 0:
                return entries, text
            time.sleep(min(delay, left))
            delay = min(delay * 2, 0.05)

    # -- introspection (INST-10) ------------------------------------------------------------
    def describe(self) -> dict[str, object]:
        self.refresh()
        topics = self.list_topics()
        per: dict[str, dict[str, object]] = {}
        for i in range(self.n):
            directory = shared.instance_dir(self.root, i)
            backend = self.own if i == self.slot else self.views.get(i)
            topic_facts: dict[str, object] = {}
            if backend is not None:
                topic_facts = {name: self._topic_facts(backend, name) for name in topics}
            per[str(i)] = {
                "mine": i == self.slot,
                # LOCK-2: diagnostic only, the last holder's once it closed
                "lock_pid": dirlock.holder(self.fs, directory),
                "topics": {k: v for k, v in topic_facts.items() if v is not None},
            }
        return {
            "backend": "file",
            "root": self.root,
            "instances": self.n,
            "slot": self.slot,
            "per_instance": per,
        }

    def _topic_facts(self, backend: FileBackend, name: str) -> dict[str, object] | None:
        try:
            ref = backend.open_topic(name, {}, False)
        except NoSuchTopic:
            return None
        state = backend.state(ref)
        share = backend.topic_config(ref)
        facts: dict[str, object] = dict(state.to_dict())
        fractions = [
            used / cap
            for used, cap in ((state.count, share.cap_records), (state.bytes, share.cap_bytes))
            if cap
        ]
        facts["cap_fraction"] = max(fractions) if fractions else None
        return facts
