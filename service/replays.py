"""SVC-25: the last answer per (call, key) for a ``request_id``, so a client that lost an
answer to a call that hands something out can ask again and get that same answer.

A second request with the same id while the first still runs waits for the first's answer
instead of calling the store again. Kept for ``window_ms`` of wall time, at most ``limit``
entries, the least recently used dropped first. Not durable: after a restart no answer is
needed, since cursors reset and leases end (SUB-9, QUE-8).
"""

from __future__ import annotations

import asyncio
import re
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web

from tidelog.errors import BadArgument

__all__ = ["Replays", "check_request_id"]

_REQUEST_ID = re.compile(r"[A-Za-z0-9_-]{1,64}")


def check_request_id(value: object) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str) or not _REQUEST_ID.fullmatch(value):
        raise BadArgument(
            f"request_id must be 1..64 ASCII letters, digits, '_' or '-', got {value!r} (SVC-25)"
        )
    return value


class Replays:
    def __init__(self, window_ms: int, limit: int) -> None:
        self.window = window_ms / 1000.0
        self.limit = limit
        # key -> (request_id, expiry, the answer's future)
        self._kept: OrderedDict[tuple[Any, ...], tuple[str, float, asyncio.Future[Any]]] = (
            OrderedDict()
        )

    async def run(
        self,
        key: tuple[Any, ...],
        request_id: str | None,
        call: Callable[[], Awaitable[web.Response]],
    ) -> web.Response:
        """``call()``'s answer, or the kept answer of the last call with this ``request_id`` on
        ``key``. A call that raised keeps its error too: a repeat gets the same refusal."""
        if request_id is None:
            return await call()
        now = time.monotonic()
        kept = self._kept.get(key)
        if kept is not None and kept[0] == request_id and kept[1] > now:
            self._kept.move_to_end(key)
            return _fresh(await asyncio.shield(kept[2]))
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._kept[key] = (request_id, now + self.window, future)
        self._kept.move_to_end(key)
        while len(self._kept) > self.limit:
            self._kept.popitem(last=False)
        try:
            value = await call()
        except Exception as exc:
            future.set_exception(exc)
            future.exception()  # retrieved: a repeat may never come
            raise
        except BaseException:
            future.cancel()
            if self._kept.get(key, (None, 0, None))[2] is future:
                del self._kept[key]
            raise
        future.set_result((value.status, value.body, value.content_type))
        return value


def _fresh(kept: tuple[int, Any, str]) -> web.Response:
    """A response is sent once: a repeat gets a new one with the same status and bytes."""
    status, body, content_type = kept
    return web.Response(status=status, body=body, content_type=content_type)
