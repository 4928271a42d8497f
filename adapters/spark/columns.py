"""Columnar conversion between tidelog records and the Arrow batches Spark exchanges with a
Python data source (no pyspark needed here: executors only need pyarrow).

Spark checks the first batch a reader yields against its expected Arrow schema with
``Schema.equals``: names, order, types (``timestamp[us, tz=UTC]``, never ``large_binary``) and
nullability must all match (SPK-3). Every schema below is therefore spelled out exactly
as ``to_arrow_schema(StructType, timezone="UTC")`` produces it, and a test pins the equality.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from tidelog.bundle import decode_bundle
from tidelog.errors import BadArgument, TidelogError
from tidelog.records import Item, Tombstone

__all__ = [
    "LOG_DDL",
    "GAP_COLUMN",
    "SEQ_COLUMN",
    "log_schema",
    "log_ddl",
    "log_batch",
    "slot_batch",
    "spark_compatible",
    "merge_slot_schemas",
    "slot_schema",
    "staged_table",
    "TombstoneFound",
]

LOG_DDL = "topic string, seq long, ts timestamp, tag string, node string, payload binary"
GAP_COLUMN = "gap_to"  # tombstones="rows": non-null exactly on tombstone rows (SPK-4)
SEQ_COLUMN = "_seq"  # slot reads: the bundle's record seq, first column (SPK-5)
_TS = pa.timestamp("us", tz="UTC")
_LOG_FIELDS = [
    pa.field("topic", pa.string()),
    pa.field("seq", pa.int64()),
    pa.field("ts", _TS),
    pa.field("tag", pa.string()),
    pa.field("node", pa.string()),
    pa.field("payload", pa.binary()),
]


class TombstoneFound(TidelogError):
    """A read met a tombstone (records lost involuntarily, TMB-1/2) with tombstones="fail"."""

    code = "tombstone"


def log_schema(tombstone_rows: bool) -> pa.Schema:
    fields = list(_LOG_FIELDS)
    if tombstone_rows:
        fields.append(pa.field(GAP_COLUMN, pa.int64()))
    return pa.schema(fields)


def log_ddl(tombstone_rows: bool) -> str:
    return LOG_DDL + (f", {GAP_COLUMN} long" if tombstone_rows else "")


def _strings(values: Sequence[str | None]) -> pa.Array:
    return pa.array(values, pa.string())


def log_batch(topic: str, items: Sequence[Item], tombstone_rows: bool) -> pa.RecordBatch:
    """Records (and, in rows mode, tombstones) as one batch of ``log_schema``. Columns are built
    from per-column Python lists in one C call each: no per-row Arrow work."""
    n = len(items)
    seqs: list[int] = []
    tss: list[int | None] = []
    tags: list[str | None] = []
    nodes: list[str | None] = []
    payloads: list[bytes | None] = []
    gaps: list[int | None] = []
    for item in items:
        if isinstance(item, Tombstone):
            seqs.append(item.gap_from)
            tss.append(None)
            tags.append(None)
            nodes.append(None)
            payloads.append(None)
            gaps.append(item.gap_to)
        else:
            seqs.append(item.seq)
            tss.append(item.ts)
            tags.append(item.tag)
            nodes.append(item.node)
            payloads.append(item.payload)
            gaps.append(None)
    ts_ms = pa.array(tss, pa.int64())
    columns = [
        pa.repeat(pa.scalar(topic, pa.string()), n),
        pa.array(seqs, pa.int64()),
        pc.multiply(ts_ms, 1000).cast(_TS),
        _strings(tags),
        _strings(nodes),
        pa.array(payloads, pa.binary()),
    ]
    if tombstone_rows:
        columns.append(pa.array(gaps, pa.int64()))
    return pa.RecordBatch.from_arrays(columns, schema=log_schema(tombstone_rows))


# -- bundle slots -------------------------------------------------------------------------------
def spark_compatible(t: pa.DataType) -> pa.DataType:
    """The Arrow type Spark can hold a column of type ``t`` as (Spark has no dictionary,
    unsigned, large or half-float types): dictionaries decode to their values, unsigned
    integers widen, timestamps become microseconds. Raises BadArgument when Spark has no
    equivalent."""
    types = pa.types
    if types.is_dictionary(t):
        return spark_compatible(t.value_type)
    widen = {
        pa.uint8(): pa.int16(),
        pa.uint16(): pa.int32(),
        pa.uint32(): pa.int64(),
        pa.uint64(): pa.decimal128(20, 0),
        pa.float16(): pa.float32(),
        pa.large_string(): pa.string(),
        pa.large_binary(): pa.binary(),
        pa.date64(): pa.date32(),
    }
    if t in widen:
        return widen[t]
    if types.is_fixed_size_binary(t):
        return pa.binary()
    if types.is_timestamp(t):
        return pa.timestamp("us", tz=t.tz)
    if types.is_list(t) or types.is_large_list(t) or types.is_fixed_size_list(t):
        return pa.list_(pa.field("element", spark_compatible(t.value_type)))
    if types.is_struct(t):
        return pa.struct([pa.field(f.name, spark_compatible(f.type)) for f in t])
    if types.is_map(t):
        return pa.map_(spark_compatible(t.key_type), spark_compatible(t.item_type))
    if (
        types.is_boolean(t)
        or types.is_signed_integer(t)
        or types.is_floating(t)
        or types.is_decimal(t)
        or types.is_string(t)
        or types.is_binary(t)
        or types.is_date32(t)
        or types.is_null(t)
    ):
        return t
    raise BadArgument(f"Arrow type {t} has no Spark equivalent; read the payload column instead")


def merge_slot_schemas(schemas: Iterable[pa.Schema]) -> pa.Schema:
    """One Spark-compatible schema covering every drifted variant: the union of the columns
    (first-seen order), every field nullable, clashing types promoted where Arrow can."""
    merged: list[pa.Schema] = []
    for schema in schemas:
        fields = [pa.field(f.name, spark_compatible(f.type)) for f in schema]
        merged.append(pa.schema(fields))
    if not merged:
        raise BadArgument("no bundle holds this slot, so its schema is unknown")
    try:
        return pa.unify_schemas(merged, promote_options="permissive")
    except (pa.ArrowInvalid, pa.ArrowTypeError) as exc:
        raise BadArgument(f"the slot's schemas cannot be merged: {exc}") from None


def slot_schema(columns: pa.Schema) -> pa.Schema:
    """The DataFrame schema of a slot read: ``_seq`` then the slot's columns."""
    if SEQ_COLUMN in columns.names:
        raise BadArgument(f"the slot has a column named {SEQ_COLUMN!r}, which tidelog adds")
    return pa.schema([pa.field(SEQ_COLUMN, pa.int64()), *columns])


def _conform(column: pa.Array | None, n: int, target: pa.DataType) -> pa.Array:
    if column is None:
        return pa.nulls(n, target)
    if column.type.equals(target):
        return column
    if pa.types.is_dictionary(column.type):
        column = column.dictionary_decode()
    try:
        return column.cast(target)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
        raise BadArgument(
            f"cannot convert a {column.type} column to {target} ({exc}); the slot's schema "
            "drifted past the sampled one: give the reader an explicit .schema(...)"
        ) from None


def slot_batch(seq: int, batch: pa.RecordBatch, target: pa.Schema) -> pa.RecordBatch:
    """One bundle slot's batch shaped to the DataFrame's Arrow schema ``target`` (``_seq``
    first): missing columns become nulls, types convert, unknown columns are an error."""
    n = batch.num_rows
    extra = [name for name in batch.schema.names if target.get_field_index(name) < 0]
    if extra:
        raise BadArgument(
            f"bundle seq {seq}: columns {extra} are not in the read schema (drift past the "
            "sampled bundles); give the reader an explicit .schema(...) or raise sampleBundles"
        )
    arrays = [pa.repeat(pa.scalar(seq, pa.int64()), n)]
    for f in list(target)[1:]:
        idx = batch.schema.get_field_index(f.name)
        arrays.append(_conform(batch.column(idx) if idx >= 0 else None, n, f.type))
    return pa.RecordBatch.from_arrays(arrays, schema=target)


def bundle_slot(payload: bytes, seq: int, slot: int) -> pa.RecordBatch | None:
    try:
        return decode_bundle(payload).get(slot)
    except TidelogError as exc:
        raise type(exc)(f"seq {seq}: {exc.message}") from None


# -- writers --------------------------------------------------------------------------------------
_STAGED = pa.schema(
    [pa.field("payload", pa.binary()), pa.field("tag", pa.string()), pa.field("node", pa.string())]
)


def staged_table(batch: pa.RecordBatch, slot: int | None) -> pa.RecordBatch:
    """A DataFrame batch as the rows of a staged file (XPR-4: payload binary, tag string, node
    string). With ``slot``, the whole batch becomes one bundle record in that slot."""
    if slot is not None:
        from tidelog.bundle import RecordBundle, encode_bundle

        encoded = encode_bundle(RecordBundle({slot: batch}))
        return pa.RecordBatch.from_arrays(
            [pa.array([encoded], pa.binary()), pa.nulls(1, pa.string()), pa.nulls(1, pa.string())],
            schema=_STAGED,
        )
    names = batch.schema.names
    if "payload" not in names:
        raise BadArgument(
            f"writing to tidelog needs a 'payload' column (binary or string); got {names}"
            " (or option slot=N to store each batch as a bundle)"
        )
    payload: Any = batch.column(names.index("payload"))
    if payload.null_count:
        raise BadArgument("column 'payload' holds nulls; every record needs a payload")
    columns = [payload.cast(pa.binary())]
    for name in ("tag", "node"):
        if name in names:
            columns.append(batch.column(names.index(name)).cast(pa.string()))
        else:
            columns.append(pa.nulls(batch.num_rows, pa.string()))
    return pa.RecordBatch.from_arrays(columns, schema=_STAGED)
