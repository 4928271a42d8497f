"""tidelog.backends.blockdev: the ``blockdev://`` backend, a flash page ring (FORMATS-blockdev.md).

``blockdev:///dev/sdX`` (a raw block device: its size comes from the device; formatting it needs
``format=true``) or ``blockdev:///path/ring.img?size=64MiB&page_size=4096&topic=events`` (an image
file, created when missing). One topic per device. Byte layout and policies:
spec/FORMATS-blockdev.md (BDEV-*); semantics: spec/SPEC.md, with the capabilities in
``CAPABILITIES``.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from tidelog.api import Store
from tidelog.clock import Clock, SystemClock
from tidelog.errors import BadArgument, NotAvailable
from tidelog.fsio import FS, OsFS
from tidelog.hooks import hooks, offers
from tidelog.uri import URI, store_path

from .device import geometry_for
from .options import DEFAULT_PAGE_SIZE, BlockdevOptions, parse_blockdev_options
from .store import CAPABILITIES, BlockdevBackend, RingEviction
from .verify import verify_image
from .writer import IoStats

__all__ = [
    "BlockdevBackend",
    "BlockdevOptions",
    "CAPABILITIES",
    "IoStats",
    "RingEviction",
    "io_stats",
    "dispose",
    "open_backend",
    "open_store",
    "verify_image",
]


def open_backend(uri: URI, options: Mapping[str, object], clock: Clock) -> BlockdevBackend:
    path = store_path(  # URI-7
        uri, "blockdev:///dev/sdb or blockdev:///var/lib/app/ring.img?size=64MiB"
    )
    store_options, bopts = parse_blockdev_options(options)
    real = os.path.realpath(path)
    if bopts.size is not None and not os.path.exists(real):
        # an image this open would create must hold a ring (BDEV-12): checked before it is
        # created, like every other option (URI-2)
        geometry_for(bopts.size, bopts.page_size or DEFAULT_PAGE_SIZE, f"option size={bopts.size}")
    # The user's own link (/dev/disk/by-id/...) is followed here, once: the image is then
    # opened without following links (FORMATS LOCK-4).
    return BlockdevBackend(OsFS(), real, clock, store_options, bopts)


def dispose(uri: URI) -> None:
    """Delete the ring image a ``blockdev://`` URI names, never a device (the descriptor's
    ``dispose``, REG-5: the conformance kit, between examples)."""
    if os.path.isfile(uri.location):
        os.unlink(uri.location)


def open_store(fs: FS, path: str, clock: Clock | None = None, **options: object) -> Store:
    """Open a ring through an explicit FS (crash tests pass a RecordingFS)."""
    store_options, bopts = parse_blockdev_options(options)
    backend = BlockdevBackend(fs, path, clock or SystemClock(), store_options, bopts)
    return Store(backend, f"blockdev://{path}")


def io_stats(store: Store, since: str = "open") -> IoStats:
    """What a blockdev store wrote to its device (BDEV-19): page, slot and zeroing writes,
    device bytes, records and payload bytes, syncs; ``.write_amplification`` is device bytes per
    payload byte. ``since="open"`` counts this store's writes; ``since="format"`` adds what the
    ring's metadata slot counted since it was formatted (as of its last write before this open).
    A snapshot: later writes do not change it. ``NotAvailable`` for another backend's store."""
    if not offers(store, BlockdevBackend):
        raise NotAvailable(f"{store.uri} is not a blockdev:// store: it keeps no I/O counters")
    backend = hooks(store, BlockdevBackend)
    if since not in ("open", "format"):
        raise BadArgument(f"since={since!r}: expected 'open' or 'format'")
    return backend.io_stats_snapshot(since)
