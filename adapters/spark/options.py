"""Options of the ``tidelog`` Spark data source, parsed once on the driver (no pyspark needed).

Spark hands a data source its options lower-cased with string values (``load(path)`` becomes
``path``). Everything is validated here, before any task runs, so a typo fails the query at
planning time with a message naming the option (spec ERR-3), not deep inside an executor.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from tidelog.backends.file.coldread import COLD_PREFIX, cold_url
from tidelog.backends.file.segstore import redact
from tidelog.backends.instances import parse_instances
from tidelog.errors import BadOption
from tidelog.names import check_subscriber_name, check_topic_name
from tidelog.options import parse_choice, parse_int, parse_size
from tidelog.uri import parse_uri

__all__ = ["SourceOptions", "parse_options", "store_root", "KNOWN_OPTIONS"]

KNOWN_OPTIONS = {
    "path",
    "uri",
    "topic",
    "fromseq",
    "toseq",
    "fromts",
    "tots",
    "slot",
    "tombstones",
    "partitionrecords",
    "partitionbytes",
    "minpartitions",
    "batchrecords",
    "maxrecordspertrigger",
    "startingoffsets",
    "subscriber",
    "stagingdir",
    "producerid",
    "requesttimeout",
    "samplebundles",
    "freshnesstimeoutms",
    "token",  # the bearer token of a served (http://) store, SPK-40
    "cold",
    "coldcachesegments",
    "hotretainsegments",
    "hotretainbytes",
    "storeid",  # a cold+URL source's store and pinned manifest version (SPK-31)
    "manifest",
    "instances",  # a store of several instances (SPK-50); also ?instances= in the URI
}
#: Options Spark itself passes to every sink/source; ignored here.
_SPARK_OPTIONS = {"checkpointlocation", "queryname"}
_TOPIC_PREFIX = "topic."  # topic.durability=fsync, ...: TopicConfig keys for a topic writes create


@dataclass(frozen=True)
class SourceOptions:
    root: str  # absolute store directory
    topic: str
    from_seq: int | None = None  # None: from evict_floor (older losses are not reported)
    to_seq: int | None = None
    from_ts: int | None = None  # ms since the epoch, inclusive
    to_ts: int | None = None
    slot: int | None = None
    tombstones: str = "fail"  # "fail" | "rows"
    partition_records: int | None = None  # None: from partition_bytes (SPK-3)
    partition_bytes: int = 128 << 20  # Spark's spark.sql.files.maxPartitionBytes default
    min_partitions: int | None = None  # None: the planning host's CPU count (SPK-3)
    batch_records: int = 65_536
    max_records_per_trigger: int | None = None
    starting_offsets: str = "resume"  # "resume" | "earliest" | "latest" | a seq (as text)
    subscriber: str = "spark"
    staging_dir: str | None = None
    producer_id: str | None = None
    request_timeout: float = 120.0
    sample_bundles: int = 1000
    freshness_timeout_ms: int = 10_000  # how long a task waits for its view to reach its plan
    topic_config: dict[str, str] = field(default_factory=dict)
    token: str | None = field(default=None, repr=False)  # a served store's (SPK-40): never shown
    cold: str | None = None  # the store's cold tier (spec/TIERING.md TIER-1), SPK-30
    cold_cache_segments: int | None = None
    hot_retain_segments: int | None = None
    hot_retain_bytes: int | None = None
    store_id: str | None = None  # a cold+URL source's store (SPK-31)
    manifest: int | None = None  # ... and its pinned manifest version (SPK-32)
    instances: str | None = None  # an instances store's count or "auto" (SPK-50, INST-1)

    def __repr__(self) -> str:
        # a cold URL may carry credentials: shown redacted (TIER-13)
        shown = {k: v for k, v in self.__dict__.items() if k != "token"}
        shown["root"], shown["cold"] = redact(self.root), self.cold and redact(self.cold)
        return f"SourceOptions({', '.join(f'{k}={v!r}' for k, v in shown.items())})"

    def view_options(self) -> dict[str, Any]:
        """``tidelog.open`` options of the read-only views Spark's processes open (SPK-30: a
        view reads cold segments when opened with the store's cold tier, TIER-8)."""
        out: dict[str, Any] = {}
        if self.cold is not None:
            out["cold"] = self.cold
        if self.cold_cache_segments is not None:
            out["cold_cache_segments"] = self.cold_cache_segments
        return out

    def owner_options(self) -> dict[str, Any]:
        """``tidelog.open`` options of a brief owner open when no process owns the store
        (XPR-3, SPK-30): the cold tier and its retention bounds, so it relocates as the owner
        would."""
        out = {k: v for k, v in self.view_options().items() if k == "cold"}
        if self.hot_retain_segments is not None:
            out["hot_retain_segments"] = self.hot_retain_segments
        if self.hot_retain_bytes is not None:
            out["hot_retain_bytes"] = self.hot_retain_bytes
        return out

    @property
    def staging(self) -> str:
        """Where writers stage Arrow files: never inside the store (LAY-2 lists every entry
        a store directory may hold), by default a hidden sibling of it."""
        if self.staging_dir:
            return self.staging_dir
        parent, base = os.path.split(self.root.rstrip(os.sep))
        return os.path.join(parent, f".{base}.spark-staging")


def store_root(location: str) -> str:
    """The absolute store directory of ``file:///abs``, ``file://./rel`` or a plain path; a
    served store's URL (SPK-40) and a ``cold+URL`` (SPK-31) as they are (a relative cold path
    made absolute)."""
    if cold_url(location) is not None:
        return COLD_PREFIX + str(cold_url(location))  # a cold tier alone (SPK-31)
    if "://" in location:
        uri = parse_uri(location)
        if uri.scheme in ("http", "https"):
            return location  # a store tidelog serve owns, read over the network (SPK-40)
        if uri.scheme != "file":
            raise BadOption(
                f"the Spark data source reads and writes file:// stores (and reads http(s):// "
                f"stores, SPK-40) only, got {location!r} "
                "(executors are other processes: memory:// stores are invisible to them)"
            )
        location = uri.location
    if not location:
        raise BadOption("the store path is empty: use load('/path/to/store') or option('uri', ...)")
    return os.path.abspath(location)


def _uri_instances(location: str) -> str | None:
    """``instances`` of a ``file://`` URI's query (INST-1), as the option (SPK-50)."""
    if "://" not in location:
        return None
    uri = parse_uri(location)
    return uri.options.get("instances") if uri.scheme == "file" else None


def _ts(key: str, value: str) -> int:
    """Milliseconds since the epoch: an integer, or an ISO-8601 time (UTC if no zone)."""
    text = value.strip()
    if text.lstrip("-").isdigit():
        return int(text)
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        raise BadOption(
            f"option {key}={value!r}: expected milliseconds since the epoch or an ISO-8601 time"
        ) from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return int(moment.timestamp() * 1000)


def _cold(value: str) -> str:
    """TIER-1's cold URL; a relative local path is made absolute here, on the driver, since
    executors run in other working directories."""
    if "://" in value or os.path.isabs(value):
        return value
    return os.path.abspath(value)


def parse_options(options: Mapping[str, str]) -> SourceOptions:
    opts = {str(k).lower(): v for k, v in options.items() if k.lower() not in _SPARK_OPTIONS}
    config = {k[len(_TOPIC_PREFIX) :]: v for k, v in opts.items() if k.startswith(_TOPIC_PREFIX)}
    unknown = sorted(k for k in opts if k not in KNOWN_OPTIONS and not k.startswith(_TOPIC_PREFIX))
    if unknown:
        raise BadOption(
            f"unknown tidelog option(s) {', '.join(unknown)}; known: "
            + ", ".join(sorted(KNOWN_OPTIONS))
            + ", topic.<config key>"
        )
    location = opts.get("uri") or opts.get("path")
    if not location:
        raise BadOption("no store given: use .load('/path/to/store') or .option('uri', 'file://…')")
    if "topic" not in opts:
        raise BadOption("option 'topic' is required")
    instances = opts.get("instances") or _uri_instances(location)
    out: dict[str, object] = {
        "root": store_root(location),
        "topic": check_topic_name(opts["topic"]),
        "topic_config": config,
    }
    ints = {
        "fromseq": ("from_seq", 1),
        "toseq": ("to_seq", 1),
        "slot": ("slot", 0),
        "partitionrecords": ("partition_records", 1),
        "minpartitions": ("min_partitions", 1),
        "batchrecords": ("batch_records", 1),
        "maxrecordspertrigger": ("max_records_per_trigger", 1),
        "samplebundles": ("sample_bundles", 1),
        "freshnesstimeoutms": ("freshness_timeout_ms", 0),
        "coldcachesegments": ("cold_cache_segments", 1),
        "hotretainsegments": ("hot_retain_segments", 0),
        "manifest": ("manifest", 1),
    }
    for key, (name, minimum) in ints.items():
        if key in opts:
            out[name] = parse_int(key, opts[key], minimum=minimum)
    if "partitionbytes" in opts:
        out["partition_bytes"] = parse_size("partitionBytes", opts["partitionbytes"])
    if "hotretainbytes" in opts:
        out["hot_retain_bytes"] = parse_size("hotRetainBytes", opts["hotretainbytes"])
    if opts.get("cold"):
        out["cold"] = _cold(str(opts["cold"]))
    if "slot" in out and int(out["slot"]) >= 64:  # type: ignore[call-overload]
        raise BadOption(f"option slot={opts['slot']!r}: a bundle has slots 0..63")
    for key, name in (("fromts", "from_ts"), ("tots", "to_ts")):
        if key in opts:
            out[name] = _ts(key, opts[key])
    if "tombstones" in opts:
        out["tombstones"] = parse_choice("tombstones", opts["tombstones"], ("fail", "rows"))
    if "startingoffsets" in opts:
        start = str(opts["startingoffsets"]).strip().lower()
        if start not in ("resume", "earliest", "latest") and not start.isdigit():
            raise BadOption(
                f"option startingOffsets={opts['startingoffsets']!r}: expected resume, "
                "earliest, latest or a seq (records after it are read)"
            )
        out["starting_offsets"] = start
    if "subscriber" in opts:
        out["subscriber"] = check_subscriber_name(opts["subscriber"])
    if opts.get("stagingdir"):
        out["staging_dir"] = os.path.abspath(opts["stagingdir"])
    if opts.get("storeid"):
        out["store_id"] = str(opts["storeid"]).strip().lower()
    if instances:
        parse_instances("instances", instances)  # a count 1..256 or auto (INST-1)
        out["instances"] = str(instances).strip().lower()
    if opts.get("token"):
        out["token"] = str(opts["token"])
    if opts.get("producerid"):
        out["producer_id"] = str(opts["producerid"])
    if "requesttimeout" in opts:
        try:
            timeout = float(opts["requesttimeout"])
        except ValueError:
            timeout = -1.0
        if timeout <= 0:
            raise BadOption(f"option requestTimeout={opts['requesttimeout']!r}: seconds > 0")
        out["request_timeout"] = timeout
    return SourceOptions(**out)  # type: ignore[arg-type]
