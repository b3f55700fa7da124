"""`schedspec diff-replay`: a trace re-run on two engines in lockstep, side by side, to
the first divergence (exit 3), violation (1), engine error (4) or hang (5); 0 when
the engines agreed on every event."""

from __future__ import annotations

from pathlib import Path

import click

from schedspec.cli.exit_codes import EXIT_CODES, crash_verdict, outcome_of
from schedspec.cli.loading import load_factories, load_trace, usage_errors
from schedspec.cli.options import as_profile, pair_options, side_phrase, step_timeout_option
from schedspec.cli.printing.diff_report import format_diff_log, replay_header
from schedspec.cli.suite_run import EngineFailure, engine_step
from schedspec.engines.boundary import guarded
from schedspec.engines.watchdog import (
    DEFAULT_STEP_TIMEOUT,
    Watchdog,
)
from schedspec.properties.differential import DiffOptions, DiffResult, diff_trace
from schedspec.properties.failure_report import plural
from schedspec.properties.run_plan import (
    EngineNamed,
    RunRequest,
    claims_for_trace,
    engine_pair,
    profile_of,
)
from schedspec.spec.invariants import Profile
from schedspec.traces.trace import Trace


@click.command("diff-replay")
@click.argument("trace", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@pair_options
@step_timeout_option
def diff_replay(
    trace: Path,
    left: str,
    right: str,
    left_python: str | None,
    right_python: str | None,
    profile: str | None,
    compare_block_ids: bool,
    step_timeout: float,
) -> None:
    """Re-run a trace file on two engines in lockstep, side by side, to the first divergence."""
    engines = engine_pair(left, right, left_python, right_python)
    code = run_diff_replay(trace, engines, as_profile(profile), compare_block_ids, step_timeout)
    raise SystemExit(code)


def run_diff_replay(
    path: Path,
    engines: tuple[EngineNamed, EngineNamed],
    requested: Profile | None,
    compare_block_ids: bool = False,
    step_timeout: float | None = DEFAULT_STEP_TIMEOUT,
) -> int:
    """`engines`: run_plan.engine_pair's, each with the interpreter it runs in."""
    trace = load_trace(path)
    request = RunRequest(engines=engines, profile=requested)
    left, right = request.names
    pair = load_factories(request)
    with Watchdog(step_timeout) as watchdog:
        guarded_pair = (guarded(pair[0], watchdog), guarded(pair[1], watchdog))
        # In the trace's family, not the one the engines would run in by default, and
        # each engine held to what the trace's config needs.
        claimed = engine_step(lambda: claims_for_trace(request, guarded_pair, trace.config))
        if isinstance(claimed, EngineFailure):
            return claimed.exit_code
        with usage_errors():
            profile = profile_of(request, claimed)
        sides = [side_phrase(engine.field, engine.python) for engine in engines]
        click.echo(
            f"replaying {path} on {left} ({sides[0]}) and {right} ({sides[1]}) in lockstep "
            f"(profile {profile}): {plural(len(trace.events), 'event')}"
        )
        for line in replay_header(trace):
            click.echo(line)
        result = diff_trace(trace, *guarded_pair, profile, DiffOptions(compare_block_ids))
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
        return crash_verdict(result.error, at, f"the {result.side} engine")
    return (
        f"PASSED: the engines agreed on all {plural(len(trace.events), 'event')} "
        f"({plural(result.stats.steps, 'step')}); each held every invariant of {profile}"
    )


def _event_name(result: DiffResult) -> str:
    if not result.entries:
        return "the start (the engines' first snapshots)"
    last = result.entries[-1]
    return f"event {last.index} ({type(last.event).__name__})"
