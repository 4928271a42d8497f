"""The runner's side of the driver protocol (spec/CONFORMANCE.md §3).

A *transport* carries requests: ``DriverProcess`` to a driver program over its stdin/stdout,
``LocalTransport`` to an in-process ``Driver`` (same JSON, no process). ``RemoteSut`` is the
``Sut`` the suite drives, and ``RemoteStore`` / ``RemoteTopic`` / ``RemoteSubscriber`` /
``RemoteSender`` look like tidelog's public API but send every call as a request, so the
stateful suite runs unchanged against any implementation that speaks the protocol.

Arguments are passed raw (no validation here): the driver's own validation and error codes are
under test too.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import shlex
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterable
from typing import IO, Any

from tidelog.backend import Capabilities
from tidelog.clock import FakeClock
from tidelog.config import TopicConfig
from tidelog.errors import ERROR_CODES, NoSuchSubscriber, StorageError, TidelogError
from tidelog.records import Item, Lease, RouterInfo, TopicState

from .driver import Driver
from .protocol import (
    PROTOCOL,
    VERSION,
    b64,
    item_from_json,
    lease_from_json,
    router_from_json,
    state_from_json,
    unb64,
)
from .sut import RingEvent, Sut

__all__ = [
    "Transport", "DriverProcess", "LocalTransport", "Crashed", "RemoteSut", "RemoteStore",
    "RemoteTopic", "RemoteSubscriber", "RemoteSender",
]  # fmt: skip


class Crashed(Exception):
    """The driver lost power inside the request (``crash_seed``); the op has no result."""


class Transport:
    """Sends requests, keeps the exchange (``log``) and the ring evictions reported."""

    def __init__(self) -> None:
        self._next = 0
        self.log: list[dict[str, Any]] = []  # {"request": ..., "response": ...}
        self.events: list[RingEvent] = []
        self.crash_seed: int | None = None  # set by RemoteSut.crash_during: the next request
        self.hello: dict[str, Any] = {}

    def _handshake(self, name: str) -> None:
        hello = self.request({"op": "hello"})
        if not isinstance(hello, dict) or hello.get("protocol") != PROTOCOL:
            self.close()
            raise StorageError(f"{name}: not a tidelog conformance driver: {hello!r}")
        if hello.get("version") != VERSION:
            self.close()
            raise StorageError(
                f"{name}: protocol version {hello.get('version')}, this runner speaks {VERSION}"
            )
        self.hello = hello

    def request(self, req: dict[str, Any]) -> Any:
        """Send one request; return its value or raise the error class of its code."""
        self._next += 1
        req = {"id": self._next, **req}
        if self.crash_seed is not None:
            req["crash_seed"], self.crash_seed = self.crash_seed, None
        entry: dict[str, Any] = {"request": req, "response": None}
        self.log.append(entry)
        resp = self._roundtrip(req)
        entry["response"] = resp
        if not isinstance(resp, dict) or resp.get("id") != req["id"]:
            raise StorageError(f"driver answered {resp!r} to request {req['id']} ({req['op']})")
        for ev in resp.get("ring_evictions") or ():
            self.events.append(RingEvent(str(ev["topic"]), int(ev["through"]), int(ev["head"])))
        if resp.get("crashed"):
            raise Crashed(req["op"])
        if resp.get("ok"):
            return resp.get("value")
        cls = ERROR_CODES.get(str(resp.get("code")), TidelogError)
        raise cls(str(resp.get("message", "")))

    def _roundtrip(self, req: dict[str, Any]) -> Any:
        raise NotImplementedError

    def close(self) -> None:
        """End the session."""


class LocalTransport(Transport):
    """An in-process ``Driver``: the same JSON, without a process boundary."""

    def __init__(self, driver: Driver) -> None:
        super().__init__()
        self.driver = driver
        self._handshake("in-process driver")

    def _roundtrip(self, req: dict[str, Any]) -> Any:
        resp = self.driver.handle(json.loads(json.dumps(req)))
        return json.loads(json.dumps(resp))

    def close(self) -> None:
        self.driver.sut.shutdown()


class DriverProcess(Transport):
    """A running driver program; each request is answered within ``timeout`` seconds."""

    def __init__(self, command: str | list[str], *, timeout: float = 60.0) -> None:
        super().__init__()
        self.command = shlex.split(command) if isinstance(command, str) else list(command)
        self.timeout = timeout
        # the driver's stderr, for the message when it dies; closed in close()
        self._stderr: IO[bytes] = tempfile.TemporaryFile(mode="w+b")  # noqa: SIM115
        try:
            self.proc = subprocess.Popen(
                self.command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._stderr
            )
        except OSError as exc:
            self._stderr.close()
            raise StorageError(f"cannot start driver {self.command!r}: {exc}") from None
        self._buf = b""
        self._handshake(self.command[0])

    def _roundtrip(self, req: dict[str, Any]) -> Any:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        try:
            self.proc.stdin.write(json.dumps(req).encode() + b"\n")
            self.proc.stdin.flush()
        except (BrokenPipeError, ValueError):
            raise StorageError(f"driver exited: {self.stderr()}") from None
        # select + os.read on the raw pipe: a hung driver fails the request after `timeout`
        # instead of hanging the run (and no thread per request)
        fd = self.proc.stdout.fileno()
        deadline = time.monotonic() + self.timeout
        while b"\n" not in self._buf:
            left = deadline - time.monotonic()
            ready = select.select([fd], [], [], max(left, 0))[0] if left > 0 else []
            if not ready:
                raise StorageError(
                    f"driver gave no answer to {req['op']!r} within {self.timeout}s: "
                    f"{self.stderr()}"
                )
            chunk = os.read(fd, 1 << 16)
            if not chunk:
                raise StorageError(
                    f"driver exited (code {self.proc.wait()}) during {req['op']!r}: "
                    f"{self.stderr()}"
                )
            self._buf += chunk
        line, self._buf = self._buf.split(b"\n", 1)
        try:
            return json.loads(line)
        except ValueError:
            raise StorageError(f"driver sent a line that is not JSON: {line[:200]!r}") from None

    def stderr(self) -> str:
        self._stderr.seek(0)
        return self._stderr.read()[-2000:].decode(errors="replace")

    def close(self) -> None:
        if self.proc.poll() is None:
            assert self.proc.stdin is not None
            with contextlib.suppress(OSError):
                self.proc.stdin.close()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if self.proc.stdout is not None:
            self.proc.stdout.close()
        self._stderr.close()


class RemoteSut(Sut):
    """An implementation behind a transport."""

    def __init__(self, transport: Transport) -> None:
        self.transport = transport
        self.hello = transport.hello
        self._handles = 0
        self._ring_pages: int | None = None

    def call(self, op: str, **args: Any) -> Any:
        return self.transport.request({"op": op, **args})

    def new_handle(self) -> int:
        self._handles += 1
        return self._handles

    def open(self, name: str, clock: FakeClock) -> RemoteStore:
        store = RemoteStore(self, name, clock)
        self._ring_pages = store.ring_pages
        return store

    def crash(self, seed: int) -> None:
        self.call("crash", seed=seed)

    def crash_during(self, seed: int, op: Callable[[], object]) -> list[RingEvent]:
        """The op's request carries ``crash_seed``; its ring overwrites (reported with the
        crashed response) stay queued for ``ring_evictions``."""
        self.transport.crash_seed = seed
        try:
            op()
        except Crashed:
            return []
        except TidelogError:
            pass
        finally:
            self.transport.crash_seed = None
        raise StorageError("the driver did not report the crash requested inside the op")

    def ring_evictions(self) -> list[RingEvent]:
        events, self.transport.events = self.transport.events, []
        return events

    def ring_pages(self) -> int | None:
        return self._ring_pages

    def ring_head(self, n: int, seqs: list[int | None]) -> tuple[int, int] | None:
        got = self.call("ring_head", pages=n, seqs=seqs)
        return None if got is None else (int(got["index"]), int(got["parity"]))

    def sender(self, slot: str) -> RemoteSender:
        return RemoteSender(self, slot)

    def dispose(self, name: str) -> None:
        with contextlib.suppress(TidelogError):
            self.call("dispose", name=name)

    def shutdown(self) -> None:
        self.transport.close()


class RemoteStore:
    """A store inside the driver, opened as ``name``; shaped like ``tidelog.Store``."""

    def __init__(self, sut: RemoteSut, name: str, clock: FakeClock) -> None:
        self.sut = sut
        self.name = name
        self.clock = clock
        opened = self.call("open", name=name)
        caps = dict(opened["capabilities"])
        caps["durability"] = frozenset(caps["durability"])
        self.capabilities = Capabilities(**caps)
        self.ring_pages: int | None = opened.get("ring_pages")
        self.closed = False

    def call(self, op: str, **args: Any) -> Any:
        return self.sut.call(op, now=self.clock.now_ms(), **args)

    def topic(self, name: str, *, create: bool = True, **config: Any) -> RemoteTopic:
        handle = self.sut.new_handle()
        self.call("topic", name=name, create=create, config=config, handle=handle)
        return RemoteTopic(self, name, handle)

    def topics(self) -> list[str]:
        return list(self.call("topics"))

    def drop_topic(self, name: str) -> None:
        self.call("drop_topic", name=name)

    def flush(self) -> None:
        self.call("flush")

    def router(self, name: str, source: str, dest: str, **options: Any) -> RouterInfo:
        return router_from_json(self.call("router", name=name, source=source, dest=dest,
                                          **options))

    def routers(self) -> list[RouterInfo]:
        return [router_from_json(obj) for obj in self.call("routers")]

    def drop_router(self, name: str) -> bool:
        return bool(self.call("drop_router", name=name))

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self.call("close")


class RemoteTopic:
    def __init__(self, store: RemoteStore, name: str, handle: int) -> None:
        self.store = store
        self.name = name
        self.handle = handle

    def _call(self, op: str, **args: Any) -> Any:
        return self.store.call(op, handle=self.handle, **args)

    @property
    def config(self) -> TopicConfig:
        return TopicConfig(**self._call("config"))

    def append(self, payload: bytes, *, tag: str | None = None, node: str | None = None) -> int:
        return int(self._call("append", payload=b64(payload), tag=tag, node=node))

    def append_many(
        self,
        payloads: Iterable[bytes],
        *,
        tag: str | None = None,
        node: str | None = None,
        producer: tuple[str, int] | None = None,
    ) -> list[int]:
        return list(
            self._call(
                "append_many",
                payloads=[b64(p) for p in payloads],
                tag=tag,
                node=node,
                producer=list(producer) if producer else None,
            )
        )

    def append_records(
        self,
        records: Iterable[tuple[bytes, str | None, str | None]],
        *,
        producer: tuple[str, int] | None = None,
    ) -> list[int]:
        rows = [[b64(p), tag, node] for p, tag, node in records]
        mark = list(producer) if producer else None
        return list(self._call("append_records", records=rows, producer=mark))

    def read(
        self, after: int = 0, limit: int = 1000, *, exclude_node: str | None = None
    ) -> list[Item]:
        items = self._call("read", after=after, limit=limit, exclude_node=exclude_node)
        return [item_from_json(i) for i in items]

    def state(self) -> TopicState:
        return state_from_json(self._call("state"))

    def delete(
        self, before_seq: int | None = None, *, tag: str | None = None, tag_glob: str | None = None
    ) -> int:
        return int(self._call("delete", before_seq=before_seq, tag=tag, tag_glob=tag_glob))

    def subscribe(self, name: str, start: str = "resume") -> RemoteSubscriber:
        self._call("subscribe", sub=name, start=start)
        return RemoteSubscriber(self, name)

    def subscribers(self) -> list[str]:
        return list(self._call("subscribers"))

    def subscriber(self, name: str) -> RemoteSubscriber:
        if name not in self.subscribers():
            raise NoSuchSubscriber(f"subscriber {name!r} does not exist")
        return RemoteSubscriber(self, name)

    def subscriber_handle(self, name: str) -> RemoteSubscriber:
        """A handle without a check (calls on a missing subscriber fail in the driver)."""
        return RemoteSubscriber(self, name)

    def claim(self, node: str, *, max: int = 1, lease_ms: int | None = None) -> list[Lease]:
        leases = self._call("claim", node=node, max=max, lease_ms=lease_ms)
        return [lease_from_json(x) for x in leases]

    def complete(self, seq: int, lease_id: int) -> None:
        self._call("complete", seq=seq, lease_id=lease_id)

    def release(self, seq: int, lease_id: int) -> None:
        self._call("release", seq=seq, lease_id=lease_id)

    def nack(self, seq: int, lease_id: int, *, delay_ms: int = 0) -> None:
        self._call("nack", seq=seq, lease_id=lease_id, delay_ms=delay_ms)


class RemoteSubscriber:
    def __init__(self, topic: RemoteTopic, name: str) -> None:
        self.topic = topic
        self.name = name

    def _call(self, op: str, **args: Any) -> Any:
        return self.topic._call(op, sub=self.name, **args)

    def poll(self, max: int = 100) -> list[Item]:
        return [item_from_json(i) for i in self._call("poll", max=max)]

    def ack(self, seq: int) -> bool:
        return bool(self._call("ack", seq=seq))

    def reject(self, seq: int) -> bool:
        return bool(self._call("reject", seq=seq))

    def commit(self, seq: int) -> int:
        return int(self._call("commit", seq=seq))

    @property
    def hwm(self) -> int:
        return int(self._call("hwm"))

    def flush(self) -> None:
        self._call("flush_sub")

    def unregister(self) -> None:
        self._call("unregister")


class RemoteSender:
    """The driver's store-and-forward sender (``sf_*`` requests), shaped like ``SlotSender``."""

    def __init__(self, sut: RemoteSut, slot: str) -> None:
        self.sut = sut
        self.slot = slot
        self.opened: dict[str, Any] = sut.call("sf_open", slot=slot)

    def state(self) -> dict[str, Any]:
        return dict(self.sut.call("sf_state"))

    def publish(self, payloads: list[bytes]) -> list[int]:
        return [int(f) for f in self.sut.call("sf_publish", payloads=[b64(p) for p in payloads])]

    def connect(self, durable: bool) -> None:
        self.sut.call("sf_connect", durable=durable)

    def send(self, limit: int) -> list[tuple[int, bytes]]:
        frames = self.sut.call("sf_send", max=limit)
        return [(int(f["fsn"]), unb64(f["payload"])) for f in frames]

    def on_ok(self, sequence: int, tables: dict[str, int]) -> None:
        self.sut.call("sf_ok", sequence=sequence, tables=tables)

    def on_durable_ack(self, tables: dict[str, int]) -> None:
        self.sut.call("sf_durable_ack", tables=tables)

    def on_error(self, status: int, sequence: int) -> None:
        self.sut.call("sf_error", status=status, sequence=sequence)

    def on_close(self, code: int) -> None:
        self.sut.call("sf_close_code", code=code)

    def disconnect(self) -> None:
        self.sut.call("sf_disconnect")

    def reopen(self) -> dict[str, Any]:
        return dict(self.sut.call("sf_reopen"))

    def crash(self, seed: int) -> dict[str, Any]:
        return dict(self.sut.call("sf_crash", seed=seed))
