"""The engine core's order of calls: when to schedule, and when a step's output lands.

A synchronous engine core schedules a step, runs it and applies its output
before it schedules the next. vLLM's async scheduling (its default) runs a
batch queue of two (`EngineCore.step_with_batch_queue`): each engine step
first schedules a new batch if there is anything to schedule, and only once
two batches are in flight (or nothing more can be scheduled) does it wait for
the oldest one and apply its output. So step N+1 is scheduled before step N's
output is applied, and aborts that arrive meanwhile are applied in between.

Every driver (the checked harness, `schedspec run`, `schedspec simulate`)
asks this one policy, so they all drive an engine the same way: BatchQueue is
the rule, EngineLoop drives an engine by it with the harness's model answering.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Generic, TypeVar

from schedspec.engines.fake_model import FakeModel, StepDecisions, StepEngine
from schedspec.spec import ModelRunnerOutput, SchedulerConfig, SchedulerOutput

Item = TypeVar("Item")

# vLLM's max_concurrent_batches with async scheduling and no pipeline parallelism.
ASYNC_BATCH_QUEUE_SIZE = 2


class BatchQueue(Generic[Item]):
    """The steps in flight, oldest first, and the rule for one engine step."""

    def __init__(self, config: SchedulerConfig | None) -> None:
        """The engine core's queue for this config (None: a synchronous one)."""
        pipelined = config is not None and config.async_scheduling
        self.size = ASYNC_BATCH_QUEUE_SIZE if pipelined else 1
        self._items: deque[Item] = deque()

    @property
    def pipelined(self) -> bool:
        return self.size > 1

    def schedules(self, has_requests: bool) -> bool:
        """Does this engine step call schedule()? A synchronous step always does (an
        idle engine must then schedule nothing); the batch queue only when there are
        unfinished requests or finished ones not yet reported."""
        return has_requests or not self.pipelined

    def push(self, item: Item, executed: bool, has_requests: bool) -> bool:
        """Put a scheduled step in flight; True when the oldest step must land now:
        the queue is full, or the step ran nothing and nothing more can be scheduled."""
        self._items.append(item)
        return len(self._items) >= self.size or not (executed or has_requests)

    def pop(self) -> Item:
        """The oldest step in flight, whose output lands next."""
        return self._items.popleft()

    def __len__(self) -> int:
        return len(self._items)

    def __iter__(self) -> Iterator[Item]:
        """The steps in flight, oldest first."""
        return iter(self._items)


@dataclass(frozen=True)
class Landed:
    """A step whose output landed: the output, the model's answer, and what the engine's
    update_from_output returned (its RequestOutputs, or None if it reports none)."""

    output: SchedulerOutput
    model_output: ModelRunnerOutput
    reported: object


@dataclass(frozen=True)
class EngineStep:
    """One engine step: what it scheduled (None: nothing was scheduled) and the step
    whose output landed in it (None: it landed nothing; under async scheduling the
    first step only schedules)."""

    scheduled: SchedulerOutput | None
    landed: Landed | None


class EngineLoop:
    """Drives an engine the way its engine core does (BatchQueue), FakeModel answering.

    has_requests tells whether the engine has unfinished requests (the caller knows:
    the engines' adapters do not all say).
    """

    def __init__(
        self,
        engine: StepEngine,
        model: FakeModel,
        config: SchedulerConfig | None,
        has_requests: Callable[[], bool],
    ) -> None:
        self.engine = engine
        self.model = model
        self.queue: BatchQueue[SchedulerOutput] = BatchQueue(config)
        self.has_requests = has_requests

    @property
    def in_flight(self) -> int:
        return len(self.queue)

    def step(self, decisions: StepDecisions | None = None) -> EngineStep:
        scheduled: SchedulerOutput | None = None
        if self.queue.schedules(self.has_requests()):
            scheduled = self.engine.schedule()
            executed = scheduled.total_num_scheduled_tokens > 0
            if not self.queue.push(scheduled, executed, self.has_requests()):
                return EngineStep(scheduled, None)
        elif not self.queue:
            return EngineStep(None, None)
        return EngineStep(scheduled, self._land(self.queue.pop(), decisions))

    def _land(self, output: SchedulerOutput, decisions: StepDecisions | None) -> Landed:
        """Run the model on the step and apply its output; a synchronous engine core then
        hands the drafter's proposals to the scheduler (an async one never does: the
        model runner fills the placeholder drafts itself)."""
        model_output = self.model.execute(output, decisions)
        reported = self.engine.update_from_output(output, model_output)
        if not self.queue.pipelined:
            drafts = self.model.propose_drafts(model_output)
            if drafts:
                self.engine.update_draft_token_ids(drafts)
        return Landed(output, model_output, reported)


def run_step_reporting(
    scheduler: StepEngine, model: FakeModel
) -> tuple[SchedulerOutput, ModelRunnerOutput, object]:
    """One synchronous engine iteration (schedule, the model, update_from_output, the
    drafter's proposals): the output, the model's answer, and what update_from_output
    returned (an engine's RequestOutputs, or None if it reports none)."""
    step = EngineLoop(scheduler, model, None, lambda: True).step()
    assert step.landed is not None  # a synchronous step lands what it scheduled
    return step.landed.output, step.landed.model_output, step.landed.reported


def run_step(scheduler: StepEngine, model: FakeModel) -> tuple[SchedulerOutput, ModelRunnerOutput]:
    """run_step_reporting without the engine's report."""
    output, model_output, _ = run_step_reporting(scheduler, model)
    return output, model_output
