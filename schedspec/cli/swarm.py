"""`schedspec check --engine gpu --instances N`: swarm mode.

Configs come from the suite's strategy (or --configs), drawn by Hypothesis
from the run's seed: --examples configs (QUICK / LONG below), each run as N
instances for --max-steps ticks. The first finding stops the run, is
replayed through the harness on the gpu engine and on the reference, shrunk
(unless --no-shrink), and written as a trace. Needs torch: check.py loads
the gpu engine, whose entry in properties/engines.py asks for it, before
importing this module.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

import click
import torch
from hypothesis import Phase, given, settings
from hypothesis import seed as hypothesis_seed
from hypothesis import strategies as st

from schedspec.cli.loading import load_configs, pick_family, pick_profile, probe
from schedspec.cli.reports import EXIT_CODES, Outcome
from schedspec.cli.suite_run import choose_seed, is_long
from schedspec.gpu_impl.cpu_allocator import retain_freed_memory
from schedspec.gpu_impl.device_checks import CHECK_IDS
from schedspec.gpu_impl.engine import default_device
from schedspec.properties.adapter import EngineFactory
from schedspec.properties.adapters.gpu import DEVICE_ENV
from schedspec.properties.failure_report import plural
from schedspec.properties.strategies import configs
from schedspec.properties.swarm import SwarmResult, run_swarm
from schedspec.properties.swarm_trace import SwarmRun
from schedspec.properties.trace import SWARM_TRACE_STEM, trace_file_name
from schedspec.spec import SchedulerConfig
from schedspec.spec.invariants import Profile

if TYPE_CHECKING:
    from schedspec.cli.check import CheckOptions

QUICK = (4, 40)  # configs, ticks per config (check's --instances help states them)
LONG = (32, 100)
SHRINK_SECONDS = 20.0


def run_swarm_check(options: CheckOptions, factory: EngineFactory) -> int:
    instances = options.instances
    default_configs, default_ticks = LONG if is_long(options.long) else QUICK
    num_configs = options.examples or default_configs
    ticks = options.max_steps or default_ticks
    # Chosen as check chooses it: what the gpu engine claims.
    family = pick_family([options.engine], options.profile)
    profile = pick_profile([probe(factory, "--engine", family)], options.profile)
    device = os.environ.get(DEVICE_ENV) or str(default_device())
    if device == "cpu":
        # A tick's tensors are small: intra-op threads cost more in hand-offs than they win.
        torch.set_num_threads(1)
        # The command owns the process: keep freed temporaries in malloc (cpu_allocator.py).
        retain_freed_memory()
    chosen = load_configs(options.configs, [options.engine])
    seed = choose_seed(options.seed)
    click.echo(
        f"swarm: {instances} instances of gpu_impl on {device}, profile {profile}, "
        f"{plural(num_configs, 'config')} of {ticks} ticks; device checks after every "
        "schedule() and update" + chosen.described()
    )
    strategy = chosen.strategy if chosen.strategy is not None else configs()
    shrink_seconds = SHRINK_SECONDS if options.shrink else 0.0
    results = _run_configs(
        strategy, num_configs, seed, instances, ticks, device, profile, shrink_seconds
    )
    finding = next((r for r in results if r.finding is not None), None)
    _echo_table(results)
    if finding is None:
        click.echo(
            f"PASSED: every device check held ({plural(len(results), 'config')}, seed {seed})"
        )
        return EXIT_CODES[Outcome.PASSED]
    return _report_finding(finding, options.trace_dir, seed, profile)


def _run_configs(
    strategy: st.SearchStrategy[SchedulerConfig],
    num_configs: int,
    seed: int,
    instances: int,
    ticks: int,
    device: str,
    profile: Profile,
    shrink_seconds: float,
) -> list[SwarmResult]:
    """One swarm per drawn config, until one finds something."""
    results: list[SwarmResult] = []

    @hypothesis_seed(seed)
    @settings(max_examples=num_configs, database=None, deadline=None, phases=[Phase.generate])
    @given(config=strategy)
    def one_config(config: SchedulerConfig) -> None:
        if any(r.finding is not None for r in results):
            return  # stop at the first finding: Hypothesis has no early exit that skips replay
        run = SwarmRun(config, seed=seed + len(results))
        result = run_swarm(run, instances, ticks, device, profile, shrink_seconds)
        results.append(result)
        click.echo(
            f"config {len(results)}: {result.instance_steps} instance-steps in "
            f"{result.seconds:.1f} s ({config})"
        )

    one_config()
    return results


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


def _report_finding(result: SwarmResult, trace_dir: Path, seed: int, profile: str) -> int:
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
    click.echo(f"FAILED: {', '.join(finding.device_checks)} (seed {seed})")
    return EXIT_CODES[Outcome.VIOLATION]
