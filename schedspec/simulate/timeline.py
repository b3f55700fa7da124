"""What each scheduled request did in one engine iteration: prefill N, decode 1 or spec 1+k.

Everything here is derived from what the scheduler publishes (SchedulerOutput
and ModelRunnerOutput), so it shows what any engine speaking the spec types
decided, not how it decided. The simulator builds each request's timeline
from these entries; `schedspec run` prints them, one line per iteration.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Literal

from schedspec.spec import ModelRunnerOutput, SchedulerOutput

Kind = Literal["prefill", "decode", "spec"]


@dataclass(frozen=True)
class ScheduledEntry:
    """What one request did in one step."""

    request_id: str
    kind: Kind
    num_scheduled: int  # tokens this step, drafts included
    num_drafts: int  # drafts verified this step (spec only)
    num_cached: int = 0  # prefix-cache hit when admitted or resumed this step
    num_accepted: int = 0  # drafts the model accepted (spec only)
    # Async scheduling: output positions of the request's previous step, still in
    # flight when this one was scheduled (the step computes past them).
    num_in_flight: int = 0

    def __str__(self) -> str:
        if self.kind == "spec":
            text = f"{self.request_id} spec 1+{self.num_drafts}"
        else:
            text = f"{self.request_id} {self.kind} {self.num_scheduled}"
        if self.num_cached:
            text += f" +{self.num_cached} cached"
        if self.num_in_flight:
            text += f" +{self.num_in_flight} in flight"
        return f"[{text}]"


def classify(
    request_id: str,
    num_computed_before: int,
    num_scheduled: int,
    num_drafts: int,
    num_tokens: int,
    num_cached: int = 0,
    num_accepted: int = 0,
) -> ScheduledEntry:
    """Name the work a request does in a step: prefill N, decode 1 or spec 1+k.

    num_tokens is the request's known token count (prompt + outputs) when the
    step was scheduled. A step that starts below num_tokens - 1 computes KV
    for tokens already known — a prompt chunk or a recomputation after
    preemption — so it is a prefill. Otherwise it computes only the last
    known token (whose KV is never computed before it is sampled), plus any
    drafts: a decode or a speculative step. A chunk that computes just the
    last known token is therefore reported as a decode: it is the same work.
    num_cached and num_accepted are carried into the entry (accepted drafts
    only for a spec step).
    """
    if num_computed_before < num_tokens - 1:
        return ScheduledEntry(request_id, "prefill", num_scheduled, 0, num_cached)
    if num_drafts > 0:
        return ScheduledEntry(
            request_id, "spec", num_scheduled, num_drafts, num_cached, num_accepted
        )
    return ScheduledEntry(request_id, "decode", num_scheduled, 0, num_cached)


def in_flight_outputs(out: SchedulerOutput, num_outputs: Mapping[str, int]) -> dict[str, int]:
    """Per running request scheduled: the output positions still in flight when it was
    scheduled (async scheduling), which the runner counts in num_output_tokens; num_outputs
    is each request's delivered outputs at that time."""
    return {
        d.request_id: d.num_output_tokens - num_outputs[d.request_id]
        for d in out.scheduled_cached_reqs
        if not d.resumed and d.num_output_tokens > num_outputs[d.request_id]
    }


def computed_before(out: SchedulerOutput) -> tuple[dict[str, int], set[str]]:
    """Each scheduled request's num_computed_tokens before this step, and the
    requests admitted or resumed in it (for those, the count is the prefix-cache hit)."""
    computed = {d.request_id: d.num_computed_tokens for d in out.scheduled_new_reqs}
    fresh = set(computed)
    computed.update((d.request_id, d.num_computed_tokens) for d in out.scheduled_cached_reqs)
    fresh.update(d.request_id for d in out.scheduled_cached_reqs if d.resumed)
    return computed, fresh


def scheduled_entries(
    out: SchedulerOutput,
    model_output: ModelRunnerOutput,
    num_tokens_at_schedule: Mapping[str, int],
    computed: Mapping[str, int],
    fresh: set[str],
    in_flight: Mapping[str, int] | None = None,
) -> list[ScheduledEntry]:
    """What each scheduled request did in the step, in scheduling order (computed and
    fresh as computed_before returns them; in_flight as in_flight_outputs does).
    num_tokens_at_schedule counts the in-flight outputs as known: the step computes
    past them."""
    in_flight = in_flight or {}
    entries = []
    drafts, sampled = out.scheduled_spec_decode_tokens, model_output.sampled_token_ids
    for rid, num in out.num_scheduled_tokens.items():
        before = computed[rid]
        # The model emits 1 + accepted drafts for a spec step.
        accepted = max(len(sampled.get(rid, ())) - 1, 0)
        cached = before if rid in fresh else 0
        num_drafts = len(drafts.get(rid, ()))
        entry = classify(
            rid,
            before,
            num,
            num_drafts,
            num_tokens_at_schedule[rid] + in_flight.get(rid, 0),
            cached,
            accepted,
        )
        if rid in in_flight:
            entry = replace(entry, num_in_flight=in_flight[rid])
        entries.append(entry)
    return entries
