"""URI scheme -> backend factory (spec URI-1).

Built-in backends are imported on first use. Third-party backends register through the
entry-point group ``tidelog.backends`` (name = scheme, value = ``"module:factory"``) or by calling
``register``. A factory is ``factory(uri: URI, options: dict, clock: Clock) -> Backend``.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from importlib.metadata import entry_points
from types import MappingProxyType
from typing import Any

from .errors import UnknownScheme

__all__ = ["register", "resolve", "known_schemes", "BUILTIN"]

ENTRY_POINT_GROUP = "tidelog.backends"

BUILTIN: MappingProxyType[str, str] = MappingProxyType(
    {
        "blockdev": "tidelog.backends.blockdev:open_backend",
        "file": "tidelog.backends.file:open_backend",
        "memory": "tidelog.backends.memory:open_backend",
        "model": "tidelog.model:open_backend",
        "sf": "tidelog.backends.sf:open_backend",
    }
)

_registered: dict[str, Callable[..., Any] | str] = {}


def register(scheme: str, factory: Callable[..., Any] | str, *, clobber: bool = False) -> None:
    """Register a backend factory (or ``"module:attr"`` string) for ``scheme``."""
    scheme = scheme.lower()
    if scheme in BUILTIN:
        raise ValueError(f"scheme {scheme!r} is built in and cannot be replaced")
    if scheme in _registered and not clobber:
        raise ValueError(f"scheme {scheme!r} is already registered (pass clobber=True)")
    _registered[scheme] = factory


def unregister(scheme: str) -> None:
    _registered.pop(scheme.lower(), None)


def _entry_point_targets() -> dict[str, str]:
    return {ep.name.lower(): ep.value for ep in entry_points(group=ENTRY_POINT_GROUP)}


def known_schemes() -> list[str]:
    return sorted(set(BUILTIN) | set(_registered) | set(_entry_point_targets()))


def _load(target: str) -> Callable[..., Any]:
    module, _, attr = target.partition(":")
    obj: Any = importlib.import_module(module)
    for part in attr.split("."):
        obj = getattr(obj, part)
    return obj  # type: ignore[no-any-return]


def resolve(scheme: str) -> Callable[..., Any]:
    scheme = scheme.lower()
    target: Callable[..., Any] | str | None = BUILTIN.get(scheme)
    if target is None:
        target = _registered.get(scheme)
    if target is None:
        target = _entry_point_targets().get(scheme)
    if target is None:
        raise UnknownScheme(
            f"unknown store scheme {scheme!r}; known schemes: {', '.join(known_schemes())}"
        )
    return _load(target) if isinstance(target, str) else target
