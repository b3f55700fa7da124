"""Cache-aware admission (vLLM 0.34.0): what its reorder may move, and in which order.

The restated SCHEDULE-ORDER and QUEUE-ORDER hold an engine to the exact queue the
reorder leaves (vllm/reorder.py). These two say which rule it broke when it does not:
CACHE-AWARE-KEEP that a request took another's place where it may not, CACHE-AWARE-ORDER
that the requests that may move are in the wrong order. Both read the queue the step's
waiting phase saw (`seen_queue`) from what the step shows: the admissions, in
scheduling order, then the queue left after the step.
"""

from __future__ import annotations

from schedspec.spec.invariants.registry import Violation, invariant
from schedspec.spec.invariants.safety.connector import stands_aside_for_connector
from schedspec.spec.invariants.transitions import ScheduleTransition
from schedspec.spec.invariants.vllm.reorder import OFF, WaitingPhase, may_move, waiting_phase
from schedspec.spec.state import RequestState


def seen_queue(t: ScheduleTransition) -> list[str] | None:
    """The pre-step queue in the order the step's waiting phase worked through it, as far
    as the step shows it; None when requests went missing (QUEUES reports that).

    Admissions take the head of that queue, skipping only requests that wait for stale
    output, which keep their places: so an admissible request left waiting stood after
    every admission, and one waiting for stale output stood where it stands in the queue
    left, among as many admissions ahead of it as its own place allows (where it stood
    against them cannot be seen; taken to be its place, which it must keep)."""
    found = t.__dict__.get(_MEMO)
    if found is None:
        found = _seen_queue(t)
        object.__setattr__(t, _MEMO, found)  # a frozen record: its own cache, nothing else
    return found or None


# seen_queue's cache on the transition ([] for None): both predicates read it.
_MEMO = "_seen_queue"


def _seen_queue(t: ScheduleTransition) -> list[str]:
    queue = t.pre.waiting
    place = {rid: i for i, rid in enumerate(queue)}
    admitted = [r for r in t.output.num_scheduled_tokens if r in t.admitted_ids and r in place]
    left = [r for r in t.post.waiting if r in place]
    if len(admitted) + len(left) != len(queue):
        return []
    seen: list[str] = []
    pending = iter(admitted)
    for rid in left:
        if t.pre.requests[rid].awaits_stale_output:
            while len(seen) < place[rid] and (ahead := next(pending, None)) is not None:
                seen.append(ahead)
        else:
            seen.extend(pending)
        seen.append(rid)
    seen.extend(pending)
    return seen


def _why_fixed(phase: WaitingPhase, request: RequestState, position: int, window: int) -> str:
    if phase.skipped == OFF:
        return f"the reorder does not run ({OFF})"
    if position >= window:
        return f"it is past the window of {window}"
    if not may_move(request):
        return "it is not a plain waiting request with nothing computed"
    return f"the reorder does not run ({phase.skipped})"


@invariant(
    "CACHE-AWARE-KEEP",
    "schedule",
    "vllm-v1",
    "With a cache-aware admission window, only plain waiting requests (never run, nothing "
    "computed) among the first window ones of the queue trade places, and only when the "
    "reorder runs: fcfs with prefix caching, no preemption in the step, two or more "
    "waiting, KV usage at the start of the waiting phase at or above the threshold. Every "
    "other request keeps its exact place in the queue (vLLM lets a moving request jump "
    "over it).",
    groups="single",
)
@stands_aside_for_connector
def check_cache_aware_keep(t: ScheduleTransition) -> list[Violation]:
    config = t.pre.config
    if not config.cache_aware_admission_window:
        return []  # nothing may move: QUEUE-ORDER and SCHEDULE-ORDER state the order
    seen = seen_queue(t)
    if seen is None:
        return []
    phase = waiting_phase(t)
    movable = set(phase.slots)
    for position, rid in enumerate(t.pre.waiting):
        if position in movable or seen[position] == rid:
            continue
        why = _why_fixed(phase, t.pre.requests[rid], position, config.cache_aware_admission_window)
        return [
            Violation(
                "CACHE-AWARE-KEEP",
                f"place {position} of the queue went to {seen[position]!r}, but {rid!r} "
                f"may not leave it: {why}",
                rid,
                None,
                expected=list(t.pre.waiting),
                actual=seen,
            )
        ]
    return []


@invariant(
    "CACHE-AWARE-ORDER",
    "schedule",
    "vllm-v1",
    "When the cache-aware reorder runs, the plain waiting requests among the first window "
    "ones of the queue take their own places deepest cached prefix first (the tokens a "
    "prefix-cache lookup would hit at the start of the waiting phase, never the last), "
    "queue position breaking ties.",
    groups="single",
)
@stands_aside_for_connector
def check_cache_aware_order(t: ScheduleTransition) -> list[Violation]:
    if not t.pre.config.cache_aware_admission_window:
        return []
    phase = waiting_phase(t)
    seen = seen_queue(t)
    if phase.skipped or seen is None:
        return []
    queue = t.pre.waiting
    depth = phase.cached_tokens
    due = [queue[i] for i in sorted(phase.slots, key=lambda i: (-depth[queue[i]], i))]
    moved = set(due)
    order = [rid for rid in seen if rid in moved]
    if order == due:
        return []
    first = next(i for i, (a, b) in enumerate(zip(order, due, strict=True)) if a != b)
    went, owed = order[first], due[first]
    return [
        Violation(
            "CACHE-AWARE-ORDER",
            f"{went!r} ({depth[went]} cached tokens) went ahead of {owed!r} "
            f"({depth[owed]} cached tokens)",
            went,
            None,
            expected=due,
            actual=order,
        )
    ]
