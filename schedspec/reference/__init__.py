"""The pure-Python reference scheduler and KV-cache manager (vLLM V1 semantics).

Depends on schedspec.spec only.
"""

from schedspec.reference.block_pool import BlockPool
from schedspec.reference.free_block_queue import FreeBlockQueue, KVCacheBlock
from schedspec.reference.kv_cache_manager import KVCacheManager
from schedspec.reference.scheduler import Scheduler

__all__ = ["BlockPool", "FreeBlockQueue", "KVCacheBlock", "KVCacheManager", "Scheduler"]
