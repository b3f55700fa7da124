"""vLLM V1's Mamba-aligned split (docs/SPEC.md, "Hybrid KV cache groups", Mamba): where a
prefill chunk of a config with a Mamba group in align mode may end (on a block boundary,
and never past the checkpoint a later hit reaches nor past the shared-prefix junction),
and the cut the budget invariants apply before they compare."""

from __future__ import annotations

from schedspec.spec.config import SchedulerConfig
from schedspec.spec.invariants.registry import Violation, invariant
from schedspec.spec.invariants.transitions import ScheduleTransition
from schedspec.spec.kv_groups import (
    NULL_BLOCK_ID,
    MambaGroup,
    mamba_aligned_new_tokens,
    mamba_checkpoint_position,
    mamba_junction_stop,
    mamba_split_group,
)
from schedspec.spec.state import RequestState


def max_prefill_tokens(config: SchedulerConfig) -> int:
    """The most a prefill chunk may take in one step: the budget, or the long-prefill
    threshold when set (the split's test for a block wider than any step)."""
    budget = config.max_num_batched_tokens
    threshold = config.long_prefill_token_threshold
    return min(budget, threshold) if threshold > 0 else budget


def prefill_end(request: RequestState) -> int:
    """Where the split stops cutting: the prompt's end, or for a resumed request
    replaying its outputs, its last token."""
    return max(len(request.prompt_token_ids), request.num_tokens - 1)


def drops_eagle_block(config: SchedulerConfig) -> bool:
    """Does vLLM drop a hit's last block for EAGLE (Scheduler.use_eagle_block_drop)? With
    an EAGLE-style drafter (lookahead slots) and no prefix caching; with prefix caching it
    hashes each block with the token after it instead (docs/FINDINGS.md G1), and the
    checkpoint is the plain one."""
    return config.lookahead_tokens > 0 and not config.enable_prefix_caching


def junction_in_step(t: ScheduleTransition, request_id: str) -> int:
    """The shared-prefix junction a step's split reads for a request: the one after the
    step (an admission's lookup records it before the split; a running request keeps
    its own), or before it for a request gone since."""
    request = t.post.requests.get(request_id) or t.pre.requests.get(request_id)
    return 0 if request is None else request.shared_prefix_boundary


def mamba_cut(
    config: SchedulerConfig, request: RequestState, start: int, num_new: int, junction: int
) -> int:
    """num_new tokens from `start` after the Mamba-aligned split (unchanged without a
    Mamba group in align mode), with the request's shared-prefix junction."""
    group = mamba_split_group(config.kv_cache_groups)
    if group is None:
        return num_new
    return mamba_aligned_new_tokens(
        start,
        num_new,
        prefill_end(request),
        request.num_tokens,
        group.block_size,
        max_prefill_tokens(config),
        drops_eagle_block(config),
        junction,
    )


@invariant(
    "MAMBA-SPLIT",
    "schedule",
    "vllm-v1",
    "With a Mamba group in align mode, a scheduled prefill chunk that stops before the "
    "prefill's end (max(prompt tokens, tokens - 1)) ends on a multiple of that group's own "
    "block size, unless no such end is past its start and a block is wider than the step's "
    "largest prefill (the budget, or the long-prefill threshold when set): then it advances "
    "by part of a block rather than stall. And no prefill chunk runs past the request's "
    "checkpoint, the last such multiple at or before its last token (where a later hit on "
    "the same prompt resumes; with an EAGLE-style drafter and no prefix caching, one "
    "block before the last multiple at or before its end), nor, when it starts mid-block, "
    "past the next multiple; nor, when the request's shared-prefix junction is strictly "
    "inside it, past the last point at or before the junction a whole number of blocks "
    "from its start (where that is past its start).",
    groups="hybrid",
)
def check_mamba_split(t: ScheduleTransition) -> list[Violation]:
    config = t.pre.config
    group = mamba_split_group(config.kv_cache_groups)
    if group is None:
        return []
    size = group.block_size
    widest = max_prefill_tokens(config)
    out: list[Violation] = []
    for rid, start in t.computed_before.items():
        request = t.pre.requests.get(rid)
        if request is None or start >= prefill_end(request):
            continue
        end = start + t.output.num_scheduled_tokens[rid]
        checkpoint = mamba_checkpoint_position(request.num_tokens, size, drops_eagle_block(config))
        if start < checkpoint < end:
            out.append(
                Violation(
                    "MAMBA-SPLIT",
                    f"prefill chunk from {start} runs past the checkpoint at {checkpoint} "
                    f"(block size {size}, {request.num_tokens} tokens): the state a hit "
                    "reaches there is never written",
                    rid,
                    expected=checkpoint,
                    actual=end,
                )
            )
            continue
        junction = junction_in_step(t, rid)
        stop = mamba_junction_stop(start, end, junction, size)
        if start < stop < end:
            out.append(
                Violation(
                    "MAMBA-SPLIT",
                    f"prefill chunk from {start} runs past the shared-prefix junction at "
                    f"{junction}, floored to {stop} (block size {size}): the state at the "
                    "prefix other requests share is never written",
                    rid,
                    expected=stop,
                    actual=end,
                )
            )
            continue
        boundary = start - start % size + size
        if start % size and boundary < end:
            out.append(
                Violation(
                    "MAMBA-SPLIT",
                    f"prefill chunk from {start}, mid-block, runs past the next Mamba block "
                    f"boundary at {boundary} (block size {size})",
                    rid,
                    expected=boundary,
                    actual=end,
                )
            )
            continue
        if end >= prefill_end(request) or end % size == 0:
            continue
        if end - end % size <= start and size > widest:
            continue  # a block wider than any step: part of one, not a stall
        out.append(
            Violation(
                "MAMBA-SPLIT",
                f"prefill chunk from {start} ends off a Mamba block boundary (block size "
                f"{size}, prefill ends at {prefill_end(request)})",
                rid,
                expected=end - end % size,
                actual=end,
            )
        )
    return out


@invariant(
    "MAMBA-HIT-WRITTEN",
    "schedule",
    "vllm-v1",
    "With prefix caching, an admission's prefix hit never ends on a state of a Mamba group "
    "in align mode that was registered in the cache during the step itself: that step "
    "writes the state, so the admission waits for a later step.",
    groups="hybrid",
)
def check_mamba_hit_written(t: ScheduleTransition) -> list[Violation]:
    config = t.post.config
    if not config.enable_prefix_caching:
        return []
    aligned = [
        (gid, g.block_size)
        for gid, g in enumerate(config.kv_cache_groups)
        if isinstance(g, MambaGroup) and g.mamba_cache_mode == "align"
    ]
    out: list[Violation] = []
    before, after = t.pre.kv.block_hashes, t.post.kv.block_hashes
    for rid in t.admitted:
        request = t.post.requests.get(rid)
        hit = t.computed_before.get(rid, 0)
        if request is None or hit == 0:
            continue
        for gid, size in aligned:
            table = request.group_block_ids[gid]
            index = hit // size - 1
            block = table[index] if index < len(table) else NULL_BLOCK_ID
            if not 0 <= block < len(after):
                continue  # no state there: HYBRID-HIT's to judge
            if after[block] is not None and before[block] != after[block]:
                out.append(
                    Violation(
                        "MAMBA-HIT-WRITTEN",
                        f"hit of {hit} tokens ends on the Mamba state in block {block} of "
                        f"group {gid}, registered in this step (not written yet)",
                        rid,
                        block,
                        expected="a state cached before the step",
                        actual=block,
                    )
                )
    return out
