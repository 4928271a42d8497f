"""The runner's side of the driver protocol: a driver process, and ``RemoteStore`` /
``RemoteTopic`` / ``RemoteSubscriber``, which look like tidelog's public API but send every call
to the driver. The stateful suite therefore runs unchanged against any implementation that
speaks the protocol (spec/CONFORMANCE.md).

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
from collections.abc import Iterable
from typing import Any

from tidelog.backend import Capabilities
from tidelog.clock import Clock
from tidelog.config import TopicConfig
from tidelog.errors import ERROR_CODES, StorageError, TidelogError
from tidelog.records import Item, Lease, TopicState

from .protocol import PROTOCOL, VERSION, b64, item_from_json, lease_from_json, state_from_json

__all__ = ["DriverProcess", "RemoteStore", "RemoteTopic", "RemoteSubscriber"]


class DriverProcess:
    """A running driver: one request at a time, each answered within ``timeout`` seconds."""

    def __init__(self, command: str | list[str], *, timeout: float = 30.0) -> None:
        self.command = shlex.split(command) if isinstance(command, str) else list(command)
        self.timeout = timeout
        self._stderr = tempfile.TemporaryFile(mode="w+b")
        try:
            self.proc = subprocess.Popen(self.command, stdin=subprocess.PIPE,
                                         stdout=subprocess.PIPE, stderr=self._stderr)
        except OSError as exc:
            self._stderr.close()
            raise StorageError(f"cannot start driver {self.command!r}: {exc}") from None
        self._buf = b""
        self._next = 0
        self.log: list[dict[str, Any]] = []  # every request, for replay files
        hello = self.request({"op": "hello"})
        if not isinstance(hello, dict) or hello.get("protocol") != PROTOCOL:
            self.close()
            raise StorageError(f"{self.command[0]}: not a tidelog conformance driver: {hello!r}")
        if hello.get("version") != VERSION:
            self.close()
            raise StorageError(f"{self.command[0]}: protocol version {hello.get('version')}, "
                               f"this runner speaks version {VERSION}")
        self.hello: dict[str, Any] = hello

    def request(self, req: dict[str, Any]) -> Any:
        """Send one request; return its value or raise the error class of its code."""
        self._next += 1
        req = {"id": self._next, **req}
        self.log.append(req)
        resp = self._roundtrip(req)
        if not isinstance(resp, dict) or resp.get("id") != req["id"]:
            raise StorageError(f"driver answered {resp!r} to request {req['id']} ({req['op']})")
        if resp.get("ok"):
            return resp.get("value")
        cls = ERROR_CODES.get(str(resp.get("code")), TidelogError)
        raise cls(str(resp.get("message", "")))

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
                raise StorageError(f"driver gave no answer to {req['op']!r} within "
                                   f"{self.timeout}s: {self.stderr()}")
            chunk = os.read(fd, 1 << 16)
            if not chunk:
                raise StorageError(f"driver exited (code {self.proc.wait()}) during "
                                   f"{req['op']!r}: {self.stderr()}")
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


class RemoteStore:
    """A store inside a driver process, opened as ``name``; shaped like ``tidelog.Store``."""

    def __init__(self, driver: DriverProcess, name: str, clock: Clock) -> None:
        self.driver = driver
        self.name = name
        self.clock = clock
        caps = self.call("open", name=name)
        caps["durability"] = frozenset(caps["durability"])
        self.capabilities = Capabilities(**caps)
        self.closed = False

    def call(self, op: str, **args: Any) -> Any:
        return self.driver.request({"op": op, "now": self.clock.now_ms(), **args})

    def topic(self, name: str, *, create: bool = True, **config: Any) -> RemoteTopic:
        self.call("topic", name=name, create=create, config=config)
        return RemoteTopic(self, name)

    def topics(self) -> list[str]:
        return list(self.call("topics"))

    def drop_topic(self, name: str) -> None:
        self.call("drop_topic", name=name)

    def flush(self) -> None:
        self.call("flush")

    def describe(self) -> dict[str, object]:
        return {"backend": "driver", "driver": self.driver.hello.get("implementation")}

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self.call("close")

    def crash(self) -> None:
        self.closed = True
        self.call("crash")

    def dispose(self) -> None:
        """Close and delete the store's data (end of an example)."""
        self.closed = True
        self.call("dispose", name=self.name)


class RemoteTopic:
    def __init__(self, store: RemoteStore, name: str) -> None:
        self.store = store
        self.name = name

    def _call(self, op: str, **args: Any) -> Any:
        return self.store.call(op, topic=self.name, **args)

    @property
    def config(self) -> TopicConfig:
        return TopicConfig(**self._call("config"))

    def append(self, payload: bytes, *, tag: str | None = None, node: str | None = None) -> int:
        return int(self._call("append", payload=b64(payload), tag=tag, node=node))

    def append_many(self, payloads: Iterable[bytes], *, tag: str | None = None,
                    node: str | None = None, producer: tuple[str, int] | None = None) -> list[int]:
        return list(self._call("append_many", payloads=[b64(p) for p in payloads], tag=tag,
                               node=node, producer=list(producer) if producer else None))

    def append_records(self, records: Iterable[tuple[bytes, str | None, str | None]], *,
                       producer: tuple[str, int] | None = None) -> list[int]:
        rows = [[b64(p), tag, node] for p, tag, node in records]
        return list(self._call("append_records", records=rows,
                               producer=list(producer) if producer else None))

    def read(self, after: int = 0, limit: int = 1000, *,
             exclude_node: str | None = None) -> list[Item]:
        return [item_from_json(i) for i in self._call("read", after=after, limit=limit,
                                                      exclude_node=exclude_node)]

    def state(self) -> TopicState:
        return state_from_json(self._call("state"))

    def delete(self, before_seq: int | None = None, *, tag: str | None = None,
               tag_glob: str | None = None) -> int:
        return int(self._call("delete", before_seq=before_seq, tag=tag, tag_glob=tag_glob))

    def subscribe(self, name: str, start: str = "resume") -> RemoteSubscriber:
        self._call("subscribe", sub=name, start=start)
        return RemoteSubscriber(self, name)

    def subscribers(self) -> list[str]:
        return list(self._call("subscribers"))

    def subscriber(self, name: str) -> RemoteSubscriber:
        if name not in self.subscribers():
            raise ERROR_CODES["no_such_subscriber"](f"subscriber {name!r} does not exist")
        return RemoteSubscriber(self, name)

    def subscriber_handle(self, name: str) -> RemoteSubscriber:
        """A handle without a check (calls on a missing subscriber fail in the driver)."""
        return RemoteSubscriber(self, name)

    def claim(self, node: str, *, max: int = 1, lease_ms: int | None = None) -> list[Lease]:
        return [lease_from_json(x) for x in self._call("claim", node=node, max=max,
                                                       lease_ms=lease_ms)]

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
