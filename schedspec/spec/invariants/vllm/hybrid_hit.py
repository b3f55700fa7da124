"""vLLM V1's reconciled prefix-cache hit over hybrid KV cache groups (docs/SPEC.md, "Hybrid
KV cache groups", each kind's hit and the reconciled hit), restated over the hashes the
cache held through a step: the hit an admission must reach at least."""

from __future__ import annotations

from collections.abc import Sequence, Set

from schedspec.spec.arithmetic import cdiv
from schedspec.spec.block_hash import BlockHash
from schedspec.spec.config import SchedulerConfig
from schedspec.spec.invariants.registry import Violation, invariant
from schedspec.spec.invariants.transitions import ScheduleTransition
from schedspec.spec.invariants.vllm.completeness import held_both_sides
from schedspec.spec.kv_groups import (
    ChunkedLocalGroup,
    KVCacheGroupSpec,
    MambaGroup,
    SlidingWindowGroup,
    group_block_hashes,
)


def _cached_prefix(own: Sequence[BlockHash], cached: Set[BlockHash], first: int, last: int) -> int:
    """How many of blocks first..last-1 are cached in a run from `first`."""
    count = 0
    for index in range(first, last):
        if own[index] not in cached:
            break
        count += 1
    return count


def group_hit(
    group: KVCacheGroupSpec,
    own: Sequence[BlockHash],
    cached: Set[BlockHash],
    limit: int,
    alignment: int,
) -> int:
    """The tokens one group would hit of at most `limit`, ending on a multiple of
    `alignment` (the scheduler block size): full attention the cached run from the first
    block; a window the rightmost run of its blocks long enough for it (else the cached run
    from the first block); a chunk its chunk's cached run after the chunks before it;
    Mamba the rightmost cached state."""
    size = group.block_size
    top = min(limit // size, len(own))

    def aligned(blocks: int) -> int:
        return blocks * size // alignment * alignment

    if isinstance(group, ChunkedLocalGroup):
        first = limit // group.attention_chunk_size * group.attention_chunk_size // size
        return (first + _cached_prefix(own, cached, first, top)) * size
    if isinstance(group, MambaGroup):
        for end in range(top, 0, -1):
            if end * size % alignment == 0 and own[end - 1] in cached:
                return end * size
        return 0
    if isinstance(group, SlidingWindowGroup):
        # A hit ends on a cached block even where the window reads none before it (a
        # 1-token window): with nothing cached the window group hits nothing.
        needed = max(1, cdiv(group.sliding_window - 1, size))
        for end in range(top, needed - 1, -1):
            if end * size % alignment == 0 and all(
                own[i] in cached for i in range(end - needed, end)
            ):
                return end * size
    return aligned(_cached_prefix(own, cached, 0, top))


def reconciled_hit(config: SchedulerConfig, tokens: Sequence[int], cached: Set[BlockHash]) -> int:
    """The longest hit no group refuses (never the last token): each group in turn cuts
    the length to its own hit at it, until a round cuts nothing. Each group's hit only
    grows with the length and with the cache, so this is the greatest such length, in any
    order, and no shorter for a larger cache."""
    groups = config.kv_cache_groups
    own = group_block_hashes(tokens, groups)
    length = len(tokens) - 1
    while True:
        cut = length
        for gid, group in enumerate(groups):
            cut = group_hit(group, own[gid], cached, cut, config.block_size)
        if cut >= length:
            return length
        length = cut


@invariant(
    "HYBRID-HIT-LONGEST",
    "schedule",
    "vllm-v1",
    "With kv_cache_groups and prefix caching, an admission's prefix hit is at least the "
    "reconciled hit over the blocks the cache held through the step: the longest length, "
    "ending on a scheduler-block boundary and never covering the last token, that every "
    "group's own hit at that length reaches (each kind's rule in docs/SPEC.md).",
    groups="hybrid",
)
def check_hybrid_hit_longest(t: ScheduleTransition) -> list[Violation]:
    config = t.post.config
    if not config.enable_prefix_caching:
        return []
    admitted = [r for r in t.admitted if r in t.post.requests]
    if not admitted:
        return []
    cached = held_both_sides(t.pre.kv, t.post.kv)
    out: list[Violation] = []
    for rid in admitted:
        request = t.post.requests[rid]
        tokens = request.prompt_token_ids + request.output_token_ids
        reachable = reconciled_hit(config, tokens, cached)
        hit = t.computed_before.get(rid, 0)
        if hit < reachable:
            out.append(
                Violation(
                    "HYBRID-HIT-LONGEST",
                    "prefix hit shorter than every group's cache allowed (tokens)",
                    rid,
                    expected=reachable,
                    actual=hit,
                )
            )
    return out
