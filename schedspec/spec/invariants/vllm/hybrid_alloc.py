"""ALLOC-EXACT over hybrid KV cache groups (docs/SPEC.md, "Hybrid KV cache groups",
two-phase allocation and Mamba): how far each group's table grows in a step, and how many
blocks it gains, per vLLM 0.33.0 and 0.34.0's get_num_blocks_to_allocate and
allocate_new_blocks of each manager."""

from __future__ import annotations

from schedspec.spec.arithmetic import cdiv
from schedspec.spec.config import SchedulerConfig
from schedspec.spec.invariants.registry import Violation, invariant
from schedspec.spec.invariants.transitions import ScheduleTransition
from schedspec.spec.invariants.vllm.policy import allocation_slots
from schedspec.spec.kv_groups import (
    NULL_BLOCK_ID,
    FullAttentionGroup,
    KVCacheGroupSpec,
    MambaGroup,
    num_skipped_tokens,
)


def group_table_length(
    config: SchedulerConfig, group: KVCacheGroupSpec, held: int, computed: int, num_new: int
) -> int:
    """A group's table length after allocate_slots for num_new tokens from `computed` (the
    hit, for an admission), holding `held` entries before: an attention group reaches the
    slots up to the lookahead (capped at max_model_len); a Mamba group in mode "none" the
    same plus its draft scratch states; one in align mode the block of the state after the
    scheduled tokens (no lookahead: no drafter has Mamba layers) plus the scratch states.
    Never shorter than it was (rejected drafts leave it longer)."""
    size = group.block_size
    main = computed + num_new
    slots = allocation_slots(config, main)
    if not isinstance(group, MambaGroup):
        return max(held, cdiv(slots, size))
    if group.mamba_cache_mode == "none":
        return max(held, cdiv(slots, size) + group.num_speculative_blocks)
    return max(held, cdiv(main, size) + group.num_speculative_blocks)


def group_new_blocks(
    group: KVCacheGroupSpec, held: int, length: int, admitted: bool, hit: int
) -> int:
    """The blocks a group's table gains in the step (non-null entries it did not hold):
    an attention group (and Mamba in mode "none") one per entry past what it held, and an
    admission none for its skipped prefix (nulls); Mamba in align mode one state block
    when the table grows (the scratch states move behind it), and an admission its hit's
    state block and its scratch states too."""
    if isinstance(group, MambaGroup) and group.mamba_cache_mode == "align":
        if not admitted:
            return int(length > held)
        return int(hit > 0) + 1 + group.num_speculative_blocks
    if not admitted:
        return length - held
    return length - num_skipped_tokens(group, hit) // group.block_size


@invariant(
    "HYBRID-ALLOC-EXACT",
    "schedule",
    "vllm-v1",
    "With kv_cache_groups, schedule() changes block tables only as vLLM's allocate_slots "
    "does, group by group: a scheduled request's table keeps each entry it held (a window, "
    "chunked-local or Mamba group may put the null block there; full attention keeps it), "
    "grows to exactly its group's length (attention: the computed, scheduled and lookahead "
    "slots, capped at max_model_len; Mamba: its state block and draft scratch states) and "
    "gains exactly its group's count of blocks (an admission none for its skipped prefix; "
    "Mamba in align mode one state block a step); a request neither scheduled nor "
    "preempted keeps every table as it was.",
    groups="hybrid",
)
def check_hybrid_alloc_exact(t: ScheduleTransition) -> list[Violation]:
    config = t.pre.config
    groups = config.kv_cache_groups
    scheduled = t.output.num_scheduled_tokens
    out: list[Violation] = []
    for rid, post in t.post.requests.items():
        pre = t.pre.requests.get(rid)
        if pre is None or rid in t.output.preempted_req_ids:
            continue
        if rid not in scheduled:
            if post.group_block_ids != pre.group_block_ids:
                out.append(
                    Violation(
                        "HYBRID-ALLOC-EXACT",
                        "tables changed without a step",
                        rid,
                        expected=pre.group_block_ids,
                        actual=post.group_block_ids,
                    )
                )
            continue
        if rid not in t.computed_before or len(post.group_block_ids) != len(groups):
            continue  # OUTPUT and HYBRID-TABLES report those
        admitted = rid in t.admitted_ids
        computed = t.computed_before[rid]
        for gid, group in enumerate(groups):
            before = () if admitted or not pre.group_block_ids else pre.group_block_ids[gid]
            after = post.group_block_ids[gid]
            out.extend(_check_group(rid, gid, group, before, after))
            length = group_table_length(config, group, len(before), computed, scheduled[rid])
            if len(after) != length:
                out.append(
                    Violation(
                        "HYBRID-ALLOC-EXACT",
                        f"group {gid}: table after {scheduled[rid]} tokens from {computed} "
                        f"computed (held {len(before)} entries)",
                        rid,
                        expected=length,
                        actual=len(after),
                    )
                )
                continue
            gained = gained_blocks(group, before, after)
            count = group_new_blocks(group, len(before), length, admitted, computed)
            if gained != count:
                out.append(
                    Violation(
                        "HYBRID-ALLOC-EXACT",
                        f"group {gid}: blocks gained after {scheduled[rid]} tokens from "
                        f"{computed} computed ({'admitted' if admitted else 'running'})",
                        rid,
                        expected=count,
                        actual=gained,
                    )
                )
    return out


def gained_blocks(group: KVCacheGroupSpec, before: tuple[int, ...], after: tuple[int, ...]) -> int:
    """The non-null entries of `after` that are not held ones: less those kept in place
    and, for Mamba in align mode, the draft scratch states moved behind the new state
    block. By position, not by id: a block a window freed in the step may come back as
    one of its new blocks."""
    kept = sum(
        1 for i, b in enumerate(before) if b != NULL_BLOCK_ID and i < len(after) and after[i] == b
    )
    moved = 0
    if isinstance(group, MambaGroup) and group.mamba_cache_mode == "align" and before:
        scratch = before[len(before) - group.num_speculative_blocks :]
        grown = after[len(before) :]
        moved = sum(1 for b in scratch if b != NULL_BLOCK_ID and b in grown)
    return sum(1 for b in after if b != NULL_BLOCK_ID) - kept - moved


def _check_group(
    rid: str,
    gid: int,
    group: KVCacheGroupSpec,
    before: tuple[int, ...],
    after: tuple[int, ...],
) -> list[Violation]:
    """Each entry held before is kept, or (but for full attention) nulled."""
    may_null = not isinstance(group, FullAttentionGroup)
    for index, block in enumerate(before):
        now = after[index] if index < len(after) else None
        if now == block or (may_null and now == NULL_BLOCK_ID):
            continue
        return [
            Violation(
                "HYBRID-ALLOC-EXACT",
                f"group {gid}, index {index}: a held entry replaced",
                rid,
                block,
                expected=block,
                actual=now,
            )
        ]
    return []
