"""The engine loop with a real model: schedule -> execute -> update -> draft.

It drives any engine that speaks the spec's scheduler API (the reference,
the gpu_impl scheduler, an adapter of a real engine) and collects, per
request, the tokens the engine kept, as its RequestOutputs report them.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from schedspec.gpu_impl.execution.drafter import PerturbedDrafter
from schedspec.gpu_impl.execution.errors import ExecutionError
from schedspec.gpu_impl.execution.model_runner import PagedModelRunner
from schedspec.gpu_impl.execution.slot_checker import SlotSafetyChecker
from schedspec.spec import (
    ModelRunnerOutput,
    Request,
    RequestOutput,
    RequestStatus,
    SchedulerOutput,
    State,
)


class ExecEngine(Protocol):
    """The scheduler API the loop needs; every EngineAdapter provides it."""

    def add_request(self, request: Request) -> None: ...
    def schedule(self) -> SchedulerOutput: ...
    def update_from_output(
        self, scheduler_output: SchedulerOutput, model_runner_output: ModelRunnerOutput
    ) -> Mapping[str, RequestOutput] | None: ...
    def update_draft_token_ids(self, draft_token_ids: Mapping[str, Sequence[int]]) -> None: ...
    def snapshot(self) -> State: ...


@dataclass(frozen=True)
class Arrival:
    step: int  # the 1-based iteration before which the request is added
    request: Request


@dataclass
class ExecutedRun:
    outputs: dict[str, list[int]] = field(default_factory=dict)  # kept tokens per request
    finish_status: dict[str, RequestStatus] = field(default_factory=dict)
    num_steps: int = 0
    num_scheduled_tokens: int = 0
    num_preemptions: int = 0
    num_prefix_hit_tokens: int = 0  # hits at admission and at resumption
    num_drafts: int = 0
    num_accepted_drafts: int = 0


def _due(pending: list[Arrival], iteration: int, idle: bool) -> list[Arrival]:
    """Arrivals to add now; an idle engine jumps to the next arrival instead of spinning."""
    due = [a for a in pending if a.step <= iteration]
    if not due and idle and pending:
        due = [a for a in pending if a.step == min(p.step for p in pending)]
    return due


def _record_step(run: ExecutedRun, out: SchedulerOutput, model_out: ModelRunnerOutput) -> None:
    run.num_steps += 1
    run.num_scheduled_tokens += out.total_num_scheduled_tokens
    run.num_preemptions += len(out.preempted_req_ids)
    run.num_prefix_hit_tokens += sum(n.num_computed_tokens for n in out.scheduled_new_reqs)
    run.num_prefix_hit_tokens += sum(
        c.num_computed_tokens for c in out.scheduled_cached_reqs if c.resumed
    )
    for rid, drafts in out.scheduled_spec_decode_tokens.items():
        run.num_drafts += len(drafts)
        if rid in model_out.sampled_token_ids:
            run.num_accepted_drafts += len(model_out.sampled_token_ids[rid]) - 1


def _collect(run: ExecutedRun, results: Mapping[str, RequestOutput] | None) -> list[str]:
    """Add each request's kept tokens; return the requests that finished."""
    if results is None:
        raise ExecutionError(
            "update_from_output", "the engine must return its RequestOutputs to be executed"
        )
    finished = []
    for rid, result in results.items():
        run.outputs.setdefault(rid, []).extend(result.new_token_ids)
        if result.finish_status is not None:
            run.finish_status[rid] = result.finish_status
            finished.append(rid)
    return finished


def execute_run(
    engine: ExecEngine,
    arrivals: Iterable[Arrival],
    runner: PagedModelRunner,
    drafter: PerturbedDrafter | None = None,
    checker: SlotSafetyChecker | None = None,
    max_steps: int = 100_000,
) -> ExecutedRun:
    """Run every arrival to completion through the engine and the paged runner."""
    pending = list(arrivals)
    live: set[str] = set()
    run = ExecutedRun()
    while pending or live:
        if run.num_steps >= max_steps:
            raise ExecutionError(
                "max_steps",
                f"{len(live) + len(pending)} requests unfinished after {max_steps} steps",
            )
        for arrival in _due(pending, run.num_steps + 1, idle=not live):
            pending.remove(arrival)
            engine.add_request(arrival.request)
            live.add(arrival.request.request_id)
            run.outputs[arrival.request.request_id] = []
        out = engine.schedule()
        model_out = runner.execute_model(out)
        if checker is not None:
            checker.check_step(out, engine.snapshot())
        _record_step(run, out, model_out)
        finished = _collect(run, engine.update_from_output(out, model_out))
        live.difference_update(finished)
        if drafter is not None:
            drafter.forget(finished)
            known = {
                rid: runner.token_ids(rid)
                for rid in model_out.sampled_token_ids
                if rid not in finished
            }
            drafts = drafter.propose_all(known)
            if drafts:
                engine.update_draft_token_ids(drafts)
    return run
