"""`schedspec check`: the invariant suite against an engine.

Random workloads (properties/state_machine.py) drive the engine, every
invariant of the profile is checked after every event, and a failure is
shrunk, printed step by step (properties/failure_report.py) and written as a
trace. With --instances N it runs swarm mode instead (swarm.py). Exit codes
as suite_run.py lists them.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click

from schedspec.campaign.chunk_work import NamedEngines
from schedspec.cli.campaign_run import (
    campaign_report,
    echo_campaign,
    examples_phrase,
    run_parallel,
    runs_in_parallel,
    with_database,
)
from schedspec.cli.exit_codes import Outcome
from schedspec.cli.loading import (
    load_configs,
    load_engine,
    pick_family,
    pick_profile,
    probe,
    require_for,
)
from schedspec.cli.options import (
    as_profile,
    backend_options,
    engine_option,
    profile_option,
    refuse_flags,
    run_options,
)
from schedspec.cli.printing.progress import suite_progress
from schedspec.cli.printing.reports import RunReport
from schedspec.cli.suite_run import (
    SuiteRunOptions,
    choose_seed,
    echo_checks,
    echo_trace_problem,
    engine_failed,
    failed_verdict,
    prepare_outputs,
    record_result,
    refuse_bad_config_strategy,
    reported,
    suite_settings,
)
from schedspec.engines.boundary import guarded
from schedspec.engines.dependencies import RAY
from schedspec.engines.errors import EngineHalt
from schedspec.engines.protocol import EngineFactory
from schedspec.engines.watchdog import Watchdog
from schedspec.properties.failure_report import failure_report
from schedspec.properties.suite import run_suite


@dataclass(frozen=True, kw_only=True)
class CheckOptions(SuiteRunOptions):
    engine: str
    instances: int = 1  # more than one: swarm mode (gpu engine), swarm.py


# The flags swarm mode refuses, each with why: what it has no use for. It runs on
# --workers, --ray and --duration as the suite does (swarm.py).
NOT_IN_SWARM_MODE = {
    "--junit": "swarm mode writes no CI reports",
    "--json": "swarm mode writes no CI reports",
    "--step-timeout": "swarm mode's device checks are no engine calls to time",
    "--example-db": "swarm mode draws configs only, and keeps its findings as traces",
}


@click.command()
@engine_option
@profile_option
@click.option(
    "--instances",
    type=click.IntRange(min=1),
    default=1,
    show_default=True,
    help="Swarm mode (--engine gpu, needs torch): this many gpu_impl instances stepped at "
    "once on device workloads, device checks after every step; --examples counts configs "
    "[default: 4, 32 with --long], --max-steps ticks per config [default: 40, 100 with "
    "--long]; a finding is replayed on both engines, shrunk and written as a trace. "
    "--workers, --ray and --duration split the configs into chunks of 4 on CPU workers; "
    "--junit, --json, --step-timeout and --example-db are not used.",
)
@run_options
@backend_options
@click.pass_context
def check(
    ctx: click.Context,
    /,
    engine: str,
    profile: str | None,
    no_shrink: bool,
    json_path: Path | None,
    **run: Any,
) -> None:
    """Run the invariant suite against an engine.

    Exit 0 if every invariant held, 1 on a violation, 2 on a usage error, 4 on an
    engine error, 5 on a hang, 6 on an error of schedspec itself, 128 + N when
    signal N interrupted it (130: Ctrl-C).
    """
    options = CheckOptions(
        engine=engine, profile=as_profile(profile), shrink=not no_shrink, json=json_path, **run
    )
    if options.instances > 1:
        for flag, reason in NOT_IN_SWARM_MODE.items():
            why = f"not used in swarm mode (--instances {options.instances}): {reason}"
            refuse_flags(ctx, [flag], why)
    if options.ray is not None:
        require_for("--ray", RAY)
    raise SystemExit(run_check(options))


def run_check(options: CheckOptions) -> int:
    if options.instances > 1:
        factory = _swarm_engine(options)  # before swarm.py, which imports torch
        from schedspec.cli.swarm import run_swarm_check

        return run_swarm_check(options, factory)
    prepare_outputs(options)
    report = RunReport(
        "check",
        {"engine": options.engine},
        options.profile,
        options.seed,
        options={"step_timeout": options.step_timeout},
    )
    with reported(report, options):
        factory = load_engine(options.engine)
        with Watchdog(options.step_timeout) as watchdog:
            _check(options, guarded(factory, watchdog), report)
    return report.exit_code


def _check(options: CheckOptions, factory: EngineFactory, report: RunReport) -> None:
    """The run, filling in the report as it goes."""
    family = pick_family([options.engine], options.profile)
    try:
        claimed = probe(factory, "--engine", family)
    except click.UsageError:
        raise
    except (Exception, EngineHalt) as err:
        report.error = err
        engine_failed(err)
        return
    profile = report.profile = pick_profile([claimed], options.profile)
    configs = load_configs(options.configs, [options.engine])
    seed = report.seed = choose_seed(options.seed)
    chosen = suite_settings(options, seed)
    click.echo(
        f"checking {options.engine} against profile {profile}: "
        f"{examples_phrase(options, chosen)} of up to {chosen.rules_per_example} actions"
        + configs.described()
    )
    recipe = NamedEngines("check", (options.engine,), profile, configs.name, options.step_timeout)
    parallel = None
    if runs_in_parallel(options):
        # Chunks of examples over workers (seed, seed + 1, ...): campaign_run.py.
        parallel = run_parallel(options, recipe, recipe.target([factory]), chosen)
        result = parallel.campaign.result
        report.campaign = campaign_report(parallel, options)
    else:
        with suite_progress(chosen.examples, options.progress) as on_example:
            result = run_suite(
                factory,
                profile,
                with_database(chosen, options, recipe),
                configs.strategy,
                options.trace_dir,
                on_example,
            )
    refuse_bad_config_strategy(result)
    replay = f"schedspec replay {result.trace_path} --engine {options.engine} --profile {profile}"
    record_result(report, result, replay)
    if result.error is not None or result.other_error is not None:
        click.echo()
        for line in failure_report(result, factory, options.engine):
            click.echo(line)
    echo_trace_problem(result)
    failing = echo_checks(result, profile)
    if parallel is not None:
        echo_campaign(parallel, options)
    if report.outcome is Outcome.PASSED:
        click.echo(f"PASSED: every invariant of profile {profile} held")
    else:
        click.echo(failed_verdict(result, failing, seed))


def _swarm_engine(options: CheckOptions) -> EngineFactory:
    """The gpu engine, the only one swarm mode runs, or a usage error (also when torch,
    which it needs, is missing)."""
    if options.engine != "gpu":
        raise click.BadParameter(
            f"--instances {options.instances} runs swarm mode, which needs --engine gpu",
            param_hint="'--instances'",
        )
    return load_engine(options.engine)
