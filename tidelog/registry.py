"""URI scheme -> backend descriptor (spec URI-1, REG-1..REG-6).

A ``BackendDescriptor`` says everything the core, the CLI, ``tidelog verify`` and the
conformance kit need to know about a backend: its factory, its capabilities (CAP-1 refusals are
decided from them by ``tidelog.api``), whether the URI location is a path or a name, and its
optional tools (verify/detect, opening through a simulated filesystem, disposing of a store)
and hooks (``tidelog.hooks``). Callables may be given as ``"module:attr"`` strings, loaded on
first use, so answering a cheap question ("is the location a path?") imports no backend.

Built-in backends are described here (``DESCRIPTORS``). Third-party backends register through
the entry-point group ``tidelog.backends`` (name = scheme, value = ``"module:attr"`` naming a
descriptor or a bare factory) or by calling ``register``. A factory is
``factory(uri: URI, options: dict, clock: Clock) -> Backend``; a bare factory registers with a
default descriptor (REG-3).
"""

from __future__ import annotations

import dataclasses
import importlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from importlib.metadata import entry_points
from types import MappingProxyType
from typing import Any, Literal

from .backend import Capabilities
from .errors import NotAvailable, UnknownScheme

__all__ = [
    "BackendDescriptor",
    "register",
    "unregister",
    "resolve",
    "descriptor",
    "find",
    "descriptors",
    "known_schemes",
    "builtin_capabilities",
    "BUILTIN",
    "DESCRIPTORS",
]

ENTRY_POINT_GROUP = "tidelog.backends"

#: a callable, or ``"module:attr"`` naming one (imported on first use)
Target = Callable[..., Any] | str

#: the capability flags whose operations the core refuses (CAP-1, REG-4), and what each
#: operation is called in the default refusal message
REFUSED_FLAGS: Mapping[str, str] = MappingProxyType(
    {
        "deletes": "deletes",
        "subscribers": "subscribers",
        "queue": "queue mode",
        "routers": "routers",
    }
)


@dataclass(frozen=True)
class BackendDescriptor:
    """One backend, as the registry knows it (REG-1). Only ``scheme`` and ``factory`` are
    required; every other field has the default a bare factory gets (REG-3)."""

    scheme: str
    #: ``factory(uri, options, clock) -> Backend``
    factory: Target
    #: what a store of this scheme claims with default options (CAP-1); None: only the open
    #: backend's own ``capabilities`` say. An open store may claim differently by its options
    #: (an ``sf://`` slot with ``sf_durability=memory`` is not crash_safe): the core refuses
    #: from what the open store claims (REG-4)
    capabilities: Capabilities | None = None
    #: "path": the URI location is a path on this machine (URI-7); "address": a network address
    #: ``host[:port][/base]``, the only location that may carry a port (URI-2); "name": anything
    #: else
    location: Literal["path", "name", "address"] = "name"
    #: what a path location names, for messages ("store directory")
    names: str = "store"
    #: a relative path location is rendered with a leading ``./`` (``file://./dir``)
    dot_relative: bool = False
    #: ``readonly=true`` opens a view that never writes (CLI-3)
    read_only_view: bool = False
    #: options that open an existing store without ever creating one (CLI-3)
    open_existing: Mapping[str, object] = field(default_factory=lambda: MappingProxyType({}))
    #: the ``not_available`` message per capability flag the backend lacks (REG-4)
    refusals: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    #: names of the ``tidelog.hooks`` protocols its backends offer (REG-5)
    hooks: frozenset[str] = frozenset()
    #: ``detect(fs, path) -> bool``: path holds one of this backend's stores (``tidelog verify``)
    detect: Target | None = None
    #: ``verify(fs, path) -> tidelog.report.Report``: check a store offline (CONFORMANCE §5)
    verify: Target | None = None
    #: ``fs_opener(fs, location, clock, **options) -> Store``: open a store through a
    #: ``tidelog.fsio.FS`` (the conformance kit's crash tests pass a RecordingFS)
    fs_opener: Target | None = None
    #: ``dispose(uri) -> None``: delete the store a URI names (the conformance kit, between
    #: examples)
    dispose: Target | None = None

    def tool(self, name: str) -> Callable[..., Any]:
        """The callable in field ``name`` (loaded if given as a string); ``NotAvailable`` when
        the descriptor has none."""
        target = getattr(self, name)
        if target is None:
            raise NotAvailable(f"{self.scheme}:// backends declare no {name} (REG-5)")
        return _load(target) if isinstance(target, str) else target  # type: ignore[no-any-return]

    def has(self, name: str) -> bool:
        """Whether tool field ``name`` is set."""
        return getattr(self, name) is not None

    def refusal(self, flag: str) -> NotAvailable:
        """The ``not_available`` error for an operation needing capability ``flag`` (REG-4)."""
        message = self.refusals.get(flag)
        if message is None:
            message = (
                f"{self.scheme}:// stores do not support {REFUSED_FLAGS.get(flag, flag)} "
                f"(capability {flag} is False, CAP-1)"
            )
        return NotAvailable(message)


def _sf_refusal(what: str) -> str:
    return (
        f"sf:// stores do not support {what}: an SF slot has one trim point, owned by its "
        "forwarder (tidelog forward / tidelog.forward.Forwarder)"
    )


_BLOCKDEV_QUEUE = "queue mode is not available on blockdev"

#: the built-in backends (spec/SPEC.md §10 for their capabilities). Adding an in-tree backend:
#: its folder under backends/ and one entry here (docs/backends.md).
DESCRIPTORS: Mapping[str, BackendDescriptor] = MappingProxyType(
    {
        d.scheme: d
        for d in (
            BackendDescriptor(
                "file",
                "tidelog.backends.file:open_backend",
                Capabilities(persistent=True, crash_safe=True, routers=True),
                location="path",
                names="store directory",
                dot_relative=True,
                read_only_view=True,  # FORMATS XPR-1
                open_existing=MappingProxyType({"create": False}),
                hooks=frozenset({"abandon", "checkpoint", "topics"}),
                detect="tidelog.backends.file.verify:is_store",
                verify="tidelog.backends.file.verify:verify_store",
                fs_opener="tidelog.backends.file:open_store",
                dispose="tidelog.backends.file:dispose",
            ),
            BackendDescriptor(
                "blockdev",
                "tidelog.backends.blockdev:open_backend",
                Capabilities(
                    persistent=True,
                    crash_safe=True,
                    deletes=False,
                    subscribers=True,
                    queue=False,
                    multi_topic=False,
                    exact_progress=False,
                    durability=frozenset({"memory", "fsync"}),
                ),
                location="path",
                names="ring image or device",
                dot_relative=True,
                read_only_view=True,  # FORMATS-blockdev BDEV-28
                open_existing=MappingProxyType({"format": False}),
                refusals=MappingProxyType(
                    {
                        "deletes": "deletes are not available on blockdev (the ring only "
                        "overwrites)",
                        "queue": _BLOCKDEV_QUEUE,
                        "routers": "routers are not available on blockdev: a ring holds one "
                        "topic, so never a router's source and dest together (RTR-13)",
                    }
                ),
                hooks=frozenset({"abandon", "topics", "io_stats", "ring_evictions"}),
                detect="tidelog.backends.blockdev.verify:is_ring",
                verify="tidelog.backends.blockdev.verify:verify_image",
                fs_opener="tidelog.backends.blockdev:open_store",
                dispose="tidelog.backends.blockdev:dispose",
            ),
            BackendDescriptor(
                "sf",
                "tidelog.backends.sf:open_backend",
                # with the default sf_durability=append; an open slot claims its own (SF-15)
                Capabilities(
                    persistent=True,
                    crash_safe=True,
                    deletes=False,
                    subscribers=False,
                    queue=False,
                    multi_topic=False,
                    durability=frozenset({"fsync"}),
                ),
                location="path",
                names="SF slot",
                read_only_view=True,  # FORWARD SF-21
                refusals=MappingProxyType(
                    {
                        "deletes": _sf_refusal("deletes"),
                        "subscribers": _sf_refusal("subscribers"),
                        "queue": _sf_refusal("queue mode"),
                        "routers": "sf:// stores do not support routers: an SF slot holds one "
                        "topic; moving records between stores is the forwarder's job (RTR-13)",
                    }
                ),
                detect="tidelog.backends.sf.verify:is_slot",
                verify="tidelog.backends.sf.verify:verify_slot",
            ),
            BackendDescriptor(
                "memory",
                "tidelog.backends.memory:open_backend",
                Capabilities(persistent=False, crash_safe=False, routers=True),
                hooks=frozenset({"topics"}),
                dispose="tidelog.backends.memory:dispose",
            ),
            BackendDescriptor(
                "model",
                "tidelog.model:open_backend",
                Capabilities(persistent=False, crash_safe=False, routers=True),
                dispose="tidelog.model:dispose",
            ),
            # the remote backend (SERVICE.md SVC-58): a store served by `tidelog serve`. What
            # is static: the location is an address, and there are no tools or hooks (nothing
            # of the served store is on this machine). Its capabilities are not: they are the
            # served store's, read from `GET /v0` at open (capabilities=None, REG-4)
            *(
                BackendDescriptor(
                    scheme,
                    "tidelog.backends.remote:open_backend",
                    None,
                    location="address",
                    names="tidelog serve address",
                )
                for scheme in ("http", "https")
            ),
        )
    }
)

#: ``cold+<scheme>``: the cold tier of a file store alone, read-only (spec/TIERING.md TIER-12).
#: One descriptor for every cold URL scheme (``cold+s3``, ``cold+file``, ...), which pyarrow.fs
#: decides, so it is not keyed by a scheme in DESCRIPTORS; ``find`` gives it for any of them.
#: Its capabilities are the backend's own (CAP-1: nothing but reads).
COLD = BackendDescriptor(
    "cold+",
    "tidelog.backends.file.coldbackend:open_backend",
    None,
    names="cold tier",
    read_only_view=True,
)

#: scheme -> its factory as ``"module:attr"``
BUILTIN: MappingProxyType[str, str] = MappingProxyType(
    {s: d.factory for s, d in DESCRIPTORS.items() if isinstance(d.factory, str)}
)

_registered: dict[str, BackendDescriptor] = {}


def register(scheme: str, factory: Target | BackendDescriptor, *, clobber: bool = False) -> None:
    """Register a backend for ``scheme``: a ``BackendDescriptor``, or a bare factory (or
    ``"module:attr"`` string), which gets the default descriptor (REG-3)."""
    scheme = scheme.lower()
    if scheme in DESCRIPTORS:
        raise ValueError(f"scheme {scheme!r} is built in and cannot be replaced")
    if scheme in _registered and not clobber:
        raise ValueError(f"scheme {scheme!r} is already registered (pass clobber=True)")
    _registered[scheme] = _describe(scheme, factory)


def unregister(scheme: str) -> None:
    _registered.pop(scheme.lower(), None)


def _describe(scheme: str, target: object) -> BackendDescriptor:
    """``target`` as the descriptor of ``scheme``: a descriptor (under this scheme) as is,
    anything else as the factory of a default one (REG-3)."""
    if isinstance(target, BackendDescriptor):
        return target if target.scheme == scheme else dataclasses.replace(target, scheme=scheme)
    return BackendDescriptor(scheme, target)  # type: ignore[arg-type]


def _entry_point_targets() -> dict[str, str]:
    return {ep.name.lower(): ep.value for ep in entry_points(group=ENTRY_POINT_GROUP)}


def known_schemes() -> list[str]:
    return sorted(set(DESCRIPTORS) | set(_registered) | set(_entry_point_targets()))


def _load(target: str) -> Any:
    module, _, attr = target.partition(":")
    obj: Any = importlib.import_module(module)
    for part in attr.split("."):
        obj = getattr(obj, part)
    return obj


def find(scheme: str) -> BackendDescriptor | None:
    """The descriptor of ``scheme``, or None: built in, registered, then entry points (whose
    target is imported to tell a descriptor from a factory)."""
    scheme = scheme.lower()
    found = DESCRIPTORS.get(scheme) or _registered.get(scheme)
    if found is not None:
        return found
    if scheme.startswith(COLD.scheme) and len(scheme) > len(COLD.scheme):
        return dataclasses.replace(COLD, scheme=scheme)
    target = _entry_point_targets().get(scheme)
    return None if target is None else _describe(scheme, _load(target))


def descriptor(scheme: str) -> BackendDescriptor:
    """The descriptor of ``scheme``; ``unknown_scheme`` naming the known ones (URI-1)."""
    found = find(scheme)
    if found is None:
        raise UnknownScheme(
            f"unknown store scheme {scheme.lower()!r}; known schemes: {', '.join(known_schemes())}"
        )
    return found


def descriptors() -> list[BackendDescriptor]:
    """Every known descriptor: the built-in ones in their order, then the registered ones, then
    those of entry points. An entry point whose target cannot be imported is left out here (it
    fails when its scheme is opened, URI-1): one broken plugin does not stop ``tidelog
    verify`` from recognising everything else."""
    out = {**DESCRIPTORS, **_registered}
    for scheme, target in sorted(_entry_point_targets().items()):
        if scheme not in out:
            try:
                out[scheme] = _describe(scheme, _load(target))
            except (ImportError, AttributeError):
                continue
    return list(out.values())


def builtin_capabilities(scheme: str) -> Capabilities:
    """What built-in backend ``scheme`` claims: its backend module reads it from here, so it is
    declared once (REG-1)."""
    caps = DESCRIPTORS[scheme].capabilities
    assert caps is not None, f"built-in {scheme}:// declares its capabilities"
    return caps


def resolve(scheme: str) -> Callable[..., Any]:
    """The factory of ``scheme`` (URI-1)."""
    return descriptor(scheme).tool("factory")
