"""``tidelog.sf``: the public names of the QuestDB store-and-forward slot support.

The implementation is the ``sf`` backend, ``tidelog.backends.sf`` (spec/FORWARD.md); this module
keeps the documented import path (``from tidelog.sf import Slot``) stable.
"""

from __future__ import annotations

from tidelog.backends.sf import (
    DURABILITIES,
    TOPIC,
    RecoveredSegment,
    Recovery,
    SfBackend,
    Slot,
    SlotStats,
    SlotView,
    check_sender_id,
    open_backend,
    recover,
    write_failed,
)

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
