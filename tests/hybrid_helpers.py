"""Builders shared by the hybrid KV cache tests: a coordinator over given groups, a prompt,
and blocks cached in one group as a finished request would have left them."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from schedspec.reference import KVCacheBlock
from schedspec.reference.vllm.kv_cache_coordinator import HybridKVCacheCoordinator
from schedspec.reference.vllm.single_type_kv_cache_manager import SingleTypeKVCacheManager
from schedspec.spec import Request
from schedspec.spec.kv_groups import (
    NULL_BLOCK_ID,
    FullAttentionGroup,
    KVCacheGroupSpec,
    MambaGroup,
    SlidingWindowGroup,
)
from tests.invariant_builders import Driver
from tests.kv_helpers import toks
from tests.sched_helpers import make_config

FULL = FullAttentionGroup(block_size=4)
WINDOW = SlidingWindowGroup(block_size=4, sliding_window=8)  # a hit needs 2 blocks
MAMBA = MambaGroup(block_size=4, mamba_cache_mode="align")
N = NULL_BLOCK_ID


def coordinator(*groups: KVCacheGroupSpec, **overrides: Any) -> HybridKVCacheCoordinator:
    fields: dict[str, Any] = {
        "block_size": 4,
        "num_blocks": 24,
        "max_model_len": 32,
        "enable_prefix_caching": True,
        "kv_cache_groups": groups,
    }
    return HybridKVCacheCoordinator(make_config(**{**fields, **overrides}))


def prompt(n: int) -> Request:
    return Request("r", toks(0, n), 8)


def cache_in_group(
    coord: HybridKVCacheCoordinator, request: Request, gid: int, indices: Sequence[int]
) -> list[KVCacheBlock]:
    """Blocks that hold the request's blocks `indices` in group gid, cached and free (ref 0,
    at the back of the queue), as a finished request would have left them."""
    pool = coord.block_pool
    hashes = coord.block_hashes(request, gid)
    blocks = pool.get_new_blocks(len(indices))
    for block, i in zip(blocks, indices, strict=True):
        table: list[KVCacheBlock] = [block] * (i + 1)
        pool.cache_full_blocks(table, hashes, i, i + 1)
    pool.free_blocks(blocks)
    return blocks


def manager(coord: HybridKVCacheCoordinator, gid: int) -> SingleTypeKVCacheManager:
    return coord.managers[gid]


def hybrid_driver(*groups: KVCacheGroupSpec, **overrides: Any) -> Driver:
    """The reference scheduler over these groups, driven by hand (invariant_builders): 4-token
    scheduler blocks, a 32-block pool, chunks of 8, two seats, prefix caching."""
    fields: dict[str, Any] = {
        "block_size": 4,
        "num_blocks": 32,
        "max_model_len": 32,
        "max_num_seqs": 2,
        "max_num_batched_tokens": 8,
        "enable_chunked_prefill": True,
        "enable_prefix_caching": True,
        "kv_cache_groups": groups,
    }
    return Driver(**(fields | overrides))
