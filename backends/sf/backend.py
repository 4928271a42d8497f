"""``sf:///<sf_dir>/<sender_id>``: an SF slot as a tidelog store (spec/FORWARD.md SF-15).

The slot is exposed as a store with exactly one topic, ``frames``, whose records are the slot's
frames: ``seq = fsn + 1`` (tidelog seqs start at 1, FSNs at 0), ``tag`` and ``node`` are None
(frames carry neither), ``ts`` is the creation time of the frame's segment (frames carry no time
of their own). Unless opened ``readonly=true``, it is read-write: ``append`` writes a frame
exactly as a QuestDB client would, so a producer can fill a slot through the tidelog API and
``tidelog forward`` (or any conformant SF client) can drain it. Acknowledged frames leave only
through the forwarder's trim, which reads as a voluntary delete (silent). Subscribers, queue
mode and deletes are not available (``not_available``): the slot's single trim point belongs to
its forwarder.

Options: ``sf_max_bytes`` (4MiB), ``sf_max_total_bytes`` (10GiB; ``max_bytes`` is an alias),
``sf_durability`` (memory, flush, append; default append), ``sf_append_deadline_millis`` (0),
``create`` (true, false, nonempty: spec/SPEC.md URI-8), ``readonly`` (false; true: a read-only
view, ``view.SlotView``, SF-21), ``mmap`` (true; false: nothing mapped, SF-22) and the common
``max_record_bytes``; all checked, ranges included (URI-6), before anything is created.
``durability`` of the topic follows ``sf_durability``: ``append`` is ``fsync`` (every append
synced), ``flush`` and ``memory`` are ``memory`` (``Store.flush()`` syncs; a crash may lose the
unsynced suffix and reuse its seqs, DUR-4).
"""

from __future__ import annotations

import errno
import os
from collections.abc import Mapping, Sequence
from typing import Any

from tidelog import storedir
from tidelog.backend import COMMON_OPTIONS, Backend, Capabilities, TopicRef
from tidelog.clock import Clock
from tidelog.config import TopicConfig
from tidelog.errors import (
    BadArgument,
    BadOption,
    BadURI,
    NoSuchTopic,
    NotAvailable,
    ReadOnly,
    StorageError,
    TooLarge,
)
from tidelog.fsio import FS, OsFS, storage_error
from tidelog.options import (
    MAX_WAIT_MS,
    format_size,
    parse_bool,
    parse_choice,
    parse_int,
    parse_size,
    validate_options,
)
from tidelog.records import Item, Record, TopicState
from tidelog.storedir import Layout, parse_create
from tidelog.uri import URI, store_path

from .format import FRAME_HEADER_SIZE, HEADER_SIZE, is_segment_name
from .lock import LOCK_FILE, PID_FILE
from .recovery import FAILED_FILE, SYNC_FILE, TMP_SUFFIX, WATERMARK_FILE
from .slot import DURABILITIES, Slot, check_sender_id
from .view import SlotView

__all__ = ["SfBackend", "open_backend", "TOPIC"]

TOPIC = "frames"
_OPTIONS: dict[str, Any] = {  # the ranges and why: spec/SPEC.md URI-6
    **COMMON_OPTIONS,
    "sf_max_bytes": lambda k, v: parse_size(
        k, v, minimum=HEADER_SIZE + FRAME_HEADER_SIZE + 1, maximum=1 << 30
    ),
    "sf_max_total_bytes": lambda k, v: parse_size(k, v),
    "sf_durability": lambda k, v: parse_choice(k, v, DURABILITIES),
    "sf_append_deadline_millis": lambda k, v: parse_int(k, v, minimum=0, maximum=MAX_WAIT_MS),
    "create": parse_create,
    "readonly": parse_bool,  # a read-only view (SF-21)
    "mmap": parse_bool,  # false: nothing mapped, every read by pread (SF-22)
}
_CLASS = {"append": "fsync", "flush": "memory", "memory": "memory"}


def _unavailable(what: str) -> NotAvailable:
    return NotAvailable(
        f"sf:// stores do not support {what}: an SF slot has one trim point, owned by its "
        "forwarder (tidelog forward / tidelog.forward.Forwarder)"
    )


class SfBackend(Backend):
    def __init__(self, slot: Slot | SlotView, *, max_record_bytes: int, deadline_ms: int) -> None:
        self.slot = slot
        self.readonly = isinstance(slot, SlotView)
        self.max_record_bytes = max_record_bytes
        self.deadline_ms = deadline_ms
        self.config = TopicConfig(durability=_CLASS[slot.durability])
        self.capabilities = Capabilities(
            persistent=True,
            # memory durability never syncs: a power loss can leave a hole between segments,
            # which recovery refuses (SF-7), so only flush/append are crash-safe.
            crash_safe=slot.durability != "memory",
            deletes=False,
            subscribers=False,
            queue=False,
            multi_topic=False,
            durability=frozenset({self.config.durability}),
        )
        self._ref = TopicRef(TOPIC, 1)

    # -- store ---------------------------------------------------------------------------------
    def _check(self, ref: TopicRef) -> None:
        if ref != self._ref:
            raise NoSuchTopic(f"topic {ref.name!r} does not exist")

    def open_topic(self, name: str, options: Mapping[str, object], create: bool) -> TopicRef:
        self.slot._check_open()
        if name != TOPIC:
            if create:
                raise _unavailable(f"a topic named {name!r} (the only topic is {TOPIC!r})")
            raise NoSuchTopic(f"topic {name!r} does not exist; an SF slot has only {TOPIC!r}")
        self.config.check_matches(name, options)
        return self._ref

    def topic_config(self, ref: TopicRef) -> TopicConfig:
        self._check(ref)
        return self.config

    def list_topics(self) -> list[str]:
        self.slot._check_open()
        return [TOPIC]

    def drop_topic(self, name: str) -> None:
        raise _unavailable("dropping topics")

    def flush(self) -> None:
        if isinstance(self.slot, Slot):
            self.slot.sync()
        else:
            self.slot._check_open()  # a view has nothing to make durable (SF-21)

    def close(self) -> None:
        self.slot.close()

    def refresh(self) -> None:
        if isinstance(self.slot, SlotView):
            self.slot.refresh()

    # -- log -----------------------------------------------------------------------------------
    def append(
        self,
        ref: TopicRef,
        payloads: Sequence[bytes],
        tag: str | None,
        node: str | None,
        producer: tuple[str, int] | None = None,
    ) -> list[int]:
        self._check(ref)
        slot = self.slot
        if not isinstance(slot, Slot):
            raise ReadOnly(f"SF slot {slot.dir} was opened read-only (readonly=true, SF-21)")
        if tag is not None or node is not None:
            raise _unavailable("tags or nodes (an SF frame is only its payload)")
        if producer is not None:
            raise _unavailable("producer ids (TOP-11)")
        for p in payloads:
            if len(p) > min(self.max_record_bytes, slot.max_payload()):
                raise TooLarge(
                    f"record of {len(p)} bytes exceeds the limit of "
                    f"{min(self.max_record_bytes, slot.max_payload())}"
                )
        return [slot.append(p, deadline_ms=self.deadline_ms) + 1 for p in payloads]

    def read(self, ref: TopicRef, after: int, limit: int, exclude_node: str | None) -> list[Item]:
        self._check(ref)
        fsn = max(after, self.slot.lowest_fsn())  # seq after + 1 is FSN after; trimmed: silent
        out: list[Item] = []
        while len(out) < limit:
            frames = self.slot.read(fsn, min(limit - len(out), 1024))
            if not frames:
                break
            ts = self.slot.frame_ts_ms(fsn)
            for payload in frames:
                out.append(Record(fsn + 1, ts, None, None, payload))
                fsn += 1
        return out

    def state(self, ref: TopicRef) -> TopicState:
        self._check(ref)
        head = self.slot.published_fsn + 1
        earliest = self.slot.lowest_fsn() + 1
        return TopicState(
            head_seq=head,
            earliest_seq=earliest,
            evict_floor=1,  # an SF slot never loses a frame involuntarily: it backpressures
            count=head - earliest + 1,
            bytes=self.slot.payload_bytes(),
        )

    # deletes, subscribers and queue mode: refused by tidelog.api from the capabilities
    # (CAP-1, REG-4), with the messages the sf:// registry entry gives

    def subscribers(self, ref: TopicRef) -> list[str]:
        self._check(ref)
        return []

    def describe(self) -> dict[str, object]:
        stats = self.slot.stats()
        poisoned = self.slot.poisoned
        facts: dict[str, object] = {
            "backend": "sf",
            "slot": self.slot.dir,
            "readonly": self.readonly,
            "durability": self.slot.durability,
            "poisoned": str(poisoned) if poisoned is not None else None,  # SF-19, FLT-3
            "segment_files": self.slot.segment_names(),
            **{k: v for k, v in vars(stats).items()},
        }
        if isinstance(self.slot, SlotView):  # what its last scan found (a view logs nothing)
            facts["warnings"] = self.slot.warnings()
            facts["scans"] = self.slot.scans
        return facts


def _is_slot(fs: FS, path: str, names: list[str]) -> bool:
    # SF-1: a slot opened before holds .lock even before its first segment
    return LOCK_FILE in names or any(is_segment_name(n) for n in names)


def _slot_entry(name: str) -> bool:
    return name in _SLOT_FILES or is_segment_name(name.removesuffix(TMP_SUFFIX))


_SLOT_FILES = frozenset({LOCK_FILE, PID_FILE, FAILED_FILE, WATERMARK_FILE, SYNC_FILE})
SLOT_LAYOUT = Layout("an SF slot", _is_slot, _slot_entry)


def _options(options: Mapping[str, object]) -> dict[str, Any]:
    """Every option parsed and checked together (URI-2, URI-6), before anything is created."""
    opts = validate_options(options, _OPTIONS, where="sf://")
    max_bytes = opts.setdefault("sf_max_bytes", 4 << 20)
    total = opts.setdefault("sf_max_total_bytes", opts.get("max_bytes", 10 << 30))
    if total < 2 * max_bytes:
        key = "sf_max_total_bytes" if "sf_max_total_bytes" in options else "max_bytes"
        raise BadOption(
            f"option {key}={options.get(key, total)!r}: must be at least "
            f"{format_size(2 * max_bytes)}, two segments of sf_max_bytes={format_size(max_bytes)} "
            "(rotation needs the next one before trimming, SF-14; URI-6)"
        )
    return opts


def open_backend(uri: URI, options: Mapping[str, object], clock: Clock) -> SfBackend:
    """Factory for the ``sf`` scheme: ``sf:///<sf_dir>/<sender_id>?options``."""
    path = store_path(uri, "sf:///var/lib/app/sf/sender-1")  # URI-7
    opts = _options(options)
    sf_dir, sender_id = os.path.split(path)
    try:
        if not os.path.dirname(os.path.normpath(uri.location)):  # no <sf_dir>/ as written
            raise BadArgument("no <sf_dir>")
        check_sender_id(sender_id)
    except BadArgument as exc:
        raise BadURI(f"sf:// needs <sf_dir>/<sender_id>, got {uri.location!r}: {exc}") from None
    mmap = opts.get("mmap", True)
    fs = OsFS(mmap=mmap)
    durability = opts.get("sf_durability", "append")
    slot: Slot | SlotView
    if opts.get("readonly", False):
        _check_view(fs, path)
        slot = SlotView(fs, path, durability=durability)
    else:
        creation = storedir.prepare(fs, path, SLOT_LAYOUT, opts.get("create", "true"))  # URI-8
        try:
            slot = Slot.open(
                sf_dir,
                sender_id,
                fs=fs,
                max_bytes=opts["sf_max_bytes"],
                max_total_bytes=opts["sf_max_total_bytes"],
                durability=durability,
                clock=clock,
                mmap=mmap,
            )
        except BaseException:
            creation.undo(clear=False)  # the directories it made, if still empty
            raise
    return SfBackend(
        slot,
        max_record_bytes=opts.get("max_record_bytes", 64 << 20),
        deadline_ms=opts.get("sf_append_deadline_millis", 0),
    )


def _check_view(fs: FS, path: str) -> None:
    """SF-21: a view opens only a slot that is there; it creates nothing (``create`` is not
    consulted) and refuses with ``io_error``."""
    try:
        if not fs.exists(path):
            err = StorageError(f"no SF slot at {path}: it does not exist (readonly=true, SF-21)")
            err.errno = errno.ENOENT
            raise err
        if not fs.is_dir(path):
            err = StorageError(f"{path} is not a directory, so not an SF slot (SF-21)")
            err.errno = errno.ENOTDIR
            raise err
        if not _is_slot(fs, path, fs.listdir(path)):
            raise StorageError(
                f"{path} is not an SF slot (it holds neither {LOCK_FILE} nor a segment file): "
                "nothing to read (readonly=true, SF-21)"
            )
    except StorageError:
        raise
    except OSError as exc:
        raise storage_error(exc, f"opening SF slot {path} read-only (SF-21)") from None
