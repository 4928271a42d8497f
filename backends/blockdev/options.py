"""``blockdev://`` URI options (spec URI-2, URI-3, ranges URI-6; FORMATS-blockdev BDEV-13): parsed
and checked before anything is opened, created or written."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from tidelog.backend import COMMON_OPTIONS, StoreOptions
from tidelog.errors import BadOption
from tidelog.model.ring import MAX_PAGES
from tidelog.names import check_topic_name
from tidelog.options import parse_bool, parse_choice, parse_int, parse_size, validate_options

from .format import MAX_PAGE_SIZE, META_BYTES, MIN_PAGE_SIZE

__all__ = ["BlockdevOptions", "parse_blockdev_options", "DEFAULT_PAGE_SIZE", "DEFAULT_TOPIC"]

DEFAULT_PAGE_SIZE = 4096
DEFAULT_TOPIC = "default"


@dataclass(frozen=True)
class BlockdevOptions:
    size: int | None = None  # bytes of an image to create (a device's size comes from the device)
    page_size: int | None = None  # None: the stored one, or DEFAULT_PAGE_SIZE when formatting
    topic: str | None = None  # None: the stored binding, or DEFAULT_TOPIC when formatting
    format: bool = False  # format even a device or image that holds something else
    direct: str = "auto"  # O_DIRECT: "auto" (raw block devices only), "on", "off"
    meta_every: int = 0  # also write the metadata slot every N page writes (0: never)
    readonly: bool = False  # a read-only view: no lock, nothing written (BDEV-28)


def _page_size(key: str, value: object) -> int:
    n = parse_size(key, value, minimum=MIN_PAGE_SIZE, maximum=MAX_PAGE_SIZE)
    if n % MIN_PAGE_SIZE:
        raise BadOption(
            f"option {key}={value!r}: must be a multiple of {MIN_PAGE_SIZE} "
            f"between {MIN_PAGE_SIZE} and {MAX_PAGE_SIZE} bytes"
        )
    return n


#: URI-6: the largest ring, 65534 pages (RING-2) of the largest page size after the metadata
MAX_SIZE = META_BYTES + MAX_PAGES * MAX_PAGE_SIZE

_BLOCKDEV_OPTIONS = {
    "size": lambda k, v: parse_size(k, v, minimum=META_BYTES + 2 * MIN_PAGE_SIZE, maximum=MAX_SIZE),
    "page_size": _page_size,
    "topic": lambda k, v: check_topic_name(v, f"option {k}: topic name"),
    "format": parse_bool,
    "direct": lambda k, v: _direct(k, v),
    "meta_every": lambda k, v: parse_int(k, v, minimum=0, maximum=MAX_PAGES),
    "readonly": parse_bool,
}


def _direct(key: str, value: object) -> str:
    if isinstance(value, bool):
        return "on" if value else "off"
    if isinstance(value, str) and value.strip().lower() in ("true", "1", "yes"):
        return "on"
    if isinstance(value, str) and value.strip().lower() in ("false", "0", "no"):
        return "off"
    return parse_choice(key, value, ("auto", "on", "off"))


def parse_blockdev_options(
    options: Mapping[str, object],
) -> tuple[StoreOptions, BlockdevOptions]:
    parsed = validate_options(options, {**COMMON_OPTIONS, **_BLOCKDEV_OPTIONS}, where="blockdev://")
    common = {k: parsed.pop(k) for k in list(parsed) if k in COMMON_OPTIONS}
    bopts = BlockdevOptions(**parsed)
    if bopts.readonly and bopts.format:
        raise BadOption("option format=true: a read-only view (readonly=true) never writes")
    return StoreOptions(**common), bopts
