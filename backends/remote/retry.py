"""When the remote backend repeats a request (SERVICE.md SVC-60), as pure functions of what
happened, so every decision is tested without a network.

Three outcomes of one attempt: an **answer** (a status line arrived), **unsent** (no
connection: nothing reached the service), **lost** (sent, no answer: it may have been applied).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

__all__ = ["Outcome", "retry_delay_ms", "backoff_ms", "DEFAULT_RETRY_AFTER_MS"]

#: SVC-10: a 429/503 without a usable ``Retry-After`` means one second
DEFAULT_RETRY_AFTER_MS = 1000
#: pauses between repeats after unsent or lost attempts: at once, then doubling to one second
_BACKOFF_MS = (0, 50, 100, 200, 400, 800, 1000)


@dataclass(frozen=True)
class Outcome:
    """What one attempt came to."""

    kind: Literal["answer", "unsent", "lost"]
    status: int = 0
    #: the error code of an answer with status >= 400 (SVC-9)
    code: str | None = None
    #: the wait the answer asked for (``retry_after_ms``, else ``Retry-After`` in ms)
    retry_after_ms: int | None = None


def backoff_ms(attempt: int) -> int:
    """The pause before repeat number ``attempt + 1`` after an unsent or lost attempt."""
    return _BACKOFF_MS[min(attempt, len(_BACKOFF_MS) - 1)]


def retry_delay_ms(
    outcome: Outcome, *, safe: bool, attempt: int, elapsed_ms: int, retry_ms: int
) -> int | None:
    """SVC-60: how long to wait before repeating the request, or None to give up now (raise).

    ``safe``: repeating the request after a lost answer changes nothing the first did not
    (SVC-23, a producer batch SVC-24, a ``request_id`` SVC-25). ``attempt`` counts the
    attempts made before this one (0 for the first); ``elapsed_ms`` is the time since the first
    began. A repeat that would start after ``retry_ms`` is not made."""
    if outcome.kind == "answer":
        if not _asks_retry(outcome):
            return None
        delay = outcome.retry_after_ms
        delay = DEFAULT_RETRY_AFTER_MS if delay is None or delay < 0 else delay
    elif outcome.kind == "unsent" or safe:
        delay = backoff_ms(attempt)
    else:
        return None  # lost, and repeating could apply it twice
    return delay if elapsed_ms + delay <= retry_ms else None


def _asks_retry(outcome: Outcome) -> bool:
    """503 (``busy``, ``closed``, ``locked``, or a proxy's) and 429 ``throttled``: the service
    refused before the store saw the request (SVC-11) and asks for a repeat later. Not 429
    ``backpressure``: that is the store's own refusal (SUB-6), raised at once as in process, so
    ``backpressure_wait_ms`` waits as CON-3 says and no longer."""
    if outcome.status == 503:
        return True
    return outcome.status == 429 and outcome.code != "backpressure"
