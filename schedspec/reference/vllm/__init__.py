"""The vLLM V1 family of the reference: Scheduler (sync and async), its KVCacheManager,
BlockPool and free-block queue, in vLLM's names."""
