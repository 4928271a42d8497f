"""The remote backend's address and options (SERVICE.md SVC-58; URI-2, URI-3, URI-6).

Parsed and refused like every backend's options, before anything is sent: an unknown key, a bad
value or a bad address is ``bad_option``/``bad_uri`` naming it. The served store's own options
(``max_record_bytes``, ``max_bytes``, URI-5) are ``tidelog serve --uri``'s, so they are unknown
keys here.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from urllib.parse import urlsplit

from tidelog.errors import BadOption, BadURI
from tidelog.options import MAX_WAIT_MS, parse_bool, parse_int, validate_options
from tidelog.uri import URI

__all__ = ["RemoteOptions", "Address", "parse_address", "parse_remote_options", "TOKEN_ENV"]

#: where the bearer token comes from when the options give none (SVC-58)
TOKEN_ENV = "TIDELOG_TOKEN"


@dataclass(frozen=True)
class Address:
    """Where the service is: ``https`` or not, host, port, and the path the API's ``/v0`` is
    under (empty, or ``/base`` behind a reverse proxy)."""

    tls: bool
    host: str
    port: int
    base: str

    def __str__(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{'https' if self.tls else 'http'}://{host}:{self.port}{self.base}"


@dataclass(frozen=True)
class RemoteOptions:
    token: str | None = None
    timeout_ms: int = 30_000
    retry_ms: int = 10_000
    no_throttle: bool = False


def parse_address(uri: URI) -> Address:
    """``host[:port][/base]`` of an ``http://`` or ``https://`` URI; the port defaults to HTTP's
    (80, 443)."""
    tls = uri.scheme == "https"
    example = f"{uri.scheme}://127.0.0.1:9000"
    try:
        parts = urlsplit("//" + uri.location)
        host, port = parts.hostname, parts.port
    except ValueError as exc:
        bad = f"bad {uri.scheme}:// address {uri.location!r}"
        raise BadURI(f"{bad}: {exc} (e.g. {example})") from None
    if not host:
        raise BadURI(f"bad {uri.scheme}:// address {uri.location!r}: no host (e.g. {example})")
    if any(ord(c) < 33 or ord(c) == 127 for c in uri.location):
        raise BadURI(
            f"bad {uri.scheme}:// address {uri.location!r}: spaces and control characters are "
            "not allowed"
        )
    base = parts.path.rstrip("/")
    return Address(tls, host, port if port is not None else (443 if tls else 80), base)


def _token(key: str, value: object) -> str:
    """A bearer token goes into a header: printable ASCII, no spaces. Never echoed (a secret)."""
    if not isinstance(value, str) or not value or not all(33 <= ord(c) < 127 for c in value):
        raise BadOption(
            f"option {key}: a bearer token is a non-empty string of printable ASCII without "
            "spaces (its value is not shown)"
        )
    return value


_SPEC = {
    "token": _token,
    # URI-6: both are waits (at most an hour)
    "timeout_ms": lambda k, v: parse_int(k, v, minimum=1, maximum=MAX_WAIT_MS),
    "retry_ms": lambda k, v: parse_int(k, v, minimum=0, maximum=MAX_WAIT_MS),
    "no_throttle": parse_bool,  # SVC-45's override on this client's appends
}


def parse_remote_options(
    scheme: str, options: Mapping[str, object], environ: Mapping[str, str] | None = None
) -> RemoteOptions:
    """The options (URI-2); ``token`` else ``$TIDELOG_TOKEN`` (an empty one counts as unset)."""
    parsed = validate_options(options, _SPEC, where=f"{scheme}://")
    if "token" not in parsed:
        env = (os.environ if environ is None else environ).get(TOKEN_ENV)
        if env:
            parsed["token"] = _token(TOKEN_ENV, env)
    return RemoteOptions(**parsed)
