"""`schedspec check` and `schedspec replay`: the invariant suite and trace replay, as commands.

cli.py holds only the click wiring; the work and the output live here.
Exit codes: 0 all invariants held, 1 a violation or an engine crash, 2 a
usage error (click.UsageError and its subclasses).
"""

from __future__ import annotations

import os
import random
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path

import click

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
from schedspec.properties.adapter import EngineAdapter, EngineFactory, load_engine_factory
from schedspec.properties.state_machine import SuiteRecorder
from schedspec.properties.suite import SuiteSettings, run_suite
from schedspec.properties.trace import Trace, TraceError
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


def _engine_failed(err: BaseException) -> int:
    """An engine that cannot even be built fails the run, but is no usage error."""
    click.echo("FAILED: " + "\n".join(crash_report(err)))
    return 1


# --------------------------------------------------------------------- check


@dataclass(frozen=True)
class CheckOptions:
    engine: str
    profile: Profile | None
    examples: int | None
    seed: int | None
    max_steps: int | None
    long: bool
    trace_dir: Path | None
    shrink: bool
    progress: bool


def suite_settings(options: CheckOptions, seed: int) -> SuiteSettings:
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


def run_check(options: CheckOptions) -> int:
    factory = load_engine(options.engine)
    try:
        probe = factory(PROBE_CONFIG)
    except Exception as err:
        return _engine_failed(err)
    profile = choose_profile(probe, options.profile)
    # The seed is chosen here rather than in run_suite so it is on screen
    # before the run starts: a run killed half-way can still be repeated.
    seed = options.seed if options.seed is not None else random.randrange(2**32)
    if options.seed is None:
        click.echo(f"seed {seed}: rerun with --seed {seed}")
    chosen = suite_settings(options, seed)
    click.echo(
        f"checking {options.engine} against profile {profile}: "
        f"{chosen.examples} examples of up to {chosen.rules_per_example} rules"
    )
    # Relative by default, so the printed replay command stays short.
    trace_dir = options.trace_dir if options.trace_dir is not None else Path()
    with _progress(chosen.examples, options.progress) as on_example:
        result = run_suite(factory, profile, chosen, None, trace_dir, on_example)
    if not result.passed:
        click.echo()
        for line in failure_report(result, factory, options.engine):
            click.echo(line)
    failing = [v.invariant for v in result.error.violations] if result.error else []
    click.echo()
    for line in format_table(result.stats, profile, failing):
        click.echo(line)
    click.echo(format_totals(result.examples, result.stats, result.seconds))
    if result.passed:
        click.echo(f"PASSED: every invariant of profile {profile} held")
        return 0
    what = ", ".join(sorted(set(failing))) or "the engine crashed"
    click.echo(f"FAILED: {what} (seed {seed})")
    return 1


@contextmanager
def _progress(examples: int, forced: bool) -> Iterator[Callable[[SuiteRecorder], None] | None]:
    """A progress bar on a terminal; with --progress elsewhere, a plain line per
    tenth of the run (no carriage returns to litter CI logs); else nothing."""
    if sys.stderr.isatty():
        with click.progressbar(
            length=examples,
            label="checking",
            file=sys.stderr,
            item_show_func=lambda text: text,
        ) as bar:

            def advance(recorder: SuiteRecorder) -> None:
                if recorder.last_failure is not None:
                    bar.label = "shrinking"
                # Hypothesis may run more examples than asked for (and then the
                # shrinker's): the bar stops at full, the counts keep moving.
                bar.update(
                    max(0, min(recorder.examples, examples) - bar.pos),
                    f"{recorder.examples} examples, {recorder.stats.steps} steps",
                )
                bar.render_progress()  # update() draws nothing when the bar did not move

            yield advance
        return
    if not forced:
        yield None
        return
    started = time.perf_counter()
    every = max(1, examples // 10)

    def report(recorder: SuiteRecorder) -> None:
        if recorder.examples % every == 0:
            click.echo(
                f"checked {recorder.examples} examples, {recorder.stats.steps} steps "
                f"({time.perf_counter() - started:.1f} s)",
                err=True,
            )

    yield report


# -------------------------------------------------------------------- replay


def load_trace(path: Path) -> Trace:
    try:
        return Trace.load(path)
    except TraceError as err:
        raise click.BadParameter(str(err), param_hint="'TRACE'") from None


def run_replay(path: Path, engine_name: str, requested: Profile | None) -> int:
    trace = load_trace(path)
    factory = load_engine(engine_name)
    try:
        engine = factory(trace.config)
    except Exception as err:
        return _engine_failed(err)
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
        return 1
    if log.crash is not None:
        click.echo(f"FAILED at {_event_name(log)}: the engine raised")
        return 1
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
