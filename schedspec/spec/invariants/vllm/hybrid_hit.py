"""vLLM V1's reconciled prefix-cache hit over hybrid KV cache groups (docs/SPEC.md, "Hybrid
KV cache groups", each kind's hit and the reconciled hit), restated over the hashes the
cache held through a step: the hit an admission must reach at least."""

from __future__ import annotations

from collections.abc import Sequence, Set

from schedspec.spec.arithmetic import cdiv
from schedspec.spec.block_hash import BlockHash, extend_block_hashes
from schedspec.spec.config import SchedulerConfig
from schedspec.spec.invariants.registry import Violation, invariant
from schedspec.spec.invariants.transitions import ScheduleTransition
from schedspec.spec.invariants.vllm.completeness import held_both_sides
from schedspec.spec.kv_groups import (
    ChunkedLocalGroup,
    FullAttentionGroup,
    KVCacheGroupSpec,
    MambaGroup,
    SlidingWindowGroup,
    group_block_hash,
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


def first_lookup_group(groups: Sequence[KVCacheGroupSpec]) -> int:
    """The group vLLM's coordinator looks up first: the first full-attention group, else
    the first group (it sorts full attention first, keeping config order). Every later
    lookup is bounded by the length before it, so this group's hit is the longest hit
    any one group has at that lookup."""
    return next((i for i, g in enumerate(groups) if isinstance(g, FullAttentionGroup)), 0)


def longest_single_group_hit(
    config: SchedulerConfig, tokens: Sequence[int], cached: Set[BlockHash]
) -> int:
    """The first-looked-up group's own hit on `tokens` (never the last token) over the
    cached hashes: the shared prefix an admission's lookup sees."""
    gid = first_lookup_group(config.kv_cache_groups)
    group = config.kv_cache_groups[gid]
    own = [group_block_hash(h, gid) for h in extend_block_hashes([], tokens, group.block_size)]
    return group_hit(group, own, cached, len(tokens) - 1, config.block_size)


@invariant(
    "SHARED-PREFIX-JUNCTION",
    "schedule",
    "vllm-v1",
    "With kv_cache_groups, an admission records its shared-prefix junction at its lookup: "
    "the hit the group looked up first (the first full-attention group, else the first "
    "group) has alone, where that is longer than the admission's reconciled hit, else 0 "
    "(always 0 without prefix caching). That hit is judged between its value over the "
    "blocks the cache held through the step and over those it held before or after it. A "
    "request running before the step keeps its junction, preempted or not.",
    groups="hybrid",
)
def check_shared_prefix_junction(t: ScheduleTransition) -> list[Violation]:
    out: list[Violation] = []
    for rid in t.pre.running:
        pre, post = t.pre.requests.get(rid), t.post.requests.get(rid)
        if pre is None or post is None:
            continue
        if post.shared_prefix_boundary != pre.shared_prefix_boundary:
            out.append(
                Violation(
                    "SHARED-PREFIX-JUNCTION",
                    "a running request's junction changed (only a lookup sets it)",
                    rid,
                    expected=pre.shared_prefix_boundary,
                    actual=post.shared_prefix_boundary,
                )
            )
    admitted = [r for r in t.admitted if r in t.post.requests]
    if not admitted:
        return out
    config = t.post.config
    caching = config.enable_prefix_caching
    through = held_both_sides(t.pre.kv, t.post.kv) if caching else set()
    either = {h for h in (*t.pre.kv.block_hashes, *t.post.kv.block_hashes) if h is not None}
    for rid in admitted:
        request = t.post.requests[rid]
        junction = request.shared_prefix_boundary
        hit = t.computed_before.get(rid, 0)
        tokens = request.prompt_token_ids + request.output_token_ids
        if not caching:
            low = high = 0
        else:
            low = longest_single_group_hit(config, tokens, through)
            high = longest_single_group_hit(config, tokens, either)
        if junction == 0 and low <= hit:
            continue
        if junction != 0 and hit < junction and low <= junction <= high:
            continue
        allowed = ["0"] if low <= hit else []
        if max(low, hit + 1) <= high:
            allowed.append(f"a hit in [{max(low, hit + 1)}, {high}]")
        out.append(
            Violation(
                "SHARED-PREFIX-JUNCTION",
                f"junction recorded at admission (hit {hit} tokens; the first group alone "
                f"hit between {low} and {high})",
                rid,
                expected=" or ".join(allowed),
                actual=junction,
            )
        )
    return out
