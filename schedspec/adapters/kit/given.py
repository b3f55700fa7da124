"""What the harness said about a request, kept by the adapter: the RequestState fields an
engine need not keep in the spec's words (or at all).

An engine keeps a request's prompt and sampling parameters in its own shape (SGLang folds
EOS into its stop tokens and has no priority field under FCFS; vLLM keeps an arrival
time, not an index). Every adapter therefore remembers, per live request, what
add_request was given and the request's arrival index, and reads them back into the
snapshot from here.
"""

from __future__ import annotations

from dataclasses import dataclass

from schedspec.spec import RemoteKV, Request


@dataclass(frozen=True)
class Given:
    """A request as add_request received it, and its position in arrival order."""

    arrival: int
    priority: int
    eos_token_id: int | None
    stop_token_ids: tuple[int, ...]
    prompt_token_ids: tuple[int, ...] = ()
    max_tokens: int = 0
    remote_kv: RemoteKV | None = None

    @staticmethod
    def of(request: Request, arrival: int) -> Given:
        """What `request` says, as the `arrival`-th request added."""
        return Given(
            arrival=arrival,
            priority=request.priority,
            eos_token_id=request.eos_token_id,
            stop_token_ids=tuple(request.stop_token_ids),
            prompt_token_ids=tuple(request.prompt_token_ids),
            max_tokens=request.max_tokens,
            remote_kv=request.remote_kv,
        )
