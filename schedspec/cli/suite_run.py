"""What `check` and `diff` share around a suite run: the outputs checked before it starts,
the run's plan put into the report as it is resolved (properties/run_plan.py decides;
here a refusal becomes a usage error, an engine that cannot be built the run's failure,
and a seed drawn at random is shown), the closing table and verdict, and the CI report
written however the run ends.

Exit codes as exit_codes.py lists them: 0 all invariants held, 1 a violation, 2 a
usage error, 3 a divergence (diff only), 4 an engine error, 5 an engine call past
--step-timeout, 6 a harness error, 128 + N interrupted by signal N.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple, TypeVar

import click

from schedspec.cli.exit_codes import EXIT_CODES, Outcome, error_outcome
from schedspec.cli.interrupts import interrupt_name
from schedspec.cli.loading import load_factories, usage_error, usage_errors
from schedspec.cli.printing.check_report import format_table, format_totals
from schedspec.cli.printing.reports import RunReport, write_reports
from schedspec.engines.boundary import guarded
from schedspec.engines.capabilities import ALL_CAPABILITIES, FAMILY_CAPABILITIES, Capability
from schedspec.engines.errors import EngineHalt
from schedspec.engines.watchdog import DEFAULT_STEP_TIMEOUT, Watchdog
from schedspec.files import OutputPathError, prepare_output_dir, prepare_output_file
from schedspec.properties.corners import format_corners
from schedspec.properties.failure_report import crash_report
from schedspec.properties.run_plan import (
    BackendChoice,
    EngineNamed,
    RunPlan,
    RunPlanError,
    RunRequest,
    choose_run_profile,
    complete_plan,
)
from schedspec.properties.strategies.configs import ConfigStrategyError
from schedspec.properties.suite import SuiteResult
from schedspec.spec.invariants import Profile

T = TypeVar("T")


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
    quiet: bool = False  # the verdict line only (and a failure's report)
    step_timeout: float | None = DEFAULT_STEP_TIMEOUT  # None or 0: no limit
    junit: Path | None = None
    json: Path | None = None
    configs: str | None = None  # module:strategy; None: the engines' default, or the suite's
    # Where and how long (options.backend_options, campaign/backend.py).
    workers: int | None = None  # None: 1 local process, or the Ray cluster's CPUs
    ray: str | None = None  # a Ray cluster's address, "local" for one started here
    duration: float | None = None  # seconds: a campaign with a time budget
    example_db: Path | None = None  # Hypothesis' example database

    def run_request(self, engines: tuple[EngineNamed, ...]) -> RunRequest:
        """What these flags name for a run of `engines`, for run_plan to resolve."""
        backend = BackendChoice(self.workers, self.ray, self.duration, self.example_db)
        return RunRequest(
            engines=engines,
            profile=self.profile,
            configs=self.configs,
            seed=self.seed,
            examples=self.examples,
            max_steps=self.max_steps,
            long=self.long,
            shrink=self.shrink,
            backend=backend,
        )


@contextmanager
def planned_run(
    options: SuiteRunOptions, request: RunRequest, report: RunReport
) -> Iterator[RunPlan | None]:
    """The run's plan (properties/run_plan.py), its engines guarded for as long as the
    run lasts (every call under --step-timeout, a failure blamed on the engine), put
    into the report as it is resolved: the profile once chosen, then the seed, shown
    before the run starts when drawn. None: an engine could not even be built
    (engine_step has said so; the report holds the error)."""
    factories = load_factories(request)
    with Watchdog(options.step_timeout) as watchdog:
        guarded_factories = tuple(guarded(factory, watchdog) for factory in factories)
        chosen = engine_step(lambda: choose_run_profile(request, guarded_factories))
        if isinstance(chosen, EngineFailure):
            report.error = chosen.error
            yield None
            return
        report.profile = chosen.profile
        report.capabilities = chosen.capabilities
        with usage_errors():
            plan = complete_plan(request, guarded_factories, chosen)
        report.seed = plan.seed
        echo_seed(plan)
        yield plan


def echo_seed(plan: RunPlan) -> None:
    """A seed drawn at random, shown before the run: a run killed half-way can still be
    repeated."""
    if plan.seed_drawn:
        click.echo(f"seed {plan.seed}: rerun with --seed {plan.seed}")


def configs_phrase(plan: RunPlan) -> str:
    """What a run's first line adds about its configs: nothing for the suite's own."""
    configs = "" if plan.configs is None else f", configs from {plan.configs}"
    if plan.capabilities >= FAMILY_CAPABILITIES[plan.family]:
        return configs
    has = ", ".join(sorted(c.value for c in plan.capabilities)) or "none of the optional ones"
    return f"{configs}, within the capabilities the adapter declares ({has})"


def prepare_outputs(options: SuiteRunOptions) -> None:
    """Every path the run may write, checked before it starts (a failure found must not
    be lost to a bad path at the end): the trace folder and the example database are
    created and proved writable, --junit and --json hold nothing but a regular file.
    A usage error names the flag."""
    reports = [("--junit", options.junit), ("--json", options.json)]
    given = [(flag, path) for flag, path in reports if path is not None]
    if len(given) == 2 and given[0][1].resolve() == given[1][1].resolve():
        raise click.BadParameter("--junit and --json name the same file", param_hint="'--json'")
    folders = [("--trace-dir", options.trace_dir), ("--example-db", options.example_db)]
    for flag, path in [*given, *folders]:
        if path is None:
            continue
        try:
            if flag in ("--trace-dir", "--example-db"):
                prepare_output_dir(path)
            else:
                prepare_output_file(path)
        except OutputPathError as err:
            raise click.BadParameter(str(err), param_hint=f"'{flag}'") from None


# The outcomes whose failing example Hypothesis saves to the example database.
_SAVED = (Outcome.VIOLATION, Outcome.DIVERGENCE, Outcome.ENGINE_ERROR, Outcome.HANG)


def unsaved_failure(report: RunReport, example_db: Path | None) -> str | None:
    """A warning when the run failed and its example database no longer takes files
    (Hypothesis drops a failed save without a word, so "tried first next time" would
    silently not happen); None otherwise."""
    if example_db is None or report.outcome not in _SAVED:
        return None
    try:
        prepare_output_dir(example_db)
    except OutputPathError as err:
        return (
            f"the failure could not be saved to --example-db ({err}); "
            "the next run will not try it first"
        )
    return None


@contextmanager
def reported(report: RunReport, options: SuiteRunOptions) -> Iterator[RunReport]:
    """Run the body and, however it ends, record how in the report and write it: a
    usage error, an interrupt, an error of the engine's or of schedspec's own. The
    exception goes on to the command group, which prints it and exits accordingly."""
    try:
        yield report
    except click.UsageError as err:
        report.usage_error = err.format_message()
        raise
    except KeyboardInterrupt as err:
        report.interrupted = err
        raise
    except (Exception, EngineHalt) as err:
        report.error = err
        raise
    finally:
        problems = write_reports(report, options.junit, options.json)
        unsaved = unsaved_failure(report, options.example_db)
        for problem in [*problems, *([unsaved] if unsaved else [])]:
            click.echo(f"warning: {problem}", err=True)


class EngineFailure(NamedTuple):
    """An engine that could not even be built: the run's failure, but no usage error."""

    error: BaseException
    exit_code: int


def engine_step(step: Callable[[], T]) -> T | EngineFailure:
    """A step that builds engines (to read what they claim): its refusals are usage
    errors; whatever else it raises is the engine's failure, printed and returned."""
    try:
        return step()
    except RunPlanError as err:
        raise usage_error(err) from None
    except (Exception, EngineHalt) as err:
        click.echo("FAILED: " + "\n".join(crash_report(err)))
        return EngineFailure(err, EXIT_CODES[error_outcome(err)])


def refuse_bad_config_strategy(result: SuiteResult) -> None:
    """A --configs strategy that failed while drawing is the caller's mistake: a usage
    error naming the flag, not a failure of the engine or of schedspec."""
    if isinstance(result.other_error, ConfigStrategyError):
        raise click.BadParameter(str(result.other_error), param_hint="'--configs'")


def echo_checks(
    result: SuiteResult,
    profile: Profile,
    heading: str | None = None,
    capabilities: frozenset[Capability] = ALL_CAPABILITIES,
    quiet: bool = False,
) -> list[str]:
    """Print the per-invariant table, the corners (those the engines' capabilities rule
    out as not applicable) and the totals (quiet: nothing); return the ids that failed."""
    failing = [v.invariant for v in result.error.violations] if result.error else []
    if quiet:
        return failing
    click.echo()
    if heading is not None:
        click.echo(heading)
    for line in format_table(result.stats, profile, failing):
        click.echo(line)
    click.echo()
    for line in format_corners(result.stats.corners, profile, capabilities):
        click.echo(line)
    click.echo(format_totals(result))
    return failing


def failed_verdict(result: SuiteResult, failing: list[str], seed: int) -> str:
    """The last line of a run that failed on an engine error, on invariants, was
    interrupted, or was stopped by schedspec's own error."""
    if result.interrupted is not None:
        found = (
            f"; the failure found so far is {', '.join(sorted(set(failing)))}" if failing else ""
        )
        return f"INTERRUPTED by {interrupt_name(result.interrupted)}{found} (seed {seed})"
    if result.other_error is not None:
        outcome = error_outcome(result.other_error)
        if outcome is Outcome.HANG:
            return f"FAILED: the engine hung ({result.other_error}) (seed {seed})"
        if outcome is Outcome.HARNESS_ERROR:
            return f"HARNESS ERROR: schedspec itself failed, not the engine (seed {seed})"
        return f"FAILED: the engine crashed (seed {seed})"
    return f"FAILED: {', '.join(sorted(set(failing)))} (seed {seed})"


def record_result(report: RunReport, result: SuiteResult, replay_command: str) -> None:
    """A finished (or interrupted) suite run's findings, into its CI report."""
    report.profile = result.profile
    report.seed = result.seed
    report.examples = result.examples
    report.stats = result.stats
    report.seconds = result.seconds
    report.violation = result.error
    report.divergence = result.divergence.divergence if result.divergence else None
    report.error = result.other_error
    report.interrupted = result.interrupted
    report.trace_path = result.trace_path
    report.trace_events = len(result.trace.events) if result.trace else None
    report.replay_command = replay_command if result.trace_path is not None else None
    report.first_failure_example = result.first_failure_example


def echo_trace_problem(result: SuiteResult) -> None:
    if result.trace_error is not None:
        click.echo(
            f"warning: {result.trace_error}; the counterexample above is all there is", err=True
        )
