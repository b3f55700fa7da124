"""`schedspec check`: the invariant suite against an engine; `schedspec conform`: the
adapter's own protocol, checked first.

check: random workloads (properties/state_machine.py) drive the engine, every
invariant of the profile is checked after every event, and a failure is
shrunk, printed step by step (properties/failure_report.py) and written as a
trace. With --instances N it runs swarm mode instead (swarm.py). Exit codes
as suite_run.py lists them.

conform: the adapter kit's conformance script (schedspec.adapters.kit.conformance) on
the engine named, each check it passed printed; the first broken promise is printed
with the adapter method at fault, and the command exits 1 (a violation, of the
protocol). Run it first: a malformed snapshot or a refusal that is not a ValueError
would otherwise be reported as a broken scheduling invariant.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click

from schedspec.campaign.backend import require_backend
from schedspec.campaign.bounds import check_instances
from schedspec.campaign.chunk_work import NamedEngines
from schedspec.cli.campaign_run import OnExample, echo_campaign, examples_phrase, run_planned
from schedspec.cli.exit_codes import EXIT_CODES, Outcome
from schedspec.cli.loading import load_engine, usage_errors
from schedspec.cli.options import (
    ENGINE_HELP,
    as_profile,
    backend_options,
    engine_option,
    interpreter_flags,
    profile_option,
    python_option,
    refuse_flags,
    run_options,
)
from schedspec.cli.printing.reports import RunReport
from schedspec.cli.suite_run import (
    SuiteRunOptions,
    configs_phrase,
    echo_checks,
    echo_trace_problem,
    failed_verdict,
    planned_run,
    prepare_outputs,
    record_result,
    refuse_bad_config_strategy,
    reported,
)
from schedspec.engines.protocol import EngineFactory
from schedspec.properties.failure_report import failure_report
from schedspec.properties.run_plan import RunPlan, RunRequest, one_engine
from schedspec.properties.suite import SuiteResult, SuiteSettings, run_suite
from schedspec.spec import FAMILIES, Family


@dataclass(frozen=True, kw_only=True)
class CheckOptions(SuiteRunOptions):
    engine: str
    instances: int = 1  # more than one: swarm mode (gpu engine), swarm.py
    python: str | None = None  # another interpreter for the engine (engines/remote/)

    @property
    def request(self) -> RunRequest:
        return self.run_request(one_engine(self.engine, self.python))


# The flags swarm mode refuses, each with why: what it has no use for. It runs on
# --workers, --ray and --duration as the suite does (swarm.py).
NOT_IN_SWARM_MODE = {
    "--junit": "swarm mode writes no CI reports",
    "--json": "swarm mode writes no CI reports",
    "--step-timeout": "swarm mode's device checks are no engine calls to time",
    "--example-db": "swarm mode draws configs only, and keeps its findings as traces",
    "--python": "swarm mode steps gpu_impl's tensors in this process",
    "--quiet": "swarm mode prints its own report",
}


@click.command()
@engine_option
@python_option("--python", "the engine")
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
@run_options(swarm=True)
@backend_options(swarm=True)
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
    with usage_errors():
        check_instances(options.instances)
        require_backend(options.request.backend)  # before any output is written
    raise SystemExit(run_check(options))


def run_check(options: CheckOptions) -> int:
    if options.instances > 1:
        factory = _swarm_engine(options)  # before swarm.py, which imports torch
        from schedspec.cli.swarm import run_swarm_check

        return run_swarm_check(options, options.request, options.instances, factory)
    prepare_outputs(options)
    report = RunReport(
        "check",
        {"engine": options.engine},
        options.profile,
        options.seed,
        options={"step_timeout": options.step_timeout}
        | ({"python": options.python} if options.python is not None else {}),
    )
    with reported(report, options), planned_run(options, options.request, report) as plan:
        if plan is not None:
            _check(options, plan, report)
    return report.exit_code


def _check(options: CheckOptions, plan: RunPlan, report: RunReport) -> None:
    """The run, filling in the report as it goes."""
    (factory,) = plan.factories
    profile = plan.profile
    if not options.quiet:
        click.echo(
            f"checking {options.engine}{_in_python(options.python)} against profile {profile}: "
            f"{examples_phrase(plan)} of up to {plan.settings.rules_per_example} actions"
            + configs_phrase(plan)
        )
    recipe = NamedEngines.of_plan(plan, options.step_timeout)

    def in_one_process(settings: SuiteSettings, on_example: OnExample) -> SuiteResult:
        return run_suite(
            factory, profile, settings, plan.config_strategy, options.trace_dir, on_example
        )

    result, parallel = run_planned(options, plan, recipe, report, in_one_process)
    refuse_bad_config_strategy(result)
    # The engine as the command line names it, its interpreter included.
    engine = f"{options.engine} {interpreter_flags(python=options.python)}".rstrip()
    replay = f"schedspec replay {result.trace_path} --engine {engine} --profile {profile}"
    record_result(report, result, replay)
    if result.error is not None or result.other_error is not None:
        if not options.quiet:
            click.echo()
        for line in failure_report(result, factory, engine):
            click.echo(line)
    echo_trace_problem(result)
    failing = echo_checks(result, profile, capabilities=plan.capabilities, quiet=options.quiet)
    if parallel is not None and not options.quiet:
        echo_campaign(parallel, options)
    if report.outcome is Outcome.PASSED:
        click.echo(f"PASSED: every invariant of profile {profile} held")
    else:
        click.echo(failed_verdict(result, failing, plan.seed))


def _swarm_engine(options: CheckOptions) -> EngineFactory:
    """The gpu engine, the only one swarm mode runs, or a usage error (also when torch,
    which it needs, is missing)."""
    if options.engine != "gpu":
        raise click.BadParameter(
            f"--instances {options.instances} runs swarm mode, which needs --engine gpu",
            param_hint="'--instances'",
        )
    return load_engine(options.engine)


def _in_python(python: str | None) -> str:
    """What a first line adds for an engine in another interpreter."""
    return "" if python is None else f" (in {python})"


# ---------------------------------------------------------------- conform


@click.command()
@click.option("--engine", required=True, help=ENGINE_HELP)
@click.option(
    "--family",
    type=click.Choice(FAMILIES),
    default="vllm",
    show_default=True,
    help="The policy family whose config the engine is built with.",
)
def conform(engine: str, family: Family) -> None:
    """Check an adapter's own protocol (snapshot shape, ids, queues, block hashes,
    refusals) and name the adapter method at fault."""
    raise SystemExit(run_conform(engine, family))


def run_conform(engine: str, family: Family) -> int:
    from schedspec.adapters.kit.conformance import ConformanceError, conform

    factory = load_engine(engine)
    click.echo(f"conformance of {engine} (family {family}):")
    try:
        passed = conform(factory, family)
    except ConformanceError as err:
        for check in err.passed:
            click.echo(f"  ok      {check}")
        click.echo(f"  FAILED  {err.check}: the adapter's {err.method}: {err.message}")
        click.echo(f"FAILED: fix the adapter's {err.method} first (then run schedspec check)")
        return EXIT_CODES[Outcome.VIOLATION]
    for check in passed:
        click.echo(f"  ok      {check}")
    click.echo("PASSED: the adapter keeps its protocol; now run schedspec check on it")
    return EXIT_CODES[Outcome.PASSED]
