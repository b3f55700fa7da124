"""`schedspec diff` and `schedspec diff-replay`: two engines in lockstep, as commands.

`diff` is `check` for a pair: random workloads into both engines, every
invariant checked on each, and the first divergence shrunk, printed side by
side and written as a trace; `diff-replay` re-runs such a trace. Exit codes
as for check (reports.EXIT_CODES), with 3 for a divergence.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import click

from schedspec.check_command import (
    choose_seed,
    config_strategy,
    echo_checks,
    engine_failed,
    failed_verdict,
    load_engine,
    load_trace,
    suite_progress,
    suite_report,
    suite_settings,
)
from schedspec.check_report import (
    PROBE_CONFIG,
    default_profile,
    plural,
)
from schedspec.diff_report import diff_failure_report, format_diff_log, replay_header
from schedspec.properties.adapter import EngineFactory
from schedspec.properties.differential import DiffOptions, DiffResult, diff_trace, run_diff
from schedspec.properties.suite import SuiteResult
from schedspec.properties.trace import Trace
from schedspec.properties.watchdog import (
    DEFAULT_STEP_TIMEOUT,
    StepTimeoutError,
    Watchdog,
    time_limited,
)
from schedspec.reports import EXIT_CODES, Outcome, RunReport, outcome_of, write_reports
from schedspec.spec.invariants import Profile


@dataclass(frozen=True)
class DiffCommandOptions:
    left: str
    right: str
    profile: Profile | None
    examples: int | None
    seed: int | None
    max_steps: int | None
    long: bool
    trace_dir: Path
    shrink: bool
    progress: bool
    compare_block_ids: bool = False
    step_timeout: float | None = DEFAULT_STEP_TIMEOUT
    junit: Path | None = None
    json: Path | None = None
    configs: str | None = None  # module:strategy, or None for the suite's own


def load_pair(left: str, right: str) -> tuple[EngineFactory, EngineFactory]:
    """Both factories, or a usage error naming the flag at fault."""
    factories = []
    for flag, name in (("--left", left), ("--right", right)):
        try:
            factories.append(load_engine(name))
        except click.BadParameter as err:
            raise click.BadParameter(err.message, param_hint=f"'{flag}'") from None
    return factories[0], factories[1]


def probe_profiles(pair: tuple[EngineFactory, EngineFactory]) -> list[frozenset[Profile]]:
    """The profiles each engine claims; raises what building an engine raises."""
    return [factory(PROBE_CONFIG).profiles for factory in pair]


def choose_pair_profile(claimed: list[frozenset[Profile]], requested: Profile | None) -> Profile:
    """The profile asked for, which both engines must claim; by default vllm-v1 when
    both claim it, else safety."""
    if requested is None:
        return default_profile(claimed[0] & claimed[1])
    for side, profiles in zip(("left", "right"), claimed, strict=True):
        if requested not in profiles:
            raise click.BadParameter(
                f"profile: the {side} engine claims {sorted(profiles)}, not {requested!r}",
                param_hint="'--profile'",
            )
    return requested


# ---------------------------------------------------------------------- diff


def run_diff_command(options: DiffCommandOptions) -> int:
    pair = load_pair(options.left, options.right)
    with Watchdog(options.step_timeout) as watchdog:
        guarded = (time_limited(pair[0], watchdog), time_limited(pair[1], watchdog))
        code, report = _diff(options, guarded)
    write_reports(report, options.junit, options.json)
    return code


def _diff(
    options: DiffCommandOptions, pair: tuple[EngineFactory, EngineFactory]
) -> tuple[int, RunReport]:
    engines = {"left": options.left, "right": options.right}
    settings_of_run: dict[str, object] = {
        "compare_block_ids": options.compare_block_ids,
        "step_timeout": options.step_timeout,
    }
    try:
        claimed = probe_profiles(pair)
    except (Exception, StepTimeoutError) as err:
        report = RunReport("diff", engines, options.profile, options.seed, engine_error=err)
        return engine_failed(err), report
    profile = choose_pair_profile(claimed, options.profile)
    seed = choose_seed(options.seed)
    chosen = suite_settings(options, seed)
    click.echo(
        f"diffing {options.left} (left) and {options.right} (right) in lockstep, profile "
        f"{profile}: {chosen.examples} examples of up to {chosen.rules_per_example} actions"
    )
    diff_options = DiffOptions(compare_block_ids=options.compare_block_ids)
    with suite_progress(chosen.examples, options.progress) as on_example:
        configs = config_strategy(options.configs)
        result = run_diff(
            *pair, profile, chosen, configs, diff_options, options.trace_dir, on_example
        )
    replay = _replay_command(result.trace_path, options, profile)
    if not result.passed:
        click.echo()
        names = (options.left, options.right)
        for line in diff_failure_report(result, *pair, names, diff_options):
            click.echo(line)
        if result.trace_path is not None:
            click.echo(f"replay it: {replay}")
    failing = echo_checks(
        result,
        profile,
        "checks per engine (both engines were checked the same until the failure):",
    )
    report = suite_report("diff", engines, result, replay, settings_of_run)
    click.echo(_verdict(report, result, failing, seed))
    return report.exit_code, report


def _verdict(report: RunReport, result: SuiteResult, failing: list[str], seed: int) -> str:
    if report.outcome is Outcome.PASSED:
        profile = report.profile
        return f"PASSED: the engines agreed at every step; each held every invariant of {profile}"
    if report.divergence is not None:
        return f"FAILED: the engines diverged on {report.divergence.path} (seed {seed})"
    return failed_verdict(result, failing, seed)


def _replay_command(trace_path: Path | None, options: DiffCommandOptions, profile: Profile) -> str:
    command = (
        f"schedspec diff-replay {trace_path} --left {options.left} --right {options.right} "
        f"--profile {profile}"
    )
    return command + (" --compare-block-ids" if options.compare_block_ids else "")


# --------------------------------------------------------------- diff-replay


def run_diff_replay(
    path: Path,
    left: str,
    right: str,
    requested: Profile | None,
    compare_block_ids: bool = False,
    step_timeout: float | None = DEFAULT_STEP_TIMEOUT,
) -> int:
    trace = load_trace(path)
    pair = load_pair(left, right)
    with Watchdog(step_timeout) as watchdog:
        guarded = (time_limited(pair[0], watchdog), time_limited(pair[1], watchdog))
        try:
            claimed = probe_profiles(guarded)
        except (Exception, StepTimeoutError) as err:
            return engine_failed(err)
        profile = choose_pair_profile(claimed, requested)
        click.echo(
            f"replaying {path} on {left} (left) and {right} (right) in lockstep "
            f"(profile {profile}): {plural(len(trace.events), 'event')}"
        )
        for line in replay_header(trace):
            click.echo(line)
        result = diff_trace(trace, *guarded, profile, DiffOptions(compare_block_ids))
    for line in format_diff_log(result):
        click.echo(line)
    click.echo(_replay_verdict(result, trace, profile))
    return EXIT_CODES[outcome_of(result.violation, result.divergence, result.error)]


def _replay_verdict(result: DiffResult, trace: Trace, profile: Profile) -> str:
    at = _event_name(result)
    if result.divergence is not None:
        return f"DIVERGED {result.divergence.where}: {result.divergence.path}"
    if result.violation is not None:
        broken = ", ".join(sorted({v.invariant for v in result.violation.violations}))
        side = getattr(result.violation, "side", "")
        return f"FAILED at {at}: {broken} broke in the {side} engine"
    if result.error is not None:
        verb = "hung" if isinstance(result.error, StepTimeoutError) else "raised"
        return f"FAILED at {at}: the {result.side} engine {verb}"
    return (
        f"PASSED: the engines agreed on all {plural(len(trace.events), 'event')} "
        f"({plural(result.stats.steps, 'step')}); each held every invariant of {profile}"
    )


def _event_name(result: DiffResult) -> str:
    if not result.entries:
        return "the start (the engines' first snapshots)"
    last = result.entries[-1]
    return f"event {last.index} ({type(last.event).__name__})"
