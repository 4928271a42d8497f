"""The public API: Store, Topic, Subscriber.

These classes check and normalise every argument (so all backends see the same clean input and
raise the same errors for bad input, spec ERR-1..3), then delegate to a Backend. They hold no
semantic state of their own: handles are cheap views (spec CON-2).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator
from functools import cached_property
from typing import Any, Protocol, TypeVar, cast

from . import registry
from .backend import Backend, Capabilities, TopicRef
from .bundle import BundleRecord, RecordBundle, decode_bundle, encode_bundle
from .config import TopicConfig
from .errors import Backpressure, BadArgument, Closed, Corrupt, NoSuchSubscriber, NotAvailable
from .names import check_label, check_subscriber_name, check_topic_name
from .records import Item, Lease, RouterConfig, RouterInfo, Tombstone, TopicState

__all__ = ["Store", "Topic", "Subscriber"]

_STARTS = ("resume", "earliest", "latest")
T = TypeVar("T")


def _int(value: object, what: str, minimum: int | None = None) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise BadArgument(f"{what} must be an integer, got {value!r}")
    if minimum is not None and value < minimum:
        raise BadArgument(f"{what} must be at least {minimum}, got {value}")
    return value


def _producer(value: object) -> tuple[str, int]:
    """TOP-11: (producer id, producer sequence >= 1)."""
    if not (isinstance(value, tuple) and len(value) == 2):
        raise BadArgument(f"producer must be (id, sequence), got {value!r}")
    pid, seq = value
    if not isinstance(pid, str) or not pid or len(pid.encode("utf-8", "replace")) > 200:
        raise BadArgument(f"producer id must be a non-empty string of at most 200 bytes: {pid!r}")
    _int(seq, "producer sequence", 1)
    return pid, seq


class _Append(Protocol):
    def __call__(
        self, payload: bytes, *, tag: str | None = None, node: str | None = None
    ) -> int: ...


def _appender(store: Store, ref: TopicRef) -> _Append:
    """A topic handle's ``append`` (``Topic.append``). Where the backend makes one
    (``append_lane``: the engine's lane, backends/common/lane.py), it is the lane itself, which
    hands what it does not take to the general path below: one Python frame per common append.
    Else the general path after the backend's payload-only lane (``Backend.lane``), asked at
    the first append. Holds the store and the ref, not the handle (no reference cycle)."""
    bundles: list[bool] = []  # payload="bundles"? (config is immutable, TOP-9), once asked

    def general(payload: object, tag: str | None = None, node: str | None = None) -> int:
        data = _payload(payload)
        check_label(tag, "tag")
        check_label(node, "node")
        if _is_bundles(store, ref, bundles):
            _check_bundle_payloads(ref.name, (data,))
        return _append_to(store, ref, (data,), tag, node)[0]

    make = getattr(store._backend, "append_lane", None)
    if make is not None and not store._closed:
        lane = make(ref, general)
        if lane is not None:
            return cast(_Append, lane)
    found: list[Callable[[bytes], int | None]] = []

    def append(payload: bytes, *, tag: str | None = None, node: str | None = None) -> int:
        """Append one record and return its seq (spec TOP-1, TOP-6)."""
        if tag is None and node is None and type(payload) is bytes and not store._closed:
            if not found:  # a topic of bundles takes none (BND-9 checks every payload)
                lane = None if _is_bundles(store, ref, bundles) else store._backend.lane(ref)
                found.append(_decline if lane is None else lane)
            seq = found[0](payload)
            if seq is not None:
                return seq
        return general(payload, tag, node)

    return append


class _AppendMany(Protocol):
    def __call__(
        self,
        payloads: Iterable[bytes],
        *,
        tag: str | None = None,
        node: str | None = None,
        producer: tuple[str, int] | None = None,
    ) -> list[int]: ...


def _many_appender(store: Store, ref: TopicRef) -> _AppendMany:
    """A topic handle's ``append_many`` (``Topic.append_many``), made as ``_appender`` makes
    ``append``: the backend's batch lane (``many_lane``, backends/common/lane.py) where it
    makes one, handing what it does not take to the general path below; else that path."""
    bundles: list[bool] = []

    def general(
        payloads: object,
        tag: str | None = None,
        node: str | None = None,
        producer: object = None,
    ) -> list[int]:
        if isinstance(payloads, (bytes, bytearray, memoryview, str)):
            raise BadArgument("append_many takes an iterable of payloads, not one payload")
        data = _payloads(payloads)  # type: ignore[arg-type]  # an iterable: checked by list()
        check_label(tag, "tag")
        check_label(node, "node")
        if producer is not None:
            producer = _producer(producer)
        if not data:
            store._live()
            return []
        if _is_bundles(store, ref, bundles):
            _check_bundle_payloads(ref.name, data)
        return _append_to(store, ref, data, tag, node, producer)

    make = getattr(store._backend, "many_lane", None)
    if make is not None and not store._closed:
        lane = make(ref, general)
        if lane is not None:
            return cast(_AppendMany, lane)

    def append_many(
        payloads: Iterable[bytes],
        *,
        tag: str | None = None,
        node: str | None = None,
        producer: tuple[str, int] | None = None,
    ) -> list[int]:
        """Append records atomically, returning their consecutive seqs (spec TOP-6, TOP-11)."""
        return general(payloads, tag, node, producer)

    return append_many


def _is_bundles(store: Store, ref: TopicRef, cache: list[bool]) -> bool:
    """Whether the topic holds bundles (payload="bundles"), asked once into ``cache``: a
    topic's config is immutable (TOP-9)."""
    if not cache:
        cache.append(store._live().topic_config(ref).payload == "bundles")
    return cache[0]


def _decline(payload: bytes) -> None:
    """The lane of a topic whose backend has none for it: never takes a record."""
    return None


def _check_bundle_payloads(name: str, payloads: Iterable[bytes]) -> None:
    """BND-9: a topic declared with payload="bundles" takes only valid bundle payloads,
    refused (bad_argument) before a seq is assigned."""
    for i, payload in enumerate(payloads):
        try:
            decode_bundle(payload)
        except Corrupt as exc:
            raise BadArgument(
                f"topic {name!r} holds bundles (payload='bundles'): payload {i} is "
                f"not one ({exc.message}); use append_bundle (BND-9)"
            ) from None


def _append_to(
    store: Store,
    ref: TopicRef,
    data: list[bytes] | tuple[bytes, ...],
    tag: str | None,
    node: str | None,
    producer: tuple[str, int] | None = None,
) -> list[int]:
    """The general append (``Backend.append``), waiting out backpressure if the topic says
    so (SUB-6)."""
    backend = store._live()
    try:
        return backend.append(ref, data, tag, node, producer)
    except Backpressure as first:
        wait_ms = backend.topic_config(ref).backpressure_wait_ms
        if wait_ms <= 0:
            raise

        def attempt() -> tuple[bool, list[int] | Backpressure]:
            try:
                return True, store._live().append(ref, data, tag, node, producer)
            except Backpressure as exc:
                return False, exc

        out = _wait_until(backend, ref, wait_ms, attempt)
        if isinstance(out, Backpressure):  # SUB-6: waited backpressure_wait_ms, still full
            raise Backpressure(f"{out.message} (after waiting {wait_ms} ms)") from first
        return out


def _payload(value: object) -> bytes:
    if isinstance(value, bytes):
        return value
    if isinstance(value, (bytearray, memoryview)):
        return bytes(value)
    raise BadArgument(f"payload must be bytes-like, got {type(value).__name__}")


def _payloads(values: Iterable[object]) -> list[bytes]:
    """The payloads of a batch as a new list of ``bytes``. When every item already is exactly
    ``bytes`` (the common case) this is two C-level passes, no Python loop per record."""
    data = list(values)
    if list(map(type, data)).count(bytes) == len(data):  # a count by identity: no hashing
        return data  # type: ignore[return-value]  # every item checked to be bytes
    return [_payload(p) for p in data]


def _wait_until(
    backend: Backend, ref: TopicRef, wait_ms: int, attempt: Callable[[], tuple[bool, T]]
) -> T:
    """Run ``attempt`` until it reports done or ``wait_ms`` of wall time pass, sleeping on the
    backend's change notification in between (spec CON-3). Returns the last attempt's value.
    Without a wait the counter is not read: over HTTP that is a request saved per call."""
    if wait_ms <= 0:
        return attempt()[1]
    deadline = time.monotonic() + wait_ms / 1000.0
    while True:
        since = backend.changes(ref)
        done, value = attempt()
        left = deadline - time.monotonic()
        if done or left <= 0:
            return value
        backend.wait(ref, since, left)


class Store:
    """An open tidelog store. Use as a context manager; see ``tidelog.open``."""

    def __init__(
        self, backend: Backend, uri: str, descriptor: registry.BackendDescriptor | None = None
    ) -> None:
        self._backend = backend
        self._uri = uri
        self._closed = False
        self._descriptor = descriptor
        # REG-4: what the open backend claims, else what its descriptor declares
        caps: Capabilities | None = getattr(backend, "capabilities", None)
        if caps is None and descriptor is not None:
            caps = descriptor.capabilities
        if caps is None:
            raise TypeError(f"{type(backend).__name__} claims no capabilities (CAP-1, REG-1)")
        self._caps = caps
        #: the capability flags whose operations the core refuses here (CAP-1, REG-4)
        self._lacks = frozenset(f for f in registry.REFUSED_FLAGS if not getattr(caps, f))

    # -- lifecycle -------------------------------------------------------------------------
    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Close the store (idempotent, spec DUR-8). Handles become unusable."""
        if not self._closed:
            self._closed = True
            self._backend.close()

    @property
    def closed(self) -> bool:
        return self._closed

    def _live(self) -> Backend:
        if self._closed:
            raise Closed(f"store {self._uri} is closed")
        return self._backend

    def _needs(self, flag: str) -> None:
        """CAP-1, REG-4: an operation needing capability ``flag`` that this store lacks is
        refused here, once for every backend, with the message its descriptor gives."""
        if flag in self._lacks:
            raise self._refusal(flag)

    def _refusal(self, flag: str) -> NotAvailable:
        d = self._descriptor
        if d is None:
            scheme = self._uri.partition("://")[0]
            d = registry.find(scheme) or registry.BackendDescriptor(scheme, "")
            self._descriptor = d
        return d.refusal(flag)

    # -- store operations ------------------------------------------------------------------
    @property
    def uri(self) -> str:
        return self._uri

    @property
    def capabilities(self) -> Capabilities:
        return self._caps

    def topic(self, name: str, *, create: bool = True, **config: Any) -> Topic:
        """Get (or create) a topic; config keys are fixed at creation (spec TOP-9)."""
        check_topic_name(name)
        if not isinstance(create, bool):
            raise BadArgument(f"create must be True or False, got {create!r}")
        ref = self._live().open_topic(name, config, create)
        return Topic(self, ref)

    def topics(self) -> list[str]:
        return self._live().list_topics()

    def drop_topic(self, name: str) -> None:
        check_topic_name(name)
        self._live().drop_topic(name)

    def flush(self) -> None:
        """Make every acknowledged op durable (spec DUR-7)."""
        self._live().flush()

    # -- routers (spec section 16) -------------------------------------------------------------
    def router(
        self,
        name: str,
        source: str,
        dest: str,
        *,
        filter_tag: str | None = None,
        exclude_node: str | None = None,
        preserve_tag: bool = True,
        preserve_node: bool = True,
        allow_cycle: bool = False,
    ) -> RouterInfo:
        """Create the router ``name`` copying ``source``'s records into ``dest``, or open the
        existing one (RTR-1; its config is fixed at creation, RTR-2)."""
        backend = self._live()
        self._needs("routers")
        check_topic_name(name, "router name")
        check_topic_name(source)
        check_topic_name(dest)
        check_label(filter_tag, "filter_tag")
        check_label(exclude_node, "exclude_node")
        for key, flag in (
            ("preserve_tag", preserve_tag),
            ("preserve_node", preserve_node),
            ("allow_cycle", allow_cycle),
        ):
            if not isinstance(flag, bool):
                raise BadArgument(f"{key} must be True or False, got {flag!r}")
        config = RouterConfig(
            source, dest, filter_tag, exclude_node, preserve_tag, preserve_node, allow_cycle
        )
        return backend.router(name, config)

    def routers(self) -> list[RouterInfo]:
        """Every router, in name order, with its cursor and lag (RTR-1); none where the store
        has no routers (RTR-13)."""
        backend = self._live()
        return [] if "routers" in self._lacks else backend.list_routers()

    def drop_router(self, name: str) -> bool:
        """Drop the router ``name``; its copies stay in dest. False if there is none (RTR-12)."""
        backend = self._live()
        self._needs("routers")
        check_topic_name(name, "router name")
        return backend.drop_router(name)

    def describe(self) -> dict[str, object]:
        return self._live().describe()

    def refresh(self) -> None:
        """Read-only stores: catch up with what the writing process appended (FORMATS XPR-1)."""
        self._live().refresh()

    def __repr__(self) -> str:
        state = "closed" if self._closed else "open"
        return f"<tidelog.Store {self._uri} ({state})>"


class Topic:
    """A handle on one topic incarnation."""

    # __dict__: ``append`` and ``append_many``, made at their first use
    __slots__ = ("_store", "_ref", "_bundles", "__dict__")

    def __init__(self, store: Store, ref: TopicRef) -> None:
        self._store = store
        self._ref = ref
        self._bundles: list[bool] = []  # payload="bundles"? once asked (``_is_bundles``)

    def _check_bundles(self, payloads: Iterable[bytes]) -> None:
        """BND-9: a topic declared with payload="bundles" takes only valid bundle payloads,
        refused (bad_argument) before a seq is assigned."""
        if _is_bundles(self._store, self._ref, self._bundles):
            _check_bundle_payloads(self.name, payloads)

    @property
    def name(self) -> str:
        return self._ref.name

    @property
    def store(self) -> Store:
        return self._store

    @property
    def incarnation(self) -> int:
        """Which life of the name this handle is on (TOP-10): a handle outlives a drop only to
        raise ``no_such_topic``, even once the name is created again."""
        return self._ref.incarnation

    def changes(self) -> int:
        """A counter that moves whenever the topic changes (CON-3): equal values mean nothing
        happened in between. Opaque, and only for comparing within one open store."""
        return self._store._live().changes(self._ref)

    @property
    def config(self) -> TopicConfig:
        return self._store._live().topic_config(self._ref)

    # -- log -------------------------------------------------------------------------------
    @cached_property
    def append(self) -> _Append:
        """``append(payload, *, tag=None, node=None) -> seq``: append one record and return its
        seq (spec TOP-1, TOP-6). The handle's ``append`` is made at its first use (the
        backend's lean path for the common case, where it has one: ``_appender``) and kept."""
        return _appender(self._store, self._ref)

    @cached_property
    def append_many(self) -> _AppendMany:
        """``append_many(payloads, *, tag=None, node=None, producer=None) -> seqs``: append
        records atomically, returning their consecutive seqs (spec TOP-6). With
        ``producer=(id, n)`` the batch is applied at most once per producer sequence: a retry
        of an already applied ``n`` returns ``[]`` (spec TOP-11). Made at its first use (the
        backend's batch lane for the common case, where it has one: ``_many_appender``) and
        kept."""
        return _many_appender(self._store, self._ref)

    def append_records(
        self,
        records: Iterable[tuple[bytes, str | None, str | None]],
        *,
        producer: tuple[str, int] | None = None,
    ) -> list[int]:
        """Append ``(payload, tag, node)`` records atomically, each with its own labels; the
        seqs are consecutive (spec TOP-6, TOP-11 for ``producer``)."""
        rows: list[tuple[bytes, str | None, str | None]] = []
        for rec in records:
            if not (isinstance(rec, tuple) and len(rec) == 3):
                raise BadArgument(f"records are (payload, tag, node) tuples, got {rec!r:.80}")
            rows.append((_payload(rec[0]), check_label(rec[1], "tag"), check_label(rec[2], "node")))
        if producer is not None:
            _producer(producer)
        backend = self._store._live()
        if not rows:
            return []
        self._check_bundles(r[0] for r in rows)
        return backend.append_records(self._ref, rows, producer)

    # -- Arrow bundles (spec/BUNDLES.md) -----------------------------------------------------
    def append_bundle(
        self,
        bundle: RecordBundle,
        *,
        tag: str | None = None,
        node: str | None = None,
        producer: tuple[str, int] | None = None,
    ) -> int | list[int]:
        """Append one Arrow ``RecordBundle`` as one record (BND-1..BND-8) and return its seq.
        With ``producer=(id, n)`` it has ``append_many`` semantics (TOP-11) and returns the list
        of seqs: ``[seq]``, or ``[]`` when ``n`` was already applied."""
        payload = encode_bundle(bundle)
        check_label(tag, "tag")
        check_label(node, "node")
        if producer is None:  # encoded here: no BND-9 check needed
            return self._append((payload,), tag, node)[0]
        _producer(producer)
        return self._append([payload], tag, node, producer)

    def read_bundles(
        self, after: int = 0, limit: int = 1000, *, wait_ms: int = 0
    ) -> list[BundleRecord | Tombstone]:
        """``read`` with every record's payload decoded as a bundle: ``BundleRecord(seq, ts,
        tag, node, bundle)``; tombstones pass through unchanged (TMB). A payload that is not a
        valid bundle raises ``Corrupt`` naming its seq (BND-6)."""
        out: list[BundleRecord | Tombstone] = []
        for item in self.read(after, limit, wait_ms=wait_ms):
            if isinstance(item, Tombstone):
                out.append(item)
                continue
            try:
                bundle = decode_bundle(item.payload)
            except Corrupt as exc:
                raise Corrupt(f"topic {self.name!r} seq {item.seq}: {exc.message}") from None
            out.append(BundleRecord(item.seq, item.ts, item.tag, item.node, bundle))
        return out

    def _append(
        self,
        data: list[bytes] | tuple[bytes, ...],
        tag: str | None,
        node: str | None,
        producer: tuple[str, int] | None = None,
    ) -> list[int]:
        return _append_to(self._store, self._ref, data, tag, node, producer)

    def read(
        self,
        after: int = 0,
        limit: int = 1000,
        *,
        exclude_node: str | None = None,
        wait_ms: int = 0,
    ) -> list[Item]:
        """Records (and tombstones) with seq > after, in order (spec TOP-7, TMB-1..5). With
        ``wait_ms``, an empty result waits up to that long for something to arrive (CON-3)."""
        _int(after, "after", 0)
        _int(limit, "limit", 1)
        _int(wait_ms, "wait_ms", 0)
        check_label(exclude_node, "exclude_node")
        backend = self._store._live()

        def attempt() -> tuple[bool, list[Item]]:
            items = self._store._live().read(self._ref, after, limit, exclude_node)
            return bool(items), items

        return _wait_until(backend, self._ref, wait_ms, attempt)

    def iter(self, after: int = 0, batch: int = 1000) -> Iterator[Item]:
        """Iterate from ``after`` to the current head, batch by batch."""
        cursor = after
        while True:
            items = self.read(after=cursor, limit=batch)
            if not items:
                return
            yield from items
            last = items[-1]
            cursor = last.gap_to if isinstance(last, Tombstone) else last.seq

    def state(self) -> TopicState:
        return self._store._live().state(self._ref)

    def delete(
        self, before_seq: int | None = None, *, tag: str | None = None, tag_glob: str | None = None
    ) -> int:
        """Voluntary delete; returns the number of records removed (spec DEL-1..6)."""
        if before_seq is None and tag is None and tag_glob is None:
            raise BadArgument("delete needs before_seq, tag or tag_glob")
        if tag is not None and tag_glob is not None:
            raise BadArgument("delete takes tag or tag_glob, not both")
        if before_seq is not None:
            _int(before_seq, "before_seq", 1)
        check_label(tag, "tag")
        check_label(tag_glob, "tag_glob")
        backend = self._store._live()
        self._store._needs("deletes")
        return backend.delete(self._ref, before_seq, tag, tag_glob)

    # -- subscribers -----------------------------------------------------------------------
    def subscribe(self, name: str, start: str = "resume") -> Subscriber:
        """Register (or resume) a durable subscriber (spec SUB-1)."""
        check_subscriber_name(name)
        if start not in _STARTS:
            raise BadArgument(f"start must be one of {', '.join(_STARTS)}, got {start!r}")
        backend = self._store._live()
        self._store._needs("subscribers")
        backend.subscribe(self._ref, name, start)
        return Subscriber(self, name)

    def subscriber(self, name: str) -> Subscriber:
        """An existing subscriber; unlike ``subscribe`` it never creates one."""
        check_subscriber_name(name)
        if name not in self._store._live().subscribers(self._ref):
            raise NoSuchSubscriber(f"subscriber {name!r} of topic {self.name!r} does not exist")
        return Subscriber(self, name)

    def subscribers(self) -> list[str]:
        return self._store._live().subscribers(self._ref)

    # -- queue mode ------------------------------------------------------------------------
    def claim(self, node: str, *, max: int = 1, lease_ms: int | None = None) -> list[Lease]:
        """Lease up to ``max`` jobs: reclaimed first, then fresh (spec QUE-1)."""
        check_label(node, "node")
        if node is None:
            raise BadArgument("claim needs a node name")
        _int(max, "max", 1)
        if lease_ms is not None:
            _int(lease_ms, "lease_ms", 1)
        backend = self._store._live()
        self._store._needs("queue")
        return backend.claim(self._ref, node, max, lease_ms)

    def complete(self, seq: int, lease_id: int) -> None:
        """Finish a job: it is deleted from the topic (spec QUE-3)."""
        backend = self._store._live()
        seq, lease_id = _int(seq, "seq", 1), _int(lease_id, "lease_id", 1)
        self._store._needs("queue")
        backend.complete(self._ref, seq, lease_id)

    def release(self, seq: int, lease_id: int) -> None:
        """Give a job back at once (spec QUE-4)."""
        backend = self._store._live()
        seq, lease_id = _int(seq, "seq", 1), _int(lease_id, "lease_id", 1)
        self._store._needs("queue")
        backend.release(self._ref, seq, lease_id)

    def nack(self, seq: int, lease_id: int, *, delay_ms: int = 0) -> None:
        """Give a job back after ``delay_ms`` (spec QUE-4)."""
        backend = self._store._live()
        seq, lease_id = _int(seq, "seq", 1), _int(lease_id, "lease_id", 1)
        delay_ms = _int(delay_ms, "delay_ms", 0)
        self._store._needs("queue")
        backend.nack(self._ref, seq, lease_id, delay_ms)

    def __repr__(self) -> str:
        return f"<tidelog.Topic {self._ref.name!r}>"


class Subscriber:
    """A handle on a named durable subscriber of a topic (spec SUB)."""

    __slots__ = ("_topic", "_name")

    def __init__(self, topic: Topic, name: str) -> None:
        self._topic = topic
        self._name = name

    @property
    def name(self) -> str:
        return self._name

    @property
    def topic(self) -> Topic:
        return self._topic

    def _call(self, seq: object = None, minimum: int = 1) -> tuple[Backend, TopicRef, int]:
        """The live backend, the topic and ``seq`` checked (when given), once subscribers are
        known to be there (CAP-1, REG-4; in this order: closed, bad argument, not available)."""
        store = self._topic._store
        backend = store._live()
        checked = 0 if seq is None else _int(seq, "seq", minimum)
        store._needs("subscribers")
        return backend, self._topic._ref, checked

    def poll(self, max: int = 100, *, wait_ms: int = 0) -> list[Item]:
        """Next unresolved records, after any pending tombstone (spec SUB-4, SUB-7). With
        ``wait_ms``, an empty result waits up to that long for something to arrive (CON-3)."""
        _int(max, "max", 1)
        _int(wait_ms, "wait_ms", 0)
        b, ref, _ = self._call()

        def attempt() -> tuple[bool, list[Item]]:
            items = self._topic._store._live().poll(ref, self._name, max)
            return bool(items), items

        return _wait_until(b, ref, wait_ms, attempt)

    def ack(self, seq: int) -> bool:
        b, ref, seq = self._call(seq)
        return b.ack(ref, self._name, seq)

    def reject(self, seq: int) -> bool:
        b, ref, seq = self._call(seq)
        return b.reject(ref, self._name, seq)

    def commit(self, seq: int) -> int:
        """Ack every unresolved seq up to ``seq``; returns how many were acked (spec SUB-3)."""
        b, ref, seq = self._call(seq, 0)
        return b.commit(ref, self._name, seq)

    @property
    def hwm(self) -> int:
        b, ref, _ = self._call()
        return b.hwm(ref, self._name)

    def flush(self) -> None:
        """Make this subscriber's progress durable (spec SUB-9, DUR-9)."""
        b, ref, _ = self._call()
        b.flush_subscriber(ref, self._name)

    def unregister(self) -> None:
        b, ref, _ = self._call()
        b.unregister(ref, self._name)

    def __repr__(self) -> str:
        return f"<tidelog.Subscriber {self._name!r} of {self._topic.name!r}>"
