"""Store URIs (spec URI-1..3): ``scheme://location?key=value&...``.

``file://``, ``blockdev://`` and ``sf://`` locations are paths (their registry descriptors say
so, REG-2): ``file:///abs/dir`` is absolute and ``file://./dir`` or ``file://dir`` are relative
to the working directory (the URI's host part is read as the start of a relative path).
``memory://NAME`` names a process-wide store; ``memory://`` is a fresh anonymous one. The
locations of ``http://`` and ``https://`` are network addresses (``host[:port][/base]``, the
remote backend, SERVICE.md SVC-58): the only ones that may carry a port. ``store_path`` checks
a path (URI-7): no ``.``/``..`` segments, no ``~``, no control characters.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from urllib.parse import SplitResult, parse_qsl, quote, unquote, urlencode, urlsplit, urlunsplit

from . import registry
from .errors import BadOption, BadURI

__all__ = ["URI", "parse_uri", "store_path", "redact_url", "redact_text", "COLD_PREFIX"]

#: ``cold+URL``: the cold tier at TIER-1's ``URL`` alone, a read-only store (TIER-12)
COLD_PREFIX = "cold+"


@dataclass(frozen=True)
class URI:
    scheme: str
    location: str
    options: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))

    def render(self) -> str:
        if self.scheme.startswith(COLD_PREFIX):  # TIER-12, TIER-13: as written, redacted
            query = f"?{urlencode(dict(self.options))}" if self.options else ""
            return redact_url(f"{self.scheme}://{self.location}{query}")
        # a secret given in the query is never echoed (reprs, logs, errors): SVC-58
        shown = {
            k: "***" if k in SECRET_OPTIONS else redact_url(v) if k in URL_OPTIONS else v
            for k, v in dict(self.options).items()
        }
        query = f"?{urlencode(shown)}" if self.options else ""
        loc = self.location
        if _is_address(self.scheme):  # host:port as given ("[::1]:9000/base")
            return f"{self.scheme}://{quote(loc, safe='/._-~:[]')}{query}"
        if not loc.startswith("/") and _dot_relative(self.scheme):
            loc = loc if loc.startswith(".") else "./" + loc
        return f"{self.scheme}://{quote(loc, safe='/._-~')}{query}"

    def __str__(self) -> str:
        return self.render()


#: options whose value is a secret: ``render`` shows them as ``***``
SECRET_OPTIONS = frozenset({"token"})
#: options whose value is a URL that may carry credentials: ``render`` redacts them (TIER-13)
URL_OPTIONS = frozenset({"cold"})


def _dot_relative(scheme: str) -> bool:
    """Whether a relative path location of ``scheme`` is rendered with a leading ``./``: its
    descriptor says (REG-2)."""
    described = registry.find(scheme)
    return described is not None and described.dot_relative


def _is_address(scheme: str) -> bool:
    """Whether ``scheme``'s location is a network address that may carry a port (REG-2)."""
    described = registry.find(scheme)
    return described is not None and described.location == "address"


def parse_uri(text: object) -> URI:
    """Split a store URI; raises BadURI for malformed ones, BadOption for repeated query keys."""
    if isinstance(text, URI):
        return text
    if not isinstance(text, str) or "://" not in text:
        raise BadURI(
            f"bad store URI {text!r}: expected scheme://location, e.g. memory:// or "
            "file:///var/lib/app/buf"
        )
    cold = text[: len(COLD_PREFIX)].lower() == COLD_PREFIX
    shown = redact_url(text)  # a (cold) URL's secrets are never echoed (TIER-13)
    try:
        parts = urlsplit(text)
        port = parts.port
    except ValueError as exc:
        raise BadURI(f"bad store URI {shown!r}: {exc}") from None
    scheme = parts.scheme.lower()
    if not scheme or not scheme.replace("+", "").replace("-", "").replace(".", "").isalnum():
        raise BadURI(f"bad store URI {shown!r}: bad scheme")
    if parts.fragment:
        raise BadURI(f"bad store URI {shown!r}: fragments (#...) are not allowed")
    if cold:  # TIER-1's URL as written (its credentials, port, percent-escapes): TIER-12
        return URI(scheme, parts.netloc + parts.path, MappingProxyType(_query(parts, shown)))
    if parts.username is not None or parts.password is not None:
        raise BadURI(f"bad store URI {shown!r}: credentials are not allowed")
    if port is not None and not _is_address(scheme):
        raise BadURI(f"bad store URI {shown!r}: ports are not allowed")
    options = _query(parts, shown)
    try:
        location = unquote(parts.netloc + parts.path, errors="strict")
    except UnicodeDecodeError:
        raise BadURI(f"bad store URI {shown!r}: a percent-escape is not UTF-8") from None
    return URI(scheme, location, MappingProxyType(options))


def _query(parts: SplitResult, shown: str) -> dict[str, str]:
    try:
        pairs = parse_qsl(parts.query, keep_blank_values=True, strict_parsing=bool(parts.query))
    except ValueError:
        raise BadURI(f"bad store URI {shown!r}: malformed query string") from None
    options: dict[str, str] = {}
    for key, value in pairs:
        if key in options:
            raise BadOption(f"option {key!r} given twice in {shown!r}")
        options[key] = value
    return options


def redact_url(url: str) -> str:
    """``url`` as it may be shown (TIER-13): the password of its userinfo
    (``s3://key:secret@bucket/...``) and the secrets of its query (access keys, tokens) as
    ``***``. Every message, log line, ``inspect`` output and repr naming a cold URL shows it
    through this (and a message quoting it, such as pyarrow's, through ``redact_text``)."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return redact_text(url, url)
    netloc = parts.netloc
    if "@" in netloc:
        userinfo, host = netloc.rsplit("@", 1)
        user, colon, _secret = userinfo.partition(":")
        netloc = f"{user}:***@{host}" if colon else f"{userinfo}@{host}"
    query = parts.query
    if query:
        pairs = [  # a value that is a URL itself (``file://...?cold=s3://...``): redacted too
            (k, "***" if _secret_key(k) else redact_url(v) if "://" in v else v)
            for k, v in parse_qsl(query, keep_blank_values=True)
        ]
        query = urlencode(pairs, safe="*:/@")
    if netloc == parts.netloc and query == parts.query:
        return url
    return urlunsplit(parts._replace(netloc=netloc, query=query))


def redact_text(text: str, url: str) -> str:
    """``text`` (an error message of a library that was handed ``url``) with every secret of
    ``url`` replaced by ``***`` (TIER-13): as written, percent-encoded and decoded."""
    for secret in _secrets(url):
        for form in {secret, unquote(secret), quote(unquote(secret), safe="")}:
            if len(form) >= 3:  # a shorter one would mangle the message, and is no secret
                text = text.replace(form, "***")
    return text


def _secrets(url: str) -> list[str]:
    out = []
    head = url.split("?", 1)[0]
    if "://" in head:
        netloc = head.split("://", 1)[1].split("/", 1)[0]
        if "@" in netloc:
            userinfo = netloc.rsplit("@", 1)[0]
            if ":" in userinfo:
                out.append(userinfo.split(":", 1)[1])
    if "?" in url:
        for pair in url.split("?", 1)[1].split("&"):
            key, _, value = pair.partition("=")
            if _secret_key(unquote(key)) and value:
                out.append(value)
    return out


#: query keys holding a secret contain one of these (``secret_key``, ``session_token``, ...)
_SECRET_WORDS = ("secret", "key", "token", "password", "credential", "signature")


def _secret_key(key: str) -> bool:
    return any(s in key.lower() for s in _SECRET_WORDS)


_PATH_MAX = 4095  # bytes of a path, and of one segment (below): Linux's PATH_MAX and NAME_MAX
_NAME_MAX = 255


def store_path(uri: URI, example: str) -> str:
    """The absolute path a ``file://``, ``sf://`` or ``blockdev://`` location names, or BadURI
    (URI-7). The location is used as spelled: ``..`` is never resolved and ``~`` never expanded,
    so a path cannot name a directory other than the one it reads as. ``example`` is a URI to
    show in the message."""
    loc = uri.location

    def bad(why: str) -> BadURI:
        return BadURI(f"bad {uri.scheme}:// path {loc!r}: {why} (URI-7; e.g. {example})")

    if not loc:
        raise bad("empty path")
    if any(ord(c) < 32 or ord(c) == 127 for c in loc):
        raise bad("control characters (NUL included) are not allowed")
    try:
        size = len(loc.encode("utf-8"))
    except UnicodeEncodeError:
        raise bad("not encodable as UTF-8") from None
    segments = loc.split("/")
    if size > _PATH_MAX or any(len(s.encode("utf-8")) > _NAME_MAX for s in segments):
        raise bad(f"longer than {_PATH_MAX} bytes, or a segment longer than {_NAME_MAX}")
    if segments[0].startswith("~"):
        raise bad("'~' is not expanded; write the absolute path")
    # one leading "." marks a relative path (file://./dir); any other dot segment is refused
    rest = segments[1:] if segments[0] == "." else segments
    if any(s in (".", "..") for s in rest):
        raise bad("'.' and '..' segments (also written %2e) are not allowed")
    return os.path.abspath(loc)
