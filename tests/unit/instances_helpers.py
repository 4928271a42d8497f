"""What the instances tests share (spec/INSTANCES.md): stores opened in one test process, each
taking its own slot as a process would, all closed at the end."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

import tidelog


@pytest.fixture
def opened() -> Iterator[list[tidelog.Store]]:
    stores: list[tidelog.Store] = []
    yield stores
    for s in stores:
        s.close()


def open_in(stores: list[tidelog.Store], root: Path, query: str, **kw: object) -> tidelog.Store:
    """``file://root?query``, kept in ``stores`` (closed by ``opened``)."""
    store = tidelog.open(f"file://{root}?{query}", **kw)
    stores.append(store)
    return store
