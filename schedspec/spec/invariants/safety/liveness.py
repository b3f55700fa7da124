"""Liveness: the waiting head is not passed over for long while nothing runs (PROGRESS,
checked on every schedule() with the run's recent history), and, at the end of a drain
with no arrivals, everything finishes and frees (DRAIN, NO-LEAK)."""

from __future__ import annotations

from schedspec.spec.config import SchedulerConfig
from schedspec.spec.invariants.registry import Violation, invariant
from schedspec.spec.invariants.transitions import DrainResult, PassedOver, ScheduleTransition
from schedspec.spec.invariants.vllm.reorder import waiting_phase_queue


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


def progress_step_bound(config: SchedulerConfig) -> int:
    """How many schedule() calls may pass over one waiting head while nothing runs
    (docs/SPEC.md, "PROGRESS"). With nothing running the head fits the empty cache and
    the budget, so a synchronous step admits it: none. Under async scheduling the head
    may be a preempted request whose stale output is still in flight (STALE-HOLD): the
    step that waits for it schedules nothing, so the engine core lands the step in
    flight (pipeline.BatchQueue), and the next step finds the head's output landed: one.
    A request waiting on KV from elsewhere (vLLM's WAITING_FOR_REMOTE_KVS) would add the
    steps its transfer may take; the model has no such state (no KV connector)."""
    return int(config.async_scheduling)


def passed_over_head(t: ScheduleTransition) -> str | None:
    """The waiting head, if this schedule() passed it over while nothing ran: the step
    began with no request running and one waiting, and the head (of the queue as the
    step's admissions work through it, after cache-aware admission's reorder) is neither
    scheduled in it nor gone after it (refused at schedule time, or finished)."""
    if t.pre.running or not t.pre.waiting:
        return None
    # Every waiting request is ready to run: the model has no request waiting on KV
    # from elsewhere (no KV connector). With one, the head is the first ready request,
    # and a parked one is passed over by right (docs/SPEC.md, "PROGRESS").
    head = waiting_phase_queue(t)[0]
    if head in t.output.num_scheduled_tokens or head not in t.post.requests:
        return None
    return head


def _times_passed_over(t: ScheduleTransition, head: str) -> int:
    """How often steps before this one passed over this very head (same id, same
    incarnation) while nothing ran, by the history the harness keeps."""
    earlier = t.head_passed_over
    if earlier is None or earlier.request_id != head:
        return 0
    return earlier.times if t.pre.requests[head].arrival == earlier.arrival else 0


def passed_over_after(t: ScheduleTransition) -> PassedOver | None:
    """The history to hand the next schedule(): this step's head and how often it has
    now been passed over, while nothing ran; a step that schedules or drops the head
    forgets it, and steps in which something ran keep it (the head must not be passed
    over again the next time nothing runs)."""
    head = passed_over_head(t)
    if head is not None:
        arrival = t.pre.requests[head].arrival
        return PassedOver(head, arrival, _times_passed_over(t, head) + 1)
    kept = t.head_passed_over
    if kept is None:
        return None
    request = t.post.requests.get(kept.request_id)
    if request is None or request.arrival != kept.arrival:
        return None  # gone (refused, finished or aborted), or another under its id
    if kept.request_id in t.output.num_scheduled_tokens:
        return None  # scheduled at last
    return kept


@invariant(
    "PROGRESS",
    "schedule",
    "safety",
    "While nothing runs, a schedule() call admits the waiting head or refuses it: at most "
    "progress_step_bound (0, or 1 under async scheduling) calls pass over one head while "
    "nothing runs before it is scheduled or leaves.",
)
def check_progress(t: ScheduleTransition) -> list[Violation]:
    head = passed_over_head(t)
    if head is None:
        return []
    times = _times_passed_over(t, head) + 1
    bound = progress_step_bound(t.pre.config)
    if times <= bound:
        return []
    return [
        Violation(
            "PROGRESS",
            f"the waiting head was passed over in {times} steps with nothing running",
            head,
            None,
            bound,
            times,
        )
    ]


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
