"""Which priority victims vLLM's running loop served before it preempted them.

The output does not say: a victim served earlier in the step is unscheduled again, and
its budget returns. But the vllm-v1 profile determines the step (docs/FORMAL.md,
"DETERMINED"), so the loop can be replayed from the state before it: running requests
in order, each sized as GREEDY-BUDGET sizes it and given the blocks ALLOC-EXACT says
its table grows by, and, where the free blocks fall short, the running request with
the largest (priority, arrival) preempted (VICTIM) until the request fits or was
itself the victim. A victim served earlier in the step gives back its budget and the
blocks it took. The replay is trusted only where it reproduces every visible decision
of the step (who among the running was scheduled, with how many tokens, and who was
preempted); otherwise the invariants that judge those decisions report the step.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from schedspec.spec.invariants.safety.connector import connector_in_play
from schedspec.spec.invariants.transitions import ScheduleTransition
from schedspec.spec.invariants.vllm.allocation import table_after_allocation
from schedspec.spec.invariants.vllm.policy import long_prefill_cap, running_wanted
from schedspec.spec.state import RequestState, State


@dataclass(frozen=True)
class RunningPhase:
    """The replayed running loop: the tokens each running request got (victims
    excluded), the victims in the order taken, and those served before being taken."""

    scheduled: dict[str, int]
    preempted: tuple[str, ...]
    served_victims: frozenset[str]


def _key(request: RequestState) -> tuple[int, int]:
    return (request.priority, request.arrival)


def replay_priority_running(pre: State) -> RunningPhase:
    """vLLM's running loop under priority, in counts: free blocks, token budget, the
    running list. Freed blocks are those whose last holder the victim was."""
    config = pre.config
    cap = long_prefill_cap(pre)
    free = len(pre.kv.free_block_ids)
    budget = config.max_num_batched_tokens
    refs = Counter({block: n for block, n in enumerate(pre.kv.ref_counts) if n > 0})
    running = list(pre.running)
    served: dict[str, tuple[int, int]] = {}  # tokens and new blocks of the step
    preempted: list[str] = []
    served_victims: set[str] = set()
    index = 0
    while index < len(running) and budget > 0:
        request = pre.requests[running[index]]
        computed = request.num_computed_tokens
        num_new = running_wanted(
            request, computed, cap, budget, config.max_model_len - 1 - computed
        )
        if request.sure_to_reach_max_tokens or num_new <= 0:
            index += 1  # its in-flight step is its last, or nothing to compute
            continue
        held = len(request.block_ids)
        need = table_after_allocation(pre, request, held, computed, num_new) - held
        while need > free:
            victim_index = max(range(len(running)), key=lambda i: _key(pre.requests[running[i]]))
            victim = running.pop(victim_index)
            if victim_index < index:
                index -= 1
            if victim in served:
                tokens, blocks = served.pop(victim)
                budget += tokens
                free += blocks  # its new blocks: held by it alone
                served_victims.add(victim)
            for block in pre.requests[victim].block_ids:
                refs[block] -= 1
                if refs[block] == 0:
                    free += 1  # its last holder: back to the free queue
            preempted.append(victim)
            if victim == request.request_id:
                break
        else:
            free -= need
            budget -= num_new
            served[request.request_id] = (num_new, need)
            index += 1
    return RunningPhase(
        {rid: tokens for rid, (tokens, _) in served.items()},
        tuple(preempted),
        frozenset(served_victims),
    )


def served_priority_victims(t: ScheduleTransition) -> frozenset[str]:
    """The step's priority victims that the running loop served before it preempted
    them, where the replay reproduces the step's visible decisions (else none)."""
    config = t.pre.config
    if config.policy != "priority" or not t.output.preempted_req_ids:
        return frozenset()
    if config.kv_cache_groups or connector_in_play(t.pre, t.post):
        return frozenset()  # Mamba's split and KV loads size the loop otherwise
    phase = replay_priority_running(t.pre)
    if not phase.served_victims:
        return frozenset()
    running = set(t.pre.running)
    scheduled = {r: n for r, n in t.output.num_scheduled_tokens.items() if r in running}
    if scheduled != phase.scheduled or set(t.output.preempted_req_ids) != set(phase.preempted):
        return frozenset()
    return phase.served_victims
