"""Topic configuration (spec RET, DUR, QUE, SUB-5/6, TOP-9; ranges URI-6).

A TopicConfig is immutable once the topic exists. ``TopicConfig.from_options`` validates user
input; ``check_matches`` implements the create-or-verify rule of TOP-9.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from .errors import BadOption, ConfigMismatch
from .names import check_topic_name
from .options import MAX_DURATION_MS, MAX_WAIT_MS, parse_choice, parse_int, parse_size

__all__ = ["TopicConfig", "DURABILITY_CLASSES", "PAYLOAD_KINDS"]

DURABILITY_CLASSES = ("ephemeral", "memory", "disk", "fsync")
#: "bundles": every payload is an Arrow RecordBundle (spec/BUNDLES.md BND-9)
PAYLOAD_KINDS = ("bytes", "bundles")


def _opt_int(key: str, value: object) -> int | None:
    return None if value is None else parse_int(key, value, minimum=1)


def _opt_duration(key: str, value: object) -> int | None:
    return None if value is None else parse_int(key, value, minimum=1, maximum=MAX_DURATION_MS)


def _opt_size(key: str, value: object) -> int | None:
    return None if value is None else parse_size(key, value)


def _opt_topic(key: str, value: object) -> str | None:
    return None if value is None else check_topic_name(value, f"{key} topic name")


_PARSERS: dict[str, Any] = {
    "durability": lambda k, v: parse_choice(k, v, DURABILITY_CLASSES),
    "cap_records": _opt_int,
    "cap_bytes": _opt_size,
    "ttl_ms": _opt_duration,
    "discard": lambda k, v: parse_choice(k, v, ("old", "reject")),
    "retention": lambda k, v: parse_choice(k, v, ("backpressure", "drop_oldest")),
    "trim": lambda k, v: parse_choice(k, v, ("acked", "none")),
    "lease_ms": lambda k, v: parse_int(k, v, minimum=1, maximum=MAX_DURATION_MS),
    "max_deliveries": _opt_int,
    "dead_letter": _opt_topic,
    "backpressure_wait_ms": lambda k, v: parse_int(k, v, minimum=0, maximum=MAX_WAIT_MS),
    "payload": lambda k, v: parse_choice(k, v, PAYLOAD_KINDS),
}


@dataclass(frozen=True)
class TopicConfig:
    durability: str = "fsync"
    cap_records: int | None = None
    cap_bytes: int | None = None
    ttl_ms: int | None = None
    discard: str = "old"
    retention: str = "backpressure"
    trim: str = "acked"
    lease_ms: int = 30_000
    max_deliveries: int | None = None
    dead_letter: str | None = None
    backpressure_wait_ms: int = 0
    payload: str = "bytes"

    @classmethod
    def keys(cls) -> tuple[str, ...]:
        return tuple(f.name for f in dataclasses.fields(cls))

    @classmethod
    def parse(cls, options: Mapping[str, object]) -> dict[str, Any]:
        """Validate user-supplied keys; returns the parsed subset (unknown key -> BadOption)."""
        out: dict[str, Any] = {}
        for key, raw in options.items():
            parser = _PARSERS.get(key)
            if parser is None:
                raise BadOption(
                    f"unknown topic option {key!r}; known options: {', '.join(cls.keys())}"
                )
            out[key] = parser(key, raw)
        return out

    @classmethod
    def from_options(cls, name: str, options: Mapping[str, object]) -> TopicConfig:
        cfg = cls(**cls.parse(options))
        if cfg.max_deliveries is not None and cfg.dead_letter is None:
            raise BadOption(f"topic {name!r}: max_deliveries needs dead_letter=<topic> (QUE-7)")
        if cfg.dead_letter == name:
            raise BadOption(f"topic {name!r}: dead_letter cannot be the topic itself")
        return cfg

    def check_matches(self, name: str, options: Mapping[str, object]) -> None:
        """TOP-9: every key passed for an existing topic must equal the stored value."""
        for key, value in self.parse(options).items():
            if getattr(self, key) != value:
                raise ConfigMismatch(
                    f"topic {name!r} exists with {key}={getattr(self, key)!r}; "
                    f"got {key}={value!r} (config is fixed at creation)"
                )

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)
