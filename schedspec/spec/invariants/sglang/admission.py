"""The `sglang` profile's admission invariants: SGLang's PrefillAdder, judged both ways.

SG-ADMISSION holds every admission to the arithmetic (it fitted, the budgets had room,
a chunked admission took exactly its chunk); SG-ADMISSION-STOP holds every refusal to
a reason (the latch, the seats, a budget, or a future that did not fit); SG-LATCH says
when the latch may close and when it must be open; SG-CHUNK-ROOM bounds the chunked
request's next chunk by what the reservations leave. The figures come from
sglang/prefill_pass.py, exact where the state shows everything and bounded both ways
where it does not; each check fires only where its bound makes the verdict certain.
"""

from __future__ import annotations

from schedspec.spec.invariants.registry import Violation, invariant
from schedspec.spec.invariants.sglang.policy import missing_policy_state
from schedspec.spec.invariants.sglang.prefill_pass import (
    TOLERANCE,
    Before,
    PrefillPass,
    RunningBatch,
    admissions_in_batch_order,
    ceil_paged,
    maybe_out_of_batch,
)
from schedspec.spec.invariants.transitions import ScheduleTransition
from schedspec.spec.request import RequestStatus
from schedspec.spec.state import SGLangState


def latch_surely_open(t: ScheduleTransition, policy: SGLangState) -> bool:
    """Was the admission latch open when the step's pass began? It reopens when a
    request leaves the running batch (finished, or aborted), when that batch is
    empty, when the step's merge leaves the chunked request out of the last batch,
    and when the last (extend or mixed) batch replaces an empty running batch. A
    request the overlap loop may already have left out of the batch (its result in
    flight finishes it, and the latest step, a decode or mixed one, did not schedule
    it), or the chunked request (never in it), reopens nothing."""
    if not policy.batch_is_full:
        return True
    batch = RunningBatch.of(t)
    if not batch.sure and not batch.maybe:
        return True
    chunked = policy.chunked_request_id
    if chunked is not None and chunked in t.previous_step:
        return True  # the merge leaves the chunked request out of the last batch
    if policy.last_batch_kind == "mixed":
        return True  # the mixed step emptied the running batch; the last batch replaces it
    members = {r.request_id for r in (*batch.sure, *batch.maybe)}
    if policy.last_batch_kind == "extend" and members <= t.previous_step:
        return True  # nothing ran before the last extend: it becomes the running batch
    config = t.pre.config
    # The overlap loop leaves a request out only at a decode or mixed step that would
    # decode it, the step before its result lands: the previous step.
    filtering = policy.last_batch_kind in ("decode", "mixed")
    return any(
        d.request.status is RequestStatus.RUNNING
        and not d.request.is_prefill_chunk
        and (d.in_last_step or not filtering or not maybe_out_of_batch(config, d.request))
        for d in t.left_running.values()
    )


def _latch_surely_closed(t: ScheduleTransition, policy: SGLangState) -> bool:
    """Was the latch closed when the step's pass began, whatever kind of step closed it
    (a decode, or an extend whose pass ran out of memory or seats)? Closed in the state,
    nothing that reopens it (latch_surely_open), and a running request surely in the batch
    (so the batch is not empty): then the pass admits nothing (the chunked request's next
    chunk aside), as _get_new_batch_prefill and the adder's loop both read the latch first."""
    return (
        policy.batch_is_full and bool(RunningBatch.of(t).sure) and not latch_surely_open(t, policy)
    )


def _fit_margin(before: Before) -> float:
    """How far past the fit test's edge an admission must be to be judged: none where
    the engine's sum is exact, a rounding error's width where it is not."""
    return 0.0 if before.reserved_exact else TOLERANCE


@invariant(
    "SG-ADMISSION",
    "schedule",
    "sglang",
    "Admission takes waiting requests from the head of the queue, in order, and each only "
    "if its whole future fits and the budgets have room: extend + max_new_tokens (at most "
    "4096) + a page < the free and evictable slots less what the pass reserved before it "
    "(each running request's remaining max_new_tokens times new_token_ratio, a mixed "
    "step's decodes, the chunked request's chunk and each earlier admission's page-ceiled "
    "extend + a page + max_new_tokens, none for a chunked admission); rem_input_tokens and "
    "rem_chunk_tokens, charged page-ceiled extends, are above 0; without chunked prefill a "
    "later admission's page-ceiled extend is under rem_input_tokens; with it, an "
    "admission whose page-ceiled extend exceeds rem_chunk_tokens is chunked at the "
    "budget's last whole page.",
)
def check_admission(t: ScheduleTransition) -> list[Violation]:
    policy = t.pre.sglang
    if policy is None:
        return missing_policy_state("SG-ADMISSION")
    count = PrefillPass.of(t, policy)
    admitted = count.admitted
    if not admitted:
        return []
    if tuple(admitted) != t.pre.waiting[: len(admitted)]:
        return [
            Violation(
                "SG-ADMISSION",
                "admissions are not the head of the waiting queue in order",
                expected=t.pre.waiting[: len(admitted)],
                actual=tuple(admitted),
            )
        ]
    out: list[Violation] = []
    for rid, before in zip(admitted, count.befores, strict=False):
        request = t.pre.requests[rid]
        prefix = t.computed_before.get(rid, 0)
        extend = t.output.num_scheduled_tokens[rid]
        future = count.future(request, prefix)
        room = count.available(before.locked).hi - before.reserved.lo
        if not future < room + _fit_margin(before):
            out.append(
                Violation(
                    "SG-ADMISSION",
                    "admitted although its future did not fit",
                    rid,
                    None,
                    expected=f"< {room}",
                    actual=future,
                )
            )
        least_prefix = count.longest_match(request)
        if prefix < least_prefix:
            out.append(
                Violation(
                    "SG-ADMISSION",
                    "its prefix match stops short of the cached prefix",
                    rid,
                    None,
                    expected=f">= {least_prefix}",
                    actual=prefix,
                )
            )
        rem_chunk = before.rem_chunk
        if before.rem_input.hi <= 0 or (rem_chunk is not None and rem_chunk.hi <= 0):
            out.append(
                Violation(
                    "SG-ADMISSION",
                    "admitted after the prefill budget ran out",
                    rid,
                    expected="rem_input > 0 and rem_chunk > 0",
                    actual={
                        "rem_input": before.rem_input.hi,
                        "rem_chunk": None if rem_chunk is None else rem_chunk.hi,
                    },
                )
            )
        paged = ceil_paged(request.num_tokens - prefix, count.page)
        if rem_chunk is None:
            if extend != request.num_tokens - prefix:
                out.append(
                    Violation(
                        "SG-ADMISSION",
                        "without chunked prefill an admission takes its whole extend",
                        rid,
                        None,
                        expected=request.num_tokens - prefix,
                        actual=extend,
                    )
                )
            if before.num_can_run and paged >= before.rem_input.hi:
                out.append(
                    Violation(
                        "SG-ADMISSION",
                        "admitted over rem_input_tokens",
                        rid,
                        None,
                        expected=f"< {before.rem_input.hi}",
                        actual=paged,
                    )
                )
            continue
        lo = count.chunk_extend(request, prefix, rem_chunk.lo)
        hi = count.chunk_extend(request, prefix, rem_chunk.hi)
        if not lo <= extend <= hi:
            out.append(
                Violation(
                    "SG-ADMISSION",
                    "the admission's extend is not the chunk budget's",
                    rid,
                    None,
                    expected=lo if lo == hi else (lo, hi),
                    actual=extend,
                )
            )
    return out


def _refusal_reason(count: PrefillPass, latch_open: bool) -> str | None:
    """Why the pass may have stopped before the first request it left waiting, or
    None when no reason can hold."""
    before = count.at_refusal
    request = count.refused
    assert request is not None
    if not latch_open:
        return "latch"
    if count.seats_left(before.num_can_run).lo <= 0:
        return "seats"
    rem_chunk = before.rem_chunk
    if before.rem_input.lo <= 0 or (rem_chunk is not None and rem_chunk.lo <= 0):
        return "budget"
    prefix = count.longest_match(request)
    paged = ceil_paged(request.num_tokens - prefix, count.page)
    if rem_chunk is None:
        if before.num_can_run and paged >= before.rem_input.lo:
            return "input budget"
    elif paged > rem_chunk.lo and count.chunk_extend(request, prefix, rem_chunk.lo) <= 0:
        return "chunk budget"
    if not count.surely_fits(request):
        return "memory"
    return None


@invariant(
    "SG-ADMISSION-STOP",
    "schedule",
    "sglang",
    "Admission stops before a waiting request only for a reason: the latch was closed, the "
    "seats (max_running_requests, free request rows) are taken, rem_input_tokens or "
    "rem_chunk_tokens is spent or cannot take a page of it, or its future (extend + "
    "max_new_tokens + a page) does not fit what the pass left.",
)
def check_admission_stop(t: ScheduleTransition) -> list[Violation]:
    policy = t.pre.sglang
    if policy is None:
        return missing_policy_state("SG-ADMISSION-STOP")
    if len(t.pre.waiting) <= len(t.admitted):
        return []
    count = PrefillPass.of(t, policy)
    request = count.refused
    if request is None or _refusal_reason(count, latch_surely_open(t, policy)) is not None:
        return []
    return [
        Violation(
            "SG-ADMISSION-STOP",
            "left waiting although its future fits, with the latch open, a seat and budget",
            request.request_id,
            None,
            expected=f"< {count.room_for(request).lo}",
            actual=count.largest_future(request),
        )
    ]


@invariant(
    "SG-LATCH",
    "schedule",
    "sglang",
    "The admission latch (batch_is_full): after a decode step that left it closed, the next "
    "step admits nothing unless a request finished or was aborted since, or the running "
    "requests are none; and a step whose pass began with it open closes it only when the "
    "seats ran out or memory did (a waiting request's future did not fit, or an admission "
    "left nothing), never for a spent compute budget.",
)
def check_latch(t: ScheduleTransition) -> list[Violation]:
    pre, post = t.pre.sglang, t.post.sglang
    if pre is None or post is None:
        return missing_policy_state("SG-LATCH")
    out: list[Violation] = []
    closed = pre.batch_is_full and pre.last_batch_kind == "decode"
    admitted = admissions_in_batch_order(t)
    if admitted and (
        (closed and not t.finished_since_last_schedule and t.pre.running)
        or _latch_surely_closed(t, pre)
    ):
        out.append(
            Violation(
                "SG-LATCH",
                f"admitted {admitted} while the latch was closed",
                expected="no admission",
                actual=admitted,
            )
        )
    if post.batch_is_full and t.pre.waiting and latch_surely_open(t, pre):
        # The pass began with the latch open: only the seats, or memory (a refused
        # future that did not fit, or an admission that left nothing) close it.
        count = PrefillPass.of(t, pre)
        before = count.at_refusal
        seats = count.seats_left(before.num_can_run)
        rem_chunk = before.rem_chunk
        # A pass whose budget was spent stops there (OTHER) without reading memory for
        # the next request: with memory left after its admissions, it leaves the latch open.
        spent = before.rem_input.hi <= 0 or (rem_chunk is not None and rem_chunk.hi <= 0)
        stopped_by_budget = spent and count.surely_fits(None)
        if seats.lo > 0 and (count.surely_fits(count.refused) or stopped_by_budget):
            out.append(
                Violation(
                    "SG-LATCH",
                    "closed the latch with memory and seats to spare",
                    expected="batch_is_full False",
                    actual=f"batch_is_full True with {seats.lo} seat(s) left",
                )
            )
    return out


@invariant(
    "SG-CHUNK-ROOM",
    "schedule",
    "sglang",
    "The chunked request's next chunk is as much of rem_chunk_tokens as the reservations "
    "leave (the free and evictable slots less the running requests' reservations and a "
    "mixed step's decodes), the whole budget when they leave nothing, never more than "
    "the pool can give it, and the rest of its prompt if that is less.",
)
def check_chunk_room(t: ScheduleTransition) -> list[Violation]:
    policy = t.pre.sglang
    if policy is None:
        return missing_policy_state("SG-CHUNK-ROOM")
    count = PrefillPass.of(t, policy)
    if count.chunked is None or not count.chunk:
        return []
    request = t.pre.requests[count.chunked]
    prefix = t.computed_before.get(count.chunked, 0)
    remaining = request.num_tokens - prefix
    rem_chunk = count.start.rem_chunk
    room = count.chunk_room()
    if rem_chunk is None or room is None:
        return []
    # Where the reservations surely leave room the chunk is at most that room; where
    # they may leave none, SGLang takes the whole budget.
    most = min(remaining, int(room.hi) if room.lo > 0 else int(rem_chunk.hi))
    if count.chunk > most:
        return [
            Violation(
                "SG-CHUNK-ROOM",
                "the chunk is larger than the room the reservations leave",
                count.chunked,
                None,
                expected=f"<= {most}",
                actual=count.chunk,
            )
        ]
    return []
