"""Several writer processes on one file:// store (spec/INSTANCES.md), in one test process:
every open takes its own slot, as separate processes do (tests/crash/test_instances_processes.py
runs them as processes)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import instances_helpers
import pytest
from instances_helpers import open_in

import tidelog
from tidelog import FakeClock
from tidelog.api import Store
from tidelog.backends.instances import Entry, merged, open_instances
from tidelog.errors import (
    BadArgument,
    BadOption,
    BadURI,
    ConfigMismatch,
    Locked,
    NoSuchTopic,
    NotAvailable,
    ReadOnly,
    TopicFull,
)
from tidelog.fsio import OsFS
from tidelog.hooks import Abandon, hooks
from tidelog.model.instances import cursor_text, parse_cursor
from tidelog.records import Record, Tombstone

opened = instances_helpers.opened  # the fixture


def _open(stores: list[tidelog.Store], root: Path, query: str = "instances=3", **kw: object):
    return open_in(stores, root, query, **kw)


def _all(topic: tidelog.Topic, cursor: str | None = None, limit: int = 2) -> list[Entry]:
    """Every entry, read ``limit`` at a time with the cursor each read returns."""
    out: list[Entry] = []
    m = merged(topic)
    while True:
        items, cursor = m.read(cursor, limit)
        if not items:
            return out
        out += items


# -- INST-1: the option --------------------------------------------------------------------
@pytest.mark.parametrize("value", ["0", "257", "x", "2.5", "-1"])
def test_INST_1_a_bad_count_is_bad_option_and_creates_nothing(tmp_path: Path, value: str) -> None:
    """INST-1, URI-2: instances is 1..256 or auto, checked before anything is created."""
    with pytest.raises(BadOption, match="instances"):
        tidelog.open(f"file://{tmp_path}/s?instances={value}")
    assert not (tmp_path / "s").exists()


def test_INST_1_the_count_is_fixed_at_creation(tmp_path: Path, opened: list) -> None:
    """INST-1: auto is os.cpu_count() at creation and the stored count after; an explicit
    count that differs is bad_option naming both."""
    first = _open(opened, tmp_path, "instances=auto")
    assert hooks(first, type(first._backend)).n == (os.cpu_count() or 1)
    first.close()
    with pytest.raises(BadOption, match=rf"has {os.cpu_count() or 1} instances"):
        tidelog.open(f"file://{tmp_path}?instances={(os.cpu_count() or 1) + 1}")
    again = _open(opened, tmp_path, "instances=auto")
    assert merged(again.topic("t")).instances == (os.cpu_count() or 1)


def test_INST_1_one_layout_is_never_opened_as_the_other(tmp_path: Path) -> None:
    """INST-1: an instances root opened without the option, or a single store opened with it,
    is bad_option: a reader never sees one instance as the whole store."""
    with tidelog.open(f"file://{tmp_path}/multi?instances=2") as s:
        s.topic("t").append(b"x")
    with pytest.raises(BadOption, match=r"instances=2"):
        tidelog.open(f"file://{tmp_path}/multi")
    with pytest.raises(BadOption, match=r"instances=2"):
        tidelog.open(f"file://{tmp_path}/multi", readonly=True)
    tidelog.open(f"file://{tmp_path}/single").close()
    with pytest.raises(BadOption, match="single-instance"):
        tidelog.open(f"file://{tmp_path}/single?instances=2")
    (tmp_path / "junk").mkdir()
    (tmp_path / "junk" / "x").write_text("x")
    with pytest.raises(BadURI):
        tidelog.open(f"file://{tmp_path}/junk?instances=2")


# -- INST-2: the layout ----------------------------------------------------------------------
def test_INST_2_layout_shared_part_and_instance_stores(tmp_path: Path, opened: list) -> None:
    """INST-2: instances.json and config/<topic>.json in canonical JSON; each instance a file
    store in instances/<i>/ (LAY-1), created when its slot is first taken."""
    a = _open(opened, tmp_path, "instances=3")
    a.topic("ev", cap_records=9)
    ident = json.loads((tmp_path / "instances.json").read_bytes())
    assert ident["instances"] == 3 and ident["version"] == 1 and len(ident["store_id"]) == 32
    raw = (tmp_path / "config" / "ev.json").read_bytes()
    body = json.loads(raw)
    assert body["name"] == "ev" and body["config"]["cap_records"] == 9
    assert raw == json.dumps(body, separators=(",", ":"), sort_keys=True).encode()
    assert sorted(os.listdir(tmp_path / "instances")) == ["0"]
    assert (tmp_path / "instances" / "0" / "meta").is_dir()
    _open(opened, tmp_path)
    assert sorted(os.listdir(tmp_path / "instances")) == ["0", "1"]
    assert not any(n.endswith(".tmp") for n in os.listdir(tmp_path / "config"))


# -- INST-3: slots -------------------------------------------------------------------------
def test_INST_3_each_open_takes_the_lowest_free_slot(tmp_path: Path, opened: list) -> None:
    """INST-3: N opens take slots 0..N-1; one more is locked naming the holders; a closed
    slot is taken again by the next open, with its records."""
    stores = [_open(opened, tmp_path) for _ in range(3)]
    assert [s.describe()["slot"] for s in stores] == [0, 1, 2]
    with pytest.raises(Locked, match=rf"pid {os.getpid()}"):
        tidelog.open(f"file://{tmp_path}?instances=3")
    t = stores[1].topic("t")
    assert t.append_many([b"a", b"b"]) == [1, 2]
    stores[1].close()
    again = _open(opened, tmp_path)
    assert again.describe()["slot"] == 1
    assert again.topic("t").append(b"c") == 3  # the instance's seqs go on (TOP-1)


def test_INST_3_a_dead_holders_slot_is_recovered_then_taken(tmp_path: Path, opened: list) -> None:
    """INST-3: a holder that dies (abandon: what SIGKILL leaves) frees its slot; the next
    opener recovers the instance and every acknowledged fsync record is there."""
    a = _open(opened, tmp_path, "instances=2")
    b = _open(opened, tmp_path, "instances=2")
    ta, tb = a.topic("t"), b.topic("t")
    acked = [ta.append(f"a{i}".encode()) for i in range(20)]
    tb.append(b"b0")
    hooks(a, Abandon).abandon()
    opened.remove(a)
    tb.append(b"b1")  # the others go on
    c = _open(opened, tmp_path, "instances=2")
    assert c.describe()["slot"] == 0
    got = [(e.instance, e.item.payload) for e in _all(c.topic("t"), limit=7)]
    assert sorted(p for i, p in got if i == 0) == sorted(f"a{i}".encode() for i in range(20))
    assert [p for i, p in got if i == 1] == [b"b0", b"b1"]
    assert c.topic("t").append(b"a20") == acked[-1] + 1


# -- INST-4: read-only -----------------------------------------------------------------------
def test_INST_4_a_read_only_store_takes_no_slot(tmp_path: Path, opened: list) -> None:
    """INST-4: readonly=true opens views of every instance, takes no slot, writes nothing;
    refresh picks up instances and records written since."""
    a = _open(opened, tmp_path, "instances=2")
    a.topic("t").append(b"a")
    view = _open(opened, tmp_path, "instances=2", readonly=True)
    b = _open(opened, tmp_path, "instances=2")  # the view holds no slot
    b.topic("t").append(b"b")
    vt = view.topic("t")
    assert sorted(e.item.payload for e in _all(vt)) == [b"a", b"b"]  # merged reads refresh
    with pytest.raises(ReadOnly):
        vt.append(b"x")
    with pytest.raises(ReadOnly):
        view.topic("new")
    with pytest.raises(NoSuchTopic):
        view.topic("new", create=False)
    with pytest.raises(NotAvailable, match="INST-10"):
        vt.state()
    with pytest.raises(tidelog.StorageError):
        tidelog.open(f"file://{tmp_path}/absent?instances=2", readonly=True)


# -- INST-5: shared config -------------------------------------------------------------------
def test_INST_5_topic_config_is_shared_and_decided_once(tmp_path: Path, opened: list) -> None:
    """INST-5, TOP-9: the first creator's config is every instance's; a different value is
    config_mismatch; no keys gets the stored config; create=False needs the shared file."""
    a = _open(opened, tmp_path, "instances=2")
    b = _open(opened, tmp_path, "instances=2")
    a.topic("ev", durability="disk", cap_records=10)
    with pytest.raises(ConfigMismatch, match="durability"):
        b.topic("ev", durability="fsync")
    tb = b.topic("ev", create=False)
    assert tb.config.durability == "disk" and tb.config.cap_records == 10
    with pytest.raises(NoSuchTopic):
        b.topic("other", create=False)
    b.topic("b-first")
    assert a.topics() == b.topics() == ["b-first", "ev"]
    assert a.topic("b-first", create=False).config == b.topic("b-first").config


def test_INST_5_a_bad_config_writes_no_shared_file(tmp_path: Path, opened: list) -> None:
    """INST-5, INST-9: a config refused (a bad value, a cap below N) leaves no shared file."""
    a = _open(opened, tmp_path, "instances=4")
    with pytest.raises(BadOption):
        a.topic("t", durability="never")
    with pytest.raises(BadOption, match="INST-9"):
        a.topic("t", cap_records=3)
    assert a.topics() == []


# -- INST-7, INST-8: the merged read and its cursor ------------------------------------------
def test_INST_7_merged_order_is_commit_time_then_instance(tmp_path: Path, opened: list) -> None:
    """INST-7: records merge by (ts, instance, seq); one instance's items keep their order."""
    clock = FakeClock(1000)
    a = _open(opened, tmp_path, "instances=2", clock=clock)
    b = _open(opened, tmp_path, "instances=2", clock=clock)
    ta, tb = a.topic("t"), b.topic("t")
    tb.append(b"b@1000")
    ta.append(b"a@1000")
    clock.advance(5)
    ta.append(b"a@1005")
    clock.advance(-3)  # a clock stepping back: b's ts is 1002, a's stays clamped (TOP-5)
    tb.append(b"b@1002")
    ta.append(b"a@1005'")
    got = [(e.instance, e.item.payload) for e in merged(ta).read().items]
    assert got == [
        (0, b"a@1000"),
        (1, b"b@1000"),
        (1, b"b@1002"),
        (0, b"a@1005"),
        (0, b"a@1005'"),
    ]


def test_INST_7_a_tombstone_comes_as_soon_as_its_instance_allows(
    tmp_path: Path, opened: list
) -> None:
    """INST-7, TMB-1, INST-9: an instance that evicted at its cap share gives its tombstone
    first, before any later record of any instance; a batch over the share is too_large."""
    clock = FakeClock(1000)
    a = _open(opened, tmp_path, "instances=2", clock=clock)
    b = _open(opened, tmp_path, "instances=2", clock=clock)
    tb = b.topic("t", cap_records=4)  # 2 per instance
    ta = a.topic("t")
    ta.append(b"a1")
    clock.advance(1)
    for p in (b"b1", b"b2", b"b3"):  # b1 evicted
        tb.append(p)
    with pytest.raises(tidelog.TooLarge):  # RET-5 against the share
        tb.append_many([b"1", b"2", b"3"])
    items = merged(ta).read(limit=10).items
    assert items[0] == Entry(1, Tombstone(1, 1))
    assert [(e.instance, e.item.payload) for e in items[1:]] == [
        (0, b"a1"),
        (1, b"b2"),
        (1, b"b3"),
    ]


def test_INST_8_the_cursor_resumes_exactly_once(tmp_path: Path, opened: list) -> None:
    """INST-8: reading on with the returned cursor sees every record of every instance once,
    also while appends go on between reads; the same cursor with nothing new reads the same."""
    stores = [_open(opened, tmp_path, "instances=3") for _ in range(3)]
    topics = [s.topic("t") for s in stores]
    m = merged(topics[0])
    seen: list[tuple[int, int]] = []
    cursor = None
    for round_ in range(6):
        for i, t in enumerate(topics):
            t.append_many([f"{i}:{round_}:{k}".encode() for k in range(i + 1)])
        items, cursor = m.read(cursor, limit=4)
        seen += [(e.instance, e.item.seq) for e in items]
    seen += [(e.instance, e.item.seq) for e in _all(topics[0], cursor, limit=5)]
    expected = [(i, q) for i in range(3) for q in range(1, 6 * (i + 1) + 1)]
    assert sorted(seen) == expected and len(seen) == len(expected)
    first = m.read("1.0.2", limit=5)
    assert m.read("1.0.2", limit=5) == first
    assert first.cursor == cursor_text(parse_cursor(first.cursor, 3))


@pytest.mark.parametrize("bad", ["1.2", "1.2.3.4", "a.b.c", "1..2", " 1.2.3", "-1.0.0", 7])
def test_INST_8_a_bad_cursor_is_bad_argument(tmp_path: Path, opened: list, bad: object) -> None:
    """INST-8: a cursor of another length or syntax is bad_argument; so is limit < 1."""
    t = _open(opened, tmp_path, "instances=3").topic("t")
    with pytest.raises(BadArgument):
        merged(t).read(bad, 10)  # type: ignore[arg-type]
    with pytest.raises(BadArgument):
        merged(t).read(None, 0)
    assert merged(t).read("", 5).cursor == "0.0.0"


def test_INST_7_wait_ms_waits_for_another_instance(tmp_path: Path, opened: list) -> None:
    """INST-7, CON-3: an empty merged read with wait_ms returns what another instance
    appends meanwhile."""
    import threading

    a = _open(opened, tmp_path, "instances=2")
    b = _open(opened, tmp_path, "instances=2")
    ta, tb = a.topic("t"), b.topic("t")
    timer = threading.Timer(0.1, lambda: tb.append(b"late"))
    timer.start()
    try:
        items = merged(ta).read(None, 10, wait_ms=5000).items
    finally:
        timer.join()
    assert [e.item.payload for e in items] == [b"late"]
    assert merged(ta).read("0.1", 10, wait_ms=30).items == []


# -- INST-9: caps divided --------------------------------------------------------------------
def test_INST_9_caps_are_divided_and_never_overshoot(tmp_path: Path, opened: list) -> None:
    """INST-9: each instance holds cap // N; the live total never exceeds the cap; one
    instance alone holds cap // N (discard=old evicts, discard=reject refuses)."""
    a = _open(opened, tmp_path, "instances=3")
    b = _open(opened, tmp_path, "instances=3")
    ta = a.topic("old", cap_records=10, cap_bytes=1000)
    tb = b.topic("old")
    for _ in range(10):
        ta.append_many([b"x" * 10] * 2)
        tb.append(b"y" * 10)
        live = ta.state().count + tb.state().count
        assert live <= 10
    assert ta.state().count == tb.state().count == 3
    assert ta.config.cap_records == 10  # the shared, undivided config
    rj = a.topic("rej", cap_records=6, discard="reject")
    rj.append_many([b"1", b"2"])
    with pytest.raises(TopicFull):
        rj.append(b"3")
    facts = a.describe()["per_instance"]["0"]["topics"]["rej"]
    assert facts["count"] == 2 and facts["cap_fraction"] == 1.0


def test_INST_9_max_bytes_is_divided(tmp_path: Path, opened: list) -> None:
    """INST-9, RET-6: each instance gets max_bytes // N; below N is bad_option."""
    with pytest.raises(BadOption, match="INST-9"):
        tidelog.open(f"file://{tmp_path}/x?instances=4&max_bytes=3")
    assert not (tmp_path / "x").exists()
    a = _open(opened, tmp_path, "instances=2&max_bytes=100")
    t = a.topic("t")
    t.append(b"x" * 50)
    with pytest.raises(tidelog.StoreFull):
        t.append(b"x")


# -- INST-10: what an instances store offers -------------------------------------------------
def test_INST_10_capabilities_and_the_own_instance(tmp_path: Path, opened: list) -> None:
    """INST-10: subscribers, queue and routers are not claimed (not_available), deletes are
    (INST-19); Topic.read is not_available; state() and seqs are the own instance's."""
    a = _open(opened, tmp_path, "instances=2")
    b = _open(opened, tmp_path, "instances=2")
    caps = a.capabilities
    assert caps.persistent and caps.crash_safe and caps.multi_topic
    assert caps.deletes and not (caps.subscribers or caps.queue or caps.routers)
    ta, tb = a.topic("t"), b.topic("t")
    assert ta.append(b"a") == 1 and tb.append(b"b") == 1
    assert ta.append_records([(b"c", "tag", None)]) == [2]
    assert ta.state().head_seq == 2 and tb.state().head_seq == 1
    with pytest.raises(NotAvailable, match="INST-7"):
        ta.read()
    for call in (
        lambda: ta.subscribe("s"),
        lambda: ta.claim("n"),
        lambda: a.router("r", "t", "t"),
    ):
        with pytest.raises(NotAvailable):
            call()
    got = [e.item for e in merged(tb).read().items]
    assert all(isinstance(r, Record) for r in got) and len(got) == 3
    per = a.describe()["per_instance"]
    assert [per[i]["mine"] for i in ("0", "1")] == [True, False]
    assert per["1"]["lock_pid"] == str(os.getpid())
    assert per["0"]["topics"]["t"]["head_seq"] == 2


def test_INST_10_merged_needs_an_instances_store(tmp_path: Path) -> None:
    """INST-7, INST-10: merged() of a topic of another store is not_available."""
    with tidelog.open("memory://") as s, pytest.raises(NotAvailable):
        merged(s.topic("t"))


# -- INST-11, INST-12: other schemes and tools -----------------------------------------------
def test_INST_11_other_schemes_refuse_instances(tmp_path: Path) -> None:
    """INST-11: memory://, blockdev:// and sf:// refuse the option with bad_option, nothing
    created."""
    for uri in (
        "memory://?instances=2",
        f"blockdev://{tmp_path}/img?size=1MiB&instances=2",
        f"sf://{tmp_path}/slot?instances=2",
    ):
        with pytest.raises(BadOption, match="INST-11"):
            tidelog.open(uri)
    assert os.listdir(tmp_path) == []


def test_INST_12_spark_refuses_instances(tmp_path: Path, opened: list) -> None:
    """INST-12: the Spark source's view (file://<root>, readonly) gets INST-1's bad_option, and
    so does an XPR-2 request to the root (the sink's ingest, the source's commit), nothing
    written. (The forwarder drains an instances store: test_forward_instances.py, FWD-33.)"""
    _open(opened, tmp_path, "instances=2").topic("t")
    from tidelog.adapters.spark import reading
    from tidelog.backends.file import requests

    with pytest.raises(BadOption, match="INST-1"):
        reading.view(str(tmp_path))
    before = sorted(os.listdir(tmp_path))
    body = {"op": "commit", "topic": "t", "subscriber": "s", "seq": 1}
    with pytest.raises(BadOption, match="INST-1"):
        requests.call(str(tmp_path), body)
    assert sorted(os.listdir(tmp_path)) == before  # no requests/ written into the root


class _RacingFS(OsFS):
    """An OsFS on which another process creates ``target`` right after the first check that
    finds it missing: what two openers of a new store racing for one slot see."""

    def __init__(self, target: str) -> None:
        super().__init__()
        self.target = target
        self.raced = False

    def is_dir(self, path: str) -> bool:
        answer = super().is_dir(path)
        if path == self.target and not answer and not self.raced:
            self.raced = True
            os.mkdir(path)  # the other opener, between this check and the next step
        return answer


def test_INST_2_an_instance_directory_made_meanwhile_is_no_refusal(tmp_path: Path) -> None:
    """INST-2, INST-3: an instance directory another opener creates between this opener's
    check and its use is taken as it is (it was a URI-8 bad_uri, seen with eight processes
    opening a new store at once)."""
    tidelog.open(f"file://{tmp_path}?instances=2").close()  # the shared part exists
    target = os.path.join(tmp_path, "instances", "1")
    fs = _RacingFS(target)
    holder = tidelog.open(f"file://{tmp_path}?instances=2")  # slot 0
    try:
        store = Store(open_instances(fs, str(tmp_path), FakeClock(), {"instances": 2}), "x")
        try:
            assert fs.raced and store.describe()["slot"] == 1
        finally:
            store.close()
    finally:
        holder.close()


def test_INST_2_a_root_made_meanwhile_is_no_refusal(tmp_path: Path) -> None:
    """INST-2, URI-8: the root another opener of a new store creates between this opener's
    check and its mkdir is opened as it is, not refused as "exists and is not a directory"."""
    root = os.path.join(tmp_path, "new")
    fs = _RacingFS(root)
    store = Store(open_instances(fs, root, FakeClock(), {"instances": 2}), "x")
    try:
        assert fs.raced and store.describe()["slot"] == 0
    finally:
        store.close()
