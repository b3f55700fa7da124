"""vLLM's SchedulerOutput in the spec's layout, and vLLM's skip_drafts claim held to.

Nothing here imports vLLM: the functions read vLLM's objects (typed Any, vLLM
ships no stubs) that the adapter (adapters/vllm/engine.py) hands them.

The layout. vLLM 0.33.0 builds its output for the model runner it runs; 0.34.0
has only the V2 runner's layout. The V2 runner, which a GPU deployment runs,
learns a resumed request whole again: vLLM lists it among scheduled_new_reqs,
with its whole block table and all its token ids (`prefill_token_ids`: the
prompt, then the outputs it kept).
The spec says what the V1 runner is told: a resumed request is a
CachedRequestData with resumed=True, its whole table, its computed count
before the step, and num_output_tokens = its outputs plus placeholders (a
resumed request has none: preemption zeroed them). A request in vLLM's
scheduled_new_reqs is resumed exactly when it was PREEMPTED before the step,
and only a preemption makes a request so: its num_preemptions says which.
Cached entries that 0.33.0 itself marks resumed (the V1 layout) keep the mark.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from schedspec.adapters.vllm.kv_groups import group_tables, held_blocks
from schedspec.spec import CachedRequestData, NewRequestData, SchedulerOutput


def spec_block_ids(block_ids: Sequence[Sequence[int]] | None) -> tuple[int, ...]:
    """vLLM's per-group block ids as the spec's block table: vLLM's block 0 is its null
    block, so its block b is the spec's b - 1. One group (full attention) is the table
    itself, a null block in it showing as NULL_BLOCK_ID (a full-attention table never
    holds one); several groups are every block held, group by group, nulls left out
    (adapters/vllm/kv_groups.py)."""
    if block_ids is None:
        return ()
    tables = group_tables(block_ids)
    return tables[0] if len(tables) == 1 else held_blocks(tables)


# vLLM's front end gives each request an internal id of its own (the client's id plus
# random characters, unless VLLM_DISABLE_REQUEST_ID_RANDOMIZATION is set), so a client
# may reuse an id once the request is aborted even while its step is in flight. The
# adapter does the same with the arrival index after this separator.
INTERNAL_ID_SEPARATOR = "#"


def internal_id(request_id: str, arrival: int) -> str:
    """The id the adapter gives vLLM for the request_id's arrival-th request."""
    return f"{request_id}{INTERNAL_ID_SEPARATOR}{arrival}"


def external_id(internal: str) -> str:
    """The spec's request id behind a vLLM id the adapter made (internal_id's inverse)."""
    return internal.rpartition(INTERNAL_ID_SEPARATOR)[0]


def _resumed_from_new(data: Any) -> CachedRequestData:
    """A V2-layout new entry of a resumed request as the spec's resumed cached entry."""
    prompt = data.prompt_token_ids
    tokens = data.prefill_token_ids
    if tokens is None or list(tokens[: len(prompt)]) != list(prompt):
        raise RuntimeError(
            f"request {data.req_id!r}: resumed, but its prefill_token_ids do not start "
            "with its prompt"
        )
    return CachedRequestData(
        external_id(data.req_id),
        True,
        spec_block_ids(data.block_ids),
        data.num_computed_tokens,
        len(tokens) - len(prompt),
    )


def spec_output(out: Any, requests: Mapping[str, Any]) -> SchedulerOutput:
    """vLLM's SchedulerOutput `out`, just returned by schedule(), in the spec's layout.

    requests: vLLM's live requests by id (the scheduler's `requests`). Call it before
    any output lands: a V2 entry's prefill_token_ids is the request's own token list,
    which grows as outputs land. Ids come out as the spec's (external_id).
    """
    new: list[NewRequestData] = []
    resumed: list[CachedRequestData] = []
    for data in out.scheduled_new_reqs:
        if requests[data.req_id].num_preemptions:
            resumed.append(_resumed_from_new(data))
        else:
            new.append(
                NewRequestData(
                    external_id(data.req_id),
                    tuple(data.prompt_token_ids),
                    spec_block_ids(data.block_ids),
                    data.num_computed_tokens,
                )
            )
    cached = out.scheduled_cached_reqs
    # Feature detection: 0.34.0's CachedRequestData has no resumed_req_ids (every
    # resumed request is a new entry); 0.33.0's lists there what it resumed in the
    # V1 layout, which the adapter refuses to run, so it is empty in practice.
    marked_resumed = getattr(cached, "resumed_req_ids", ())
    running = [
        CachedRequestData(
            external_id(rid),
            rid in marked_resumed,
            spec_block_ids(cached.new_block_ids[i]),
            cached.num_computed_tokens[i],
            cached.num_output_tokens[i],
        )
        for i, rid in enumerate(cached.req_ids)
    ]
    return SchedulerOutput(
        scheduled_new_reqs=tuple(new),
        # Running requests first, then resumed ones: vLLM's V1 order.
        scheduled_cached_reqs=(*running, *resumed),
        num_scheduled_tokens={
            external_id(rid): num for rid, num in out.num_scheduled_tokens.items()
        },
        total_num_scheduled_tokens=out.total_num_scheduled_tokens,
        scheduled_spec_decode_tokens={
            external_id(rid): tuple(tokens)
            for rid, tokens in out.scheduled_spec_decode_tokens.items()
        },
        preempted_req_ids=frozenset(map(external_id, out.preempted_req_ids or ())),
        finished_req_ids=frozenset(map(external_id, out.finished_req_ids)),
    )


class DraftingSkips:
    """vLLM's skip_drafts claim, checked step by step.

    With the V2 runner and a drafter that has its own forward pass (lookahead > 0,
    vLLM's `can_skip_drafts`), a step whose output says skip_drafts makes the model
    runner propose no drafts after it: vLLM sets it when no scheduled request can use
    them (`Scheduler._drafts_unused`: each is a non-final prefill chunk, or samples its
    last output token in this step). The scheduler's state does not depend on it. The
    harness's FakeModel fills placeholder drafts with the drafter's guesses as if the
    drafter had run after the request's last step, so it models vLLM only while the
    claim holds: a request whose last step skipped drafting is never scheduled again
    with drafts to verify (admissions aside: an admission's padding drafts come from no
    drafter pass at all).
    """

    def __init__(self) -> None:
        self._skipped: set[str] = set()  # requests whose last step skipped drafting

    def check(self, output: SchedulerOutput, skip_drafts: bool) -> None:
        """Hold one step's output to the claim, then remember what it skipped.
        Raises RuntimeError naming a request scheduled with drafts that nobody proposed."""
        admitted = {d.request_id for d in output.scheduled_new_reqs}
        admitted.update(c.request_id for c in output.scheduled_cached_reqs if c.resumed)
        for rid, drafts in output.scheduled_spec_decode_tokens.items():
            if drafts and rid in self._skipped and rid not in admitted:
                raise RuntimeError(
                    f"request {rid!r}: scheduled with {len(drafts)} drafts to verify, but "
                    "vLLM's last step for it said skip_drafts, so the model runner proposed "
                    "none"
                )
        if skip_drafts:
            self._skipped.update(output.num_scheduled_tokens)
        else:
            self._skipped.difference_update(output.num_scheduled_tokens)

    def forget(self, request_id: str) -> None:
        """A request that finished (its id may come back as a new request)."""
        self._skipped.discard(request_id)
