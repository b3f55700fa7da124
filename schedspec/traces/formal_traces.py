"""A Z3 counterexample run (schedspec.spec.formal.bmc.Reached) as a replayable trace.

Slot i becomes request r<i>, added in slot order; each model step becomes a
Step event (one engine step) whose decisions fix the drafts accepted in the
output that lands in it, followed, for a synchronous engine, by a
ProposeDrafts event for the drafts the model proposed (the async engine core
proposes none). Prompts hold distinct tokens and max_tokens is the search's,
so requests end at max_tokens or max_model_len, as in the search. The
harness's model draws tokens from a vocabulary without EOS, so no request
stops early.
"""

from __future__ import annotations

from schedspec.engines.events import AddRequest, Drain, Event, ProposeDrafts, Step
from schedspec.engines.fake_model import StepDecisions
from schedspec.spec import SchedulerConfig
from schedspec.spec.formal.bmc import Reached
from schedspec.traces.trace import Trace


def request_id(slot: int) -> str:
    return f"r{slot}"


def reached_config(reached: Reached) -> SchedulerConfig:
    c = reached.config
    return SchedulerConfig(
        block_size=c.block_size,
        num_blocks=c.num_blocks,
        max_num_batched_tokens=c.max_num_batched_tokens,
        max_num_seqs=c.max_num_seqs,
        max_model_len=c.max_model_len,
        enable_chunked_prefill=c.enable_chunked_prefill,
        long_prefill_token_threshold=c.long_prefill_token_threshold,
        long_prefill_needs_chunked_prefill=c.long_prefill_needs_chunked_prefill,
        enable_prefix_caching=False,
        watermark=0.0,
        policy="fcfs",
        num_speculative_tokens=c.num_speculative_tokens,
        num_lookahead_tokens=c.num_lookahead_tokens,
        async_scheduling=c.async_scheduling,
        pad_spec_decode=c.pad_spec_decode,
    )


def to_trace(reached: Reached, drain: bool = True) -> Trace:
    """The trace of the run; drain=True adds a Drain so later consequences show too."""
    config = reached_config(reached)
    events: list[Event] = []
    for slot, length in enumerate(reached.prompt_lengths):
        first = 100 * slot  # distinct tokens per request
        events.append(
            AddRequest(
                request_id=request_id(slot),
                prompt_token_ids=tuple(range(first, first + length)),
                max_tokens=reached.max_tokens[slot],
            )
        )
    for choices in reached.steps:
        accepted = {request_id(s): a for s, a in choices.accepted.items()}
        events.append(Step(StepDecisions(accepted=accepted)))
        if choices.proposed:
            events.append(ProposeDrafts({request_id(s): k for s, k in choices.proposed.items()}))
    if drain:
        events.append(Drain())
    note = (
        f"Z3 counterexample: {reached.variant.name} breaks {reached.invariant_id} in step "
        f"{len(reached.steps)}"
    )
    return Trace(config=config, events=tuple(events), note=note)
