"""A live request as the spec's RequestState, from the few fields only the engine knows.

Of a RequestState's twenty-two fields an engine must give five: its outputs, its computed
count, its status, its block table and how often it was preempted (EngineRequest). What
the harness gave at add_request (the prompt, priority, arrival, max_tokens, EOS and
stop tokens, the KV connector's RemoteKV) the adapter keeps (Given); what is in flight
it counts (pipeline.Pipeline). An engine that keeps one of those fields in its own
words (SGLang's clipped max_new_tokens, vLLM's own in-flight counters) gives it here
instead, and the engine's word wins.
"""

from __future__ import annotations

from typing import NamedTuple

from schedspec.adapters.kit.given import Given
from schedspec.adapters.kit.pipeline import InFlight
from schedspec.spec import RequestState, RequestStatus

_IDLE = InFlight()


class EngineRequest(NamedTuple):
    """What only the engine knows about a live request."""

    output_token_ids: tuple[int, ...]
    num_computed_tokens: int  # tokens computed or scheduled (vLLM advances it at schedule)
    status: RequestStatus  # WAITING, RUNNING or PREEMPTED (WAITING_FOR_REMOTE_KVS)
    block_ids: tuple[int, ...]  # its block table, in the spec's block ids
    num_preemptions: int
    # The engine's own word, where it keeps one (None: as given).
    prompt_token_ids: tuple[int, ...] | None = None
    max_tokens: int | None = None
    spec_token_ids: tuple[int, ...] = ()  # drafts to verify (engines with drafts)
    abort_pending: bool = False  # aborted, finishing when its running step lands


def request_state(
    request_id: str, given: Given, engine: EngineRequest, in_flight: InFlight = _IDLE
) -> RequestState:
    """The spec's state of one live request: the engine's fields, what the harness gave,
    and what is in flight."""
    prompt = engine.prompt_token_ids
    return RequestState(
        request_id=request_id,
        priority=given.priority,
        arrival=given.arrival,
        prompt_token_ids=given.prompt_token_ids if prompt is None else prompt,
        output_token_ids=engine.output_token_ids,
        spec_token_ids=engine.spec_token_ids,
        num_computed_tokens=engine.num_computed_tokens,
        status=engine.status,
        block_ids=engine.block_ids,
        num_preemptions=engine.num_preemptions,
        max_tokens=given.max_tokens if engine.max_tokens is None else engine.max_tokens,
        eos_token_id=given.eos_token_id,
        stop_token_ids=given.stop_token_ids,
        num_in_flight_tokens=in_flight.tokens,
        num_output_placeholders=in_flight.placeholders,
        num_stale_output_tokens=in_flight.stale,
        drop_stale_output=in_flight.drop_stale,
        abort_pending=engine.abort_pending,
        is_prefill_chunk=in_flight.prefill_chunk,
        remote_kv=given.remote_kv,
    )
