"""A ``LocalSut`` whose stores are reached over HTTP: each store the template names is opened
in this process with the runner's clock (CNF-4), served by ``tidelog serve``'s service on
127.0.0.1 (spec/SERVICE.md), and handed to the suite as the remote backend's store
(``http://``, SVC-58). So every level runs through the service and the remote backend: the
model judges the whole path, encoding, errors and retries included.

A clean close and reopen is a restart of the service over the store (DUR-1 applies to the
served store, not to a client's connections); a crash stops the service, then loses power
under the served store as ``LocalSut`` does.
"""

from __future__ import annotations

import contextlib
from typing import Any

import tidelog
from tidelog.api import Store
from tidelog.clock import FakeClock
from tidelog.errors import TidelogError

from .sut import LocalSut

__all__ = ["ServedSut"]


class ServedSut(LocalSut):
    """``LocalSut``'s stores, each behind a live service, driven through ``http://``."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.hello["implementation"] += " over HTTP (tidelog serve, http://)"
        self.service: Any = None  # tidelog.service.server.ServiceThread (needs aiohttp)
        self.remote: Store | None = None

    def _stop(self) -> None:
        """Stop the service and close the client; the served store stays as it is."""
        remote, self.remote = self.remote, None
        if remote is not None:
            remote.close()
        service, self.service = self.service, None
        if service is not None:
            service.stop()

    def open(self, name: str, clock: FakeClock) -> Store:
        self._stop()
        if self.store is not None:  # the suite closed the client: close the served store
            with contextlib.suppress(TidelogError):
                self.store.close()
        served = super().open(name, clock)
        from tidelog.service.server import ServiceThread

        self.service = ServiceThread(served).start()
        self.remote = tidelog.open(self.service.url)
        return self.remote

    def _abandon(self) -> None:
        self._stop()
        super()._abandon()

    def dispose(self, name: str) -> None:
        self._stop()
        super().dispose(name)

    def shutdown(self) -> None:
        self._stop()
        super().shutdown()
