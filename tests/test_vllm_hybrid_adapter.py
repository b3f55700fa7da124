"""The vLLM adapter with hybrid KV cache groups (adapters/vllm/kv_groups.py): the configs
it refuses and their nearest runnable ones, the block-id and hash translation, and, with
vLLM installed (either supported release), vLLM's scheduler built from the groups and
snapshotted group by group."""

from __future__ import annotations

import importlib.util
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import pytest

from schedspec.adapters.vllm.config import expressible, refusal
from schedspec.adapters.vllm.kv_groups import (
    PoolHashes,
    group_tables,
    held_blocks,
    spec_block_id,
)
from schedspec.adapters.vllm.output import spec_block_ids
from schedspec.spec import Request, SchedulerConfig, extend_block_hashes
from schedspec.spec.kv_groups import (
    NULL_BLOCK_ID,
    ChunkedLocalGroup,
    FullAttentionGroup,
    KVCacheGroupSpec,
    MambaGroup,
    SlidingWindowGroup,
    group_block_hash,
)
from tests.sched_helpers import make_config

FULL = FullAttentionGroup(block_size=4)
WINDOW = SlidingWindowGroup(block_size=4, sliding_window=5)  # holds 2 blocks at most
MAMBA = MambaGroup(block_size=4, mamba_cache_mode="align")
CHUNKED = ChunkedLocalGroup(block_size=4, attention_chunk_size=8)
UNEQUAL = (FullAttentionGroup(block_size=8), SlidingWindowGroup(block_size=4, sliding_window=6))


def hybrid(*groups: KVCacheGroupSpec, **overrides: Any) -> SchedulerConfig:
    fields: dict[str, Any] = {
        "block_size": 4,
        "num_blocks": 40,
        "max_model_len": 32,
        "max_num_batched_tokens": 16,
        "max_num_seqs": 4,
        "enable_prefix_caching": True,
        "kv_cache_groups": groups,
    }
    return make_config(**{**fields, **overrides})


# ------------------------------------------------- refusals (no vLLM needed)


def test_mamba_groups_in_two_modes_are_refused_naming_the_field() -> None:
    config = hybrid(
        FULL, MAMBA, replace(MAMBA, mamba_cache_mode="none"), enable_prefix_caching=False
    )
    refused = refusal(config)
    assert refused is not None and refused.field == "kv_cache_groups"
    assert "one mamba_cache_mode for the whole model" in str(refused)
    # The nearest config vLLM runs: every Mamba group aligned.
    fixed = expressible(config)
    assert refusal(fixed) is None
    assert fixed.kv_cache_groups == (FULL, MAMBA, MAMBA)


def test_unequal_block_sizes_under_prefix_caching_are_refused_naming_the_field() -> None:
    config = hybrid(*UNEQUAL, block_size=8)
    refused = refusal(config)
    assert refused is not None and refused.field == "kv_cache_groups"
    assert "block sizes [4, 8] with prefix caching" in str(refused)
    assert "hashes every 4 tokens" in str(refused)
    # Without prefix caching vLLM hashes nothing, and runs them.
    assert refusal(replace(config, enable_prefix_caching=False)) is None
    # The nearest config: every group at the scheduler block size.
    fixed = expressible(config)
    assert refusal(fixed) is None
    assert [g.block_size for g in fixed.kv_cache_groups] == [8, 8]
    assert fixed.block_size == 8


def test_unequal_block_sizes_beside_an_aligned_mamba_group_are_refused() -> None:
    """Without prefix caching too: vLLM's split cuts at the smallest prefix-cacheable
    group's block (CacheConfig.block_size), not at Mamba's own, and a served model in
    align mode has one block size. The vLLM check met it once regime hybrid-mamba-eagle
    drew Full(1) + Mamba(2) without prefix caching: a 2-token prompt, vLLM scheduled 1
    (its split at block 1, the EAGLE checkpoint at 1), the reference 2."""
    wide = replace(MAMBA, block_size=8)
    config = hybrid(FULL, wide, block_size=8, enable_prefix_caching=False)
    refused = refusal(config)
    assert refused is not None and refused.field == "kv_cache_groups"
    assert "block sizes [4, 8] beside a Mamba group in align mode" in str(refused)
    fixed = expressible(config)
    assert refusal(fixed) is None
    assert fixed.kv_cache_groups == (FullAttentionGroup(block_size=8), wide)
    # Mamba in mode "none" has no split: its block may differ (vLLM's default is
    # max_model_len).
    running = replace(wide, mamba_cache_mode="none")
    assert refusal(hybrid(FULL, running, block_size=8, enable_prefix_caching=False)) is None


def test_a_runnable_hybrid_config_is_its_own_nearest() -> None:
    config = hybrid(FULL, WINDOW, MAMBA)
    assert refusal(config) is None
    assert expressible(config).kv_cache_groups == config.kv_cache_groups


# --------------------------------------- block ids and hashes (no vLLM needed)


def test_vllm_block_ids_as_the_specs() -> None:
    # vLLM's block 0 is its null block; its block b is ours b - 1.
    assert [spec_block_id(b) for b in (0, 1, 7)] == [NULL_BLOCK_ID, 0, 6]
    tables = group_tables(([1, 2, 3], [0, 0, 5], [0, 9]))
    assert tables == ((0, 1, 2), (NULL_BLOCK_ID, NULL_BLOCK_ID, 4), (NULL_BLOCK_ID, 8))
    # Every block held, group 0's table first, the null block left out.
    assert held_blocks(tables) == (0, 1, 2, 4, 8)
    # The scheduler output's tables: one group is the table itself, several are flattened.
    assert spec_block_ids(([1, 2],)) == (0, 1)
    assert spec_block_ids(([1, 2], [0, 3])) == (0, 1, 2)
    assert spec_block_ids(None) == ()


def _sha(tokens: Sequence[int]) -> bytes:
    return bytes(tokens[-1:]) * 32  # any hash unique per prefix end suffices here


def _key(vllm_hash: bytes, group_id: int) -> bytes:
    return vllm_hash + group_id.to_bytes(4, "big")


def test_pool_keys_translate_per_group_at_each_groups_block_size() -> None:
    """vLLM hashes every 4 tokens; a group of 8-token blocks names its block k by the hash
    at token 8(k + 1), which is the spec's hash of that group's block k, tagged."""
    config = hybrid(*UNEQUAL, block_size=8, enable_prefix_caching=False)
    hashes = PoolHashes(config, hash_block_size=4)
    tokens = list(range(1, 17))
    vllm = [bytes([i]) * 32 for i in range(4)]  # one per 4 tokens, each naming its prefix
    hashes.learn("r", vllm, tokens)
    chain8 = extend_block_hashes([], tokens, 8)
    chain4 = extend_block_hashes([], tokens, 4)
    assert hashes.spec_of(_key(vllm[1], 0)) == group_block_hash(chain8[0], 0)
    assert hashes.spec_of(_key(vllm[3], 0)) == group_block_hash(chain8[1], 0)
    assert [hashes.spec_of(_key(h, 1)) for h in vllm] == [group_block_hash(h, 1) for h in chain4]
    with pytest.raises(RuntimeError, match="which no request's tokens produced"):
        hashes.spec_of(_key(vllm[0], 0))  # no block of group 0 ends at token 4


def test_without_groups_pool_keys_are_the_single_groups_untagged() -> None:
    config = make_config(block_size=4, enable_prefix_caching=True)
    hashes = PoolHashes(config, hash_block_size=4)
    tokens = list(range(1, 9))
    vllm = [b"a" * 32, b"b" * 32]
    hashes.learn("r", vllm, tokens)
    assert hashes.spec_of(_key(vllm[1], 0)) == extend_block_hashes([], tokens, 4)[1]


def test_a_coarser_vllm_hash_than_a_group_is_refused_when_hashes_come() -> None:
    config = hybrid(*UNEQUAL, block_size=8, enable_prefix_caching=False)
    hashes = PoolHashes(config, hash_block_size=8)
    hashes.learn("r", [], list(range(16)))  # no prefix caching: vLLM hashes nothing
    with pytest.raises(RuntimeError, match="coarser than a group's"):
        hashes.learn("r", [b"x" * 32], list(range(16)))


# ----------------------------------------------------------- with vLLM


needs_vllm = pytest.mark.skipif(
    importlib.util.find_spec("vllm") is None, reason="vLLM is not installed"
)


def _engine(config: SchedulerConfig) -> Any:
    from schedspec.adapters.vllm.engine import VllmEngine

    return VllmEngine(config)


def _step(engine: Any, sampled: int = 7) -> None:
    """One step; every request whose step reached its known tokens samples `sampled`."""
    from tests.test_vllm_adapter import finish_step  # it needs vLLM to import

    finish_step(engine, engine.schedule(), sampled)


@needs_vllm
@pytest.mark.parametrize(
    "groups",
    [(FULL, WINDOW), (FULL, MAMBA), (WINDOW, CHUNKED, MAMBA), (FULL, FULL)],
    ids=lambda g: "+".join(x.kind for x in g),
)
def test_vllm_takes_the_groups_as_given(groups: tuple[KVCacheGroupSpec, ...]) -> None:
    from schedspec.adapters.vllm.kv_groups import spec_groups

    engine = _engine(hybrid(*groups))
    kv = engine.scheduler.kv_cache_manager
    assert spec_groups(kv.kv_cache_config) == groups  # also checked when built
    assert kv.block_pool.null_block.block_id == 0
    assert engine.snapshot().kv.num_blocks == 40


@needs_vllm
def test_a_window_frees_a_block_and_the_snapshot_shows_the_null_block() -> None:
    """A 13-token prompt in full attention beside a 5-token window (blocks of 4): after the
    prompt, the window keeps only the blocks holding its last 5 tokens; the blocks it
    freed show as NULL_BLOCK_ID, and block_ids lists what the request holds."""
    engine = _engine(hybrid(FULL, WINDOW, enable_prefix_caching=False))
    engine.add_request(Request("r", list(range(1, 14)), 4))
    _step(engine)  # the 13 prompt tokens
    _step(engine)  # the window frees below the 13 processed tokens
    state = engine.snapshot()
    request = state.requests["r"]
    full, window = request.group_block_ids
    assert full == (0, 1, 2, 3)
    assert window[:2] == (NULL_BLOCK_ID, NULL_BLOCK_ID) and NULL_BLOCK_ID not in window[2:]
    assert request.block_ids == held_blocks(request.group_block_ids)
    held = set(request.block_ids)
    assert set(state.kv.free_block_ids) == set(range(40)) - held
    assert all(state.kv.ref_counts[b] == (b in held) for b in range(40))


@needs_vllm
def test_mamba_keeps_one_state_block_among_nulls() -> None:
    engine = _engine(hybrid(FULL, MAMBA, enable_prefix_caching=False))
    engine.add_request(Request("r", list(range(1, 14)), 4))
    for _ in range(3):
        _step(engine)
    _, mamba = engine.snapshot().requests["r"].group_block_ids
    assert len(mamba) == 4  # one slot per block of tokens: 15 computed tokens
    assert sum(b != NULL_BLOCK_ID for b in mamba) <= 2  # the running state (and its source)


@needs_vllm
@pytest.mark.parametrize("groups", [(FULL, WINDOW), (WINDOW, CHUNKED, MAMBA)], ids=str)
def test_the_prefix_cache_is_named_by_the_specs_group_hashes(
    groups: tuple[KVCacheGroupSpec, ...],
) -> None:
    """A finished request's cached blocks: each pool key is the spec's hash of the block
    of that group, tagged with the group (spec.kv_groups.group_block_hash)."""
    engine = _engine(hybrid(*groups))
    prompt = list(range(1, 18))
    engine.add_request(Request("r", prompt, 1))
    _step(engine)
    _step(engine)
    state = engine.snapshot()
    assert "r" not in state.requests
    chain = extend_block_hashes([], [*prompt, 7], 4)
    possible = {group_block_hash(h, gid) for gid in range(len(groups)) for h in chain}
    cached = [h for h, _ in state.kv.prefix_cache]
    assert cached and set(cached) <= possible
    assert all(h in possible for h in state.kv.block_hashes if h is not None)
