"""What the runner knows about each request, learned only from SchedulerOutputs.

Like vLLM's model runner: a new request brings its prompt and whole block
table; a running one brings the blocks appended this step; a resumed one
(after preemption) brings a replacement table; the runner itself appends
the tokens it samples. Nothing here reads the scheduler's state.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from schedspec.gpu_impl.execution.errors import ExecutionError
from schedspec.spec import SchedulerOutput


@dataclass
class RunnerRequestState:
    request_id: str
    num_prompt_tokens: int
    token_ids: list[int]  # prompt, then the outputs this runner sampled
    block_ids: list[int]  # the block table
    num_computed_tokens: int = 0  # before the current step


@dataclass
class RequestStates:
    requests: dict[str, RunnerRequestState] = field(default_factory=dict)

    def apply(self, out: SchedulerOutput) -> None:
        """Bring every request up to date with one step's SchedulerOutput."""
        for rid in out.finished_req_ids:
            self.requests.pop(rid, None)
        for rid in out.preempted_req_ids:
            if rid in self.requests:
                self.requests[rid].block_ids = []  # freed; the tokens stay
        for new in out.scheduled_new_reqs:
            self.requests[new.request_id] = RunnerRequestState(
                new.request_id,
                len(new.prompt_token_ids),
                list(new.prompt_token_ids),
                list(new.block_ids),
                new.num_computed_tokens,
            )
        for cached in out.scheduled_cached_reqs:
            state = self.get(cached.request_id)
            if cached.resumed:
                state.block_ids = list(cached.new_block_ids)
            else:
                state.block_ids.extend(cached.new_block_ids)
            state.num_computed_tokens = cached.num_computed_tokens
            known = state.num_prompt_tokens + cached.num_output_tokens
            if known > len(state.token_ids):
                raise ExecutionError(
                    "num_output_tokens",
                    f"request {cached.request_id!r}: the scheduler counts "
                    f"{cached.num_output_tokens} outputs, the runner sampled "
                    f"{len(state.token_ids) - state.num_prompt_tokens}",
                )
            del state.token_ids[known:]

    def get(self, request_id: str) -> RunnerRequestState:
        state = self.requests.get(request_id)
        if state is None:
            raise ExecutionError(
                "scheduled_cached_reqs", f"request {request_id!r} was never scheduled as new"
            )
        return state
