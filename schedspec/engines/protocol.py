"""The engine adapter protocol: how schedspec drives any scheduler.

An adapter speaks the spec's types and maps its engine's concrete state to
the abstract spec.State (the refinement mapping). That is all the suite,
the differential runner and trace replay need. The reference scheduler
already speaks these types, so its adapter is three lines
(adapters/reference.py). Engines are named and loaded in registry.py.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Protocol

from schedspec.spec import (
    ModelRunnerOutput,
    Request,
    RequestOutput,
    SchedulerConfig,
    SchedulerOutput,
    State,
)
from schedspec.spec.invariants import Profile


class EngineAdapter(Protocol):
    # The profiles the engine claims: "safety", and "vllm-v1" if it makes
    # vLLM V1's exact decisions.
    profiles: frozenset[Profile]

    def add_request(self, request: Request) -> None:
        """Queue a fresh request; raise ValueError (changing nothing) if the spec refuses it."""

    def schedule(self) -> SchedulerOutput: ...

    def update_from_output(
        self, scheduler_output: SchedulerOutput, model_runner_output: ModelRunnerOutput
    ) -> Mapping[str, RequestOutput] | None:
        """Apply the model's output. Return each sampling request's kept tokens and
        finish status (checked by STOP), or None if the engine does not expose them."""

    def update_draft_token_ids(self, draft_token_ids: Mapping[str, Sequence[int]]) -> None: ...

    def finish_requests(self, request_ids: Iterable[str]) -> None:
        """Abort these requests; unknown or finished ids are ignored. Called between
        engine steps, and for a vLLM-family engine also between a step's schedule() and
        its update_from_output() (the abort queue vLLM drains there: events.Step)."""

    def snapshot(self) -> State:
        """The engine's state seen through the spec (the refinement mapping)."""


EngineFactory = Callable[[SchedulerConfig], EngineAdapter]
