"""Runs every slot-safety predicate on every executed step and counts the checks."""

from __future__ import annotations

from collections import Counter

import torch

from schedspec.gpu_impl.execution.kv_provenance import KvProvenance, PrefixTags
from schedspec.gpu_impl.execution.model_runner import PagedModelRunner
from schedspec.gpu_impl.execution.slot_safety import PREDICATES, CheckContext, StepView
from schedspec.spec import SchedulerOutput, State


class SlotSafetyError(AssertionError):
    def __init__(self, predicate: str, message: str) -> None:
        super().__init__(f"{predicate}: {message}")
        self.predicate = predicate


def default_tolerance(dtype: torch.dtype) -> float:
    """How far cached KV may drift from a fresh computation by summation order alone."""
    return 1e-9 if dtype == torch.float64 else 1e-3


class SlotSafetyChecker:
    def __init__(self, runner: PagedModelRunner) -> None:
        self.context = CheckContext(
            runner=runner,
            provenance=KvProvenance(runner.cache.num_slots),
            tolerance=default_tolerance(runner.model.dtype),
        )
        self.tags = PrefixTags()
        self.counts: Counter[str] = Counter()

    def check_step(self, scheduler_output: SchedulerOutput, state: State) -> None:
        """Check the runner's last step against the engine's schedule() and snapshot."""
        self.tags.forget(scheduler_output.finished_req_ids)
        step = self.context.runner.last_step
        if step is None:
            return
        sequences: dict[str, tuple[int, ...]] = {}
        tags: dict[str, list[int]] = {}
        for rid, request in state.requests.items():
            known = request.prompt_token_ids + request.output_token_ids
            drafts = tuple(scheduler_output.scheduled_spec_decode_tokens.get(rid, ()))
            sequences[rid] = known + drafts
            tags[rid] = self.tags.of(rid, known, drafts)
        view = StepView(scheduler_output, state, step, sequences, tags)
        for name, predicate in PREDICATES:
            self.counts[name] += 1
            message = predicate(view, self.context)
            if message is not None:
                raise SlotSafetyError(name, message)
