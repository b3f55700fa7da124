"""Invariants of update_draft_token_ids(): what the drafter's proposal may change.

The drafter proposes drafts for running requests between two steps (a synchronous
engine only: under async scheduling the model runner fills placeholder drafts itself
and the engine core never calls it). DRAFTS judges how a step consumes drafts; these
judge the call that hands them over.
"""

from __future__ import annotations

import dataclasses

from schedspec.spec.invariants.registry import Violation, invariant
from schedspec.spec.invariants.transitions import DraftsTransition
from schedspec.spec.request import RequestStatus
from schedspec.spec.state import RequestState


def keeps_drafts(request: RequestState) -> bool:
    """vLLM keeps proposed drafts for a running request whose last step sampled; a
    request in its prefill (its last step stopped short of its known tokens) drops
    them (PR #30618): the drafter ran on a partial prompt."""
    return request.status is RequestStatus.RUNNING and not request.is_prefill_chunk


@invariant(
    "DRAFT-UPDATE",
    "drafts",
    "safety",
    "update_draft_token_ids changes nothing but drafts: a named live request ends with the "
    "drafts proposed for it or none, every other field of every request, the queues and the "
    "KV cache stay as they were.",
)
def check_draft_update(t: DraftsTransition) -> list[Violation]:
    out: list[Violation] = []
    if set(t.post.requests) != set(t.pre.requests):
        out.append(
            Violation(
                "DRAFT-UPDATE",
                "the live requests changed",
                expected=sorted(t.pre.requests),
                actual=sorted(t.post.requests),
            )
        )
    for rid, pre in t.pre.requests.items():
        post = t.post.requests.get(rid)
        if post is None:
            continue
        proposed = t.proposed.get(rid)
        allowed = {pre.spec_token_ids} if proposed is None else {(), tuple(proposed)}
        if post.spec_token_ids not in allowed:
            what = "a request not named changed its drafts" if proposed is None else "drafts"
            out.append(
                Violation(
                    "DRAFT-UPDATE",
                    f"{what} other than proposed",
                    rid,
                    None,
                    sorted(allowed),
                    post.spec_token_ids,
                )
            )
        if dataclasses.replace(post, spec_token_ids=pre.spec_token_ids) != pre:
            out.append(Violation("DRAFT-UPDATE", "a field other than the drafts changed", rid))
    if (t.post.waiting, t.post.running) != (t.pre.waiting, t.pre.running):
        out.append(Violation("DRAFT-UPDATE", "the queues changed"))
    if t.post.kv != t.pre.kv:
        out.append(Violation("DRAFT-UPDATE", "the KV cache changed"))
    return out


@invariant(
    "DRAFT-KEEP",
    "drafts",
    "vllm-v1",
    "Drafts proposed for a running request whose last step sampled are kept as proposed; "
    "drafts proposed for a running request in its prefill (its last step a prefill chunk) "
    "are dropped (vLLM PR #30618).",
)
def check_draft_keep(t: DraftsTransition) -> list[Violation]:
    """Only running requests are judged: vLLM keeps drafts proposed for a preempted
    request whose last step sampled (its is_prefill_chunk is stale), the reference
    drops them, and the drafter only ever proposes for running requests."""
    out: list[Violation] = []
    for rid, proposed in t.proposed.items():
        pre = t.pre.requests.get(rid)
        post = t.post.requests.get(rid)
        if pre is None or post is None or pre.status is not RequestStatus.RUNNING:
            continue  # unknown or finished ids are ignored (DRAFT-UPDATE: nothing changes)
        kept = keeps_drafts(pre)
        expected = tuple(proposed) if kept else ()
        if post.spec_token_ids == expected:
            continue
        why = (
            "not kept for a running request whose last step sampled"
            if kept
            else ("kept for a request in its prefill")
        )
        out.append(
            Violation("DRAFT-KEEP", f"drafts {why}", rid, None, expected, post.spec_token_ids)
        )
    return out
