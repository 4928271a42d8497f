"""Quiver segment files (``.qseg``, spec/BUNDLES.md QSEG).

A pure codec: ``build_qseg`` turns consecutive bundle records into the bytes of one sealed
segment, ``open_qseg`` validates such bytes (a ``bytes``, ``memoryview``, mmap or
``pyarrow.Buffer``) and returns a ``QsegReader`` that hands out bundles and per-slot Arrow
batches **without copying**: every batch's buffers point into the segment's memory.

Layout (QSEG-1..QSEG-9)::

    stream data region   one Arrow IPC *file* per stream, each starting on a 64-byte boundary
    stream directory     Arrow IPC stream, one batch, one row per stream      (64-byte aligned)
    batch manifest       Arrow IPC stream, one batch, one row per bundle      (64-byte aligned)
    footer v1 (34 B)     version u16, stream_count u32, bundle_count u32,
                         directory_offset u64, directory_length u32,
                         manifest_offset u64, manifest_length u32
    trailer (16 B)       footer_size u32, magic "QUIVER\\0S", crc32 u32 (IEEE, whole file
                         except the crc field)

A stream holds the chunks (batches) of one (slot, payload type, schema fingerprint) key that
share the same dictionaries; a chunk with different dictionary values opens a new stream for
the same key (QSEG-4; the Arrow IPC file format cannot replace a dictionary, and unifying them
would change key types, which QSEG-4 forbids).
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import pyarrow as pa
import pyarrow.ipc as ipc

from tidelog.bundle import (
    HEADER_SIZE,
    HEADER_STRUCT,
    SLOT_META_SIZE,
    SLOT_META_STRUCT,
    BundleRecord,
    RecordBundle,
    decode_bundle,
    encode_bundle,
    first_message,
    message_fingerprint,
    schema_fingerprint,
)
from tidelog.bundle import MAGIC as BUNDLE_MAGIC
from tidelog.errors import BadArgument, Corrupt

from . import parse_qseg_name, qseg_name

__all__ = [
    "MAGIC",
    "FOOTER_VERSION",
    "FOOTER_V1_SIZE",
    "TRAILER_SIZE",
    "ALIGN",
    "DIRECTORY_SCHEMA",
    "MANIFEST_SCHEMA",
    "QsegError",
    "Truncated",
    "InvalidFormat",
    "ChecksumMismatch",
    "ArrowError",
    "StreamNotFound",
    "SlotNotInBundle",
    "StreamInfo",
    "QsegReader",
    "build_qseg",
    "open_qseg",
    "open_qseg_file",
    "qseg_name",
    "parse_qseg_name",
]

MAGIC = b"QUIVER\x00S"
FOOTER_VERSION = 1
_FOOTER_V1 = struct.Struct("<HIIQIQI")
FOOTER_V1_SIZE = _FOOTER_V1.size  # 34
_TRAILER = struct.Struct("<I8sI")
TRAILER_SIZE = _TRAILER.size  # 16
ALIGN = 64
_ARROW_FILE_MAGIC = b"ARROW1"
_U32 = (1 << 32) - 1

_REF = pa.struct(
    [
        pa.field("slot_id", pa.uint16(), nullable=False),
        pa.field("stream_id", pa.uint32(), nullable=False),
        pa.field("chunk_index", pa.uint32(), nullable=False),
    ]
)
#: QSEG-5: one row per stream, stream_id == row number.
DIRECTORY_SCHEMA = pa.schema(
    [
        pa.field("stream_id", pa.uint32(), nullable=False),
        pa.field("slot_id", pa.uint16(), nullable=False),
        pa.field("payload_type_id", pa.uint16(), nullable=False),
        pa.field("schema_fingerprint", pa.binary(32), nullable=False),
        pa.field("byte_offset", pa.uint64(), nullable=False),
        pa.field("byte_length", pa.uint64(), nullable=False),
        pa.field("row_count", pa.uint64(), nullable=False),
        pa.field("chunk_count", pa.uint32(), nullable=False),
    ]
)
#: QSEG-6: one row per bundle, bundle_index == row number, seq == first_seq + bundle_index.
MANIFEST_SCHEMA = pa.schema(
    [
        pa.field("bundle_index", pa.uint32(), nullable=False),
        pa.field("seq", pa.uint64(), nullable=False),
        pa.field("ts", pa.int64()),
        pa.field("tag", pa.string()),
        pa.field("node", pa.string()),
        pa.field("slot_refs", pa.list_(pa.field("item", _REF, nullable=False))),
    ]
)


# -- errors (QSEG-7, QSEG-8) ---------------------------------------------------------------------
class QsegError(Corrupt):
    """A ``.qseg`` that cannot be trusted; ``kind`` is the error variant QSEG-7 names and
    ``rule`` the spec/BUNDLES.md rule broken. Callers skip the file (QSEG-7)."""

    kind = "Segment"

    def __init__(self, rule: str, detail: str) -> None:
        super().__init__(f"{self.kind}: {detail} ({rule})")
        self.rule = rule
        self.detail = detail


class Truncated(QsegError):
    kind = "Truncated"


class InvalidFormat(QsegError):
    kind = "InvalidFormat"


class ChecksumMismatch(QsegError):
    kind = "ChecksumMismatch"


class ArrowError(QsegError):
    kind = "Arrow"


class StreamNotFound(QsegError):
    kind = "StreamNotFound"


class SlotNotInBundle(BadArgument, LookupError):
    """Asked for a slot the bundle does not hold (``SlotNotInBundle``, QSEG-7): a caller
    error on a valid file, not corruption."""

    def __init__(self, bundle_index: int, slot: int) -> None:
        super().__init__(f"SlotNotInBundle: bundle {bundle_index} has no slot {slot} (QSEG-6)")
        self.bundle_index = bundle_index
        self.slot = slot


class StreamInfo(NamedTuple):
    """One row of the stream directory (QSEG-5)."""

    stream_id: int
    slot: int
    payload_type_id: int
    schema_fingerprint: bytes
    byte_offset: int
    byte_length: int
    row_count: int
    chunk_count: int


# -- building ----------------------------------------------------------------------------------
def _dictionaries(array: Any, out: list[pa.Array]) -> None:
    """Every dictionary inside ``array`` (nested types included), in a fixed order."""
    t = array.type
    if pa.types.is_dictionary(t):
        out.append(array.dictionary)
        _dictionaries(array.dictionary, out)
        return
    if pa.types.is_struct(t):
        for i in range(t.num_fields):
            _dictionaries(array.field(i), out)
    elif pa.types.is_map(t):
        _dictionaries(array.keys, out)
        _dictionaries(array.items, out)
    elif (
        pa.types.is_list(t)
        or pa.types.is_large_list(t)
        or pa.types.is_fixed_size_list(t)
        or getattr(pa.types, "is_list_view", lambda _: False)(t)
        or getattr(pa.types, "is_large_list_view", lambda _: False)(t)
    ):
        _dictionaries(array.values, out)
    elif pa.types.is_union(t):
        for i in range(t.num_fields):
            _dictionaries(array.field(i), out)


def _batch_dictionaries(batch: pa.RecordBatch) -> list[pa.Array]:
    out: list[pa.Array] = []
    for column in batch.columns:
        _dictionaries(column, out)
    return out


def _same_dictionaries(a: list[pa.Array], b: list[pa.Array]) -> bool:
    return len(a) == len(b) and all(x.equals(y) for x, y in zip(a, b))


@dataclass
class _Run:
    """Chunks that will form one stream: same key, same dictionaries."""

    key: tuple[int, int, bytes]  # slot, payload type, fingerprint
    dicts: list[pa.Array]
    chunks: list[tuple[int, pa.RecordBatch]]  # (bundle index, batch)


def _encode_file(schema: pa.Schema, batches: Sequence[pa.RecordBatch]) -> pa.Buffer:
    sink = pa.BufferOutputStream()
    with ipc.new_file(sink, schema) as writer:
        for batch in batches:
            writer.write_batch(batch)
    return sink.getvalue()


def _encode_stream(batch: pa.RecordBatch) -> pa.Buffer:
    sink = pa.BufferOutputStream()
    with ipc.new_stream(sink, batch.schema) as writer:
        writer.write_batch(batch)
    return sink.getvalue()


def _as_bundle(
    item: RecordBundle | bytes | bytearray | memoryview | None, i: int
) -> tuple[RecordBundle | None, bytes | None]:
    """(bundle, the payload bytes the segment must give back for it)."""
    if item is None:
        return None, None
    if isinstance(item, RecordBundle):
        return item, encode_bundle(item)
    if isinstance(item, (bytes, bytearray, memoryview)):
        return decode_bundle(item), bytes(item)
    raise BadArgument(f"bundle {i}: expected a RecordBundle, payload bytes or None")


def build_qseg(
    bundles: Sequence[RecordBundle | bytes | bytearray | memoryview | None],
    first_seq: int,
    *,
    tss: Sequence[int | None] | None = None,
    tags: Sequence[str | None] | None = None,
    nodes: Sequence[str | None] | None = None,
) -> bytes:
    """The bytes of a ``.qseg`` holding ``bundles`` as seqs ``first_seq, first_seq + 1, ...``.

    An entry may be a ``RecordBundle``, an encoded bundle payload (BND), or ``None`` for a seq
    with no live record (its manifest row has null ``slot_refs``). ``tss`` / ``tags`` /
    ``nodes`` carry the records' labels (QSEG-6), default null.
    """
    if isinstance(first_seq, bool) or not isinstance(first_seq, int) or first_seq < 1:
        raise BadArgument(f"first_seq must be an integer >= 1, got {first_seq!r}")
    n = len(bundles)
    if n == 0:
        raise BadArgument("a segment holds at least one bundle")
    if n > _U32:
        raise BadArgument(f"{n} bundles; a segment holds at most {_U32}")
    for name, column in (("tss", tss), ("tags", tags), ("nodes", nodes)):
        if column is not None and len(column) != n:
            raise BadArgument(f"{name} has {len(column)} entries for {n} bundles")
    pairs = [_as_bundle(b, i) for i, b in enumerate(bundles)]
    decoded = [bundle for bundle, _ in pairs]

    # Group chunks into runs, in arrival order; a key's open run closes when a chunk brings
    # different dictionaries (QSEG-4).
    runs: list[_Run] = []
    open_run: dict[tuple[int, int, bytes], _Run] = {}
    for i, bundle in enumerate(decoded):
        if bundle is None:
            continue
        for slot, batch in bundle.slots.items():
            key = (slot, bundle.payload_type(slot), schema_fingerprint(batch.schema))
            dicts = _batch_dictionaries(batch)
            run = open_run.get(key)
            if run is None or not _same_dictionaries(run.dicts, dicts):
                run = _Run(key, dicts, [])
                runs.append(run)
                open_run[key] = run
            run.chunks.append((i, batch))

    # Encode each run; a run Arrow refuses (a dictionary our walk did not see) is split into
    # one stream per chunk, which the file format always accepts.
    encoded: list[tuple[_Run, pa.Buffer]] = []
    for run in runs:
        schema = run.chunks[0][1].schema
        try:
            encoded.append((run, _encode_file(schema, [b for _, b in run.chunks])))
        except pa.ArrowInvalid:
            for chunk in run.chunks:
                single = _Run(run.key, run.dicts, [chunk])
                encoded.append((single, _encode_file(schema, [chunk[1]])))
    encoded.sort(key=lambda e: (e[0].chunks[0][0], e[0].key[0]))

    parts: list[bytes | pa.Buffer] = []
    size = 0

    def put(data: bytes | pa.Buffer) -> int:
        nonlocal size
        pad = -size % ALIGN
        if pad:
            parts.append(b"\x00" * pad)
            size += pad
        at = size
        parts.append(data)
        size += len(data) if isinstance(data, bytes) else data.size
        return at

    refs: list[list[dict[str, int]]] = [[] for _ in range(n)]
    directory: dict[str, list[Any]] = {f.name: [] for f in DIRECTORY_SCHEMA}
    for stream_id, (run, data) in enumerate(encoded):
        offset = put(data)
        slot, type_id, fingerprint = run.key
        for chunk_index, (i, _) in enumerate(run.chunks):
            refs[i].append({"slot_id": slot, "stream_id": stream_id, "chunk_index": chunk_index})
        for name, value in (
            ("stream_id", stream_id),
            ("slot_id", slot),
            ("payload_type_id", type_id),
            ("schema_fingerprint", fingerprint),
            ("byte_offset", offset),
            ("byte_length", data.size),
            ("row_count", sum(b.num_rows for _, b in run.chunks)),
            ("chunk_count", len(run.chunks)),
        ):
            directory[name].append(value)
    for r in refs:
        r.sort(key=lambda ref: ref["slot_id"])

    dir_bytes = _encode_stream(pa.record_batch(directory, schema=DIRECTORY_SCHEMA))
    manifest = pa.record_batch(
        {
            "bundle_index": list(range(n)),
            "seq": [first_seq + i for i in range(n)],
            "ts": list(tss) if tss is not None else [None] * n,
            "tag": list(tags) if tags is not None else [None] * n,
            "node": list(nodes) if nodes is not None else [None] * n,
            "slot_refs": [None if decoded[i] is None else refs[i] for i in range(n)],
        },
        schema=MANIFEST_SCHEMA,
    )
    man_bytes = _encode_stream(manifest)
    if dir_bytes.size > _U32 or man_bytes.size > _U32:
        raise BadArgument("segment directory or manifest above 4 GiB")
    dir_off = put(dir_bytes)
    man_off = put(man_bytes)
    footer = _FOOTER_V1.pack(
        FOOTER_VERSION, len(encoded), n, dir_off, dir_bytes.size, man_off, man_bytes.size
    )
    head = b"".join(parts) + footer + struct.pack("<I", len(footer)) + MAGIC
    built = head + struct.pack("<I", zlib.crc32(head))
    # QSEG-9: every record must come back byte-identical (TOP-5) from the stored messages
    reader = open_qseg(built)
    for i, (_, payload) in enumerate(pairs):
        if payload is not None and reader.payload(i) != payload:
            raise BadArgument(
                f"bundle {i}: its payload is not what the segment's Arrow messages reassemble "
                "to (written by another Arrow encoder?); seal it in a plain segment (QSEG-9)"
            )
    return built


# -- reading -----------------------------------------------------------------------------------
def _read_ipc_stream(buf: pa.Buffer, what: str, schema: pa.Schema) -> pa.RecordBatch:
    try:
        batches = list(ipc.open_stream(buf))
    except (pa.ArrowException, ValueError, OSError) as exc:
        raise ArrowError("QSEG-5", f"{what}: bad Arrow IPC stream: {exc}") from None
    if len(batches) != 1:
        raise InvalidFormat("QSEG-5", f"{what}: {len(batches)} batches, expected 1")
    batch = batches[0]
    if not batch.schema.equals(schema):
        raise InvalidFormat("QSEG-5", f"{what}: unexpected schema {batch.schema}")
    return batch


_EOS = b"\xff\xff\xff\xff\x00\x00\x00\x00"  # IPC end-of-stream marker (continuation, 0)
_BLOCK = struct.Struct("<qi4xq")  # Arrow File.fbs struct Block: offset, metaDataLength, bodyLength


class _Parts(NamedTuple):
    """Where one stream's IPC messages lie in the segment (absolute (offset, length) pairs),
    read from the Arrow file's own footer: what a chunk's standalone IPC stream is made of."""

    schema: tuple[int, int]
    dictionaries: list[tuple[int, int]]
    batches: list[tuple[int, int]]
    rows: list[int]


def _file_blocks(
    view: memoryview, base: int, where: str
) -> tuple[list[tuple[int, int]], list[tuple[int, int]]]:
    """The dictionary and record batch message ranges of the Arrow IPC file ``view`` (which
    starts at ``base`` in the segment), from its footer (Arrow File.fbs: a flatbuffer ``Footer``
    whose fields 2 and 3 are vectors of ``Block``). Raises ArrowError on anything malformed."""
    size = len(view)

    def fail(detail: str) -> ArrowError:
        return ArrowError("QSEG-2", f"{where}: Arrow file footer: {detail}")

    if size < 18 or bytes(view[size - 6 :]) != _ARROW_FILE_MAGIC:
        raise fail("no trailing ARROW1 magic")
    (flen,) = struct.unpack_from("<i", view, size - 10)
    start = size - 10 - flen
    if flen < 8 or start < 8:
        raise fail(f"length {flen} does not fit")
    fb = view[start : size - 10]

    def u32(at: int) -> int:
        if not 0 <= at <= len(fb) - 4:
            raise fail("offset outside the footer")
        return int(struct.unpack_from("<I", fb, at)[0])

    root = u32(0)
    vtable = root - struct.unpack_from("<i", fb, root)[0] if root <= len(fb) - 4 else -1
    if not 0 <= vtable <= len(fb) - 4:
        raise fail("bad root table")
    vt_size = struct.unpack_from("<H", fb, vtable)[0]

    def blocks(field: int) -> list[tuple[int, int]]:
        slot = 4 + 2 * field
        if slot + 2 > vt_size or vtable + slot + 2 > len(fb):
            return []
        rel = struct.unpack_from("<H", fb, vtable + slot)[0]
        if not rel:
            return []
        at = root + rel
        vec = at + u32(at)
        n = u32(vec)
        if vec + 4 + n * _BLOCK.size > len(fb):
            raise fail("block vector runs past the footer")
        out = []
        for k in range(n):
            off, meta, body = _BLOCK.unpack_from(fb, vec + 4 + k * _BLOCK.size)
            if off < 8 or meta < 8 or body < 0 or off + meta + body > start:
                raise fail(f"block {k} at {off}+{meta}+{body} is outside the file")
            out.append((base + off, meta + body))
        return out

    return blocks(2), blocks(3)


class QsegReader:
    """A validated ``.qseg`` (everything is checked at open: a reader never meets corruption
    later). Bundle ``i`` is seq ``first_seq + i``. Batches reference the segment's buffer."""

    def __init__(self, buf: pa.Buffer) -> None:
        self.buffer = buf
        size = buf.size
        if size < TRAILER_SIZE:
            raise Truncated("QSEG-7", f"{size} bytes, shorter than the 16-byte trailer")
        view = memoryview(buf).cast("B")
        footer_size, magic, crc = _TRAILER.unpack_from(view, size - TRAILER_SIZE)
        if magic != MAGIC:
            raise InvalidFormat("QSEG-7", f"trailer magic {bytes(magic)!r}, expected {MAGIC!r}")
        if zlib.crc32(view[: size - 4]) != crc:
            raise ChecksumMismatch("QSEG-7", "crc32 of the file does not match the trailer")
        foot_at = size - TRAILER_SIZE - footer_size
        if footer_size < 2 or foot_at < 0:
            raise InvalidFormat("QSEG-8", f"footer_size {footer_size} does not fit the file")
        (version,) = struct.unpack_from("<H", view, foot_at)
        if version != FOOTER_VERSION:
            raise InvalidFormat("QSEG-8", f"footer version {version} is not supported (only 1)")
        if footer_size < FOOTER_V1_SIZE:
            raise InvalidFormat("QSEG-8", f"footer_size {footer_size} < {FOOTER_V1_SIZE} for v1")
        # v1 fields; bytes beyond them belong to a later minor extension and are ignored
        _, n_streams, n_bundles, dir_off, dir_len, man_off, man_len = _FOOTER_V1.unpack_from(
            view, foot_at
        )
        for what, off, length in (("directory", dir_off, dir_len), ("manifest", man_off, man_len)):
            if off % 8 or off + length > foot_at:
                raise InvalidFormat("QSEG-8", f"{what} at {off}+{length} is outside the file")
        self._dir = _read_ipc_stream(buf.slice(dir_off, dir_len), "directory", DIRECTORY_SCHEMA)
        self._man = _read_ipc_stream(buf.slice(man_off, man_len), "manifest", MANIFEST_SCHEMA)
        if self._dir.num_rows != n_streams or self._man.num_rows != n_bundles:
            raise InvalidFormat("QSEG-8", "footer counts disagree with directory / manifest")
        self.data_end = min(dir_off, man_off)
        self.streams = self._load_streams()
        self._parts: list[_Parts] = []
        self._readers = [self._open_stream(s) for s in self.streams]
        self._refs = self._load_manifest()
        man = self._man.to_pydict()
        self.first_seq: int = man["seq"][0] if n_bundles else 0
        self._tss: list[int | None] = man["ts"]
        self._tags: list[str | None] = man["tag"]
        self._nodes: list[str | None] = man["node"]

    # -- validation --------------------------------------------------------------------------
    def _load_streams(self) -> list[StreamInfo]:
        rows = self._dir.to_pydict()
        out: list[StreamInfo] = []
        end = 0
        for i in range(self._dir.num_rows):
            info = StreamInfo(*(rows[f.name][i] for f in DIRECTORY_SCHEMA))
            if info.stream_id != i:
                raise InvalidFormat("QSEG-5", f"directory row {i} has stream_id {info.stream_id}")
            if info.byte_offset % ALIGN:
                raise InvalidFormat("QSEG-3", f"stream {i} at {info.byte_offset} is not aligned")
            if info.byte_offset < end or info.byte_offset + info.byte_length > self.data_end:
                raise InvalidFormat("QSEG-3", f"stream {i} overlaps or leaves the data region")
            end = info.byte_offset + info.byte_length
            out.append(info)
        return out

    def _open_stream(self, info: StreamInfo) -> ipc.RecordBatchFileReader:
        where = f"stream {info.stream_id}"
        data = self.buffer.slice(info.byte_offset, info.byte_length)
        head = memoryview(data).cast("B")
        if bytes(head[:6]) != _ARROW_FILE_MAGIC:
            raise ArrowError("QSEG-2", f"{where} is not an Arrow IPC file")
        try:
            reader = ipc.open_file(data)
            rows = [reader.get_batch(k).num_rows for k in range(reader.num_record_batches)]
        except (pa.ArrowException, ValueError, OSError) as exc:
            raise ArrowError("QSEG-2", f"{where}: {exc}") from None
        try:
            schema_len = len(first_message(head[8:]))
            fingerprint = message_fingerprint(head[8:])
        except ValueError as exc:
            raise ArrowError("QSEG-2", f"{where}: {exc}") from None
        if fingerprint != info.schema_fingerprint:
            raise InvalidFormat("QSEG-4", f"{where}: schema fingerprint mismatch")
        if reader.num_record_batches != info.chunk_count or sum(rows) != info.row_count:
            raise InvalidFormat("QSEG-5", f"{where}: chunk or row count disagrees")
        dictionaries, batches = _file_blocks(head, info.byte_offset, where)
        if len(batches) != info.chunk_count:
            raise ArrowError("QSEG-2", f"{where}: footer lists {len(batches)} record batches")
        self._parts.append(_Parts((info.byte_offset + 8, schema_len), dictionaries, batches, rows))
        return reader

    def _load_manifest(self) -> list[list[tuple[int, int, int]] | None]:
        man = self._man.to_pydict()
        seen: set[tuple[int, int]] = set()
        first = man["seq"][0] if man["seq"] else 0
        out: list[list[tuple[int, int, int]] | None] = []
        for i in range(self._man.num_rows):
            if man["bundle_index"][i] != i or man["seq"][i] != first + i:
                raise InvalidFormat("QSEG-6", f"manifest row {i}: bundle_index/seq out of order")
            refs = man["slot_refs"][i]
            if refs is None:
                out.append(None)
                continue
            entry: list[tuple[int, int, int]] = []
            for ref in refs:
                slot, sid, chunk = ref["slot_id"], ref["stream_id"], ref["chunk_index"]
                if sid >= len(self.streams):
                    raise StreamNotFound("QSEG-6", f"bundle {i} names stream {sid}")
                info = self.streams[sid]
                if info.slot != slot or chunk >= info.chunk_count or (sid, chunk) in seen:
                    raise InvalidFormat("QSEG-6", f"bundle {i}: bad reference {ref}")
                if entry and slot <= entry[-1][0]:
                    raise InvalidFormat("QSEG-6", f"bundle {i}: slots not ascending")
                seen.add((sid, chunk))
                entry.append((slot, sid, chunk))
            out.append(entry)
        if len(seen) != sum(s.chunk_count for s in self.streams):
            raise InvalidFormat("QSEG-6", "a stream chunk belongs to no bundle")
        return out

    # -- access ------------------------------------------------------------------------------
    def __len__(self) -> int:
        return len(self._refs)

    @property
    def bundle_count(self) -> int:
        return len(self._refs)

    @property
    def last_seq(self) -> int:
        return self.first_seq + len(self._refs) - 1

    def _index(self, i: int) -> int:
        if isinstance(i, bool) or not isinstance(i, int) or not 0 <= i < len(self._refs):
            raise BadArgument(f"bundle index {i!r} outside 0..{len(self._refs) - 1}")
        return i

    def has_bundle(self, i: int) -> bool:
        return self._refs[self._index(i)] is not None

    def bundle(self, i: int) -> RecordBundle | None:
        """Bundle ``i`` exactly as appended (None where the seq had no live record)."""
        refs = self._refs[self._index(i)]
        if refs is None:
            return None
        slots = {slot: self._readers[sid].get_batch(chunk) for slot, sid, chunk in refs}
        types = {
            slot: self.streams[sid].payload_type_id
            for slot, sid, _ in refs
            if self.streams[sid].payload_type_id != slot
        }
        return RecordBundle(slots, payload_types=types)

    def record(self, i: int) -> BundleRecord | None:
        """Bundle ``i`` with its seq, ts, tag and node (QSEG-6)."""
        bundle = self.bundle(i)
        if bundle is None:
            return None
        ts = self._tss[i]
        return BundleRecord(
            self.first_seq + i, 0 if ts is None else ts, self._tags[i], self._nodes[i], bundle
        )

    def _slot_stream(self, sid: int, chunk: int) -> list[tuple[int, int]]:
        """The ranges that form chunk ``chunk`` of stream ``sid`` as a standalone IPC stream:
        schema message, dictionary messages, its record batch message (then end-of-stream)."""
        parts = self._parts[sid]
        return [parts.schema, *parts.dictionaries, parts.batches[chunk]]

    def payload_len(self, i: int) -> int | None:
        """Bytes of bundle ``i``'s record payload (BND layout), without building it."""
        refs = self._refs[self._index(i)]
        if refs is None:
            return None
        n = HEADER_SIZE
        for _, sid, chunk in refs:
            n += SLOT_META_SIZE + sum(ln for _, ln in self._slot_stream(sid, chunk)) + len(_EOS)
        return n

    def payload(self, i: int) -> bytes | None:
        """The record payload of bundle ``i``, byte-identical to what was appended (QSEG-9):
        reassembled from the stored Arrow messages (no Arrow decoding or re-encoding, so it
        does not depend on the Arrow version reading it)."""
        refs = self._refs[self._index(i)]
        if refs is None:
            return None
        view = memoryview(self.buffer).cast("B")
        bitmap = 0
        for slot, _, _ in refs:
            bitmap |= 1 << slot
        out: list[bytes | memoryview] = [HEADER_STRUCT.pack(BUNDLE_MAGIC, 1, HEADER_SIZE, bitmap)]
        for _, sid, chunk in refs:
            info, ranges = self.streams[sid], self._slot_stream(sid, chunk)
            length = sum(ln for _, ln in ranges) + len(_EOS)
            rows = self._parts[sid].rows[chunk]
            out.append(
                SLOT_META_STRUCT.pack(info.payload_type_id, info.schema_fingerprint, rows, length)
            )
            out += [view[off : off + ln] for off, ln in ranges]
            out.append(_EOS)
        return b"".join(out)

    def labels(self, i: int) -> tuple[int | None, str | None, str | None]:
        """(ts, tag, node) of entry ``i`` without touching Arrow data."""
        self._index(i)
        return self._tss[i], self._tags[i], self._nodes[i]

    def slot_chunk(self, i: int, slot: int) -> pa.RecordBatch:
        refs = self._refs[self._index(i)] or []
        for s, sid, chunk in refs:
            if s == slot:
                return self._readers[sid].get_batch(chunk)
        raise SlotNotInBundle(i, slot)

    def slot_batches(self, slot: int) -> list[pa.RecordBatch]:
        """Every batch of ``slot``, in bundle order, zero-copy (schemas may differ: drift)."""
        return [b for _, b in self.iter_slot(slot)]

    def iter_slot(self, slot: int) -> Iterator[tuple[int, pa.RecordBatch]]:
        """(bundle index, batch) of every bundle holding ``slot``, in bundle order."""
        for i, refs in enumerate(self._refs):
            for s, sid, chunk in refs or ():
                if s == slot:
                    yield i, self._readers[sid].get_batch(chunk)

    def slot_streams(self, slot: int) -> list[tuple[StreamInfo, ipc.RecordBatchFileReader]]:
        """The streams of ``slot`` with their Arrow file readers (bulk columnar access)."""
        return [(s, self._readers[s.stream_id]) for s in self.streams if s.slot == slot]


def open_qseg(buf: Any) -> QsegReader:
    """Validate and open a ``.qseg`` held in memory (bytes, memoryview, mmap, pyarrow.Buffer).
    Raises a ``QsegError`` subclass (all ``Corrupt``) on a damaged file (QSEG-7)."""
    if not isinstance(buf, pa.Buffer):
        try:
            buf = pa.py_buffer(buf)
        except TypeError:
            what = type(buf).__name__
            raise BadArgument(f"open_qseg needs a bytes-like buffer, got {what}") from None
    return QsegReader(buf)


def open_qseg_file(path: str) -> QsegReader:
    """Open a sealed ``.qseg`` through mmap: batches point into the mapped file (zero-copy)."""
    with pa.memory_map(path, "r") as source:
        buf = source.read_buffer()
    return QsegReader(buf)
