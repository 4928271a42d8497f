"""The tidelog exception hierarchy (spec ERR-1).

Every error carries a stable ``.code``; codes are API. Classes also inherit a builtin where one
fits, so ``except ValueError`` or ``except LookupError`` keep working for callers who do not know
tidelog's types (the zarr/SQLAlchemy habit).
"""

from __future__ import annotations

__all__ = [
    "TidelogError",
    "BadURI",
    "BadOption",
    "BadName",
    "BadArgument",
    "UnknownScheme",
    "NotAvailable",
    "NoSuchTopic",
    "NoSuchSubscriber",
    "ConfigMismatch",
    "RouterFanIn",
    "TopicFull",
    "TooLarge",
    "StoreFull",
    "Backpressure",
    "LeaseLost",
    "Closed",
    "ReadOnly",
    "Locked",
    "Corrupt",
    "StorageError",
    "ERROR_CODES",
]


class TidelogError(Exception):
    """Root of every tidelog error. ``code`` is a stable machine-readable string."""

    code: str = "error"

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.message!r})"


class BadURI(TidelogError, ValueError):
    code = "bad_uri"


class BadOption(TidelogError, ValueError):
    code = "bad_option"


class BadName(TidelogError, ValueError):
    code = "bad_name"


class BadArgument(TidelogError, ValueError):
    code = "bad_argument"


class UnknownScheme(TidelogError, ValueError):
    code = "unknown_scheme"


class NotAvailable(TidelogError):
    code = "not_available"


class NoSuchTopic(TidelogError, LookupError):
    code = "no_such_topic"


class NoSuchSubscriber(TidelogError, LookupError):
    code = "no_such_subscriber"


class ConfigMismatch(TidelogError, ValueError):
    code = "config_mismatch"


class RouterFanIn(ConfigMismatch):
    """RTR-9: a router into a dest that another source already feeds."""

    code = "router_dest_fan_in"


class TopicFull(TidelogError):
    code = "topic_full"


class TooLarge(TidelogError, ValueError):
    code = "too_large"


class StoreFull(TidelogError):
    code = "store_full"


class Backpressure(TidelogError):
    code = "backpressure"


class LeaseLost(TidelogError):
    code = "lease_lost"


class Closed(TidelogError):
    code = "closed"


class ReadOnly(TidelogError):
    code = "read_only"


class Locked(TidelogError):
    code = "locked"


class Corrupt(TidelogError):
    code = "corrupt"


class StorageError(TidelogError, OSError):
    code = "io_error"


def _all_codes() -> dict[str, type[TidelogError]]:
    out: dict[str, type[TidelogError]] = {}
    for name in __all__:
        obj = globals().get(name)
        if isinstance(obj, type) and issubclass(obj, TidelogError) and obj is not TidelogError:
            out[obj.code] = obj
    return out


#: code -> exception class, for drivers that carry errors across a process boundary.
ERROR_CODES: dict[str, type[TidelogError]] = _all_codes()
