"""The `sglang` profile's lifecycle rules: where a request sits in the running order,
how the chunked request's abort ends it, and what a retraction evicts.

policy.py holds the batch-kind rules and admission.py the admission ones; these are the
ones around them that SGLang 0.5.23 decides as exactly (docs/SPEC.md, "SG-RUNNING-ORDER",
"SG-CHUNKED-ABORT", "SG-RETRACT-EVICT"), read off the abstract state and
State.sglang under the mapping of docs/SPEC.md, "Two families".
"""

from __future__ import annotations

from schedspec.spec.invariants.registry import Violation, invariant, still_live
from schedspec.spec.invariants.sglang.policy import missing_policy_state
from schedspec.spec.invariants.transitions import ScheduleTransition
from schedspec.spec.sglang_arithmetic import RETRACT_DECODE_STEPS


@invariant(
    "SG-RUNNING-ORDER",
    "schedule",
    "sglang",
    "The running order after a step that retracts nothing, among the requests it ran (the "
    "chunked request aside, last by SG-ONE-CHUNKED): the request whose prefill the step's "
    "chunk completed first, then the admissions in queue order, then the requests that "
    "decoded, in their old order (the new extend batch, with the running batch appended in "
    "a mixed step, joins the running batch at its end).",
)
def check_running_order(t: ScheduleTransition) -> list[Violation]:
    pre, post = t.pre.sglang, t.post.sglang
    if pre is None or post is None:
        return missing_policy_state("SG-RUNNING-ORDER")
    if t.output.preempted_req_ids:
        return []  # the survivors are ranked by SG-RETRACT's key instead
    scheduled = t.output.num_scheduled_tokens
    chunked_before, chunked_after = pre.chunked_request_id, post.chunked_request_id
    # PrefillAdder takes the chunked request's chunk before any admission.
    completed = (
        [chunked_before]
        if chunked_before is not None
        and chunked_before in scheduled
        and chunked_before != chunked_after
        else []
    )
    admissions = [r for r in t.pre.waiting if r in t.admitted_ids and r != chunked_after]
    decoders = [
        r
        for r in t.pre.running
        if r in scheduled and r not in t.admitted_ids and r != chunked_before
    ]
    running = set(t.post.running)
    expected = tuple(r for r in (*completed, *admissions, *decoders) if r in running)
    actual = tuple(r for r in t.post.running if r in scheduled and r != chunked_after)
    if actual == expected:
        return []
    return [
        Violation(
            "SG-RUNNING-ORDER",
            f"the running order after a {post.last_batch_kind} step",
            expected=expected,
            actual=actual,
        )
    ]


@invariant(
    "SG-CHUNKED-ABORT",
    "schedule",
    "sglang",
    "An abort of the chunked request ends it at the start of the next step: that step does "
    "not schedule it, it is gone after the step (reported by the next one), and the KV it "
    "held uncached is freed uncached (its last chunk may still be computing).",
)
def check_chunked_abort(t: ScheduleTransition) -> list[Violation]:
    pre = t.pre.sglang
    if pre is None:
        return missing_policy_state("SG-CHUNKED-ABORT")
    chunked = pre.chunked_request_id
    # Only an abort that named it while it was chunked: one that reached it earlier (a
    # running request's deferred abort, kept through a retraction) finishes it when a
    # step that runs it lands, as STOP says.
    if chunked is None or chunked not in t.aborted_since_last_schedule:
        return []
    request = t.pre.requests.get(chunked)
    if request is None:
        return []
    out: list[Violation] = []
    if chunked in t.output.num_scheduled_tokens:
        out.append(
            Violation(
                "SG-CHUNKED-ABORT",
                "the aborted chunked request was given another chunk",
                chunked,
                expected="not scheduled",
                actual=t.output.num_scheduled_tokens[chunked],
            )
        )
    elif chunked in t.post.requests:
        out.append(
            still_live(
                "SG-CHUNKED-ABORT",
                "the aborted chunked request is still live",
                t.post.requests[chunked],
            )
        )
    before, after = t.pre.kv.block_hashes, t.post.kv.block_hashes
    # Nothing else caches a block in schedule(): the one insert there is the chunked
    # request's own checkpoint, which its abort cancels.
    cached = tuple(b for b in request.block_ids if before[b] is None and after[b] is not None)
    if cached:
        out.append(
            Violation(
                "SG-CHUNKED-ABORT",
                "the aborted chunked request's uncached KV was cached",
                chunked,
                expected=(),
                actual=cached,
            )
        )
    return out


@invariant(
    "SG-RETRACT-EVICT",
    "schedule",
    "sglang",
    "After a retraction the radix cache is evicted until the survivors can decode 20 steps "
    "each: the free slots after the step, with the slots its decode took, are at least 20 "
    "per surviving request, unless nothing evictable is left.",
)
def check_retract_evict(t: ScheduleTransition) -> list[Violation]:
    if not t.output.preempted_req_ids:
        return []
    survivors = list(t.output.num_scheduled_tokens)
    kv = t.post.kv
    free = sum(1 for b in kv.free_block_ids if kv.block_hashes[b] is None)
    if free == len(kv.free_block_ids):
        return []  # the tree has nothing left to evict
    # The decode allocates after the last retraction's eviction: its slots were free then.
    taken = sum(
        len(set(t.post.requests[r].block_ids) - set(t.pre.requests[r].block_ids))
        for r in survivors
        if r in t.post.requests and r in t.pre.requests
    )
    page = t.post.config.block_size
    target = len(survivors) * RETRACT_DECODE_STEPS
    if (free + taken) * page >= target:
        return []
    return [
        Violation(
            "SG-RETRACT-EVICT",
            f"evictable blocks left while the free slots fall short of {len(survivors)} "
            f"survivors x {RETRACT_DECODE_STEPS} decodes",
            expected=f">= {target}",
            actual=(free + taken) * page,
        )
    ]
