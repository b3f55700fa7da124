"""The reference's per-group rules against vLLM 0.34.0's own managers, on the same inputs:
what each kind skips, each kind's hit (which positions hold a block and how long it is),
the reconciled hit over groups,
and each kind's table over successive chunks. Block ids differ (vLLM's pool has
its null block at 0), so tables compare as null masks.

Needs vLLM 0.34.0 (the managers' signatures are that release's); skipped otherwise.
"""

from __future__ import annotations

import importlib
import itertools
from collections.abc import Sequence
from typing import Any

import pytest

from schedspec.reference.vllm.single_type_kv_cache_manager import SingleTypeKVCacheManager
from schedspec.spec.kv_groups import (
    ChunkedLocalGroup,
    FullAttentionGroup,
    KVCacheGroupSpec,
    MambaGroup,
    SlidingWindowGroup,
)
from tests.hybrid_helpers import FULL, cache_in_group, coordinator, prompt

vllm = pytest.importorskip("vllm", reason="vLLM is not installed")
if not vllm.__version__.startswith("0.34."):
    pytest.skip("the managers' signatures are vLLM 0.34.0's", allow_module_level=True)
torch = pytest.importorskip("torch")
_pool = importlib.import_module("vllm.v1.core.block_pool")
_utils = importlib.import_module("vllm.v1.core.kv_cache_utils")
_managers = importlib.import_module("vllm.v1.core.single_type_kv_cache_manager")
_specs = importlib.import_module("vllm.v1.kv_cache_interface")

BLOCK = 4
NUM_HASHES = 5  # a 21-token prompt's full blocks
GROUPS: list[KVCacheGroupSpec] = [
    SlidingWindowGroup(block_size=BLOCK, sliding_window=8),
    SlidingWindowGroup(block_size=BLOCK, sliding_window=5),
    ChunkedLocalGroup(block_size=BLOCK, attention_chunk_size=8),
    MambaGroup(block_size=BLOCK, mamba_cache_mode="align"),
]
CACHED = [(), (0,), (0, 1), (1, 2), (0, 2, 3), (2, 3, 4), (0, 1, 2, 3, 4), (1, 3)]


def vllm_spec(group: KVCacheGroupSpec, num_speculative_blocks: int = 0) -> Any:
    attention = {"num_kv_heads": 1, "head_size": 8, "dtype": torch.float16}
    if isinstance(group, SlidingWindowGroup):
        return _specs.SlidingWindowSpec(
            block_size=group.block_size, sliding_window=group.sliding_window, **attention
        )
    if isinstance(group, ChunkedLocalGroup):
        return _specs.ChunkedLocalAttentionSpec(
            block_size=group.block_size,
            attention_chunk_size=group.attention_chunk_size,
            **attention,
        )
    assert isinstance(group, MambaGroup)
    return _specs.MambaSpec(
        block_size=group.block_size,
        shapes=((1,),),
        dtypes=(torch.float16,),
        mamba_cache_mode=group.mamba_cache_mode,
        num_speculative_blocks=num_speculative_blocks,
    )


def vllm_manager_class(group: KVCacheGroupSpec) -> Any:
    if isinstance(group, SlidingWindowGroup):
        return _managers.SlidingWindowManager
    if isinstance(group, ChunkedLocalGroup):
        return _managers.ChunkedLocalAttentionManager
    return _managers.MambaManager


def vllm_pool() -> Any:
    return _pool.BlockPool(24, True, hash_block_size=BLOCK)


def vllm_hit_mask(group: KVCacheGroupSpec, cached: Sequence[int], max_length: int) -> list[bool]:
    pool = vllm_pool()
    hashes = [_utils.BlockHash(bytes([i + 1]) * 32) for i in range(NUM_HASHES)]
    for i in cached:
        block = pool.free_block_queue.popleft()
        key = _utils.make_block_hash_with_group_id(hashes[i], 1)
        pool.cached_block_hash_to_block.insert(key, block)
        block.block_hash = key
    (hit,), length = vllm_manager_class(group).find_longest_cache_hit(
        hashes, max_length, [1], pool, vllm_spec(group), False, BLOCK
    )
    assert length == len(hit) * BLOCK
    return [not b.is_null for b in hit]


def our_hit_mask(group: KVCacheGroupSpec, cached: Sequence[int], max_length: int) -> list[bool]:
    kv = coordinator(FULL, group)
    request = prompt(NUM_HASHES * BLOCK + 1)
    blocks = dict(zip(cached, cache_in_group(kv, request, 1, cached), strict=True))
    hit = kv.managers[1].find_longest_cache_hit(kv.block_hashes(request, 1), max_length)
    for i, block in enumerate(hit):
        assert block is kv.null_block or block is blocks[i]  # positional: block i's
    return [b is not kv.null_block for b in hit]


@pytest.mark.parametrize("group", GROUPS, ids=lambda g: type(g).__name__)
@pytest.mark.parametrize("cached", CACHED, ids=str)
@pytest.mark.parametrize("max_length", [0, 4, 8, 12, 16, 20])
def test_each_kinds_hit_is_vllms(
    group: KVCacheGroupSpec, cached: tuple[int, ...], max_length: int
) -> None:
    assert our_hit_mask(group, cached, max_length) == vllm_hit_mask(group, cached, max_length)


def vllm_manager(group: KVCacheGroupSpec, num_speculative_blocks: int = 0) -> Any:
    return vllm_manager_class(group)(
        vllm_spec(group, num_speculative_blocks),
        block_pool=vllm_pool(),
        enable_caching=True,
        kv_cache_group_id=1,
        scheduler_block_size=BLOCK,
    )


@pytest.mark.parametrize("group", GROUPS, ids=lambda g: type(g).__name__)
def test_each_kinds_skipped_tokens_are_vllms(group: KVCacheGroupSpec) -> None:
    ours: SingleTypeKVCacheManager = coordinator(FULL, group).managers[1]
    theirs = vllm_manager(group)
    for computed in range(1, 30):
        assert ours.get_num_skipped_tokens(computed) == theirs.get_num_skipped_tokens(computed)


TABLE_CASES = [(group, 0) for group in GROUPS] + [
    (MambaGroup(block_size=BLOCK, mamba_cache_mode="align", num_speculative_blocks=1), 1)
]


@pytest.mark.parametrize(
    ("group", "num_speculative_blocks"), TABLE_CASES, ids=lambda c: str(c).split("(")[0]
)
@pytest.mark.parametrize("chunks", [(8, 4, 4), (4, 12, 4), (16, 4), (3, 5, 8), (1,) * 10])
def test_a_table_over_chunks_is_vllms(
    group: KVCacheGroupSpec, num_speculative_blocks: int, chunks: tuple[int, ...]
) -> None:
    """Chunk after chunk, window frees on the processed tokens, then the count and the
    allocation: the same null mask as vLLM's table, and the same count."""
    ours = coordinator(FULL, group).managers[1]
    theirs = vllm_manager(group, num_speculative_blocks)
    ours.req_to_blocks["r"] = []
    ours.add_local_computed_blocks("r", [], 0)
    theirs.req_to_blocks["r"] = []
    theirs.add_local_computed_blocks("r", [], 0, 0)
    computed = 0
    for chunk in chunks:
        ours.remove_skipped_blocks("r", computed)
        theirs.remove_skipped_blocks("r", computed)
        end = computed + chunk
        needed = ours.get_num_blocks_to_allocate("r", end, [], computed, end)
        assert needed == theirs.get_num_blocks_to_allocate("r", end, [], computed, 0, end)
        ours.allocate_new_blocks("r", end, end)
        theirs.allocate_new_blocks("r", end, end)
        computed = end
        assert [b is not ours.null_block for b in ours.req_to_blocks["r"]] == [
            not b.is_null for b in theirs.req_to_blocks["r"]
        ]


MIXES: list[tuple[KVCacheGroupSpec, ...]] = [
    (FULL, GROUPS[0]),
    (FULL, GROUPS[3]),
    (GROUPS[0], GROUPS[3]),
    (FULL, GROUPS[1], GROUPS[3]),
]
SUBSETS = CACHED[1:6]


def vllm_coordinator(mix: tuple[KVCacheGroupSpec, ...]) -> Any:
    """vLLM's own coordinator over the mix (built by get_kv_cache_coordinator from a
    KVCacheConfig, no weights), 64 blocks, prefix caching on."""
    specs = [
        _specs.FullAttentionSpec(
            block_size=group.block_size, num_kv_heads=1, head_size=8, dtype=torch.float16
        )
        if isinstance(group, FullAttentionGroup)
        else vllm_spec(group)
        for group in mix
    ]
    config = _specs.KVCacheConfig(
        num_blocks=64,
        kv_cache_tensors=[],
        kv_cache_groups=[_specs.KVCacheGroupSpec([f"layer{i}"], s) for i, s in enumerate(specs)],
    )
    # The scheduler's block (their lcm), and the one vLLM hashes at (their gcd).
    size, hashed = max(g.block_size for g in mix), min(g.block_size for g in mix)
    module = importlib.import_module("vllm.v1.core.kv_cache_coordinator")
    return module.get_kv_cache_coordinator(config, 64, 64, False, True, False, 1, 1, size, hashed)


def vllm_reconciled_hit(
    mix: tuple[KVCacheGroupSpec, ...], cached: tuple[tuple[int, ...], ...], max_length: int
) -> tuple[int, int, list[list[bool]]]:
    theirs = vllm_coordinator(mix)
    hashes = [_utils.BlockHash(bytes([i + 1]) * 32) for i in range(NUM_HASHES)]
    pool = theirs.block_pool
    for gid, indices in enumerate(cached):
        for i in indices:
            block = pool.free_block_queue.popleft()
            key = _utils.make_block_hash_with_group_id(hashes[i], gid)
            pool.cached_block_hash_to_block.insert(key, block)
            block.block_hash = key
    blocks, length, uncached = theirs.find_longest_cache_hit(hashes, max_length)
    return length, uncached, [[not b.is_null for b in group] for group in blocks]


@pytest.mark.parametrize("mix", MIXES, ids=lambda m: "+".join(type(g).__name__ for g in m))
@pytest.mark.parametrize("max_length", [8, 20])
def test_the_reconciled_hit_is_vllms(mix: tuple[KVCacheGroupSpec, ...], max_length: int) -> None:
    """Every combination of cached subsets over the groups: the same hit length, the same
    uncached common prefix past it (the shared-prefix junction's source), and the same
    blocks in each group."""
    for cached in itertools.product(SUBSETS, repeat=len(mix)):
        ours = coordinator(*mix)
        request = prompt(NUM_HASHES * BLOCK + 1)
        for gid, indices in enumerate(cached):
            cache_in_group(ours, request, gid, indices)
        hits, length, uncached = ours.find_longest_cache_hit(request, max_length)
        masks = [[b is not ours.null_block for b in group] for group in hits]
        assert (length, uncached, masks) == vllm_reconciled_hit(mix, cached, max_length), cached


NEGATIVE_MIXES: list[tuple[KVCacheGroupSpec, ...]] = [
    (FULL, GROUPS[3]),
    (GROUPS[0], FULL, GROUPS[3]),
    (
        FullAttentionGroup(block_size=BLOCK),
        MambaGroup(block_size=2 * BLOCK, mamba_cache_mode="align"),
    ),
]


@pytest.mark.parametrize("mix", NEGATIVE_MIXES, ids=lambda m: "+".join(g.kind for g in m))
def test_a_negative_mamba_count_never_hides_another_groups_need(
    mix: tuple[KVCacheGroupSpec, ...],
) -> None:
    """vLLM 0.34.0's MambaManager.get_num_blocks_to_allocate (align mode) returns a
    negative count when the request's table was sized for more tokens than this step's
    (drafts scheduled, then rejected, then fewer drafts), and the coordinator sums it
    with the other groups' counts. Could the sum then let another group allocate past
    the free blocks? Only if another group needed blocks in the same call. A table is
    never shortened while the request holds it (windows put the null block in place),
    so every group's table covers the most tokens any earlier step allocated for:
    another group needs blocks only for more tokens than that, and Mamba's count is
    then >= 0. Over every pair of steps (first_tokens, then_tokens), on vLLM's own
    coordinator: a negative Mamba count comes only with zero in every other group, so
    the sum decides as the reference's count clamped at 0 does (both fit any free
    count >= 0). No finding."""
    seen_negative = 0
    mamba = len(mix) - 1
    for first in range(1, 18):
        for then in range(1, 18):
            theirs = vllm_coordinator(mix)
            empty: tuple[list[Any], ...] = tuple([] for _ in mix)
            theirs.get_num_blocks_to_allocate("r", first, empty, 0, 0, 0, first)
            theirs.allocate_new_blocks("r", first, first, 0)
            computed = min(first, then) - 1  # the rejected drafts rolled back
            counts = [
                manager.get_num_blocks_to_allocate("r", then, [], computed, computed, then)
                for manager in theirs.single_type_managers
            ]
            total = theirs.get_num_blocks_to_allocate("r", then, empty, 0, computed, computed, then)
            assert total == sum(counts), (first, then)
            if counts[mamba] < 0:
                seen_negative += 1
                assert then < first, (first, then)
                assert counts[:mamba] == [0] * mamba, (first, then, counts)
    assert seen_negative > 0  # the case exists: vLLM does return negative counts
