"""toyserve: a tiny continuous-batching scheduler with paged KV blocks and prefix caching."""

from toyserve.blocks import BlockManager
from toyserve.engine import Engine, EngineConfig
from toyserve.sequence import Finish, SeqState, Sequence

__all__ = ["BlockManager", "Engine", "EngineConfig", "Finish", "SeqState", "Sequence"]
