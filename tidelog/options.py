"""Parsing and validation of option values: sizes, integers, booleans, enumerations (spec URI-3).

Values may arrive as Python objects (keyword arguments) or as strings (URI query); both go through
the same parsers so a URI and a keyword argument mean the same thing.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from .errors import BadOption

__all__ = [
    "parse_size",
    "parse_int",
    "parse_bool",
    "parse_choice",
    "OptionSpec",
    "validate_options",
]

_SIZE_RE = re.compile(r"\s*(\d+)\s*([KMGT]i?B?|B)?\s*", re.IGNORECASE)
_MULT = {"": 1, "B": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}


def parse_size(key: str, value: object, *, minimum: int = 1) -> int:
    """``4096``, ``"64KiB"``, ``"64M"``, ``"1GiB"`` -> bytes. Multiples are binary."""
    if isinstance(value, bool):
        raise BadOption(f"option {key}={value!r}: expected a size such as 4096 or 64MiB")
    if isinstance(value, int):
        n = value
    elif isinstance(value, str):
        m = _SIZE_RE.fullmatch(value)
        if not m:
            raise BadOption(f"option {key}={value!r}: expected a size such as 4096 or 64MiB")
        unit = (m.group(2) or "").upper()
        n = int(m.group(1)) * _MULT[unit[:1] if unit not in ("B", "") else unit]
    else:
        raise BadOption(f"option {key}={value!r}: expected a size such as 4096 or 64MiB")
    if n < minimum:
        raise BadOption(f"option {key}={value!r}: must be at least {minimum}")
    return n


def parse_int(
    key: str, value: object, *, minimum: int | None = None, maximum: int | None = None
) -> int:
    if isinstance(value, bool):
        raise BadOption(f"option {key}={value!r}: expected an integer")
    if isinstance(value, int):
        n = value
    elif isinstance(value, str) and re.fullmatch(r"\s*-?\d+\s*", value):
        n = int(value)
    else:
        raise BadOption(f"option {key}={value!r}: expected an integer")
    if minimum is not None and n < minimum:
        raise BadOption(f"option {key}={value!r}: must be at least {minimum}")
    if maximum is not None and n > maximum:
        raise BadOption(f"option {key}={value!r}: must be at most {maximum}")
    return n


_TRUE = {"true", "1", "on", "yes"}
_FALSE = {"false", "0", "off", "no"}


def parse_bool(key: str, value: object) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, str):
        v = value.strip().lower()
        if v in _TRUE:
            return True
        if v in _FALSE:
            return False
    raise BadOption(f"option {key}={value!r}: expected true/false (also 1/0, on/off, yes/no)")


def parse_choice(key: str, value: object, choices: Iterable[str]) -> str:
    choices = tuple(choices)
    if isinstance(value, str) and value in choices:
        return value
    raise BadOption(f"option {key}={value!r}: expected one of {', '.join(choices)}")


#: key -> parser(key, raw_value) -> parsed value
OptionSpec = Mapping[str, Callable[[str, Any], Any]]


def validate_options(
    options: Mapping[str, object], spec: OptionSpec, *, where: str
) -> dict[str, Any]:
    """Parse every option with its parser; unknown keys are BadOption naming the known ones."""
    out: dict[str, Any] = {}
    for key, raw in options.items():
        parser = spec.get(key)
        if parser is None:
            known = ", ".join(sorted(spec)) or "(none)"
            raise BadOption(f"unknown option {key!r} for {where}; known options: {known}")
        out[key] = parser(key, raw)
    return out
