"""`schedspec check --engine gpu --instances N`: swarm mode.

Configs come from the suite's strategy (or --configs), drawn by Hypothesis
from the run's seed: --examples configs (QUICK / LONG below), each run as N
instances for --max-steps ticks. The first finding stops the run, is
replayed through the harness on the gpu engine and on the reference, shrunk
(unless --no-shrink), and written as a trace.

With --workers, --ray or --duration the configs are split into chunks
(campaign/swarm_chunks.py) run by the same runners as the suite's campaigns
(campaign_run.open_backend: forked local processes or Ray), on the CPU: a count
run stops at the first finding in chunk order and reports it as a run in one
process does; a campaign (--duration) goes on and keeps every distinct finding's
trace. Needs torch: check.py loads the gpu engine, whose entry in
engines/registry.py asks for it, before importing this module.
"""

from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

import click

from schedspec.adapters.gpu import DEVICE_ENV
from schedspec.campaign.swarm import SwarmResult
from schedspec.campaign.swarm_chunks import (
    SWARM_CHUNK_CONFIGS,
    SwarmCampaign,
    SwarmSettings,
    SwarmWork,
    finding_label,
    prepare_device,
    run_configs,
    run_swarm_campaign,
)
from schedspec.cli.campaign_run import (
    Coverage,
    campaign_deadline,
    echo_coverage,
    echo_findings,
    open_backend,
    planned_chunks,
    runs_in_parallel,
)
from schedspec.cli.interrupts import interrupt_exit_code, interrupt_name
from schedspec.cli.loading import ChosenConfigs, load_configs, pick_family, pick_profile, probe
from schedspec.cli.options import format_duration
from schedspec.cli.printing.progress import campaign_progress
from schedspec.cli.printing.reports import EXIT_CODES, Outcome
from schedspec.cli.suite_run import choose_seed, is_long
from schedspec.engines.protocol import EngineFactory
from schedspec.gpu_impl.device_checks import CHECK_IDS
from schedspec.gpu_impl.engine import default_device
from schedspec.properties.failure_report import plural
from schedspec.properties.strategies.configs import configs
from schedspec.traces.trace import SWARM_TRACE_STEM, trace_file_name

if TYPE_CHECKING:
    from collections.abc import Callable

    from schedspec.cli.check import CheckOptions

QUICK = (4, 40)  # configs, ticks per config (check's --instances help states them)
LONG = (32, 100)
SHRINK_SECONDS = 20.0


# What a swarm's chunks count, for the progress bar and the closing line.
UNITS = ("configs", "instance-steps")


def run_swarm_check(options: CheckOptions, factory: EngineFactory) -> int:
    instances = options.instances
    default_configs, default_ticks = LONG if is_long(options.long) else QUICK
    num_configs = options.examples or default_configs
    ticks = options.max_steps or default_ticks
    device = os.environ.get(DEVICE_ENV) or str(default_device())
    parallel = runs_in_parallel(options)
    if parallel and device != "cpu":
        raise click.UsageError(
            f"--workers, --ray, --duration: swarm mode runs chunks on CPU workers only, and "
            f"this run's device is {device} (one process drives a device; --instances sets "
            f"how many instances it steps at once; {DEVICE_ENV}=cpu runs on the CPU)"
        )
    prepare_device(device)  # before anything runs on it, and before workers are forked
    # Chosen as check chooses it: what the gpu engine claims.
    family = pick_family([options.engine], options.profile)
    profile = pick_profile([probe(factory, "--engine", family)], options.profile)
    chosen = load_configs(options.configs, [options.engine])
    seed = choose_seed(options.seed)
    how_many = (
        plural(num_configs, "config")
        if options.duration is None
        else f"configs for {format_duration(options.duration)}"
        + (f" (at most {options.examples})" if options.examples is not None else "")
    )
    click.echo(
        f"swarm: {instances} instances of gpu_impl on {device}, profile {profile}, "
        f"{how_many} of {ticks} ticks; device checks after every "
        "schedule() and update" + chosen.described()
    )
    swarm = SwarmSettings(
        instances, ticks, device, profile, SHRINK_SECONDS if options.shrink else 0.0
    )
    if not parallel:
        strategy = chosen.strategy if chosen.strategy is not None else configs()
        results = run_configs(strategy, num_configs, seed, swarm, _echo_config())
        _echo_table(results)
        finding = next((r for r in results if r.finding is not None), None)
        if finding is None:
            return _passed(results, seed)
        _report_finding(finding, options.trace_dir, seed, profile)
        return _failed(finding, seed)
    campaign, backend = _run_chunks(options, swarm, chosen, num_configs, seed)
    return _campaign_verdict(options, campaign, backend, seed, profile)


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


def _run_chunks(
    options: CheckOptions, swarm: SwarmSettings, chosen: ChosenConfigs, configs: int, seed: int
) -> tuple[SwarmCampaign, str]:
    """The configs in chunks on the backend the options name (campaign_run.open_backend),
    and the backend's name."""
    with open_backend(options) as backend:
        deadline = campaign_deadline(options)
        sizes = (SWARM_CHUNK_CONFIGS, SWARM_CHUNK_CONFIGS)
        chunks = planned_chunks(options, configs, seed, deadline, backend.workers, sizes)
        work = SwarmWork(swarm, chosen.name, deadline)
        # The bar measures configs, or a campaign's time (its --examples cap, if given).
        counted = configs if options.duration is None else options.examples
        progress = campaign_progress(counted, options.duration, options.progress, units=UNITS)
        with progress as on_progress:
            campaign = run_swarm_campaign(
                work,
                chunks,
                backend.runner,
                keep_going=options.duration is not None,
                trace_dir=options.trace_dir,
                on_config=_echo_config(),
                on_progress=on_progress,
            )
    return campaign, backend.name


def _campaign_verdict(
    options: CheckOptions, campaign: SwarmCampaign, backend: str, seed: int, profile: str
) -> int:
    """The closing table, what the chunks covered, the findings and the exit code, as a
    run in one process reports them."""
    results = campaign.results
    _echo_table(results)
    if campaign.first is not None:
        path = _report_finding(campaign.first, options.trace_dir, seed, profile)
        campaign.findings[0] = replace(campaign.findings[0], trace_path=path)
    coverage = Coverage(len(results), campaign.instance_steps, campaign.seconds, UNITS)
    echo_coverage(backend, campaign.chunks, campaign.lost, coverage)
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
        raise campaign.error  # the command group reports it, with its exit code
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
