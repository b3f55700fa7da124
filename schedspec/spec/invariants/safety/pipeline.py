"""Safety invariants of the pipeline: what is in flight, and what its output may do.

With async scheduling (vLLM's default) step N+1 is scheduled before step N's
output is applied. Per request the state says what is in flight
(num_in_flight_tokens), how many output positions the in-flight sampling
steps stand for (num_output_placeholders), and how much of what is in flight
predates a preemption (num_stale_output_tokens). A synchronous engine has
one step in flight only between schedule() and update_from_output(), and no
placeholders or stale output ever. docs/SPEC.md, "Async scheduling", states
the semantics these predicates hold engines to.
"""

from __future__ import annotations

from schedspec.spec.invariants.registry import (
    FieldCheck,
    Violation,
    field_violations,
    invariant,
    outputs_changed,
)
from schedspec.spec.invariants.safety.connector import ended_by_failed_load
from schedspec.spec.invariants.transitions import ScheduleTransition, UpdateTransition
from schedspec.spec.request import PLACEHOLDER_TOKEN_ID, RequestStatus
from schedspec.spec.state import RequestState, State


@invariant(
    "PIPELINE",
    "state",
    "safety",
    "The pipeline counters are consistent: in-flight tokens, placeholders and stale tokens "
    "are >= 0, placeholders and stale tokens never exceed the tokens in flight, and all are "
    "0 on an idle request; a WAITING request has nothing in flight, a PREEMPTED one has no "
    "placeholders and all its in-flight tokens stale, a RUNNING one none stale; a running "
    "request's confirmed computed tokens (computed - in flight) stop short of its last "
    "known token; a prefill chunk has no output in flight; without async scheduling there "
    "are no placeholders, stale output or placeholder drafts (with it a request's drafts are "
    "all placeholders or none); stale output is marked to be dropped only while some is in "
    "flight (vllm-v1's STALE-KEPT: never).",
)
def check_pipeline(state: State) -> list[Violation]:
    async_scheduling = state.config.async_scheduling
    out: list[Violation] = []
    for rid, request in state.requests.items():
        out.extend(_pipeline_violations(rid, request, async_scheduling))
    return out


def _pipeline_violations(
    rid: str, request: RequestState, async_scheduling: bool
) -> list[Violation]:
    in_flight = request.num_in_flight_tokens
    placeholders = request.num_output_placeholders
    stale = request.num_stale_output_tokens
    counters = (in_flight, placeholders, stale)
    if min(counters) < 0:
        return [
            Violation(
                "PIPELINE",
                f"negative counter (in flight, placeholders, stale) {counters}",
                rid,
                expected="all >= 0",
                actual=counters,
            )
        ]
    # (message, expected, actual) of each broken clause.
    problems: list[tuple[str, object, object]] = []
    if placeholders > in_flight or stale > in_flight:
        problems.append(
            (
                f"placeholders {placeholders} or stale {stale} over in flight {in_flight}",
                f"placeholders, stale <= {in_flight}",
                (placeholders, stale),
            )
        )
    if not async_scheduling and (placeholders or stale):
        problems.append(
            (
                "placeholders or stale output without async scheduling",
                (0, 0),
                (placeholders, stale),
            )
        )
    if request.drop_stale_output and not stale:
        problems.append(
            ("marked to drop stale output with none in flight", "stale tokens > 0", stale)
        )
    drafts = request.spec_token_ids
    if PLACEHOLDER_TOKEN_ID in drafts and (
        not async_scheduling or any(d != PLACEHOLDER_TOKEN_ID for d in drafts)
    ):
        problems.append(
            (
                f"placeholder drafts {drafts} outside async scheduling, or mixed",
                "all placeholders, under async scheduling" if async_scheduling else "real drafts",
                drafts,
            )
        )
    status = request.status
    if status is RequestStatus.WAITING and in_flight:
        problems.append((f"WAITING with {in_flight} tokens in flight", 0, in_flight))
    elif status is RequestStatus.PREEMPTED and (placeholders or stale != in_flight):
        problems.append(
            (
                f"PREEMPTED with {placeholders} placeholders and {stale} of {in_flight} "
                "in-flight tokens stale",
                (0, in_flight),
                (placeholders, stale),
            )
        )
    elif status is RequestStatus.RUNNING:
        confirmed = request.num_computed_tokens - in_flight
        if stale:
            problems.append((f"RUNNING with {stale} stale tokens in flight", 0, stale))
        if not 0 <= confirmed <= request.num_tokens - 1:
            problems.append(
                (
                    f"confirmed computed tokens {confirmed} outside [0, {request.num_tokens - 1}]",
                    f"0 <= confirmed <= {request.num_tokens - 1}",
                    confirmed,
                )
            )
        if request.is_prefill_chunk and placeholders:
            problems.append(("a prefill chunk with output placeholders", 0, placeholders))
    return [
        Violation("PIPELINE", message, rid, expected=expected, actual=actual)
        for message, expected, actual in problems
    ]


@invariant(
    "MAX-TOKENS",
    "schedule",
    "safety",
    "A request whose in-flight sampling step is sure to bring it to max_tokens (all its "
    "drafts rejected still counted) is not scheduled again: that step could only compute a "
    "position past max_tokens (vLLM PR #27922).",
)
def check_max_tokens(t: ScheduleTransition) -> list[Violation]:
    out: list[Violation] = []
    for rid in t.output.num_scheduled_tokens:
        pre = t.pre.requests.get(rid)
        if pre is not None and pre.status is RequestStatus.RUNNING and pre.sure_to_reach_max_tokens:
            out.append(
                Violation(
                    "MAX-TOKENS",
                    "scheduled although its in-flight step reaches max_tokens",
                    rid,
                    None,
                    expected=f"not scheduled (in flight reaches max_tokens {pre.max_tokens})",
                    actual=f"{t.output.num_scheduled_tokens[rid]} token(s) scheduled",
                )
            )
    return out


@invariant(
    "STALE-HOLD",
    "schedule",
    "safety",
    "A preempted request is not resumed while output from before its preemption is still in "
    "flight: that output will fill the position the resumed step would compute again, and "
    "its token would be delivered twice.",
)
def check_stale_hold(t: ScheduleTransition) -> list[Violation]:
    out: list[Violation] = []
    for cached in t.output.scheduled_cached_reqs:
        pre = t.pre.requests.get(cached.request_id)
        if cached.resumed and pre is not None and pre.awaits_stale_output:
            out.append(
                Violation(
                    "STALE-HOLD",
                    f"resumed with {pre.num_stale_output_tokens} stale tokens in flight",
                    cached.request_id,
                    expected="resumed once its stale output is in",
                    actual=pre.num_stale_output_tokens,
                )
            )
    return out


@invariant(
    "SCHEDULE-PIPELINE",
    "schedule",
    "safety",
    "schedule() puts each scheduled step in flight: in-flight tokens grow by the tokens "
    "scheduled, and nothing else in flight moves except a preemption's reset; the step is "
    "a prefill chunk exactly when it stops short of the known tokens and in-flight outputs "
    "(it samples nothing); with async scheduling a step that samples adds 1 + its drafts "
    "as output placeholders and leaves num_speculative_tokens placeholder drafts.",
)
def check_schedule_pipeline(t: ScheduleTransition) -> list[Violation]:
    config = t.post.config
    scheduled = t.output.num_scheduled_tokens
    drafts = t.output.scheduled_spec_decode_tokens
    out: list[Violation] = []
    for rid, post in t.post.requests.items():
        pre = t.pre.requests.get(rid)
        if pre is None or rid in t.output.preempted_req_ids:
            continue  # MONOTONE / PREEMPT-RESET
        if pre is post and rid not in scheduled:
            continue  # the very record, of a request the step did not run: all kept
        num = scheduled.get(rid, 0)
        expected_in_flight = pre.num_in_flight_tokens + num
        if post.num_in_flight_tokens != expected_in_flight:
            out.append(
                Violation(
                    "SCHEDULE-PIPELINE",
                    "in-flight tokens",
                    rid,
                    None,
                    expected=expected_in_flight,
                    actual=post.num_in_flight_tokens,
                )
            )
        if rid not in scheduled:
            if (
                post.num_output_placeholders == pre.num_output_placeholders
                and post.num_stale_output_tokens == pre.num_stale_output_tokens
            ):
                continue  # the common case, without building the field checks
            out += field_violations(
                "SCHEDULE-PIPELINE",
                "counters of an unscheduled request",
                rid,
                [
                    FieldCheck(
                        "num_output_placeholders",
                        pre.num_output_placeholders,
                        post.num_output_placeholders,
                    ),
                    FieldCheck(
                        "num_stale_output_tokens",
                        pre.num_stale_output_tokens,
                        post.num_stale_output_tokens,
                    ),
                ],
            )
            continue
        chunk = post.num_computed_tokens < pre.num_tokens + pre.num_output_placeholders
        if post.is_prefill_chunk != chunk:
            out.append(
                Violation(
                    "SCHEDULE-PIPELINE",
                    "prefill-chunk flag",
                    rid,
                    None,
                    expected=chunk,
                    actual=post.is_prefill_chunk,
                )
            )
        added = 0
        if config.async_scheduling and not chunk:
            added = 1 + len(drafts.get(rid, ()))
        expected_placeholders = pre.num_output_placeholders + added
        if post.num_output_placeholders != expected_placeholders:
            out.append(
                Violation(
                    "SCHEDULE-PIPELINE",
                    "output placeholders",
                    rid,
                    None,
                    expected=expected_placeholders,
                    actual=post.num_output_placeholders,
                )
            )
    return out


@invariant(
    "UPDATE-PIPELINE",
    "update",
    "safety",
    "update_from_output lands the step: each live scheduled request's in-flight tokens (and "
    "stale ones, for output that predates a preemption) fall by the tokens scheduled; a "
    "sampling step's output resolves its 1 + drafts placeholders unless stale; stale output "
    "moves neither placeholders nor num_computed_tokens.",
)
def check_update_pipeline(t: UpdateTransition) -> list[Violation]:
    scheduled = t.output.num_scheduled_tokens
    out: list[Violation] = []
    for rid, post in t.post.requests.items():
        pre = t.pre.requests.get(rid)
        if pre is None or (pre is post and rid not in scheduled):
            # ROLLBACK reports a request that appeared; the very record, of a request
            # the step did not run, kept its counters.
            continue
        mine = t.scheduled_for(pre)
        num = scheduled[rid] if mine else 0
        stale = t.is_stale(pre)
        expected = (
            pre.num_in_flight_tokens - num,
            pre.num_stale_output_tokens - num if stale else pre.num_stale_output_tokens,
            pre.num_output_placeholders - _resolved(t, rid, pre, mine, stale),
        )
        actual = (
            post.num_in_flight_tokens,
            post.num_stale_output_tokens,
            post.num_output_placeholders,
        )
        if actual != expected:
            out.append(
                Violation(
                    "UPDATE-PIPELINE",
                    "(in flight, stale, placeholders) after the output",
                    rid,
                    None,
                    expected=expected,
                    actual=actual,
                )
            )
    return out


def _resolved(t: UpdateTransition, rid: str, pre: RequestState, mine: bool, stale: bool) -> int:
    """Placeholders a step's output resolves: 1 + its drafts, for a sampling step (`mine`:
    t.scheduled_for(pre), which the caller has already asked)."""
    sampled = t.model_output.sampled_token_ids.get(rid, ())
    if not mine or stale or not sampled or pre.num_output_placeholders == 0:
        return 0
    return 1 + len(t.output.scheduled_spec_decode_tokens.get(rid, ()))


@invariant(
    "DELIVERY",
    "update",
    "safety",
    "A step's output goes only to the request it was scheduled for (not a later request "
    "that reuses an aborted id), and lands at the position it was sampled for: no token is "
    "delivered twice, skipped, or out of order.",
)
def check_delivery(t: UpdateTransition) -> list[Violation]:
    out: list[Violation] = []
    scheduled = t.output.num_scheduled_tokens
    for rid, pre in t.pre.requests.items():
        post = t.post.requests.get(rid)
        if post is pre and rid not in scheduled:
            continue  # the very record, of a request the step did not run: outputs kept
        if not t.scheduled_for(pre):
            if post is None and ended_by_failed_load(t, rid):
                continue
            if post is None or post.output_token_ids != pre.output_token_ids:
                out.append(
                    outputs_changed(
                        "DELIVERY",
                        "output of a step not scheduled for this request was applied to it",
                        pre,
                        post,
                    )
                )
            continue
        position = t.sampled_at.get(rid)
        if position is not None and position != pre.num_tokens:
            out.append(
                Violation(
                    "DELIVERY",
                    "sampled tokens land at another position than they were sampled for",
                    rid,
                    None,
                    expected=position,
                    actual=pre.num_tokens,
                )
            )
    return out


@invariant(
    "NO-OUTPUT-AFTER-ABORT",
    "update",
    "safety",
    "update_from_output reports output only for a request that is live when the output "
    "lands and that the step was scheduled for: a request aborted while its step ran (or "
    "an id reused since) is told nothing more.",
)
def check_no_output_after_abort(t: UpdateTransition) -> list[Violation]:
    if not t.request_outputs:
        return []
    out: list[Violation] = []
    for rid in t.request_outputs:
        if rid not in t.output.num_scheduled_tokens:
            continue  # not this step's request: STOP and ROLLBACK judge such reports
        pre = t.pre.requests.get(rid)
        if pre is None:
            out.append(
                Violation(
                    "NO-OUTPUT-AFTER-ABORT",
                    "output reported for a finished request",
                    rid,
                    expected="no output",
                    actual=t.request_outputs[rid],
                )
            )
        elif not t.scheduled_for(pre):
            out.append(
                Violation(
                    "NO-OUTPUT-AFTER-ABORT",
                    "output of an aborted request reported to the request that reuses its id",
                    rid,
                    expected="no output",
                    actual=t.request_outputs[rid],
                )
            )
    return out


@invariant(
    "CACHE-CONFIRMED",
    "update",
    "safety",
    "update_from_output registers in the prefix cache only blocks whose KV has landed: full "
    "blocks within the holder's confirmed computed tokens (computed - in flight) and known "
    "tokens.",
    groups="single",
)
def check_cache_confirmed(t: UpdateTransition) -> list[Violation]:
    bs = t.post.config.block_size
    pre_hashes = t.pre.kv.block_hashes
    hashes = t.post.kv.block_hashes
    out: list[Violation] = []
    if hashes == pre_hashes:
        return out  # the step registered nothing (most steps)
    for rid, post in t.post.requests.items():
        landed = min(post.num_computed_tokens - post.num_in_flight_tokens, post.num_tokens)
        for index, block in enumerate(post.block_ids):
            if not 0 <= block < min(len(hashes), len(pre_hashes)):
                continue  # CONSERVATION reports ids out of range
            fresh = hashes[block] is not None and hashes[block] != pre_hashes[block]
            if fresh and (index + 1) * bs > landed:
                out.append(
                    Violation(
                        "CACHE-CONFIRMED",
                        f"block at index {index} registered before its KV landed",
                        rid,
                        block,
                        expected=landed,
                        actual=(index + 1) * bs,
                    )
                )
    return out
