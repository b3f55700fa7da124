"""What a block keeps registered in the prefix cache across each call: its hash, until
an allocation reuses it (a victim's, an aborted or finished request's, a free one's).

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

from collections.abc import Sequence

from schedspec.spec.block_hash import BlockHash
from schedspec.spec.invariants.registry import Violation, invariant, or_absent
from schedspec.spec.invariants.transitions import (
    AbortTransition,
    ScheduleTransition,
    UpdateTransition,
)
from schedspec.spec.invariants.vllm.running_replay import served_priority_victims
from schedspec.spec.request import RequestStatus
from schedspec.spec.state import RequestState, State


def lost_registrations(
    before: Sequence[BlockHash | None], after: Sequence[BlockHash | None]
) -> list[int]:
    """The blocks that carried a hash before a call and carry another or none after it."""
    if before == after:
        return []  # the common case, in one comparison
    return [
        block
        for block, block_hash in enumerate(before)
        if block_hash is not None and _hash_at(after, block) != block_hash
    ]


def _hash_at(hashes: Sequence[BlockHash | None], block: int) -> BlockHash | None:
    return hashes[block] if block < len(hashes) else None


@invariant(
    "CACHE-SCHEDULE-KEPT",
    "schedule",
    "vllm-v1",
    "With prefix caching on, a block that carried a hash before schedule() carries it after, "
    "unless the step reused it for a new allocation: a preempted request's blocks keep "
    "their registrations (tokens computed, or in flight in an earlier step that still runs "
    "and writes them), and so do free cached blocks the free queue did not reach (vLLM "
    "frees a block with its hash, cached blocks to the back of the queue, and allocations "
    "take the queue from the front, evicting the hashes of the blocks they take). A "
    "priority victim the step served before preempting it (the running loop's replay "
    "says which) also keeps what that service registered below its computed tokens.",
    groups="single",
)
def check_cache_schedule_kept(t: ScheduleTransition) -> list[Violation]:
    if not t.post.config.enable_prefix_caching:
        return []
    before, after = t.pre.kv.block_hashes, t.post.kv.block_hashes
    lost = lost_registrations(before, after)
    served = served_priority_victims(t)
    if not lost and not served:
        return []  # the common case: nothing evicted
    step = _Freeing(t)
    out = _served_victims_kept(t, step, served)
    for block in lost:
        if step.reused(block):
            continue
        where = step.victim_of.get(block)
        what = f"victim's block at index {where[1]}" if where else "block"
        out.append(
            Violation(
                "CACHE-SCHEDULE-KEPT",
                f"{what} lost its registration, not reused",
                where[0].request_id if where else None,
                block,
                expected=before[block],
                actual=or_absent(_hash_at(after, block), "no hash"),
            )
        )
    return out


def _served_victims_kept(
    t: ScheduleTransition, step: _Freeing, served: frozenset[str]
) -> list[Violation]:
    """A priority victim the step served before preempting it keeps what that service
    registered over KV already computed or in flight: vLLM takes back only the
    registrations past its computed tokens (the step's own, no longer computed). So
    each full block among its first min(num_computed_tokens, num_tokens) tokens that
    did not carry its hash before carries it after, unless the step reused it. (Those
    that carried it before are the clause above's.)"""
    out: list[Violation] = []
    before, after = t.pre.kv.block_hashes, t.post.kv.block_hashes
    bs = t.pre.config.block_size
    for rid in sorted(served):
        victim = t.pre.requests[rid]
        own = t.hashes.of(victim)
        full = min(min(victim.num_computed_tokens, victim.num_tokens) // bs, len(own))
        for index, block in enumerate(victim.block_ids[:full]):
            if _hash_at(before, block) == own[index] or _hash_at(after, block) == own[index]:
                continue
            if step.reused(block):
                continue
            out.append(
                Violation(
                    "CACHE-SCHEDULE-KEPT",
                    f"victim served before its preemption lost the registration its "
                    f"service made of its block at index {index}, not reused",
                    rid,
                    block,
                    expected=own[index],
                    actual=or_absent(_hash_at(after, block), "no hash"),
                )
            )
    return out


class _Freeing:
    """Where each block stood before a step, for telling a reuse (which evicts a hash)
    from a lost registration. A victim frees its table tail first, hashless blocks to
    the front of the free queue and cached ones to the back, and allocations take the
    queue from the front. So a block was reached only once every block ahead of it was
    taken: those free before it in the queue before the step, and for a victim's block,
    every block free before the step and every block of its table after it (freed
    first). A taken block is held after the step, except under priority: a victim may
    have taken blocks in the step before being unscheduled, and freed them again,
    hashless and to the front; the order then tells nothing, and a free hashless block
    may be such a one (with one victim, a block free before the step; with two, a
    victim's too)."""

    def __init__(self, t: ScheduleTransition) -> None:
        self.free_before = t.pre.kv.free_block_ids
        self.free_before_set = frozenset(self.free_before)
        self.free_after = frozenset(t.post.kv.free_block_ids)
        victims = [
            r
            for rid in t.output.preempted_req_ids
            if (r := t.pre.requests.get(rid)) is not None and r.status is RequestStatus.RUNNING
        ]
        priority = t.post.config.policy == "priority"
        self.refreed_free = priority and len(victims) > 0
        self.refreed_victims = priority and len(victims) > 1
        self.victim_of: dict[int, tuple[RequestState, int]] = {
            block: (victim, index)
            for victim in victims
            for index, block in enumerate(victim.block_ids)
        }
        self.held_before = _holders(t.pre)
        self.held_after = _holders(t.post)

    def reused(self, block: int) -> bool:
        holders = self.held_after.get(block, set())
        if holders & self.held_before.get(block, set()):
            return False  # held through the step: it never reached the free queue
        victim = self.victim_of.get(block)
        if block in self.free_before_set:
            refreed, ahead = self.refreed_free, self._ahead_in_queue(block)
        elif victim is not None:
            refreed = self.refreed_victims
            ahead = {*self.free_before, *victim[0].block_ids[victim[1] + 1 :]}
        else:
            return False  # held before by a request that neither keeps it nor freed it
        if refreed:
            return True
        return bool(holders) and ahead.isdisjoint(self.free_after)

    def _ahead_in_queue(self, block: int) -> set[int]:
        return set(self.free_before[: self.free_before.index(block)])


def _holders(state: State) -> dict[int, set[str]]:
    held: dict[int, set[str]] = {}
    for rid, request in state.requests.items():
        for block in request.block_ids:
            held.setdefault(block, set()).add(rid)
    return held


@invariant(
    "CACHE-ABORT-KEPT",
    "abort",
    "vllm-v1",
    "With prefix caching on, finish_requests drops no registration: an aborted request's "
    "blocks are freed with the hashes they carried (those of KV its step in flight is "
    "writing included), and an abort allocates nothing, so no hash is evicted.",
)
def check_cache_abort_kept(t: AbortTransition) -> list[Violation]:
    return _none_lost("CACHE-ABORT-KEPT", "finish_requests", t.pre, t.post)


@invariant(
    "CACHE-UPDATE-KEPT",
    "update",
    "vllm-v1",
    "With prefix caching on, update_from_output drops no registration: every block that "
    "carried a hash before the call carries it after, held or free (a landing allocates "
    "nothing, and a request that finishes on it frees its blocks with their hashes).",
)
def check_cache_update_kept(t: UpdateTransition) -> list[Violation]:
    return _none_lost("CACHE-UPDATE-KEPT", "update_from_output", t.pre, t.post)


def _none_lost(invariant_id: str, call: str, pre: State, post: State) -> list[Violation]:
    """A violation for each registration a call that allocates nothing dropped, naming
    the request that held the block before it, if one did."""
    if not post.config.enable_prefix_caching:
        return []
    before, after = pre.kv.block_hashes, post.kv.block_hashes
    lost = lost_registrations(before, after)
    if not lost:
        return []
    holders = _holders(pre)
    return [
        Violation(
            invariant_id,
            f"registration dropped by {call}",
            min(holders[block]) if block in holders else None,
            block,
            expected=before[block],
            actual=or_absent(_hash_at(after, block), "no hash"),
        )
        for block in lost
    ]
