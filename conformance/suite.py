"""The Python conformance kit: pytest base classes a backend subclasses (spec/CONFORMANCE.md §2;
the pattern of zarr's ``StoreTests`` and SQLAlchemy's ``SuiteRequirements``).

    from tidelog.conformance.suite import BackendSuite

    class TestMyBackend(BackendSuite):
        capabilities = Capabilities(persistent=False, crash_safe=False, queue=False)

        def store_uri(self, name: str) -> str:
            return f"mine://{name}"

The subclass says how to reach a store (``store_uri``) and what the backend claims
(``capabilities``); the kit brings:

* ``test_capabilities_claimed``: the store claims exactly the declared flags (CAP-1), and
  ``test_lacking_capabilities_refuse``: every lacking capability's operation raises
  ``not_available``;
* ``test_level_<level>``: the stateful suite against the model, one conformance level per test
  (``log``, ``subscribers``, ``queue``, ``routers``, ``crash``, ``ring``), each present only
  when the capabilities make the level apply, so nothing is skipped;
* with ``fs_opener`` (the backend does its file I/O through ``tidelog.fsio``): power loss
  simulated on tidelog's recording FS, both in the ``crash`` level and in
  ``test_crash_workloads`` (every crash point of small workloads, exhaustively);
* with ``verify_format`` (``"file"`` or ``"blockdev"``: the backend writes one of tidelog's
  on-disk formats; or a scheme whose descriptor has a ``verify``): ``test_format_roundtrip``:
  what it wrote passes ``tidelog verify`` and reads back the same after a reopen;
* with ``over_http``: each store is served by ``tidelog serve``'s service and every level runs
  through the remote backend (``http://``), so the service is checked against the model.

With ``scheme`` naming a registered backend descriptor (``tidelog.registry``, REG-5), the
capabilities, ``fs_opener``, ``verify_format`` and ``ring`` the class does not set come from it.

Sizes: ``examples`` and ``steps`` per level (``TIDELOG_CONFORMANCE_EXAMPLES`` overrides
``examples``); the seed is pytest's ``--hypothesis-seed`` (or ``TIDELOG_SEED``), printed on
failure with the shrunk operation sequence.
"""

from __future__ import annotations

import os
import random
import shutil
import tempfile
import uuid
from collections.abc import Callable
from typing import Any, ClassVar

from tidelog import registry
from tidelog.backend import Capabilities
from tidelog.clock import Clock, FakeClock
from tidelog.uri import parse_uri

from .crashcheck import CrashRun, Op, observe
from .crashfs import RecordingFS
from .driver import Driver
from .levels import applies
from .remote import LocalTransport, RemoteSut
from .runner import LevelResult, check_refusals, format_report, run_level
from .sut import FsOpener, LocalSut, descriptor_opener, durable_dirs

__all__ = ["BackendSuite", "CRASH_WORKLOADS", "session_seed"]

#: small workloads checked at every crash point by ``test_crash_workloads`` (fsync appends
#: survive, weaker classes lose only a suffix, subscriber progress stays within DUR-9)
CRASH_WORKLOADS: dict[str, list[Op]] = {
    "DUR-2 fsync appends": [
        ("create", "t0", {"durability": "fsync"}),
        ("append", "t0", b"a" * 100, None),
        ("append_many", "t0", [b"b" * 40, b"c"]),
        ("append", "t0", b"d", "tag"),
    ],
    "DUR-3 DUR-4 DUR-5 weaker classes": [
        ("create", "t0", {"durability": "disk"}),
        ("append", "t0", b"d1", None),
        ("flush",),
        ("append", "t0", b"d2" * 60, None),
        ("append", "t0", b"d3", None),
    ],
    "DUR-9 subscriber progress": [
        ("create", "t0", {"durability": "fsync"}),
        ("subscribe", "t0", "s0", "earliest"),
        ("append_many", "t0", [b"1", b"2", b"3"]),
        ("ack", "t0", "s0", 1),
        ("flush_sub", "t0", "s0"),
        ("commit", "t0", "s0", 3),
    ],
}


def session_seed() -> int:
    """pytest's --hypothesis-seed (Hypothesis keeps it here), TIDELOG_SEED, or a fresh one."""
    import hypothesis.core

    forced: Any = hypothesis.core.global_force_seed
    if isinstance(forced, int):
        return forced
    env = os.environ.get("TIDELOG_SEED")
    return int(env) if env and env.isdigit() else random.SystemRandom().randrange(2**32)


class BackendSuite:
    """Base class of a backend's conformance tests; see the module docstring."""

    #: the URI scheme: with a registered descriptor (REG-5), ``capabilities``, ``fs_opener``,
    #: ``verify_format`` and ``ring`` default to what the descriptor declares
    scheme: ClassVar[str | None] = None
    #: what the backend claims (CAP-1); the store's ``capabilities`` must equal it
    capabilities: ClassVar[Capabilities]
    #: open a store through an FS: ``fs_opener(fs, location, clock, **uri_options)``
    fs_opener: ClassVar[FsOpener | None] = None
    #: the scheme whose verifier checks what the backend writes (``"file"``, ``"blockdev"``, or
    #: a registered scheme whose descriptor has ``verify``; for test_format_roundtrip)
    verify_format: ClassVar[str | None] = None
    #: the store is a flash-style page ring reporting ``ring_evictions`` (BDEV-16)
    ring: ClassVar[bool] = False
    #: serve each store with ``tidelog serve``'s service and run the levels through the remote
    #: backend (``http://``, spec/SERVICE.md SVC-58; ``tidelog.conformance.served``)
    over_http: ClassVar[bool] = False
    examples: ClassVar[int] = 50
    steps: ClassVar[int] = 40
    #: seconds Hypothesis may spend shrinking a failure
    shrink_seconds: ClassVar[float] = 30.0

    def store_uri(self, name: str) -> str:
        """The URI of store ``name`` (a fresh one for a new name; the same store again, after
        a close, for the same name)."""
        raise NotImplementedError("a BackendSuite subclass must define store_uri(name)")

    # -- collection: only the tests whose level applies exist ----------------------------------
    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        described = registry.find(cls.scheme) if cls.scheme else None
        if described is not None:  # REG-5: what the class does not say, its descriptor does
            _default(cls, "capabilities", described.capabilities)
            if described.has("fs_opener"):
                _default(cls, "fs_opener", staticmethod(descriptor_opener(described.scheme)))
            if described.has("verify"):
                _default(cls, "verify_format", described.scheme)
            _default(cls, "ring", "ring_evictions" in described.hooks)
        caps = getattr(cls, "capabilities", None)
        if caps is None:
            return
        hello = {
            "crash": ["between", "during"] if cls.fs_opener and caps.crash_safe else [],
            "ops": ["ring_head"] if cls.ring else [],
        }
        for level in ("subscribers", "queue", "routers", "crash", "ring"):
            if applies(level, caps, hello) is not None:
                setattr(cls, f"test_level_{level}", None)  # not collected
        if cls.fs_opener is None or not caps.crash_safe:
            cls.test_crash_workloads = None  # type: ignore[assignment]
        if cls.verify_format is None:
            cls.test_format_roundtrip = None  # type: ignore[assignment]

    # -- plumbing -------------------------------------------------------------------------------
    def _sut(self) -> RemoteSut:
        scheme = parse_uri(self.store_uri("probe")).scheme
        opener = type(self).fs_opener  # the plain function (through self it would be bound)
        openers = {scheme: opener} if opener is not None else {}
        fs = "recording" if opener is not None else "os"
        make: type[LocalSut] = LocalSut
        if self.over_http:
            from .served import ServedSut

            make = ServedSut
        local = make(self.store_uri, fs=fs, openers=openers)  # type: ignore[arg-type]
        return RemoteSut(LocalTransport(Driver(local)))

    def _level(self, level: str) -> None:
        examples = int(os.environ.get("TIDELOG_CONFORMANCE_EXAMPLES", self.examples))
        result = run_level(
            self._sut, level, examples=examples, steps=self.steps, seed=session_seed(),
            shrink_seconds=self.shrink_seconds,
        )
        _expect_pass(result)

    # -- the tests ------------------------------------------------------------------------------
    def test_capabilities_claimed(self) -> None:
        """CAP-1: the store claims exactly the capabilities the backend declares."""
        link = self._sut()
        try:
            name = "caps" + uuid.uuid4().hex[:8]
            store = link.open(name, FakeClock(1_000_000))
            got = store.capabilities
            store.close()
            link.dispose(name)
        finally:
            link.shutdown()
        assert got == self.capabilities, f"store claims {got}; declared: {self.capabilities}"

    def test_lacking_capabilities_refuse(self) -> None:
        """CAP-1: every operation of a capability the backend lacks raises not_available."""
        link = self._sut()
        try:
            problems = check_refusals(link)
        finally:
            link.shutdown()
        assert not problems, "; ".join(problems)

    def test_level_log(self) -> None:
        """TOP, TMB, DEL, RET, ERR, DUR-1, DUR-7, DUR-8 against the model."""
        self._level("log")

    def test_level_subscribers(self) -> None:
        """SUB-1..SUB-9 against the model."""
        self._level("subscribers")

    def test_level_queue(self) -> None:
        """QUE-1..QUE-8 against the model."""
        self._level("queue")

    def test_level_routers(self) -> None:
        """RTR-1..RTR-12 against the model (CNF-33)."""
        self._level("routers")

    def test_level_crash(self) -> None:
        """DUR-2..DUR-6, DUR-9, CRASH-7: power loss between and inside operations."""
        self._level("crash")

    def test_level_ring(self) -> None:
        """RING-1..RING-6, BDEV-16: head detection in every lap, overwrite as eviction."""
        self._level("ring")

    def test_crash_workloads(self) -> None:
        """CRASH-7, DUR-2..DUR-6, DUR-9: small workloads, every crash point, every torn or
        dropped write (exhaustive up to the state-space limit)."""
        opener = type(self).fs_opener
        assert opener is not None
        uri = parse_uri(self.store_uri("crash" + uuid.uuid4().hex[:8]))
        location, options = "/" + uri.location.strip("/"), dict(uri.options)

        def open_store(fs: RecordingFS, clock: Clock) -> Any:
            durable_dirs(fs, os.path.dirname(location))
            return opener(fs, location, clock, **options)

        checked = 0
        for name, ops in CRASH_WORKLOADS.items():
            ops = [self._adapt(op) for op in ops if self._supported(op)]
            run = CrashRun(open_store, ops)
            try:
                checked += run.check(list(range(len(run.fs.history) + 1)), torn="garbage")
            except AssertionError as exc:
                raise AssertionError(f"workload {name!r}: {exc}") from None
        assert checked > 0

    def _adapt(self, op: Op) -> Op:
        if op[0] == "create" and not self.capabilities.exact_progress:
            # an at-least-once backend may undo a trim after a crash (see the crash level)
            return (op[0], op[1], {**op[2], "trim": "none"})
        return op

    def _supported(self, op: Op) -> bool:
        caps = self.capabilities
        if op[0] in ("subscribe", "ack", "commit", "flush_sub"):
            return caps.subscribers
        if op[0] == "create":
            return op[2].get("durability", "fsync") in caps.durability
        return True

    def test_format_roundtrip(self) -> None:
        """Format round trip: what the backend wrote passes ``tidelog verify`` (every checksum
        and structure rule of its format) and reads back identically after a reopen."""
        from tidelog.verify import verify_path

        tmp = tempfile.mkdtemp(prefix="tidelog-kit-")
        try:
            self._roundtrip(tmp, verify_path)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)

    def _roundtrip(self, tmp: str, verify_path: Callable[..., Any]) -> None:
        import tidelog

        name = "rt" + uuid.uuid4().hex[:8]
        uri = self.store_uri(name)
        clock = FakeClock(1_000_000)
        store = tidelog.open(uri, clock=clock)
        topic_name = store.topics()[0] if store.topics() else "t0"
        topic = store.topic(topic_name)
        for i in range(20):
            topic.append(bytes([i]) * (i * 7 % 50), tag="a" if i % 2 else None)
        if self.capabilities.subscribers:
            sub = topic.subscribe("s0", start="earliest")
            sub.ack(3)
            sub.flush()
        before = observe(store)
        store.close()
        report = verify_path(parse_uri(uri).location, kind=self.verify_format)
        assert report.ok, "verify found: " + "; ".join(str(p) for p in report.errors)
        again = tidelog.open(uri, clock=FakeClock(clock.now_ms()))
        try:
            assert observe(again) == before
        finally:
            again.close()


def _default(cls: type, attr: str, value: object) -> None:
    """Set ``attr`` on ``cls`` unless a subclass of BackendSuite declares it."""
    for klass in cls.__mro__:
        if klass is BackendSuite:
            break
        if attr in vars(klass):
            return
    if value is not None:
        setattr(cls, attr, value)


def _expect_pass(result: LevelResult) -> None:
    if result.status == "pass":
        return
    lines = format_report([result])
    if result.failure is not None and result.failure.hypothesis_steps:
        lines += ["Hypothesis steps:", result.failure.hypothesis_steps]
    lines.append(f"reproduce with TIDELOG_SEED={result.seed}")
    raise AssertionError("\n".join(lines))

