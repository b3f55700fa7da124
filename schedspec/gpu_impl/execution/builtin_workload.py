"""The CLI's built-in workload, fitted to the tiny model, and the report of its run.

The workload module is written for the fake model (32,000 token ids, EOS
chosen as the token the fake model emits at a position). Here prompts are
folded into the tiny model's vocabulary, and a request meant to stop early
takes as EOS the token the tiny model itself emits at that position.
The builder is passed in, so this package keeps depending on the spec only.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol

from schedspec.gpu_impl.execution.dense_runner import dense_generate
from schedspec.gpu_impl.execution.executed_run import Arrival, ExecEngine
from schedspec.gpu_impl.execution.invariance import InvarianceReport, check_output_invariance
from schedspec.gpu_impl.execution.slot_checker import SlotSafetyError
from schedspec.gpu_impl.execution.stop_rules import StopRule
from schedspec.gpu_impl.execution.tiny_model import TinyModel, TinyModelConfig
from schedspec.spec import Request, SchedulerConfig

TokenAt = Callable[[str, int], int]  # (request id, position) -> the token emitted there


class WorkloadItem(Protocol):
    @property
    def request_id(self) -> str: ...
    @property
    def arrival_step(self) -> int: ...
    @property
    def prompt_token_ids(self) -> tuple[int, ...]: ...
    @property
    def max_tokens(self) -> int: ...
    @property
    def priority(self) -> int: ...


def fit_workload(
    build: Callable[[TokenAt], Sequence[WorkloadItem]], model: TinyModel, max_model_len: int
) -> list[Arrival]:
    """build(token_at) gives the workload; token_at is asked for the token at each
    early stop's position, which the dense run of the tiny model then supplies."""
    stop_at: dict[str, int] = {}

    def record(request_id: str, position: int) -> int:
        stop_at[request_id] = position
        return 0  # replaced below, once the prompt is known

    arrivals = []
    for item in build(record):
        prompt = [t % model.config.vocab_size for t in item.prompt_token_ids]
        eos = None
        if item.request_id in stop_at:
            rule = StopRule(stop_at[item.request_id] - len(prompt) + 1, max_model_len)
            eos = dense_generate(model, prompt, rule)[-1]
        request = Request(
            item.request_id, prompt, item.max_tokens, eos_token_id=eos, priority=item.priority
        )
        arrivals.append(Arrival(item.arrival_step, request))
    return arrivals


def report_lines(report: InvarianceReport, model: TinyModel) -> list[str]:
    cfg = model.config
    run = report.run
    lines = [
        f"Model: tiny transformer, {cfg.num_layers} layers, {cfg.num_heads} heads, "
        f"hidden {cfg.hidden_size}, vocab {cfg.vocab_size}, seed {cfg.seed}, "
        f"{str(model.dtype).removeprefix('torch.')} on {model.device}",
        f"Steps: {run.num_steps}  tokens scheduled: {run.num_scheduled_tokens}  "
        f"preemptions: {run.num_preemptions}  prefix-hit tokens: {run.num_prefix_hit_tokens}  "
        f"drafts accepted: {run.num_accepted_drafts}/{run.num_drafts}",
    ]
    if report.slot_checks:
        names = ", ".join(report.slot_checks)
        steps = max(report.slot_checks.values())
        lines.append(f"Slot safety held on all {steps} executed steps: {names}")
    matched = report.num_requests - len(report.mismatches)
    lines.append(
        f"Output invariance: {matched}/{report.num_requests} requests matched the dense "
        f"one-request-at-a-time run ({report.num_output_tokens} tokens)"
    )
    lines.extend(m.describe() for m in report.mismatches)
    return lines


def execute_builtin_workload(
    build: Callable[[TokenAt], Sequence[WorkloadItem]],
    engine_factory: Callable[[SchedulerConfig], ExecEngine],
    config: SchedulerConfig,
    seed: int,
    max_steps: int,
) -> tuple[bool, list[str]]:
    """Run the workload through the engine and the tiny model with every slot check;
    (True, report) when every request matched the dense run, else (False, report)."""
    model = TinyModel(TinyModelConfig(seed=seed))
    arrivals = fit_workload(build, model, config.max_model_len)
    try:
        report = check_output_invariance(
            engine_factory, config, model, arrivals, draft_seed=seed + 1, max_steps=max_steps
        )
    except SlotSafetyError as violation:
        return False, [f"Slot safety violated: {violation}"]
    return report.matched, report_lines(report, model)
