"""Spark over a store that ``tidelog serve`` owns: ``http://`` / ``https://`` locations
(spec/BUNDLES.md SPK-40..SPK-43). No pyspark here.

The planner and the streaming source runner use the remote backend (``tidelog.open(url)``,
SERVICE.md SVC-58); a task reads its range with one Arrow read of the service (SVC-61) and
checks that answer against its plan (SPK-41): the same store, the same incarnation, a head at
least its range's end, and a stream that says it accounted for the whole range (SVC-63).
"""

from __future__ import annotations

import http.client
import json
import socket
import ssl
import threading
import time
from collections.abc import Iterator
from typing import Any
from urllib.parse import quote, urlencode

import pyarrow as pa

import tidelog
from tidelog.api import Store, Topic
from tidelog.backends.remote.backend import RemoteBackend
from tidelog.backends.remote.options import Address, parse_address, parse_remote_options
from tidelog.errors import ERROR_CODES, BadOption, StorageError, TidelogError
from tidelog.hooks import hooks
from tidelog.service.wire import error_from_json
from tidelog.uri import parse_uri

from .columns import TombstoneFound
from .guard import Planned, StaleView, host
from .options import SourceOptions

__all__ = [
    "ARROW_STREAM",
    "END_KEY",
    "ERROR_KEY",
    "is_served",
    "check_served",
    "store",
    "topic",
    "plan",
    "owner_host",
    "read_served",
    "request",
]

ARROW_STREAM = "application/vnd.apache.arrow.stream"
END_KEY = b"tidelog.end"  # SVC-63: the last seq an Arrow read accounts for
ERROR_KEY = b"tidelog.error"  # SVC-63: the error that ended it (SVC-9's body)
#: error codes of the adapter's own classes, which tidelog.errors does not list
_CODES: dict[str, type[TidelogError]] = {
    **ERROR_CODES,
    TombstoneFound.code: TombstoneFound,
    StaleView.code: StaleView,
}

_stores: dict[tuple[str, str | None], Store] = {}
_stores_lock = threading.Lock()


def is_served(location: str) -> bool:
    """Whether a store location names a served store (SPK-40)."""
    return location.lower().startswith(("http://", "https://"))


def check_served(opts: SourceOptions) -> None:
    """SPK-40: what a served store does not offer Spark yet is ``bad_option`` at planning."""
    if is_served(opts.root) and opts.slot is not None:
        raise BadOption(
            f"option slot={opts.slot}: slot reads of a served store ({_shown(opts)}) are not "
            "supported yet; read the log columns (SPK-40)"
        )


def _shown(opts: SourceOptions) -> str:
    """The store's address as it may be shown (never a token of its query, SVC-58)."""
    return str(_address(opts))


def _address(opts: SourceOptions) -> Address:
    return parse_address(parse_uri(opts.root))


def _token(opts: SourceOptions) -> str | None:
    """Option ``token``, else the URL's, else ``TIDELOG_TOKEN`` (SPK-40, SVC-58)."""
    uri = parse_uri(opts.root)
    options: dict[str, object] = dict(uri.options)
    if opts.token:
        options["token"] = opts.token
    return parse_remote_options(uri.scheme, options).token


def store(opts: SourceOptions) -> Store:
    """This process's remote store for ``opts`` (opened once per URL and token)."""
    key = (opts.root, opts.token)
    with _stores_lock:
        found = _stores.get(key)
        if found is None or found.closed:
            if opts.token:
                found = tidelog.open(opts.root, token=opts.token)
            else:
                found = tidelog.open(opts.root)
            _stores[key] = found
        return found


def topic(opts: SourceOptions) -> Topic:
    return store(opts).topic(opts.topic, create=False)


def plan(opts: SourceOptions) -> Planned:
    """SPK-14's plan from the owner (SPK-40): its store_id (SVC-62), the topic's incarnation
    and head_seq."""
    t = topic(opts)
    head = t.state().head_seq
    store_id = str(hooks(t.store, RemoteBackend).hello.get("store_id", ""))
    return Planned(store_id, t.incarnation, head)


def owner_host(opts: SourceOptions) -> str:
    """The host a served store's partitions prefer (SPK-42)."""
    return _address(opts).host


def request(opts: SourceOptions, body: dict[str, Any]) -> dict[str, Any]:
    """SPK-40: the streaming source's ``subscribe`` and ``commit`` requests (SPK-9, SPK-10),
    as staging.request makes them to a file store's owner, through the subscriber endpoints."""
    t = topic(opts)
    op = body["op"]
    if op == "subscribe":
        sub = t.subscribe(body["subscriber"], start=body.get("start", "resume"))
        sub.flush()
        return {"ok": True, "hwm": sub.hwm}
    if op == "commit":
        sub = t.subscribe(body["subscriber"], start=body.get("start") or "resume")
        acked = sub.commit(min(int(body["seq"]), t.state().head_seq))
        sub.flush()
        return {"ok": True, "acked": acked, "hwm": sub.hwm}
    raise BadOption(f"a served store takes no {op!r} request from Spark (SPK-40)")


# -- the Arrow read of one task (SPK-41) ----------------------------------------------------------
def _connect(address: Address, timeout: float) -> http.client.HTTPConnection:
    if address.tls:
        context = ssl.create_default_context()
        return http.client.HTTPSConnection(
            address.host, address.port, timeout=timeout, context=context
        )
    return http.client.HTTPConnection(address.host, address.port, timeout=timeout)


def _error(status: int, data: bytes) -> TidelogError:
    exc = error_from_json(status, data)
    cls = _CODES.get(exc.code)
    if cls is not None and type(exc) is not cls:
        exc = cls(exc.message)
    return exc


def _open(
    opts: SourceOptions, lo: int, hi: int, planned: Planned | None
) -> tuple[http.client.HTTPConnection, http.client.HTTPResponse, int]:
    """The Arrow read's answer once its head is checked (SPK-41): (connection, response, head)."""
    address = _address(opts)
    token = _token(opts)
    headers = {"User-Agent": f"tidelog/{tidelog.__version__}", "Accept": ARROW_STREAM}
    if token is not None:
        headers["Authorization"] = f"Bearer {token}"
    query: dict[str, object] = {
        "after": lo - 1,
        "until": hi,
        "tombstones": opts.tombstones,
        "batch_records": min(opts.batch_records, 1_000_000),
    }
    if planned is not None:
        query["incarnation"] = planned.incarnation
    path = f"{address.base}/v0/topics/{quote(opts.topic, safe='')}/arrow?{urlencode(query)}"
    start = time.monotonic()
    deadline = start + opts.freshness_timeout_ms / 1000
    while True:
        conn = _connect(address, opts.request_timeout)
        try:
            conn.request("GET", path, headers=headers)
            resp = conn.getresponse()
        except (OSError, http.client.HTTPException) as exc:
            conn.close()
            raise StorageError(
                f"Arrow read of topic {opts.topic!r} seqs {lo}..{hi} from {address} failed: "
                f"{_reason(exc)} (SPK-41)"
            ) from None
        if resp.status != 200:
            err = _error(resp.status, resp.read())
            conn.close()
            if planned is not None and err.code == "no_such_topic":
                raise StaleView(
                    f"topic {opts.topic!r} of {address}, incarnation {planned.incarnation} of "
                    f"the driver's plan, is gone (dropped, maybe re-created): {err.message} "
                    "(SPK-41)"
                )
            raise err
        store_id = resp.headers.get("X-Tidelog-Store-Id", "")
        head = int(resp.headers.get("X-Tidelog-Head-Seq", "0"))
        if planned is not None and store_id != planned.store_id:
            conn.close()
            raise StaleView(
                f"{address} serves another store (store_id {store_id}, the plan's "
                f"{planned.store_id}) than the driver planned this read from (SPK-41)"
            )
        if head >= hi:
            return conn, resp, head
        conn.close()
        now = time.monotonic()
        if now >= deadline:
            raise _behind(opts, head, hi, f" after waiting {int((now - start) * 1000)} ms")
        time.sleep(min(0.05, deadline - now))


def _behind(opts: SourceOptions, head: int, hi: int, why: str) -> StaleView:
    return StaleView(
        f"the store served at {_address(opts)} is behind the driver's plan (topic "
        f"{opts.topic!r}: its head {head}, the plan's end {hi}){why}, read from executor host "
        f"{host()} (SPK-41)"
    )


def _reason(exc: BaseException) -> str:
    if isinstance(exc, TimeoutError | socket.timeout):
        return "timed out"
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__


def read_served(
    opts: SourceOptions, lo: int, hi: int, planned: Planned | None = None
) -> Iterator[pa.RecordBatch]:
    """Seqs ``lo..hi`` of a served store as ``log_schema`` batches (SPK-41): one Arrow read
    (SVC-61), its batches yielded as they arrive, and an error unless the stream says it
    accounted for the whole range (SVC-63, SPK-15)."""
    conn, resp, _head = _open(opts, lo, hi, planned)
    where = f"Arrow read of topic {opts.topic!r} seqs {lo}..{hi} from {_address(opts)}"
    end: int | None = None
    try:
        try:
            reader = pa.ipc.open_stream(resp)
            while True:
                try:
                    batch, meta = reader.read_next_batch_with_custom_metadata()
                except StopIteration:
                    break
                if meta is not None and ERROR_KEY in meta:
                    body = meta[ERROR_KEY]
                    err = json.loads(body)["error"]
                    cls = _CODES.get(str(err["code"]), TidelogError)
                    raise cls(f"{where}: {err['message']}")
                if meta is not None and END_KEY in meta:
                    end = int(meta[END_KEY])
                elif batch.num_rows:
                    yield batch
        except (OSError, http.client.HTTPException, pa.ArrowInvalid) as exc:
            raise StorageError(
                f"{where}: the stream broke off ({_reason(exc)}); its rows are not taken for "
                "the range (SVC-63)"
            ) from None
    finally:
        conn.close()
    if end is None:
        raise StorageError(f"{where}: the stream ended without tidelog.end (SVC-63)")
    if end < hi:
        raise _behind(opts, end, hi, " (the stream's end)")
