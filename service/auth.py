"""Bearer tokens, rights and TLS for ``tidelog serve`` (spec/SERVICE.md SVC-47..SVC-50).

``Authorizer.check`` is the one gate: the app calls it first in every handler, before it looks
anything up, with the right the endpoint needs (SVC-48); it answers the caller's ``Principal`` or
raises ``Unauthorized`` (401) or ``Forbidden`` (403). The tokens file holds SHA-256 hashes only;
a presented token is hashed and compared with every entry in constant time.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import json
import logging
import socket
import ssl
from collections.abc import Iterable
from dataclasses import dataclass, field
from fnmatch import fnmatchcase
from typing import Any, Final

from tidelog.errors import BadArgument, BadOption, Forbidden, TidelogError, Unauthorized
from tidelog.fsio import OsFS, read_whole

__all__ = [
    "RIGHTS",
    "STORE_WIDE",
    "Grant",
    "Principal",
    "ANYONE",
    "Authorizer",
    "hash_token",
    "load_tokens",
    "server_ssl_context",
    "is_loopback",
    "check_listen",
]

log = logging.getLogger("tidelog.service.auth")

#: SVC-48: the rights a grant gives on the topics its glob matches.
RIGHTS: Final = ("read", "write", "admin")
#: SVC-48: the one glob that grants a right store-wide ("on ``*``").
STORE_WIDE: Final = "*"
#: ``check``'s two rights that no grant gives: any valid token, and nothing at all.
_GATES: Final = ("any", "none")
_MAX_NAME = 128


def hash_token(token: str) -> str:
    """SVC-47: the ``sha256`` a tokens file holds for ``token`` (hex of its UTF-8 bytes), the
    same as ``printf '%s' "$TOKEN" | sha256sum``."""
    return hashlib.sha256(token.encode("utf-8", "surrogatepass")).hexdigest()


@dataclass(frozen=True)
class Grant:
    """Rights on the topics a glob matches (``fnmatchcase``, as DEL-3)."""

    topics: str
    rights: frozenset[str]


@dataclass(frozen=True)
class Principal:
    """Who a request is: a token's name and grants, or, with no tokens file, anyone with every
    right (``name`` None). ``digest`` is the token's SHA-256, kept to find the same token again
    after a reload (``Authorizer.recheck``); it is never shown."""

    name: str | None
    grants: tuple[Grant, ...]
    unthrottled: bool = False
    digest: bytes = field(default=b"", repr=False, compare=False)

    def can(self, right: str, topic: str | None) -> bool:
        """SVC-48: whether one of the grants gives ``right`` on ``topic`` (the union of the
        matching grants); ``topic`` None is store-wide: a grant whose glob is exactly ``*``.
        ``any`` and ``none`` hold for every principal."""
        if right in _GATES:
            return True
        if right not in RIGHTS:
            raise BadArgument(f"right {right!r}: expected one of {', '.join(RIGHTS + _GATES)}")
        for grant in self.grants:
            if right not in grant.rights:
                continue
            if grant.topics == STORE_WIDE if topic is None else fnmatchcase(topic, grant.topics):
                return True
        return False

    def readable(self, topics: Iterable[str]) -> list[str]:
        """SVC-48: the names of ``topics`` this principal may read, in their order
        (``GET /v0/topics``)."""
        return [t for t in topics if self.can("read", t)]


#: No tokens file: every request has every right and may bypass throttling (SVC-47, SVC-45).
ANYONE: Final = Principal(None, (Grant(STORE_WIDE, frozenset(RIGHTS)),), unthrottled=True)


def _where(path: str, at: str, what: str) -> BadOption:
    return BadOption(f"--tokens {path}: {at}: {what} (SVC-47)")


def _keys(
    path: str, at: str, obj: object, required: set[str], optional: set[str]
) -> dict[str, Any]:
    if not isinstance(obj, dict):
        raise _where(path, at, f"expected an object, got {type(obj).__name__}")
    unknown = sorted(set(obj) - required - optional)
    if unknown:
        raise _where(
            path,
            at,
            f"unknown key {unknown[0]!r} (known: {', '.join(sorted(required | optional))})",
        )
    missing = sorted(required - set(obj))
    if missing:
        raise _where(path, at, f"missing key {missing[0]!r}")
    return obj


def _grant(path: str, at: str, obj: object) -> Grant:
    obj = _keys(path, at, obj, {"topics", "rights"}, set())
    glob = obj["topics"]
    if not isinstance(glob, str) or not glob:
        raise _where(path, f"{at}.topics", f"expected a non-empty glob string, got {glob!r}")
    rights = obj["rights"]
    if not isinstance(rights, list) or not rights:
        raise _where(path, f"{at}.rights", f"expected a non-empty list of {', '.join(RIGHTS)}")
    for i, right in enumerate(rights):
        if right not in RIGHTS:
            raise _where(
                path, f"{at}.rights[{i}]", f"{right!r} is not a right ({', '.join(RIGHTS)})"
            )
    return Grant(glob, frozenset(rights))


def _entry(path: str, at: str, obj: object) -> Principal:
    obj = _keys(path, at, obj, {"name", "sha256", "grants"}, {"unthrottled"})
    name = obj["name"]
    if not isinstance(name, str) or not 0 < len(name) <= _MAX_NAME or not name.isprintable():
        raise _where(
            path, f"{at}.name", f"expected 1-{_MAX_NAME} printable characters, got {name!r}"
        )
    hexdigest = obj["sha256"]
    try:
        if not isinstance(hexdigest, str) or len(hexdigest) != 64:
            raise ValueError
        digest = bytes.fromhex(hexdigest)
    except ValueError:
        raise _where(
            path, f"{at}.sha256", "expected the 64 hex digits of the token's SHA-256"
        ) from None
    grants = obj["grants"]
    if not isinstance(grants, list):
        raise _where(path, f"{at}.grants", f"expected a list, got {type(grants).__name__}")
    unthrottled = obj.get("unthrottled", False)
    if not isinstance(unthrottled, bool):
        raise _where(path, f"{at}.unthrottled", f"expected true or false, got {unthrottled!r}")
    return Principal(
        name,
        tuple(_grant(path, f"{at}.grants[{i}]", g) for i, g in enumerate(grants)),
        unthrottled,
        digest,
    )


def load_tokens(path: str) -> tuple[Principal, ...]:
    """SVC-47: the entries of the tokens file at ``path``; anything wrong with it is
    ``bad_option`` naming the file and where in it."""
    try:
        data = read_whole(OsFS(), path)
    except OSError as exc:
        raise BadOption(
            f"--tokens {path}: cannot read it: {exc.strerror or exc} (SVC-47)"
        ) from None
    try:
        doc = json.loads(data)
    except (ValueError, UnicodeDecodeError) as exc:
        raise BadOption(f"--tokens {path}: not valid JSON: {exc} (SVC-47)") from None
    doc = _keys(path, "top level", doc, {"tokens"}, set())
    if not isinstance(doc["tokens"], list):
        raise _where(path, "tokens", f"expected a list, got {type(doc['tokens']).__name__}")
    entries = tuple(_entry(path, f"tokens[{i}]", e) for i, e in enumerate(doc["tokens"]))
    names: set[str] = set()
    digests: set[bytes] = set()
    for i, entry in enumerate(entries):
        assert entry.name is not None
        if entry.name in names:
            raise _where(path, f"tokens[{i}].name", f"{entry.name!r} is given twice")
        if entry.digest in digests:
            raise _where(path, f"tokens[{i}].sha256", "the same hash as an earlier token")
        names.add(entry.name)
        digests.add(entry.digest)
    return entries


def _bearer(header: str | None) -> str:
    """The token of an ``Authorization: Bearer <token>`` header (RFC 6750: the scheme is
    case-insensitive), else ``Unauthorized``. The token itself never goes into a message."""
    if header is None or not header.strip():
        raise Unauthorized("no token: send 'Authorization: Bearer <token>' (SVC-49)")
    scheme, _, token = header.strip().partition(" ")
    if scheme.lower() != "bearer":
        raise Unauthorized(f"the Authorization scheme {scheme[:20]!r} is not Bearer (SVC-49)")
    token = token.strip()
    if not token:
        raise Unauthorized("an empty bearer token (SVC-49)")
    return token


class Authorizer:
    """The service's tokens (SVC-47..SVC-49). ``path`` None: no tokens file, every request has
    every right. ``generation`` counts the loads that took effect, so a long-lived stream can
    tell cheaply when to ``recheck``."""

    def __init__(self, path: str | None) -> None:
        self.path = path
        self._entries: tuple[Principal, ...] = () if path is None else load_tokens(path)
        self.generation = 0

    @property
    def open(self) -> bool:
        """True without a tokens file."""
        return self.path is None

    @property
    def names(self) -> list[str]:
        return [e.name for e in self._entries if e.name is not None]

    def reload(self) -> str | None:
        """SVC-49 (``SIGHUP``): read the file again. A file that does not load keeps the old
        tokens; the reason is logged and returned (None when the new tokens took effect)."""
        if self.path is None:
            return None
        try:
            entries = load_tokens(self.path)
        except BadOption as exc:
            log.warning("tokens not reloaded, the old ones stay: %s", exc.message)
            return exc.message
        self._entries = entries
        self.generation += 1
        log.info("tokens reloaded from %s: %d tokens", self.path, len(entries))
        return None

    def _find(self, digest: bytes) -> Principal | None:
        found = None
        for entry in self._entries:  # every entry, no early exit: the time tells nothing
            if hmac.compare_digest(digest, entry.digest):
                found = entry
        return found

    def authenticate(self, header: str | None) -> Principal:
        """The principal of an ``Authorization`` header: ``Unauthorized`` without a token or
        with one the file does not hold (SVC-49)."""
        if self.path is None:
            return ANYONE
        token = _bearer(header)
        digest = hashlib.sha256(token.encode("utf-8", "surrogatepass")).digest()
        entry = self._find(digest)
        if entry is None:
            raise Unauthorized("unknown bearer token (SVC-49)")
        return entry

    def check(self, authorization_header: str | None, right: str, topic: str | None) -> Principal:
        """SVC-48, SVC-49: the caller's principal if it has ``right`` on ``topic`` (None:
        store-wide, a grant on exactly ``*``). ``right`` is ``read``, ``write``, ``admin``,
        ``any`` (any valid token) or ``none`` (no check: ``/v0/health``). No token or an unknown
        one is ``Unauthorized``; a known one without the right ``Forbidden``. Call it before
        anything is looked up: the answer never depends on whether ``topic`` exists."""
        if right == "none":
            try:
                return self.authenticate(authorization_header)
            except Unauthorized:
                return ANYONE if self.path is None else Principal(None, ())
        return self.authorize(self.authenticate(authorization_header), right, topic)

    def authorize(self, principal: Principal, right: str, topic: str | None) -> Principal:
        """``principal`` if it has ``right`` on ``topic``, else ``Forbidden`` (SVC-49); a second
        check of one request (a router's dest) needs no second hash."""
        if not principal.can(right, topic):
            where = "store-wide (a grant on '*')" if topic is None else f"on topic {topic!r}"
            raise Forbidden(f"token {principal.name!r} has no {right} right {where} (SVC-48)")
        return principal

    def recheck(self, principal: Principal, right: str, topic: str | None) -> Principal:
        """After a reload: the principal the same token is now, if it still has ``right`` on
        ``topic``; ``Unauthorized`` if the file no longer holds the token, ``Forbidden`` if it
        lost the right (a stream then ends, SVC-49)."""
        if self.path is None:
            return ANYONE
        entry = self._find(principal.digest)
        if entry is None:
            raise Unauthorized(f"token {principal.name!r} is no longer in the tokens file (SVC-49)")
        return self.authorize(entry, right, topic)


# -- TLS and the start-up checks ---------------------------------------------------------------


def _no_password() -> bytes:
    # An encrypted key would make OpenSSL prompt on the terminal; refuse it instead.
    raise BadOption("the TLS key is encrypted; tidelog serve takes an unencrypted key (SVC-50)")


def server_ssl_context(cert: str, key: str) -> ssl.SSLContext:
    """SVC-50: the server's TLS context: TLS 1.2 or later, the ``ssl`` module's defaults for a
    server, the certificate chain ``cert`` and its private key ``key`` (PEM). A file that
    cannot be read or used is ``bad_option`` naming it."""
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    for option, path in (("--tls-cert", cert), ("--tls-key", key)):
        try:
            read_whole(OsFS(), path)
        except OSError as exc:
            raise BadOption(
                f"{option} {path}: cannot read it: {exc.strerror or exc} (SVC-50)"
            ) from None
    try:
        ctx.load_cert_chain(cert, key, password=_no_password)
    except TidelogError:
        raise
    except (ssl.SSLError, OSError) as exc:
        raise BadOption(
            f"--tls-cert {cert} --tls-key {key}: not a usable PEM certificate and matching "
            f"unencrypted key: {exc} (SVC-50)"
        ) from None
    return ctx


def is_loopback(host: str) -> bool:
    """Whether every address ``host`` names is a loopback one (``127.0.0.0/8``, ``::1``).
    ``""`` and the wildcard addresses are every interface, so not loopback; a name that does
    not resolve is taken as not loopback (the safe answer: binding reports it, CLI-9)."""
    if not host:
        return False
    try:
        infos = socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError):
        return False
    addresses = {str(info[4][0]) for info in infos}
    return bool(addresses) and all(_loopback_address(a) for a in addresses)


def _loopback_address(text: str) -> bool:
    try:
        addr = ipaddress.ip_address(text.partition("%")[0])
    except ValueError:
        return False
    if isinstance(addr, ipaddress.IPv6Address) and addr.ipv4_mapped is not None:
        return addr.ipv4_mapped.is_loopback
    return addr.is_loopback


def check_listen(
    host: str, tokens: str | None, tls: bool, no_auth: bool, allow_plain_http: bool
) -> None:
    """The start-up checks of SVC-47 and SVC-50, run before anything is bound or opened: a
    non-loopback ``host`` needs ``--tokens`` (or ``--no-auth``), and tokens to a non-loopback
    address travel only over TLS (or with ``--allow-plain-http``). ``bad_option`` otherwise."""
    if no_auth and tokens is not None:
        raise BadOption("--no-auth and --tokens contradict each other: give one (SVC-47)")
    if is_loopback(host):
        return
    if tokens is None and not no_auth:
        raise BadOption(
            f"--host {host!r} is not a loopback address: give --tokens FILE, or --no-auth to "
            "give every right to whoever reaches it (SVC-47)"
        )
    if tokens is not None and not tls and not allow_plain_http:
        raise BadOption(
            f"--tokens over plain HTTP on --host {host!r} would send every token in clear "
            "text: give --tls-cert and --tls-key, or --allow-plain-http (SVC-50)"
        )
