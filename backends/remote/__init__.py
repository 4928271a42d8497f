"""tidelog.backends.remote: a store served by ``tidelog serve``, over HTTP (``http://`` and
``https://``; spec/SERVICE.md section 10, SVC-58..SVC-60).

``tidelog.open("http://127.0.0.1:9000")`` gives the same ``Store``/``Topic``/``Subscriber`` API
as in process: each Backend call is one request of the service's API (SVC-13), errors raise the
class of their ERR-1 code, waits are woken by the served store's change notification (SVC-59),
and requests are repeated only where that cannot apply them twice (SVC-60). The clock given to
``tidelog.open`` is not used: the served store has its own (SVC-1). Closing the store closes
this client's connections; the served store stays open.
"""

from __future__ import annotations

from collections.abc import Mapping

from tidelog.clock import Clock
from tidelog.uri import URI

from .backend import RemoteBackend, open_remote
from .client import Client
from .options import parse_address, parse_remote_options

__all__ = ["RemoteBackend", "open_backend"]


def open_backend(uri: URI, options: Mapping[str, object], clock: Clock) -> RemoteBackend:
    """The factory of ``http://`` and ``https://`` (REG-1): options and address are checked
    before anything is sent (URI-2), then ``GET /v0`` reads the served store's capabilities."""
    opts = parse_remote_options(uri.scheme, options)
    address = parse_address(uri)
    return open_remote(Client(address, opts))
