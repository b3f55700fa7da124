"""The click options several commands share, and their help texts.

Only flags live here; each command's module holds its work. Importing this
module stays light (no Hypothesis, torch, z3 or matplotlib): main.py's
--help and `schedspec run` read it.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar, cast

import click
from click.core import ParameterSource

from schedspec.engines.registry import ENGINE_FORMS
from schedspec.engines.watchdog import (
    DEFAULT_STEP_TIMEOUT,
    MAX_STEP_TIMEOUT,
    check_step_timeout,
)
from schedspec.spec.invariants import PROFILES

if TYPE_CHECKING:
    from schedspec.spec.invariants import Profile

F = TypeVar("F", bound=Callable[..., Any])

ENGINE_HELP = (
    f"The engine: {ENGINE_FORMS} naming a factory (SchedulerConfig -> EngineAdapter; "
    "a class works; the working directory is on the import path)."
)
PROFILE_HELP = (
    "Invariants to check: safety (any engine), or safety plus one family's exact decisions "
    "(vllm-v1, sglang; also picks the family the engine runs in) [default: the family "
    "profile the engine claims, else safety]."
)
PAIR_PROFILE_HELP = (
    "Invariants to check on both engines (see check --help) [default: the family profile "
    "both claim, else safety]."
)


def as_profile(value: str | None) -> Profile | None:
    return cast("Profile | None", value)  # click.Choice(PROFILES) checked it


def stack(*decorators: Callable[[F], F]) -> Callable[[F], F]:
    """Several click decorators as one, applied in the order written."""

    def apply(function: F) -> F:
        for decorator in reversed(decorators):
            function = decorator(function)
        return function

    return apply


def given_flags(ctx: click.Context, *flags: str) -> list[str]:
    """Those of `flags` the user gave (on the command line or through the environment),
    as opposed to left at their defaults."""
    given = []
    for param in ctx.command.params:
        named = [flag for flag in flags if flag in param.opts]
        source = ctx.get_parameter_source(param.name) if param.name else None
        if named and source not in (None, ParameterSource.DEFAULT, ParameterSource.DEFAULT_MAP):
            given += named
    return given


def refuse_flags(ctx: click.Context, flags: list[str], reason: str) -> None:
    """A usage error if any of `flags` was given: `reason` says what it conflicts with."""
    given = given_flags(ctx, *flags)
    if given:
        raise click.UsageError(f"{', '.join(given)}: {reason}")


engine_option = click.option("--engine", default="reference", show_default=True, help=ENGINE_HELP)
profile_option = click.option(
    "--profile", type=click.Choice(PROFILES), default=None, help=PROFILE_HELP
)


def _step_timeout(ctx: click.Context, param: click.Parameter, value: float) -> float:
    """A finite number of seconds up to a day (click's FloatRange lets inf and nan in)."""
    try:
        check_step_timeout(value)
    except ValueError as err:
        raise click.BadParameter(str(err)) from None
    return value


step_timeout_option = click.option(
    "--step-timeout",
    type=float,
    default=DEFAULT_STEP_TIMEOUT,
    show_default=True,
    metavar="SECONDS",
    callback=_step_timeout,
    help="An engine call that runs longer is stopped and reported as a hang (exit 5); "
    f"0: no limit; at most {MAX_STEP_TIMEOUT:g}.",
)


def count_option(flag: str, help_text: str) -> Callable[[F], F]:
    """An optional count of at least 1 whose default the command works out (the help
    says how)."""
    return click.option(flag, type=click.IntRange(min=1), default=None, help=help_text)


def run_options(swarm: bool) -> Callable[[F], F]:
    """The flags `check` and `diff` share: how hard to look, where results go. swarm: the
    command has swarm mode (check), whose defaults the help then states too."""
    return stack(
        count_option(
            "--examples",
            "Hypothesis examples to search [default: 100, 2000 with --long"
            + ("; swarm mode: configs, 4, 32 with --long]." if swarm else "]."),
        ),
        click.option(
            "--seed", type=click.IntRange(min=0), default=None, help="Repeat a run exactly."
        ),
        count_option(
            "--max-steps",
            "Actions per example (add_request, abort, drafts, step), each of which may step "
            "the engine several times [default: 40, 100 with --long"
            + ("; swarm mode: ticks per config, the same]." if swarm else "]."),
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
            help="The configs to draw: a Hypothesis strategy (or a function returning one) "
            "[default: the engine's own where it has one (vllm: its release's knobs, sync and "
            "async, with and without speculative decoding, outside the corners where vLLM and "
            "the spec are known to part: docs/FINDINGS.md), else the suite's].",
        ),
        click.option(
            "--progress", is_flag=True, help="Report progress on stderr even off a terminal."
        ),
        click.option(
            "--quiet",
            is_flag=True,
            help="Print the verdict line only (PASSED: ... or FAILED: ...): no heading, no "
            "invariant or corner table, no shrink notice; a failure still prints its violation, "
            "counterexample and trace.",
        ),
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


# The longest --duration accepted: a week. A campaign past that is no longer one run.
MAX_DURATION_SECONDS = 7 * 86_400.0
_DURATION_PART = re.compile(r"(\d+(?:\.\d+)?)([smhd]?)")
_UNIT_SECONDS = {"": 1.0, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86_400.0}


def parse_duration(text: str) -> float:
    """Seconds in a duration such as 90, 90s, 5m, 2h, 1h30m or 1d; ValueError naming the
    form or the bound (more than 0, at most a week)."""
    compact = text.strip().lower()
    parts = _DURATION_PART.findall(compact)
    if not compact or "".join(n + u for n, u in parts) != compact:
        raise ValueError(
            f"must be a number of seconds or a duration with units s, m, h, d "
            f"(90, 90s, 5m, 2h, 1h30m), got {text!r}"
        )
    seconds = sum(float(number) * _UNIT_SECONDS[unit] for number, unit in parts)
    if not 0 < seconds <= MAX_DURATION_SECONDS:
        raise ValueError(f"must be more than 0 s and at most 7d, got {text!r}")
    return seconds


def format_duration(seconds: float) -> str:
    """A duration as parse_duration reads it, largest units first (5m, 1h30m, 45.5s)."""
    rest = round(seconds, 1)
    text = ""
    for unit, size in (("d", 86_400), ("h", 3600), ("m", 60)):
        count, rest = divmod(rest, size)
        if count:
            text += f"{int(count)}{unit}"
    if rest or not text:
        text += f"{rest:g}s"
    return text


def _duration(ctx: click.Context, param: click.Parameter, value: str | None) -> float | None:
    if value is None:
        return None
    try:
        return parse_duration(value)
    except ValueError as err:
        raise click.BadParameter(str(err)) from None


def _example_db(ctx: click.Context, param: click.Parameter, value: str | None) -> Path | None:
    """The folder as a Path; an empty string is refused (as a Path it is the working
    directory, which would fill with Hypothesis' folders). The folder itself is checked
    with the other outputs (suite_run.prepare_outputs)."""
    if value is None:
        return None
    if not value.strip():
        raise click.BadParameter("is empty: name a folder for Hypothesis' example database")
    return Path(value)


def backend_options(swarm: bool) -> Callable[[F], F]:
    """Where the chunks of a `check` or `diff` run (or of swarm mode's configs, swarm: the
    command has it) go: local processes, or Ray; for a count of examples, or for a time
    (a campaign)."""
    return stack(
        count_option(
            "--workers",
            "Workers: the examples are split into chunks over seeds seed, seed + 1, ... "
            "[default: 1 local process; with --ray, the cluster's CPUs].",
        ),
        click.option(
            "--ray",
            is_flag=False,
            flag_value="local",
            default=None,
            metavar="[ADDRESS]",
            help="Run the chunks as Ray tasks: on the cluster at ADDRESS (auto, HOST:PORT, "
            "ray://HOST:PORT), or, with no ADDRESS, on a local cluster started for the run "
            "(loopback only). Needs Ray, the ray extra (without it the error says how to "
            "install it).",
        ),
        click.option(
            "--duration",
            default=None,
            callback=_duration,
            metavar="DURATION",
            help="A campaign: search for this long (90s, 5m, 2h, 1h30m; at most 7d) in chunks "
            "of 200 examples" + (" (swarm mode: 4 configs)" if swarm else "") + ", keeping "
            "every distinct failure's trace; --examples, if given, caps it.",
        ),
        click.option(
            "--example-db",
            type=click.Path(file_okay=False),
            callback=_example_db,
            default=None,
            metavar="DIR",
            help="Hypothesis' example database: failing examples are saved here and tried "
            "first by the next run given it (shared by every worker; a run then depends on "
            "more than its seed).",
        ),
    )


def python_option(flag: str, engine: str) -> Callable[[F], F]:
    """--python, --left-python or --right-python: the interpreter `engine` runs in."""
    return click.option(
        flag,
        default=None,
        metavar="PATH",
        help=f"Run {engine} in this Python (another venv's bin/python with the same "
        "schedspec installed), in a process of its own over a pipe, loaded there by name "
        "[default: this process].",
    )


def interpreter_flags(**pythons: str | None) -> str:
    """The interpreter flags given (keyword: the flag, `_` for `-`), as a command line
    spells them, each followed by a space: for a printed replay command."""
    given = [(flag, path) for flag, path in pythons.items() if path is not None]
    return "".join(f"--{flag.replace('_', '-')} {shlex.quote(path)} " for flag, path in given)


def side_phrase(side: str, python: str | None) -> str:
    """How a first line names an engine's side: "left", or "left, in PATH" for one in
    another interpreter."""
    return side if python is None else f"{side}, in {python}"


pair_options = stack(
    click.option("--left", default="reference", show_default=True, help=ENGINE_HELP),
    click.option("--right", required=True, help=ENGINE_HELP),
    python_option("--left-python", "the left engine"),
    python_option("--right-python", "the right engine"),
    click.option("--profile", type=click.Choice(PROFILES), default=None, help=PAIR_PROFILE_HELP),
    click.option(
        "--compare-block-ids",
        is_flag=True,
        help="Also compare block ids and the free-queue order (off: block counts only).",
    ),
)
