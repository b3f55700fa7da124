"""When a request is done: EOS, a stop token, max_tokens or max_model_len."""

from __future__ import annotations

from collections.abc import Sequence

from schedspec.spec import Request, RequestStatus


def check_stop(request: Request, token: int, max_model_len: int) -> RequestStatus | None:
    """The finished status that appending `token` puts the request in, or None.

    EOS and stop tokens win over the length caps, as in vLLM: a request that
    hits EOS on its last allowed token finished STOPPED, not LENGTH_CAPPED.
    """
    if token == request.eos_token_id or token in request.stop_token_ids:
        return RequestStatus.FINISHED_STOPPED
    if (
        len(request.all_token_ids) >= max_model_len
        or len(request.output_token_ids) >= request.max_tokens
    ):
        return RequestStatus.FINISHED_LENGTH_CAPPED
    return None


def append_output_tokens(
    request: Request, tokens: Sequence[int], max_model_len: int, trim: bool = True
) -> int:
    """Append tokens one at a time until a stop; return how many were kept.

    Tokens after the stop are dropped and (with trim) num_computed_tokens is
    pulled back by their count, so it still covers every kept token but the
    last. Stale output (async, after a preemption reset the count) trims nothing.
    """
    for kept, token in enumerate(tokens, 1):
        request.append_output_token_id(token)
        status = check_stop(request, token, max_model_len)
        if status is not None:
            request.status = status
            if status is RequestStatus.FINISHED_STOPPED and token != request.eos_token_id:
                request.stop_reason = token  # like vLLM: set for stop tokens, not EOS
            if trim:
                request.num_computed_tokens -= len(tokens) - kept
            return kept
    return len(tokens)
