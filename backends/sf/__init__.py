"""tidelog.backends.sf: QuestDB store-and-forward slots, byte-exact (spec/FORWARD.md).

    from tidelog.sf import Slot
    with Slot.open("/var/lib/app/sf", "edge-7", durability="append") as slot:
        fsn = slot.append(b"...")

    tidelog.open("sf:///var/lib/app/sf/edge-7")   # the slot as a one-topic store ("frames")
    tidelog.open("sf:///var/lib/app/sf/edge-7?readonly=true")   # read beside its writer

``open_backend`` is the factory of the ``sf`` URI scheme (see ``tidelog.backends.sf.backend``).
"""

from __future__ import annotations

from .backend import TOPIC, SfBackend, open_backend
from .recovery import RecoveredSegment, Recovery, recover
from .slot import DURABILITIES, Slot, SlotStats, check_sender_id, write_failed
from .view import SlotView

__all__ = [
    "Slot",
    "SlotStats",
    "SlotView",
    "DURABILITIES",
    "Recovery",
    "RecoveredSegment",
    "recover",
    "check_sender_id",
    "write_failed",
    "open_backend",
    "SfBackend",
    "TOPIC",
]
