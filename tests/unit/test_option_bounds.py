"""Option values: their syntax (spec URI-3) and their ranges (URI-6), checked for every option of
every backend before anything is created (URI-2); and a property: any option values and any
path-based URI either open a store or raise a typed error, leaving nothing behind when refused.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import event, given, settings
from hypothesis import strategies as st
from tree_listing import listing

import tidelog
from tidelog.backend import COMMON_OPTIONS
from tidelog.backends.blockdev.options import _BLOCKDEV_OPTIONS
from tidelog.backends.file.options import _FILE_OPTIONS
from tidelog.backends.sf.backend import _OPTIONS as SF_OPTIONS
from tidelog.config import _PARSERS as TOPIC_OPTIONS
from tidelog.errors import TidelogError
from tidelog.options import parse_int, parse_size

TABLES: dict[str, dict[str, Callable[[str, Any], Any]]] = {
    "common": COMMON_OPTIONS,
    "file": _FILE_OPTIONS,
    "blockdev": _BLOCKDEV_OPTIONS,
    "sf": SF_OPTIONS,
    "topic": TOPIC_OPTIONS,
}
# names, not numbers (URI-4); a cold tier's URL (TIERING.md TIER-1)
NAMES = {("blockdev", "topic"), ("topic", "dead_letter"), ("file", "cold")}
EVERY_OPTION = [(t, k) for t, table in TABLES.items() for k in table if (t, k) not in NAMES]

# spec/SPEC.md URI-6, row by row: (table, key, largest accepted, smallest refused above it)
G = 1 << 30
RANGES = [
    ("common", "max_record_bytes", G, G + 1),
    ("common", "max_bytes", (1 << 63) - 1, 1 << 63),
    ("file", "wal_shards", 64, 65),
    ("file", "wal_file_bytes", G, G + 1),
    ("file", "wal_recycle", 64, 65),
    ("file", "commit_interval_ms", 60_000, 60_001),
    ("file", "head_reserve", 1 << 32, (1 << 32) + 1),
    ("file", "checkpoint_bytes", 64 * G, 64 * G + 1),
    ("file", "seal_worker_bytes", 64 * G, 64 * G + 1),
    ("file", "write_out_bytes", G, G + 1),
    ("file", "segment_max_records", (1 << 32) - 1, 1 << 32),
    ("file", "segment_max_bytes", (1 << 32) - 1, 1 << 32),
    ("file", "progress_flush_ms", 3_600_000, 3_600_001),
    ("file", "hot_retain_segments", (1 << 63) - 1, 1 << 63),
    ("file", "hot_retain_bytes", (1 << 63) - 1, 1 << 63),
    ("file", "cold_grace_ms", 1 << 62, (1 << 62) + 1),
    ("file", "cold_cache_segments", 1024, 1025),
    ("blockdev", "size", 4096 + 65534 * (16 << 20), 4096 + 65534 * (16 << 20) + 1),
    ("blockdev", "page_size", 16 << 20, (16 << 20) + 512),
    ("blockdev", "meta_every", 65534, 65535),
    ("sf", "sf_max_bytes", G, G + 1),
    ("sf", "sf_max_total_bytes", (1 << 63) - 1, 1 << 63),
    ("sf", "sf_append_deadline_millis", 3_600_000, 3_600_001),
    ("topic", "cap_records", (1 << 63) - 1, 1 << 63),
    ("topic", "cap_bytes", (1 << 63) - 1, 1 << 63),
    ("topic", "max_deliveries", (1 << 63) - 1, 1 << 63),
    ("topic", "ttl_ms", 1 << 62, (1 << 62) + 1),
    ("topic", "lease_ms", 1 << 62, (1 << 62) + 1),
    ("topic", "backpressure_wait_ms", 3_600_000, 3_600_001),
]


def _spec_rows() -> set[str]:
    """The option names in the first column of the URI-6 table of spec/SPEC.md."""
    text = (Path(__file__).resolve().parents[2] / "spec" / "SPEC.md").read_text()
    table = text[text.index("**URI-6**") : text.index("**URI-7**")]
    rows = [line.split("|")[1] for line in table.splitlines() if line.startswith("| `")]
    return {name.strip(" `") for row in rows for name in row.split(",")}


URI_6_SPEC_ROWS = _spec_rows()


@pytest.mark.parametrize(("table", "key"), EVERY_OPTION)
@pytest.mark.parametrize("huge", [1 << 64, str(1 << 64), "99999999999999999999999TiB"])
def test_URI_6_every_option_of_every_backend_is_bounded(table: str, key: str, huge: Any) -> None:
    """URI-6: no option of any backend (or topic) accepts an unbounded number: before, sizes
    and counts had no upper bound (wal_file_bytes=1TiB preallocated a terabyte)."""
    with pytest.raises(tidelog.BadOption, match=key):
        TABLES[table][key](key, huge)


@pytest.mark.parametrize(("table", "key", "top", "over"), RANGES)
def test_URI_6_the_ranges_are_those_of_the_spec(table: str, key: str, top: int, over: int) -> None:
    """URI-6, ERR-3: each option's largest value is accepted, the next one is bad_option whose
    message names the key, the value and the range."""
    parse = TABLES[table][key]
    assert parse(key, top) == top
    assert parse(key, str(top)) == top
    with pytest.raises(tidelog.BadOption, match=rf"{key}=.*must be at most.*range .* URI-6"):
        parse(key, over)
    assert key in URI_6_SPEC_ROWS


def test_URI_6_the_spec_table_lists_every_numeric_option() -> None:
    """URI-6: the spec's table of bounds names every numeric option the code bounds."""
    numeric = {
        k
        for t, k in EVERY_OPTION
        if k
        not in ("prealloc", "create", "background", "readonly", "mmap", "format", "direct")
        and k != "seal_worker"
        and k not in ("durability", "discard", "retention", "trim", "payload", "sf_durability")
    }
    assert numeric <= URI_6_SPEC_ROWS


@pytest.mark.parametrize(
    "query",
    [
        f"wal_file_bytes={1 << 70}",  # before: OverflowError from the preallocation, files left
        "wal_file_bytes=1TiB&prealloc=none",  # before: accepted (with prealloc: the whole disk)
        f"head_reserve={1 << 70}",  # before: opened, then every append failed
        f"progress_flush_ms={10**20}",  # before: the maintenance thread died silently
        f"segment_max_records={1 << 70}",
        f"max_record_bytes={1 << 70}",
    ],
)
def test_URI_6_out_of_range_values_are_refused_before_anything_is_created(
    tmp_path: Path, query: str
) -> None:
    """URI-6, URI-2: a value out of range is bad_option at open, and no file or directory
    was created (the listing of the parent is unchanged)."""
    with pytest.raises(tidelog.BadOption, match="URI-6") as exc:
        tidelog.open(f"file://{tmp_path}/s?{query}")
    assert exc.value.code == "bad_option"
    assert listing(tmp_path) == []


def test_URI_6_sf_sizes_are_bad_option_before_anything_is_created(tmp_path: Path) -> None:
    """URI-6, ERR-1: sf_max_bytes below a header and a frame, and sf_max_total_bytes below two
    segments, are bad_option (before: bad_argument from the slot, after its directory existed)."""
    for query, match in [
        ("sf_max_bytes=1", "sf_max_bytes='1': must be at least 33"),
        ("sf_max_bytes=1KiB&sf_max_total_bytes=1KiB", "sf_max_total_bytes='1KiB'.*at least 2KiB"),
        ("sf_max_bytes=1KiB&max_bytes=1500", "max_bytes='1500'.*at least 2KiB"),
        ("sf_max_bytes=2GiB", "must be at most 1GiB"),
        (f"sf_append_deadline_millis={10**20}", "at most 3600000"),
    ]:
        with pytest.raises(tidelog.BadOption, match=match) as exc:
            tidelog.open(f"sf://{tmp_path}/sf/a?{query}")
        assert exc.value.code == "bad_option"
    assert listing(tmp_path) == []


def test_URI_6_a_new_blockdev_image_too_small_for_its_pages_is_refused_first(
    tmp_path: Path,
) -> None:
    """URI-6, URI-2, BDEV-12: size and page_size that cannot hold a ring are bad_option before
    the image is created (before: a ring.img.tmp was left behind)."""
    for query in ("size=5KiB", "size=64KiB&page_size=16MiB"):
        with pytest.raises(tidelog.BadOption, match="too small"):
            tidelog.open(f"blockdev://{tmp_path}/ring.img?{query}")
    assert listing(tmp_path) == []


def test_URI_6_topic_options_are_bounded() -> None:
    """URI-6: topic durations and waits are bounded too (a huge backpressure_wait_ms would
    overflow the wait; ttl_ms and lease_ms are added to ms timestamps)."""
    with tidelog.open("memory://") as store:
        for key, value in [
            ("backpressure_wait_ms", 3_600_001),
            ("ttl_ms", (1 << 62) + 1),
            ("lease_ms", 1 << 63),
            ("cap_records", 1 << 63),
        ]:
            with pytest.raises(tidelog.BadOption, match=key):
                store.topic("t", **{key: value})
        assert store.topics() == []


# -- URI-3: value syntax -------------------------------------------------------------------------


def test_URI_3_numbers_are_ascii_digits() -> None:
    """URI-3: Unicode digits are refused (before: wal_file_bytes=１２MiB was 12 MiB)."""
    for bad in ("１２MiB", "١٢", "12\u0663", "²", "1_000", "+5", "0x10", "1e3", "1.5"):
        with pytest.raises(tidelog.BadOption):
            parse_size("k", bad)
    for bad in ("１２", "٣", "1_000", "0x10", "1e3"):
        with pytest.raises(tidelog.BadOption, match="ASCII digits"):
            parse_int("k", bad)
    assert parse_int("k", " -12 ") == -12


@pytest.mark.parametrize("value", ["64MB", "64mb", "1GB", "4kB", "1TB", "64 MB"])
def test_URI_3_decimal_looking_units_are_refused(value: str) -> None:
    """URI-3, ERR-3: 64MB is refused as ambiguous, naming the binary spelling (before: it meant
    64 MiB without a word)."""
    with pytest.raises(tidelog.BadOption, match=r"ambiguous; write \d+[KMGT]iB"):
        parse_size("wal_file_bytes", value)


def test_URI_3_units_are_binary() -> None:
    """URI-3: K/KiB, M/MiB, G/GiB, T/TiB in any case are powers of 1024; B is bytes."""
    for text, want in [
        ("4096", 4096),
        ("7B", 7),
        ("64K", 64 << 10),
        ("64KiB", 64 << 10),
        ("64kib", 64 << 10),
        (" 2 M ", 2 << 20),
        ("1GiB", 1 << 30),
        ("1t", 1 << 40),
    ]:
        assert parse_size("k", text) == want


# -- the property --------------------------------------------------------------------------------

_KEYS = {
    "file": sorted({*COMMON_OPTIONS, *_FILE_OPTIONS}),
    "sf": sorted(SF_OPTIONS),
    "blockdev": sorted({*COMMON_OPTIONS, *_BLOCKDEV_OPTIONS}),
}
_WORDS = [
    "true", "false", "nonempty", "none", "zero", "fallocate", "auto", "on", "off", "append",
    "flush", "memory", "64KiB", "1MiB", "4K", "64MB", "１２", "-1", "", " ", "t", "9" * 25,
]  # fmt: skip
_VALUES = st.one_of(
    st.integers(min_value=-(1 << 70), max_value=1 << 70),
    st.integers(min_value=0, max_value=1 << 21),
    st.booleans(),
    st.sampled_from(_WORDS),
    st.builds(
        "{}{}".format,
        st.integers(0, 1 << 12),
        st.sampled_from(["", "B", "K", "KiB", "M", "MiB", "G", "T", "MB", "kb", "Ki", "X"]),
    ),
    st.text(max_size=6),
)
#: values each key accepts, extremes included, so that many cases open (and append)
_GOOD: dict[str, list[object]] = {
    "max_record_bytes": ["1MiB", 1, "1GiB"],
    "max_bytes": ["1GiB", (1 << 63) - 1],
    "wal_shards": [1, "3", 64],
    "wal_file_bytes": ["64KiB", "1GiB"],
    "wal_recycle": [0, 64],
    "prealloc": ["none"],
    "commit_interval_ms": [1, 60_000],
    "head_reserve": [1, 1 << 32],
    "checkpoint_bytes": ["4KiB", "64GiB"],
    "seal_worker": [False, True],
    "seal_worker_bytes": [0, "64GiB"],
    "write_out_bytes": [0, "1GiB"],
    "segment_max_records": [1, (1 << 32) - 1],
    "segment_max_bytes": ["4KiB", (1 << 32) - 1],
    "progress_flush_ms": [1, 3_600_000],
    "create": ["true", "nonempty", True],
    "background": ["false", True],
    "readonly": [False],
    "mmap": [False, True],
    "sf_max_bytes": [33, "1MiB"],
    "sf_max_total_bytes": ["2MiB", (1 << 63) - 1],
    "sf_durability": ["memory", "flush", "append"],
    "sf_append_deadline_millis": [0, 3_600_000],
    "size": [64 << 10, "1MiB"],
    "page_size": [512, "4KiB"],
    "topic": ["events"],
    "format": ["true", False],
    "direct": ["off", "auto"],
    "meta_every": [0, 65534],
}
_SAFE = ["a", "b", "slot", "sp ace", "é"]
_SEGMENTS = st.sampled_from(
    [*_SAFE, ".", "..", "%2e%2e", "%2E", "~", "a%00", "a%2Fb", "%ff", "x%0a"]
)
# Valid values that would make this test write much (it must never fill the disk) are
# replaced: the WAL is never preallocated, SF segments and blockdev images are at most 1 MiB.
_CAPPED = {
    "file": {"wal_file_bytes": None},
    "sf": {"sf_max_bytes": 1 << 20},
    "blockdev": {"size": 1 << 20},
}


def _capped(scheme: str, options: dict[str, object]) -> dict[str, object]:
    if scheme == "file" and options.get("prealloc") in ("fallocate", "zero", None):
        options["prealloc"] = "none"
    for key, cap in _CAPPED[scheme].items():
        if cap is None or key not in options:
            continue
        try:
            big = parse_size(key, options[key]) > cap
        except tidelog.BadOption:
            continue  # refused anyway
        if big:
            options[key] = cap
    return options


@st.composite
def _cases(draw: st.DrawFn) -> tuple[str, str, dict[str, object]]:
    scheme = draw(st.sampled_from(["file", "sf", "blockdev"]))
    segments = st.one_of(st.sampled_from(_SAFE), _SEGMENTS)
    deep = scheme != "blockdev" or draw(st.booleans())  # an image's directory must exist
    path = "/".join(draw(st.lists(segments, min_size=1, max_size=4 if deep else 1)))
    keys = draw(st.lists(st.sampled_from([*_KEYS[scheme], "colour"]), max_size=4, unique=True))
    good = st.sampled_from
    options = {k: draw(st.one_of(good(_GOOD.get(k, ["?"])), _VALUES)) for k in keys}
    if scheme == "blockdev" and "size" not in options and draw(st.integers(0, 3)):
        options["size"] = draw(good(_GOOD["size"]))  # a missing image needs one
    return scheme, path, _capped(scheme, options)


@settings(deadline=None)
@given(case=_cases())
def test_URI_2_URI_6_URI_7_URI_8_any_options_open_or_refuse_leaving_nothing(
    tmp_path_factory: pytest.TempPathFactory, case: tuple[str, str, dict[str, object]]
) -> None:
    """URI-2, URI-6, URI-7, URI-8, ERR-1: random option values and paths (dot segments, '~',
    escapes, control characters) either open a store or raise a typed TidelogError; a refusal
    leaves the whole temporary tree exactly as it was."""
    scheme, path, options = case
    base = tmp_path_factory.mktemp("case")
    (base / "inner").mkdir()
    before = listing(base)
    try:
        try:
            store = tidelog.open(f"{scheme}://{base}/inner/{path}", **options)
        except TidelogError as exc:
            event(f"{scheme}: refused, {exc.code}")
            assert listing(base) == before
        else:
            event(f"{scheme}: opened")
            try:
                name = {"file": "t", "sf": "frames"}.get(scheme, options.get("topic", "default"))
                store.topic(str(name)).append(b"x")
            except TidelogError as exc:
                event(f"{scheme}: append refused, {exc.code}")
            finally:
                store.close()
    finally:
        shutil.rmtree(base)
