"""vLLM V1's rule for a drafter's proposal: which drafts a request keeps."""

from __future__ import annotations

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
            Violation(
                "DRAFT-KEEP",
                f"drafts {why}",
                rid,
                None,
                expected=expected,
                actual=post.spec_token_ids,
            )
        )
    return out
