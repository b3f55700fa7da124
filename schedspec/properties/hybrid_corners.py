"""The hybrid KV cache corners a schedule() reached (corners.py names and describes them;
docs/SPEC.md, "Hybrid KV cache groups")."""

from __future__ import annotations

from collections.abc import MutableMapping

from schedspec.spec.invariants import ScheduleTransition
from schedspec.spec.invariants.vllm.mamba import (
    drops_eagle_block,
    max_prefill_tokens,
    prefill_end,
)
from schedspec.spec.kv_groups import (
    NULL_BLOCK_ID,
    ChunkedLocalGroup,
    FullAttentionGroup,
    SlidingWindowGroup,
    group_block_hashes,
    mamba_checkpoint_position,
    mamba_split_group,
)


def _bump(counts: MutableMapping[str, int], name: str) -> None:
    counts[name] = counts.get(name, 0) + 1


def count_hybrid(counts: MutableMapping[str, int], t: ScheduleTransition) -> None:
    if _window_freed(t):
        _bump(counts, "window-frees-a-block")
    if t.post.config.enable_prefix_caching and _hit_cut_by_lagging_group(t):
        _bump(counts, "hit-cut-by-lagging-group")
    if _mamba_split(t):
        _bump(counts, "mamba-aligned-split")
    if _eagle_checkpoint_backoff(t):
        _bump(counts, "mamba-eagle-checkpoint-backoff")
    if _hybrid_victim(t):
        _bump(counts, "hybrid-preemption")


def _window_freed(t: ScheduleTransition) -> bool:
    """Did a window or chunk group put the null block where a scheduled request held one?"""
    groups = t.post.config.kv_cache_groups
    for rid in t.output.num_scheduled_tokens:
        pre, post = t.pre.requests.get(rid), t.post.requests.get(rid)
        if pre is None or post is None or not pre.group_block_ids:
            continue
        for gid, group in enumerate(groups):
            if not isinstance(group, SlidingWindowGroup | ChunkedLocalGroup):
                continue
            before, after = pre.group_block_ids[gid], post.group_block_ids[gid]
            if any(
                b != NULL_BLOCK_ID and a == NULL_BLOCK_ID
                for b, a in zip(before, after, strict=False)
            ):
                return True
    return False


def _hit_cut_by_lagging_group(t: ScheduleTransition) -> bool:
    """Did an admission hit less than full attention alone had cached: the full group's
    next scheduler block after the hit cached before the step, and not the last token?"""
    config = t.post.config
    groups = config.kv_cache_groups
    full = next((i for i, g in enumerate(groups) if isinstance(g, FullAttentionGroup)), None)
    if full is None:
        return False
    cached = {h for h, _ in t.pre.kv.prefix_cache}
    size = groups[full].block_size
    for rid in t.admitted:
        request = t.post.requests.get(rid)
        if request is None:
            continue
        hit = t.computed_before.get(rid, 0)
        end = hit + config.block_size
        if end > request.num_tokens - 1:
            continue
        tokens = request.prompt_token_ids + request.output_token_ids
        own = group_block_hashes(tokens[:end], groups)[full]
        if all(h in cached for h in own[hit // size : end // size]):
            return True
    return False


def _budget_left(t: ScheduleTransition, num: int) -> bool:
    """Did a chunk of num tokens stop with budget left in the step and under any
    long-prefill cap (so that only the split can have stopped it)?"""
    config = t.post.config
    return (
        t.output.total_num_scheduled_tokens < config.max_num_batched_tokens
        and num < max_prefill_tokens(config)
    )


def _mamba_split(t: ScheduleTransition) -> bool:
    """Did a chunk of a request stop before its prefill's end with budget left and under
    any long-prefill cap (so the Mamba-aligned split is what stopped it: a boundary cut,
    the checkpoint stop or the junction stop)?"""
    if mamba_split_group(t.post.config.kv_cache_groups) is None:
        return False
    for rid, start in t.computed_before.items():
        request = t.pre.requests.get(rid)
        num = t.output.num_scheduled_tokens[rid]
        if request is None or not _budget_left(t, num):
            continue
        if start < start + num < prefill_end(request):
            return True
    return False


def _eagle_checkpoint_backoff(t: ScheduleTransition) -> bool:
    """Under EAGLE's block drop, did the backed-off Mamba checkpoint decide a prefill chunk
    that starts before the plain one (the last boundary before the last token): did it
    stop there with budget left, or run through the plain checkpoint? Either differs from
    the cut without the back-off (vLLM #50630 and #43559's shape). A chunk from mid-block
    that stops there stops at its next boundary anyway: not counted."""
    config = t.post.config
    group = mamba_split_group(config.kv_cache_groups)
    if group is None or not drops_eagle_block(config):
        return False
    for rid, start in t.computed_before.items():
        request = t.pre.requests.get(rid)
        if request is None or start >= prefill_end(request):
            continue
        plain = mamba_checkpoint_position(request.num_tokens, group.block_size, False)
        backed = mamba_checkpoint_position(request.num_tokens, group.block_size, True)
        num = t.output.num_scheduled_tokens[rid]
        end = start + num
        if backed == plain or start >= plain:
            continue
        if end > plain:
            return True
        if start % group.block_size == 0 and start < backed == end and _budget_left(t, num):
            return True
    return False


def _hybrid_victim(t: ScheduleTransition) -> bool:
    for rid in t.output.preempted_req_ids:
        request = t.pre.requests.get(rid)
        if (
            request is not None
            and sum(
                1 for table in request.group_block_ids if any(b != NULL_BLOCK_ID for b in table)
            )
            >= 2
        ):
            return True
    return False
