"""A pass-through adapter that remembers what its engine said, call by call.

CheckedEngine keeps only the latest abstract state. The replay log (which
prints every step's decisions) and the lockstep diff (which compares two
engines after every call) need more, and get it from this wrapper without
touching the harness.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import NamedTuple

from schedspec.engines.capabilities import claimed_capabilities
from schedspec.engines.profiles import claimed_profiles
from schedspec.engines.protocol import EngineAdapter
from schedspec.spec import ModelRunnerOutput, Request, RequestOutput, SchedulerOutput, State


class Admission(NamedTuple):
    """add_request's outcome: None if accepted, else the refusal's type and message."""

    request_id: str
    refusal: str | None


class Scheduled(NamedTuple):
    output: SchedulerOutput


class ModelAnswer(NamedTuple):
    """The harness model's answer, as passed to update_from_output."""

    output: ModelRunnerOutput


class Snapshot(NamedTuple):
    after: str  # the engine call this state follows ("start": none yet)
    state: State


Observation = Admission | Scheduled | ModelAnswer | Snapshot


class RecordingEngine:
    """Passes every call through, remembering outputs, answers and snapshots in order."""

    def __init__(self, inner: EngineAdapter) -> None:
        self.inner = inner
        self.profiles = claimed_profiles(inner)
        self.capabilities = claimed_capabilities(inner)
        self.outputs: list[SchedulerOutput] = []  # every schedule() result
        self.observations: list[Observation] = []
        self._last_call = "start"

    def add_request(self, request: Request) -> None:
        self._last_call = "add_request"
        try:
            self.inner.add_request(request)
        except Exception as err:
            refusal = f"{type(err).__name__}: {err}"
            self.observations.append(Admission(request.request_id, refusal))
            raise
        self.observations.append(Admission(request.request_id, None))

    def schedule(self) -> SchedulerOutput:
        self._last_call = "schedule"
        output = self.inner.schedule()
        self.outputs.append(output)
        self.observations.append(Scheduled(output))
        return output

    def update_from_output(
        self, scheduler_output: SchedulerOutput, model_runner_output: ModelRunnerOutput
    ) -> Mapping[str, RequestOutput] | None:
        self._last_call = "update_from_output"
        self.observations.append(ModelAnswer(model_runner_output))
        return self.inner.update_from_output(scheduler_output, model_runner_output)

    def update_draft_token_ids(self, draft_token_ids: Mapping[str, Sequence[int]]) -> None:
        self._last_call = "update_draft_token_ids"
        self.inner.update_draft_token_ids(draft_token_ids)

    def finish_requests(self, request_ids: Iterable[str]) -> None:
        self._last_call = "finish_requests"
        self.inner.finish_requests(request_ids)

    def snapshot(self) -> State:
        state = self.inner.snapshot()
        self.observations.append(Snapshot(self._last_call, state))
        return state
