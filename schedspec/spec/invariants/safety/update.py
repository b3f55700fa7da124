"""Safety invariants of update_from_output() and finish_requests()."""

from __future__ import annotations

from dataclasses import replace
from operator import attrgetter

from schedspec.spec.config import SchedulerConfig
from schedspec.spec.invariants.registry import (
    Violation,
    changed_fields,
    field_violations,
    invariant,
    outputs_changed,
    still_live,
)
from schedspec.spec.invariants.safety.connector import ended_by_failed_load, is_load
from schedspec.spec.invariants.transitions import AbortTransition, UpdateTransition
from schedspec.spec.outputs import RequestOutput
from schedspec.spec.request import RequestStatus, sglang_max_new_tokens
from schedspec.spec.state import RequestState


def expected_kept(request: RequestState, sampled: tuple[int, ...], max_model_len: int) -> int:
    """How many sampled tokens the stop rule keeps, and so whether the request stops.

    Tokens are appended one at a time; the first that is EOS or a stop token,
    or that brings the request to max_tokens or max_model_len, is the last
    one kept. Returns len(sampled) + 1 when no token stops the request.
    """
    stops = set(request.stop_token_ids)
    if request.eos_token_id is not None:
        stops.add(request.eos_token_id)
    outputs = len(request.output_token_ids)
    tokens = request.num_tokens
    for kept, token in enumerate(sampled, 1):
        if token in stops or outputs + kept >= request.max_tokens or tokens + kept >= max_model_len:
            return kept
    return len(sampled) + 1


@invariant(
    "STOP",
    "update",
    "safety",
    "Sampled tokens are appended in order up to the first stop (EOS, stop token, max_tokens, "
    "max_model_len); a request stops exactly then, tokens past the stop are dropped, and it "
    "never emits more than max_tokens tokens; stale output marked to be dropped changes "
    "nothing; a request with an abort pending stops at the "
    "end of the step that lands (ABORTED, or what a stop in it says); what the engine reports "
    "per request (kept tokens, finish status: STOPPED for EOS or a stop token, else "
    "LENGTH_CAPPED) says so; nothing past the length cap (SGLang's clipped "
    "max_new_tokens, which may be 0) is delivered, and a stop past it is LENGTH_CAPPED.",
)
def check_stop(t: UpdateTransition) -> list[Violation]:
    max_model_len = t.post.config.max_model_len
    scheduled = t.output.num_scheduled_tokens
    out: list[Violation] = []
    for rid, pre in t.pre.requests.items():
        post = t.post.requests.get(rid)
        if post is pre and rid not in scheduled:
            continue  # the very record, of a request the step did not run: all kept
        sampled = tuple(t.model_output.sampled_token_ids.get(rid, ()))
        if not t.scheduled_for(pre) or not sampled:
            if post is None:
                if not ended_by_failed_load(t, rid):
                    out.append(
                        Violation(
                            "STOP",
                            "finished without sampling",
                            rid,
                            expected="live",
                            actual="finished",
                        )
                    )
            elif post.output_token_ids != pre.output_token_ids:
                out.append(
                    Violation(
                        "STOP",
                        "outputs changed without sampling",
                        rid,
                        expected=pre.output_token_ids,
                        actual=post.output_token_ids,
                    )
                )
            continue
        if t.is_stale(pre) and pre.drop_stale_output:
            # Output of a step from before a preemption, which this engine drops.
            if post is None or post.output_token_ids != pre.output_token_ids:
                out.append(
                    outputs_changed("STOP", "stale output marked to be dropped was kept", pre, post)
                )
            continue
        natural = expected_kept(pre, sampled, max_model_len)
        # A pending abort ends the request with this step's tokens at the latest.
        kept = min(natural, len(sampled)) if pre.abort_pending else natural
        if t.request_outputs is not None:
            cap = length_cap(t.post.config, pre)
            out.extend(_check_reported(t.request_outputs.get(rid), pre, sampled, natural, cap))
        if kept <= len(sampled):
            if post is not None:
                out.append(
                    Violation(
                        "STOP",
                        f"still live after stop token {kept} of {len(sampled)}",
                        rid,
                        expected="finished",
                        actual=post.status.name,
                    )
                )
            continue
        if post is None:
            out.append(
                Violation(
                    "STOP",
                    "finished with no stop condition met",
                    rid,
                    expected="live",
                    actual="finished",
                )
            )
        elif post.output_token_ids != pre.output_token_ids + sampled:
            out.append(
                Violation(
                    "STOP",
                    "outputs are not the old ones plus the sampled tokens",
                    rid,
                    None,
                    expected=pre.output_token_ids + sampled,
                    actual=post.output_token_ids,
                )
            )
    return out


def length_cap(config: SchedulerConfig, request: RequestState) -> int:
    """The output count a stop token may not lie past. vLLM: max_tokens. SGLang: its
    clipped max_new_tokens, which may be 0 where the state's max_tokens is 1 (one token
    is always sampled); recomputing the clip from the state's max_tokens gives it back,
    as the clip of a clipped value changes nothing unless the bound is below 1."""
    if config.family == "sglang":
        return sglang_max_new_tokens(config, len(request.prompt_token_ids), request.max_tokens)
    return request.max_tokens


def _check_reported(
    reported: RequestOutput | None,
    pre: RequestState,
    sampled: tuple[int, ...],
    kept: int,
    cap: int,
) -> list[Violation]:
    """The engine's own report of a sampling request: the kept tokens and why it finished.
    Nothing past the length cap is delivered, and a stop token past it is a length
    finish (SGLang: a request whose max_new_tokens is clipped to 0 samples one token,
    finishes, and delivers nothing)."""
    rid = pre.request_id
    if reported is None:
        return [
            Violation(
                "STOP",
                "no output reported for a request that sampled",
                rid,
                expected=f"an output with {len(sampled)} sampled token(s)",
                actual="no output",
            )
        ]
    stopped = kept <= len(sampled)
    expected_tokens = sampled[:kept] if stopped else sampled
    expected_status: RequestStatus | None = None
    if pre.abort_pending:
        # Deferred abort: reported aborted, though a stop in the same step may say why.
        expected_status = RequestStatus.FINISHED_ABORTED
    if stopped:
        last = sampled[kept - 1]
        is_stop_token = last == pre.eos_token_id or last in pre.stop_token_ids
        expected_status = (
            RequestStatus.FINISHED_STOPPED
            if is_stop_token
            else RequestStatus.FINISHED_LENGTH_CAPPED
        )
        # Nothing is delivered past the cap; a stop token past it is a length finish. A
        # pending abort finishes first (SGLang's to_finish), and sets no cap on delivery.
        room = max(0, cap - len(pre.output_token_ids))
        if kept > room and not pre.abort_pending:
            expected_tokens = sampled[:room]
            expected_status = RequestStatus.FINISHED_LENGTH_CAPPED
    out: list[Violation] = []
    if tuple(reported.new_token_ids) != expected_tokens:
        out.append(
            Violation(
                "STOP",
                "reported tokens are not the sampled ones up to the stop",
                rid,
                None,
                expected=expected_tokens,
                actual=tuple(reported.new_token_ids),
            )
        )
    if reported.finish_status is not expected_status and not (
        pre.abort_pending and reported.finish_status is RequestStatus.FINISHED_ABORTED
    ):
        out.append(
            Violation(
                "STOP",
                "reported finish status",
                rid,
                None,
                expected=expected_status,
                actual=reported.finish_status,
            )
        )
    return out


@invariant(
    "ROLLBACK",
    "update",
    "safety",
    "update_from_output pulls num_computed_tokens back by exactly the rejected drafts (and "
    "the tokens dropped past a stop): a decoding request ends with its confirmed computed "
    "tokens (computed - in flight) == num_tokens - 1, finished ones too (as the engine "
    "reports them). Stale output (a step scheduled before the request's preemption) moves "
    "nothing.",
)
def check_rollback(t: UpdateTransition) -> list[Violation]:
    scheduled = t.output.num_scheduled_tokens
    out: list[Violation] = []
    for rid, post in t.post.requests.items():
        pre = t.pre.requests.get(rid)
        if pre is post and rid not in scheduled:
            continue  # the very record, of a request the step did not run: nothing moved
        if pre is None:
            out.append(
                Violation(
                    "ROLLBACK",
                    "appeared during update_from_output",
                    rid,
                    expected="absent (add_request adds)",
                    actual=post.status.name,
                )
            )
            continue
        mine = t.scheduled_for(pre)
        if not mine and is_load(t.pre, t.post, rid):
            continue  # a failed load's cut: LOAD-FAILURE judges it
        # Output of a step scheduled for an earlier request under this id (aborted while
        # the step ran) is not this request's: it changes nothing here (DELIVERY).
        sampled = t.model_output.sampled_token_ids.get(rid, ()) if mine else ()
        stale = t.is_stale(pre)
        if sampled and not stale:
            drafts = len(t.output.scheduled_spec_decode_tokens.get(rid, ()))
            rejected = drafts - (len(sampled) - 1)
            expected = pre.num_computed_tokens - rejected
        else:
            expected = pre.num_computed_tokens
        if post.num_computed_tokens != expected:
            out.append(
                Violation(
                    "ROLLBACK",
                    "num_computed_tokens after the output",
                    rid,
                    None,
                    expected=expected,
                    actual=post.num_computed_tokens,
                )
            )
        confirmed = post.num_computed_tokens - post.num_in_flight_tokens
        if sampled and not stale and confirmed != post.num_tokens - 1:
            out.append(
                Violation(
                    "ROLLBACK",
                    "a request that sampled must have computed all but its last token",
                    rid,
                    None,
                    expected=post.num_tokens - 1,
                    actual=confirmed,
                )
            )
    if t.request_outputs is not None:
        out.extend(_check_reported_computed(t))
    return out


def _check_reported_computed(t: UpdateTransition) -> list[Violation]:
    """A reported computed count, finished requests included (the state forgets them):
    every kept token but the last has KV, so it is the old token count + kept - 1."""
    out: list[Violation] = []
    for rid, reported in t.request_outputs.items() if t.request_outputs else ():
        pre = t.pre.requests.get(rid)
        if pre is None or reported.num_computed_tokens is None:
            continue
        # None kept (a stop cut at a length cap of 0): the old tokens all have KV.
        expected = pre.num_tokens + max(len(reported.new_token_ids), 1) - 1
        if reported.num_computed_tokens != expected:
            out.append(
                Violation(
                    "ROLLBACK",
                    "reported num_computed_tokens after the output",
                    rid,
                    None,
                    expected=expected,
                    actual=reported.num_computed_tokens,
                )
            )
    return out


# The fields a landing never moves: who the request is, what stops it, and its place in
# the engine's life cycle. (Outputs, computed tokens, pipeline counters and drafts are
# what a landing does move: STOP, ROLLBACK, UPDATE-PIPELINE and the draft rules judge
# those; the block table may change under SGLang, which caches a finished prefill.)
_FIXED_BY_A_LANDING = (
    "status",
    "priority",
    "arrival",
    "prompt_token_ids",
    "max_tokens",
    "eos_token_id",
    "stop_token_ids",
    "num_preemptions",
)
_fixed_fields = attrgetter(*_FIXED_BY_A_LANDING)


@invariant(
    "UPDATE-FRAME",
    "update",
    "safety",
    "update_from_output moves no request between or within the queues and leaves each "
    "request that stays live its status, priority, arrival, prompt, stop conditions and "
    "preemption count: a landing (stale output included) only appends tokens, moves the "
    "counters the other update invariants name, and removes the requests that finish.",
)
def check_update_frame(t: UpdateTransition) -> list[Violation]:
    out: list[Violation] = []
    live = t.post.requests
    queues = (
        ("waiting", t.pre.waiting, t.post.waiting),
        ("running", t.pre.running, t.post.running),
    )
    for name, before, after in queues:
        kept = tuple(r for r in before if r in live)
        if after != kept:
            out.append(
                Violation(
                    "UPDATE-FRAME", f"{name} queue changed", None, None, expected=kept, actual=after
                )
            )
    for rid, post in live.items():
        pre = t.pre.requests.get(rid)
        if pre is None or pre is post or _fixed_fields(pre) == _fixed_fields(post):
            continue  # appeared (ROLLBACK reports it), or the common case: all kept
        for name in _FIXED_BY_A_LANDING:
            before, after = getattr(pre, name), getattr(post, name)
            if before != after:
                out.append(
                    Violation(
                        "UPDATE-FRAME", f"{name} changed", rid, None, expected=before, actual=after
                    )
                )
    return out


@invariant(
    "ABORT",
    "abort",
    "safety",
    "finish_requests removes every waiting request it names at once; a running one it names "
    "is removed at once or, by an engine that defers aborts, kept RUNNING and marked "
    "abort_pending (it finishes when the next step that runs it lands); nothing else changes, "
    "and unknown and finished ids are ignored.",
)
def check_abort(t: AbortTransition) -> list[Violation]:
    named = set(t.request_ids)
    out: list[Violation] = []
    deferred: set[str] = set()
    for rid, pre in t.pre.requests.items():
        post = t.post.requests.get(rid)
        if rid not in named:
            if post != pre:
                out += field_violations(
                    "ABORT", "a request not aborted changed", rid, changed_fields(pre, post)
                )
        elif post is None:
            continue
        elif rid in t.pre.waiting:
            out.append(still_live("ABORT", "a waiting request is still live after abort", post))
        elif post != replace(pre, abort_pending=True):
            out += field_violations(
                "ABORT",
                "still live after abort, and not only marked abort_pending",
                rid,
                changed_fields(replace(pre, abort_pending=True), post),
            )
        else:
            deferred.add(rid)
    kept_running = tuple(r for r in t.pre.running if r not in named or r in deferred)
    kept_waiting = tuple(r for r in t.pre.waiting if r not in named)
    waiting = t.post.waiting
    if t.pre.config.max_num_inflight_kv_loads is not None:
        # The plain and async-load queues interleave by their heads (docs/SPEC.md, "The
        # KV connector"): removing a head may change which goes first, not who waits.
        waiting, kept_waiting = tuple(sorted(waiting)), tuple(sorted(kept_waiting))
    if t.post.running != kept_running or waiting != kept_waiting:
        out.append(
            Violation(
                "ABORT",
                "queues are not the old ones minus the aborted",
                expected=(kept_running, kept_waiting),
                actual=(t.post.running, t.post.waiting),
            )
        )
    return out
