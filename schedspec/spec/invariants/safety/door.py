"""The door: add_request refuses exactly the requests that could never run to completion."""

from __future__ import annotations

from schedspec.spec.errors import SpecInputError
from schedspec.spec.invariants.registry import (
    FieldCheck,
    Violation,
    changed_fields,
    field_violations,
    holds_nothing,
    invariant,
)
from schedspec.spec.invariants.transitions import AddTransition
from schedspec.spec.request import RequestStatus, validate_new_request
from schedspec.spec.state import RequestState


def door_refuses(t: AddTransition) -> str | None:
    """Why the spec refuses this request in the pre state, or None if it is admissible."""
    try:
        validate_new_request(t.request, t.pre.config)
    except SpecInputError as err:
        return str(err)
    if t.request.request_id in t.pre.requests:
        return f"duplicate request id {t.request.request_id!r}"
    if t.pre.connector is not None and t.request.request_id in t.pre.connector.held:
        # Its blocks still wait for the connector's worker, whose report names the id.
        return f"request id {t.request.request_id!r} is still held by the KV connector"
    return None


@invariant(
    "DOOR",
    "add",
    "safety",
    "add_request raises ValueError for, and only for, a request the spec refuses (empty "
    "prompt, prompt of max_model_len tokens or more (family sglang: max_model_len - 6 or "
    "more), max_tokens < 1, bad token ids, a live duplicate id or one the KV connector "
    "still holds, remote KV without a connector or past the prompt), and a refusal changes "
    "nothing; an accepted request is WAITING at the "
    "back of the queue (by key under priority) with nothing computed.",
)
def check_door(t: AddTransition) -> list[Violation]:
    reason = door_refuses(t)
    rid = t.request.request_id
    if reason is not None:
        if t.refusal is None:
            return [
                Violation(
                    "DOOR",
                    f"accepted a request the spec refuses: {reason}",
                    rid,
                    expected="refused with ValueError",
                    actual="accepted",
                )
            ]
        if not isinstance(t.refusal, ValueError):
            return [
                Violation(
                    "DOOR",
                    f"refused with {type(t.refusal).__name__}, not ValueError",
                    rid,
                    expected=ValueError.__name__,
                    actual=type(t.refusal).__name__,
                )
            ]
        return field_violations(
            "DOOR", "a refused request changed the state", rid, changed_fields(t.pre, t.post)
        )
    if t.refusal is not None:
        return [
            Violation(
                "DOOR",
                f"refused an admissible request: {t.refusal}",
                rid,
                expected="accepted",
                actual=f"refused with {type(t.refusal).__name__}",
            )
        ]
    added = t.post.requests.get(rid)
    if added is None:
        return [
            Violation(
                "DOOR",
                "accepted request is not a fresh WAITING request",
                rid,
                expected="live",
                actual="not live",
            )
        ]
    fresh = field_violations(
        "DOOR",
        "accepted request is not a fresh WAITING request",
        rid,
        [
            FieldCheck("status", RequestStatus.WAITING.name, added.status.name),
            *holds_nothing(added),
            FieldCheck("in waiting", True, rid in t.post.waiting),
        ],
    )
    if fresh:
        return fresh
    expected = _queue_after_arrival(t, added)
    if t.post.waiting != expected or t.post.running != t.pre.running:
        return [
            Violation(
                "DOOR",
                "arrival out of queue order",
                rid,
                None,
                expected=expected,
                actual=t.post.waiting,
            )
        ]
    return []


def _queue_after_arrival(t: AddTransition, added: RequestState) -> tuple[str, ...]:
    """fcfs: the new request joins the back; priority: the queue stays ordered by
    (priority, arrival)."""
    if t.pre.config.kv_connector:
        # Holders go first and async loads queue apart (docs/SPEC.md, "The KV
        # connector"): the arrival keeps the others' order, wherever it joins.
        position = t.post.waiting.index(added.request_id)
        return (*t.pre.waiting[:position], added.request_id, *t.pre.waiting[position:])
    if t.pre.config.policy == "fcfs":
        return (*t.pre.waiting, added.request_id)

    def key(rid: str) -> tuple[int, int]:
        request = t.post.requests[rid]
        return (request.priority, request.arrival)

    return tuple(sorted((*t.pre.waiting, added.request_id), key=key))
