"""Parsing and validation of option values: sizes, integers, booleans, enumerations (spec URI-3)
and their ranges (URI-6).

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
    "format_size",
    "OptionSpec",
    "validate_options",
    "MAX_COUNT",
    "MAX_DURATION_MS",
    "MAX_WAIT_MS",
]

#: URI-6: a count or cap fits a signed 64-bit field everywhere
MAX_COUNT = (1 << 63) - 1
#: URI-6: a duration added to a ms timestamp still fits a signed 64-bit field
MAX_DURATION_MS = 1 << 62
#: URI-6: a timeout a thread sleeps on
MAX_WAIT_MS = 3_600_000

# URI-3: ASCII digits only (\d would take any Unicode digit), binary units; "KB"/"MB"/... are
# matched here only to be refused with a clear message.
_SIZE_RE = re.compile(r"\s*([0-9]+)\s*(?:([KMGT])(i?B)?|(B))?\s*", re.IGNORECASE | re.ASCII)
_INT_RE = re.compile(r"\s*-?[0-9]+\s*", re.ASCII)
_MULT = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}
_SIZE_HINT = "a size such as 4096, 64KiB or 64MiB (binary units: K/KiB, M/MiB, G/GiB, T/TiB)"


def format_size(n: int) -> str:
    """``n`` bytes as the largest exact binary unit: 1073741824 -> ``1GiB``, 4095 -> ``4095``."""
    for unit, mult in (("TiB", 1 << 40), ("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= mult and n % mult == 0:
            return f"{n // mult}{unit}"
    return str(n)


def _check_range(key: str, value: object, n: int, lo: int | None, hi: int, show: Any) -> int:
    below = lo is not None and n < lo
    if below or n > hi:
        bound = f"at least {show(lo)}" if below else f"at most {show(hi)}"
        span = f"{show(lo)} to {show(hi)}" if lo is not None else f"up to {show(hi)}"
        raise BadOption(f"option {key}={value!r}: must be {bound} (range {span}, URI-6)")
    return n


def parse_size(key: str, value: object, *, minimum: int = 1, maximum: int = MAX_COUNT) -> int:
    """``4096``, ``"64KiB"``, ``"64M"``, ``"1GiB"`` -> bytes, within ``[minimum, maximum]``.
    Multiples are binary; ``KB``/``MB``/``GB``/``TB`` are refused as ambiguous (URI-3)."""
    if isinstance(value, bool):
        raise BadOption(f"option {key}={value!r}: expected {_SIZE_HINT}")
    if isinstance(value, int):
        n = value
    elif isinstance(value, str):
        m = _SIZE_RE.fullmatch(value)
        if not m:
            raise BadOption(f"option {key}={value!r}: expected {_SIZE_HINT}")
        digits, prefix, suffix = m.group(1), (m.group(2) or "").upper(), m.group(3) or ""
        if suffix.upper() == "B":  # "64MB": decimal to many readers, binary to others
            raise BadOption(
                f"option {key}={value!r}: {prefix}B is ambiguous; write {digits}{prefix}iB "
                f"({int(digits) * _MULT[prefix]} bytes) or the number of bytes (URI-3)"
            )
        n = int(digits) * _MULT.get(prefix, 1)
    else:
        raise BadOption(f"option {key}={value!r}: expected {_SIZE_HINT}")
    return _check_range(key, value, n, minimum, maximum, format_size)


def parse_int(
    key: str, value: object, *, minimum: int | None = None, maximum: int = MAX_COUNT
) -> int:
    """An integer within ``[minimum, maximum]`` (URI-3: ASCII digits, optional ``-``)."""
    if isinstance(value, bool):
        raise BadOption(f"option {key}={value!r}: expected an integer")
    if isinstance(value, int):
        n = value
    elif isinstance(value, str) and _INT_RE.fullmatch(value):
        n = int(value)
    else:
        raise BadOption(f"option {key}={value!r}: expected an integer (ASCII digits)")
    return _check_range(key, value, n, minimum, maximum, str)


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
        if parser is None and key == "instances":
            raise BadOption(
                f"option instances={raw!r}: several writer instances are a file:// option; "
                f"{where} has one writer by construction (INST-11)"
            )
        if parser is None:
            known = ", ".join(sorted(spec)) or "(none)"
            raise BadOption(f"unknown option {key!r} for {where}; known options: {known}")
        out[key] = parser(key, raw)
    return out
