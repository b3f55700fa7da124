"""Invariants of update_draft_token_ids(): what the drafter's proposal may change.

The drafter proposes drafts for running requests between two steps (a synchronous
engine only: under async scheduling the model runner fills placeholder drafts itself
and the engine core never calls it). DRAFTS judges how a step consumes drafts; these
judge the call that hands them over.
"""

from __future__ import annotations

import dataclasses

from schedspec.spec.invariants.registry import (
    Violation,
    changed_fields,
    field_violations,
    invariant,
)
from schedspec.spec.invariants.transitions import DraftsTransition


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
                    expected=sorted(allowed),
                    actual=post.spec_token_ids,
                )
            )
        if dataclasses.replace(post, spec_token_ids=pre.spec_token_ids) != pre:
            out += field_violations(
                "DRAFT-UPDATE",
                "a field other than the drafts changed",
                rid,
                changed_fields(pre, post, ignore=["spec_token_ids"]),
            )
    queues_before = (t.pre.waiting, t.pre.running)
    if (t.post.waiting, t.post.running) != queues_before:
        out.append(
            Violation(
                "DRAFT-UPDATE",
                "the queues changed",
                expected=queues_before,
                actual=(t.post.waiting, t.post.running),
            )
        )
    if t.post.kv != t.pre.kv:
        out += field_violations(
            "DRAFT-UPDATE", "the KV cache changed", None, changed_fields(t.pre.kv, t.post.kv)
        )
    return out
