"""A raw HTTP/1.1 keep-alive client for the benchmarks: the same request bytes for every
server (what any language's HTTP client sends), with no HTTP library in the way."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator

__all__ = ["Http", "IO_S"]

#: the longest a benchmark waits for one answer
IO_S = 10.0


class Http:
    """A raw HTTP/1.1 keep-alive connection: the same request bytes for every stack."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer

    @classmethod
    async def open(cls, port: int) -> Http:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.get_extra_info("socket").setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return cls(reader, writer)

    async def head(self) -> tuple[int, dict[str, str]]:
        raw = await asyncio.wait_for(self.reader.readuntil(b"\r\n\r\n"), IO_S)
        lines = raw.decode("latin-1").split("\r\n")
        headers = {}
        for line in lines[1:]:
            if line:
                k, _, v = line.partition(":")
                headers[k.strip().lower()] = v.strip()
        return int(lines[0].split()[1]), headers

    async def request(self, raw: bytes) -> bytes:
        self.writer.write(raw)
        status, headers = await self.head()
        if "content-length" in headers:
            body = await asyncio.wait_for(
                self.reader.readexactly(int(headers["content-length"])), IO_S
            )
        else:
            body = b"".join([c async for c in self.chunks()])
        if status != 200:
            raise RuntimeError(f"HTTP {status}: {body[:200]!r}")
        return body

    async def chunks(self) -> AsyncIterator[bytes]:
        """The body of a chunked response, chunk by chunk (an SSE stream never ends)."""
        while True:
            size = int((await self.reader.readuntil(b"\r\n")).strip(), 16)
            data = await self.reader.readexactly(size + 2)
            if size == 0:
                return
            yield data[:-2]

    def close(self) -> None:
        self.writer.close()
