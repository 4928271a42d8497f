"""Server response frames and handshake headers (FWD-3..FWD-7, FWD-9).

Every response starts with a status byte: ``0x00`` OK (sequence + per-table seqTxns), ``0x02``
durable ack (per-table seqTxns, no sequence), anything else an error frame (sequence + a UTF-8
message of at most 1024 bytes). All integers little-endian. ``decode`` raises ``WireError`` for
a frame that does not parse: the loop treats that as a transient frame-decode error (§13.3).
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Final

__all__ = [
    "QWP_VERSION",
    "STATUS_OK",
    "STATUS_DURABLE_ACK",
    "MAX_ERROR_MESSAGE",
    "H_MAX_VERSION",
    "H_CLIENT_ID",
    "H_REQUEST_DURABLE_ACK",
    "H_VERSION",
    "H_DURABLE_ACK",
    "H_FSN_AT_ZERO",
    "H_LAST_FSN",
    "Ok",
    "DurableAck",
    "ErrorFrame",
    "Response",
    "WireError",
    "encode_ok",
    "encode_durable_ack",
    "encode_error",
    "decode",
]

QWP_VERSION: Final = 1  # the only QWP version tidelog speaks (FWD-3)
STATUS_OK: Final = 0x00
STATUS_DURABLE_ACK: Final = 0x02
MAX_ERROR_MESSAGE: Final = 1024

# Request headers (FWD-3)
H_MAX_VERSION: Final = "X-QWP-Max-Version"
H_CLIENT_ID: Final = "X-QWP-Client-Id"
H_REQUEST_DURABLE_ACK: Final = "X-QWP-Request-Durable-Ack"
# Response headers
H_VERSION: Final = "X-QWP-Version"
H_DURABLE_ACK: Final = "X-QWP-Durable-Ack"
# tidelog extensions (FWD-19, FWD-21): the FSN of wire sequence 0 on this connection, sent by
# the forwarder so the receiver can de-duplicate by FSN; and the receiver's highest stored FSN
# for the client id, echoed so a sender whose numbering went backwards fails loudly.
H_FSN_AT_ZERO: Final = "X-Tidelog-Fsn-At-Zero"
H_LAST_FSN: Final = "X-Tidelog-Last-Fsn"

_SEQ: Final = struct.Struct("<q")
_U16: Final = struct.Struct("<H")


class WireError(ValueError):
    """A response frame that does not parse."""


@dataclass(frozen=True)
class Ok:
    sequence: int
    tables: Mapping[str, int] = field(default_factory=dict)


@dataclass(frozen=True)
class DurableAck:
    tables: Mapping[str, int] = field(default_factory=dict)


@dataclass(frozen=True)
class ErrorFrame:
    status: int
    sequence: int
    message: str


Response = Ok | DurableAck | ErrorFrame


def _tables(tables: Mapping[str, int] | Iterable[tuple[str, int]]) -> bytes:
    items = list(tables.items()) if isinstance(tables, Mapping) else list(tables)
    if len(items) > 0xFFFF:
        raise ValueError(f"{len(items)} tables do not fit a uint16 count")
    out = [_U16.pack(len(items))]
    for name, seq_txn in items:
        raw = name.encode("utf-8")
        if len(raw) > 0xFFFF:
            raise ValueError("table name longer than 65535 bytes")
        out += [_U16.pack(len(raw)), raw, _SEQ.pack(seq_txn)]
    return b"".join(out)


def encode_ok(sequence: int, tables: Mapping[str, int] | Iterable[tuple[str, int]] = ()) -> bytes:
    """OK frame (FWD-6)."""
    return bytes([STATUS_OK]) + _SEQ.pack(sequence) + _tables(tables)


def encode_durable_ack(tables: Mapping[str, int] | Iterable[tuple[str, int]]) -> bytes:
    """Durable-ack frame (FWD-7): no sequence, cumulative per-table watermarks."""
    return bytes([STATUS_DURABLE_ACK]) + _tables(tables)


def encode_error(status: int, sequence: int, message: str) -> bytes:
    """Error frame (FWD-9); the message is cut to 1024 bytes on a character boundary."""
    if not 0 <= status <= 0xFF or status in (STATUS_OK, STATUS_DURABLE_ACK):
        raise ValueError(f"error status must be a byte other than 0x00 and 0x02, got {status}")
    raw = message.encode("utf-8")[:MAX_ERROR_MESSAGE]
    raw = raw.decode("utf-8", "ignore").encode("utf-8")
    return bytes([status]) + _SEQ.pack(sequence) + _U16.pack(len(raw)) + raw


def _read_tables(data: bytes, pos: int) -> tuple[dict[str, int], int]:
    if pos + 2 > len(data):
        raise WireError("truncated table count")
    (count,) = _U16.unpack_from(data, pos)
    pos += 2
    tables: dict[str, int] = {}
    for _ in range(count):
        if pos + 2 > len(data):
            raise WireError("truncated table name length")
        (n,) = _U16.unpack_from(data, pos)
        pos += 2
        if pos + n + 8 > len(data):
            raise WireError("truncated table entry")
        try:
            name = data[pos : pos + n].decode("utf-8")
        except UnicodeDecodeError:
            raise WireError("table name is not UTF-8") from None
        (seq_txn,) = _SEQ.unpack_from(data, pos + n)
        pos += n + 8
        # Repeated names max-merge: watermarks are monotonic (FWD-5).
        tables[name] = max(tables.get(name, seq_txn), seq_txn)
    return tables, pos


def decode(data: bytes) -> Response:
    """Parse one server response frame."""
    if not data:
        raise WireError("empty response frame")
    status = data[0]
    if status == STATUS_DURABLE_ACK:
        tables, _ = _read_tables(data, 1)
        return DurableAck(tables)
    if len(data) < 9:
        raise WireError(f"response with status 0x{status:02x} shorter than 9 bytes")
    (sequence,) = _SEQ.unpack_from(data, 1)
    if status == STATUS_OK:
        tables, _pos = _read_tables(data, 9)
        return Ok(sequence, tables)
    if len(data) < 11:
        raise WireError("error frame without a message length")
    (n,) = _U16.unpack_from(data, 9)
    if 11 + n > len(data):
        raise WireError("truncated error message")
    message = data[11 : 11 + n].decode("utf-8", "replace")
    return ErrorFrame(status, sequence, message)
