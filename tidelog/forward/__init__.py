"""tidelog.forward: drain a tidelog topic or a QuestDB-compatible SF slot to a receiver over
WebSocket, and the receiver itself (spec/FORWARD.md SF, FWD).

    from tidelog.forward import Forwarder, Receiver
"""

from __future__ import annotations

from .conf import SenderConfig, parse_conf
from .errors import ErrorInbox, SenderError, SenderFailed, TopicDropped, default_error_handler
from .forwarder import Forwarder
from .instances import InstancesForwarder
from .receiver import Receiver
from .source import Gap, MemorySource, SlotSource, Source, TopicSource

__all__ = [
    "Forwarder",
    "InstancesForwarder",
    "Receiver",
    "SenderConfig",
    "parse_conf",
    "SenderError",
    "SenderFailed",
    "TopicDropped",
    "ErrorInbox",
    "default_error_handler",
    "Source",
    "SlotSource",
    "MemorySource",
    "TopicSource",
    "Gap",
]
