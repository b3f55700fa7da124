"""The vLLM V1 profile: the exact decisions vLLM's scheduler makes, as predicates.

An engine that claims the vllm-v1 profile must make these same decisions;
any correct engine need only pass the safety profile.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from schedspec.spec.arithmetic import cdiv
from schedspec.spec.block_hash import BlockHash
from schedspec.spec.config import SchedulerConfig
from schedspec.spec.invariants.registry import Violation, invariant
from schedspec.spec.invariants.safety.connector import connector_in_play
from schedspec.spec.invariants.transitions import (
    AbortTransition,
    ScheduleTransition,
    UpdateTransition,
)
from schedspec.spec.invariants.vllm.mamba import junction_in_step, mamba_cut
from schedspec.spec.invariants.vllm.reorder import waiting_phase_queue
from schedspec.spec.kv_groups import NULL_BLOCK_ID
from schedspec.spec.state import KVState, RequestState, State


def long_prefill_cap(pre: State) -> int:
    """The per-request cap of a step: the threshold, once more than one request exists,
    and (under long_prefill_needs_chunked_prefill, vLLM 0.34.0) only with chunked
    prefill on."""
    config = pre.config
    if config.long_prefill_needs_chunked_prefill and not config.enable_chunked_prefill:
        return 0
    if len(pre.running) + len(pre.waiting) > 1:
        return config.long_prefill_token_threshold
    return 0


def _capped(num_tokens: int, cap: int) -> int:
    return cap if 0 < cap < num_tokens else num_tokens


def _admissible(state: State, queue: Sequence[str] | None = None) -> list[str]:
    """The waiting queue in order (the state's, or `queue`: the same requests as the
    step's waiting phase orders them), minus the requests that wait for stale output
    (vLLM skips them and puts them back where they were)."""
    order = state.waiting if queue is None else queue
    return [r for r in order if not state.requests[r].awaits_stale_output]


def padded_admission(
    t: ScheduleTransition, pre: RequestState, num_hit: int, budget_left: int, cap: int
) -> int:
    """vLLM's spec-decode padding of an admission: 1 + K when it pads, 0 when it does
    not, -1 when the padded count does not fit the budget left (the admission then
    waits). It pads a request with exactly one token to compute when no running
    request's prefill continues in the step and some running request is in the
    step or the request hit the prefix cache, and 1 + K more positions leave room
    below max_model_len. The reference does not pad where the long-prefill cap
    would cut the padding (vLLM then fails its assertion: docs/FINDINGS.md F3)."""
    config = t.pre.config
    if not config.pad_spec_decode or pre.num_tokens - num_hit != 1:
        return 0
    admitted = t.admitted_ids
    scheduled_running = [r for r in t.output.num_scheduled_tokens if r not in admitted]
    if any(t.pre.requests[r].is_prefill_chunk for r in scheduled_running if r in t.pre.requests):
        return 0
    if not scheduled_running and num_hit == 0:
        return 0
    padded = 1 + config.num_speculative_tokens
    if num_hit + padded + 1 > config.max_model_len:
        return 0
    if padded > budget_left:
        return -1
    return 0 if 0 < cap < padded else padded


def _running_demand(pre: RequestState, computed: int) -> int:
    """What a running request still has to compute: its known tokens, the output
    positions of its in-flight sampling step, and its drafts."""
    return pre.num_tokens_with_spec + pre.num_output_placeholders - computed


def running_wanted(pre: RequestState, computed: int, cap: int, budget_left: int, room: int) -> int:
    """The tokens vLLM's running loop asks for a running request before any Mamba split:
    its demand under the long-prefill cap, the budget left and the room below
    max_model_len."""
    return min(_capped(_running_demand(pre, computed), cap), budget_left, room)


@invariant(
    "SCHEDULE-ORDER",
    "schedule",
    "vllm-v1",
    "Running requests are served first, in running order, then waiting ones are admitted in "
    "queue order (as cache-aware admission leaves it at the start of the waiting phase) "
    "with nothing skipped but requests that wait for stale output; admitted requests join "
    "the end of running.",
)
def check_schedule_order(t: ScheduleTransition) -> list[Violation]:
    scheduled = t.output.num_scheduled_tokens
    admitted = t.admitted_ids
    queue = waiting_phase_queue(t)
    in_running_order = [r for r in t.pre.running if r in scheduled]
    in_queue_order = [r for r in queue if r in admitted]
    out: list[Violation] = []
    in_play = connector_in_play(t.pre, t.post)
    if in_play:
        # Lookups that are not ready, parked loads and the async-load queue take
        # admissions out of queue order (docs/FORMAL.md, "What is left free"): only
        # running first, in running order, and admissions appended, are judged.
        in_queue_order = [r for r in scheduled if r in admitted]
    expected_admitted = _admissible(t.pre, queue)[: len(admitted)]
    if in_queue_order != expected_admitted and not in_play:
        out.append(
            Violation(
                "SCHEDULE-ORDER",
                "admissions skipped a waiting request",
                expected=expected_admitted,
                actual=in_queue_order,
            )
        )
    if list(scheduled) != in_running_order + in_queue_order:
        out.append(
            Violation(
                "SCHEDULE-ORDER",
                "scheduling order",
                None,
                None,
                expected=in_running_order + in_queue_order,
                actual=list(scheduled),
            )
        )
    preempted = t.output.preempted_req_ids
    expected_running = [r for r in t.pre.running if r not in preempted] + in_queue_order
    if list(t.post.running) != expected_running:
        out.append(
            Violation(
                "SCHEDULE-ORDER",
                "running order after the step",
                None,
                None,
                expected=expected_running,
                actual=list(t.post.running),
            )
        )
    return out


@invariant(
    "GREEDY-BUDGET",
    "schedule",
    "vllm-v1",
    "In scheduling order each request gets min(its demand after the long-prefill cap, the "
    "budget left, room below max_model_len), a running request's demand counting its "
    "in-flight output positions and drafts; with chunked prefill off an admission gets its "
    "whole capped prompt or is not admitted; with pad_spec_decode an admission of exactly "
    "one token is padded to 1 + K as vLLM pads it, and not made when 1 + K exceeds the budget "
    "left. (Under priority, a step whose victim was "
    "already scheduled refunds its budget after later requests were sized: they may get "
    "less, never more.)",
)
def check_greedy_budget(t: ScheduleTransition) -> list[Violation]:
    config = t.pre.config
    cap = long_prefill_cap(t.pre)
    before = t.computed_before
    admitted = t.admitted_ids
    budget = config.max_num_batched_tokens
    out: list[Violation] = []
    for rid, num in t.output.num_scheduled_tokens.items():
        pre = t.pre.requests.get(rid)
        if pre is None or rid not in before:
            continue
        if rid in admitted:
            padded = padded_admission(t, pre, before[rid], budget, cap)
            if padded < 0:
                # vLLM holds the admission rather than run it unpadded (found by DETERMINED).
                out.append(
                    Violation(
                        "GREEDY-BUDGET",
                        f"admitted although its padded {1 + config.num_speculative_tokens} "
                        "tokens do not fit the budget left (vLLM holds it)",
                        rid,
                        None,
                        expected=0,
                        actual=num,
                    )
                )
                budget -= num
                continue
            expected = padded if padded > 0 else _capped(pre.num_tokens - before[rid], cap)
            if config.enable_chunked_prefill:
                expected = min(expected, budget)
        else:
            demand = _capped(_running_demand(pre, before[rid]), cap)
            expected = min(demand, budget, config.max_model_len - 1 - before[rid])
        # A Mamba group in align mode cuts prefill chunks to its state boundaries (and to
        # the junction an admission's lookup just recorded, or a running request kept).
        expected = mamba_cut(config, pre, before[rid], expected, junction_in_step(t, rid))
        # A priority victim unscheduled after this request was sized gives its
        # budget back too late for it: then the request may get less, never more.
        refunded = config.policy == "priority" and bool(t.output.preempted_req_ids)
        if num > expected or (num != expected and not refunded):
            out.append(
                Violation(
                    "GREEDY-BUDGET", "tokens scheduled", rid, None, expected=expected, actual=num
                )
            )
        budget -= num
    return out


@invariant(
    "RUNNING-SERVED",
    "schedule",
    "vllm-v1",
    "Every running request is scheduled or preempted, unless the running requests ahead of "
    "it used up the whole budget, or it has nothing to compute below max_model_len, or its "
    "in-flight step is sure to reach max_tokens, or the Mamba-aligned split cuts its "
    "chunk to nothing.",
)
def check_running_served(t: ScheduleTransition) -> list[Violation]:
    scheduled = t.output.num_scheduled_tokens
    config = t.pre.config
    budget = config.max_num_batched_tokens
    used_ahead = 0
    out: list[Violation] = []
    for rid in t.pre.running:
        pre = t.pre.requests[rid]
        room = config.max_model_len - 1 - pre.num_computed_tokens
        idle = (
            pre.sure_to_reach_max_tokens
            or _running_demand(pre, pre.num_computed_tokens) <= 0
            or room <= 0
            or _cut_to_nothing(t, pre, budget - used_ahead, room)
        )
        if rid in scheduled:
            used_ahead += scheduled[rid]
        elif rid not in t.output.preempted_req_ids and used_ahead < budget and not idle:
            out.append(
                Violation(
                    "RUNNING-SERVED",
                    "skipped with budget left",
                    rid,
                    None,
                    expected=budget,
                    actual=used_ahead,
                )
            )
    return out


def _cut_to_nothing(t: ScheduleTransition, pre: RequestState, budget_left: int, room: int) -> bool:
    """Does the Mamba-aligned split leave a running request nothing this step?"""
    config = t.pre.config
    if not config.kv_cache_groups:
        return False
    cap = long_prefill_cap(t.pre)
    wanted = running_wanted(pre, pre.num_computed_tokens, cap, budget_left, room)
    junction = pre.shared_prefix_boundary  # a running request keeps its own
    return wanted > 0 and mamba_cut(config, pre, pre.num_computed_tokens, wanted, junction) == 0


@invariant(
    "NO-ADMIT-AFTER-PREEMPT",
    "schedule",
    "vllm-v1",
    "A step that preempted admits nothing: freed blocks go to running requests first and a "
    "victim cannot bounce straight back.",
)
def check_no_admit_after_preempt(t: ScheduleTransition) -> list[Violation]:
    admitted = list(t.admitted)  # a list in the message, as before
    if t.output.preempted_req_ids and admitted:
        return [
            Violation(
                "NO-ADMIT-AFTER-PREEMPT",
                f"admitted {admitted} after preempting {sorted(t.output.preempted_req_ids)}",
                expected="no admission",
                actual=admitted,
            )
        ]
    return []


def _key(request: RequestState) -> tuple[int, int]:
    return (request.priority, request.arrival)


@invariant(
    "VICTIM",
    "schedule",
    "vllm-v1",
    "fcfs preempts from the end of the running list; priority preempts the running requests "
    "with the largest (priority, arrival).",
)
def check_victim(t: ScheduleTransition) -> list[Violation]:
    preempted = t.output.preempted_req_ids
    if not preempted:
        return []
    running = list(t.pre.running)
    if t.pre.config.policy == "fcfs":
        expected = set(running[len(running) - len(preempted) :])
    else:
        by_key = sorted(running, key=lambda r: _key(t.pre.requests[r]))
        expected = set(by_key[len(by_key) - len(preempted) :])
    if expected == set(preempted):
        return []
    return [
        Violation(
            "VICTIM",
            "wrong victims",
            None,
            None,
            expected=sorted(expected),
            actual=sorted(preempted),
        )
    ]


@invariant(
    "QUEUE-ORDER",
    "schedule",
    "vllm-v1",
    "fcfs: victims go to the front of the waiting queue (in running order), admissions "
    "leave it and everything else keeps its order (requests skipped while they wait for "
    "stale output included), but for cache-aware admission's reorder, which stays; "
    "priority: the queue is ordered by (priority, arrival).",
)
def check_queue_order(t: ScheduleTransition) -> list[Violation]:
    if connector_in_play(t.pre, t.post):
        return []  # holders first, and the async-load queue apart: LOAD-PARKED judges
    waiting = list(t.post.waiting)
    if t.pre.config.policy == "priority":
        expected = sorted(waiting, key=lambda r: _key(t.post.requests[r]))
    else:
        victims = [r for r in t.pre.running if r in t.output.preempted_req_ids]
        admitted = t.admitted_ids
        expected = victims + [r for r in waiting_phase_queue(t) if r not in admitted]
    if waiting == expected:
        return []
    return [
        Violation(
            "QUEUE-ORDER", "waiting queue order", None, None, expected=expected, actual=waiting
        )
    ]


@invariant(
    "WATERMARK",
    "schedule",
    "vllm-v1",
    "An admission made while something runs leaves at least int(watermark * num_blocks) "
    "blocks free.",
)
def check_watermark(t: ScheduleTransition) -> list[Violation]:
    admitted = t.admitted
    if not admitted or len(t.post.running) < 2:
        return []  # the only admission went into an idle engine: no watermark
    spare = t.post.config.watermark_blocks
    free = len(t.post.kv.free_block_ids)
    if free >= spare:
        return []
    return [
        Violation(
            "WATERMARK",
            "admitted into the watermark",
            admitted[-1],
            None,
            expected=spare,
            actual=free,
        )
    ]


def cached_prefix(kv: KVState, own: Sequence[BlockHash], max_blocks: int) -> list[int]:
    """The blocks a prefix-cache lookup returns: the first-registered block of
    each hash, up to the first miss."""
    first = {block_hash: ids[0] for block_hash, ids in kv.prefix_cache}
    hits: list[int] = []
    for block_hash in own[:max_blocks]:
        block = first.get(block_hash)
        if block is None:
            break
        hits.append(block)
    return hits


def allocation_slots(config: SchedulerConfig, num_tokens: int) -> int:
    """The slots vLLM's allocate_slots reserves for a request that will have computed
    num_tokens: those and the lookahead slots, capped at max_model_len."""
    return min(num_tokens + config.lookahead_tokens, config.max_model_len)


def admission_blocks_needed(
    config: SchedulerConfig, num_tokens: int, hit_tokens: int, num_new: int, evictable: int
) -> int:
    """The free blocks an admission takes in vLLM's check (allocate_slots with
    full_sequence_must_fit): enough for its whole known sequence or this step's slots,
    whichever is more, less its prefix hit, plus the hit blocks it takes out of the free
    queue (evictable: cached, held by nobody)."""
    full = min(num_tokens, config.max_model_len)
    slots = allocation_slots(config, hit_tokens + num_new)
    bs = config.block_size
    return max(cdiv(max(full, slots), bs) - hit_tokens // bs, 0) + evictable


@invariant(
    "ADMISSION-STOP",
    "schedule",
    "vllm-v1",
    "Admission stops only for a reason: no waiting request (but those waiting for stale "
    "output), no budget, max_num_seqs reached, a preemption this step, or the first such "
    "request does not fit (its whole capped prompt, or its padding, over the budget with "
    "chunked prefill off, or its blocks plus the watermark over the free blocks).",
    groups="single",
)
def check_admission_stop(t: ScheduleTransition) -> list[Violation]:
    config = t.post.config
    bs = config.block_size

    def lookup(head: RequestState) -> tuple[int, Callable[[int], int]]:
        hits = cached_prefix(t.post.kv, t.hashes.of(head), (head.num_tokens - 1) // bs)
        hit_tokens = len(hits) * bs
        evictable = sum(1 for b in hits if t.post.kv.ref_counts[b] == 0)
        return hit_tokens, lambda num_new: admission_blocks_needed(
            config, head.num_tokens, hit_tokens, num_new, evictable
        )

    return admission_stop("ADMISSION-STOP", t, lookup)


AdmissionLookup = Callable[[RequestState], tuple[int, Callable[[int], int]]]


def admission_stop(
    invariant_id: str, t: ScheduleTransition, lookup: AdmissionLookup
) -> list[Violation]:
    """ADMISSION-STOP's rule, with the queue head's prefix hit and block count given by
    `lookup`: the head's hit tokens, and the free blocks it takes for a number of new
    tokens (the single group's count, or the hybrid groups' sum)."""
    if connector_in_play(t.pre, t.post):
        return []
    config = t.post.config
    budget_left = config.max_num_batched_tokens - sum(t.output.num_scheduled_tokens.values())
    admissible = _admissible(t.post)
    if (
        t.output.preempted_req_ids
        or not admissible
        or budget_left <= 0
        or len(t.post.running) >= config.max_num_seqs
    ):
        return []
    head = t.post.requests[admissible[0]]
    hit_tokens, blocks_for = lookup(head)
    cap = long_prefill_cap(t.pre)
    padded = padded_admission(t, head, hit_tokens, budget_left, cap)
    if padded < 0:
        return []  # the padded step does not fit: vLLM waits rather than not pad
    demand = padded or _capped(head.num_tokens - hit_tokens, cap)
    if not config.enable_chunked_prefill and demand > budget_left:
        return []
    num_new = min(demand, budget_left)
    spare = config.watermark_blocks if t.post.running else 0
    needed = blocks_for(num_new)
    if needed + spare > len(t.post.kv.free_block_ids):
        return []
    return [
        Violation(
            invariant_id,
            f"queue head could have been admitted ({needed} "
            f"blocks + {spare} spare <= {len(t.post.kv.free_block_ids)} free, "
            f"{budget_left} tokens left)",
            head.request_id,
            expected="admitted",
            actual=t.post.queue_of(head.request_id),
        )
    ]


def expected_free_queue(pre: State, post: State, freed: Sequence[str]) -> list[int]:
    """The free queue after freeing these requests' tables in order, tail block first:
    blocks nobody holds any more go to the front if uncached, to the back if cached. A
    hybrid request frees one table per group, in group order (nulls are no one's)."""
    refs = list(pre.kv.ref_counts)
    queue = list(pre.kv.free_block_ids)
    caching = pre.config.enable_prefix_caching
    for rid in freed:
        for table in _freed_tables(pre.requests[rid]):
            front: list[int] = []
            back: list[int] = []
            for block in reversed(table):
                refs[block] -= 1
                if refs[block] == 0:
                    cached = caching and post.kv.block_hashes[block] is not None
                    (back if cached else front).append(block)
            queue = front + queue + back
    return queue


def _freed_tables(request: RequestState) -> list[tuple[int, ...]]:
    """The tables a request frees one by one: its one table, or each group's non-null
    blocks (vLLM's KVCacheCoordinator.free frees group by group)."""
    if not request.group_block_ids:
        return [request.block_ids]
    return [tuple(b for b in table if b != NULL_BLOCK_ID) for table in request.group_block_ids]


def _check_free_order(
    invariant_id: str, pre: State, post: State, freed: Sequence[str]
) -> list[Violation]:
    expected = expected_free_queue(pre, post, freed)
    if list(post.kv.free_block_ids) == expected:
        return []
    return [
        Violation(
            invariant_id,
            f"free queue after freeing {list(freed)}",
            None,
            None,
            expected=expected,
            actual=list(post.kv.free_block_ids),
        )
    ]


@invariant(
    "FREE-ORDER",
    "update",
    "vllm-v1",
    "A finished request's blocks are freed tail first: uncached ones to the front of the "
    "free queue (reused first), cached ones to the back (evicted last, LRU); a hybrid "
    "request's group by group, in group order.",
)
def check_free_order_update(t: UpdateTransition) -> list[Violation]:
    if connector_frees_unordered(t.pre, t.post):
        return []
    held = t.post.connector.held if t.post.connector is not None else {}
    freed = [
        r
        for r in t.output.num_scheduled_tokens
        if r in t.pre.requests and r not in t.post.requests and r not in held
    ]
    return _check_free_order("FREE-ORDER", t.pre, t.post, freed)


def connector_frees_unordered(pre: State, post: State) -> bool:
    """Did the KV connector's reports free blocks in this transition (a held request
    released, or a failed load ended)? vLLM frees those in set order, which the spec
    leaves open, after the step's plain frees."""
    if pre.connector is None or post.connector is None:
        return False
    released = any(rid not in post.connector.held for rid in pre.connector.held)
    ended_loads = any(rid not in post.requests for rid in pre.connector.loads)
    return released or ended_loads


@invariant(
    "FREE-ORDER-ABORT",
    "abort",
    "vllm-v1",
    "The same free-queue rule for an abort of one request (vLLM frees a multi-request abort "
    "in set order, which the spec leaves open).",
)
def check_free_order_abort(t: AbortTransition) -> list[Violation]:
    held = t.post.connector.held if t.post.connector is not None else {}
    freed = [r for r in dict.fromkeys(t.request_ids) if r in t.pre.requests]
    if len(freed) != 1 or freed[0] in held:
        return []
    return _check_free_order("FREE-ORDER-ABORT", t.pre, t.post, freed)
