"""A batch read of a topic of an instances store (spec/BUNDLES.md SPK-44, spec/INSTANCES.md).

Each instance directory, ``<root>/instances/<i>``, is a complete ``file://`` store (INST-2): its
copy of the topic is read exactly as a single store's topic is (SPK-3, SPK-4), through this
process's read-only view of that directory, with a plan per instance (SPK-14) and SPK-15's
whole-range check per task. The rows carry the instance they come from in an ``instance``
column: a seq names a record only within its instance (INST-7). Imports pyspark (reached from
``source``).
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Iterator, Sequence

import pyarrow as pa
from pyspark.sql.datasource import DataSourceReader, InputPartition
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.types import StructType

from tidelog.backends.instances import parse_instances, shared
from tidelog.errors import BadArgument, BadOption, NoSuchTopic
from tidelog.fsio import OsFS

from . import guard, netread, reading
from .columns import log_ddl, log_schema
from .options import SourceOptions

__all__ = ["INSTANCE_COLUMN", "InstanceRange", "InstancesReader", "ddl", "refuse", "schema"]

INSTANCE_COLUMN = "instance"


def schema(opts: SourceOptions) -> pa.Schema:
    """SPK-3's log schema (with SPK-4's gap column in rows mode), then ``instance int``."""
    return log_schema(opts.tombstones == "rows").append(pa.field(INSTANCE_COLUMN, pa.int32()))


def ddl(opts: SourceOptions) -> str:
    return log_ddl(opts.tombstones == "rows") + f", {INSTANCE_COLUMN} int"


def refuse(opts: SourceOptions, what: str) -> None:
    """What is not offered on an instances store yet (SPK-44, INST-12): ``bad_option``."""
    if opts.instances is not None:
        raise BadOption(
            f"option instances: a {what} of a store of several instances is not supported yet "
            "(only a batch read is, SPK-44; INST-12)"
        )


def _count(opts: SourceOptions) -> int:
    """The store's instance count, checked against the option (INST-1) and the options a
    read across instances cannot honour refused, all at planning time."""
    if opts.from_seq is not None or opts.to_seq is not None:
        raise BadOption(
            "options fromSeq/toSeq with instances: a seq names a record only within its "
            "instance (INST-7); bound the read by fromTs/toTs (SPK-44)"
        )
    if opts.slot is not None:
        raise BadOption("option slot with instances: slot reads of an instances store (SPK-44)")
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
    (SPK-44), and what that copy was planned from (SPK-14)."""

    def __init__(self, instance: int, lo: int, hi: int, planned: guard.Planned) -> None:
        super().__init__((instance, lo, hi))
        self.instance, self.lo, self.hi, self.planned = instance, lo, hi, planned


def partitions(
    opts: SourceOptions, per_task: Callable[[SourceOptions], int]
) -> list[InstanceRange]:
    """Every instance's copy cut as SPK-3 cuts a topic (``per_task``: the seqs per task of
    that copy); an instance without a store or without the topic yet has nothing to read."""
    out: list[InstanceRange] = []
    found = False
    for i in range(_count(opts)):
        one = _instance(opts, i)
        if not os.path.isdir(os.path.join(one.root, "meta")):
            continue  # a slot no writer has taken yet (INST-2)
        try:
            lo, hi = reading.seq_bounds(one)
        except NoSuchTopic:
            continue
        found = True
        if lo > hi:
            continue
        planned = reading.plan(one)
        size = opts.partition_records or per_task(one)
        out += [InstanceRange(i, a, b, planned) for a, b in reading.split(lo, hi, size)]
    if not found and shared.read_config(OsFS(), opts.root, opts.topic) is None:
        raise NoSuchTopic(f"topic {opts.topic!r} does not exist in {opts.root}")
    return out


def read(opts: SourceOptions, part: InstanceRange) -> Iterator[pa.RecordBatch]:
    """The task: SPK-3's read of its instance's range (SPK-14, SPK-15 against that instance's
    plan), each batch with the ``instance`` column added."""
    for batch in reading.read_log(_instance(opts, part.instance), part.lo, part.hi, part.planned):
        column = pa.array([part.instance] * batch.num_rows, pa.int32())
        yield batch.append_column(pa.field(INSTANCE_COLUMN, pa.int32()), column)


class InstancesReader(DataSourceReader):
    """``spark.read`` of a topic of an instances store (SPK-44)."""

    def __init__(
        self, opts: SourceOptions, user: StructType, per_task: Callable[[SourceOptions], int]
    ) -> None:
        got = to_arrow_schema(user, timezone="UTC")
        if not got.equals(schema(opts)):
            raise BadArgument(
                f"a read of an instances store has the schema `{ddl(opts)}`; got "
                f"`{user.simpleString()}` (SPK-44)"
            )
        self.opts = opts
        self.per_task = per_task

    def partitions(self) -> Sequence[InputPartition]:
        return partitions(self.opts, self.per_task)

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        if not isinstance(partition, InstanceRange):
            return iter(())  # Spark's stand-in when partitions() planned none
        return read(self.opts, partition)
