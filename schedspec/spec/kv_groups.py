"""KV cache groups: the kinds of attention layer a hybrid model's cache serves.

A model whose layers are all full attention has one group, and that is the default
(an empty `SchedulerConfig.kv_cache_groups`): one pool, one block size, today's
rules. A hybrid model (sliding-window layers beside full attention, as in gpt-oss
and Gemma 3; Mamba layers beside full attention, as in Qwen3-Next) has a group per
kind of layer, each with its own block size and its own rule for which blocks it
still needs, over one shared pool (docs/SPEC.md, "Hybrid KV cache groups").

Each kind is a frozen dataclass checked on construction; a bad value raises
ConfigError naming the field. `kind` is a field (not settable) so that
dataclasses.asdict, which writes a config into a trace, keeps it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

from schedspec.spec.arithmetic import cdiv
from schedspec.spec.block_hash import BlockHash, extend_block_hashes, hash_block_tokens
from schedspec.spec.checks import require_int
from schedspec.spec.errors import ConfigError, shown

MambaCacheMode = Literal["none", "align"]
MAMBA_CACHE_MODES: tuple[MambaCacheMode, ...] = ("none", "align")

# Drafts verified per step are at most this many (config.MAX_SPECULATIVE_TOKENS), so
# no Mamba group needs more scratch state blocks than that.
MAX_SPECULATIVE_BLOCKS = 256

# The null block's id, where a group's table holds "nothing here" (a block a window
# skipped or freed, a Mamba slot not in use). It is outside the pool's
# 0..num_blocks-1, so no snapshot of the pool ever lists it (vLLM gives it id 0 and
# its pool one block more; an adapter maps that to this).
NULL_BLOCK_ID = -1


@dataclass(frozen=True, kw_only=True)
class FullAttentionGroup:
    """Layers that attend to every earlier token: a block is kept until the request ends."""

    block_size: int
    kind: Literal["full_attention"] = field(default="full_attention", init=False)

    def __post_init__(self) -> None:
        require_int("block_size", self.block_size, 1)


@dataclass(frozen=True, kw_only=True)
class SlidingWindowGroup:
    """Layers that attend to the last `sliding_window` tokens (the new token included):
    blocks wholly before the window are freed once processed."""

    block_size: int
    sliding_window: int
    kind: Literal["sliding_window"] = field(default="sliding_window", init=False)

    def __post_init__(self) -> None:
        require_int("block_size", self.block_size, 1)
        require_int("sliding_window", self.sliding_window, 1)


@dataclass(frozen=True, kw_only=True)
class ChunkedLocalGroup:
    """Layers that attend within fixed chunks of `attention_chunk_size` tokens (Llama 4's
    local layers): blocks of earlier chunks are freed once processed."""

    block_size: int
    attention_chunk_size: int
    kind: Literal["chunked_local"] = field(default="chunked_local", init=False)

    def __post_init__(self) -> None:
        require_int("block_size", self.block_size, 1)
        require_int("attention_chunk_size", self.attention_chunk_size, 1)


@dataclass(frozen=True, kw_only=True)
class MambaGroup:
    """Recurrent (Mamba, linear-attention) layers: one state per request, not one slot per
    token. A block holds the state after a whole number of blocks of tokens.

    mamba_cache_mode "none": one running state, overwritten in place; no prefix caching.
    "align": a state is kept at each block boundary, chunk ends are cut to boundaries,
    and the previous state is copied forward into each new block (vLLM's names).
    num_speculative_blocks: scratch states for drafts (MTP/EAGLE with linear layers).
    """

    block_size: int
    mamba_cache_mode: MambaCacheMode = "none"
    num_speculative_blocks: int = 0
    kind: Literal["mamba"] = field(default="mamba", init=False)

    def __post_init__(self) -> None:
        require_int("block_size", self.block_size, 1)
        if self.mamba_cache_mode not in MAMBA_CACHE_MODES:
            raise ConfigError(
                "mamba_cache_mode",
                f"must be one of {MAMBA_CACHE_MODES}, got {shown(self.mamba_cache_mode)}",
            )
        require_int(
            "num_speculative_blocks",
            self.num_speculative_blocks,
            0,
            MAX_SPECULATIVE_BLOCKS,
            "a request never has more drafts in flight",
        )


KVCacheGroupSpec = FullAttentionGroup | SlidingWindowGroup | ChunkedLocalGroup | MambaGroup
GROUP_KINDS: dict[str, type[KVCacheGroupSpec]] = {
    "full_attention": FullAttentionGroup,
    "sliding_window": SlidingWindowGroup,
    "chunked_local": ChunkedLocalGroup,
    "mamba": MambaGroup,
}


def scheduler_block_size(groups: tuple[KVCacheGroupSpec, ...]) -> int:
    """The block size the scheduler aligns to: the least common multiple of the groups'
    (vLLM 0.34.0 kv_cache_utils.resolve_kv_cache_block_sizes), so a scheduler block is
    a whole number of blocks in every group."""
    return math.lcm(*(g.block_size for g in groups))


def max_in_flight_tokens(max_num_batched_tokens: int, async_scheduling: bool) -> int:
    """The most tokens scheduled but not yet processed: one step's budget, two under async
    scheduling (a step in flight while the next is scheduled). vLLM 0.33.0 and 0.34.0
    VllmConfig.max_in_flight_tokens, with one pipeline stage."""
    return (1 + int(async_scheduling)) * max_num_batched_tokens


def admission_cap_blocks(
    group: KVCacheGroupSpec, max_in_flight_tokens: int, max_model_len: int
) -> int | None:
    """The most blocks a request holds at once in a group that frees blocks as it runs
    (a window, chunked local), or None for a group that holds every block to the end.

    Frees run on processed tokens before each allocation, so a window group holds the
    window's `sliding_window - 1` tokens before the first unprocessed one, plus the
    tokens in flight and scheduled, never more than max_model_len; one block more where
    the window starts inside a block. A chunked-local group holds its current chunk plus
    those tokens. vLLM's full-sequence admission gate counts such a group at this cap
    (vLLM 0.33.0 and 0.34.0 `max_admission_blocks_per_request` of SlidingWindowSpec and
    ChunkedLocalAttentionSpec, applied by `apply_admission_cap`)."""
    if isinstance(group, SlidingWindowGroup):
        tokens = min(group.sliding_window - 1 + max_in_flight_tokens, max_model_len)
        return cdiv(tokens, group.block_size) + 1
    if isinstance(group, ChunkedLocalGroup):
        tokens = min(group.attention_chunk_size + max_in_flight_tokens, max_model_len)
        return cdiv(tokens, group.block_size)
    return None


def window_block_reachable(group: KVCacheGroupSpec, index: int, scheduler_block_size: int) -> bool:
    """Whether some prefix-cache hit can use block `index` of the group's table, so that
    caching it is worth a registration. Only a sliding window says no: a hit ends on a
    scheduler-block boundary and the window group reads just the `cdiv(sliding_window - 1,
    block_size)` blocks before it, so a block outside every such tail is never a hit.
    Where that tail covers a whole scheduler block, every block is reachable; with a
    1-token window none is. vLLM 0.33.0 and 0.34.0
    `SlidingWindowManager.reachable_block_mask` with dense retention
    (`prefix_cache_retention_interval` None, the KVCacheConfig default)."""
    if not isinstance(group, SlidingWindowGroup):
        return True
    need = cdiv(group.sliding_window - 1, group.block_size)
    per_boundary = scheduler_block_size // group.block_size
    return need >= per_boundary or index % per_boundary >= per_boundary - need


def blocks_for_one_request(
    groups: tuple[KVCacheGroupSpec, ...], max_model_len: int, async_scheduling: bool = False
) -> int:
    """Blocks of the shared pool that one request of max_model_len tokens may hold at once,
    summed over the groups: a bound the pool must meet so that any admissible request
    fits an empty cache.

    Attention groups count every block of the sequence: a window frees blocks only
    once processed, and a whole-prompt step holds them all before any is processed.
    vLLM sizes a window or chunked-local group by `admission_cap_blocks` instead; that
    cap leaves out a step's lookahead slots, and a pool at the cap let a lone request
    with drafts preempt itself for ever (docs/HYBRID.md, "Design decisions").
    A Mamba group holds its running state and its draft scratch states, plus in align
    mode the previous state it copies from (vLLM 0.34.0 MambaSpec.max_memory_usage_bytes).
    Under async scheduling one state more: states are retired on processed tokens, and
    when the next step's state block is allocated the previous step's tokens are still
    in flight, so its state and the one it copied from are both held (vLLM 0.34.0's
    MambaSpec counts 2 + num_speculative_blocks either way: docs/HYBRID.md, "Design
    decisions").
    In mode "none" it follows the attention rule over its blocks, so a whole-prompt step
    holds a block per block_size tokens: one when block_size is max_model_len, vLLM's
    default for that mode (model_executor/models/config.py).
    """
    total = 0
    for group in groups:
        if isinstance(group, MambaGroup) and group.mamba_cache_mode == "align":
            total += 2 + int(async_scheduling) + group.num_speculative_blocks
        elif isinstance(group, MambaGroup):
            total += cdiv(max_model_len, group.block_size) + group.num_speculative_blocks
        else:
            total += cdiv(max_model_len, group.block_size)
    return total


def check_groups(
    groups: object, block_size: int, enable_prefix_caching: bool
) -> tuple[KVCacheGroupSpec, ...]:
    """The groups of a SchedulerConfig, checked against its other fields; a bad value
    raises ConfigError naming `kv_cache_groups[i].<field>`."""
    if not isinstance(groups, tuple):
        raise ConfigError("kv_cache_groups", f"must be a tuple of groups, got {shown(groups)}")
    for i, group in enumerate(groups):
        if not isinstance(group, KVCacheGroupSpec):
            raise ConfigError(
                f"kv_cache_groups[{i}]",
                f"must be one of {', '.join(c.__name__ for c in GROUP_KINDS.values())}, "
                f"got {shown(group)}",
            )
    if not groups:
        return groups
    if len(groups) == 1 and isinstance(groups[0], FullAttentionGroup):
        # The same cache spelled two ways would make two configs of one behaviour.
        raise ConfigError(
            "kv_cache_groups",
            "a lone full-attention group is the default: leave kv_cache_groups empty",
        )
    lcm = scheduler_block_size(groups)
    if block_size != lcm:
        raise ConfigError(
            "block_size",
            f"must be the scheduler block size, the least common multiple of the "
            f"kv_cache_groups' block sizes ({lcm}), got {block_size}",
        )
    for i, group in enumerate(groups):
        if isinstance(group, ChunkedLocalGroup) and group.block_size != lcm:
            # vLLM 0.34.0 ChunkedLocalAttentionManager.find_longest_cache_hit asserts it.
            raise ConfigError(
                f"kv_cache_groups[{i}].block_size",
                f"a chunked-local group's block size must be the scheduler block size "
                f"({lcm}), got {group.block_size}",
            )
        if (
            isinstance(group, MambaGroup)
            and enable_prefix_caching
            and group.mamba_cache_mode != "align"
        ):
            # vLLM 0.34.0 MambaManager.__init__: only aligned states can be hits.
            raise ConfigError(
                f"kv_cache_groups[{i}].mamba_cache_mode",
                "must be 'align' with enable_prefix_caching (only block-aligned Mamba "
                f"states can be prefix-cache hits), got {shown(group.mamba_cache_mode)}",
            )
    return groups


def group_from_json(raw: object, where: str) -> KVCacheGroupSpec:
    """A group from a trace's config; errors name `where` and the field."""
    if not isinstance(raw, Mapping):
        raise ConfigError(where, f"must be an object, got {shown(raw)}")
    kind = raw.get("kind")
    cls = GROUP_KINDS.get(kind) if isinstance(kind, str) else None
    if cls is None:
        raise ConfigError(
            f"{where}.kind", f"must be one of {tuple(GROUP_KINDS)}, got {shown(kind)}"
        )
    fields = {k: v for k, v in raw.items() if k != "kind"}
    try:
        return cls(**fields)
    except ConfigError as err:
        raise ConfigError(f"{where}.{err.field}", err.reason) from None
    except TypeError as err:  # an unknown or missing field
        raise ConfigError(where, str(err)) from None


def mamba_split_group(groups: tuple[KVCacheGroupSpec, ...]) -> MambaGroup | None:
    """The Mamba group whose block boundaries chunk ends are cut to: the first in align
    mode (vLLM 0.34.0 takes the first Mamba group's), or None."""
    return next(
        (g for g in groups if isinstance(g, MambaGroup) and g.mamba_cache_mode == "align"),
        None,
    )


def mamba_checkpoint_position(num_tokens: int, block_size: int, drop_eagle_block: bool) -> int:
    """The last Mamba block boundary a prefix hit on a request of num_tokens can reach: a
    hit leaves at least the last token to compute (its logits), so the boundary at or
    before num_tokens - 1 (0 for a one-token request). Under EAGLE's block drop
    (drop_eagle_block: an EAGLE-style drafter without prefix caching) a hit loses its last
    block, so one block before the boundary at or before num_tokens."""
    if drop_eagle_block:
        return max(0, num_tokens - num_tokens % block_size - block_size)
    return max(0, (num_tokens - 1) // block_size * block_size)


def mamba_aligned_new_tokens(
    start: int,
    num_new_tokens: int,
    prefill_end: int,
    num_tokens: int,
    block_size: int,
    max_prefill_tokens: int,
    drop_eagle_block: bool,
    junction: int = 0,
) -> int:
    """The spec's statement of the Mamba-aligned split (docs/SPEC.md, "Hybrid KV cache
    groups", Mamba): of num_new_tokens from `start`, the tokens scheduled. A chunk that
    ends before prefill_end (max(prompt tokens, tokens - 1)) ends on a multiple of the
    Mamba group's block_size, unless that leaves nothing and a block is wider than the
    step's largest prefill (max_prefill_tokens), when it keeps its end (else it would
    never advance). A prefill chunk also stops at a boundary it would run past: the next
    one when it starts mid-block (the state realigns), the request's checkpoint
    (`mamba_checkpoint_position` of its num_tokens), so that the state a later request's
    hit reaches is written, and `mamba_junction_stop` of its shared-prefix junction."""
    end = start + num_new_tokens
    if start >= prefill_end:
        return num_new_tokens
    if end < prefill_end:
        aligned = end - end % block_size
        if aligned > start or block_size <= max_prefill_tokens:
            end = aligned
    boundaries = [
        mamba_checkpoint_position(num_tokens, block_size, drop_eagle_block),
        mamba_junction_stop(start, end, junction, block_size),
    ]
    if start % block_size:
        boundaries.append(start - start % block_size + block_size)
    return min((b for b in boundaries if start < b < end), default=end) - start


def mamba_junction_stop(start: int, end: int, junction: int, block_size: int) -> int:
    """Where a prefill chunk from `start` to `end` (after the boundary cut) stops for the
    request's shared-prefix junction (RequestState.shared_prefix_boundary): when the
    junction is strictly inside the chunk, the last point at or before it a whole number
    of Mamba blocks from `start` (so the state at the prefix other requests share is
    written for the next one); else `end`, no stop. A stop at `start` itself is none."""
    if not start < junction < end:
        return end
    return start + (junction - start) // block_size * block_size


def group_block_hash(block_hash: BlockHash, group_id: int) -> BlockHash:
    """A block's hash as group `group_id` caches it: the chain hash of the request's tokens
    up to the end of that block (at the group's block size), tagged with the group. The
    pool is shared, and one group's block must never be another group's hit (vLLM keys
    its map by hash and group id to the same end)."""
    return hash_block_tokens(block_hash, [group_id])


def group_block_hashes(
    tokens: Sequence[int], groups: tuple[KVCacheGroupSpec, ...]
) -> tuple[list[BlockHash], ...]:
    """Each group's hashes of the full blocks of `tokens`, in group order."""
    return tuple(
        [group_block_hash(h, gid) for h in extend_block_hashes([], tokens, g.block_size)]
        for gid, g in enumerate(groups)
    )


def num_skipped_tokens(group: KVCacheGroupSpec, num_computed_tokens: int) -> int:
    """The leading tokens a group's layers never read again once num_computed_tokens are
    computed (docs/SPEC.md, "Hybrid KV cache groups", what each kind still reads)."""
    if isinstance(group, SlidingWindowGroup):
        return max(0, num_computed_tokens - group.sliding_window + 1)
    if isinstance(group, ChunkedLocalGroup):
        size = group.attention_chunk_size
        return num_computed_tokens // size * size
    if isinstance(group, MambaGroup):
        return max(0, num_computed_tokens - 1)
    return 0
