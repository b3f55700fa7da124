"""`schedspec check` and `schedspec replay`: the invariant suite and trace replay, as commands.

cli.py holds only the click wiring; the work and the output live here
(diff_command.py does the same for `diff` and `diff-replay`). Exit codes
(reports.EXIT_CODES): 0 all invariants held, 1 a violation, 3 a divergence
(diff only), 4 an engine error, 5 an engine call past --step-timeout, 2 a
usage error (click.UsageError and its subclasses).
"""

from __future__ import annotations

import os
import random
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Protocol

import click
from hypothesis.strategies import SearchStrategy

from schedspec.check_report import (
    PROBE_CONFIG,
    ReplayLog,
    crash_report,
    default_profile,
    failure_report,
    format_config,
    format_log,
    format_table,
    format_totals,
    plural,
    replay_with_log,
)
from schedspec.progress import progress
from schedspec.properties.adapter import (
    EngineAdapter,
    EngineFactory,
    load_config_strategy,
    load_engine_factory,
)
from schedspec.properties.parallel import run_suite_parallel
from schedspec.properties.state_machine import SuiteRecorder
from schedspec.properties.suite import SuiteResult, SuiteSettings, run_suite
from schedspec.properties.trace import Trace, TraceError
from schedspec.properties.watchdog import (
    DEFAULT_STEP_TIMEOUT,
    StepTimeoutError,
    Watchdog,
    time_limited,
)
from schedspec.reports import EXIT_CODES, Outcome, RunReport, outcome_of, write_reports
from schedspec.spec import SchedulerConfig
from schedspec.spec.invariants import Profile


def load_engine(name: str) -> EngineFactory:
    """The factory for --engine, or a usage error naming the flag."""
    # A console script does not put the working directory on sys.path, yet
    # `--engine my_adapter:make_engine` run from an engine's repo should just
    # work, as it does for pytest or uvicorn.
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        return load_engine_factory(name)
    except ValueError as err:
        raise click.BadParameter(str(err), param_hint="'--engine'") from None


def config_strategy(name: str | None) -> SearchStrategy[SchedulerConfig] | None:
    """The strategy --configs names (None: the suite's own), or a usage error."""
    if name is None:
        return None
    try:
        return load_config_strategy(name)
    except ValueError as err:
        raise click.BadParameter(str(err), param_hint="'--configs'") from None


def choose_profile(engine: EngineAdapter, requested: Profile | None) -> Profile:
    """The profile asked for, which the engine must claim, or the default one."""
    claimed = engine.profiles
    if requested is None:
        return default_profile(claimed)
    if requested not in claimed:
        raise click.BadParameter(
            f"profile: the engine claims {sorted(claimed)}, not {requested!r}",
            param_hint="'--profile'",
        )
    return requested


def engine_failed(err: BaseException) -> int:
    """An engine that cannot even be built fails the run, but is no usage error."""
    click.echo("FAILED: " + "\n".join(crash_report(err)))
    return EXIT_CODES[outcome_of(None, None, err)]


def error_verdict(err: BaseException) -> str:
    if isinstance(err, StepTimeoutError):
        return f"the engine hung ({err})"
    return "the engine crashed"


# --------------------------------------------------------------------- check


@dataclass(frozen=True)
class CheckOptions:
    engine: str
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
    configs: str | None = None  # module:strategy, or None for the suite's own
    workers: int = 1  # processes; more than one splits the examples over seeds
    instances: int = 1  # more than one: swarm mode (gpu engine), properties/swarm_command.py


class RunShape(Protocol):
    """The flags `check` and `diff` share that shape a suite run."""

    @property
    def examples(self) -> int | None: ...
    @property
    def max_steps(self) -> int | None: ...
    @property
    def long(self) -> bool: ...
    @property
    def shrink(self) -> bool: ...


def suite_settings(options: RunShape, seed: int) -> SuiteSettings:
    long = options.long or os.environ.get("SCHEDSPEC_LONG") == "1"
    chosen = SuiteSettings.long() if long else SuiteSettings.quick()
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


def run_check(options: CheckOptions) -> int:
    if options.instances > 1:
        from schedspec.properties.swarm_command import run_swarm_check

        return run_swarm_check(options)
    factory = load_engine(options.engine)
    with Watchdog(options.step_timeout) as watchdog:
        code, report = _check(options, time_limited(factory, watchdog))
    write_reports(report, options.junit, options.json)
    return code


def _check(options: CheckOptions, factory: EngineFactory) -> tuple[int, RunReport]:
    engines = {"engine": options.engine}
    try:
        probe = factory(PROBE_CONFIG)
    except Exception as err:
        report = RunReport("check", engines, options.profile, options.seed, engine_error=err)
        return engine_failed(err), report
    profile = choose_profile(probe, options.profile)
    seed = choose_seed(options.seed)
    chosen = suite_settings(options, seed)
    click.echo(
        f"checking {options.engine} against profile {profile}: "
        f"{chosen.examples} examples of up to {chosen.rules_per_example} actions"
    )
    configs = config_strategy(options.configs)
    if options.workers > 1:
        # One Hypothesis run per process (seed, seed + 1, ...); no progress bar.
        result = run_suite_parallel(
            factory, profile, chosen, options.workers, configs, options.trace_dir
        )
    else:
        with suite_progress(chosen.examples, options.progress) as on_example:
            result = run_suite(factory, profile, chosen, configs, options.trace_dir, on_example)
    replay = f"schedspec replay {result.trace_path} --engine {options.engine} --profile {profile}"
    if not result.passed:
        click.echo()
        for line in failure_report(result, factory, options.engine):
            click.echo(line)
    failing = echo_checks(result, profile)
    report = suite_report("check", engines, result, replay, {"step_timeout": options.step_timeout})
    if report.outcome is Outcome.PASSED:
        click.echo(f"PASSED: every invariant of profile {profile} held")
    else:
        click.echo(failed_verdict(result, failing, seed))
    return report.exit_code, report


def echo_checks(result: SuiteResult, profile: Profile, heading: str | None = None) -> list[str]:
    """Print the per-invariant table and the totals; return the ids that failed."""
    failing = [v.invariant for v in result.error.violations] if result.error else []
    click.echo()
    if heading is not None:
        click.echo(heading)
    for line in format_table(result.stats, profile, failing):
        click.echo(line)
    click.echo(format_totals(result.examples, result.stats, result.seconds))
    return failing


def failed_verdict(result: SuiteResult, failing: list[str], seed: int) -> str:
    """The last line of a run that failed on an engine error or on invariants."""
    if result.other_error is not None:
        return f"FAILED: {error_verdict(result.other_error)} (seed {seed})"
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
    )


@contextmanager
def suite_progress(examples: int, forced: bool) -> Iterator[Callable[[SuiteRecorder], None] | None]:
    """Examples and steps so far, on the shared progress display (schedspec/progress.py)."""
    with progress(examples, "checking", forced) as show:
        if show is None:
            yield None
            return

        def advance(recorder: SuiteRecorder) -> None:
            now = "shrinking" if recorder.last_failure is not None else "checking"
            show(
                recorder.examples,
                now,
                f"{recorder.examples} examples, {recorder.stats.steps} steps",
            )

        yield advance


# -------------------------------------------------------------------- replay


def load_trace(path: Path) -> Trace:
    try:
        return Trace.load(path)
    except TraceError as err:
        raise click.BadParameter(str(err), param_hint="'TRACE'") from None


def run_replay(
    path: Path,
    engine_name: str,
    requested: Profile | None,
    step_timeout: float | None = DEFAULT_STEP_TIMEOUT,
) -> int:
    trace = load_trace(path)
    factory = load_engine(engine_name)
    with Watchdog(step_timeout) as watchdog:
        return _replay(path, trace, time_limited(factory, watchdog), engine_name, requested)


def _replay(
    path: Path, trace: Trace, factory: EngineFactory, engine_name: str, requested: Profile | None
) -> int:
    try:
        engine = factory(trace.config)
    except Exception as err:
        return engine_failed(err)
    profile = choose_profile(engine, requested)
    click.echo(f"replaying {path} on {engine_name} (profile {profile}): {len(trace.events)} events")
    for line in format_config(trace.config, trace.model):
        click.echo(f"  {line}")
    if trace.note:  # what the run that wrote the trace saw
        click.echo("recorded failure: " + trace.note.replace("\n", "\n  "))
    log = replay_with_log(trace, engine, profile)
    for line in format_log(log):
        click.echo(line)
    if log.violation is not None:
        broken = ", ".join(sorted({v.invariant for v in log.violation.violations}))
        click.echo(f"FAILED at {_event_name(log)}: {broken} broke")
        return EXIT_CODES[Outcome.VIOLATION]
    if log.crash is not None:
        verb = "hung" if isinstance(log.crash, StepTimeoutError) else "raised"
        click.echo(f"FAILED at {_event_name(log)}: the engine {verb}")
        return EXIT_CODES[outcome_of(None, None, log.crash)]
    click.echo(
        f"PASSED: all {plural(len(trace.events), 'event')} held every invariant of {profile} "
        f"({plural(log.stats.steps, 'step')} checked)"
    )
    return 0


def _event_name(log: ReplayLog) -> str:
    if not log.entries:
        return "the start (the engine's first snapshot)"
    last = log.entries[-1]
    return f"event {last.index} ({type(last.event).__name__})"
