"""The spec's KV cache groups as vLLM's KVCacheConfig, and vLLM's per-group block tables
as the spec's (docs/SPEC.md, "Hybrid KV cache groups").

Nothing here imports vLLM: the builders take the adapter's `Vllm` names
(adapters/vllm/runtime.py), the readers vLLM's objects (typed Any).

Translation (`kv_cache_config`): one vLLM KVCacheGroupSpec per spec group, in the
config's order, each with one layer of its own: FullAttentionGroup -> FullAttentionSpec,
SlidingWindowGroup -> SlidingWindowSpec (sliding_window), ChunkedLocalGroup ->
ChunkedLocalAttentionSpec (attention_chunk_size), MambaGroup -> MambaSpec
(mamba_cache_mode, num_speculative_blocks; one float32 state of one value, the scheduler
never reads a state's shape). Without groups it is today's one full-attention group.
The layers' shapes mean nothing to the scheduler (no tensors are allocated), only the
kinds and their parameters do.

vLLM keeps one `mamba_cache_mode` for the whole model (CacheConfig.mamba_cache_mode,
which the Scheduler reads to decide the aligned split), so the Mamba groups of a config
it runs share one mode (`refusal`). The split cuts at CacheConfig.block_size, which
vLLM's engine core sets to the smallest prefix-cacheable group's, and a served model in
align mode has its Mamba block at the attention block: beside a Mamba group in align
mode every group has one block size (`refusal`), as under prefix caching.

Block ids: vLLM's pool has one block more than the spec's, its null block, at id 0
(BlockPool pops it first; the adapter checks that when it builds the scheduler). vLLM's
block b is the spec's b - 1, and its null block is the spec's NULL_BLOCK_ID, which
stands outside the pool.

Block hashes (`PoolHashes`): vLLM hashes a request once, every `hash_block_size` tokens
(the groups' gcd under prefix caching, vLLM 0.34.0 resolve_kv_cache_block_sizes), and
names a group's block in its pool by the hash at the block's last such boundary (it
covers the whole prefix), packed with the group's index (make_block_hash_with_group_id:
4 bytes, big-endian). The spec names it by group_block_hash of the group's own chained
hash. The adapter pairs them per group: vLLM's every (block size / hash_block_size)-th
hash of a request with the spec's hash of the same block of the same request.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from schedspec.adapters.kit import HashTranslator
from schedspec.spec import BlockHash, ConfigError, SchedulerConfig
from schedspec.spec.kv_groups import (
    NULL_BLOCK_ID,
    ChunkedLocalGroup,
    FullAttentionGroup,
    KVCacheGroupSpec,
    MambaCacheMode,
    MambaGroup,
    SlidingWindowGroup,
    group_block_hash,
    mamba_split_group,
)

# vLLM's null block: the first block its BlockPool hands out, which it never frees.
VLLM_NULL_BLOCK_ID = 0


def refusal(config: SchedulerConfig) -> ConfigError | None:
    """Why the adapter cannot run the config's groups on vLLM (the field and why), or
    None."""
    groups = config.kv_cache_groups
    modes = {g.mamba_cache_mode for g in groups if isinstance(g, MambaGroup)}
    if len(modes) > 1:
        return ConfigError(
            "kv_cache_groups",
            f"Mamba groups in modes {sorted(modes)}: vLLM keeps one mamba_cache_mode for "
            "the whole model (CacheConfig.mamba_cache_mode); give every Mamba group the same",
        )
    sizes = sorted({g.block_size for g in groups})
    if config.enable_prefix_caching and len(sizes) > 1:
        return ConfigError(
            "kv_cache_groups",
            f"block sizes {sizes} with prefix caching: vLLM then hashes every "
            f"{math.gcd(*sizes)} tokens and registers a block that a prompt ends inside "
            "under the prompt's last hash (BlockPool.cache_partial_block), a finer hit "
            "than the spec's, which hits whole scheduler blocks (docs/HYBRID.md, 'Design "
            "decisions'); give every group the same block size",
        )
    if mamba_split_group(groups) is not None and len(sizes) > 1:
        return ConfigError(
            "kv_cache_groups",
            f"block sizes {sizes} beside a Mamba group in align mode: vLLM's split cuts "
            "chunks at CacheConfig.block_size, which its engine core sets to the smallest "
            "prefix-cacheable group's, not at the Mamba group's own; a served model in "
            "align mode has its Mamba block at the attention block (Platform's block-size "
            "update sets mamba_block_size to it); give every group the same block size",
        )
    return None


def expressible(config: SchedulerConfig) -> SchedulerConfig:
    """The nearest config whose groups the adapter runs on vLLM (`refusal`): Mamba groups
    in one mode, "align" where they differ (they differ only without prefix caching,
    where the spec allows "align" too); under prefix caching or beside a Mamba group in
    align mode, every group at the scheduler block size (their lcm, so the scheduler's
    block size stays)."""
    if refusal(config) is None:
        return config
    groups = tuple(
        replace(g, mamba_cache_mode="align") if isinstance(g, MambaGroup) else g
        for g in config.kv_cache_groups
    )
    if config.enable_prefix_caching or mamba_split_group(groups) is not None:
        groups = tuple(replace(g, block_size=config.block_size) for g in groups)
    return replace(config, kv_cache_groups=groups)


def groups_of(config: SchedulerConfig) -> tuple[KVCacheGroupSpec, ...]:
    """The config's groups, the single full-attention group where it has none."""
    return config.kv_cache_groups or (FullAttentionGroup(block_size=config.block_size),)


def mamba_cache_mode(config: SchedulerConfig) -> MambaCacheMode:
    """vLLM's CacheConfig.mamba_cache_mode for the config: its Mamba groups' mode (they
    share one: `refusal`), "none" without Mamba groups (vLLM's default)."""
    for group in config.kv_cache_groups:
        if isinstance(group, MambaGroup):
            return group.mamba_cache_mode
    return "none"


def kv_cache_config(v: Any, config: SchedulerConfig, num_vllm_blocks: int) -> Any:
    """vLLM's KVCacheConfig for the config's groups (the single full-attention group
    without them), over num_vllm_blocks blocks, the null block among them."""
    return v.KVCacheConfig(
        num_blocks=num_vllm_blocks,
        kv_cache_tensors=[],
        kv_cache_groups=[
            v.KVCacheGroupSpec([f"layer{i}"], _layer_spec(v, group))
            for i, group in enumerate(groups_of(config))
        ],
    )


def _layer_spec(v: Any, group: KVCacheGroupSpec) -> Any:
    attention = {"block_size": group.block_size, "num_kv_heads": 1, "head_size": 1}
    if isinstance(group, FullAttentionGroup):
        return v.FullAttentionSpec(**attention, dtype=v.float32)
    if isinstance(group, SlidingWindowGroup):
        return v.SlidingWindowSpec(
            **attention, dtype=v.float32, sliding_window=group.sliding_window
        )
    if isinstance(group, ChunkedLocalGroup):
        return v.ChunkedLocalAttentionSpec(
            **attention, dtype=v.float32, attention_chunk_size=group.attention_chunk_size
        )
    return v.MambaSpec(
        block_size=group.block_size,
        shapes=((1,),),
        dtypes=(v.float32,),
        mamba_cache_mode=group.mamba_cache_mode,
        num_speculative_blocks=group.num_speculative_blocks,
    )


def spec_groups(kv_cache_config: Any) -> tuple[KVCacheGroupSpec, ...]:
    """vLLM's KVCacheConfig read back as the spec's groups (`kv_cache_config`'s inverse),
    for the check that vLLM took the config as given. A kind the spec has no group for
    is a RuntimeError naming it."""
    groups: list[KVCacheGroupSpec] = []
    for group in kv_cache_config.kv_cache_groups:
        spec = group.kv_cache_spec
        kind = type(spec).__name__
        if kind == "FullAttentionSpec":
            groups.append(FullAttentionGroup(block_size=spec.block_size))
        elif kind == "SlidingWindowSpec":
            groups.append(
                SlidingWindowGroup(block_size=spec.block_size, sliding_window=spec.sliding_window)
            )
        elif kind == "ChunkedLocalAttentionSpec":
            groups.append(
                ChunkedLocalGroup(
                    block_size=spec.block_size, attention_chunk_size=spec.attention_chunk_size
                )
            )
        elif kind == "MambaSpec":
            groups.append(
                MambaGroup(
                    block_size=spec.block_size,
                    mamba_cache_mode=spec.mamba_cache_mode,
                    num_speculative_blocks=spec.num_speculative_blocks,
                )
            )
        else:
            raise RuntimeError(f"vLLM's KV cache has a group of kind {kind}")
    return tuple(groups)


def spec_block_id(vllm_block_id: int) -> int:
    """A vLLM block id as the spec's: the null block is NULL_BLOCK_ID, block b is b - 1."""
    return NULL_BLOCK_ID if vllm_block_id == VLLM_NULL_BLOCK_ID else vllm_block_id - 1


def group_tables(block_ids: Sequence[Sequence[int]]) -> tuple[tuple[int, ...], ...]:
    """vLLM's per-group block ids (KVCacheManager.get_block_ids) as the spec's
    RequestState.group_block_ids: each group's table in order, the null block as
    NULL_BLOCK_ID."""
    return tuple(tuple(spec_block_id(b) for b in table) for table in block_ids)


def held_blocks(tables: Sequence[Sequence[int]]) -> tuple[int, ...]:
    """The spec's RequestState.block_ids of a hybrid request: every block it holds, group
    0's table first, then group 1's, ..., the null block left out (it is no block of the
    pool)."""
    return tuple(b for table in tables for b in table if b != NULL_BLOCK_ID)


class PoolHashes:
    """vLLM's pool keys (a block hash and a group index) as the spec's hashes, learned from
    each request's own tokens (adapters/kit/block_hashes.py). Without groups a key's hash
    is the spec's single group's, untagged, as before groups."""

    def __init__(self, config: SchedulerConfig, hash_block_size: int) -> None:
        self._tagged = bool(config.kv_cache_groups)
        # Per group: its translator, and how many of vLLM's hashes make one of its blocks.
        self._groups = [
            (HashTranslator(g.block_size), g.block_size // hash_block_size)
            for g in groups_of(config)
        ]

    def learn(self, rid: str, vllm_hashes: Sequence[bytes], tokens: Sequence[int]) -> None:
        """Pair the request's vLLM hashes with the spec's hashes of its blocks, per group.
        (vLLM hashes only under prefix caching: without it a request has no hashes, and
        its hash block size, the scheduler's, may be coarser than a group's.)"""
        if not vllm_hashes:
            return
        for translator, stride in self._groups:
            if stride == 0:
                raise RuntimeError("vLLM hashes at a block size coarser than a group's")
            translator.learn(rid, vllm_hashes[stride - 1 :: stride], tokens)

    def spec_of(self, key: bytes) -> BlockHash:
        """A pool key (block hash + 4-byte group index) as the spec's hash."""
        group_id = int.from_bytes(key[-4:], "big")
        translator, _ = self._groups[group_id]
        found = translator.spec_of(bytes(key[:-4]))
        return group_block_hash(found, group_id) if self._tagged else found

    def forget(self, rid: str) -> None:
        for translator, _ in self._groups:
            translator.forget(rid)
