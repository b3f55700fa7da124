"""What `check` and `diff` share around a suite run: the seed, the settings, the closing
table and verdict, and the CI report.

Exit codes (reports.EXIT_CODES): 0 all invariants held, 1 a violation, 3 a
divergence (diff only), 4 an engine error, 5 an engine call past
--step-timeout, 2 a usage error (click.UsageError and its subclasses).
"""

from __future__ import annotations

import os
import random
from dataclasses import dataclass, replace
from pathlib import Path

import click

from schedspec.cli.check_report import format_table, format_totals
from schedspec.cli.reports import EXIT_CODES, RunReport, outcome_of
from schedspec.properties.failure_report import crash_report
from schedspec.properties.suite import SuiteResult, SuiteSettings
from schedspec.properties.watchdog import DEFAULT_STEP_TIMEOUT, StepTimeoutError
from schedspec.spec.invariants import Profile


@dataclass(frozen=True, kw_only=True)
class SuiteRunOptions:
    """The flags `check` and `diff` share (options.run_options), and the profile."""

    profile: Profile | None
    examples: int | None
    seed: int | None
    max_steps: int | None
    long: bool
    trace_dir: Path
    shrink: bool
    progress: bool
    step_timeout: float | None = DEFAULT_STEP_TIMEOUT  # None or 0: no limit
    junit: Path | None = None
    json: Path | None = None
    configs: str | None = None  # module:strategy; None: the engines' default, or the suite's


def is_long(long_flag: bool) -> bool:
    """--long, or SCHEDSPEC_LONG=1 in the environment."""
    return long_flag or os.environ.get("SCHEDSPEC_LONG") == "1"


def suite_settings(options: SuiteRunOptions, seed: int) -> SuiteSettings:
    chosen = SuiteSettings.long() if is_long(options.long) else SuiteSettings.quick()
    return replace(
        chosen,
        examples=options.examples if options.examples is not None else chosen.examples,
        rules_per_example=(
            options.max_steps if options.max_steps is not None else chosen.rules_per_example
        ),
        seed=seed,
        shrink=options.shrink,
    )


def choose_seed(given: int | None) -> int:
    """The seed is chosen here rather than in run_suite so it is on screen before
    the run starts: a run killed half-way can still be repeated."""
    if given is not None:
        return given
    seed = random.randrange(2**32)
    click.echo(f"seed {seed}: rerun with --seed {seed}")
    return seed


def engine_failed(err: BaseException) -> int:
    """An engine that cannot even be built fails the run, but is no usage error."""
    click.echo("FAILED: " + "\n".join(crash_report(err)))
    return EXIT_CODES[outcome_of(None, None, err)]


def echo_checks(result: SuiteResult, profile: Profile, heading: str | None = None) -> list[str]:
    """Print the per-invariant table and the totals; return the ids that failed."""
    failing = [v.invariant for v in result.error.violations] if result.error else []
    click.echo()
    if heading is not None:
        click.echo(heading)
    for line in format_table(result.stats, profile, failing):
        click.echo(line)
    click.echo(format_totals(result))
    return failing


def failed_verdict(result: SuiteResult, failing: list[str], seed: int) -> str:
    """The last line of a run that failed on an engine error or on invariants."""
    if result.other_error is not None:
        if isinstance(result.other_error, StepTimeoutError):
            return f"FAILED: the engine hung ({result.other_error}) (seed {seed})"
        return f"FAILED: the engine crashed (seed {seed})"
    return f"FAILED: {', '.join(sorted(set(failing)))} (seed {seed})"


def suite_report(
    command: str,
    engines: dict[str, str],
    result: SuiteResult,
    replay_command: str,
    options: dict[str, object],
) -> RunReport:
    """The CI report of a finished suite run (check or diff)."""
    return RunReport(
        command,
        engines,
        result.profile,
        result.seed,
        result.examples,
        result.stats,
        result.seconds,
        violation=result.error,
        divergence=result.divergence.divergence if result.divergence else None,
        engine_error=result.other_error,
        trace_path=result.trace_path,
        trace_events=len(result.trace.events) if result.trace else None,
        replay_command=replay_command if result.trace_path is not None else None,
        options=options,
        first_failure_example=result.first_failure_example,
    )
