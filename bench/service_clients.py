"""The clients of the service benchmark (``service_cases``): one driver per system with the same
operations, so every measurement is one load generator for all three, on asyncio in the bench
process (never the server's).

Each system is driven by its usual Python client: NATS JetStream by ``nats-py``, Redis Streams by
``redis`` (redis-py's asyncio client), tidelog's HTTP API (spec/SERVICE.md sections 4 and
6; spec/SERVICE.md as rules move there) by a raw HTTP/1.1 keep-alive client on asyncio streams
(``http_client.Http``: what any language's HTTP client sends). Every connection is its own
(one per appender, one for the live stream, one for the consumer).

What each operation is, per system:

* append: ``js.publish`` awaiting its PubAck; ``XADD`` awaiting its reply; a raw
  ``POST /v0/topics/{t}/records`` awaiting ``{"seq"}`` (SVC-6).
* live: a push consumer (AckPolicy none, DeliverPolicy new); ``XREAD BLOCK`` from the last id;
  the SSE stream ``GET /v0/topics/{t}/events?after=<head_seq>`` (SVC-27).
* consume: a pull consumer's ``fetch(n)`` and, with AckPolicy all, ``ack_sync`` of the last;
  ``XREADGROUP COUNT n`` and ``XACK`` of the n ids; ``POST .../subscribers/{s}/poll`` with
  ``{"max": n}`` and ``.../commit`` of the last seq (SVC-18).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
from collections.abc import Callable
from typing import Any

from .http_client import Http

__all__ = ["Driver", "Live", "TidelogDriver", "NatsDriver", "RedisDriver", "IO_S", "TidelogHttp"]

#: bound on every answer (seconds); a prefill may take ``PREFILL_S``
IO_S, PREFILL_S = 10.0, 120.0
#: records per prefill request / pipeline
PREFILL_BATCH = 1000

OnPayload = Callable[[bytes], None]


class Live:
    """A receiving stream: ``task`` runs it (its exception is the stream's failure); ``notes``
    counts what it saw besides records (tidelog's ``deferred`` / ``resumed`` events)."""

    def __init__(self, closer: Callable[[], Any]) -> None:
        self.task: asyncio.Task[None] | None = None
        self.notes: dict[str, int] = {}
        self._closer = closer

    async def close(self) -> None:
        # each step bounded: a client cancelled mid-command may never finish closing (a
        # redis-py single-connection client did, twice in four full runs, hanging the bench)
        if self.task is not None:
            self.task.cancel()
            await bounded(self.task)
        got = self._closer()
        if asyncio.iscoroutine(got):
            await bounded(got)


async def bounded(step: Any) -> None:
    """Await ``step`` (a coroutine or a task) for at most ``IO_S``, whatever it raises; left
    running after that (``asyncio.wait_for`` would wait for its cancellation, maybe forever)."""
    task = asyncio.ensure_future(step)
    await asyncio.wait({task}, timeout=IO_S)
    if task.done() and not task.cancelled():
        task.exception()  # retrieved: a failure to close is not the case's failure


class Driver:
    """One system's client side; ``topic`` is its stream/topic/key."""

    name = "?"

    def __init__(self, port: int, topic: str) -> None:
        self.port, self.topic = port, topic

    async def setup(self) -> None:
        """Create the topic (stream, key) with the durable configuration of the bench."""
        raise NotImplementedError

    async def appender(self) -> tuple[Callable[[bytes], Any], Callable[[], Any]]:
        """A new connection: (append(data) awaiting the durable answer, close)."""
        raise NotImplementedError

    async def live(self, on_payload: OnPayload) -> Live:
        """Start receiving: every record appended after this returns reaches ``on_payload``."""
        raise NotImplementedError

    async def prefill(self, n: int, data: bytes) -> None:
        """``n`` records of ``data``, as fast as the system takes them (not timed)."""
        raise NotImplementedError

    async def consumer(self, batch: int) -> tuple[Callable[[], Any], Callable[[], Any]]:
        """A consumer from the first record: (fetch() -> records handed out, up to ``batch``;
        ack() -> records acknowledged by acknowledging the last fetch)."""
        raise NotImplementedError

    async def check_consumed(self, n: int) -> None:
        """RuntimeError unless the system holds exactly the first ``n`` records as acked."""
        raise NotImplementedError

    async def stored(self) -> int:
        """Records the topic holds."""
        raise NotImplementedError

    async def close(self) -> None:
        pass


# -- tidelog serve --------------------------------------------------------------------------------
class TidelogHttp(Http):
    """``Http`` with any status: ``call`` returns (status, headers, body)."""

    async def call(
        self, method: str, path: str, body: bytes | None = None, headers: str = ""
    ) -> tuple[int, dict[str, str], bytes]:
        raw = f"{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n{headers}".encode()
        if body is not None:
            raw += b"Content-Length: %d\r\n" % len(body)
        self.writer.write(raw + b"\r\n" + (body or b""))
        return await self.answer()

    async def answer(self) -> tuple[int, dict[str, str], bytes]:
        status, head = await self.head()
        if "content-length" in head:
            data = await asyncio.wait_for(
                self.reader.readexactly(int(head["content-length"])), IO_S
            )
        elif head.get("transfer-encoding", "").lower() == "chunked":
            data = b"".join([c async for c in self.chunks()])
        else:
            data = b""
        return status, head, data

    async def json(
        self, method: str, path: str, obj: Any = None, ok: tuple[int, ...] = (200,)
    ) -> Any:
        body = None if obj is None else json.dumps(obj).encode()
        ctype = "" if obj is None else "Content-Type: application/json\r\n"
        status, _, data = await self.call(method, path, body, ctype)
        if status not in ok:
            raise RuntimeError(f"tidelog serve: {method} {path} -> HTTP {status}: {data[:300]!r}")
        return json.loads(data) if data else None


def raw_append(topic: str, data: bytes, headers: bytes = b"") -> bytes:
    """The request bytes of a raw append (SVC-6) of ``data`` to ``topic``."""
    return (
        b"POST /v0/topics/%s/records HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        b"Content-Type: application/octet-stream\r\n%sContent-Length: %d\r\n\r\n%s"
        % (topic.encode(), headers, len(data), data)
    )


def sse_events(block: bytes) -> tuple[str, str]:
    """(event type, data) of one SSE event block; ("", "") for a comment or a bare field."""
    kind, data = "", []
    for line in block.split(b"\n"):
        if line.startswith(b"event:"):
            kind = line[6:].strip().decode()
        elif line.startswith(b"data:"):
            data.append(line[5:].lstrip(b" ").decode())
    if data and not kind:
        kind = "message"
    return kind, "\n".join(data)


class TidelogDriver(Driver):
    name = "tidelog"

    def __init__(
        self,
        port: int,
        topic: str,
        durability: str = "fsync",
        priority: int | None = None,
        no_throttle: bool = False,
    ) -> None:
        super().__init__(port, topic)
        self.durability, self.priority = durability, priority
        self._headers = b"X-Tidelog-No-Throttle: 1\r\n" if no_throttle else b""
        self._admin: TidelogHttp | None = None
        self._consumer: TidelogHttp | None = None
        self.base = f"/v0/topics/{topic}"

    async def conn(self) -> TidelogHttp:
        http = await TidelogHttp.open(self.port)
        assert isinstance(http, TidelogHttp)  # Http.open makes its cls
        return http

    async def admin(self) -> TidelogHttp:
        if self._admin is None:
            self._admin = await self.conn()
        return self._admin

    async def setup(self) -> None:
        admin = await self.admin()
        await admin.json("PUT", self.base, {"durability": self.durability}, ok=(200, 201))
        if self.priority is not None:
            got = await admin.json("PUT", f"{self.base}/priority", {"priority": self.priority})
            if got.get("priority") != self.priority:
                raise RuntimeError(f"tidelog serve: priority of {self.topic} is {got}")

    async def appender(self) -> tuple[Callable[[bytes], Any], Callable[[], Any]]:
        http = await self.conn()
        topic, headers = self.topic, self._headers

        async def append(data: bytes) -> None:
            http.writer.write(raw_append(topic, data, headers))
            status, _, body = await http.answer()
            if status != 200:
                raise RuntimeError(f"tidelog serve: append to {topic} -> HTTP {status}: {body!r}")

        return append, http.close

    async def head_seq(self) -> int:
        state = await (await self.admin()).json("GET", f"{self.base}/state")
        return int(state["head_seq"])

    async def live(self, on_payload: OnPayload) -> Live:
        after = await self.head_seq()
        http = await self.conn()
        http.writer.write(
            f"GET {self.base}/events?after={after} HTTP/1.1\r\nHost: 127.0.0.1\r\n"
            "Accept: text/event-stream\r\n\r\n".encode()
        )
        status, head = await http.head()
        if status != 200 or "text/event-stream" not in head.get("content-type", ""):
            http.close()
            raise RuntimeError(f"tidelog serve: SSE stream refused: HTTP {status} {head}")
        live = Live(http.close)
        chunked = head.get("transfer-encoding", "").lower() == "chunked"

        async def pieces() -> Any:
            if chunked:
                async for c in http.chunks():
                    yield c
                return
            while data := await http.reader.read(1 << 16):
                yield data

        async def run() -> None:
            buf = b""
            b64decode, loads = base64.b64decode, json.loads
            async for piece in pieces():
                buf += piece.replace(b"\r\n", b"\n")
                *blocks, buf = buf.split(b"\n\n")
                for block in blocks:
                    kind, data = sse_events(block)
                    if kind == "record":
                        on_payload(b64decode(loads(data)["payload"]))
                    elif kind in ("tombstone", "error", "shutdown"):
                        raise RuntimeError(f"tidelog serve: SSE {kind} on {self.topic}: {data}")
                    elif kind:
                        live.notes[kind] = live.notes.get(kind, 0) + 1
            raise RuntimeError(f"tidelog serve: the SSE stream of {self.topic} ended")

        live.task = asyncio.create_task(run())
        return live

    async def prefill(self, n: int, data: bytes) -> None:
        admin = await self.admin()
        encoded = base64.b64encode(data).decode()
        for start in range(0, n, PREFILL_BATCH):
            k = min(PREFILL_BATCH, n - start)
            got = await admin.json("POST", f"{self.base}/batch", {"payloads": [encoded] * k})
            if len(got["seqs"]) != k:
                raise RuntimeError(f"tidelog serve: a batch of {k} got {len(got['seqs'])} seqs")

    async def consumer(self, batch: int) -> tuple[Callable[[], Any], Callable[[], Any]]:
        http = await self.conn()
        sub = f"{self.base}/subscribers/bench"
        await http.json("PUT", sub, {"start": "earliest"})
        last = 0

        async def fetch() -> int:
            nonlocal last
            items = (await http.json("POST", f"{sub}/poll", {"max": batch, "wait_ms": 0}))["items"]
            for item in items:
                if "seq" not in item:
                    raise RuntimeError(f"tidelog serve: a tombstone in the consume run: {item}")
            if items:
                last = items[-1]["seq"]
            return len(items)

        async def ack() -> int:
            return int((await http.json("POST", f"{sub}/commit", {"seq": last}))["acked"])

        self._consumer = http
        return fetch, ack

    async def check_consumed(self, n: int) -> None:
        got = await (await self.admin()).json("GET", f"{self.base}/subscribers/bench")
        if got["hwm"] != n:
            raise RuntimeError(f"tidelog serve: subscriber hwm {got['hwm']} after {n} consumed")

    async def stored(self) -> int:
        return await self.head_seq()

    async def close(self) -> None:
        for http in (self._admin, self._consumer):
            if http is not None:
                http.close()


# -- NATS JetStream -------------------------------------------------------------------------------
class NatsDriver(Driver):
    name = "nats"

    def __init__(self, port: int, topic: str) -> None:
        import nats  # ImportError: reported as not installed

        super().__init__(port, topic)
        self._nats = nats
        self.stream = topic.upper().replace("-", "_")
        self._conns: list[Any] = []

    async def _connect(self) -> Any:
        nc = await self._nats.connect(
            f"nats://127.0.0.1:{self.port}",
            connect_timeout=IO_S,
            max_reconnect_attempts=0,
            allow_reconnect=False,
        )
        self._conns.append(nc)
        return nc

    async def setup(self) -> None:
        from nats.js.api import StorageType, StreamConfig

        js = (await self._connect()).jetstream(timeout=IO_S)
        self._js = js
        await js.add_stream(
            StreamConfig(name=self.stream, subjects=[self.topic], storage=StorageType.FILE)
        )

    async def appender(self) -> tuple[Callable[[bytes], Any], Callable[[], Any]]:
        nc = await self._connect()
        js, subject, stream = nc.jetstream(timeout=IO_S), self.topic, self.stream

        async def append(data: bytes) -> None:
            ack = await js.publish(subject, data)
            if ack.stream != stream:
                raise RuntimeError(f"nats: published into {ack.stream}, not {stream}")

        return append, nc.close

    async def live(self, on_payload: OnPayload) -> Live:
        from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy

        nc = await self._connect()

        async def cb(msg: Any) -> None:
            on_payload(msg.data)

        config = ConsumerConfig(ack_policy=AckPolicy.NONE, deliver_policy=DeliverPolicy.NEW)
        sub = await nc.jetstream(timeout=IO_S).subscribe(
            self.topic, cb=cb, config=config, manual_ack=True
        )
        return Live(sub.unsubscribe)

    async def prefill(self, n: int, data: bytes) -> None:
        nc = self._conns[0]
        for start in range(0, n, PREFILL_BATCH):
            for _ in range(min(PREFILL_BATCH, n - start)):
                await nc.publish(self.topic, data)
            await nc.flush(timeout=IO_S)
        deadline = asyncio.get_running_loop().time() + PREFILL_S
        while (got := await self.stored()) < n:
            if asyncio.get_running_loop().time() > deadline:
                raise RuntimeError(f"nats: {got} of {n} prefilled messages stored")
            await asyncio.sleep(0.01)

    async def consumer(self, batch: int) -> tuple[Callable[[], Any], Callable[[], Any]]:
        from nats.js.api import AckPolicy, ConsumerConfig

        nc = await self._connect()
        config = ConsumerConfig(ack_policy=AckPolicy.ALL, max_ack_pending=-1)
        psub = await nc.jetstream(timeout=IO_S).pull_subscribe(
            self.topic, durable="bench", config=config
        )
        last: list[Any] = []

        async def fetch() -> int:
            msgs = await psub.fetch(batch, timeout=IO_S)
            last[:] = msgs[-1:]
            return len(msgs)

        async def ack() -> int:
            await last[0].ack_sync(timeout=IO_S)
            return -1  # AckPolicy all: one ack covers the batch; checked by check_consumed

        return fetch, ack

    async def check_consumed(self, n: int) -> None:
        info = await self._js.consumer_info(self.stream, "bench")
        if info.ack_floor.stream_seq != n or info.num_ack_pending:
            raise RuntimeError(
                f"nats: ack floor {info.ack_floor}, {info.num_ack_pending} pending "
                f"after {n} consumed"
            )

    async def stored(self) -> int:
        return int((await self._js.stream_info(self.stream)).state.messages)

    async def close(self) -> None:
        for nc in self._conns:
            with contextlib.suppress(Exception):
                await nc.close()


# -- Redis Streams --------------------------------------------------------------------------------
class RedisDriver(Driver):
    name = "redis"

    def __init__(self, port: int, topic: str) -> None:
        import redis.asyncio  # ImportError: reported as not installed

        super().__init__(port, topic)
        self._redis = redis.asyncio
        self._conns: list[Any] = []

    def _client(self) -> Any:
        r = self._redis.Redis(
            host="127.0.0.1",
            port=self.port,
            single_connection_client=True,
            socket_timeout=IO_S,
            socket_connect_timeout=IO_S,
        )
        self._conns.append(r)
        return r

    async def setup(self) -> None:
        self._main = self._client()
        info = await self._main.info("persistence")
        if info.get("aof_enabled") != 1:
            raise RuntimeError(f"redis: the AOF is off: {info}")

    async def appender(self) -> tuple[Callable[[bytes], Any], Callable[[], Any]]:
        r = self._client()
        await r.ping()
        key = self.topic

        async def append(data: bytes) -> None:
            await r.xadd(key, {"p": data})

        return append, r.aclose

    async def live(self, on_payload: OnPayload) -> Live:
        r = self._client()
        newest = await r.xrevrange(self.topic, count=1)
        key = self.topic
        last = newest[0][0] if newest else b"0-0"

        async def run() -> None:
            nonlocal last
            while True:
                for _, entries in await r.xread({key: last}, count=1000, block=1000) or ():
                    for entry_id, fields in entries:
                        on_payload(fields[b"p"])
                        last = entry_id

        live = Live(r.aclose)
        live.task = asyncio.create_task(run())
        return live

    async def prefill(self, n: int, data: bytes) -> None:
        for start in range(0, n, PREFILL_BATCH):
            pipe = self._main.pipeline(transaction=False)
            for _ in range(min(PREFILL_BATCH, n - start)):
                pipe.xadd(self.topic, {"p": data})
            await pipe.execute()

    async def consumer(self, batch: int) -> tuple[Callable[[], Any], Callable[[], Any]]:
        r = self._client()
        key = self.topic
        await r.xgroup_create(key, "g", id="0")
        ids: list[bytes] = []

        async def fetch() -> int:
            got = await r.xreadgroup("g", "c", {key: ">"}, count=batch)
            ids[:] = [entry_id for _, entries in got for entry_id, _ in entries]
            return len(ids)

        async def ack() -> int:
            return int(await r.xack(key, "g", *ids))

        return fetch, ack

    async def check_consumed(self, n: int) -> None:
        pending = await self._main.xpending(self.topic, "g")
        (group,) = await self._main.xinfo_groups(self.topic)
        if pending["pending"] or group.get("entries-read", n) != n:
            raise RuntimeError(f"redis: {pending['pending']} pending, group {group} after {n}")

    async def stored(self) -> int:
        return int(await self._main.xlen(self.topic))

    async def close(self) -> None:
        for r in self._conns:
            await bounded(r.aclose())  # as Live.close
