"""Mutant implementations: tidelog with one planted defect each (CNF-32, "proof the suite can
fail"). Each is a thin subclass of a real backend, of the recording FS, of the SF sender or of
the driver, never a copy; ``make_driver`` serves one of them over the driver protocol:

    tidelog conformance driver --load tests/conformance/mutants.py --uri tombstone-missing

``MUTANTS`` names every mutant with the rule it breaks and the conformance level that binds that
rule; tests/conformance/test_mutants.py runs that level against each through a driver process
and asserts the suite fails it. This file is loaded by path (``--load``), not imported as a test.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from tidelog.api import Store
from tidelog.backend import StoreOptions, TopicRef
from tidelog.backends.common.routing import Routing
from tidelog.backends.memory import MemoryBackend
from tidelog.clock import Clock, FakeClock
from tidelog.conformance.crashfs import RecordingFS
from tidelog.conformance.driver import Driver
from tidelog.conformance.forwarding import SlotSender
from tidelog.conformance.sut import SF_DIR, LocalSut
from tidelog.errors import BadArgument, TopicFull
from tidelog.forward.ackstate import ConnState
from tidelog.named import NamedStores
from tidelog.records import Item, Record, Tombstone

__all__ = ["MUTANTS", "Mutant", "make_driver"]


@dataclass(frozen=True)
class Mutant:
    name: str
    rule: str  # the spec rule the defect breaks
    level: str  # the conformance level that binds it
    defect: str
    template: str  # the store template its driver serves
    fs: str  # the driver's --fs
    build: Callable[[str, str], Driver]


FILE = (
    "file:///m/{name}?background=false&commit_interval_ms=60000&prealloc=none"
    "&wal_file_bytes=64KiB&checkpoint_bytes=4KiB"
    "&segment_max_records=4&head_reserve=3"
)
BLOCKDEV = "blockdev:///m/{name}.img?size=7168&page_size=512&topic=t0"


# -- memory backend subclasses ------------------------------------------------------------------
class _MemorySut(LocalSut):
    """memory://NAME stores built from a MemoryBackend subclass (named: reopen applies DUR-1)."""

    backend_cls: type[MemoryBackend] = MemoryBackend

    def __init__(self) -> None:
        super().__init__("memory://{name}")
        self.named: NamedStores[MemoryBackend] = NamedStores("memory")

    def open(self, name: str, clock: FakeClock) -> Store:
        opts = StoreOptions()
        backend = self.named.open(name, opts, clock, lambda: self.backend_cls(clock, opts, name))
        self.store = Store(backend, f"memory://{name}")
        return self.store

    def dispose(self, name: str) -> None:
        super().dispose(name)
        self.named.forget(name)


class NoTombstone(MemoryBackend):
    """TMB-1: reads leave out the tombstone of an eviction (silent loss)."""

    def read(self, ref: TopicRef, after: int, limit: int, exclude_node: str | None) -> list[Item]:
        return [i for i in super().read(ref, after, limit, exclude_node) if isinstance(i, Record)]


class DeleteTombstone(MemoryBackend):
    """TMB-4: a voluntary delete is reported to readers as a tombstone."""

    def __init__(self, clock: Clock, options: StoreOptions, name: str | None) -> None:
        super().__init__(clock, options, name)
        self.deleted: dict[TopicRef, list[tuple[int, int]]] = {}

    def _live(self, ref: TopicRef) -> set[int]:
        return {i.seq for i in super().read(ref, 0, 10**9, None) if isinstance(i, Record)}

    def delete(
        self, ref: TopicRef, before_seq: int | None, tag: str | None, tag_glob: str | None
    ) -> int:
        live = self._live(ref)
        n = super().delete(ref, before_seq, tag, tag_glob)
        for seq in sorted(live - self._live(ref)):
            self.deleted.setdefault(ref, []).append((seq, seq))
        return n

    def read(self, ref: TopicRef, after: int, limit: int, exclude_node: str | None) -> list[Item]:
        items = super().read(ref, after, limit, exclude_node)
        extra = [Tombstone(lo, hi) for lo, hi in self.deleted.get(ref, ()) if hi > after]
        merged = sorted(items + extra, key=lambda i: i[0])
        return merged[:limit]


class HwmAcrossGap(MemoryBackend):
    """SUB-2: ack(seq) moves the hwm to seq even across unresolved seqs below it."""

    def ack(self, ref: TopicRef, name: str, seq: int) -> bool:
        out = super().ack(ref, name, seq)
        super().commit(ref, name, seq)
        return out


class RejectAfterAck(MemoryBackend):
    """RET-3: a full discard="reject" topic makes room by dropping its oldest records, then
    acknowledges the append (ack-then-drop)."""

    def append(
        self,
        ref: TopicRef,
        payloads: Sequence[bytes],
        tag: str | None,
        node: str | None,
        producer: tuple[str, int] | None = None,
    ) -> list[int]:
        try:
            return super().append(ref, payloads, tag, node, producer)
        except TopicFull:
            st = self.state(ref)
            self.delete(ref, st.earliest_seq + len(payloads), None, None)
            return super().append(ref, payloads, tag, node, producer)


class LateExpiry(MemoryBackend):
    """RET-4, QUE-5: lazy time effects are evaluated one millisecond late (``<`` for ``<=``)."""

    def _tick(self, t: Any, now: int) -> None:
        super()._tick(t, now - 1)


class NackIgnoresDelay(MemoryBackend):
    """QUE-4: nack(delay_ms=d) returns the job at once."""

    def nack(self, ref: TopicRef, seq: int, lease_id: int, delay_ms: int) -> None:
        super().nack(ref, seq, lease_id, 0)


class ExcludedCount(MemoryBackend):
    """TOP-7: records skipped by exclude_node count against the limit."""

    def read(self, ref: TopicRef, after: int, limit: int, exclude_node: str | None) -> list[Item]:
        items = super().read(ref, after, limit, None)
        return [i for i in items if not (isinstance(i, Record) and i.node == exclude_node)] if (
            exclude_node is not None
        ) else items


class _TombstoneBlindRouting(Routing):
    """RTR-5: a router reads its source without the tombstones, so a gap of records it had
    not forwarded yet (evicted, expired, lost) is skipped silently: no loss range in dest."""

    def _forward(self, name: str, now: int) -> bool:
        log = self.e.topics[self.e.routers[name].source].log
        read = log.read

        def records_only(*args: Any) -> list[Item]:
            return [i for i in read(*args) if not isinstance(i, Tombstone)]

        log.read = records_only  # type: ignore[method-assign]
        try:
            return super()._forward(name, now)
        finally:
            del log.read


class SilentGap(MemoryBackend):
    """RTR-5: tombstones are not forwarded (``_TombstoneBlindRouting``)."""

    def __init__(self, clock: Clock, options: StoreOptions, name: str | None) -> None:
        super().__init__(clock, options, name)
        self.routing = _TombstoneBlindRouting(self)


def _memory(cls: type[MemoryBackend]) -> Callable[[str, str], Driver]:
    def build(template: str, fs: str) -> Driver:
        sut = type(f"{cls.__name__}Sut", (_MemorySut,), {"backend_cls": cls})()
        return Driver(sut)

    return build


# -- file backend: a lying FS and a trusting WAL scanner ------------------------------------------
class LyingFS(RecordingFS):
    """DUR-2: fsync/fdatasync of WAL files returns without making anything durable."""

    def _sync(self, ino: int, path: str, kind: str) -> None:
        if "/wal/" not in path:
            super()._sync(ino, path, kind)


class _LyingSut(LocalSut):
    def __init__(self) -> None:
        super().__init__(FILE, fs="recording")
        self.fs = LyingFS()

    def _relie(self) -> None:
        self.fs.__class__ = LyingFS  # the crash state is a plain RecordingFS: the disk still lies

    def crash(self, seed: int) -> None:
        super().crash(seed)
        self._relie()

    def crash_during(self, seed: int, op: Callable[[], object]) -> None:
        super().crash_during(seed, op)
        self._relie()

    def dispose(self, name: str) -> None:
        super().dispose(name)
        self._relie()


def _trusting_scanner() -> None:
    """WAL-5, DUR-6: a frame whose checksum fails is returned as data (torn writes replay)."""
    from tidelog.backends.file.format import wal

    real = wal._decode_at
    header = struct.Struct("<IBBQQQHHI")

    def decode_at(mv: memoryview, pos: int) -> Any:
        got = real(mv, pos)
        if isinstance(got, wal._Stop) and "checksum" in got.detail:
            frame_len, ftype, flags, topic_id, seq, ts, nl, tl, dl = header.unpack_from(mv, pos)
            at = pos + header.size
            text = bytes(mv[at : at + nl + tl]).decode("utf-8", "replace")
            node = text[:nl] if flags & 2 else None
            tag = text[nl:] if flags & 1 else None
            data = bytes(mv[at + nl + tl : at + nl + tl + dl])
            return wal.Frame(ftype, flags, topic_id, seq, ts, node, tag, data, pos, frame_len + 4)
        return got

    wal._decode_at = decode_at


def _torn_frames(template: str, fs: str) -> Driver:
    _trusting_scanner()
    return Driver(LocalSut(FILE, fs="recording"))


def _cursor_first() -> None:
    """RTR-10: forwarding makes the cursor durable in a WAL batch of its own (written and synced
    at once), before the batch holding the copies it covers: a power loss between the two keeps
    the cursor and loses the copies, which are then never made."""
    from tidelog.backends.file.format import wal
    from tidelog.backends.file.journal import WalJournal

    def router_moved(self: WalJournal, t: Any, name: str, cursor: int) -> None:
        shard = self.shards[self.shard_of(t.tid)]
        frame = wal.encode_control(
            wal.FrameType.ROUTER, t.tid, {"op": "cursor", "name": name}, seq=cursor,
            durable=t.config.durability == "fsync", seed=shard.gen,
        )  # fmt: skip
        shard.wait_synced(shard.submit(frame, shard.gen))

    WalJournal.router_moved = router_moved  # type: ignore[method-assign]


def _cursor_before_copies(template: str, fs: str) -> Driver:
    _cursor_first()
    return Driver(LocalSut(FILE, fs="recording"))


def _fan_in(template: str, fs: str) -> Driver:
    """RTR-9: a router into a dest that another source already feeds is created, not refused
    (``router_dest_fan_in``): the dest then interleaves two sources."""
    from tidelog.backends.common import routing

    real = routing.check_new

    def check_new(name: str, config: Any, old: Any, topics: Any, routers: Any) -> bool:
        same = [r for r in routers if r.dest != config.dest or r.source == config.source]
        return real(name, config, old, topics, same)

    routing.check_new = check_new
    return Driver(LocalSut("memory://{name}"))


# -- the SF sender ----------------------------------------------------------------------------
class _OffByOneSut(LocalSut):
    """FSN-1, FSN-6: after a reconnect the connection's fsnAtZero is ackedFsn + 2."""

    def new_sender(self, slot: str) -> SlotSender:
        first = [True]

        def conn(fsn_at_zero: int, durable: bool) -> ConnState:
            shift = 0 if first[0] else 1
            first[0] = False
            return ConnState(fsn_at_zero + shift, durable)

        return SlotSender(self.sf_fs, SF_DIR, slot, conn_factory=conn)


# -- blockdev ring: head detection wrong after the second wrap -----------------------------------
def _second_wrap_head() -> None:
    """RING-3: in an even lap every valid page is taken as written in this lap, which is only
    true before the first wrap: after the second, the previous lap's pages fool it."""
    from tidelog.backends.blockdev import ring
    from tidelog.model.ring import RingHead, page_seq

    real = ring.find_head

    def find_head(n: int, read_seq: Callable[[int], int | None]) -> Any:
        head = real(n, read_seq)
        if head is not None and head.parity == 0 and read_seq(n - 1) == page_seq(1, n - 1, n):
            last = max(i for i in range(n) if read_seq(i) is not None)
            return RingHead(last, 0)
        return head

    ring.find_head = find_head


def _head_wrap(template: str, fs: str) -> Driver:
    _second_wrap_head()
    return Driver(LocalSut(BLOCKDEV, fs="recording"))


# -- the driver: handles that follow the name ----------------------------------------------------
class _NameHandles(Driver):
    """TOP-10: a topic handle resolves its topic by name at every use, so after a drop and a
    re-create an old handle works on the new incarnation."""

    def _topic(self, req: dict[str, Any]) -> Any:
        name = super()._topic(req).name
        return self._store().topic(name, create=False)


MUTANTS: dict[str, Mutant] = {
    m.name: m
    for m in [
        Mutant("tombstone-missing", "TMB-1", "log", "eviction leaves no tombstone",
               "memory://{name}", "os", _memory(NoTombstone)),
        Mutant("deleted-gap-tombstone", "TMB-4", "log", "a deleted gap reads as a tombstone",
               "memory://{name}", "os", _memory(DeleteTombstone)),
        Mutant("fsync-lost", "DUR-2", "crash", "acked fsync records lost after power loss",
               FILE, "recording", lambda t, f: Driver(_LyingSut())),
        Mutant("torn-frame-accepted", "WAL-5/DUR-6", "crash", "a torn WAL frame replays as data",
               FILE, "recording", _torn_frames),
        Mutant("hwm-across-gap", "SUB-2", "subscribers", "ack moves the hwm across a gap",
               "memory://{name}", "os", _memory(HwmAcrossGap)),
        Mutant("fsn-off-by-one", "FSN-6", "forward", "FSN off by one after a reconnect",
               "memory://{name}", "os", lambda t, f: Driver(_OffByOneSut("memory://{name}"))),
        Mutant("head-second-wrap", "RING-3", "ring", "head detection wrong after the 2nd wrap",
               BLOCKDEV, "recording", _head_wrap),
        Mutant("reject-after-ack", "RET-3", "log", "a full reject topic drops acked records",
               "memory://{name}", "os", _memory(RejectAfterAck)),
        Mutant("late-expiry", "RET-4/QUE-5", "queue", "TTL and lease expiry one ms late",
               "memory://{name}", "os", _memory(LateExpiry)),
        Mutant("nack-delay-ignored", "QUE-4", "queue", "nack with a delay returns the job at once",
               "memory://{name}", "os", _memory(NackIgnoresDelay)),
        Mutant("stale-handle", "TOP-10", "log", "a dropped topic's handle reaches its successor",
               "memory://{name}", "os", lambda t, f: _NameHandles(LocalSut("memory://{name}"))),
        Mutant("excluded-count", "TOP-7", "log", "records skipped by exclude_node use the limit",
               "memory://{name}", "os", _memory(ExcludedCount)),
        Mutant("router-silent-gap", "RTR-5", "routers",
               "a source gap the router had not forwarded leaves no loss range in dest",
               "memory://{name}", "os", _memory(SilentGap)),
        Mutant("router-fan-in", "RTR-9", "routers", "a second source may feed a router's dest",
               "memory://{name}", "os", _fan_in),
        Mutant("cursor-before-copies", "RTR-10", "crash",
               "the router cursor is made durable before the copies it covers",
               FILE, "recording", _cursor_before_copies),
    ]
}


def make_driver(template: str, *, fs: str = "os") -> Driver:
    """``--uri NAME`` selects the mutant (see MUTANTS)."""
    mutant = MUTANTS.get(template)
    if mutant is None:
        raise BadArgument(f"no mutant {template!r}; mutants: {', '.join(MUTANTS)}")
    return mutant.build(mutant.template, mutant.fs)


