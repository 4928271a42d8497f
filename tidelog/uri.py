"""Store URIs (spec URI-1..3): ``scheme://location?key=value&...``.

``file://`` and ``blockdev://`` locations are paths: ``file:///abs/dir`` is absolute and
``file://./dir`` or ``file://dir`` are relative to the working directory (the URI's host part is
read as the start of a relative path; tidelog has no remote hosts). ``memory://NAME`` names a
process-wide store; ``memory://`` is a fresh anonymous one.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from urllib.parse import parse_qsl, quote, unquote, urlencode, urlsplit

from .errors import BadOption, BadURI

__all__ = ["URI", "parse_uri"]


@dataclass(frozen=True)
class URI:
    scheme: str
    location: str
    options: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))

    def render(self) -> str:
        query = f"?{urlencode(dict(self.options))}" if self.options else ""
        loc = self.location
        if self.scheme in ("file", "blockdev") and not loc.startswith("/"):
            loc = loc if loc.startswith(".") else "./" + loc
        return f"{self.scheme}://{quote(loc, safe='/._-~')}{query}"

    def __str__(self) -> str:
        return self.render()


def parse_uri(text: object) -> URI:
    """Split a store URI; raises BadURI for malformed ones, BadOption for repeated query keys."""
    if isinstance(text, URI):
        return text
    if not isinstance(text, str) or "://" not in text:
        raise BadURI(
            f"bad store URI {text!r}: expected scheme://location, e.g. memory:// or "
            "file:///var/lib/app/buf"
        )
    try:
        parts = urlsplit(text)
        port = parts.port
    except ValueError as exc:
        raise BadURI(f"bad store URI {text!r}: {exc}") from None
    scheme = parts.scheme.lower()
    if not scheme or not scheme.replace("+", "").replace("-", "").replace(".", "").isalnum():
        raise BadURI(f"bad store URI {text!r}: bad scheme")
    if parts.fragment:
        raise BadURI(f"bad store URI {text!r}: fragments (#...) are not allowed")
    if parts.username is not None or parts.password is not None:
        raise BadURI(f"bad store URI {text!r}: credentials are not allowed")
    if port is not None:
        raise BadURI(f"bad store URI {text!r}: ports are not allowed")
    try:
        pairs = parse_qsl(parts.query, keep_blank_values=True, strict_parsing=bool(parts.query))
    except ValueError:
        raise BadURI(f"bad store URI {text!r}: malformed query string") from None
    options: dict[str, str] = {}
    for key, value in pairs:
        if key in options:
            raise BadOption(f"option {key!r} given twice in {text!r}")
        options[key] = value
    location = unquote(parts.netloc + parts.path)
    return URI(scheme, location, MappingProxyType(options))
