"""Hybrid KV cache regimes (docs/SPEC.md, "Hybrid KV cache groups"): a drawn config given
kv_cache_groups, for engines with Capability.HYBRID_KV (configs(hybrid=True)).

Each regime is a plain function of the drawn config, drawing nothing more, so a strategy
without hybrid regimes draws exactly what it drew before. Their groups are small so that
within a 40-action example windows slide (a window of one block and a token: a block
falls behind it every block of progress), Mamba states are copied (one state block per
block of progress) and prefix hits meet groups that disagree; the pool is the tightest
legal one or up to two blocks more, so hybrid requests preempt each other.
"""

from __future__ import annotations

import dataclasses

from schedspec.spec import SchedulerConfig
from schedspec.spec.kv_groups import (
    ChunkedLocalGroup,
    FullAttentionGroup,
    KVCacheGroupSpec,
    MambaGroup,
    SlidingWindowGroup,
    blocks_for_one_request,
    scheduler_block_size,
)


def _base(config: SchedulerConfig) -> int:
    """The smallest group block size: the drawn block size, at most 4 (a scheduler block
    of a few small group blocks, reached within an example)."""
    return min(config.block_size, 4)


def _with_groups(
    config: SchedulerConfig, groups: tuple[KVCacheGroupSpec, ...], caching: bool
) -> SchedulerConfig:
    """The drawn config with these groups: their lcm as the block size, a pool of the
    tightest legal size or up to two blocks more, no KV connector (not modelled with
    groups), no cache-aware reorder (its depth is the single group's: docs/HYBRID.md,
    "Design decisions")."""
    held = blocks_for_one_request(groups, config.max_model_len, config.async_scheduling)
    size = scheduler_block_size(groups)
    pool = max(held + config.num_blocks % 3, -(-config.max_model_len // size))
    return dataclasses.replace(
        config,
        kv_cache_groups=groups,
        block_size=size,
        num_blocks=pool,
        enable_prefix_caching=caching,
        kv_connector=False,
        kv_load_failure_policy="fail",
        max_num_inflight_kv_loads=None,
        cache_aware_admission_window=0,
        cache_aware_admission_threshold=0.5,
    )


def _chunked(config: SchedulerConfig) -> SchedulerConfig:
    # vLLM requires chunked prefill for Mamba prefix caching (model_executor/models/
    # config.py); the budget may then stay as drawn (at least max_num_seqs).
    return dataclasses.replace(config, enable_chunked_prefill=True)


def sliding_window(config: SchedulerConfig) -> SchedulerConfig:
    """Full attention beside a window of one block and a token, both at the drawn block
    size: every block of progress frees a window block (window-frees-a-block)."""
    b = _base(config)
    groups = (
        FullAttentionGroup(block_size=b),
        SlidingWindowGroup(block_size=b, sliding_window=b + 1),
    )
    return _with_groups(config, groups, caching=True)


def short_window(config: SchedulerConfig) -> SchedulerConfig:
    """Full attention at twice the window group's block size, beside a window of one window
    block: a hit ends on a full-attention boundary and reads only the window block before
    it, so the window caches every second block, and with 1-token blocks (a 1-token
    window) none (docs/FINDINGS.md G6, `window_block_reachable`)."""
    b = _base(config)
    groups = (
        FullAttentionGroup(block_size=2 * b),
        SlidingWindowGroup(block_size=b, sliding_window=b),
    )
    return _with_groups(config, groups, caching=True)


def mamba_align(config: SchedulerConfig) -> SchedulerConfig:
    """Full attention at half the Mamba group's block size, Mamba in align mode with a
    scratch state per draft, prefix caching and chunked prefill: chunk ends are cut to
    Mamba boundaries that the full group's smaller blocks do not have (mamba-aligned-split;
    vLLM #55600 and #54076 cut at the smallest group's block size)."""
    b = _base(config)
    mamba = MambaGroup(
        block_size=2 * b,
        mamba_cache_mode="align",
        num_speculative_blocks=config.num_speculative_tokens,
    )
    return _with_groups(_chunked(config), (FullAttentionGroup(block_size=b), mamba), caching=True)


def mamba_eagle(config: SchedulerConfig) -> SchedulerConfig:
    """mamba_align's groups with an EAGLE-style drafter (the drawn K drafts, at least one,
    with K lookahead slots) and no prefix caching: vLLM's EAGLE block drop
    (Scheduler.use_eagle_block_drop, which prefix caching's lookahead hashes clear) backs
    the Mamba checkpoint off a block, so a prefill stops one block earlier, or runs
    through the boundary the plain checkpoint would stop it at
    (mamba-eagle-checkpoint-backoff; vLLM #50630 and #43559: the Mamba side ignored the
    drop). Padding stays as drawn, within a budget of at least 1 + K."""
    b = _base(config)
    k = max(config.num_speculative_tokens, 1)
    drafted = dataclasses.replace(
        _chunked(config),
        num_speculative_tokens=k,
        num_lookahead_tokens=None,
        max_num_batched_tokens=max(config.max_num_batched_tokens, 1 + k),
    )
    mamba = MambaGroup(block_size=2 * b, mamba_cache_mode="align", num_speculative_blocks=k)
    return _with_groups(drafted, (FullAttentionGroup(block_size=b), mamba), caching=False)


def mamba_wide_block(config: SchedulerConfig) -> SchedulerConfig:
    """A Mamba block one token wider than the step's budget (at most two blocks of full
    attention, or the padded 1 + K), so no step covers one: chunks advance by part of a
    block rather than round down to nothing (vLLM #40707, #45414)."""
    b = _base(config)
    seats = min(config.max_num_seqs, 2 * b)
    budget = max(seats, 2 * b)
    if config.pad_spec_decode:
        budget = max(budget, 1 + config.num_speculative_tokens)
    narrowed = dataclasses.replace(
        _chunked(config),
        max_num_seqs=seats,
        max_num_batched_tokens=budget,
        long_prefill_token_threshold=0,
    )
    mamba = MambaGroup(
        block_size=budget + 1,
        mamba_cache_mode="align",
        num_speculative_blocks=config.num_speculative_tokens,
    )
    return _with_groups(narrowed, (FullAttentionGroup(block_size=b), mamba), caching=True)


def window_and_mamba(config: SchedulerConfig) -> SchedulerConfig:
    """Full attention, a window of one block and a token, and Mamba in align mode, all at
    the drawn block size, with prefix caching: a hit is cut by whichever group lags
    (hit-cut-by-lagging-group; vLLM #46453's disagreeing hits)."""
    b = _base(config)
    groups = (
        FullAttentionGroup(block_size=b),
        SlidingWindowGroup(block_size=b, sliding_window=b + 1),
        MambaGroup(
            block_size=b,
            mamba_cache_mode="align",
            num_speculative_blocks=config.num_speculative_tokens,
        ),
    )
    return _with_groups(_chunked(config), groups, caching=True)


def chunked_local(config: SchedulerConfig) -> SchedulerConfig:
    """Full attention beside chunked-local attention with chunks of two blocks."""
    b = _base(config)
    groups = (
        FullAttentionGroup(block_size=b),
        ChunkedLocalGroup(block_size=b, attention_chunk_size=2 * b),
    )
    return _with_groups(config, groups, caching=True)


def mamba_running_state(config: SchedulerConfig) -> SchedulerConfig:
    """Mamba in mode "none" (one running state, no prefix caching) at vLLM's default
    block size for that mode, max_model_len, beside a window."""
    b = _base(config)
    groups = (
        SlidingWindowGroup(block_size=b, sliding_window=b + 1),
        MambaGroup(
            block_size=config.max_model_len, num_speculative_blocks=config.num_speculative_tokens
        ),
    )
    return _with_groups(config, groups, caching=False)
