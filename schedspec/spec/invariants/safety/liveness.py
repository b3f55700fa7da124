"""Liveness: the waiting head is not passed over for long while nothing runs (PROGRESS,
checked on every schedule() with the run's recent history), and, at the end of a drain
with no arrivals, everything finishes and frees (DRAIN, NO-LEAK)."""

from __future__ import annotations

from schedspec.spec.config import SchedulerConfig, smallest_pool
from schedspec.spec.invariants.registry import Violation, invariant
from schedspec.spec.invariants.transitions import DrainResult, PassedOver, ScheduleTransition
from schedspec.spec.invariants.vllm.reorder import waiting_phase_queue


def drain_step_bound(
    config: SchedulerConfig, num_unfinished: int, max_unready_queries: int = 0
) -> int:
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

    With a KV connector the drain's worker reports every transfer at the first landing,
    and a load is promoted by the next schedule(): two steps more (three under async
    scheduling, which lands a step later), after a connector lookup that answers "not
    ready" for up to max_unready_queries steps.
    """
    pipelined_drafts = config.async_scheduling and config.num_speculative_tokens > 0
    steps_per_token = 2 if pipelined_drafts else 1
    connector_steps = (
        max_unready_queries + 2 + int(config.async_scheduling) if config.kv_connector else 0
    )
    return (
        num_unfinished * config.max_model_len * steps_per_token
        + 1
        + int(config.async_scheduling)
        + connector_steps
    )


def progress_step_bound(config: SchedulerConfig) -> int:
    """How many schedule() calls may pass over one waiting head while nothing runs
    (docs/SPEC.md, "PROGRESS"). With nothing running the head fits the empty cache and
    the budget, so a synchronous step admits it: none. Under async scheduling the head
    may be a preempted request whose stale output is still in flight (STALE-HOLD): the
    step that waits for it schedules nothing, so the engine core lands the step in
    flight (pipeline.BatchQueue), and the next step finds the head's output landed: one.
    A request whose KV connector lookup is not ready may be passed over once per step
    until it is (its RemoteKV's num_unready_queries): the caller adds those; a parked
    load still loading is passed over by right (passed_over_head)."""
    return int(config.async_scheduling)


def passed_over_head(t: ScheduleTransition) -> str | None:
    """The waiting head, if this schedule() passed it over while nothing ran: the step
    began with no request running and one waiting, and the head (of the queue as the
    step's admissions work through it, after cache-aware admission's reorder) is neither
    scheduled in it nor gone after it (refused at schedule time, or finished), and
    neither is the head of the queue before that reorder."""
    if t.pre.running or not t.pre.waiting:
        return None
    head = waiting_phase_queue(t)[0]
    if _served_or_gone(t, head):
        return None
    # Cache-aware admission's reorder is a choice of vllm-v1's profile (CACHE-AWARE-ORDER
    # and CACHE-AWARE-KEEP hold an engine to it), not a condition of progress: an
    # engine that claims safety only may admit the queue's own head instead (vLLM 0.33.0
    # under a config with a window, which it has no knob for), and that is no stall.
    if _served_or_gone(t, t.pre.waiting[0]):
        return None
    if connector_excuses(t):
        return None
    return head


def _served_or_gone(t: ScheduleTransition, request_id: str) -> bool:
    """Scheduled in the step, or gone from the state after it."""
    return request_id in t.output.num_scheduled_tokens or request_id not in t.post.requests


def connector_excuses(t: ScheduleTransition) -> bool:
    """May a KV connector hold the head back by right (docs/SPEC.md, "PROGRESS")? While a
    load is in flight its blocks, its reservation and its place under
    max_num_inflight_kv_loads hold until the worker reports; blocks held for a send are
    beyond the scheduler's reach; and a step that parked a load made progress. Once every
    load has reported and no send is pending, the head is judged like any other: two
    loads that are in and wait for each other's blocks (vLLM #45388) are caught."""
    for state in (t.pre, t.post):
        connector = state.connector
        if connector is None:
            return False
        if connector.held or "loading" in connector.loads.values():
            return True
    # The connector's lookups and the async-load queue reorder admissions: a step that
    # admitted someone made progress.
    return bool(t.output.num_scheduled_tokens)


def head_bound(t: ScheduleTransition, head: str) -> int:
    """progress_step_bound, plus the steps the head's connector lookup is not ready."""
    remote = t.pre.requests[head].remote_kv
    unready = remote.num_unready_queries if remote is not None else 0
    return progress_step_bound(t.pre.config) + unready


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
    bound = head_bound(t, head)
    if times <= bound:
        return []
    return [
        Violation(
            "PROGRESS",
            f"the waiting head was passed over in {times} steps with nothing running",
            head,
            None,
            expected=bound,
            actual=times,
        )
    ]


@invariant(
    "DRAIN",
    "drain",
    "safety",
    "With no new arrivals, every unfinished request finishes within "
    "num_unfinished * max_model_len + 1 steps (each token may take two under async "
    "scheduling with drafts; one more step lands the last output in flight; a KV "
    "connector adds its lookups and one report and promotion), unless blocks held for "
    "sends the worker never reports leave less than a max_model_len request's blocks.",
)
def check_drain(d: DrainResult) -> list[Violation]:
    if not d.final.requests and d.num_steps <= d.step_bound:
        return []
    if stalled_by_lost_sends(d):
        return []
    return [
        Violation(
            "DRAIN",
            f"{len(d.final.requests)} requests unfinished after {d.num_steps} steps",
            None,
            None,
            expected=d.step_bound,
            actual=d.num_steps,
        )
    ]


def stalled_by_lost_sends(d: DrainResult) -> bool:
    """Do blocks held for sends that the worker never reports leave the pool smaller than
    the config may be (smallest_pool: a max_model_len request's blocks, or with drafts an
    async load's beside a verify step's)? Then a request may wait for ever, and rightly: nothing
    in the scheduler can take those blocks back (upstream's open question, vLLM #46283's
    class). Otherwise the drain's bound stands: every request fits what is left."""
    connector = d.final.connector
    if connector is None:
        return False
    lost = {
        block
        for rid, held in connector.held.items()
        if rid in d.unreported_sends
        for block in held.block_ids
    }
    config = d.final.config
    return bool(lost) and config.num_blocks - len(lost) < smallest_pool(config)


@invariant(
    "NO-LEAK",
    "drain",
    "safety",
    "Once every request has finished or been aborted, every block is free with ref count 0, "
    "but those the KV connector holds for a send its worker never reports.",
)
def check_no_leak(d: DrainResult) -> list[Violation]:
    if d.final.requests:
        return []  # DRAIN reports the unfinished requests
    kv = d.final.kv
    out: list[Violation] = []
    kept: set[int] = set()
    if d.final.connector is not None:
        for rid, held in d.final.connector.held.items():
            if rid in d.unreported_sends:
                kept.update(held.block_ids)
            else:
                out.append(
                    Violation(
                        "NO-LEAK",
                        f"still held for the connector ({held.reason})",
                        rid,
                        expected="released",
                        actual=held.block_ids,
                    )
                )
    if kept:
        leaked = [b for b, ref in enumerate(kv.ref_counts) if ref and b not in kept]
        for block in leaked:
            out.append(
                Violation(
                    "NO-LEAK",
                    "held with nothing live",
                    None,
                    block,
                    expected="ref count 0",
                    actual=kv.ref_counts[block],
                )
            )
        return out
    if len(kv.free_block_ids) != kv.num_blocks:
        out.append(
            Violation(
                "NO-LEAK",
                "blocks not free after everything finished",
                None,
                None,
                expected=kv.num_blocks,
                actual=len(kv.free_block_ids),
            )
        )
    for block, ref in enumerate(kv.ref_counts):
        if ref:
            out.append(
                Violation(
                    "NO-LEAK",
                    f"ref count {ref} with nothing live",
                    None,
                    block,
                    expected=0,
                    actual=ref,
                )
            )
    return out
