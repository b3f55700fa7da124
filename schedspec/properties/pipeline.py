"""The engine core's order of calls: when to schedule, and when a step's output lands.

A synchronous engine core schedules a step, runs it and applies its output
before it schedules the next. vLLM's async scheduling (its default) runs a
batch queue of two (`EngineCore.step_with_batch_queue`): each engine step
first schedules a new batch if there is anything to schedule, and only once
two batches are in flight (or nothing more can be scheduled) does it wait for
the oldest one and apply its output. So step N+1 is scheduled before step N's
output is applied, and aborts that arrive meanwhile are applied in between.

Every driver (the checked harness, `schedspec run`, `schedspec simulate`)
asks this one policy, so they all drive an engine the same way.
"""

from __future__ import annotations

from collections import deque
from typing import Generic, TypeVar

from schedspec.spec import SchedulerConfig

Item = TypeVar("Item")

# vLLM's max_concurrent_batches with async scheduling and no pipeline parallelism.
ASYNC_BATCH_QUEUE_SIZE = 2


class BatchQueue(Generic[Item]):
    """The steps in flight, oldest first, and the rule for one engine step."""

    def __init__(self, config: SchedulerConfig) -> None:
        self.size = ASYNC_BATCH_QUEUE_SIZE if config.async_scheduling else 1
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
