"""Named corners of the scheduler: the situations a search must reach to find the bugs
that hide there, counted on every checked schedule() call.

A campaign prints how many steps reached each corner, so a long run shows what it
covered, and a corner it never reached says where the search (or a --configs strategy)
is blind. Each corner is one cheap test on a schedule() transition: the state before,
the engine's output, and the state after.
"""

from __future__ import annotations

from collections.abc import Iterator

from schedspec.spec import SchedulerConfig, SchedulerOutput, State

# name -> what a step in that corner does (README and docs/CAMPAIGNS.md list them).
CORNERS: dict[str, str] = {
    "preemption": "preempts a request (its blocks freed for recomputation)",
    "priority-preemption": "preempts under the priority policy",
    "resumed": "resumes a request it had preempted",
    "prefix-cache-hit": "admits a request with a prefix-cache hit",
    "chunked-prefill": "schedules a prefill chunk that stops short of the prompt",
    "spec-decode": "schedules speculative (draft) tokens",
    "token-budget-full": "spends the whole max_num_batched_tokens",
    "batch-full": "runs max_num_seqs requests",
    "kv-exhausted": "leaves no free KV block",
    "admission-held": "leaves a request waiting although budget and seats remain",
    "pipelined": "schedules a request whose previous step is still in flight (async)",
}


def corners_of(
    config: SchedulerConfig, pre: State, output: SchedulerOutput, mid: State
) -> Iterator[str]:
    """The corners one schedule() transition reaches (names from CORNERS)."""
    scheduled = output.num_scheduled_tokens
    if output.preempted_req_ids:
        yield "preemption"
        if config.policy == "priority":
            yield "priority-preemption"
    if any(cached.resumed for cached in output.scheduled_cached_reqs):
        yield "resumed"
    if any(new.num_computed_tokens > 0 for new in output.scheduled_new_reqs):
        yield "prefix-cache-hit"
    requests = mid.requests
    if any(r in requests and requests[r].is_prefill_chunk for r in scheduled):
        yield "chunked-prefill"
    if output.scheduled_spec_decode_tokens:
        yield "spec-decode"
    full_budget = output.total_num_scheduled_tokens >= config.max_num_batched_tokens
    if full_budget:
        yield "token-budget-full"
    full_batch = len(mid.running) >= config.max_num_seqs
    if full_batch:
        yield "batch-full"
    if not mid.kv.free_block_ids:
        yield "kv-exhausted"
    if mid.waiting and not full_budget and not full_batch:
        yield "admission-held"
    before = pre.requests
    if any(r in before and before[r].num_in_flight_tokens for r in scheduled):
        yield "pipelined"
