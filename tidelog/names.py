"""Name rules for topics, subscribers and named memory stores (spec URI-4, SUB-1).

Names end up in file names and URIs, so they are checked before anything is created.
"""

from __future__ import annotations

import re

from .errors import BadName

__all__ = ["check_topic_name", "check_subscriber_name", "check_label"]

_TOPIC_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,199}")
_SUB_RE = re.compile(r"[A-Za-z0-9_-]{1,64}")
_WINDOWS_DEVICES = frozenset(
    ["CON", "PRN", "AUX", "NUL"]
    + [f"COM{i}" for i in range(1, 10)]
    + [f"LPT{i}" for i in range(1, 10)]
)
MAX_LABEL_BYTES = 1024


def check_topic_name(name: object, what: str = "topic name") -> str:
    """Return ``name`` if it is a valid topic (or store) name, else raise BadName."""
    if not isinstance(name, str) or not _TOPIC_RE.fullmatch(name):
        raise BadName(
            f"bad {what} {name!r}: use 1-200 ASCII letters, digits, '.', '_' or '-', "
            "starting with a letter or digit"
        )
    return name


def check_subscriber_name(name: object) -> str:
    """Return ``name`` if it is a valid subscriber name (Quiver's rule), else raise BadName."""
    if not isinstance(name, str) or not _SUB_RE.fullmatch(name):
        raise BadName(f"bad subscriber name {name!r}: use 1-64 ASCII letters, digits, '_' or '-'")
    if name.upper() in _WINDOWS_DEVICES:
        raise BadName(f"bad subscriber name {name!r}: reserved device name")
    return name


def check_label(value: object, what: str) -> str | None:
    """Validate a record tag or node (spec TOP-6): None, or a non-empty str of at most 1024
    bytes in utf-8."""
    if value is None:
        return None
    if not isinstance(value, str) or not value:
        raise BadName(f"bad {what} {value!r}: must be a non-empty string or None")
    try:
        n = len(value.encode("utf-8"))
    except UnicodeEncodeError:
        raise BadName(f"bad {what} {value!r}: not encodable as utf-8") from None
    if n > MAX_LABEL_BYTES:
        raise BadName(f"bad {what}: {n} bytes in utf-8, the limit is {MAX_LABEL_BYTES}")
    return value
