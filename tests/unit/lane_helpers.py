"""Helpers of the lane tests (test_append_lane.py, test_many_lane.py)."""

from __future__ import annotations

from typing import Any

import pytest

from tidelog import api as api_mod
from tidelog.backends.common.lane import make_many_lane


class General(list[tuple[Any, ...]]):
    """The batches that reached the general path (``api._append_to``)."""


def count_general(monkeypatch: pytest.MonkeyPatch) -> General:
    """Record each batch the general path appends, from now on."""
    seen = General()
    real = api_mod._append_to

    def counted(store: Any, ref: Any, data: Any, tag: Any, node: Any, producer: Any = None) -> Any:
        seen.append((list(data), tag, node, producer))
        return real(store, ref, data, tag, node, producer)

    monkeypatch.setattr(api_mod, "_append_to", counted)
    return seen


def is_many_lane(fn: object) -> bool:
    """Whether ``fn`` is a batch lane: the closure ``make_many_lane`` makes."""
    code = getattr(fn, "__code__", None)
    return code is not None and code.co_qualname == make_many_lane.__code__.co_qualname + (
        ".<locals>.append_many"
    )
