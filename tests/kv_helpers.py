"""Small builders and views shared by the KV-side tests (free queue, pool, manager, prefix cache).

Block ids in the worked examples are the reference's: 0..num_blocks-1, no null
block, and a fresh free queue in id order.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from schedspec.reference import BlockPool, FreeBlockQueue, KVCacheBlock, KVCacheManager
from schedspec.spec import BlockHash, Request, RequestStatus, SchedulerConfig
from tests.sched_helpers import make_config


def kv_config(**overrides: Any) -> SchedulerConfig:
    """block_size 4, 8 blocks (32 slots), prefix caching on; override anything."""
    fields: dict[str, Any] = {
        "num_blocks": 8,
        "max_num_batched_tokens": 64,
        "max_num_seqs": 8,
        "max_model_len": 32,
        "enable_prefix_caching": True,
    }
    return make_config(**{**fields, **overrides})


def make_kv(**overrides: Any) -> KVCacheManager:
    return KVCacheManager(kv_config(**overrides))


def toks(first: int, n: int) -> list[int]:
    """n consecutive token ids starting at first: one block's worth of distinct content."""
    return list(range(first, first + n))


def make_request(request_id: str, prompt: Sequence[int], max_tokens: int = 16) -> Request:
    return Request(request_id, prompt, max_tokens)


def ids(blocks: Iterable[KVCacheBlock] | None) -> list[int]:
    assert blocks is not None
    return [b.block_id for b in blocks]


def queue_ids(queue: FreeBlockQueue) -> list[int]:
    return [b.block_id for b in queue]


def free_ids(kv: KVCacheManager | BlockPool) -> list[int]:
    """The free queue, front (reused first) to back."""
    pool = kv.block_pool if isinstance(kv, KVCacheManager) else kv
    return queue_ids(pool.free_block_queue)


def refs(kv: KVCacheManager) -> list[int]:
    """Ref count of every block, indexed by block id."""
    return [b.ref_cnt for b in kv.block_pool.blocks]


def cache_map(kv: KVCacheManager | BlockPool) -> dict[BlockHash, list[int]]:
    """The prefix-cache map: hash -> block ids holding it, oldest first."""
    pool = kv.block_pool if isinstance(kv, KVCacheManager) else kv
    return {h: list(holders) for h, holders in pool.cached_block_hash_to_block.items()}


def admit(
    kv: KVCacheManager,
    request: Request,
    num_new_tokens: int | None = None,
    *,
    has_running_requests: bool = False,
) -> list[int] | None:
    """What the scheduler's waiting loop does for one request, on the KV side only.

    Looks up the prefix cache, allocates with full_sequence_must_fit, and on
    success marks the request RUNNING with hit + new tokens computed (the
    scheduler's schedule-time advance). num_new_tokens defaults to the rest
    of the prompt. Returns the ids of the whole block table, or None.
    """
    hits, num_hit = kv.get_computed_blocks(request)
    n = request.num_tokens - num_hit if num_new_tokens is None else num_new_tokens
    new = kv.allocate_slots(
        request,
        n,
        num_new_computed_tokens=num_hit,
        new_computed_blocks=hits,
        full_sequence_must_fit=True,
        has_running_requests=has_running_requests,
    )
    if new is None:
        return None
    kv.record_prefix_cache_lookup(request, num_hit)
    request.status = RequestStatus.RUNNING
    request.num_computed_tokens = num_hit + n
    return list(kv.get_block_ids(request.request_id))


def finish(kv: KVCacheManager, request: Request) -> None:
    """End a request (as a stop would) and release its blocks."""
    request.status = RequestStatus.FINISHED_STOPPED
    kv.free(request)
