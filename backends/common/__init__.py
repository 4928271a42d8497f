"""tidelog.backends.common: the engine shared by backends (spec semantics written once)."""

from .engine import Engine, EngineTopic
from .index import TopicLog, glob_prefix

__all__ = ["Engine", "EngineTopic", "TopicLog", "glob_prefix"]
