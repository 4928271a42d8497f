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
import weakref
from collections.abc import Callable
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


class _Slot:
    """A thread's connection. Kept in a ``threading.local``: when the thread ends, its slot is
    dropped and closes the connection, so threads that come and go leave no socket behind."""

    __slots__ = ("conn", "__weakref__")

    def __init__(self) -> None:
        self.conn: http.client.HTTPConnection | None = None

    def close(self) -> None:
        conn, self.conn = self.conn, None
        if conn is not None:
            conn.close()

    def __del__(self) -> None:
        self.close()


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
        #: every thread's slot, to close them all at ``close()``
        self._slots: weakref.WeakSet[_Slot] = weakref.WeakSet()
        self._closed = False
        self._ssl = ssl.create_default_context() if address.tls else None
        self._headers = {
            "User-Agent": f"tidelog/{tidelog.__version__}",
            "Accept": "application/json",
        }
        if options.token is not None:
            self._headers["Authorization"] = f"Bearer {options.token}"
        if options.no_throttle:  # read by the append endpoints only (SVC-45)
            self._headers["X-Tidelog-No-Throttle"] = "1"

    # -- connections --------------------------------------------------------------------------
    def _slot(self) -> _Slot:
        slot: _Slot | None = getattr(self._local, "slot", None)
        if slot is None:
            slot = self._local.slot = _Slot()
            with self._lock:
                self._slots.add(slot)
        return slot

    def open_connections(self) -> int:
        """How many connections are open (one at most per thread that made a call)."""
        with self._lock:
            return sum(1 for s in self._slots if s.conn is not None)

    def _connection(self, slot: _Slot, timeout: float) -> http.client.HTTPConnection:
        conn = slot.conn
        if conn is not None and (conn.sock is None or _readable(conn.sock)):
            slot.close()  # closed by the service while idle: never send on it
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
            except ssl.SSLError as exc:  # a certificate refused is refused again: no repeat
                conn.close()
                err = StorageError(
                    f"TLS with {self.address} failed ({exc}); nothing was sent, so it was not "
                    "applied (SVC-60)"
                )
                err.maybe_applied = False  # type: ignore[attr-defined]
                raise err from None
            except (OSError, http.client.HTTPException) as exc:
                conn.close()
                raise _Unsent(exc) from None
            assert conn.sock is not None
            if isinstance(conn.sock, socket.socket) and conn.sock.family != socket.AF_UNIX:
                # small requests and answers: never wait for an ACK (Nagle)
                conn.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            slot.conn = conn
        return conn

    def close(self) -> None:
        """Close every connection (the served store stays open, SVC-58)."""
        self._closed = True
        with self._lock:
            slots = list(self._slots)
        for slot in slots:
            slot.close()

    # -- one exchange -------------------------------------------------------------------------
    def _exchange(self, req: Request) -> tuple[int, http.client.HTTPMessage, bytes]:
        timeout = (self.options.timeout_ms + req.wait_ms) / 1000.0
        slot = self._slot()
        conn = self._connection(slot, timeout)
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
            slot.close()
            raise _Lost(exc) from None
        if resp.will_close:
            slot.close()
        return resp.status, resp.headers, data

    # -- one call -----------------------------------------------------------------------------
    def call(self, req: Request, what: str) -> Any:
        """Send ``req`` (repeating it as SVC-60 allows) and return its JSON answer (None for an
        answer without a body); raise the error it stands for. ``what`` names the call in
        messages."""
        start = self._monotonic()
        attempt = 0
        lost = False  # an earlier attempt got no answer
        error: TidelogError
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


def _answer_error(status: int, headers: http.client.HTTPMessage, data: bytes) -> TidelogError:
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
