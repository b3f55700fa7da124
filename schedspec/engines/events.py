"""The events of a trace: what the harness does to an engine, in order."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from schedspec.engines.fake_model import StepDecisions
from schedspec.spec import Request


@dataclass(frozen=True)
class AddRequest:
    request_id: str
    prompt_token_ids: tuple[int, ...]
    max_tokens: int
    eos_token_id: int | None = None
    stop_token_ids: tuple[int, ...] = ()
    priority: int = 0

    def to_request(self) -> Request:
        """A fresh spec Request: each engine gets its own object."""
        return Request(
            self.request_id,
            self.prompt_token_ids,
            self.max_tokens,
            eos_token_id=self.eos_token_id,
            stop_token_ids=self.stop_token_ids,
            priority=self.priority,
        )


@dataclass(frozen=True)
class Abort:
    request_ids: tuple[str, ...]


@dataclass(frozen=True)
class ProposeDrafts:
    num_drafts: Mapping[str, int]  # request -> how many drafts the drafter proposes


@dataclass(frozen=True)
class Step:
    """schedule(), the model's output for it (shaped by these decisions), update_from_output().

    `aborts` arrive while the step's model runs, and the engine's own loop applies them
    where it does. vLLM's engine core drains its abort queue just before
    update_from_output of the step that lands (`EngineCore.step` and
    `step_with_batch_queue` alike): the aborted requests' blocks are freed with their
    step's output still to land. In an engine step that lands nothing, and in an SGLang
    family engine (whose loop takes aborts only at the start of an iteration), they
    apply after the step, as an Abort event would.
    """

    decisions: StepDecisions = field(default_factory=StepDecisions)
    aborts: tuple[str, ...] = ()


@dataclass(frozen=True)
class Drain:
    """Step with no arrivals until nothing is unfinished; then the liveness checks."""


Event = AddRequest | Abort | ProposeDrafts | Step | Drain
