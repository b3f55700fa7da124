"""The click wiring of `check`, `replay`, `diff` and `diff-replay` (cli.py adds them to `main`).

Only flags live here; the work is in check_command.py and diff_command.py,
imported inside each command: the harness pulls in Hypothesis, which
`schedspec run` does not need at start-up.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar, cast

import click

from schedspec.properties.watchdog import DEFAULT_STEP_TIMEOUT
from schedspec.spec.invariants import PROFILES

if TYPE_CHECKING:
    from schedspec.spec.invariants import Profile

F = TypeVar("F", bound=Callable[..., Any])

ENGINE_HELP = "'reference', or module:factory naming a factory (SchedulerConfig -> EngineAdapter)."
PROFILE_HELP = "Invariants to check [default: vllm-v1 if the engine claims it, else safety]."
PAIR_PROFILE_HELP = (
    "Invariants to check on both engines [default: vllm-v1 if both claim it, else safety]."
)


def _profile(value: str | None) -> Profile | None:
    return cast("Profile | None", value)  # click.Choice(PROFILES) checked it


def _stack(*decorators: Callable[[F], F]) -> Callable[[F], F]:
    def apply(function: F) -> F:
        for decorator in reversed(decorators):
            function = decorator(function)
        return function

    return apply


step_timeout_option = click.option(
    "--step-timeout",
    type=click.FloatRange(min=0),
    default=DEFAULT_STEP_TIMEOUT,
    show_default=True,
    metavar="SECONDS",
    help="An engine call that runs longer is stopped and reported as a hang (exit 5); 0: no limit.",
)

# The flags `check` and `diff` share: how hard to look, where results go.
run_options = _stack(
    click.option(
        "--examples",
        type=click.IntRange(min=1),
        default=None,
        help="Hypothesis examples to run [default: the quick profile's, or the long one's].",
    ),
    click.option("--seed", type=click.IntRange(min=0), default=None, help="Repeat a run exactly."),
    click.option(
        "--max-steps",
        type=click.IntRange(min=1),
        default=None,
        help="Actions per example (add_request, abort, drafts, step), each of which may step "
        "the engine several times "
        "[default: the quick profile's, or the long one's].",
    ),
    click.option("--long", is_flag=True, help="The long profile (also SCHEDSPEC_LONG=1)."),
    click.option(
        "--trace-dir",
        type=click.Path(file_okay=False, path_type=Path),
        # Relative, so the printed replay command stays short.
        default=Path(),
        help="Where a failure's trace is written [default: the current directory].",
    ),
    click.option("--no-shrink", is_flag=True, help="Report the first failure found, unshrunk."),
    click.option(
        "--configs",
        default=None,
        metavar="MODULE:STRATEGY",
        help="The configs to draw: a Hypothesis strategy (or a function returning one), e.g. "
        "one narrowed to what an engine supports [default: the suite's own].",
    ),
    click.option("--progress", is_flag=True, help="Report progress on stderr even off a terminal."),
    step_timeout_option,
    click.option(
        "--junit",
        type=click.Path(dir_okay=False, path_type=Path),
        default=None,
        help="Write a JUnit XML report here (a testcase per invariant, one for engine errors).",
    ),
    click.option(
        "--json",
        "json_path",
        type=click.Path(dir_okay=False, path_type=Path),
        default=None,
        help="Write a JSON summary here (outcome, counts, violations, trace path).",
    ),
)

pair_options = _stack(
    click.option("--left", default="reference", show_default=True, help=ENGINE_HELP),
    click.option("--right", required=True, help=ENGINE_HELP),
    click.option("--profile", type=click.Choice(PROFILES), default=None, help=PAIR_PROFILE_HELP),
    click.option(
        "--compare-block-ids",
        is_flag=True,
        help="Also compare block ids and the free-queue order (off: block counts only).",
    ),
)


@click.command()
@click.option("--engine", default="reference", show_default=True, help=ENGINE_HELP)
@click.option("--profile", type=click.Choice(PROFILES), default=None, help=PROFILE_HELP)
@click.option(
    "--workers",
    type=click.IntRange(min=1),
    default=1,
    show_default=True,
    help="Processes: the examples are split over seeds seed, seed + 1, ... (one per core).",
)
@click.option(
    "--instances",
    type=click.IntRange(min=1),
    default=1,
    show_default=True,
    help="Swarm mode (--engine gpu): this many gpu_impl instances stepped at once on device "
    "workloads, device checks after every step; --examples counts configs, --max-steps ticks.",
)
@run_options
def check(
    engine: str,
    profile: str | None,
    no_shrink: bool,
    json_path: Path | None,
    **run: Any,
) -> None:
    """Run the invariant suite against an engine.

    Exit 0 if every invariant held, 1 on a violation, 4 on an engine error,
    5 on a hang, 2 on a usage error.
    """
    from schedspec.check_command import CheckOptions, run_check

    options = CheckOptions(
        engine=engine, profile=_profile(profile), shrink=not no_shrink, json=json_path, **run
    )
    raise SystemExit(run_check(options))


@click.command()
@click.argument("trace", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("--engine", default="reference", show_default=True, help=ENGINE_HELP)
@click.option("--profile", type=click.Choice(PROFILES), default=None, help=PROFILE_HELP)
@step_timeout_option
def replay(trace: Path, engine: str, profile: str | None, step_timeout: float) -> None:
    """Re-run a trace file on an engine and name the first event that breaks an invariant."""
    from schedspec.check_command import run_replay

    raise SystemExit(run_replay(trace, engine, _profile(profile), step_timeout))


@click.command()
@pair_options
@run_options
def diff(profile: str | None, no_shrink: bool, json_path: Path | None, **run: Any) -> None:
    """Drive two engines in lockstep through random workloads and report the first step
    where they disagree.

    Exit 0 if they agreed and held every invariant, 3 on a divergence, 1 on
    a violation, 4 on an engine error, 5 on a hang, 2 on a usage error.
    """
    from schedspec.diff_command import DiffCommandOptions, run_diff_command

    options = DiffCommandOptions(
        profile=_profile(profile), shrink=not no_shrink, json=json_path, **run
    )
    raise SystemExit(run_diff_command(options))


@click.command("diff-replay")
@click.argument("trace", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@pair_options
@step_timeout_option
def diff_replay(
    trace: Path,
    left: str,
    right: str,
    profile: str | None,
    compare_block_ids: bool,
    step_timeout: float,
) -> None:
    """Re-run a trace file on two engines in lockstep, side by side, to the first divergence."""
    from schedspec.diff_command import run_diff_replay

    code = run_diff_replay(trace, left, right, _profile(profile), compare_block_ids, step_timeout)
    raise SystemExit(code)


COMMANDS = (check, replay, diff, diff_replay)
