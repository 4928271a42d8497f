"""Spark on a topic of an instances store (spec/BUNDLES.md SPK-50..SPK-52; spec/INSTANCES.md).

Each instance directory, ``<root>/instances/<i>``, is a complete ``file://`` store (INST-2): its
copy of the topic is read exactly as a single store's topic is (SPK-3, SPK-4), through this
process's read-only view of that directory, with a plan per instance (SPK-14) and SPK-15's
whole-range check per task. The rows carry the instance they come from in an ``instance``
column: a seq names a record only within its instance (INST-7). A streaming read's offset is an
INST-8 cursor and its progress a merged subscriber (INST-15..INST-17). Writes go into instance
0's copy (SPK-52). Imports pyspark (reached from ``source``).
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Iterator, Sequence

import pyarrow as pa
from pyspark.sql.datasource import DataSourceReader, DataSourceStreamReader, InputPartition
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)
from pyspark.sql.types import StructType

import tidelog
from tidelog.api import Store
from tidelog.backends.instances import MergedSubscriber, merged, parse_instances, shared
from tidelog.errors import BadArgument, BadOption, NoSuchTopic
from tidelog.fsio import OsFS
from tidelog.model.instances import cursor_text, parse_cursor

from . import guard, netread, reading
from .columns import log_ddl, log_schema
from .options import SourceOptions

__all__ = [
    "sink_options",
    "INSTANCE_COLUMN",
    "InstanceRange",
    "InstancesReader",
    "InstancesStreamReader",
    "ddl",
    "schema",
]

INSTANCE_COLUMN = "instance"

#: SPK-3's cut of a read's seqs ``lo..hi`` into its tasks' ranges (source._cut)
Cut = Callable[[SourceOptions, int, int], list[tuple[int, int]]]


def schema(opts: SourceOptions) -> pa.Schema:
    """SPK-3's log schema (with SPK-4's gap column in rows mode), then ``instance int``."""
    return log_schema(opts.tombstones == "rows").append(pa.field(INSTANCE_COLUMN, pa.int32()))


def ddl(opts: SourceOptions) -> str:
    return log_ddl(opts.tombstones == "rows") + f", {INSTANCE_COLUMN} int"


def sink_options(opts: SourceOptions) -> SourceOptions:
    """SPK-52: the options a write of an instances store goes through: instance 0's copy of
    the topic, the one every retry and replay agrees on, with the staging directory beside the
    root (never inside ``instances/``, INST-2). Without ``instances``, ``opts`` unchanged."""
    if opts.instances is None:
        return opts
    _count(opts)
    if opts.topic_config:
        raise BadOption(
            "topic.<key> options with instances: a topic's config is shared by every instance "
            "(INST-5); open the topic in a writer process with its config first (SPK-52)"
        )
    if _state(opts, 0) is None:
        raise NoSuchTopic(
            f"topic {opts.topic!r} has no copy in instance 0 of {opts.root}: a Spark write "
            "goes to instance 0, where a writer process must have opened the topic first "
            "(INST-5, INST-15; SPK-52)"
        )
    return dataclasses.replace(_instance(opts, 0), staging_dir=opts.staging)


def _count(opts: SourceOptions) -> int:
    """The store's instance count, checked against the option (INST-1) and the options a
    read across instances cannot honour refused, all at planning time."""
    if opts.from_seq is not None or opts.to_seq is not None:
        raise BadOption(
            "options fromSeq/toSeq with instances: a seq names a record only within its "
            "instance (INST-7); bound the read by fromTs/toTs (SPK-50)"
        )
    if opts.slot is not None:
        raise BadOption("option slot with instances: slot reads of an instances store (SPK-50)")
    if netread.is_served(opts.root):
        raise BadOption("option instances: a served store is read through its owner (SPK-40)")
    fs = OsFS()
    if not shared.is_instances_root(fs, opts.root):
        guard.check_visible(opts.root, None)  # no store here, said as SPK-16 says it
        raise BadOption(
            f"option instances={opts.instances}: {opts.root} is a single-instance store; "
            "read it without the option (INST-1)"
        )
    stored = int(shared.read_identity(fs, opts.root)["instances"])
    wanted = parse_instances("instances", opts.instances)
    if wanted is not None and wanted != stored:
        raise BadOption(
            f"option instances={wanted}: the store at {opts.root} has {stored} instances "
            "(pass instances=auto or the count; INST-1)"
        )
    return stored


def _instance(opts: SourceOptions, i: int) -> SourceOptions:
    """The options of instance ``i``'s copy: its directory as the store (INST-2)."""
    return dataclasses.replace(opts, root=shared.instance_dir(opts.root, i), instances=None)


class InstanceRange(InputPartition):
    """Seqs ``lo..hi`` inclusive of instance ``instance``'s copy of the topic: one task
    (SPK-50), and what that copy was planned from (SPK-14)."""

    def __init__(self, instance: int, lo: int, hi: int, planned: guard.Planned) -> None:
        super().__init__((instance, lo, hi))
        self.instance, self.lo, self.hi, self.planned = instance, lo, hi, planned


def _ranges(
    opts: SourceOptions,
    i: int,
    lo: int,
    hi: int,
    cut: Cut,
) -> list[InstanceRange]:
    """Seqs ``lo..hi`` of instance ``i``'s copy as tasks, planned from its view (SPK-14)."""
    if lo > hi:
        return []
    one = _instance(opts, i)
    planned = reading.plan(one)
    return [InstanceRange(i, a, b, planned) for a, b in cut(one, lo, hi)]


def _state(opts: SourceOptions, i: int) -> tuple[int, int, int] | None:
    """(evict_floor, earliest_seq, head_seq) of instance ``i``'s copy in this process's view,
    None where the instance has no store yet (a slot never taken, INST-2) or no copy."""
    one = _instance(opts, i)
    if not os.path.isdir(os.path.join(one.root, "meta")):
        return None
    try:
        state = reading.topic(one).state()
    except NoSuchTopic:
        return None
    return state.evict_floor, state.earliest_seq, state.head_seq


def partitions(opts: SourceOptions, cut: Cut) -> list[InstanceRange]:
    """Every instance's copy cut as SPK-3 cuts a topic (``cut``: SPK-3's cut of
    that copy); an instance without a store or without the topic yet has nothing to read."""
    out: list[InstanceRange] = []
    found = False
    for i in range(_count(opts)):
        state = _state(opts, i)
        if state is None:
            continue
        found = True
        out += _ranges(opts, i, state[0], state[2], cut)
    if not found and shared.read_config(OsFS(), opts.root, opts.topic) is None:
        raise NoSuchTopic(f"topic {opts.topic!r} does not exist in {opts.root}")
    return out


def read(opts: SourceOptions, part: InstanceRange) -> Iterator[pa.RecordBatch]:
    """The task: SPK-3's read of its instance's range (SPK-14, SPK-15 against that instance's
    plan), each batch with the ``instance`` column added."""
    for batch in reading.read_log(_instance(opts, part.instance), part.lo, part.hi, part.planned):
        column = pa.array([part.instance] * batch.num_rows, pa.int32())
        yield batch.append_column(pa.field(INSTANCE_COLUMN, pa.int32()), column)


def _check_schema(opts: SourceOptions, user: StructType) -> None:
    got = to_arrow_schema(user, timezone="UTC")
    if not got.equals(schema(opts)):
        raise BadArgument(
            f"a read of an instances store has the schema `{ddl(opts)}`; got "
            f"`{user.simpleString()}` (SPK-50)"
        )


class InstancesReader(DataSourceReader):
    """``spark.read`` of a topic of an instances store (SPK-50)."""

    def __init__(
        self,
        opts: SourceOptions,
        user: StructType,
        cut: Cut,
    ) -> None:
        _check_schema(opts, user)
        self.opts = opts
        self.cut = cut

    def partitions(self) -> Sequence[InputPartition]:
        return partitions(self.opts, self.cut)

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        if not isinstance(partition, InstanceRange):
            return iter(())  # Spark's stand-in when partitions() planned none
        return read(self.opts, partition)


class InstancesStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """``spark.readStream`` of a topic of an instances store (SPK-51). Offsets are
    ``{"cursor": "p0.p1..."}``, an INST-8 cursor: every seq <= ``p_i`` of instance ``i`` has
    been offered. A micro-batch ``(start, end]`` reads seqs ``start_i + 1 .. end_i`` of each
    instance; ``commit`` commits the merged subscriber to ``end`` (INST-17)."""

    def __init__(
        self,
        opts: SourceOptions,
        user: StructType,
        cut: Cut,
    ) -> None:
        _check_schema(opts, user)
        if opts.starting_offsets not in ("resume", "earliest", "latest"):
            raise BadOption(
                f"option startingOffsets={opts.starting_offsets}: with instances a seq names a "
                "record only within its instance: resume, earliest or latest (SPK-51)"
            )
        self.opts = opts
        self.cut = cut
        self.n = _count(opts)
        self._runner_state()

    def _runner_state(self) -> None:
        self._store: Store | None = None
        self._sub: MergedSubscriber | None = None
        self._initial: str | None = None
        self._until: list[int] | None = None

    def __getstate__(self) -> dict[str, object]:
        return {"opts": self.opts, "cut": self.cut, "n": self.n}

    def __setstate__(self, state: dict[str, object]) -> None:
        self.__dict__.update(state)
        self._runner_state()

    # runner side -------------------------------------------------------------------------------
    def _subscriber(self, start: str) -> MergedSubscriber:
        """The merged subscriber (INST-15), registered through a read-only open of the store
        that takes no slot (INST-4): every instance holds what this query has not committed."""
        if self._sub is None:
            uri = f"file://{self.opts.root}?instances={self.n}&readonly=true"
            self._store = tidelog.open(uri, **self.opts.view_options())
            topic = self._store.topic(self.opts.topic, create=False)
            self._sub = merged(topic).subscribe(self.opts.subscriber, start=start)
        return self._sub

    def _heads(self) -> list[int]:
        return [0 if (st := _state(self.opts, i)) is None else st[2] for i in range(self.n)]

    def initialOffset(self) -> dict[str, str]:
        # Spark calls this twice (SPK-9): the first answer is kept
        if self._initial is None:
            start = self.opts.starting_offsets
            sub = self._subscriber("latest" if start == "latest" else "earliest")
            if start == "resume":
                positions = parse_cursor(sub.hwm, self.n)
            elif start == "latest":
                positions = self._heads()
            else:
                states = [_state(self.opts, i) for i in range(self.n)]
                positions = [0 if st is None else st[1] - 1 for st in states]
            self._initial = cursor_text(positions)
        return {"cursor": self._initial}

    def getDefaultReadLimit(self) -> ReadLimit:
        n = self.opts.max_records_per_trigger
        return ReadMaxRows(n) if n else ReadAllAvailable()

    def prepareForTriggerAvailableNow(self) -> None:
        self._until = self._heads()

    def latestOffset(self, start: dict[str, str], limit: ReadLimit) -> dict[str, str]:
        begin = parse_cursor(start["cursor"], self.n)
        end = self._until if self._until is not None else self._heads()
        if isinstance(limit, ReadMaxRows):  # each instance's share of the rows of a trigger
            share = max(1, limit.max_rows // self.n)
            end = [min(e, b + share) for b, e in zip(begin, end)]
        return {"cursor": cursor_text([max(b, e) for b, e in zip(begin, end)])}

    def reportLatestOffset(self) -> dict[str, str]:
        return {"cursor": cursor_text(self._heads())}

    def partitions(self, start: dict[str, str], end: dict[str, str]) -> Sequence[InputPartition]:
        lo, hi = parse_cursor(start["cursor"], self.n), parse_cursor(end["cursor"], self.n)
        out: list[InstanceRange] = []
        for i in range(self.n):
            out += _ranges(self.opts, i, lo[i] + 1, hi[i], self.cut)
        return out

    def commit(self, end: dict[str, str]) -> None:
        # SPK-10: everything up to ``end`` is durably in the sink; never beyond
        self._subscriber("earliest").commit(end["cursor"])

    def stop(self) -> None:
        if self._store is not None:
            self._store.close()

    # executor side -------------------------------------------------------------------------------
    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        if not isinstance(partition, InstanceRange):
            return iter(())
        return read(self.opts, partition)
