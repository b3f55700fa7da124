"""The engine core's order of calls for B instances at once: which instances schedule,
and which step lands in each.

A synchronous engine core schedules every step and applies its output before it
schedules the next. vLLM's async scheduling runs a batch queue of two: an engine
step schedules only where there is something to schedule (unfinished requests, or
finished ones not reported yet), and the oldest step in flight lands once two are
in flight or nothing more can be scheduled (the step just scheduled ran nothing and
no request is left). So each instance holds at most one step in flight between
ticks; `SwarmQueue` keeps that step ([B, S] fields, `held` says where) and picks,
per instance, the step that lands this tick. It is the device form of the harness's
rule (schedspec.engines.pipeline.BatchQueue), so that a swarm instance replayed
through the harness lands the same steps at the same events.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from schedspec.gpu_impl.batch_state import EMPTY, BatchState
from schedspec.gpu_impl.step_plan import StepPlan


@dataclass(frozen=True)
class StepInFlight:
    """What landing a scheduled step needs ([B, S], drafts [B, S, K]): the tokens each
    slot ran, its computed count before, its drafts, its rank, and (async) which
    request the slot held when the step was scheduled (its arrival index): a slot
    emptied and taken by a new request since must not take the old request's output."""

    scheduled: torch.Tensor
    computed_before: torch.Tensor
    num_drafts: torch.Tensor
    drafts: torch.Tensor
    rank: torch.Tensor
    arrival: torch.Tensor | None  # None: the step lands in the tick that scheduled it

    @staticmethod
    def of(plan: StepPlan, arrival: torch.Tensor | None = None) -> StepInFlight:
        return StepInFlight(
            plan.scheduled, plan.computed_before, plan.num_drafts, plan.drafts, plan.rank, arrival
        )

    def _mapped(
        self, each: Callable[[torch.Tensor, torch.Tensor], torch.Tensor], other: StepInFlight
    ) -> StepInFlight:
        """each(field, other's field) for every field (arrival where both have one)."""
        arrival = None
        if self.arrival is not None and other.arrival is not None:
            arrival = each(self.arrival, other.arrival)
        return StepInFlight(
            each(self.scheduled, other.scheduled),
            each(self.computed_before, other.computed_before),
            each(self.num_drafts, other.num_drafts),
            each(self.drafts, other.drafts),
            each(self.rank, other.rank),
            arrival,
        )

    def widened(self, slots: int) -> StepInFlight:
        """The same step over `slots` slots (the engine widens its tensors when a request
        names a slot past them; the new slots ran nothing in this step)."""
        extra = slots - self.scheduled.shape[1]
        if extra <= 0:
            return self

        def pad(x: torch.Tensor, _: torch.Tensor) -> torch.Tensor:
            return torch.cat([x, x.new_zeros((x.shape[0], extra, *x.shape[2:]))], dim=1)

        return self._mapped(pad, self)

    def chosen(self, mask: torch.Tensor, other: StepInFlight) -> StepInFlight:
        """Per instance ([B] mask), this step where mask holds, `other` elsewhere."""

        def pick(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
            return torch.where(mask.view(-1, *([1] * (a.dim() - 1))), a, b)

        return self._mapped(pick, other)

    def still_there(self, state: BatchState) -> torch.Tensor:
        """[B, S] the slots that still hold the request this step was scheduled for."""
        if self.arrival is None:
            return torch.ones_like(self.scheduled, dtype=torch.bool)
        return (state.status != EMPTY) & (state.arrival == self.arrival)


class SwarmQueue:
    """Per instance, the step in flight between ticks (async: at most one), and the
    rule that picks the step landing in a tick."""

    def __init__(self, state: BatchState, pipelined: bool) -> None:
        self.pipelined = pipelined
        device = state.device
        # Finished (or aborted) requests not reported by a schedule() yet: an instance
        # with one schedules even with no request left (vLLM's has_requests).
        self.unreported = torch.zeros(state.batch, dtype=torch.bool, device=device)
        self.held = torch.zeros(state.batch, dtype=torch.bool, device=device)
        self.step: StepInFlight | None = None

    def schedules(self, state: BatchState) -> torch.Tensor | None:
        """[B] the instances that schedule this tick; None: all of them (synchronous)."""
        if not self.pipelined:
            return None
        live = (state.status != EMPTY).any(dim=1)
        return live | self.unreported

    def land(
        self, state: BatchState, plan: StepPlan, schedules: torch.Tensor | None
    ) -> tuple[StepInFlight, torch.Tensor | None]:
        """After schedule(): the step landing in each instance this tick and [B] where one
        lands (None: every instance lands the plan just made)."""
        if schedules is None:
            return StepInFlight.of(plan), None
        self.unreported &= ~schedules
        new = StepInFlight.of(plan, state.arrival.clone())
        executed = plan.scheduled.sum(dim=1) > 0
        live = (state.status != EMPTY).any(dim=1)
        # A scheduling instance lands when its queue is full or the step ran nothing and
        # nothing is left to schedule; one that did not schedule lands what it holds.
        lands = torch.where(schedules, self.held | ~(executed | live), self.held)
        held = self.step.widened(state.slots) if self.step is not None else new
        landing = held.chosen(self.held, new)
        # What stays in flight: the new step, where it did not land at once.
        self.step = new.chosen(schedules, held)
        self.held = schedules & (self.held | ~lands)
        return landing, lands

    def finished(self, mask: torch.Tensor) -> None:
        """Requests that finished or were aborted ([B, S], or [B] by instance): the next
        schedule() of their instance reports them."""
        if self.pipelined:
            self.unreported |= mask.any(dim=1) if mask.dim() == 2 else mask
