"""A minimal QWP-over-WebSocket listener for tests against the real QuestDB client (stdlib only).

It answers the upgrade (``X-QWP-Version: 1`` and any extra ``headers``), records every binary
message it receives and acknowledges the first ``ack_limit`` of each connection
(``0x00 | u64 wire_seq | u16 0``, the OK frame of questdb 6.0.0, Rust client 7.2.0). Bound to
127.0.0.1, one thread per connection, everything closed by ``stop()``.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import socket
import struct
import threading

_GUID = b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11"


def is_catch_up(message: bytes) -> bool:
    """FWD-29, FWD-32: a symbol-dictionary catch-up, a QWP message with flag 0x08 and no table
    (table_count, bytes 6..8, is 0); every data message carries at least one table."""
    return message[:4] == b"QWP1" and message[5] & 0x08 != 0 and message[6:8] == b"\0\0"


def data_messages(messages: list[bytes]) -> list[bytes]:
    """The QWP messages that carry tables (catch-ups left out)."""
    return [m for m in messages if not is_catch_up(m)]


class QwpListener:
    def __init__(
        self,
        ack_limit: int = 1 << 62,
        headers: dict[str, str] | None = None,
        drop_first_after: int | None = None,
    ) -> None:
        self.ack_limit = ack_limit
        # close the first connection (no close frame) once it has sent this many messages
        self.drop_first_after = drop_first_after
        self.starts: list[int] = []  # index in ``messages`` where each connection began
        self.headers = "".join(f"{k}: {v}\r\n" for k, v in (headers or {}).items()).encode()
        self.messages: list[bytes] = []  # every binary message, in arrival order
        self.connections = 0
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._sock.bind(("127.0.0.1", 0))
        self._sock.listen(8)
        self._sock.settimeout(0.2)
        self.port = self._sock.getsockname()[1]
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._conns: list[socket.socket] = []
        self._threads: list[threading.Thread] = []
        self._accept = threading.Thread(target=self._accept_loop, daemon=True)
        self._accept.start()

    def _accept_loop(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self._sock.accept()
            except OSError:
                continue
            with self._lock:
                self._conns.append(conn)
                self.connections += 1
            t = threading.Thread(target=self._serve, args=(conn,), daemon=True)
            self._threads.append(t)
            t.start()

    def _serve(self, conn: socket.socket) -> None:
        try:
            conn.settimeout(10)
            buf = b""
            while b"\r\n\r\n" not in buf:
                chunk = conn.recv(4096)
                if not chunk:
                    return
                buf += chunk
            head, _, rest = buf.partition(b"\r\n\r\n")
            key = b""
            for line in head.split(b"\r\n"):
                name, _, value = line.partition(b":")
                if name.strip().lower() == b"sec-websocket-key":
                    key = value.strip()
            accept = base64.b64encode(hashlib.sha1(key + _GUID).digest())
            conn.sendall(
                b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\n"
                b"Connection: Upgrade\r\nSec-WebSocket-Accept: " + accept + b"\r\n"
                b"X-QWP-Version: 1\r\n" + self.headers + b"\r\n"
            )
            reader = _Reader(conn, rest)
            seq = 0
            with self._lock:
                first = not self.starts
                self.starts.append(len(self.messages))
            while not self._stop.is_set():
                opcode, payload = reader.frame()
                if opcode == 8:  # close
                    conn.sendall(b"\x88\x00")
                    return
                if opcode == 9:  # ping -> pong
                    conn.sendall(_frame(10, payload))
                    continue
                if opcode != 2:
                    continue
                with self._lock:
                    self.messages.append(payload)
                if seq < self.ack_limit:
                    conn.sendall(_frame(2, b"\x00" + struct.pack("<QH", seq, 0)))
                seq += 1
                if first and seq == self.drop_first_after:
                    return
        except (OSError, EOFError):
            return
        finally:
            conn.close()

    def stop(self) -> None:
        self._stop.set()
        self._sock.close()
        with self._lock:
            for c in self._conns:
                with contextlib.suppress(OSError):
                    c.shutdown(socket.SHUT_RDWR)
                c.close()
        self._accept.join(5)
        for t in self._threads:
            t.join(5)


def _frame(opcode: int, payload: bytes) -> bytes:
    n = len(payload)
    if n < 126:
        head = struct.pack("!BB", 0x80 | opcode, n)
    elif n < 1 << 16:
        head = struct.pack("!BBH", 0x80 | opcode, 126, n)
    else:
        head = struct.pack("!BBQ", 0x80 | opcode, 127, n)
    return head + payload


class _Reader:
    def __init__(self, conn: socket.socket, buf: bytes) -> None:
        self.conn, self.buf = conn, buf

    def _take(self, n: int) -> bytes:
        while len(self.buf) < n:
            chunk = self.conn.recv(65536)
            if not chunk:
                raise EOFError
            self.buf += chunk
        out, self.buf = self.buf[:n], self.buf[n:]
        return out

    def frame(self) -> tuple[int, bytes]:
        """One whole message (continuation frames joined); client frames are masked."""
        data = b""
        first_op = None
        while True:
            b0, b1 = self._take(2)
            op, fin = b0 & 0x0F, b0 & 0x80
            n = b1 & 0x7F
            if n == 126:
                n = struct.unpack("!H", self._take(2))[0]
            elif n == 127:
                n = struct.unpack("!Q", self._take(8))[0]
            mask = self._take(4) if b1 & 0x80 else b"\0\0\0\0"
            raw = self._take(n)
            payload = bytes(c ^ mask[i & 3] for i, c in enumerate(raw))
            if op >= 8:
                return op, payload
            if first_op is None:
                first_op = op
            data += payload
            if fin:
                return first_op, data
