"""`schedspec replay`: re-run a trace on an engine and name the first event that breaks
an invariant (exit 1), or say that all held (exit 0); 4 if the engine raised, 5 if it
hung, 2 on a usage error, 6 if schedspec itself failed.

`schedspec export-test`: the same replay written out as a standalone pytest file for the
engine's own suite (schedspec/export/). Exit 0 with the file written (to standard
output, or -o), 2 when the trace holds what the engine's file cannot express (naming
the trace's field)."""

from __future__ import annotations

import json
from pathlib import Path

import click

from schedspec.cli.exit_codes import EXIT_CODES, Outcome, crash_verdict, outcome_of
from schedspec.cli.loading import load_factories, load_trace, usage_errors
from schedspec.cli.options import (
    as_profile,
    engine_option,
    profile_option,
    python_option,
    step_timeout_option,
)
from schedspec.cli.suite_run import EngineFailure, engine_step
from schedspec.engines.boundary import guarded
from schedspec.engines.capabilities import claimed_capabilities
from schedspec.engines.protocol import EngineAdapter, EngineFactory
from schedspec.engines.watchdog import (
    DEFAULT_STEP_TIMEOUT,
    Watchdog,
)
from schedspec.export.lowering import ExportError
from schedspec.export.writers import WRITERS, export_test
from schedspec.files import OutputPathError, write_atomically
from schedspec.properties.failure_report import format_config, format_log, plural
from schedspec.properties.replay_log import ReplayLog, replay_with_log
from schedspec.properties.run_plan import (
    RunPlanError,
    RunRequest,
    build_engine,
    one_engine,
    profile_of,
    require_capabilities,
)
from schedspec.spec import ConfigError
from schedspec.spec.invariants import Profile
from schedspec.traces.trace import Trace

# The events a replay prints, the last ones before the failure (or the end): a trace of a
# million events printed whole was a minute of output nobody reads.
SHOWN_EVENTS = 200


@click.command()
@click.argument("trace", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@engine_option
@python_option("--python", "the engine")
@profile_option
@step_timeout_option
@click.option(
    "--quiet",
    is_flag=True,
    help="Print the verdict line only when every event holds (PASSED: ...); a failure "
    "still prints the replayed events and what broke.",
)
def replay(
    trace: Path,
    engine: str,
    python: str | None,
    profile: str | None,
    step_timeout: float,
    quiet: bool,
) -> None:
    """Re-run a trace file on an engine and name the first event that breaks an invariant."""
    raise SystemExit(run_replay(trace, engine, as_profile(profile), step_timeout, python, quiet))


def run_replay(
    path: Path,
    engine_name: str,
    requested: Profile | None,
    step_timeout: float | None = DEFAULT_STEP_TIMEOUT,
    python: str | None = None,
    quiet: bool = False,
) -> int:
    """`python`: the interpreter the engine runs in (None: this one)."""
    trace = load_trace(path)
    request = RunRequest(engines=one_engine(engine_name, python), profile=requested)
    (factory,) = load_factories(request)
    with Watchdog(step_timeout) as watchdog:
        return _replay(path, trace, guarded(factory, watchdog), request, quiet)


def _replay(
    path: Path, trace: Trace, factory: EngineFactory, request: RunRequest, quiet: bool
) -> int:
    (engine_name,) = request.names
    built = engine_step(lambda: _build_for_trace(engine_name, factory, trace))
    if isinstance(built, EngineFailure):
        return built.exit_code
    engine, claimed = built
    with usage_errors():
        profile = profile_of(request, [claimed])
    heading = [f"replaying {path} on {engine_name} (profile {profile}): {len(trace.events)} events"]
    heading += [f"  {line}" for line in format_config(trace.config, trace.model)]
    if trace.note:  # what the run that wrote the trace saw
        heading.append("recorded failure: " + trace.note.replace("\n", "\n  "))
    if not quiet:  # before the replay, which may take long
        click.echo("\n".join(heading))
    log = replay_with_log(trace, engine, profile)
    if log.failed or not quiet:  # a failure prints in full, --quiet or not
        if quiet:
            click.echo("\n".join(heading))
        for line in format_log(log, last=SHOWN_EVENTS):
            click.echo(line)
    if log.violation is not None:
        broken = ", ".join(sorted({v.invariant for v in log.violation.violations}))
        click.echo(f"FAILED at {_event_name(log)}: {broken} broke")
        return EXIT_CODES[Outcome.VIOLATION]
    if log.crash is not None:
        click.echo(crash_verdict(log.crash, _event_name(log)))
        return EXIT_CODES[outcome_of(None, None, log.crash)]
    click.echo(
        f"PASSED: all {plural(len(trace.events), 'event')} held every invariant of {profile} "
        f"({plural(log.stats.steps, 'step')} checked)"
    )
    return 0


def _build_for_trace(
    engine_name: str, factory: EngineFactory, trace: Trace
) -> tuple[EngineAdapter, frozenset[Profile]]:
    """The engine built at the trace's config. An engine that refuses that config
    (ConfigError: a hybrid cache in an engine with one KV cache group, a connector in
    one without) is told a config it cannot run: a usage error naming the field, not a
    failure of the engine."""
    try:
        engine, claimed = build_engine("engine", factory, trace.config)
    except ConfigError as err:
        raise RunPlanError(
            "engine", f"{engine_name!r} cannot run the trace's config: {err}"
        ) from err
    (named,) = one_engine(engine_name)
    require_capabilities(named, claimed_capabilities(engine), trace.config)
    return engine, claimed


def _event_name(log: ReplayLog) -> str:
    if not log.entries:
        return "the start (the engine's first snapshot)"
    last = log.entries[-1]
    return f"event {last.index} ({type(last.event).__name__})"


def engine_arg(text: str) -> tuple[str, object]:
    """NAME=VALUE, the value read as JSON (a bare word is a string)."""
    name, equals, raw = text.partition("=")
    if not equals or not name.isidentifier():
        raise click.BadParameter(f"{text!r}: must be NAME=VALUE", param_hint="'--engine-arg'")
    try:
        return name, json.loads(raw)
    except json.JSONDecodeError:
        return name, raw


@click.command("export-test")
@click.argument("trace", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option(
    "--for",
    "engine",
    type=click.Choice(sorted(WRITERS)),
    required=True,
    help="The engine whose own scheduler the test drives.",
)
@click.option(
    "-o",
    "--output",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="Write the file here [default: standard output].",
)
@click.option(
    "--finding",
    default="",
    help="What the bug is called (an issue, a finding's id), for the file's docstring.",
)
@click.option(
    "--engine-arg",
    "engine_args",
    multiple=True,
    metavar="NAME=VALUE",
    help="An engine argument the trace's config cannot state, set as given (vLLM: a "
    "keyword of its SchedulerConfig; SGLang: of its ServerArgs); repeatable.",
)
def export_test_command(
    trace: Path, engine: str, output: Path | None, finding: str, engine_args: tuple[str, ...]
) -> None:
    """Write a trace as a pytest file that drives the engine's own scheduler, with no
    schedspec import: it fails where the trace's bug is and passes on a fixed engine."""
    args = dict(engine_arg(text) for text in engine_args)
    try:
        text = export_test(load_trace(trace), str(trace), engine, finding, args)
    except ExportError as err:
        raise click.UsageError(f"cannot export {trace} for {engine}: {err}") from None
    if output is None:
        click.echo(text, nl=False)
    else:
        try:
            write_atomically(output, text)
        except OutputPathError as err:
            raise click.BadParameter(str(err), param_hint="'--output'") from None
        click.echo(f"wrote {output}", err=True)
