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
from schedspec.cli.options import as_profile, backend_options, pair_options, run_options
from schedspec.cli.printing.diff_report import diff_failure_report
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
from schedspec.engines.watchdog import (
    Watchdog,
)
from schedspec.properties.differential import DiffOptions, run_diff
from schedspec.properties.suite import SuiteResult
from schedspec.spec import Family
from schedspec.spec.invariants import Profile

Pair = tuple[EngineFactory, EngineFactory]
SIDE_FLAGS = (("left", "--left"), ("right", "--right"))


@dataclass(frozen=True, kw_only=True)
class DiffCommandOptions(SuiteRunOptions):
    left: str
    right: str
    compare_block_ids: bool = False


@click.command()
@pair_options
@run_options
@backend_options
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
    if options.ray is not None:
        require_for("--ray", RAY)
    raise SystemExit(run_diff_command(options))


def load_pair(left: str, right: str) -> Pair:
    """Both factories, or a usage error naming the flag at fault."""
    return load_engine(left, "--left"), load_engine(right, "--right")


def probe_pair(pair: Pair, family: Family) -> list[frozenset[Profile]]:
    """The profiles each engine claims in the family (loading.probe, with its side's flag)."""
    return [
        probe(factory, flag, family) for factory, (_, flag) in zip(pair, SIDE_FLAGS, strict=True)
    ]


def pair_profile(claimed: list[frozenset[Profile]], requested: Profile | None) -> Profile:
    return pick_profile(claimed, requested, [side for side, _ in SIDE_FLAGS])


def run_diff_command(options: DiffCommandOptions) -> int:
    prepare_outputs(options)
    settings_of_run: dict[str, object] = {
        "compare_block_ids": options.compare_block_ids,
        "step_timeout": options.step_timeout,
    }
    engines = {"left": options.left, "right": options.right}
    report = RunReport("diff", engines, options.profile, options.seed, options=settings_of_run)
    with reported(report, options):
        pair = load_pair(options.left, options.right)
        with Watchdog(options.step_timeout) as watchdog:
            guarded_pair = (guarded(pair[0], watchdog), guarded(pair[1], watchdog))
            _diff(options, guarded_pair, report)
    return report.exit_code


def _diff(options: DiffCommandOptions, pair: Pair, report: RunReport) -> None:
    """The run, filling in the report as it goes."""
    family = pick_family([options.left, options.right], options.profile)
    try:
        claimed = probe_pair(pair, family)
    except click.UsageError:
        raise
    except (Exception, EngineHalt) as err:
        report.error = err
        engine_failed(err)
        return
    profile = report.profile = pair_profile(claimed, options.profile)
    configs = load_configs(options.configs, [options.left, options.right])
    seed = report.seed = choose_seed(options.seed)
    chosen = suite_settings(options, seed)
    click.echo(
        f"diffing {options.left} (left) and {options.right} (right) in lockstep, profile "
        f"{profile}: {examples_phrase(options, chosen)} of up to "
        f"{chosen.rules_per_example} actions" + configs.described()
    )
    diff_options = DiffOptions(compare_block_ids=options.compare_block_ids)
    recipe = NamedEngines(
        "diff",
        (options.left, options.right),
        profile,
        configs.name,
        options.step_timeout,
        options.compare_block_ids,
    )
    parallel = None
    if runs_in_parallel(options):
        # Chunks of examples over workers (seed, seed + 1, ...): campaign_run.py.
        parallel = run_parallel(options, recipe, recipe.target(pair), chosen)
        result = parallel.campaign.result
        report.campaign = campaign_report(parallel, options)
    else:
        with suite_progress(chosen.examples, options.progress) as on_example:
            result = run_diff(
                *pair,
                profile,
                with_database(chosen, options, recipe),
                configs.strategy,
                diff_options,
                options.trace_dir,
                on_example,
            )
    refuse_bad_config_strategy(result)
    replay = _replay_command(result.trace_path, options, profile)
    record_result(report, result, replay)
    if result.error is not None or result.other_error is not None or result.divergence:
        click.echo()
        names = (options.left, options.right)
        for line in diff_failure_report(result, *pair, names, diff_options):
            click.echo(line)
        if result.trace_path is not None:
            click.echo(f"replay it: {replay}")
    echo_trace_problem(result)
    failing = echo_checks(
        result,
        profile,
        "checks per engine (both engines were checked the same until the failure):",
    )
    if parallel is not None:
        echo_campaign(parallel, options)
    click.echo(_verdict(report, result, failing, seed))


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
        f"--profile {profile}"
    )
    return command + (" --compare-block-ids" if options.compare_block_ids else "")
