"""``tidelog.sf``: the public names of the QuestDB store-and-forward slot support.

The implementation is the ``sf`` backend, ``tidelog.backends.sf`` (spec/FORWARD.md); this module
keeps the documented import path (``from tidelog.sf import Slot``) stable, with exactly the
names that package exports.
"""

from __future__ import annotations

from tidelog.backends.sf import *  # noqa: F403
from tidelog.backends.sf import __all__ as __all__
