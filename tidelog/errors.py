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
    "Unauthorized",
    "Forbidden",
    "NotFound",
    "MethodNotAllowed",
    "RequestTimeout",
    "UnsupportedMediaType",
    "HeadersTooLarge",
    "Throttled",
    "Busy",
    "Internal",
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


# -- raised by the service (spec/SERVICE.md SVC-10) and, over HTTP, by the remote backend ------


class Unauthorized(TidelogError, PermissionError):
    code = "unauthorized"


class Forbidden(TidelogError, PermissionError):
    code = "forbidden"


class NotFound(TidelogError, LookupError):
    """No such path in the service's API (not a topic or subscriber: those have their own)."""

    code = "not_found"


class MethodNotAllowed(TidelogError):
    code = "method_not_allowed"


class RequestTimeout(TidelogError):
    code = "request_timeout"


class UnsupportedMediaType(TidelogError, ValueError):
    code = "unsupported_media_type"


class HeadersTooLarge(TidelogError, ValueError):
    code = "headers_too_large"


class _RetryLater(TidelogError):
    """A refusal that says when to try again (SVC-10's ``Retry-After``)."""

    def __init__(self, message: str, retry_after_ms: int = 1000) -> None:
        super().__init__(message)
        self.retry_after_ms = retry_after_ms


class Throttled(_RetryLater):
    """SVC-44: the service refused an append under saturation; nothing was stored."""

    code = "throttled"


class Busy(_RetryLater):
    code = "busy"


class Internal(TidelogError):
    """The service failed on a bug of its own: its log has the trace."""

    code = "internal"


def _all_codes() -> dict[str, type[TidelogError]]:
    out: dict[str, type[TidelogError]] = {}
    for name in __all__:
        obj = globals().get(name)
        if isinstance(obj, type) and issubclass(obj, TidelogError) and obj is not TidelogError:
            out[obj.code] = obj
    return out


#: code -> exception class, for drivers that carry errors across a process boundary.
ERROR_CODES: dict[str, type[TidelogError]] = _all_codes()
