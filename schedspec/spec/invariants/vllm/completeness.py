"""The other half of decisions the policy invariants judge from one side only.

CACHE-CONTENT and CACHE-CONFIRMED judge what is registered in the prefix cache;
CACHE-COMPLETE and CACHE-COMPLETE-UPDATE judge what must be (and freed.py what a freed
block must keep); CACHE-HIT-LONGEST judges that a prefix hit is as long as the cache
allowed. (The converse of ADMISSION-STOP, an
admission that happened, is ADMISSION-FIT in allocation.py.) All of them are vLLM V1's
decisions (an engine may admit more eagerly, or cache less, and still be safe).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from schedspec.spec.block_hash import BlockHash
from schedspec.spec.invariants.registry import Violation, invariant, or_absent
from schedspec.spec.invariants.safety.connector import is_load
from schedspec.spec.invariants.safety.update import expected_kept
from schedspec.spec.invariants.transitions import (
    ChainHashes,
    ScheduleTransition,
    UpdateTransition,
)
from schedspec.spec.request import RequestStatus
from schedspec.spec.state import KVState, RequestState


def _admissions_in_order(t: ScheduleTransition) -> list[str]:
    """The step's admissions, in scheduling order, that are still live after it."""
    admitted = t.admitted_ids
    return [r for r in t.output.num_scheduled_tokens if r in admitted and r in t.post.requests]


def missing_registrations(
    invariant_id: str,
    kv: KVState,
    request: RequestState,
    own: Sequence[BlockHash],
    num_tokens: int,
    block_size: int,
) -> list[Violation]:
    """A violation for each full block among the request's first num_tokens tokens that
    does not carry its own content's hash."""
    out: list[Violation] = []
    hashes = kv.block_hashes
    full = min(num_tokens // block_size, len(request.block_ids), len(own))
    # The common case, every full block registered, in one comparison.
    if kv.hashes_carried(request.block_ids[:full]) == list(own[:full]):
        return out
    for index in range(full):
        block = request.block_ids[index]
        if 0 <= block < len(hashes) and hashes[block] != own[index]:
            out.append(
                Violation(
                    invariant_id,
                    f"full block at index {index} not registered in the prefix cache",
                    request.request_id,
                    block,
                    expected=own[index],
                    actual=or_absent(hashes[block], "no hash"),
                )
            )
    return out


@invariant(
    "CACHE-COMPLETE",
    "schedule",
    "vllm-v1",
    "With prefix caching on, after schedule() every request scheduled in the step and still "
    "running holds its own content's hash on each full block among its first "
    "min(num_computed_tokens, num_tokens) tokens (vLLM's cache_blocks in allocate_slots): no "
    "registration is lost.",
    groups="single",
)
def check_cache_complete(t: ScheduleTransition) -> list[Violation]:
    config = t.post.config
    if not config.enable_prefix_caching:
        return []
    out: list[Violation] = []
    for rid in t.output.num_scheduled_tokens:
        post = t.post.requests.get(rid)
        if post is None or post.status is not RequestStatus.RUNNING:
            continue
        registered = min(post.num_computed_tokens, post.num_tokens)
        own = t.hashes.of(post)
        kv = t.post.kv
        out += missing_registrations("CACHE-COMPLETE", kv, post, own, registered, config.block_size)
    return out


@invariant(
    "CACHE-COMPLETE-UPDATE",
    "update",
    "vllm-v1",
    "With prefix caching on, after update_from_output() every request of the landed step "
    "that was and stays running (its output not stale) holds its own content's hash on each "
    "full block among its first min(confirmed computed tokens, num_tokens) tokens: blocks "
    "filled by accepted drafts or by landed async output are registered as the output lands "
    "(vLLM's cache_blocks in update_from_output). A running request that finishes on the "
    "landing leaves them registered on the blocks it freed (its kept tokens but the last "
    "have KV), so that the next request with that prefix hits them.",
    groups="single",
)
def check_cache_complete_update(t: UpdateTransition) -> list[Violation]:
    config = t.post.config
    if not config.enable_prefix_caching or t.hashes is None:
        return []
    out: list[Violation] = []
    for rid in t.output.num_scheduled_tokens:
        pre = t.pre.requests.get(rid)
        post = t.post.requests.get(rid)
        if pre is None or not t.scheduled_for(pre) or t.is_stale(pre):
            continue
        if pre.status is not RequestStatus.RUNNING:
            continue
        if post is None:
            out += _finished_on_landing(t, pre, t.hashes)
            continue
        if post.status is not RequestStatus.RUNNING:
            continue
        landed = min(post.num_confirmed_computed_tokens, post.num_tokens)
        own = t.hashes.of(post)
        kv = t.post.kv
        out += missing_registrations(
            "CACHE-COMPLETE-UPDATE", kv, post, own, landed, config.block_size
        )
    return out


def _finished_on_landing(
    t: UpdateTransition, pre: RequestState, hashes: ChainHashes
) -> list[Violation]:
    """A request that sampled and finished in this update: its content is the old tokens
    plus the kept ones, of which all but the last have KV (ROLLBACK's count), and the
    blocks it held keep those full blocks' hashes after the free (freeing keeps them)."""
    sampled = tuple(t.model_output.sampled_token_ids.get(pre.request_id, ()))
    if not sampled or pre.abort_pending:
        return []  # aborted, or no output: nothing landed to register
    config = t.post.config
    kept = sampled[: expected_kept(pre, sampled, config.max_model_len)]
    finished = replace(pre, output_token_ids=pre.output_token_ids + kept)
    return missing_registrations(
        "CACHE-COMPLETE-UPDATE",
        t.post.kv,
        finished,
        hashes.of(finished),
        finished.num_tokens - 1,  # every token but the last kept one has KV
        config.block_size,
    )


def held_both_sides(before: KVState, after: KVState) -> set[BlockHash]:
    """Hashes some block carries both before and after a step. A schedule() frees
    nothing once it admits, so such a block was never evicted and re-registered by a
    later admission: its hash was in the cache at every admission's lookup."""
    return {
        h
        for h, h_after in zip(before.block_hashes, after.block_hashes, strict=False)
        if h is not None and h == h_after
    }


@invariant(
    "CACHE-HIT-LONGEST",
    "schedule",
    "vllm-v1",
    "With prefix caching on, an admission's prefix hit is at least the longest run of its "
    "own leading block hashes (never the last token's block) that the cache held through "
    "the step: a lookup never stops short of a hit it could have had.",
    groups="single",
)
def check_cache_hit_longest(t: ScheduleTransition) -> list[Violation]:
    config = t.post.config
    if not config.enable_prefix_caching:
        return []
    order = _admissions_in_order(t)
    if not order:
        return []
    bs = config.block_size
    cached = held_both_sides(t.pre.kv, t.post.kv)
    out: list[Violation] = []
    for rid in order:
        if is_load(t.pre, t.post, rid):
            continue  # a promoted load starts from what it loaded, with no lookup
        request = t.post.requests[rid]
        own = t.hashes.of(request)[: (request.num_tokens - 1) // bs]
        reachable = next((i for i, h in enumerate(own) if h not in cached), len(own))
        hit = t.computed_before.get(rid, 0) // bs
        if hit < reachable:
            out.append(
                Violation(
                    "CACHE-HIT-LONGEST",
                    "prefix hit shorter than the cache allowed (blocks)",
                    rid,
                    None,
                    expected=reachable,
                    actual=hit,
                )
            )
    return out
