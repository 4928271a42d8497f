"""The limits of ``tidelog serve`` (spec/SERVICE.md SVC-51): one frozen record of the options,
their defaults and ranges, shown by ``GET /v0`` (``to_dict``). The app enforces them."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from tidelog.errors import BadOption
from tidelog.options import MAX_WAIT_MS, parse_int, parse_size

__all__ = ["Limits"]

_KIB = 1 << 10
_MIB = 1 << 20
_GIB = 1 << 30


def _limit(default: int, low: int, high: int, help: str, size: bool = False) -> Any:
    return field(default=default, metadata={"range": (low, high), "help": help, "size": size})


@dataclass(frozen=True)
class Limits:
    """SVC-51: each field is the option ``--<name with dashes>``; sizes also take ``16MiB``."""

    max_request_bytes: int = _limit(
        16 * _MIB, _KIB, _GIB, "Largest request body; larger: 413 too_large.", size=True
    )
    max_batch: int = _limit(10_000, 1, 1_000_000, "Most records in one batch; more: 413.")
    max_header_bytes: int = _limit(
        16 * _KIB, _KIB, _MIB, "Largest request line and headers; larger: 431.", size=True
    )
    request_timeout_ms: int = _limit(
        30_000, 100, MAX_WAIT_MS, "Time to receive a request's body; then 408 and close."
    )
    keepalive_timeout_ms: int = _limit(
        60_000, 1, MAX_WAIT_MS, "An idle keep-alive connection is closed after this."
    )
    max_http_connections: int = _limit(
        1024, 1, 1_000_000, "Open HTTP connections; more: 503 busy, then close."
    )
    max_streams: int = _limit(4096, 0, 1_000_000, "SSE streams in all; more: 503 busy.")
    max_streams_per_token: int = _limit(
        256, 0, 1_000_000, "SSE streams of one token; more: 503 busy."
    )
    max_wait_ms: int = _limit(
        30_000, 0, MAX_WAIT_MS, "Longest wait of a read, poll or changes request."
    )
    max_staged_bytes: int = _limit(
        4 * _GIB, _MIB, 1 << 40, "Chunks staged by all writes; more: 507 store_full.", size=True
    )
    staged_ttl_ms: int = _limit(
        3_600_000, 1000, 7 * 86_400_000, "A staged write idle this long is deleted."
    )

    @classmethod
    def from_options(cls, **options: object) -> Limits:
        """The limits the given options set (the rest keep their defaults): integers, or
        strings as the command line gives them, None for the default; out of range or unknown
        is ``bad_option``."""
        fields = {f.name: f for f in dataclasses.fields(cls)}
        values: dict[str, int] = {}
        for name, value in options.items():
            if value is None:  # an option not given: its default
                continue
            f = fields.get(name)
            if f is None:
                raise BadOption(
                    f"option {name!r}: not a limit of tidelog serve (known: {', '.join(fields)}) "
                    "(SVC-51)"
                )
            low, high = f.metadata["range"]
            parse = parse_size if f.metadata["size"] else parse_int
            values[name] = parse(name, value, minimum=low, maximum=high)
        return cls(**values)

    @staticmethod
    def options() -> list[tuple[str, str, int, str]]:
        """``(option, field name, default, help)`` for each limit, for the command line."""
        defaults = Limits()
        return [
            ("--" + f.name.replace("_", "-"), f.name, getattr(defaults, f.name), f.metadata["help"])
            for f in dataclasses.fields(Limits)
        ]

    def to_dict(self) -> dict[str, int]:
        """The ``limits`` object of ``GET /v0``: every limit by its field name."""
        return dataclasses.asdict(self)
