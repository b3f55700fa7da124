"""vLLM V1's side of the engine-neutral split (docs/SPEC.md, "Which profile states what").

The safety core once stated these as any engine's duty; SGLang shows they are vLLM's
choices, not safety: it defers the abort of a running request to its next step, drops
a retracted request's output in flight, and swaps a block of a running request's table
for the radix tree's copy of the same tokens. Safety now allows each; vllm-v1 keeps
vLLM's stricter rule here.
"""

from __future__ import annotations

from schedspec.spec.invariants.registry import Violation, invariant, still_live
from schedspec.spec.invariants.transitions import AbortTransition, ScheduleTransition
from schedspec.spec.state import State


@invariant(
    "ABORT-AT-ONCE",
    "abort",
    "vllm-v1",
    "finish_requests removes every live request it names at once, running ones included "
    "(no abort is left pending).",
)
def check_abort_at_once(t: AbortTransition) -> list[Violation]:
    return [
        still_live(
            "ABORT-AT-ONCE",
            "an aborted request is still live (abort deferred)",
            t.post.requests[rid],
        )
        for rid in dict.fromkeys(t.request_ids)
        if rid in t.pre.requests and rid in t.post.requests
    ]


@invariant(
    "STALE-KEPT",
    "state",
    "vllm-v1",
    "Stale output (from before a preemption) is never marked to be dropped: vLLM delivers it.",
)
def check_stale_kept(state: State) -> list[Violation]:
    return [
        Violation(
            "STALE-KEPT",
            "stale output marked to be dropped",
            rid,
            expected="drop_stale_output False",
            actual="drop_stale_output True",
        )
        for rid, request in state.requests.items()
        if request.drop_stale_output
    ]


@invariant(
    "TABLE-GROWS",
    "schedule",
    "vllm-v1",
    "A running request's block table only grows: the blocks it held before the step keep "
    "their places (vLLM's runner keeps each table and appends to it).",
    groups="single",
)
def check_table_grows(t: ScheduleTransition) -> list[Violation]:
    out: list[Violation] = []
    for cached in t.output.scheduled_cached_reqs:
        pre = t.pre.requests.get(cached.request_id)
        post = t.post.requests.get(cached.request_id)
        if cached.resumed or pre is None or post is None:
            continue
        if post.block_ids[: len(pre.block_ids)] != pre.block_ids:
            out.append(
                Violation(
                    "TABLE-GROWS",
                    "a block the request held changed place",
                    cached.request_id,
                    None,
                    expected=pre.block_ids,
                    actual=post.block_ids[: len(pre.block_ids)],
                )
            )
    return out
