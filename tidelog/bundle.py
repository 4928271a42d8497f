"""Arrow RecordBundles and their record payload encoding (spec/BUNDLES.md BND).

A ``RecordBundle`` is a fixed set of up to 64 optional *slots*; each present slot holds one
``pyarrow.RecordBatch``. Slots are how one logical arrival carries several tables with unrelated
schemas (Quiver: Logs, LogAttrs, ResourceAttrs, ...). A bundle is stored as one tidelog record
whose payload is Quiver's WAL entry body (slot bitmap, per-slot metadata, one Arrow IPC
*stream* per slot) behind a small tidelog header (BND-1..BND-8).

The per-slot IPC stream is written and read by Arrow itself, so the schema comes back exactly:
dictionary key types (``int8`` stays ``int8``), field metadata, nullability and schema
metadata. Nothing is unified across bundles, so the schema of a slot may drift freely from one
bundle to the next (BND-7).

pyarrow is imported lazily by the functions that need it: ``import tidelog`` stays light.
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any, NamedTuple

from .errors import BadArgument, Corrupt

if TYPE_CHECKING:
    import pyarrow as pa

__all__ = [
    "MAGIC",
    "VERSION",
    "HEADER_SIZE",
    "SLOT_META_SIZE",
    "MAX_SLOTS",
    "RecordBundle",
    "BundleRecord",
    "SlotMeta",
    "encode_bundle",
    "decode_bundle",
    "read_slot_metas",
    "is_bundle",
    "schema_fingerprint",
    "message_fingerprint",
    "first_message",
    "HEADER_STRUCT",
    "SLOT_META_STRUCT",
]

MAGIC = b"TDLB"
VERSION = 1
#: magic(4) | version u16 | header_size u16 | slot_bitmap u64 (BND-1, BND-2)
HEADER_SIZE = 16
HEADER_STRUCT = struct.Struct("<4sHHQ")
#: payload_type_id u16 | schema_fingerprint [32] | row_count u32 | payload_len u32 (BND-3)
SLOT_META_STRUCT = struct.Struct("<H32sII")
SLOT_META_SIZE = SLOT_META_STRUCT.size  # 42
MAX_SLOTS = 64  # one u64 bitmap (BND-2)
_U32 = (1 << 32) - 1
_CONTINUATION = b"\xff\xff\xff\xff"


class SlotMeta(NamedTuple):
    """The metadata block of one present slot (BND-3)."""

    slot: int
    payload_type_id: int
    schema_fingerprint: bytes
    row_count: int
    payload_offset: int  # where the slot's IPC stream starts in the payload
    payload_len: int


class RecordBundle:
    """Up to 64 optional slots, each a ``pyarrow.RecordBatch``.

    ``RecordBundle({0: logs, 2: attrs})`` or ``RecordBundle([logs, None, attrs])``. Each present
    slot also has a ``payload_type_id`` (u16; Quiver's payload kind for the slot), by default the
    slot number. Bundles compare equal when the same slots are present with the same payload
    types and equal batches *including* their schemas (dictionary key types, metadata).
    """

    __slots__ = ("_slots", "_types")

    def __init__(
        self,
        slots: Mapping[int, pa.RecordBatch | None] | Iterable[pa.RecordBatch | None] = (),
        *,
        payload_types: Mapping[int, int] | None = None,
    ) -> None:
        import pyarrow as pa

        items = slots.items() if isinstance(slots, Mapping) else enumerate(slots)
        present: dict[int, pa.RecordBatch] = {}
        for slot, batch in items:
            _check_slot(slot)
            if batch is None:
                continue
            if not isinstance(batch, pa.RecordBatch):
                raise BadArgument(
                    f"bundle slot {slot} must be a pyarrow.RecordBatch or None, "
                    f"got {type(batch).__name__}"
                )
            if batch.num_rows > _U32:
                raise BadArgument(f"bundle slot {slot} has {batch.num_rows} rows; at most {_U32}")
            present[slot] = batch
        types: dict[int, int] = {}
        for slot, tid in (payload_types or {}).items():
            if slot not in present:
                raise BadArgument(f"payload type given for slot {slot}, which has no batch")
            if isinstance(tid, bool) or not isinstance(tid, int) or not 0 <= tid <= 0xFFFF:
                raise BadArgument(f"payload_type_id of slot {slot} must be a u16, got {tid!r}")
            types[slot] = tid
        self._slots = dict(sorted(present.items()))
        self._types = types

    # -- access ----------------------------------------------------------------------------
    def __getitem__(self, slot: int) -> pa.RecordBatch | None:
        _check_slot(slot)
        return self._slots.get(slot)

    def get(self, slot: int) -> pa.RecordBatch | None:
        return self._slots.get(slot)

    @property
    def slots(self) -> dict[int, pa.RecordBatch]:
        """Present slots, ascending (a copy)."""
        return dict(self._slots)

    def present(self) -> list[int]:
        return list(self._slots)

    @property
    def bitmap(self) -> int:
        out = 0
        for slot in self._slots:
            out |= 1 << slot
        return out

    def payload_type(self, slot: int) -> int:
        if slot not in self._slots:
            raise BadArgument(f"bundle slot {slot} is absent")
        return self._types.get(slot, slot)

    def row_count(self, slot: int) -> int:
        batch = self._slots.get(slot)
        return 0 if batch is None else batch.num_rows

    @property
    def num_rows(self) -> int:
        return sum(b.num_rows for b in self._slots.values())

    def __len__(self) -> int:
        return len(self._slots)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, RecordBundle):
            return NotImplemented
        if list(self._slots) != list(other._slots):
            return False
        for slot, batch in self._slots.items():
            theirs = other._slots[slot]
            if self.payload_type(slot) != other.payload_type(slot):
                return False
            if not batch.schema.equals(theirs.schema, check_metadata=True):
                return False
            if not batch.equals(theirs):
                return False
        return True

    __hash__ = None  # type: ignore[assignment]  # mutable-ish contents (Arrow batches)

    def __repr__(self) -> str:
        parts = ", ".join(f"{s}: {b.num_rows} rows" for s, b in self._slots.items())
        return f"RecordBundle({{{parts}}})"


class BundleRecord(NamedTuple):
    """A record of a bundle topic with its payload decoded (``Topic.read_bundles``)."""

    seq: int
    ts: int
    tag: str | None
    node: str | None
    bundle: RecordBundle


def _check_slot(slot: object) -> None:
    if isinstance(slot, bool) or not isinstance(slot, int) or not 0 <= slot < MAX_SLOTS:
        raise BadArgument(f"bundle slot must be an integer in 0..{MAX_SLOTS - 1}, got {slot!r}")


# -- fingerprints ----------------------------------------------------------------------------
def first_message(stream: memoryview | bytes) -> memoryview:
    """The bytes of the first encapsulated IPC message (the schema) of an IPC stream: optional
    continuation marker, int32 metadata length, metadata (padded). A schema message has no
    body. Raises ValueError when the bytes cannot hold one."""
    view = memoryview(stream).cast("B")
    if len(view) >= 8 and bytes(view[:4]) == _CONTINUATION:
        start = 8
        (length,) = struct.unpack_from("<i", view, 4)
    elif len(view) >= 4:  # pre-1.0 framing: no continuation marker
        start = 4
        (length,) = struct.unpack_from("<i", view, 0)
    else:
        raise ValueError("too short for an IPC message")
    if length <= 0 or start + length > len(view):
        raise ValueError(f"bad IPC schema message length {length}")
    return view[: start + length]


def message_fingerprint(stream: memoryview | bytes) -> bytes:
    """BND-4: SHA-256 of the encapsulated schema message at the start of an IPC stream."""
    return hashlib.sha256(first_message(stream)).digest()


def schema_fingerprint(schema: pa.Schema) -> bytes:
    """BND-4: SHA-256 of ``schema.serialize()`` (the encapsulated IPC schema message, exactly
    the bytes an IPC stream of this schema starts with)."""
    return hashlib.sha256(schema.serialize()).digest()


# -- encoding --------------------------------------------------------------------------------
def _ipc_stream(batch: pa.RecordBatch) -> pa.Buffer:
    import pyarrow as pa

    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, batch.schema) as writer:
        writer.write_batch(batch)
    return sink.getvalue()


def encode_bundle(bundle: RecordBundle) -> bytes:
    """A bundle as a record payload (BND-1..BND-5): header, then per present slot (ascending)
    its metadata block and its Arrow IPC stream."""
    if not isinstance(bundle, RecordBundle):
        raise BadArgument(f"expected a RecordBundle, got {type(bundle).__name__}")
    header = HEADER_STRUCT.pack(MAGIC, VERSION, HEADER_SIZE, bundle.bitmap)
    parts: list[bytes | pa.Buffer] = [header]
    for slot, batch in bundle.slots.items():
        stream = _ipc_stream(batch)
        if stream.size > _U32:
            raise BadArgument(f"bundle slot {slot} encodes to {stream.size} bytes; at most {_U32}")
        fingerprint = message_fingerprint(memoryview(stream))
        meta = (bundle.payload_type(slot), fingerprint, batch.num_rows, stream.size)
        parts.append(SLOT_META_STRUCT.pack(*meta))
        parts.append(stream)
    return b"".join(parts)  # pa.Buffer supports the buffer protocol


# -- decoding --------------------------------------------------------------------------------
def is_bundle(payload: bytes | bytearray | memoryview) -> bool:
    """True when ``payload`` starts with the bundle magic and a known version (a cheap probe,
    not a validation: ``decode_bundle`` checks the rest)."""
    view = _bytes_view(payload)
    return (
        len(view) >= 6
        and bytes(view[:4]) == MAGIC
        and struct.unpack_from("<H", view, 4)[0] == VERSION
    )


def _bytes_view(payload: object) -> memoryview:
    if isinstance(payload, (bytes, bytearray, memoryview)):
        return memoryview(payload).cast("B")
    try:
        import pyarrow as pa

        if isinstance(payload, pa.Buffer):
            return memoryview(payload).cast("B")
    except ImportError:  # pragma: no cover - pyarrow is a dependency
        pass
    raise BadArgument(f"a bundle payload is bytes-like, got {type(payload).__name__}")


def read_slot_metas(payload: bytes | bytearray | memoryview) -> list[SlotMeta]:
    """Parse and bounds-check the header and every slot metadata block, without decoding any
    Arrow data (BND-1..BND-3, BND-5). Raises ``Corrupt`` naming the rule broken."""
    view = _bytes_view(payload)
    if len(view) < HEADER_SIZE:
        raise Corrupt(f"bundle payload of {len(view)} bytes is shorter than its header (BND-1)")
    magic, version, header_size, bitmap = HEADER_STRUCT.unpack_from(view, 0)
    if magic != MAGIC:
        raise Corrupt(f"not a bundle payload: magic {bytes(magic)!r}, expected {MAGIC!r} (BND-1)")
    if version != VERSION:
        raise Corrupt(f"bundle payload version {version} is not supported (only {VERSION}) (BND-1)")
    if header_size < HEADER_SIZE or header_size > len(view):
        raise Corrupt(f"bundle header_size {header_size} is invalid (BND-1)")
    metas: list[SlotMeta] = []
    off = header_size
    for slot in range(MAX_SLOTS):
        if not bitmap >> slot & 1:
            continue
        if off + SLOT_META_SIZE > len(view):
            raise Corrupt(f"bundle slot {slot}: metadata block runs past the payload (BND-3)")
        type_id, fingerprint, rows, length = SLOT_META_STRUCT.unpack_from(view, off)
        off += SLOT_META_SIZE
        if off + length > len(view):
            raise Corrupt(
                f"bundle slot {slot}: payload_len {length} runs past the payload "
                f"({len(view) - off} bytes left) (BND-3)"
            )
        metas.append(SlotMeta(slot, type_id, bytes(fingerprint), rows, off, length))
        off += length
    if off != len(view):
        raise Corrupt(f"bundle payload has {len(view) - off} trailing bytes (BND-5)")
    return metas


def _read_slot(buf: pa.Buffer, meta: SlotMeta) -> pa.RecordBatch:
    import pyarrow as pa

    stream = buf.slice(meta.payload_offset, meta.payload_len)
    where = f"bundle slot {meta.slot}"
    try:
        fingerprint = message_fingerprint(memoryview(stream))
    except ValueError as exc:
        raise Corrupt(f"{where}: no Arrow IPC schema message ({exc}) (BND-6)") from None
    if fingerprint != meta.schema_fingerprint:
        raise Corrupt(f"{where}: schema fingerprint mismatch (BND-4)")
    try:
        reader = pa.ipc.open_stream(stream)
        batches = list(reader)
    except (pa.ArrowException, ValueError, OSError) as exc:
        raise Corrupt(f"{where}: bad Arrow IPC stream: {exc} (BND-6)") from None
    if len(batches) != 1:
        raise Corrupt(f"{where}: IPC stream holds {len(batches)} batches, expected 1 (BND-6)")
    batch = batches[0]
    if batch.num_rows != meta.row_count:
        raise Corrupt(
            f"{where}: {batch.num_rows} rows decoded, metadata says {meta.row_count} (BND-3)"
        )
    return batch


def decode_bundle(payload: Any) -> RecordBundle:
    """Decode a payload written by ``encode_bundle``. The batches reference ``payload``'s memory
    where Arrow can (no copy). Garbage raises ``Corrupt`` (never returns a wrong bundle)."""
    import pyarrow as pa

    view = _bytes_view(payload)
    metas = read_slot_metas(view)
    buf = payload if isinstance(payload, pa.Buffer) else pa.py_buffer(view)
    slots = {m.slot: _read_slot(buf, m) for m in metas}
    types = {m.slot: m.payload_type_id for m in metas if m.payload_type_id != m.slot}
    return RecordBundle(slots, payload_types=types)
