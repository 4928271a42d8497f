"""Staged writes (spec/SERVICE.md SVC-65..SVC-68): a Spark write task on another host stages its
rows as chunks (``PUT /v0/topics/{t}/staged/{w}``), and the driver's commit appends the chunks of
the attempts that won in one ``append_records`` (spec/BUNDLES.md SPK-44) -- XPR-4's staged files
and ingest, with the files kept here instead of in a directory every Spark process shares.

Layout: ``<directory>/<topic key>-<w>/p<P>-a<A>-c<C>.arrow`` per chunk, and ``outcome.json`` once
the write was committed or aborted (what a repeated commit answers, SVC-66). A write's directory
is touched by every request on it, so its mtime says when it was last used (SVC-68).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import shutil
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import pyarrow as pa
from aiohttp import web

from tidelog.adapters.spark.netread import ARROW_STREAM
from tidelog.adapters.spark.options import SourceOptions
from tidelog.api import Store
from tidelog.backends.file import requests as xpr
from tidelog.backends.file.store import FileBackend
from tidelog.errors import BadArgument, NotFound, StoreFull, UnsupportedMediaType
from tidelog.fsio import OsFS
from tidelog.hooks import hooks, offers
from tidelog.names import check_topic_name

from .endpoints import producer_from_json
from .limits import Limits
from .request import check_query, json_body, query_int, read_body
from .responses import json_response
from .wire import dumps, loads

if TYPE_CHECKING:
    from .app import Service

__all__ = ["StagedWrites", "add_routes"]

_WRITE_ID = re.compile(r"[A-Za-z0-9_-]{1,64}")
_OUTCOME = "outcome.json"
_CHUNK = re.compile(r"p\d+-a\d+-c\d+\.arrow")
_STRING = (pa.string(), pa.large_string())
_BINARY = (pa.binary(), pa.large_binary())
Append = Callable[[list[tuple[bytes, str | None, str | None]], tuple[str, int] | None], list[int]]


def staging_directory(store: Store) -> tuple[str, bool]:
    """SVC-68: (directory, temporary): ``served/`` in SPK-6's default staging directory of a
    file store, else a temporary directory of a name no one can guess, made (private to this
    user) by the first chunk, so a service that stages nothing leaves nothing behind."""
    if offers(store, FileBackend):
        root = hooks(store, FileBackend).root
        return os.path.join(SourceOptions(root=root, topic="").staging, "served"), False
    return os.path.join(tempfile.gettempdir(), f"tidelog-staged-{uuid.uuid4().hex}"), True


def check_chunk(data: bytes) -> int:
    """SVC-65: the body is one Arrow IPC stream of XPR-4's staged columns; returns its rows."""
    try:
        table = pa.ipc.open_stream(pa.py_buffer(data)).read_all()
    except (pa.ArrowInvalid, OSError) as exc:
        raise BadArgument(f"a staged chunk must be one Arrow IPC stream: {exc} (SVC-65)") from None
    want = {"payload": _BINARY, "tag": _STRING, "node": _STRING}
    for f in table.schema:
        if f.name not in want or not any(f.type.equals(t) for t in want[f.name]):
            raise BadArgument(
                f"a staged chunk has columns payload (binary), tag and node (string); got "
                f"{f.name} {f.type} (SVC-65, XPR-4)"
            )
    if "payload" not in table.schema.names:
        raise BadArgument("a staged chunk needs a 'payload' column (SVC-65, XPR-4)")
    if table.column("payload").null_count:
        raise BadArgument("column 'payload' of a staged chunk holds nulls (SVC-65)")
    return int(table.num_rows)


class StagedWrites:
    """The staged chunks of every write, their bytes counted against ``--max-staged-bytes`` and
    collected after ``--staged-ttl-ms`` idle (SVC-65..SVC-68). Methods do file I/O: they run on
    worker threads."""

    def __init__(
        self,
        directory: str,
        limits: Limits,
        *,
        temporary: bool = False,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.directory = directory
        self.max_bytes = limits.max_staged_bytes
        self.ttl_s = limits.staged_ttl_ms / 1000.0
        self.temporary = temporary
        self.clock = clock
        self.fs = OsFS()
        self._lock = threading.Condition()
        self._busy: set[str] = set()  # writes a commit or abort is working on
        self._bytes = 0
        self._collected = 0.0
        if os.path.isdir(directory):
            for name in os.listdir(directory):
                for path in _chunks(os.path.join(directory, name)):
                    with contextlib.suppress(OSError):
                        self._bytes += os.path.getsize(path)
        self.collect()

    @classmethod
    def for_store(cls, store: Store, limits: Limits) -> StagedWrites:
        directory, temporary = staging_directory(store)
        return cls(directory, limits, temporary=temporary)

    @property
    def staged_bytes(self) -> int:
        with self._lock:
            return self._bytes

    def close(self) -> None:
        """At shutdown: a temporary directory goes (its store goes with the process)."""
        if self.temporary:
            shutil.rmtree(self.directory, ignore_errors=True)

    # -- paths ----------------------------------------------------------------------------------
    def _write_dir(self, topic: str, write: str) -> str:
        key = hashlib.sha256(topic.encode()).hexdigest()[:16]
        return os.path.join(self.directory, f"{key}-{write}")

    @staticmethod
    def _chunk(wdir: str, part: int, attempt: int, chunk: int) -> str:
        return os.path.join(wdir, f"p{part}-a{attempt}-c{chunk}.arrow")

    @staticmethod
    def _outcome(wdir: str) -> dict[str, Any] | None:
        try:
            with open(os.path.join(wdir, _OUTCOME), "rb") as f:
                result: dict[str, Any] = loads(f.read(), "a staged write's outcome")
                return result
        except FileNotFoundError:
            return None

    def _mkdir(self, wdir: str) -> None:
        if self.temporary:  # private to this user
            os.makedirs(self.directory, mode=0o700, exist_ok=True)
        os.makedirs(wdir, exist_ok=True)

    def _touch(self, wdir: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            os.utime(wdir)

    # -- SVC-65 ---------------------------------------------------------------------------------
    def put(
        self, topic: str, write: str, part: int, attempt: int, chunk: int, data: bytes
    ) -> dict[str, int]:
        rows = check_chunk(data)
        wdir = self._write_dir(topic, write)
        size = len(data)
        self.collect()
        with self._lock:
            if self._outcome(wdir) is not None:
                raise _finished(topic, write)
            if self._bytes + size > self.max_bytes:
                raise StoreFull(
                    f"staging {size} bytes would exceed --max-staged-bytes {self.max_bytes} "
                    f"({self._bytes} staged) (SVC-65)"
                )
            self._bytes += size  # reserved: released below when the chunk does not stay
            self._mkdir(wdir)
        final = self._chunk(wdir, part, attempt, chunk)
        tmp = f"{final}.{uuid.uuid4().hex}.tmp"  # a concurrent repeat writes its own
        kept = False
        try:
            with open(tmp, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            with self._lock:
                if self._outcome(wdir) is not None:  # committed or aborted meanwhile
                    raise _finished(topic, write)
                old = os.path.getsize(final) if os.path.exists(final) else 0
                os.replace(tmp, final)
                kept = True
                self._bytes -= old
                self._touch(wdir)
        finally:
            if not kept:
                with contextlib.suppress(OSError):
                    os.unlink(tmp)
                with self._lock:
                    self._bytes -= size
        return {"rows": rows, "bytes": size}

    # -- SVC-66, SVC-67 -------------------------------------------------------------------------
    @contextlib.contextmanager
    def _working(self, wdir: str) -> Iterator[None]:
        """One commit or abort of a write at a time (a repeat waits for the first)."""
        with self._lock:
            while wdir in self._busy:
                self._lock.wait()
            self._busy.add(wdir)
        try:
            yield
        finally:
            with self._lock:
                self._busy.discard(wdir)
                self._lock.notify_all()

    def commit(
        self,
        topic: str,
        write: str,
        parts: list[tuple[int, int, int]],
        producer: tuple[str, int] | None,
        append: Append,
    ) -> list[int]:
        """SVC-66: ``append(records, producer)`` appends and makes them durable."""
        wdir = self._write_dir(topic, write)
        with self._working(wdir):
            outcome = self._outcome(wdir)
            if outcome is not None:
                self._touch(wdir)
                if "seqs" not in outcome:
                    raise NotFound(
                        f"staged write {write!r} of topic {topic!r} was aborted (SVC-67)"
                    )
                seqs: list[int] = outcome["seqs"]
                return seqs
            paths = [self._chunk(wdir, p, a, c) for p, a, n in parts for c in range(n)]
            for (p, a, n), path in zip(_expand(parts), paths, strict=True):
                if not os.path.exists(path):
                    raise NotFound(
                        f"chunk {n} of part {p} attempt {a} of staged write {write!r} (topic "
                        f"{topic!r}) is not staged: never sent, aborted, or the write was "
                        f"committed and collected after --staged-ttl-ms (SVC-66, SVC-68)"
                    )
            records = [r for path in paths for r in xpr.read_staged(self.fs, path)]
            appended = append(records, producer) if records else []
            seqs = [appended[0], appended[-1]] if appended else []
            self._finish(wdir, {"seqs": seqs})
        return seqs

    def abort(self, topic: str, write: str) -> None:
        """SVC-67."""
        wdir = self._write_dir(topic, write)
        with self._working(wdir):
            outcome = self._outcome(wdir)
            if outcome is None or "seqs" not in outcome:
                self._finish(wdir, {"aborted": True})
            else:
                self._drop_chunks(wdir)

    def _finish(self, wdir: str, outcome: dict[str, Any]) -> None:
        """Record the outcome (so a late chunk is refused), then drop every chunk."""
        self._mkdir(wdir)
        path = os.path.join(wdir, _OUTCOME)
        with self._lock:
            xpr_tmp = f"{path}.tmp"
            with open(xpr_tmp, "wb") as f:
                f.write(dumps(outcome))
            os.replace(xpr_tmp, path)
        self._drop_chunks(wdir)

    def _drop_chunks(self, wdir: str) -> None:
        for path in _chunks(wdir, tmp=True):
            with contextlib.suppress(OSError):
                size = os.path.getsize(path)
                os.unlink(path)
                if path.endswith(".arrow"):
                    with self._lock:
                        self._bytes -= size
        self._touch(wdir)

    # -- SVC-68 ---------------------------------------------------------------------------------
    def collect(self) -> int:
        """Delete writes idle for the TTL; at most every min(ttl / 10, 60 s). Returns how many."""
        now = self.clock()
        with self._lock:
            if now - self._collected < min(self.ttl_s / 10, 60.0):
                return 0
            self._collected = now
        if not os.path.isdir(self.directory):
            return 0
        removed = 0
        for name in os.listdir(self.directory):
            wdir = os.path.join(self.directory, name)
            try:
                idle = now - os.stat(wdir).st_mtime
            except FileNotFoundError:
                continue
            if idle < self.ttl_s:
                continue
            with self._lock:
                if wdir in self._busy:
                    continue
                self._busy.add(wdir)
            try:
                self._drop_chunks(wdir)
                shutil.rmtree(wdir, ignore_errors=True)
                removed += 1
            finally:
                with self._lock:
                    self._busy.discard(wdir)
                    self._lock.notify_all()
        return removed


def _expand(parts: list[tuple[int, int, int]]) -> Iterator[tuple[int, int, int]]:
    for p, a, n in parts:
        for c in range(n):
            yield p, a, c


def _chunks(wdir: str, tmp: bool = False) -> list[str]:
    try:
        names = os.listdir(wdir)
    except (FileNotFoundError, NotADirectoryError):
        return []
    return [
        os.path.join(wdir, n) for n in names if _CHUNK.fullmatch(n) or (tmp and n.endswith(".tmp"))
    ]


def _finished(topic: str, write: str) -> NotFound:
    return NotFound(
        f"staged write {write!r} of topic {topic!r} was committed or aborted: nothing more is "
        "staged for it (SVC-65, SVC-67)"
    )


def _write_id(request: web.Request) -> str:
    write = request.match_info["w"]
    if not _WRITE_ID.fullmatch(write):
        raise BadArgument(f"a write id is 1..64 of A-Z a-z 0-9 _ -, got {write!r} (SVC-65)")
    return write


def _parts(value: object) -> list[tuple[int, int, int]]:
    if not isinstance(value, list):
        raise BadArgument("field 'parts': expected a list of [part, attempt, chunks] (SVC-66)")
    out: list[tuple[int, int, int]] = []
    for i, item in enumerate(value):
        if (
            not isinstance(item, list)
            or len(item) != 3
            or not all(isinstance(x, int) and not isinstance(x, bool) and x >= 0 for x in item)
        ):
            raise BadArgument(f"parts[{i}]: expected [part, attempt, chunks] >= 0, got {item!r}")
        out.append((item[0], item[1], item[2]))
    if len({p for p, _, _ in out}) != len(out):
        raise BadArgument("field 'parts' names a part twice (SVC-66)")
    return out


def add_routes(app: web.Application, svc: Service) -> None:
    async def put_chunk(request: web.Request) -> web.Response:
        check_query(request, ("part", "attempt", "chunk"))
        write = _write_id(request)
        topic = check_topic_name(request.match_info["t"])
        key = [query_int(request, name, None, 0) for name in ("part", "attempt", "chunk")]
        if None in key:
            raise BadArgument(
                "query parameters 'part', 'attempt' and 'chunk' are required (SVC-65)"
            )
        if request.content_type != ARROW_STREAM:
            raise UnsupportedMediaType(
                f"a staged chunk is {ARROW_STREAM}, got {request.content_type!r} (SVC-65)"
            )
        data = await read_body(request)
        part, attempt, chunk = (int(k) for k in key if k is not None)
        answer = await svc.call(svc.staged.put, topic, write, part, attempt, chunk, data)
        return json_response(answer)

    async def commit(request: web.Request) -> web.Response:
        check_query(request, ("incarnation",))
        write = _write_id(request)
        name = check_topic_name(request.match_info["t"])
        body = await json_body(request, ("parts", "producer"))
        parts = _parts(body.get("parts", []))
        producer = producer_from_json(body.get("producer"))
        incarnation = query_int(request, "incarnation", None, 1)

        def append(records: list[Any], prod: tuple[str, int] | None) -> list[int]:
            seqs: list[int] = svc.on_topic(
                name, incarnation, lambda t: t.append_records(records, producer=prod)
            )
            svc.store.flush()  # SVC-66: durable before the answer, as XPR-2's ingest
            return seqs

        seqs = await svc.call(svc.staged.commit, name, write, parts, producer, append)
        svc.metrics.appended(name, seqs[1] - seqs[0] + 1 if seqs else 0)
        return json_response({"seqs": seqs})

    async def abort(request: web.Request) -> web.Response:
        check_query(request, ())
        write = _write_id(request)
        name = check_topic_name(request.match_info["t"])
        await svc.call(svc.staged.abort, name, write)
        return web.Response(status=204)

    path = "/v0/topics/{t}/staged/{w}"
    for method, route_path, handler in (
        ("PUT", path, put_chunk),
        ("POST", path + "/commit", commit),
        ("DELETE", path, abort),
    ):
        svc.rights[app.router.add_route(method, route_path, handler)] = "write"  # SVC-67
