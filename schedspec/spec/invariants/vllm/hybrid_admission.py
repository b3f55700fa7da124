"""vLLM V1's admission count over hybrid KV cache groups (docs/SPEC.md, "Hybrid KV cache
groups", two-phase allocation and the admission cap): ADMISSION-STOP's rule with the
reconciled hit and the groups' sum, a window or chunked-local group counted at its
admission cap in the full-sequence gate."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from schedspec.spec.arithmetic import cdiv
from schedspec.spec.block_hash import BlockHash
from schedspec.spec.config import SchedulerConfig
from schedspec.spec.invariants.registry import Violation, invariant
from schedspec.spec.invariants.transitions import ScheduleTransition
from schedspec.spec.invariants.vllm.hybrid_hit import reconciled_hit
from schedspec.spec.invariants.vllm.policy import admission_stop, allocation_slots
from schedspec.spec.kv_groups import (
    MambaGroup,
    admission_cap_blocks,
    group_block_hashes,
    max_in_flight_tokens,
    num_skipped_tokens,
)
from schedspec.spec.state import KVState, RequestState


def hybrid_admission_blocks(
    config: SchedulerConfig,
    kv: KVState,
    own: Sequence[Sequence[BlockHash]],
    num_tokens: int,
    hit_tokens: int,
    num_new: int,
) -> int:
    """The free blocks a new request takes in vLLM's two checks, over attention groups:
    its whole known sequence (each window or chunked-local group at most at its admission
    cap) and this step's slots, whichever sum is more. In each group a request with a hit
    of `hit_tokens` needs no block for its hit nor for its skipped prefix (nulls), and
    takes the hit blocks past that prefix out of the free queue where nobody holds them
    (`own`: each group's hashes of the request's blocks)."""
    in_flight = max_in_flight_tokens(config.max_num_batched_tokens, config.async_scheduling)
    full = min(num_tokens, config.max_model_len)
    slots = allocation_slots(config, hit_tokens + num_new)
    first = {block_hash: ids[0] for block_hash, ids in kv.prefix_cache}
    gate = step = 0
    for gid, group in enumerate(config.kv_cache_groups):
        size = group.block_size
        skipped = num_skipped_tokens(group, hit_tokens) // size
        held = hit_tokens // size
        kept = (first.get(h) for h in own[gid][skipped:held])
        evictable = sum(1 for b in kept if b is not None and kv.ref_counts[b] == 0)
        cap = admission_cap_blocks(group, in_flight, config.max_model_len)
        whole = cdiv(full, size) if cap is None else min(cdiv(full, size), cap)
        gate += max(whole - max(skipped, held), 0) + evictable
        step += max(cdiv(slots, size) - max(skipped, held), 0) + evictable
    return max(gate, step)


@invariant(
    "HYBRID-ADMISSION-STOP",
    "schedule",
    "vllm-v1",
    "With kv_cache_groups (attention kinds), admission stops only for ADMISSION-STOP's "
    "reasons, the queue head's blocks counted over every group from its reconciled hit, "
    "with a window or chunked-local group at its admission cap in the full-sequence gate.",
    groups="hybrid",
)
def check_hybrid_admission_stop(t: ScheduleTransition) -> list[Violation]:
    config = t.post.config
    if any(isinstance(g, MambaGroup) for g in config.kv_cache_groups):
        # Mamba's aligned split may cut an admission to nothing (MAMBA-SPLIT's rule),
        # and its count is its own; not restated here.
        return []
    kv = t.post.kv
    cached = {block_hash for block_hash, _ in kv.prefix_cache}

    def lookup(head: RequestState) -> tuple[int, Callable[[int], int]]:
        tokens = head.prompt_token_ids + head.output_token_ids
        own = group_block_hashes(tokens, config.kv_cache_groups)
        hit = reconciled_hit(config, tokens, cached) if config.enable_prefix_caching else 0
        return hit, lambda num_new: hybrid_admission_blocks(
            config, kv, own, head.num_tokens, hit, num_new
        )

    return admission_stop("HYBRID-ADMISSION-STOP", t, lookup)
