"""Liveness, checked at the end of a drain: with no arrivals, everything finishes and frees."""

from __future__ import annotations

from schedspec.spec.config import SchedulerConfig
from schedspec.spec.invariants.registry import Violation, invariant
from schedspec.spec.invariants.transitions import DrainResult


def drain_step_bound(config: SchedulerConfig, num_unfinished: int) -> int:
    """Steps within which a drain of num_unfinished requests must end.

    Under fcfs the oldest running request is never a victim (it only
    preempts itself when it runs alone, and alone it fits: the cache holds
    a max_model_len request) and gets the first share of the budget, so it
    advances at least one token per step and finishes within max_model_len
    steps; then the next oldest takes its place. The same bound is claimed
    for priority, where the most urgent running request plays that role.
    With async scheduling and drafts, the oldest request can sit out a step
    while its output is in flight (its placeholders would take it past
    max_model_len or max_tokens) and the next step lands that output, so each
    of its tokens may take two steps. With async scheduling one more step
    lands the last output in flight.
    """
    pipelined_drafts = config.async_scheduling and config.num_speculative_tokens > 0
    steps_per_token = 2 if pipelined_drafts else 1
    return (
        num_unfinished * config.max_model_len * steps_per_token + 1 + int(config.async_scheduling)
    )


@invariant(
    "DRAIN",
    "drain",
    "safety",
    "With no new arrivals, every unfinished request finishes within "
    "num_unfinished * max_model_len + 1 steps (each token may take two under async "
    "scheduling with drafts; one more step lands the last output in flight).",
)
def check_drain(d: DrainResult) -> list[Violation]:
    if not d.final.requests and d.num_steps <= d.step_bound:
        return []
    return [
        Violation(
            "DRAIN",
            f"{len(d.final.requests)} requests unfinished after {d.num_steps} steps",
            None,
            None,
            d.step_bound,
            d.num_steps,
        )
    ]


@invariant(
    "NO-LEAK",
    "drain",
    "safety",
    "Once every request has finished or been aborted, every block is free with ref count 0.",
)
def check_no_leak(d: DrainResult) -> list[Violation]:
    if d.final.requests:
        return []  # DRAIN reports the unfinished requests
    kv = d.final.kv
    out: list[Violation] = []
    if len(kv.free_block_ids) != kv.num_blocks:
        out.append(
            Violation(
                "NO-LEAK",
                "blocks not free after everything finished",
                None,
                None,
                kv.num_blocks,
                len(kv.free_block_ids),
            )
        )
    for block, ref in enumerate(kv.ref_counts):
        if ref:
            out.append(Violation("NO-LEAK", f"ref count {ref} with nothing live", None, block))
    return out
