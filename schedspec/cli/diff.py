"""`schedspec diff`: two engines in lockstep through random workloads.

It is `check` for a pair: random workloads into both engines, every
invariant checked on each, and the first divergence shrunk, printed side by
side (printing/diff_report.py) and written as a trace that `diff-replay` re-runs.
Exit codes as for check (suite_run.py), with 3 for a divergence.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click

from schedspec.campaign.backend import require_backend
from schedspec.campaign.chunk_work import NamedEngines
from schedspec.cli.campaign_run import OnExample, echo_campaign, examples_phrase, run_planned
from schedspec.cli.exit_codes import Outcome
from schedspec.cli.loading import usage_errors
from schedspec.cli.options import (
    as_profile,
    backend_options,
    interpreter_flags,
    pair_options,
    run_options,
    side_phrase,
)
from schedspec.cli.printing.diff_report import diff_failure_report
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
from schedspec.properties.differential import DiffOptions, run_diff
from schedspec.properties.run_plan import RunPlan, RunRequest, engine_pair
from schedspec.properties.suite import SuiteResult, SuiteSettings
from schedspec.spec.invariants import Profile


@dataclass(frozen=True, kw_only=True)
class DiffCommandOptions(SuiteRunOptions):
    left: str
    right: str
    compare_block_ids: bool = False
    left_python: str | None = None  # another interpreter for an engine (engines/remote/)
    right_python: str | None = None

    @property
    def request(self) -> RunRequest:
        return self.run_request(
            engine_pair(self.left, self.right, self.left_python, self.right_python)
        )

    @property
    def interpreter_flags(self) -> str:
        """The --left-python and --right-python given, as the command line spells them."""
        return interpreter_flags(left_python=self.left_python, right_python=self.right_python)


@click.command()
@pair_options
@run_options(swarm=False)
@backend_options(swarm=False)
def diff(profile: str | None, no_shrink: bool, json_path: Path | None, **run: Any) -> None:
    """Drive two engines in lockstep through random workloads and report the first step
    where they disagree.

    Exit 0 if they agreed and held every invariant, 1 on a violation, 2 on a usage
    error, 3 on a divergence, 4 on an engine error, 5 on a hang, 6 on an error of
    schedspec itself, 128 + N when signal N interrupted it (130: Ctrl-C).
    """
    options = DiffCommandOptions(
        profile=as_profile(profile), shrink=not no_shrink, json=json_path, **run
    )
    with usage_errors():
        require_backend(options.request.backend)  # before any output is written
    raise SystemExit(run_diff_command(options))


def run_diff_command(options: DiffCommandOptions) -> int:
    prepare_outputs(options)
    settings_of_run: dict[str, object] = {
        "compare_block_ids": options.compare_block_ids,
        "step_timeout": options.step_timeout,
    }
    pythons = {"left_python": options.left_python, "right_python": options.right_python}
    # Only those given: a report of a run in one interpreter reads as it always has.
    settings_of_run |= {name: path for name, path in pythons.items() if path is not None}
    engines = {"left": options.left, "right": options.right}
    report = RunReport("diff", engines, options.profile, options.seed, options=settings_of_run)
    with reported(report, options), planned_run(options, options.request, report) as plan:
        if plan is not None:
            _diff(options, plan, report)
    return report.exit_code


def _diff(options: DiffCommandOptions, plan: RunPlan, report: RunReport) -> None:
    """The run, filling in the report as it goes."""
    left, right = plan.factories
    profile = plan.profile
    left_side = side_phrase("left", options.left_python)
    right_side = side_phrase("right", options.right_python)
    if not options.quiet:
        click.echo(
            f"diffing {options.left} ({left_side}) and {options.right} ({right_side}) in "
            f"lockstep, profile {profile}: {examples_phrase(plan)} of up to "
            f"{plan.settings.rules_per_example} actions" + configs_phrase(plan)
        )
    diff_options = DiffOptions(compare_block_ids=options.compare_block_ids)
    recipe = NamedEngines.of_plan(plan, options.step_timeout, options.compare_block_ids)

    def in_one_process(settings: SuiteSettings, on_example: OnExample) -> SuiteResult:
        return run_diff(
            left,
            right,
            profile,
            settings,
            plan.config_strategy,
            diff_options,
            options.trace_dir,
            on_example,
        )

    result, parallel = run_planned(options, plan, recipe, report, in_one_process)
    refuse_bad_config_strategy(result)
    replay = _replay_command(result.trace_path, options, profile)
    record_result(report, result, replay)
    if result.error is not None or result.other_error is not None or result.divergence:
        if not options.quiet:
            click.echo()
        names = (options.left, options.right)
        for line in diff_failure_report(result, left, right, names, diff_options):
            click.echo(line)
        if result.trace_path is not None:
            click.echo(f"replay it: {replay}")
    echo_trace_problem(result)
    failing = echo_checks(
        result,
        profile,
        "checks per engine (both engines were checked the same until the failure):",
        plan.capabilities,
        quiet=options.quiet,
    )
    if parallel is not None and not options.quiet:
        echo_campaign(parallel, options)
    click.echo(_verdict(report, result, failing, plan.seed))


def _verdict(report: RunReport, result: SuiteResult, failing: list[str], seed: int) -> str:
    if report.outcome is Outcome.PASSED:
        profile = report.profile
        return f"PASSED: the engines agreed at every step; each held every invariant of {profile}"
    if report.divergence is not None and result.interrupted is None:
        return f"FAILED: the engines diverged on {report.divergence.path} (seed {seed})"
    return failed_verdict(result, failing, seed)


def _replay_command(trace_path: Path | None, options: DiffCommandOptions, profile: Profile) -> str:
    command = (
        f"schedspec diff-replay {trace_path} --left {options.left} --right {options.right} "
        f"{options.interpreter_flags}--profile {profile}"
    )
    return command + (" --compare-block-ids" if options.compare_block_ids else "")
