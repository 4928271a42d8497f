"""tidelog.backends.blockdev: not implemented yet (see the project's open issues)."""

from __future__ import annotations

from collections.abc import Mapping

from tidelog.clock import Clock
from tidelog.errors import NotAvailable
from tidelog.uri import URI

__all__ = ["open_backend"]


def open_backend(uri: URI, options: Mapping[str, object], clock: Clock) -> object:
    raise NotAvailable("the blockdev:// backend is not available yet in this version of tidelog")
