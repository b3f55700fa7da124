"""When a generation ends: the spec's stop rules, for runs without a scheduler.

The dense baseline generates one request alone and must stop exactly where
a scheduler stops the same request: EOS or a stop token (kept as the last
output), else max_tokens outputs, else max_model_len tokens in all.
"""

from __future__ import annotations

from dataclasses import dataclass

from schedspec.spec import Request


@dataclass(frozen=True)
class StopRule:
    max_tokens: int
    max_model_len: int
    eos_token_id: int | None = None
    stop_token_ids: tuple[int, ...] = ()

    @staticmethod
    def of(request: Request, max_model_len: int) -> StopRule:
        return StopRule(
            request.max_tokens, max_model_len, request.eos_token_id, request.stop_token_ids
        )

    def is_done(self, num_prompt_tokens: int, output_token_ids: list[int]) -> bool:
        """True once the last output token ends the request."""
        last = output_token_ids[-1]
        return (
            last == self.eos_token_id
            or last in self.stop_token_ids
            or len(output_token_ids) >= self.max_tokens
            or num_prompt_tokens + len(output_token_ids) >= self.max_model_len
        )
