"""The ``tidelog`` PySpark data source (spec/BUNDLES.md SPK-1..SPK-16). Imports pyspark:
reach it through ``tidelog.adapters.spark.register(spark)``, which imports it lazily.

Where each piece runs (SPK-2, SPK-9) decides how it reaches the store:

* ``schema`` / ``reader`` / ``partitions`` / ``writer``: short-lived planner workers on the
  driver -> a read-only view (XPR-1).
* ``read`` and ``write``: executor workers -> a read-only view per worker process; writes only
  stage files (SPK-2, SPK-6). A served store (``http(s)://``) is read through its owner's
  Arrow reads and written by staging chunks on it (SPK-40, SPK-44; netread.py, netsink.py).
* writer ``commit`` / ``abort``: one more worker on the driver, on an unpickled copy of the
  planner's writer -> one ingest request to the owner (XPR-2..4), or deleting staged files.
* stream reader ``initialOffset`` / ``latestOffset`` / ``commit``: one long-lived source runner
  per query -> its own refreshed read-only view, and subscribe / commit requests (SPK-9).
"""

from __future__ import annotations

import hashlib
import os
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
from pyspark import TaskContext
from pyspark.sql.datasource import (
    DataSource,
    DataSourceArrowWriter,
    DataSourceReader,
    DataSourceStreamArrowWriter,
    DataSourceStreamReader,
    InputPartition,
    WriterCommitMessage,
)
from pyspark.sql.pandas.types import from_arrow_schema, to_arrow_schema
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)
from pyspark.sql.types import StructType

from tidelog.errors import BadArgument, BadOption

from . import coldsource, guard, instances, netread, netsink, reading, staging
from .columns import SEQ_COLUMN, log_ddl, log_schema, slot_schema
from .netsink import QUERY_ID_KEY
from .options import SourceOptions, parse_options

__all__ = ["TidelogDataSource", "SeqRange", "StagedFile"]


class SeqRange(InputPartition):
    """Seqs ``lo..hi`` inclusive: one task (SPK-3), and what it was planned from (SPK-14)."""

    def __init__(
        self, lo: int, hi: int, planned: guard.Planned | None = None, owner: str | None = None
    ) -> None:
        super().__init__((lo, hi))
        self.lo = lo
        self.hi = hi
        self.planned = planned
        self.owner = owner  # a served store's host (SPK-42)

    def preferredLocations(self) -> list[str]:  # Spark's name (InputPartition's, in the JVM)
        """SPK-42: a served store's partitions prefer its host (Spark 4.3 does not ask)."""
        owner = getattr(self, "owner", None)
        return [owner] if owner else []


class ColdRange(SeqRange):
    """Seqs ``lo..hi`` of a cold tier alone, with the pinned manifest version and the segments
    to read (SPK-32)."""

    def __init__(self, lo: int, hi: int, plan: coldsource.ColdPlan) -> None:
        super().__init__(lo, hi)
        self.plan = plan


@dataclass
class StagedFile(WriterCommitMessage):
    """A task's staged file (empty path: the task had no rows) and the streaming query id."""

    path: str
    rows: int
    query_id: str | None = None


def _arrow_target(schema: StructType) -> pa.Schema:
    return to_arrow_schema(schema, timezone="UTC")


def _check_log_schema(schema: StructType, opts: SourceOptions) -> None:
    want = log_schema(opts.tombstones == "rows")
    got = _arrow_target(schema)
    if not got.equals(want):
        raise BadArgument(
            f"a tidelog log read has the schema `{log_ddl(opts.tombstones == 'rows')}`; "
            f"got `{schema.simpleString()}` (only slot reads, option slot=N, take a user schema)"
        )


def _read(opts: SourceOptions, target: pa.Schema, part: InputPartition) -> Iterator[pa.RecordBatch]:
    if not isinstance(part, SeqRange):
        return iter(())  # Spark's stand-in when partitions() planned none: nothing to read
    if isinstance(part, ColdRange):
        return coldsource.read_cold(opts, part.lo, part.hi, part.plan)
    planned = getattr(part, "planned", None)  # a partition pickled by an older adapter has none
    if opts.slot is None:
        return reading.read_log(opts, part.lo, part.hi, planned)
    return reading.read_slot(opts, part.lo, part.hi, target, planned)


def _partitions(opts: SourceOptions, lo: int, hi: int) -> list[SeqRange]:
    if lo > hi:
        return []
    planned = reading.plan(opts)
    owner = netread.owner_host(opts) if netread.is_served(opts.root) else None
    return [SeqRange(a, b, planned, owner) for a, b in _cut(opts, lo, hi)]


def _cut(opts: SourceOptions, lo: int, hi: int) -> list[tuple[int, int]]:
    """SPK-3: seqs ``lo..hi`` as the inclusive ranges of a read's tasks."""
    if opts.partition_records:
        return reading.split(lo, hi, opts.partition_records)
    return reading.split_even(lo, hi, _task_count(opts, hi - lo + 1))


def _task_count(opts: SourceOptions, seqs: int) -> int:
    """SPK-3: without ``partitionRecords``, as many tasks as ``partitionBytes`` of payload at
    the topic's mean record size make, and at least ``minPartitions`` while each keeps
    ``MIN_SPLIT_BYTES``; the range is then cut evenly. A task costs Spark's Python data source
    path tens of ms whatever it reads, so tasks are sized by volume, as Spark sizes file
    splits; and cut evenly, since a scan lasts as long as its longest task (2M records of
    100 B at 128 MiB made one task of 1.34M records and one of 0.66M)."""
    state = reading.topic(opts).state()
    mean = state.bytes / state.count if state.count else 1.0
    return reading.task_count(opts, seqs * max(mean, 1.0))


class TidelogDataSource(DataSource):
    """``spark.read.format("tidelog")``, ``df.write.format("tidelog")`` and the streaming
    variants; see spec/BUNDLES.md §3 for the options."""

    @classmethod
    def name(cls) -> str:
        return "tidelog"

    def _opts(self) -> SourceOptions:
        opts = parse_options(dict(self.options))
        netread.check_served(opts)  # what a served store offers Spark (SPK-40)
        coldsource.check_cold(opts)  # ... and a cold tier alone (SPK-31)
        return opts

    def schema(self) -> StructType | str:
        opts = self._opts()
        if opts.instances is not None:
            return instances.ddl(opts)  # SPK-50
        if opts.slot is None:
            return log_ddl(opts.tombstones == "rows")
        return from_arrow_schema(slot_schema(reading.infer_slot_columns(opts)))

    def reader(self, schema: StructType) -> DataSourceReader:
        opts = self._opts()
        if opts.instances is not None:
            return instances.InstancesReader(opts, schema, _cut)  # SPK-50
        return TidelogReader(opts, schema)

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        opts = self._opts()
        coldsource.refuse(opts, "a streaming read")
        if opts.instances is not None:
            return instances.InstancesStreamReader(opts, schema, _cut)  # SPK-51
        return TidelogStreamReader(opts, schema)

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceArrowWriter:
        if overwrite:
            raise BadOption("a tidelog topic is an append-only log: use .mode('append')")
        opts = self._opts()
        coldsource.refuse(opts, "a write")
        if netread.is_served(opts.root):  # staged on the owner (SPK-44)
            return netsink.ServedWriter(opts)
        return TidelogWriter(instances.sink_options(opts))  # SPK-52: instance 0

    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamArrowWriter:
        if overwrite:
            raise BadOption("a tidelog topic is an append-only log: use outputMode('append')")
        opts = self._opts()
        coldsource.refuse(opts, "a write")
        if netread.is_served(opts.root):  # staged on the owner (SPK-44)
            return netsink.ServedStreamWriter(opts)
        opts = instances.sink_options(opts)  # SPK-52: instance 0
        return TidelogStreamWriter(opts, query_key(dict(self.options), opts))


def _target_for(opts: SourceOptions, schema: StructType) -> pa.Schema:
    if opts.slot is None:
        _check_log_schema(schema, opts)
        return log_schema(opts.tombstones == "rows")
    target = _arrow_target(schema)
    if not target.names or target.names[0] != SEQ_COLUMN:
        raise BadArgument(f"a slot read's schema must start with `{SEQ_COLUMN} long`")
    return target


# -- batch read -----------------------------------------------------------------------------------
class TidelogReader(DataSourceReader):
    def __init__(self, opts: SourceOptions, schema: StructType) -> None:
        self.opts = opts
        self.target = _target_for(opts, schema)

    def partitions(self) -> Sequence[InputPartition]:
        if coldsource.is_cold(self.opts.root):  # the pinned manifest's segments (SPK-32)
            return [ColdRange(a, b, p) for a, b, p in coldsource.plan_partitions(self.opts)]
        lo, hi = reading.seq_bounds(self.opts)
        return _partitions(self.opts, lo, hi)

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        return _read(self.opts, self.target, partition)


# -- streaming read --------------------------------------------------------------------------------
class TidelogStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Offsets are ``{"seq": s}``: every seq <= s has been offered (SPK-9). A micro-batch
    ``(start, end]`` reads seqs ``start+1 .. end``."""

    def __init__(self, opts: SourceOptions, schema: StructType) -> None:
        self.opts = opts
        self.target = _target_for(opts, schema)
        self._initial: int | None = None  # runner-side state (never pickled, see __getstate__)
        self._until: int | None = None  # availableNow: the head when the trigger started
        self._registered = False

    def __getstate__(self) -> dict[str, Any]:
        return {"opts": self.opts, "target": self.target}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.opts = state["opts"]
        self.target = state["target"]
        self._initial = self._until = None
        self._registered = False

    # runner side -------------------------------------------------------------------------------
    def _head(self) -> int:
        return reading.topic(self.opts).state().head_seq

    def _register(self, start: str) -> int:
        """Register the durable subscriber now, so trim and retention honour this query from
        its first batch (SUB-5, SUB-6); returns its hwm."""
        result = staging.request(
            self.opts,
            {
                "op": "subscribe",
                "topic": self.opts.topic,
                "subscriber": self.opts.subscriber,
                "start": start,
            },
        )
        self._registered = True
        return int(result["hwm"])

    def initialOffset(self) -> dict[str, int]:
        # Spark calls this twice (SPK-9): the first answer is kept, so "latest" cannot
        # move between the calls.
        if self._initial is None:
            start = self.opts.starting_offsets
            state = reading.topic(self.opts).state()
            if start == "latest":
                self._register("latest")
                self._initial = state.head_seq
            elif start == "earliest":
                self._register("earliest")
                self._initial = state.earliest_seq - 1
            elif start == "resume":
                self._initial = self._register("earliest")
            else:
                self._register("earliest")
                self._initial = min(int(start), state.head_seq)
        return {"seq": self._initial}

    def getDefaultReadLimit(self) -> ReadLimit:
        n = self.opts.max_records_per_trigger
        return ReadMaxRows(n) if n else ReadAllAvailable()

    def prepareForTriggerAvailableNow(self) -> None:
        self._until = self._head()

    def latestOffset(self, start: dict[str, int], limit: ReadLimit) -> dict[str, int]:
        begin = int(start["seq"])
        end = self._until if self._until is not None else self._head()
        if isinstance(limit, ReadMaxRows):
            end = min(end, begin + limit.max_rows)
        return {"seq": max(begin, end)}

    def reportLatestOffset(self) -> dict[str, int]:
        return {"seq": self._head()}

    def partitions(self, start: dict[str, int], end: dict[str, int]) -> Sequence[InputPartition]:
        return _partitions(self.opts, int(start["seq"]) + 1, int(end["seq"]))

    def commit(self, end: dict[str, int]) -> None:
        # Spark calls this for batch N-1 while planning batch N (SPK-10): everything up
        # to ``end`` is durably in the sink, so the subscriber may resolve it and the owner
        # trim it (SPK-10). Never beyond: uncommitted batches are replayed after a restart.
        staging.request(
            self.opts,
            {
                "op": "commit",
                "topic": self.opts.topic,
                "subscriber": self.opts.subscriber,
                "seq": int(end["seq"]),
                "start": "earliest",
            },
        )

    def stop(self) -> None:  # never called by Spark 4.3 (SPK-10): nothing relies on it
        pass

    # executor side -------------------------------------------------------------------------------
    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        return _read(self.opts, self.target, partition)


# -- batch write -----------------------------------------------------------------------------------
class _Attempt:
    """The attempt directory of a write (SPK-7): created on the driver side when the writer is
    pickled to ship it to its tasks (so a writer Spark plans but never runs, or a commit-side
    copy, creates nothing); tasks only create files inside it (staging.stage)."""

    opts: SourceOptions
    _parent: str
    _prefix: str
    _directory: str | None

    def _attempt(self) -> str:
        if self._directory is None:
            self._directory = staging.new_attempt(self._parent, self._prefix)
        return self._directory

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_directory"] = self._attempt()
        # where a task that finds no attempt looks to tell an abort from a host that does not
        # see the driver's directory (SPK-16): the staging directory's parent, the driver's host
        anchor = os.path.dirname(self.opts.staging.rstrip(os.sep))
        state.setdefault("_origin", (anchor, guard.host()))
        return state

    def _stage(self, iterator: Iterator[pa.RecordBatch]) -> tuple[str, int]:
        origin = self.__dict__.get("_origin")
        return staging.stage(self._attempt(), iterator, self.opts.slot, origin)


class TidelogWriter(_Attempt, DataSourceArrowWriter):
    """Tasks stage files; ``commit`` makes them visible in one atomic, idempotent ingest with
    producer ``(spark-job-<uuid>, 1)``; ``abort`` removes the attempt (SPK-6, SPK-7)."""

    def __init__(self, opts: SourceOptions) -> None:
        self.opts = opts
        self.job_id = uuid.uuid4().hex  # set in the planner: executors and commit share it
        self._parent, self._prefix, self._directory = opts.staging, f"job-{self.job_id}", None

    def write(self, iterator: Iterator[pa.RecordBatch]) -> StagedFile:
        path, rows = self._stage(iterator)
        return StagedFile(path, rows)

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        files = [m.path for m in messages if isinstance(m, StagedFile) and m.path]
        try:
            if files:
                staging.ingest(self.opts, files, (f"spark-job-{self.job_id}", 1))
        finally:
            if self._directory is not None:
                staging.remove_attempt(self._directory)

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        # Also after tasks that failed (None messages) or still run: the attempt directory is
        # renamed away first, so nothing they write can remain (staging module docstring).
        if self._directory is not None:
            staging.remove_attempt(self._directory)


# -- streaming write -------------------------------------------------------------------------------
def query_key(options: dict[str, str], opts: SourceOptions) -> str:
    """What names a streaming query's staging directory on the driver side, where Spark's query
    id is unknown: option producerId, else the checkpoint location (one per query)."""
    lowered = {str(k).lower(): v for k, v in options.items()}
    source = opts.producer_id or lowered.get("checkpointlocation")
    if not source:
        raise BadOption(
            "the tidelog streaming sink needs .option('checkpointLocation', ...) on the writer "
            "(or option producerId): it names the query's staging directory"
        )
    return hashlib.sha256(str(source).encode()).hexdigest()[:16]


class TidelogStreamWriter(_Attempt, DataSourceStreamArrowWriter):
    """Exactly-once sink: micro-batch ``b`` of query ``q`` is one ingest with producer
    ``(spark-<q>, b + 1)``; a replayed batch is refused by the producer mark (SPK-11)."""

    def __init__(self, opts: SourceOptions, key: str) -> None:
        self.opts = opts
        self.query_dir = os.path.join(opts.staging, f"query-{key}")
        self._parent, self._prefix, self._directory = self.query_dir, "attempt", None

    def write(self, iterator: Iterator[pa.RecordBatch]) -> StagedFile:
        ctx = TaskContext.get()
        query_id = ctx.getLocalProperty(QUERY_ID_KEY) if ctx is not None else None
        path, rows = self._stage(iterator)
        return StagedFile(path, rows, query_id)

    def _producer(self, messages: list[Any], batch_id: int) -> tuple[str, int]:
        ids = {m.query_id for m in messages if isinstance(m, StagedFile) and m.query_id}
        return staging.stream_producer(self.opts, ids, batch_id)

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        files = [m.path for m in messages if isinstance(m, StagedFile) and m.path]
        try:
            if files:
                staging.ingest(self.opts, files, self._producer(messages, batchId))
        finally:
            # Micro-batches of one query run one after another: every attempt directory of
            # the query is this batch's or a failed earlier one's (SPK-11).
            staging.sweep(self.query_dir)

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        staging.sweep(self.query_dir)
