"""HTTP/1.1 requests to ``tidelog serve`` for the remote backend (SERVICE.md SVC-58, SVC-60).

Standard library only (``http.client``): one keep-alive connection per thread, so the API may
be called from many threads (CON-1) without a lock around the network. Each call is one
request, repeated only as ``retry.py`` decides; every failure is a typed error (ERR-1): an
error answer raises the class its code names (SVC-9), no answer raises ``io_error`` saying
whether the request may have been applied.
"""

from __future__ import annotations

import http.client
import select
import socket
import ssl
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

import tidelog
from tidelog.errors import Closed, StorageError, TidelogError
from tidelog.service.wire import error_from_json, loads

from .options import Address, RemoteOptions
from .retry import Outcome, retry_delay_ms

__all__ = ["Client", "Request"]

_GONE = frozenset({"no_such_topic", "no_such_subscriber"})


class Request:
    """One API call as a request: method, path under the address's base, query, body."""

    __slots__ = ("method", "path", "query", "body", "content_type", "safe", "gone_ok", "wait_ms")

    def __init__(
        self,
        method: str,
        path: str,
        *,
        query: str = "",
        body: bytes | None = None,
        content_type: str = "application/json",
        safe: bool = False,
        gone_ok: bool = False,
        wait_ms: int = 0,
    ) -> None:
        self.method = method
        self.path = path
        self.query = query
        self.body = body
        self.content_type = content_type
        #: repeating it after a lost answer changes nothing the first did not (SVC-60)
        self.safe = safe
        #: a DELETE whose repeat after a lost answer may find the thing gone: that 404 is
        #: success (the lost first request removed it, SVC-23)
        self.gone_ok = gone_ok
        #: the service may hold the answer this long (a wait, SVC-21): added to the timeout
        self.wait_ms = wait_ms

    def __repr__(self) -> str:
        return f"{self.method} {self.path}{'?' + self.query if self.query else ''}"


class _Unsent(Exception):
    """No connection: the request never left (it was not applied)."""


class _Lost(Exception):
    """The request (or part of it) was sent and no answer came: it may have been applied."""


def _readable(sock: socket.socket) -> bool:
    """Whether an idle keep-alive socket has something to read: the service closed it (EOF)
    or wrote what it should not have. Either way it is not reused."""
    if hasattr(select, "poll"):
        poller = select.poll()
        poller.register(sock, select.POLLIN)
        return bool(poller.poll(0))
    return bool(select.select([sock], [], [], 0)[0])


class Client:
    """Requests to one service address; thread-safe."""

    def __init__(
        self,
        address: Address,
        options: RemoteOptions,
        *,
        sleep: Callable[[float], None] = time.sleep,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.address = address
        self.options = options
        self._sleep = sleep
        self._monotonic = monotonic
        self._local = threading.local()
        self._lock = threading.Lock()
        self._open: set[http.client.HTTPConnection] = set()
        self._closed = False
        self._ssl = ssl.create_default_context() if address.tls else None
        self._headers = {
            "User-Agent": f"tidelog/{tidelog.__version__}",
            "Accept": "application/json",
        }
        if options.token is not None:
            self._headers["Authorization"] = f"Bearer {options.token}"

    # -- connections --------------------------------------------------------------------------
    def _connection(self, timeout: float) -> http.client.HTTPConnection:
        conn: http.client.HTTPConnection | None = getattr(self._local, "conn", None)
        if conn is not None and (conn.sock is None or _readable(conn.sock)):
            self._drop(conn)  # closed by the service while idle: never send on it
            conn = None
        if conn is None:
            if self._closed:
                raise Closed(f"the remote store {self.address} is closed")
            a = self.address
            if self._ssl is not None:
                conn = http.client.HTTPSConnection(a.host, a.port, timeout=timeout,
                                                   context=self._ssl)  # fmt: skip
            else:
                conn = http.client.HTTPConnection(a.host, a.port, timeout=timeout)
            try:
                conn.connect()
            except (OSError, http.client.HTTPException) as exc:
                conn.close()
                raise _Unsent(exc) from None
            assert conn.sock is not None
            with self._lock:
                self._open.add(conn)
            if isinstance(conn.sock, socket.socket) and conn.sock.family != socket.AF_UNIX:
                # small requests and answers: never wait for an ACK (Nagle)
                conn.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            self._local.conn = conn
        return conn

    def _drop(self, conn: http.client.HTTPConnection) -> None:
        conn.close()
        with self._lock:
            self._open.discard(conn)
        if getattr(self._local, "conn", None) is conn:
            self._local.conn = None

    def close(self) -> None:
        """Close every connection (the served store stays open, SVC-58)."""
        self._closed = True
        with self._lock:
            conns, self._open = list(self._open), set()
        for conn in conns:
            conn.close()

    # -- one exchange -------------------------------------------------------------------------
    def _exchange(self, req: Request) -> tuple[int, Mapping[str, str], bytes]:
        timeout = (self.options.timeout_ms + req.wait_ms) / 1000.0
        conn = self._connection(timeout)
        headers = dict(self._headers)
        if req.body is not None:
            headers["Content-Type"] = req.content_type
        target = self.address.base + req.path + (f"?{req.query}" if req.query else "")
        try:
            assert conn.sock is not None
            conn.sock.settimeout(timeout)
            conn.request(req.method, target, body=req.body, headers=headers)
            resp = conn.getresponse()
            data = resp.read()
        except (OSError, http.client.HTTPException) as exc:
            self._drop(conn)
            raise _Lost(exc) from None
        if resp.will_close:
            self._drop(conn)
        return resp.status, resp.headers, data

    # -- one call -----------------------------------------------------------------------------
    def call(self, req: Request, what: str) -> Any:
        """Send ``req`` (repeating it as SVC-60 allows) and return its JSON answer (None for an
        answer without a body); raise the error it stands for. ``what`` names the call in
        messages."""
        start = self._monotonic()
        attempt = 0
        lost = False  # an earlier attempt got no answer
        while True:
            try:
                status, headers, data = self._exchange(req)
            except _Unsent as exc:
                outcome, error = Outcome("unsent"), self._unsent(what, exc, attempt)
            except _Lost as exc:
                lost = True
                outcome, error = Outcome("lost"), self._lost(req, what, exc, attempt)
            else:
                if status < 300:
                    return self._decode(status, data, what)
                error = _answer_error(status, headers, data)
                if lost and req.gone_ok and status == 404 and error.code in _GONE:
                    return None
                retry_after = getattr(error, "retry_after_ms", None)
                outcome = Outcome("answer", status, error.code, retry_after)
            elapsed = int((self._monotonic() - start) * 1000)
            delay = retry_delay_ms(
                outcome, safe=req.safe, attempt=attempt, elapsed_ms=elapsed,
                retry_ms=self.options.retry_ms,
            )  # fmt: skip
            if delay is None:
                raise error
            if delay:
                self._sleep(delay / 1000.0)
            attempt += 1

    def _decode(self, status: int, data: bytes, what: str) -> Any:
        if status == 204 or not data:
            return None
        try:
            return loads(data, f"the answer to {what}")
        except TidelogError as exc:
            raise StorageError(f"{self.address}: {exc.message}") from None

    def _unsent(self, what: str, exc: BaseException, attempt: int) -> StorageError:
        err = StorageError(
            f"{what}: cannot reach {self.address} ({_reason(exc)}) after {attempt + 1} "
            "attempt(s); nothing was sent, so it was not applied (SVC-60)"
        )
        err.maybe_applied = False  # type: ignore[attr-defined]
        return err

    def _lost(self, req: Request, what: str, exc: BaseException, attempt: int) -> StorageError:
        if req.safe:
            why = f"after {attempt + 1} attempt(s) (repeating it is safe, SVC-23..SVC-25)"
        else:
            why = "and it is not repeated: a repeat could apply it twice"
        err = StorageError(
            f"{what}: no answer from {self.address} ({_reason(exc)}) {why}; it may have been "
            "applied (SVC-60)"
        )
        err.maybe_applied = True  # type: ignore[attr-defined]
        return err


def _reason(exc: BaseException) -> str:
    cause = exc.args[0] if exc.args and isinstance(exc.args[0], BaseException) else exc
    if isinstance(cause, TimeoutError | socket.timeout):
        return "timed out"
    return f"{type(cause).__name__}: {cause}" if str(cause) else type(cause).__name__


def _answer_error(status: int, headers: Mapping[str, str], data: bytes) -> TidelogError:
    """SVC-9: the error an answer with status >= 300 stands for, with ``retry_after_ms`` from
    the body, else from ``Retry-After`` (whole seconds, SVC-10)."""
    if status < 400:
        return StorageError(f"unexpected HTTP {status} from the service (SVC-13)")
    error = error_from_json(status, data)
    if getattr(error, "retry_after_ms", None) is None:
        header = headers.get("Retry-After")
        if header is not None and header.strip().isdigit():
            error.retry_after_ms = int(header.strip()) * 1000  # type: ignore[attr-defined]
    return error
