"""Output invariance: a scheduled, paged, batched run emits per request exactly
what the dense baseline emits running that request alone."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

from schedspec.gpu_impl.execution.dense_runner import dense_generate
from schedspec.gpu_impl.execution.drafter import PerturbedDrafter
from schedspec.gpu_impl.execution.executed_run import Arrival, ExecEngine, ExecutedRun, execute_run
from schedspec.gpu_impl.execution.model_runner import PagedModelRunner
from schedspec.gpu_impl.execution.slot_checker import SlotSafetyChecker
from schedspec.gpu_impl.execution.stop_rules import StopRule
from schedspec.gpu_impl.execution.tiny_model import TinyModel
from schedspec.spec import Request, SchedulerConfig

# Relative weight noise of the draft model: enough that a good share of drafts is rejected.
DRAFT_NOISE = 0.3


@dataclass(frozen=True)
class Mismatch:
    request_id: str
    index: int  # first output position where the two runs differ
    paged: tuple[int, ...]
    dense: tuple[int, ...]

    def describe(self) -> str:
        return (
            f"request {self.request_id!r} differs at output {self.index}: "
            f"paged {list(self.paged[self.index : self.index + 4])}..., "
            f"dense {list(self.dense[self.index : self.index + 4])}... "
            f"({len(self.paged)} vs {len(self.dense)} tokens)"
        )


@dataclass(frozen=True)
class InvarianceReport:
    run: ExecutedRun
    num_requests: int
    num_output_tokens: int  # of the dense run
    mismatches: tuple[Mismatch, ...]
    slot_checks: Mapping[str, int]  # predicate -> steps checked (empty: checks off)

    @property
    def matched(self) -> bool:
        return not self.mismatches


def dense_outputs(
    model: TinyModel, requests: Iterable[Request], max_model_len: int
) -> dict[str, list[int]]:
    return {
        r.request_id: dense_generate(model, r.prompt_token_ids, StopRule.of(r, max_model_len))
        for r in requests
    }


def compare_outputs(
    paged: Mapping[str, Sequence[int]], dense: Mapping[str, Sequence[int]]
) -> tuple[Mismatch, ...]:
    mismatches = []
    for rid in sorted(set(paged) | set(dense)):
        a, b = tuple(paged.get(rid, ())), tuple(dense.get(rid, ()))
        if a != b:
            index = next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), None)
            mismatches.append(Mismatch(rid, min(len(a), len(b)) if index is None else index, a, b))
    return tuple(mismatches)


def check_output_invariance(
    engine_factory: Callable[[SchedulerConfig], ExecEngine],
    config: SchedulerConfig,
    model: TinyModel,
    arrivals: Sequence[Arrival],
    runner_factory: Callable[[TinyModel, SchedulerConfig], PagedModelRunner] = PagedModelRunner,
    check_slots: bool = True,
    draft_seed: int = 1,
    max_steps: int = 100_000,
) -> InvarianceReport:
    """Run the arrivals through a fresh engine and the paged runner, slot checks on
    every step unless check_slots is off, and compare with the dense baseline.

    The dense run reads each arrival's prompt and stop parameters before the
    engine sees (and mutates) the Request.
    """
    dense = dense_outputs(model, [a.request for a in arrivals], config.max_model_len)
    runner = runner_factory(model, config)
    drafter = None
    if config.num_speculative_tokens:
        drafter = PerturbedDrafter(
            model.perturbed(DRAFT_NOISE, draft_seed),
            config.num_speculative_tokens,
            config.max_model_len,
        )
    checker = SlotSafetyChecker(runner) if check_slots else None
    run = execute_run(engine_factory(config), arrivals, runner, drafter, checker, max_steps)
    return InvarianceReport(
        run=run,
        num_requests=len(dense),
        num_output_tokens=sum(len(t) for t in dense.values()),
        mismatches=compare_outputs(run.outputs, dense),
        slot_checks=dict(checker.counts) if checker is not None else {},
    )
