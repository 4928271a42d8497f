"""Where a store call of the service runs: on the event loop when it cannot block, else on a
worker thread (spec/SERVICE.md SVC-1, SVC-26).

The store blocks in three ways: an op waits for its group commit (a durable append, CON-1),
for a change (CON-3: a wait, backpressure) or for the disk (a file-backed read, a progress
file). Handing every call to a worker thread costs a thread switch each way, more than the op
itself. So a call whose backend allows it (``Engine.begin_inline``: the store lock is free, the
op reads no sealed segment) runs right on the loop, holding the store lock, with its wait for
durability collected instead of waited for; ``Durable`` waits for those on one thread of its
own, so a group commit's writers cost one wake-up per sync, not a parked thread each; the
answer goes out once its op is durable, as SVC-15 says. A call that would wait for a change
(``WouldBlock``) runs again on a worker thread, as does every call the backend does not
allow on the loop.
"""

from __future__ import annotations

import asyncio
import queue
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from tidelog.api import Store
from tidelog.backends.common.engine import Engine, Pending, WouldBlock

__all__ = ["Calls", "Durable"]

T = TypeVar("T")
_ELSEWHERE: Any = object()


class Durable:
    """Waits for the durability of ops run on the loop (``Engine.finish``) on one thread, and
    resolves their futures on the loop, a batch at a time: the first wait of a batch leads the
    sync that covers every op queued before it, the rest find theirs done."""

    def __init__(self, engine: Engine, loop: asyncio.AbstractEventLoop) -> None:
        self.engine = engine
        self.loop = loop
        self._queue: queue.SimpleQueue[tuple[list[Pending], asyncio.Future[None]] | None] = (
            queue.SimpleQueue()
        )
        self._thread = threading.Thread(target=self._run, name="tidelog-svc-durable", daemon=True)
        self._thread.start()

    def wait(self, pending: list[Pending]) -> asyncio.Future[None]:
        """On the loop: a future done once ``pending`` is durable (or failed as the op's wait
        would have: its exception)."""
        future = self.loop.create_future()
        self._queue.put((pending, future))
        return future

    def _run(self) -> None:
        get, get_nowait = self._queue.get, self._queue.get_nowait
        while True:
            item = get()
            stop = item is None
            batch = [] if item is None else [item]
            while not stop:
                try:
                    item = get_nowait()
                except queue.Empty:
                    break
                if item is None:
                    stop = True
                else:
                    batch.append(item)
            done: list[tuple[asyncio.Future[None], BaseException | None]] = []
            for pending, future in batch:
                try:
                    self.engine.finish(pending)
                    done.append((future, None))
                except BaseException as exc:  # the op's own wait would have raised it
                    done.append((future, exc))
            if done:
                try:
                    self.loop.call_soon_threadsafe(_resolve, done)
                except RuntimeError:  # the loop closed: nobody waits for an answer any more
                    return
            if stop:
                return

    def close(self) -> None:
        """Finish what is queued, then stop the thread."""
        self._queue.put(None)
        self._thread.join()


def _resolve(done: list[tuple[asyncio.Future[None], BaseException | None]]) -> None:
    for future, exc in done:
        if future.done():
            continue
        if exc is None:
            future.set_result(None)
        else:
            future.set_exception(exc)


class Calls:
    """The service's store calls: ``inline`` on the loop when the backend allows it, ``thread``
    otherwise. A client that goes away does not cancel a call: its op completes or not as a
    whole (SVC-26, ERR-2)."""

    def __init__(self, store: Store, workers: int) -> None:
        backend = store._live()
        self.engine = backend if isinstance(backend, Engine) and backend.INLINE else None
        self.pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="tidelog-svc")
        self.durable: Durable | None = None

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        if self.engine is not None:
            self.durable = Durable(self.engine, loop)

    def close(self) -> None:
        if self.durable is not None:
            self.durable.close()
        self.pool.shutdown(wait=True)

    async def thread(self, fn: Callable[..., T], *args: Any) -> T:
        """Run ``fn(*args)`` on a worker thread."""
        loop = asyncio.get_running_loop()
        return await asyncio.shield(loop.run_in_executor(self.pool, fn, *args))

    async def inline(
        self, topic: str | None, after: int | None, fn: Callable[..., T], *args: Any
    ) -> T:
        """Run ``fn(*args)``, calls of topic ``topic`` (reading payloads after ``after``, as
        ``Engine.resident`` takes it), on the loop when the backend allows it, else on a
        worker thread; either way the answer is what the call returns or raises once its op
        is as durable as the call itself would have waited for."""
        engine, durable = self.engine, self.durable
        if engine is None or durable is None:
            return await self.thread(fn, *args)
        later = engine.begin_inline(topic, after)
        if later is None:
            return await self.thread(fn, *args)
        error: BaseException | None = None
        try:
            result = fn(*args)
        except WouldBlock:
            result = _ELSEWHERE
        except Exception as exc:
            error = exc
        finally:
            engine.end_inline()
        if later:
            # the op took effect already; cancelling this wait (the client went away) leaves
            # it to Durable, which finishes it all the same (SVC-26)
            await durable.wait(later)
        if error is not None:
            raise error
        if result is _ELSEWHERE:
            return await self.thread(fn, *args)
        return result
