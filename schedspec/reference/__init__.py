"""The pure-Python reference scheduler: vLLM V1's policy (Scheduler) and SGLang's
(SGLangScheduler), one per policy family of SchedulerConfig.

Depends on schedspec.spec only.
"""

from schedspec.reference.block_pool import BlockPool
from schedspec.reference.free_block_queue import FreeBlockQueue, KVCacheBlock
from schedspec.reference.kv_cache_manager import KVCacheManager
from schedspec.reference.scheduler import Scheduler
from schedspec.reference.sglang_scheduler import SGLangScheduler

__all__ = [
    "BlockPool",
    "FreeBlockQueue",
    "KVCacheBlock",
    "KVCacheManager",
    "SGLangScheduler",
    "Scheduler",
]
