"""What one schedule() call has decided so far: the budget left and who got what."""

from __future__ import annotations

from dataclasses import dataclass, field

from schedspec.spec import Request


@dataclass
class StepPlan:
    token_budget: int
    num_scheduled_tokens: dict[str, int] = field(default_factory=dict)
    spec_decode_tokens: dict[str, tuple[int, ...]] = field(default_factory=dict)
    new_block_ids: dict[str, tuple[int, ...]] = field(default_factory=dict)
    scheduled_running: list[Request] = field(default_factory=list)
    scheduled_new: list[Request] = field(default_factory=list)
    scheduled_resumed: list[Request] = field(default_factory=list)
    preempted: list[Request] = field(default_factory=list)

    def schedule(self, request: Request, num_tokens: int, new_block_ids: tuple[int, ...]) -> None:
        self.num_scheduled_tokens[request.request_id] = num_tokens
        self.new_block_ids[request.request_id] = new_block_ids
        self.token_budget -= num_tokens

    def unschedule(self, request: Request) -> None:
        """Undo a running request's place in this step (it was preempted after it)."""
        rid = request.request_id
        self.token_budget += self.num_scheduled_tokens.pop(rid)
        self.new_block_ids.pop(rid)
        self.spec_decode_tokens.pop(rid, None)
        self.scheduled_running.remove(request)
