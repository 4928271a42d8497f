"""The system under test as the conformance suite sees it (spec/CONFORMANCE.md §2, §3).

A ``Sut`` opens stores by name, simulates power loss, reports involuntary evictions the model
cannot predict (ring overwrite, BDEV-16), answers the pure ring head-detection question (RING-3)
and hands out the store-and-forward sender (FSN). Two implementations exist:

* ``LocalSut`` (this module): an implementation living in this process, reached through
  tidelog's public API. The Python kit (``tidelog.conformance.suite``) runs the suite on it
  directly, and tidelog's own driver (``tidelog conformance driver``) serves it over the wire.
* ``RemoteSut`` (``remote.py``): any program speaking the driver protocol.

Power loss needs the backend's file I/O to go through tidelog's FS seam (``tidelog.fsio``): with
``fs="recording"`` every store lives on one in-memory ``RecordingFS`` and a crash replaces it by
one of the disk states a power loss may leave (spec/CRASH.md), drawn from the request's seed.
Without it, a crash is a process death (the backend's ``abandon``: nothing unwritten reaches the
disk, everything written survives).
"""

from __future__ import annotations

import contextlib
import posixpath
import random
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from importlib import import_module
from typing import Any, Literal

import tidelog
from tidelog import registry
from tidelog.api import Store
from tidelog.clock import Clock, FakeClock
from tidelog.errors import BadArgument, NotAvailable, TidelogError
from tidelog.fsio import FS
from tidelog.hooks import Abandon, RingEvictions, hooks, offers
from tidelog.uri import parse_uri

from .crashfs import RecordingFS
from .forwarding import SlotSender

__all__ = [
    "Sut",
    "LocalSut",
    "RingEvent",
    "FsOpener",
    "FS_OPENERS",
    "CRASH_SAMPLES",
    "descriptor_opener",
]

#: ``opener(fs, location, clock, **options) -> Store``: open a store of one scheme through an FS
FsOpener = Callable[..., Store]


def descriptor_opener(scheme: str) -> FsOpener:
    """The ``fs_opener`` of ``scheme``'s descriptor (REG-5), loaded when first called."""

    def opener(fs: FS, location: str, clock: Clock, **options: object) -> Store:
        store: Store = registry.descriptor(scheme).tool("fs_opener")(fs, location, clock, **options)
        return store

    return opener


#: the built-in schemes whose backends route all their I/O through the FS seam (crash
#: simulation possible), from their descriptors; a ``--load``-ed module registers a descriptor
#: with an ``fs_opener`` to add its own
FS_OPENERS: dict[str, FsOpener] = {
    s: descriptor_opener(s) for s, d in registry.DESCRIPTORS.items() if d.has("fs_opener")
}

#: disk states sampled per simulated power loss (the request's seed picks one of them)
CRASH_SAMPLES = 8
SF_DIR = "/sf"


@dataclass(frozen=True)
class RingEvent:
    """Live records ``<= through`` of ``topic`` were evicted by ring overwrite at head ``head``
    (BDEV-16): an involuntary eviction whose timing depends on page packing, so the suite learns
    it from the implementation and checks that it was legitimate."""

    topic: str
    through: int
    head: int

    def to_json(self) -> dict[str, object]:
        return {"topic": self.topic, "through": self.through, "head": self.head}


class Sut:
    """What the suite needs from an implementation. Subclasses implement every method."""

    #: the driver's hello: {"reopen": bool, "crash": [...], "ops": [...], ...}
    hello: dict[str, Any]

    def open(self, name: str, clock: FakeClock) -> Any:
        """Open (or recover) store ``name``; returns an object shaped like ``tidelog.Store``."""
        raise NotImplementedError

    def crash(self, seed: int) -> None:
        """Power loss now: the open store is gone; the next ``open`` recovers."""
        raise NotImplementedError

    def crash_during(self, seed: int, op: Callable[[], object]) -> list[RingEvent]:
        """Run ``op`` (one call on the open store) and lose power at a point inside it."""
        raise NotImplementedError

    def ring_evictions(self) -> list[RingEvent]:
        """Ring overwrites that evicted live records since the last call (BDEV-16)."""
        return []

    def ring_pages(self) -> int | None:
        """Page count of the open store's ring, or None when it is not a ring."""
        return None

    def ring_head(self, n: int, seqs: list[int | None]) -> tuple[int, int] | None:
        """RING-3..5: (head index, lap parity) of a ring of ``n`` pages whose pages read
        ``seqs`` (None: invalid page); None for an empty ring; raises Corrupt."""
        raise NotAvailable("this implementation has no ring head detection")

    def sender(self, slot: str) -> Any:
        """Open (or recover) store-and-forward slot ``slot``; an object like ``SlotSender``."""
        raise NotAvailable("this implementation has no store-and-forward sender")

    def sender_crash(self, seed: int) -> None:
        """Power loss of the slot: the open sender is gone; ``sender`` recovers it."""
        raise NotAvailable("this implementation cannot crash its sender")

    def dispose(self, name: str) -> None:
        """Delete store ``name`` (and slot ``name``): an example is over."""

    def shutdown(self) -> None:
        """The run is over."""


class LocalSut(Sut):
    """Stores of this process, opened by ``template.format(name=...)`` or ``uri(name)``."""

    def __init__(
        self,
        template: str | Callable[[str], str],
        *,
        fs: Literal["os", "recording"] = "os",
        openers: Mapping[str, FsOpener] | None = None,
    ) -> None:
        self.uri_of: Callable[[str], str] = (
            template if callable(template) else (lambda name: template.format(name=name))
        )
        self.recording = fs == "recording"
        #: the given openers, else every scheme's descriptor's (REG-5)
        self.openers = dict(openers) if openers is not None else None
        self.fs = RecordingFS()
        self.sf_fs = RecordingFS()
        self.store: Store | None = None
        self._seen = 0
        self._sender: SlotSender | None = None
        sample = self.uri_of("probe")
        self.scheme = parse_uri(sample).scheme
        power = self.recording and self._opener(self.scheme) is not None
        shown = sample.replace("probe", "{name}")
        self.hello = {
            "implementation": f"tidelog {tidelog.__version__} ({shown})",
            "reopen": True,
            # "between": power loss (recording FS) or process death (abandon) between ops;
            # "during": power loss inside an op (needs the recording FS)
            "crash": ["between", "during"] if power else (["between"] if self._abandons() else []),
            "power_loss": power,
        }

    def _opener(self, scheme: str) -> FsOpener | None:
        if self.openers is not None:
            return self.openers.get(scheme)
        described = registry.find(scheme)
        return descriptor_opener(scheme) if described and described.has("fs_opener") else None

    def _abandons(self) -> bool:
        described = registry.find(self.scheme)
        return described is not None and "abandon" in described.hooks

    # -- stores -------------------------------------------------------------------------------
    def open(self, name: str, clock: FakeClock) -> Store:
        uri = self.uri_of(name)
        parsed = parse_uri(uri)
        opener = self._opener(parsed.scheme) if self.recording else None
        if opener is not None:
            durable_dirs(self.fs, posixpath.dirname(parsed.location))
            store = opener(self.fs, parsed.location, clock, **dict(parsed.options))
        else:
            store = tidelog.open(uri, clock=clock)
        self.store = store
        self._seen = 0
        return store

    def _abandon(self) -> None:
        store, self.store = self.store, None
        if store is None:
            return
        if not offers(store, Abandon):
            raise NotAvailable(f"{self.scheme}:// stores cannot simulate a crash")
        hooks(store, Abandon).abandon()

    def crash(self, seed: int) -> None:
        if not self.hello["crash"]:
            raise NotAvailable(f"{self.scheme}:// stores cannot simulate a crash")
        self._abandon()
        if self.hello["power_loss"]:
            self.fs = _pick_state(self.fs, None, seed)

    def crash_during(self, seed: int, op: Callable[[], object]) -> list[RingEvent]:
        """Run ``op``, then lose power at a point inside its I/O; returns the ring overwrites
        the op caused (they happened before the power went)."""
        if not self.hello["power_loss"]:
            raise NotAvailable("a crash inside an op needs the recording FS (--fs recording)")
        start = len(self.fs.history)
        with contextlib.suppress(TidelogError):
            op()
        events = self.ring_evictions()
        # Crash right after one of the op's writes (so it is pending: lost, reordered or torn),
        # or at its end when it wrote nothing.
        history = self.fs.history
        points = [i + 1 for i in range(start, len(history)) if type(history[i]).__name__ == "Data"]
        at = random.Random(seed).choice(points or [len(history)])
        self._abandon()
        self.fs = _pick_state(self.fs, at, seed, since=start)
        return events

    def ring_evictions(self) -> list[RingEvent]:
        if self.store is None or not offers(self.store, RingEvictions):
            return []
        found = hooks(self.store, RingEvictions).ring_evictions
        fresh = found[self._seen :]
        self._seen = len(found)
        return [RingEvent(e.topic, e.through, e.head) for e in fresh]

    def ring_pages(self) -> int | None:
        if self.store is None or not offers(self.store, RingEvictions):
            return None
        pages: Any = self.store.describe()["page_count"]
        return int(pages)

    def ring_head(self, n: int, seqs: list[int | None]) -> tuple[int, int] | None:
        # The function the blockdev backend's recovery calls (looked up at call time, so a
        # planted defect in it is what is measured).
        ring = import_module("tidelog.backends.blockdev.ring")
        if not 0 < len(seqs) == n:
            raise BadArgument(f"ring_head needs exactly {n} page numbers, got {len(seqs)}")
        head = ring.find_head(n, lambda i: seqs[i])
        return None if head is None else (head.index, head.parity)

    # -- store-and-forward --------------------------------------------------------------------
    def sender(self, slot: str) -> SlotSender:
        if self._sender is not None and not self._sender.closed:
            self._sender.close()
        self._sender = self.new_sender(slot)
        return self._sender

    def new_sender(self, slot: str) -> SlotSender:
        """Hook: the sender implementation (mutants override this)."""
        return SlotSender(self.sf_fs, SF_DIR, slot)

    def sender_crash(self, seed: int) -> None:
        self._sender = None  # dropped without closing: nothing more reaches the disk
        self.sf_fs = _pick_state(self.sf_fs, None, seed)

    # -- cleanup ------------------------------------------------------------------------------
    def dispose(self, name: str) -> None:
        if self.store is not None:
            with contextlib.suppress(TidelogError):
                self.store.close()
            self.store = None
        if self._sender is not None:
            with contextlib.suppress(TidelogError):
                self._sender.close()
            self._sender = None
        self.sf_fs = RecordingFS()
        if self.recording and self._opener(self.scheme) is not None:
            self.fs = RecordingFS()  # one store at a time: start the next example from scratch
            return
        uri = parse_uri(self.uri_of(name))
        described = registry.find(uri.scheme)
        if described is not None and described.has("dispose"):
            described.tool("dispose")(uri)  # REG-5: a blockdev image file, never a device

    def shutdown(self) -> None:
        if self.store is not None:
            with contextlib.suppress(TidelogError):
                self.store.close()
            self.store = None


def durable_dirs(fs: RecordingFS, path: str) -> None:
    """Create ``path`` and its missing parents durably: the place a store lives in is not part
    of what a crash may lose."""
    parts = [p for p in path.split("/") if p]
    for i in range(len(parts)):
        here = "/" + "/".join(parts[: i + 1])
        if not fs.exists(here):
            fs.mkdir(here)
            fs.fsync_dir(posixpath.dirname(here))


def _pick_state(fs: RecordingFS, at: int | None, seed: int, since: int = 0) -> RecordingFS:
    """One disk state a power loss at ``at`` (None: now) may leave, chosen by ``seed`` among a
    seeded sample: "nothing unsynced persisted", "everything persisted", and random ones that
    drop, reorder and tear writes (CRASH-1..CRASH-6). The sample is tilted towards the states
    recovery code gets wrong: when it has them, a state that tears a write made at or after
    history index ``since`` half the time, and one that tears it half new, half old ("linear":
    the header intact, the checksum wrong) a further third of the time."""
    rng = random.Random(seed)
    states = list(
        fs.crash_states(at=at, mode="sample", seed=seed, limit=CRASH_SAMPLES, torn="all")
    )

    def tears(state: RecordingFS, kinds: str) -> bool:
        found = _TORN.findall(state.description)
        return any(int(i) >= since and kind in kinds for i, kind in found)

    torn = [s for s in states if tears(s, "linear zero garbage")]
    linear = [s for s in torn if tears(s, "linear")]
    roll = rng.random()
    if linear and roll < 1 / 3:
        return rng.choice(linear)
    if torn and roll < 2 / 3:
        return rng.choice(torn)
    return rng.choice(states)


_TORN = re.compile(r"#(\d+) write [^,;]*=(linear|zero|garbage)")
