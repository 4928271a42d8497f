"""The instances store against its model (tidelog.model.instances), stateful: two instances
held by two stores in this process (each applies the other's XPR-2 requests on its
maintenance tick, or itself when the other is closed: XPR-3), with creates, appends, a
holder closing and reopening (INST-3), drops and re-creates (INST-6), merged
subscribers with per-seq acks (INST-15, INST-16, INST-18), unregistered and registered again
(INST-22), and deletes (INST-19). After every
step the merged read of the whole topic (INST-7) is the model's, entry for entry."""

from __future__ import annotations

import shutil
import tempfile

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from tidelog import FakeClock
from tidelog.api import Store, Topic
from tidelog.backends.instances import MergedSubscriber, merged, open_instances
from tidelog.errors import NoSuchTopic
from tidelog.fsio import OsFS
from tidelog.model.instances import Entry, InstancesModel, cursor_text
from tidelog.records import Record

N = 2
OPTIONS = {"instances": N, "prealloc": "none", "wal_file_bytes": "64KiB"}
TAGS = st.sampled_from([None, "a", "b"])


def _view(entries: list[Entry]) -> list[tuple[object, ...]]:
    out: list[tuple[object, ...]] = []
    for e in entries:
        item = e.item
        if isinstance(item, Record):
            out.append((e.instance, item.seq, item.ts, item.tag, item.payload))
        else:
            out.append((e.instance, "gap", item.gap_from, item.gap_to))
    return out


class InstancesMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.dir = tempfile.mkdtemp(prefix="tidelog-inst-")
        self.clock = FakeClock()
        self.model = InstancesModel(N, self.clock)
        self.stores = [
            Store(open_instances(OsFS(), self.dir, self.clock, OPTIONS), f"file://{self.dir}")
            for _ in range(N)
        ]
        self.model.held = {0, 1}
        self.handles: dict[int, Topic] = {}
        self.closed: int | None = None  # a slot nobody holds: requests are handed off (XPR-3)
        self.sub_on = 0
        self.sub: MergedSubscriber | None = None
        self.session = [0] * N
        self.polled: list[Entry] = []
        self.n = 0

    def teardown(self) -> None:
        try:
            for i, s in enumerate(self.stores):
                if i != self.closed:
                    s.close()
        finally:
            shutil.rmtree(self.dir, ignore_errors=True)

    @precondition(lambda self: self.closed is None)
    @rule(i=st.integers(0, N - 1))
    def close(self, i: int) -> None:
        """INST-3: a holder closes; its instance is held by nobody until it reopens."""
        self.stores[i].close()
        self.model.release(i, self.clock)
        self.closed = i
        self.handles.pop(i, None)
        if self.sub is not None and self.sub_on == i:
            self.sub, self.polled, self.session = None, [], [0] * N

    @precondition(lambda self: self.closed is not None)
    @rule()
    def reopen(self) -> None:
        """INST-3: the next open takes the free slot, recovered."""
        i = self.closed
        assert i is not None
        store = Store(open_instances(OsFS(), self.dir, self.clock, OPTIONS), f"file://{self.dir}")
        self.stores[i] = store
        assert store.describe()["slot"] == i == self.model.take()
        self.closed = None
        if "t" in self.model.configs:
            self.create(i)

    @rule(i=st.integers(0, N - 1))
    def create(self, i: int) -> None:
        """INST-5: every instance opens the shared topic (the first creates it)."""
        if i == self.closed:
            return
        self.model.topic(i, "t", {})
        self.handles[i] = self.stores[i].topic("t")
        assert self.handles[i].incarnation == self.model.incarnations["t"]

    @precondition(lambda self: self.handles)
    @rule(i=st.integers(0, N - 1), count=st.integers(1, 3), tag=TAGS, tick=st.integers(0, 2))
    def append(self, i: int, count: int, tag: str | None, tick: int) -> None:
        if i not in self.handles:
            return
        self.clock.advance(tick)
        payloads = [b"p%d" % (self.n + k) for k in range(count)]
        self.n += count
        ref = self.model._ref(i, "t")
        assert ref is not None
        want = self.model.stores[i].append(ref, payloads, tag, None)
        got = self.handles[i].append_many(payloads, tag=tag)
        assert got == want

    @precondition(lambda self: self.handles)
    @rule(i=st.integers(0, N - 1))
    def drop(self, i: int) -> None:
        """INST-6: gone everywhere; every handle from before raises no_such_topic."""
        if i == self.closed:
            i = 1 - i
        self.model.drop("t")
        self.stores[i].drop_topic("t")
        stale, self.handles = list(self.handles.values()), {}
        self.sub, self.polled, self.session = None, [], [0] * N
        for old in stale:
            try:
                old.append(b"x")
            except NoSuchTopic:
                pass
            else:
                raise AssertionError("a handle from before the drop appended")

    @precondition(lambda self: self.handles)
    @rule(tag=st.sampled_from(["a", "b"]), use_glob=st.booleans())
    def delete_tag(self, tag: str, use_glob: bool) -> None:
        """INST-19: a tag delete in every instance."""
        i = min(self.handles)
        if use_glob:
            want = self.model.delete("t", None, None, tag + "*")
            got = self.handles[i].delete(tag_glob=tag + "*")
        else:
            want = self.model.delete("t", None, tag, None)
            got = self.handles[i].delete(tag=tag)
        assert got == want

    @precondition(lambda self: self.handles)
    @rule(positions=st.lists(st.integers(0, 8), min_size=N, max_size=N))
    def delete_before(self, positions: list[int]) -> None:
        """INST-19: a merged delete bounded by a cursor."""
        i = max(self.handles)
        want = self.model.delete("t", positions, None, None)
        assert merged(self.handles[i]).delete(before=cursor_text(positions)) == want

    @precondition(lambda self: self.handles and self.sub is None)
    @rule()
    def subscribe(self) -> None:
        i = min(self.handles)
        self.model.subscribe("t", "s", "earliest")
        self.sub = merged(self.handles[i]).subscribe("s")
        self.sub_on = i

    @precondition(lambda self: self.sub is not None)
    @rule()
    def unregister(self) -> None:
        """INST-22: gone from every instance; a later subscribe of the name starts anew."""
        assert self.sub is not None
        self.model.unregister("t", "s")
        self.sub.unregister()
        self.sub, self.polled, self.session = None, [], [0] * N

    @precondition(lambda self: self.sub is not None)
    @rule(limit=st.integers(1, 5))
    def poll(self, limit: int) -> None:
        """INST-16: the same items as the model's poll, session positions alike."""
        assert self.sub is not None
        want, want_cursor = self.model.poll("t", "s", self.session, limit)
        got, cursor = self.sub.poll(limit)
        assert _view(got) == _view(want)
        assert cursor == want_cursor
        self.polled = [e for e in got if isinstance(e.item, Record)]

    @precondition(lambda self: self.polled)
    @rule(k=st.integers(0, 4), reject=st.booleans())
    def settle(self, k: int, reject: bool) -> None:
        """INST-18: ack or reject one polled record in its instance."""
        assert self.sub is not None
        e = self.polled[k % len(self.polled)]
        op = "reject" if reject else "ack"
        want = self.model.settle("t", "s", e.instance, e.item.seq, op)
        got = (self.sub.reject if reject else self.sub.ack)(e.instance, e.item.seq)
        assert got == want

    @invariant()
    def merged_read_is_the_models(self) -> None:
        """INST-7: the whole topic, merged, as the model has it (and the hwms, INST-17)."""
        if not self.handles:
            open_one = self.stores[1 if self.closed == 0 else 0]
            assert open_one.topics() == self.model.topics()
            return
        handle = self.handles[min(self.handles)]
        want, _ = self.model.read("t", None, 1000)
        got = merged(handle).read(None, 1000).items
        assert _view(got) == _view(want)
        if self.sub is not None:
            hwms = [h or 0 for h in self.model.hwms("t", "s")]
            assert self.sub.hwm == cursor_text(hwms)


InstancesMachine.TestCase.settings = settings(
    max_examples=12, stateful_step_count=14, deadline=None
)
test_INST_6_INST_18_INST_19_the_store_is_its_model = InstancesMachine.TestCase
