"""`schedspec run`: the built-in mixed workload through the reference scheduler.

Prints one line per iteration and a summary (printing/run_report.py); with --execute,
the same workload runs through a tiny paged-attention model instead
(gpu_impl/execution), which needs torch.
"""

from __future__ import annotations

import dataclasses
import json
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import click

from schedspec.cli.loading import require_for
from schedspec.cli.mixed_workload import WorkloadRequest, build_workload
from schedspec.cli.printing.run_report import (
    Scheduled,
    StepRecord,
    Summary,
    format_step,
    format_summary,
    record_step,
    summarize,
)
from schedspec.engines.dependencies import TORCH
from schedspec.engines.fake_model import FakeModel
from schedspec.engines.pipeline import EngineLoop
from schedspec.reference import Scheduler
from schedspec.spec import ConfigError, Request, SchedulerConfig

# Caps a long prompt's chunk so decodes in the same step are not starved.
DEFAULT_PREFILL_CAP = 256


class NotDrainedError(Exception):
    """The workload still had unfinished requests after --max-steps iterations."""


@dataclass
class Run:
    records: list[StepRecord]
    summary: Summary


def _due(pending: list[WorkloadRequest], iteration: int, idle: bool) -> list[WorkloadRequest]:
    """The arrivals to add before this iteration.

    An idle engine does not spin through empty iterations: it waits for the
    next arrival, so that one is delivered at once.
    """
    due = [w for w in pending if w.arrival_step <= iteration]
    if not due and idle and pending:
        due = [w for w in pending if w.arrival_step == pending[0].arrival_step]
    return due


def run_workload(
    config: SchedulerConfig,
    workload: list[WorkloadRequest],
    model: FakeModel,
    max_steps: int,
    on_step: Callable[[StepRecord], None] | None = None,
) -> Run:
    """The workload through the reference, driven as its engine core drives it (with
    async scheduling each iteration schedules a step and lands the one before)."""
    scheduler = Scheduler(config)
    loop = EngineLoop(scheduler, model, config, scheduler.has_unfinished_requests)
    pending = sorted(workload, key=lambda w: w.arrival_step)
    requests: dict[str, Request] = {}
    records: list[StepRecord] = []
    in_flight: deque[Scheduled] = deque()
    while pending or scheduler.has_unfinished_requests() or loop.in_flight:
        if len(records) >= max_steps:
            raise NotDrainedError(
                f"{scheduler.get_num_unfinished_requests() + len(pending)} requests unfinished "
                f"after --max-steps {max_steps}; raise it or give the scheduler more room"
            )
        iteration = len(records) + 1
        idle = not scheduler.has_unfinished_requests() and not loop.in_flight
        arrived = _due(pending, iteration, idle)
        for w in arrived:
            pending.remove(w)
            requests[w.request_id] = w.to_request()
            scheduler.add_request(requests[w.request_id])
        # Token counts as schedule() sees them; update_from_output changes them.
        live = {rid: r for rid, r in requests.items() if not r.is_finished}
        num_tokens = {rid: r.num_tokens for rid, r in live.items()}
        num_outputs = {rid: r.num_output_tokens for rid, r in live.items()}
        step = loop.step()
        scheduled = None
        if step.scheduled is not None:
            scheduled = Scheduled(iteration, step.scheduled, num_tokens, num_outputs)
            in_flight.append(scheduled)
        landed = None
        if step.landed is not None:
            reported = step.landed.reported
            assert isinstance(reported, dict)  # the reference reports its RequestOutputs
            landed = (in_flight.popleft(), step.landed.model_output, reported)
        record = record_step(
            iteration,
            [w.request_id for w in arrived],
            scheduled,
            landed,
            config.max_num_batched_tokens,
            scheduler.kv_cache_manager.block_pool.get_usage(),
            pipelined=loop.queue.pipelined,
        )
        records.append(record)
        if on_step is not None:
            on_step(record)
    kv = scheduler.kv_cache_manager
    summary = summarize(
        records,
        requests,
        kv.prefix_cache_queries,
        kv.prefix_cache_hits,
        config.enable_prefix_caching,
        kv.block_pool.get_usage(),
    )
    return Run(records, summary)


def _build_config(**fields: Any) -> SchedulerConfig:
    """SchedulerConfig validates every field; report its refusal as a usage error (exit 2)."""
    if fields.get("long_prefill_token_threshold") is None:
        # The cap may not exceed max_model_len; a default must not make a
        # valid --max-model-len an error.
        fields["long_prefill_token_threshold"] = min(DEFAULT_PREFILL_CAP, fields["max_model_len"])
    try:
        return SchedulerConfig(**fields)
    except ConfigError as err:
        flag = "--" + err.field.replace("_", "-")
        raise click.BadParameter(str(err), param_hint=f"'{flag}'") from None


# Defaults are sized so the built-in workload shows every scheduling path:
# chunked prefills, mixed batches, drafts, prefix hits and preemption.
@click.command()
@click.option("--block-size", default=16, show_default=True, help="Tokens per KV block.")
@click.option("--num-blocks", default=80, show_default=True, help="KV blocks in the cache.")
@click.option(
    "--max-num-batched-tokens", default=512, show_default=True, help="Token budget per step."
)
@click.option("--max-num-seqs", default=16, show_default=True, help="Most running requests.")
@click.option("--max-model-len", default=1024, show_default=True, help="Most tokens per request.")
@click.option(
    "--enable-chunked-prefill/--no-enable-chunked-prefill",
    default=True,
    show_default=True,
    help="Split long prompts across steps.",
)
@click.option(
    "--long-prefill-token-threshold",
    type=int,
    default=None,
    help="Per-request prefill cap per step when others are present (0 = none) "
    f"[default: {DEFAULT_PREFILL_CAP}, or max-model-len if smaller].",
)
@click.option(
    "--enable-prefix-caching/--no-enable-prefix-caching",
    default=True,
    show_default=True,
    help="Reuse KV blocks of identical prefixes.",
)
@click.option(
    "--watermark",
    default=0.04,
    show_default=True,
    help="Fraction of blocks kept free when admitting.",
)
@click.option(
    "--policy",
    type=click.Choice(["fcfs", "priority"]),
    default="fcfs",
    show_default=True,
    help="Queue order and preemption victim: fcfs (arrival order; the last running request "
    "is preempted) or priority (lower value first; the largest (priority, arrival) is "
    "preempted).",
)
@click.option(
    "--num-speculative-tokens", default=2, show_default=True, help="Drafts verified per step."
)
@click.option(
    "--num-lookahead-tokens",
    type=int,
    default=None,
    help="KV slots reserved past the step for the drafter [default: num-speculative-tokens].",
)
@click.option(
    "--async-scheduling/--no-async-scheduling",
    default=False,
    show_default=True,
    help="Schedule each step before the previous one's output lands, as vLLM does by "
    "default (the timeline marks output positions in flight, and stale or dropped output).",
)
@click.option(
    "--pad-spec-decode/--no-pad-spec-decode",
    default=False,
    show_default=True,
    help="Pad a one-token admission to 1 + num-speculative-tokens with placeholder drafts, "
    "as vLLM does when drafting.",
)
@click.option("--seed", default=0, show_default=True, help="Seeds the workload and the model.")
@click.option(
    "--max-steps",
    default=10_000,
    show_default=True,
    type=click.IntRange(min=1),
    help="Fail if the workload has not drained after this many iterations.",
)
@click.option("--quiet", is_flag=True, help="Print the summary only.")
@click.option("--json", "as_json", is_flag=True, help="One JSON document: config, steps, summary.")
@click.option(
    "--execute",
    is_flag=True,
    help="Run the workload through a tiny paged-attention model instead of the fake one, "
    "check slot safety on every step, and fail unless every request's output matches a "
    "dense one-request-at-a-time run.",
)
def run(
    seed: int, max_steps: int, quiet: bool, as_json: bool, execute: bool, **config_fields: Any
) -> None:
    """Run the built-in mixed workload through the reference scheduler."""
    config = _build_config(**config_fields)
    if execute:
        _execute(config, seed, max_steps, as_json)
        return
    model = FakeModel(seed=seed, num_speculative_tokens=config.num_speculative_tokens)
    workload = build_workload(config.max_model_len, seed, model.token_at)
    printer = None if quiet or as_json else lambda r: click.echo(format_step(r))
    try:
        result = run_workload(config, workload, model, max_steps, printer)
    except NotDrainedError as err:
        raise click.ClickException(str(err)) from None
    if as_json:
        document: dict[str, Any] = {"config": dataclasses.asdict(config)}
        if not quiet:
            document["steps"] = [dataclasses.asdict(r) for r in result.records]
        document["summary"] = dataclasses.asdict(result.summary)
        click.echo(json.dumps(document, indent=2))
        return
    if not quiet:
        click.echo()
    for line in format_summary(result.summary):
        click.echo(line)


def _execute(config: SchedulerConfig, seed: int, max_steps: int, as_json: bool) -> None:
    """`run --execute`: torch is imported only here, so a plain `run` stays light."""
    if as_json:
        raise click.UsageError("--execute prints a text report; drop --json")
    if config.async_scheduling or config.pad_spec_decode:
        raise click.UsageError(
            "--execute runs the paged model step by step, with drafts from its own drafter "
            "(no placeholders); drop --async-scheduling and --pad-spec-decode"
        )
    require_for("--execute", TORCH)
    import torch

    from schedspec.gpu_impl.execution.builtin_workload import execute_builtin_workload

    torch.set_num_threads(1)  # a tiny model: threads only add overhead
    ok, lines = execute_builtin_workload(
        lambda token_at: build_workload(config.max_model_len, seed, token_at),
        Scheduler,
        config,
        seed,
        max_steps,
    )
    for line in lines:
        click.echo(line)
    if not ok:
        raise click.ClickException("the paged run failed its checks (see above)")
