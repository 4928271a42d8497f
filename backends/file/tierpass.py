"""One tiering pass of a file store's maintenance (spec/TIERING.md): relocate what the hot
bounds let go (TIER-5), write a manifest version if what it says changed (TIER-9), collect
what no version and not the state references (TIER-10)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from .manifest import Manifests, manifest_body, state_keys
from .relocate import relocate

if TYPE_CHECKING:
    from .store import FileBackend
    from .tiers import Tiers

__all__ = ["tier_pass"]


def tier_pass(b: FileBackend, tiers: Tiers) -> int:
    """Returns how many segments became cold. The caller holds the checkpoint lock."""
    moved = relocate(b, tiers)
    if tiers.manifest is None:
        tiers.manifest = Manifests(tiers.store, tiers.store_id, tiers.options.cold_grace_ms)
    with b.lock:
        tiers.prune(b.by_id)
        cold = {tid: tiers.cold_of(t) for tid, t in b.by_id.items()}
        topics = manifest_body((t, cold[tid]) for tid, t in sorted(b.by_id.items()))
        now = b.clock.now_ms()
    tiers.manifest.write(topics, now)
    tiers.manifest.collect(state_keys(tiers.store_id, cold), now)
    return moved
