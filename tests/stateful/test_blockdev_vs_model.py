"""The stateful suite against the blockdev backend (spec: TOP/TMB/RET/SUB rules, DUR-1 through real
close + reopen of an image; CAP-2 exempts DEL-* and QUE-*, and the machine uses one topic).

The ring is tiny (6 pages of 512 bytes) so it wraps within a few steps and ring overwrite
reuses pages all the time. Ring overwrite is the one effect the model cannot predict: which
records share a page depends on record sizes and commit timing. The backend reports every
overwrite that evicted live records (BDEV-16: ``ring_evictions``) and this machine applies it to
the model as the involuntary eviction the spec says it is (TMB-1, SUB-7), after checking that it
was legitimate: the ring really was full, i.e. ``page_count`` newer pages, each holding at least
one newer record, existed (``head - through >= page_count``). Everything else is compared exactly,
with no special case.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from typing import Any

from hypothesis import event, settings
from hypothesis.stateful import precondition, rule

from tidelog.api import Store
from tidelog.conformance.machine import LogMachine

PAGES = 6
PAGE_SIZE = 512
SIZE = 4096 + PAGES * PAGE_SIZE
_ROOT = tempfile.mkdtemp(prefix="tidelog-stateful-blockdev-")


class BlockdevMachine(LogMachine):
    @staticmethod
    def sut_uri(name: str) -> str:
        path = os.path.join(_ROOT, f"{name}.img")
        return f"blockdev://{path}?size={SIZE}&page_size={PAGE_SIZE}&topic=t0"

    def cleanup_sut(self, name: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(os.path.join(_ROOT, f"{name}.img"))

    # -- the model learns ring overwrites (BDEV-16) -----------------------------------------
    _seen = 0

    def learn_ring(self, store: Store | None = None) -> None:
        """BDEV-16, TMB-1, SUB-7: apply the backend's ring evictions to the model."""
        backend: Any = (store or self.sut)._backend
        fresh = backend.ring_evictions[self._seen :]
        self._seen = len(backend.ring_evictions)
        model: Any = self.model._backend
        for ev in fresh:
            assert ev.head - ev.through >= PAGES, (
                f"BDEV-16: ring evicted through seq {ev.through} at head {ev.head}: the ring "
                f"of {PAGES} pages was not full"
            )
            event("ring overwrite evicted live records")
            with model.lock:
                t = model.topics.get(ev.topic)
                seqs = [q for q in t.live_sorted() if q <= ev.through] if t is not None else []
                if seqs:
                    model._remove_involuntary(t, seqs, "evicted")
                    model._record_history(t)

    def both(self, fn: Any) -> Any:
        out = super().both(fn)
        self.learn_ring()
        return out

    def on_topic(self, name: str, fn: Any) -> Any:
        out = super().on_topic(name, fn)
        self.learn_ring()
        return out

    def on_sub(self, topic: str, sub: str, fn: Any) -> Any:
        out = super().on_sub(topic, sub, fn)
        self.learn_ring()
        return out

    @precondition(lambda self: self.supports_reopen)
    @rule()
    def reopen(self) -> None:
        """DUR-1, SUB-9: clean close + reopen of the image restores everything exactly."""
        old = self.sut
        super().reopen()
        self.learn_ring(old)  # the final page written at close may have overwritten some
        self._seen = 0
        facts: Any = self.sut.describe()
        if facts["looped"]:
            event("reopened a ring that has wrapped")


BlockdevMachine.TestCase.settings = settings(
    BlockdevMachine.TestCase.settings,
    max_examples=int(os.environ.get("TIDELOG_STATEFUL_EXAMPLES", "1000")) // 4,
    stateful_step_count=50,
    deadline=None,
)
TestBlockdevVsModel = BlockdevMachine.TestCase
