"""The pure-Python reference scheduler: vLLM V1's policy (Scheduler) and SGLang's
(SGLangScheduler), one per policy family of SchedulerConfig.

Depends on schedspec.spec only.
"""

from schedspec.reference.sglang.scheduler import SGLangScheduler
from schedspec.reference.vllm.block_pool import BlockPool
from schedspec.reference.vllm.free_block_queue import FreeBlockQueue, KVCacheBlock
from schedspec.reference.vllm.kv_cache_manager import KVCacheManager
from schedspec.reference.vllm.scheduler import Scheduler

__all__ = [
    "BlockPool",
    "FreeBlockQueue",
    "KVCacheBlock",
    "KVCacheManager",
    "SGLangScheduler",
    "Scheduler",
]
