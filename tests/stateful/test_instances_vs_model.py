"""A store of three instances against the model of instances (spec/INSTANCES.md): stores
opened and closed (slots, INST-3), killed and taken over, topics created from any instance
(INST-5, INST-9), appends in every instance, merged reads from writers and from a read-only
store (INST-4, INST-7) with cursors kept and re-read (INST-8), a merged subscriber registered,
polled and committed (INST-15..INST-17). Tiny WAL files, checkpoints and
segments make replay and sealed reads happen within a few steps."""

from __future__ import annotations

import os
import shutil
import tempfile

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

import tidelog
from tidelog import FakeClock
from tidelog.backends.instances import MergedSubscriber, merged
from tidelog.errors import TidelogError
from tidelog.hooks import Abandon, hooks
from tidelog.model.instances import InstancesModel

N = 3
OPTIONS = (
    "wal_file_bytes=64KiB&checkpoint_bytes=4KiB&segment_max_records=3"
    "&prealloc=none&progress_flush_ms=5&commit_interval_ms=2"
)
NAMES = st.sampled_from(["a", "b"])
#: each name's config; another cap is config_mismatch (INST-5), one below N bad_option (INST-9)
CAPS = {"a": None, "b": 7}


class _Pick:
    """A stand-in for ``st.data()`` in the set-up: always draws ``value``."""

    def __init__(self, value: object) -> None:
        self.value = value

    def draw(self, strategy: object) -> object:
        return self.value


class InstancesMachine(RuleBasedStateMachine):
    """INST-3..INST-5, INST-7..INST-9, INST-15..INST-17 against tidelog.model.instances."""

    @initialize()
    def start(self) -> None:
        self.root = tempfile.mkdtemp(prefix="tidelog-instances-")
        self.uri = f"file://{self.root}/s?instances={N}&{OPTIONS}"
        self.clock = FakeClock(10_000)
        self.model = InstancesModel(N, self.clock)
        self.stores: dict[int, tidelog.Store] = {}
        self.counter = 0
        self.cursors: list[str | None] = [None]
        for _ in range(2):
            self._open()
        self.create_topic(_Pick(0), "a", False)
        self.view = tidelog.open(self.uri, readonly=True, clock=self.clock)
        self.subs: dict[str, tuple[MergedSubscriber, list[int]]] = {}  # topic -> real, model
        self.polled: dict[str, list[str]] = {}
        self.subscribe(_Pick(self.view), "a", "earliest")

    def teardown(self) -> None:
        for store in list(getattr(self, "stores", {}).values()):
            store.close()
        if hasattr(self, "view"):
            self.view.close()
        if hasattr(self, "root"):
            shutil.rmtree(self.root, ignore_errors=True)

    def _open(self) -> None:
        store = tidelog.open(self.uri, clock=self.clock)
        slot = store.describe()["slot"]
        assert slot == self.model.take()
        self.stores[slot] = store  # type: ignore[index]

    def _same(self, real: object, model: object) -> None:
        """Both returned the same value, or raised errors of the same code."""
        assert real == model, (real, model)

    @staticmethod
    def _call(fn):  # type: ignore[no-untyped-def]
        try:
            return fn()
        except TidelogError as exc:
            return ("error", exc.code)

    # -- slots ------------------------------------------------------------------------------
    @precondition(lambda self: len(self.stores) < N)
    @rule()
    def open_store(self) -> None:
        self._open()

    @precondition(lambda self: len(self.stores) > 1)
    @rule(data=st.data(), crash=st.booleans())
    def close_store(self, data: st.DataObject, crash: bool) -> None:
        slot = data.draw(st.sampled_from(sorted(self.stores)))
        store = self.stores.pop(slot)
        if crash:  # what SIGKILL leaves; fsync topics keep every acknowledged op (DUR-2)
            hooks(store, Abandon).abandon()
        else:
            store.close()
        self.model.release(slot, self.clock)

    # -- topics and appends -----------------------------------------------------------------
    @rule(data=st.data(), name=NAMES, other=st.booleans())
    def create_topic(self, data: st.DataObject | _Pick, name: str, other: bool) -> None:
        slot = data.draw(st.sampled_from(sorted(self.stores)))
        cap = CAPS[name]
        if other:
            cap = data.draw(st.sampled_from([2, 12]))
        options = {} if cap is None else {"cap_records": cap}
        real = self._call(lambda: self.stores[slot].topic(name, **options).name)
        model = self._call(lambda: self.model.topic(slot, name, options).name)
        self._same(real, model)
        self._same(self.stores[slot].topics(), self.model.topics())

    @rule(data=st.data(), name=NAMES, n=st.integers(1, 3))
    def append(self, data: st.DataObject, name: str, n: int) -> None:
        """Appends in one or more instances, in a drawn order, at one clock reading."""
        if name not in self.model.configs:
            return
        slots = data.draw(st.permutations(sorted(self.stores)))
        for slot in slots[: data.draw(st.integers(1, len(slots)))]:
            payloads = [f"{slot}/{self.counter + k}".encode() for k in range(n)]
            self.counter += n
            self._same(
                self._append_real(slot, name, payloads), self._append_model(slot, name, payloads)
            )

    def _append_real(self, slot: int, name: str, payloads: list[bytes]) -> object:
        return self._call(lambda: self.stores[slot].topic(name, create=False).append_many(payloads))

    def _append_model(self, slot: int, name: str, payloads: list[bytes]) -> object:
        def go() -> list[int]:
            self.model.topic(slot, name, {})
            return self.model.append(slot, name, payloads)

        return self._call(go)

    @rule(ms=st.integers(-2, 5))
    def tick(self, ms: int) -> None:
        self.clock.advance(ms)

    # -- merged reads -----------------------------------------------------------------------
    @rule(data=st.data(), name=NAMES, limit=st.integers(1, 8), from_view=st.booleans())
    def read(self, data: st.DataObject, name: str, limit: int, from_view: bool) -> None:
        if name not in self.model.configs:
            return
        cursor = data.draw(st.sampled_from(self.cursors))
        if from_view:
            store = self.view
        else:
            store = self.stores[data.draw(st.sampled_from(sorted(self.stores)))]
        real = merged(store.topic(name, create=False)).read(cursor, limit)
        items, text = self.model.read(name, cursor, limit)
        self._same(real.items, items)
        self._same(real.cursor, text)
        if len(self.cursors) < 8:
            self.cursors.append(text)

    # -- merged subscribers (INST-15..INST-17) ---------------------------------------------
    @rule(data=st.data(), name=NAMES, start=st.sampled_from(["earliest", "latest"]))
    def subscribe(self, data: st.DataObject | _Pick, name: str, start: str) -> None:
        """Registered from the view or a writer; then a new handle on the view (which lives as
        long as the test), with fresh session positions."""
        if name not in self.model.configs:
            return
        stores = [self.view, *(self.stores[k] for k in sorted(self.stores))]
        store = data.draw(st.sampled_from(stores))
        merged(store.topic(name, create=False)).subscribe("s", start)
        self.model.subscribe(name, "s", start)
        real = merged(self.view.topic(name, create=False)).subscribe("s")
        self.subs[name] = (real, [0] * N)
        self._same(real.hwm, self._hwm(name))

    def _hwm(self, name: str) -> str:
        return ".".join(str(h or 0) for h in self.model.hwms(name, "s"))

    @precondition(lambda self: self.subs)
    @rule(data=st.data(), limit=st.integers(1, 8))
    def poll(self, data: st.DataObject, limit: int) -> None:
        name = data.draw(st.sampled_from(sorted(self.subs)))
        real, session = self.subs[name]
        got = real.poll(limit)
        items, text = self.model.poll(name, "s", session, limit)
        self._same(got.items, items)
        self._same(got.cursor, text)
        self.polled.setdefault(name, []).append(text)

    @precondition(lambda self: self.polled)
    @rule(data=st.data())
    def commit(self, data: st.DataObject) -> None:
        name = data.draw(st.sampled_from(sorted(self.polled)))
        cursor = data.draw(st.sampled_from(self.polled[name]))
        real, _ = self.subs[name]
        real.commit(cursor)
        self.model.commit(name, "s", [int(p) for p in cursor.split(".")])
        self._same(real.hwm, self._hwm(name))

    @invariant()
    def every_record_once(self) -> None:
        """INST-8: reading on from the start with the returned cursors sees every live record
        of every instance once (checked on the model's side, cheap)."""
        for name in self.model.configs:
            seen, cursor = [], None
            while True:
                items, cursor = self.model.read(name, cursor, 5)
                if not items:
                    break
                seen += [(e.instance, e.item.seq) for e in items if hasattr(e.item, "seq")]
            expected = sorted((i, r.seq) for i, r in self.model.records(name))
            assert sorted(seen) == expected and len(set(seen)) == len(seen)


InstancesMachine.TestCase.settings = settings(
    max_examples=int(os.environ.get("TIDELOG_STATEFUL_EXAMPLES", "100")) // 4,
    stateful_step_count=30,
    deadline=None,
)
TestInstancesVsModel = InstancesMachine.TestCase
