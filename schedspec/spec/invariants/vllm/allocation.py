"""The vLLM V1 profile's rules for the blocks schedule() hands out: how much a table
grows, when an admission fits, when a preemption is needed.

`schedspec prove --only DETERMINED` found each one missing: without it two engines
could make different decisions on the same state and both pass the profile
(docs/FORMAL.md, "DETERMINED").
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable

from schedspec.spec.arithmetic import cdiv
from schedspec.spec.invariants.registry import Violation, invariant
from schedspec.spec.invariants.safety.connector import connector_in_play, is_load
from schedspec.spec.invariants.transitions import ScheduleTransition
from schedspec.spec.invariants.vllm.policy import (
    _capped,
    _running_demand,
    admission_blocks_needed,
    allocation_slots,
    long_prefill_cap,
)
from schedspec.spec.invariants.vllm.reorder import waiting_phase_queue
from schedspec.spec.state import RequestState, State


def table_after_allocation(
    state: State, request: RequestState, held: int, computed: int, num_new: int
) -> int:
    """The table's length after allocate_slots for num_new tokens from `computed` (the
    hit, for an admission): what the slots up to the lookahead need, capped at
    max_model_len, or what it holds already if that is more."""
    config = state.config
    slots = allocation_slots(config, computed + num_new)
    return max(held, cdiv(slots, config.block_size))


@invariant(
    "ALLOC-EXACT",
    "schedule",
    "vllm-v1",
    "schedule() changes a block table only as vLLM's allocate_slots does: a scheduled "
    "request's table keeps its blocks and grows to exactly what its computed, scheduled and "
    "lookahead tokens need (capped at max_model_len); a request neither scheduled nor "
    "preempted keeps its table as it was.",
    groups="single",
)
def check_alloc_exact(t: ScheduleTransition) -> list[Violation]:
    scheduled = t.output.num_scheduled_tokens
    before = t.computed_before
    admitted = t.admitted_ids
    out: list[Violation] = []
    for rid, post in t.post.requests.items():
        pre = t.pre.requests.get(rid)
        if pre is None or rid in t.output.preempted_req_ids:
            continue
        if rid not in scheduled:
            if post.block_ids != pre.block_ids and not is_load(t.pre, t.post, rid):
                out.append(
                    Violation(
                        "ALLOC-EXACT",
                        "table changed without a step",
                        rid,
                        None,
                        expected=list(pre.block_ids),
                        actual=list(post.block_ids),
                    )
                )
            continue
        if rid not in before or is_load(t.pre, t.post, rid):
            continue  # OUTPUT reports the missing data; LOAD-* judge a load's table
        held = () if rid in admitted else pre.block_ids
        expected = table_after_allocation(t.pre, pre, len(held), before[rid], scheduled[rid])
        if post.block_ids[: len(held)] != held or len(post.block_ids) != expected:
            out.append(
                Violation(
                    "ALLOC-EXACT",
                    f"table after {scheduled[rid]} tokens from {before[rid]} computed "
                    f"(held {len(held)} blocks)",
                    rid,
                    None,
                    expected=expected,
                    actual=len(post.block_ids),
                )
            )
    return out


def _blocks_taken(t: ScheduleTransition, admissions: Iterable[str]) -> dict[str, set[int]]:
    """The blocks each admission took out of the free queue, in admission order (a
    block two of them hold counts for the first)."""
    free = set(t.pre.kv.free_block_ids)
    seen: set[int] = set()
    taken: dict[str, set[int]] = {}
    for rid in admissions:
        post = t.post.requests.get(rid)
        table = set(post.block_ids) if post is not None else set()
        taken[rid] = (table & free) - seen
        seen |= table
    return taken


@invariant(
    "ADMISSION-FIT",
    "schedule",
    "vllm-v1",
    "Every admission fitted when it was made: its whole known sequence (or this step's "
    "slots, if more), less its prefix hit, plus the hit blocks it took out of the free queue "
    "and, while something ran, the watermark, within the free blocks at that point.",
    groups="single",
)
def check_admission_fit(t: ScheduleTransition) -> list[Violation]:
    made = t.admitted_ids
    # In the order they were made: the queue's, after cache-aware admission's reorder.
    admissions = [r for r in waiting_phase_queue(t) if r in made]
    if not admissions or connector_in_play(t.pre, t.post):
        return []
    config = t.pre.config
    bs = config.block_size
    taken = _blocks_taken(t, admissions)
    before = t.computed_before
    # The free blocks when each admission was made: the step's end plus what it and
    # the admissions after it took.
    free = len(t.post.kv.free_block_ids) + sum(len(blocks) for blocks in taken.values())
    running = len(t.post.running) - len(admissions)
    out: list[Violation] = []
    for rid in admissions:
        post = t.post.requests.get(rid)
        pre = t.pre.requests.get(rid)
        if post is None or pre is None or rid not in before:
            continue
        hit_tokens = before[rid]
        hit_blocks = set(post.block_ids[: hit_tokens // bs])
        evictable = len(hit_blocks & taken[rid])
        num_new = t.output.num_scheduled_tokens.get(rid, 0)
        needed = admission_blocks_needed(config, pre.num_tokens, hit_tokens, num_new, evictable)
        spare = config.watermark_blocks if running > 0 else 0
        if needed + spare > free:
            out.append(
                Violation(
                    "ADMISSION-FIT",
                    f"admitted needing {needed} blocks + {spare} spare with {free} free",
                    rid,
                    None,
                    expected=needed + spare,
                    actual=free,
                )
            )
        free -= len(taken[rid])
        running += 1
    return out


@invariant(
    "PREEMPT-NEEDED",
    "schedule",
    "vllm-v1",
    "fcfs preempts only while the request being served cannot get its blocks: had the first "
    "victim in running order (the last one taken) stayed, the blocks the running requests "
    "ahead of it took in the step, plus those it asked for itself, would exceed the free "
    "blocks and those the other victims freed. (Not checked under priority.)",
    groups="single",
)
def check_preempt_needed(t: ScheduleTransition) -> list[Violation]:
    preempted = t.output.preempted_req_ids
    config = t.pre.config
    if not preempted or config.policy != "fcfs":
        return []
    running = list(t.pre.running)
    victims = [r for r in running if r in preempted]
    if not victims:
        return []
    first = victims[0]
    ahead = running[: running.index(first)]
    scheduled = t.output.num_scheduled_tokens
    taken = sum(
        len(t.post.requests[r].block_ids) - len(t.pre.requests[r].block_ids)
        for r in ahead
        if r in t.post.requests
    )
    # What the victim would have asked for when the loop reached it.
    victim = t.pre.requests[first]
    budget_left = config.max_num_batched_tokens - sum(scheduled.get(r, 0) for r in ahead)
    demand = _capped(_running_demand(victim, victim.num_computed_tokens), long_prefill_cap(t.pre))
    room = config.max_model_len - 1 - victim.num_computed_tokens
    num_new = min(demand, budget_left, room)
    asked = 0
    if budget_left > 0 and not victim.sure_to_reach_max_tokens and num_new > 0:
        held = len(victim.block_ids)
        asked = (
            table_after_allocation(t.pre, victim, held, victim.num_computed_tokens, num_new) - held
        )
    # Blocks the other victims return: those no one else holds.
    holders = Counter(b for r in victims[1:] for b in t.pre.requests[r].block_ids)
    freed = sum(1 for b, n in holders.items() if t.pre.kv.ref_counts[b] == n)
    available = len(t.pre.kv.free_block_ids) + freed
    if taken + asked > available:
        return []
    return [
        Violation(
            "PREEMPT-NEEDED",
            f"preempted although the requests ahead took {taken} blocks and it asked for "
            f"{asked}, with {available} free without it",
            first,
            None,
            expected=f"> {available} blocks wanted (else no preemption)",
            actual=taken + asked,
        )
    ]
