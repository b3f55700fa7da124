"""`schedspec check --engine gpu --instances N`: swarm mode.

Configs come from the suite's strategy (or --configs), drawn by Hypothesis
from the run's seed: --examples configs, each run as N instances for --max-steps
ticks (campaign/swarm_plan.py: SWARM_QUICK, SWARM_LONG). The first finding stops the
run, is replayed through the harness on the gpu engine and on the reference, shrunk
(unless --no-shrink), and written as a trace.

With --workers, --ray or --duration the configs are split into chunks
(campaign/swarm_chunks.py) run by the same runners as the suite's campaigns
(campaign/backend.py: forked local processes or Ray), on the CPU: a count
run stops at the first finding in chunk order and reports it as a run in one
process does; a campaign (--duration) goes on and keeps every distinct finding's
trace. Needs torch: check.py loads the gpu engine, whose entry in
engines/registry.py asks for it, before importing this module.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path

import click

from schedspec.adapters.gpu import DEVICE_ENV
from schedspec.campaign.swarm import SwarmResult
from schedspec.campaign.swarm_chunks import SwarmCampaign, finding_label, prepare_device
from schedspec.campaign.swarm_plan import (
    SwarmPlan,
    chunks_off_cpu,
    plan_swarm,
    run_swarm_here,
    run_swarm_parallel,
    swarm_device,
)
from schedspec.cli.campaign_run import (
    Coverage,
    echo_backend,
    echo_coverage,
    echo_findings,
    how_much,
    progress_bar,
)
from schedspec.cli.exit_codes import EXIT_CODES, Outcome
from schedspec.cli.interrupts import interrupt_exit_code, interrupt_name
from schedspec.cli.loading import usage_errors
from schedspec.cli.suite_run import SuiteRunOptions, configs_phrase, echo_seed
from schedspec.engines.protocol import EngineFactory
from schedspec.gpu_impl.device_checks import CHECK_IDS
from schedspec.properties.failure_report import plural
from schedspec.properties.run_plan import RunRequest, resolve_plan
from schedspec.properties.strategies.configs import ConfigStrategyError, vet_config_strategy
from schedspec.traces.trace import SWARM_TRACE_STEM, trace_file_name

# What a swarm's chunks count, for the progress bar and the closing line.
UNITS = ("configs", "instance-steps")


def run_swarm_check(
    options: SuiteRunOptions, request: RunRequest, instances: int, factory: EngineFactory
) -> int:
    """Swarm mode: `instances` instances of the gpu engine (`factory`, loaded by check)
    per config of the request."""
    device = swarm_device()
    if chunks_off_cpu(request.backend, device):
        raise click.UsageError(
            f"--workers, --ray, --duration: swarm mode runs chunks on CPU workers only, and "
            f"this run's device is {device} (one process drives a device; --instances sets "
            f"how many instances it steps at once; {DEVICE_ENV}=cpu runs on the CPU)"
        )
    prepare_device(device)  # before anything runs on it, and before workers are forked
    with usage_errors():
        plan = resolve_plan(request, (factory,))  # as check resolves it: what gpu claims
    if plan.config_strategy is not None:
        with _configs_refused():
            vet_config_strategy(plan.config_strategy, plan.seed)
    echo_seed(plan)
    planned = plan_swarm(plan, instances, device)
    how_many = how_much(plan, plural(planned.configs, "config"), "configs")
    click.echo(
        f"swarm: {instances} instances of gpu_impl on {device}, profile {plan.profile}, "
        f"{how_many} of {planned.swarm.ticks} ticks; device checks after every "
        "schedule() and update" + configs_phrase(plan)
    )
    if not request.backend.parallel:
        with _configs_refused():
            results = run_swarm_here(planned, _echo_config())
        _echo_table(results)
        finding = next((r for r in results if r.finding is not None), None)
        if finding is None:
            return _passed(results, plan.seed)
        _report_finding(finding, options.trace_dir, plan.seed, plan.profile)
        return _failed(finding, plan.seed)
    with usage_errors():  # an address given with --ray where no cluster answers
        campaign, where = run_swarm_parallel(
            planned,
            options.trace_dir,
            on_backend=echo_backend,
            on_config=_echo_config(),
            progress=progress_bar(options, UNITS),
        )
    return _campaign_verdict(options, planned, campaign, where)


@contextmanager
def _configs_refused() -> Iterator[None]:
    """A --configs strategy that raises or draws a non-config is a usage error, as in
    one-process check: vetted before the swarm runs, and caught if a later draw fails."""
    try:
        yield
    except ConfigStrategyError as err:
        raise click.BadParameter(str(err), param_hint="'--configs'") from None


def _echo_config() -> Callable[[SwarmResult], None]:
    """Each config's line as its result comes in (in chunk order), numbered from 1."""
    count = [0]

    def echo(result: SwarmResult) -> None:
        count[0] += 1
        click.echo(
            f"config {count[0]}: {result.instance_steps} instance-steps in "
            f"{result.seconds:.1f} s ({result.run.config})"
        )

    return echo


def _campaign_verdict(
    options: SuiteRunOptions, planned: SwarmPlan, campaign: SwarmCampaign, where: str
) -> int:
    """The closing table, what the chunks covered, the findings and the exit code, as a
    run in one process reports them."""
    seed, profile = planned.plan.seed, planned.plan.profile
    results = campaign.results
    _echo_table(results)
    if campaign.first is not None:
        path = _report_finding(campaign.first, options.trace_dir, seed, profile)
        campaign.findings[0] = replace(campaign.findings[0], trace_path=path)
    coverage = Coverage(len(results), campaign.instance_steps, campaign.seconds, UNITS)
    echo_coverage(where, campaign.chunks, campaign.lost, coverage)
    if options.duration is not None:
        echo_findings(campaign.findings)
    if campaign.interrupted is not None:
        found = (
            f"; the failure found so far is {campaign.findings[0].label}"
            if campaign.findings
            else ""
        )
        click.echo(f"INTERRUPTED by {interrupt_name(campaign.interrupted)}{found} (seed {seed})")
        return interrupt_exit_code(campaign.interrupted)
    if campaign.first is not None:
        return _failed(campaign.first, seed)
    if campaign.error is not None:
        with _configs_refused():  # a bad --configs draw in a worker: a usage error
            raise campaign.error  # else the command group reports it, with its exit code
    return _passed(results, seed)


def _passed(results: list[SwarmResult], seed: int) -> int:
    click.echo(f"PASSED: every device check held ({plural(len(results), 'config')}, seed {seed})")
    return EXIT_CODES[Outcome.PASSED]


def _failed(finding: SwarmResult, seed: int) -> int:
    click.echo(f"FAILED: {finding_label(finding)} (seed {seed})")
    return EXIT_CODES[Outcome.VIOLATION]


def _echo_table(results: list[SwarmResult]) -> None:
    click.echo()
    click.echo(f"{'device check':<16} {'instance-checks':>16}  failures")
    for check_id in CHECK_IDS:
        total = sum(r.checks.get(check_id, 0) for r in results)
        failed = sum(
            1 for r in results if r.finding is not None and check_id in r.finding.device_checks
        )
        click.echo(f"{check_id:<16} {total:>16}  {failed:>8}")
    steps = sum(r.instance_steps for r in results)
    seconds = sum(r.seconds for r in results)
    rate = steps / seconds if seconds else 0.0
    click.echo(f"instance-steps: {steps}  time: {seconds:.1f} s  instance-steps/s: {rate:,.0f}")


def _report_finding(result: SwarmResult, trace_dir: Path, seed: int, profile: str) -> Path:
    """The finding as the harness judged it, its trace written under the run's seed."""
    finding = result.finding
    assert finding is not None
    click.echo(
        f"\nVIOLATION on the device: instance {finding.instance}, tick {finding.tick + 1}: "
        f"{', '.join(finding.device_checks)}"
    )
    click.echo(f"config: {result.run.config}")
    for engine, found in (("gpu", finding.on_gpu), ("reference", finding.on_reference)):
        verdict = ", ".join(sorted(found)) if found else f"holds every invariant of {profile}"
        click.echo(f"replayed on {engine} ({len(finding.trace.events)} events): {verdict}")
    trace = finding.shrunk or finding.trace
    trace_dir.mkdir(parents=True, exist_ok=True)
    path = trace_dir / trace_file_name(SWARM_TRACE_STEM, seed)
    trace.save(path)
    if finding.shrunk is not None:
        shrunk = "shrunk to"
    elif finding.on_gpu or finding.on_reference:
        shrunk = "not shrunk (--no-shrink):"
    else:
        shrunk = "not shrunk (no engine fails it):"
    click.echo(f"{shrunk} {plural(len(trace.events), 'event')}, written to {path}")
    click.echo(f"replay it: schedspec replay {path} --engine gpu --profile {profile}")
    return path
