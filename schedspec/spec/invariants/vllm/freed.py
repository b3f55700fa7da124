"""What a freed block keeps registered in the prefix cache: a victim's, an aborted
request's, and any block across a landing.

vLLM frees a block with its hash (`BlockPool.free_blocks` keeps `block_hash`, and puts a
cached block at the back of the free queue); only reuse, which takes the queue from the
front, evicts it. So the registrations a request's blocks carried survive it, those of
KV a step still in flight is writing included (under async scheduling: that step runs,
and steps run in order). CACHE-CONTENT and CACHE-COMPUTED bound registrations from
above; these say what must stay. (What a request that finishes on a landing must have
registered is CACHE-COMPLETE-UPDATE's.) vLLM V1's decisions: an engine may cache less
and still be safe.
"""

from __future__ import annotations

from collections.abc import Callable

from schedspec.spec.invariants.registry import Violation, invariant
from schedspec.spec.invariants.transitions import (
    AbortTransition,
    ScheduleTransition,
    UpdateTransition,
)
from schedspec.spec.request import RequestStatus
from schedspec.spec.state import RequestState, State


def lost_registrations(
    invariant_id: str,
    pre: State,
    post: State,
    request: RequestState,
    reused: Callable[[int], bool],
) -> list[Violation]:
    """A violation for each block of the request's table (before the call) that carried a
    hash then and carries another or none after it, unless reused(index) says the call
    took that block for a new allocation (which evicts its hash)."""
    pre_hashes = pre.kv.block_hashes
    post_hashes = post.kv.block_hashes
    out: list[Violation] = []
    for index, block in enumerate(request.block_ids):
        if not 0 <= block < len(pre_hashes) or pre_hashes[block] is None:
            continue  # out of range (CONSERVATION), or nothing registered to keep
        if post_hashes[block] == pre_hashes[block] or reused(index):
            continue
        out.append(
            Violation(
                invariant_id,
                f"block at index {index} lost its registration as it was freed",
                request.request_id,
                block,
                pre_hashes[block],
                post_hashes[block],
            )
        )
    return out


@invariant(
    "CACHE-VICTIM-KEPT",
    "schedule",
    "vllm-v1",
    "With prefix caching on, a request preempted in the step keeps every registration its "
    "blocks carried before the step (tokens computed, or in flight in an earlier step that "
    "still runs and writes them): each such block carries its hash after the step, unless "
    "the step reused it for a new allocation, which the free queue reaches only after "
    "every block ahead of it (vLLM frees a block with its hash, cached blocks to the back "
    "of the queue, and only reuse from the front evicts a hash).",
)
def check_cache_victim_kept(t: ScheduleTransition) -> list[Violation]:
    if not t.post.config.enable_prefix_caching or not t.output.preempted_req_ids:
        return []
    out: list[Violation] = []
    for rid in t.output.preempted_req_ids:
        victim = t.pre.requests.get(rid)
        if victim is None or victim.status is not RequestStatus.RUNNING:
            continue  # PREEMPT-RESET reports it

        def reused(index: int, victim: RequestState = victim) -> bool:
            return _reused(t, victim, index)

        out += lost_registrations("CACHE-VICTIM-KEPT", t.pre, t.post, victim, reused)
    return out


def _reused(t: ScheduleTransition, victim: RequestState, index: int) -> bool:
    """Can the step have reused the victim's block at index for a new allocation (which
    evicts its hash)? The victim freed its table tail first, hashless blocks to the front
    of the free queue and cached ones to the back, and allocations take from the front:
    so the block was reached only once every block free before the step and every block
    the victim freed before it (those past index) was taken, and then a request took it
    and holds it. Under priority a second victim may have taken blocks after the first
    freed them, been unscheduled, and freed them again, hashless and to the front: the
    order then tells nothing, and a free hashless block may be such a one."""
    block = victim.block_ids[index]
    post = t.post
    several_priority_victims = (
        post.config.policy == "priority" and len(t.output.preempted_req_ids) > 1
    )
    holders = [r.request_id for r in post.requests.values() if block in r.block_ids]
    if not holders:
        return several_priority_victims
    held_before = (t.pre.requests.get(rid) for rid in holders)
    if any(r is not None and block in r.block_ids for r in held_before):
        return False  # held through the step: it never reached the free queue
    if several_priority_victims:
        return True
    ahead = {*t.pre.kv.free_block_ids, *victim.block_ids[index + 1 :]}
    return ahead.isdisjoint(post.kv.free_block_ids)


@invariant(
    "CACHE-ABORT-KEPT",
    "abort",
    "vllm-v1",
    "With prefix caching on, finish_requests frees each aborted request's blocks with the "
    "registrations they carried (those of KV its step in flight is writing included): an "
    "abort allocates nothing, so no hash is evicted.",
)
def check_cache_abort_kept(t: AbortTransition) -> list[Violation]:
    if not t.post.config.enable_prefix_caching:
        return []
    out: list[Violation] = []
    for rid in dict.fromkeys(t.request_ids):  # an id named twice is freed once
        request = t.pre.requests.get(rid)
        if request is not None and rid not in t.post.requests:
            out += lost_registrations("CACHE-ABORT-KEPT", t.pre, t.post, request, _never)
    return out


def _never(index: int) -> bool:
    return False


@invariant(
    "CACHE-UPDATE-KEPT",
    "update",
    "vllm-v1",
    "With prefix caching on, update_from_output drops no registration: every block that "
    "carried a hash before the call carries it after, held or free (a landing allocates "
    "nothing, and a request that finishes on it frees its blocks with their hashes).",
)
def check_cache_update_kept(t: UpdateTransition) -> list[Violation]:
    if not t.post.config.enable_prefix_caching:
        return []
    before, after = t.pre.kv.block_hashes, t.post.kv.block_hashes
    if before == after:
        return []  # the common case, in one comparison
    return [
        Violation(
            "CACHE-UPDATE-KEPT",
            "registration dropped by update_from_output",
            None,
            block,
            block_hash,
            after[block] if block < len(after) else None,
        )
        for block, block_hash in enumerate(before)
        if block_hash is not None and (block >= len(after) or after[block] != block_hash)
    ]
