"""When a request is done: EOS, a stop token, max_tokens or max_model_len."""

from __future__ import annotations

from collections.abc import Sequence

from schedspec.spec import Request, RequestStatus


def append_output_tokens(
    request: Request, tokens: Sequence[int], max_model_len: int, trim: bool = True
) -> int:
    """Append tokens one at a time until a stop; return how many were kept.

    A stop is EOS or a stop token, else a length cap (max_model_len tokens, or
    max_tokens outputs). EOS and stop tokens win over the caps, as in vLLM: a
    request that hits EOS on its last allowed token finished STOPPED, not
    LENGTH_CAPPED.

    Tokens after the stop are dropped and (with trim) num_computed_tokens is
    pulled back by their count, so it still covers every kept token but the
    last. Stale output (async, after a preemption reset the count) trims nothing.
    """
    # The lists and stop fields are read once: this runs per sampling request per step.
    output_ids = request.output_token_ids
    all_ids = request.all_token_ids
    eos = request.eos_token_id
    stop_ids = request.stop_token_ids
    max_tokens = request.max_tokens
    kept = 0
    for token in tokens:
        kept += 1
        output_ids.append(token)
        all_ids.append(token)
        # A stop token first, then the caps.
        if token == eos or token in stop_ids:
            status = RequestStatus.FINISHED_STOPPED
        elif len(all_ids) >= max_model_len or len(output_ids) >= max_tokens:
            status = RequestStatus.FINISHED_LENGTH_CAPPED
        else:
            continue
        request.status = status
        if status is RequestStatus.FINISHED_STOPPED and token != eos:
            request.stop_reason = token  # like vLLM: set for stop tokens, not EOS
        if trim:
            request.num_computed_tokens -= len(tokens) - kept
        return kept
    return kept
