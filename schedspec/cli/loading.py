"""The library's refusals as usage errors, and what the commands load by name.

The library decides (properties/run_plan.py, campaign/backend.py) and refuses with
RunPlanError, whose `field` is the request's, or with MissingDependencyError; here
each becomes a click usage error (exit 2) naming the flag, with no traceback. A
request's fields are named as the flags are: field max_steps is --max-steps.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

import click

from schedspec.engines.dependencies import MissingDependencyError, OptionalDependency, require
from schedspec.properties.run_plan import (
    ENGINES_FIELD,
    RunPlanError,
    RunRequest,
    load_engines,
    one_engine,
)

if TYPE_CHECKING:
    from schedspec.engines.protocol import EngineFactory
    from schedspec.traces.trace import Trace


def usage_error(err: RunPlanError) -> click.UsageError:
    """The refusal as a usage error on its field's flag: a bad value of the flag, or a
    flag left out that must be given; a refusal of no one field names none."""
    if err.field == ENGINES_FIELD:
        return click.UsageError(str(err))
    flag = "--" + err.field.replace("_", "-")
    if err.needs_choice:
        return click.UsageError(f"{err}: choose one with {flag}")
    return click.BadParameter(str(err), param_hint=f"'{flag}'")


@contextmanager
def usage_errors() -> Iterator[None]:
    """The library's refusals in the body raised as usage errors."""
    try:
        yield
    except RunPlanError as err:
        raise usage_error(err) from None
    except MissingDependencyError as err:  # its message names what needs it
        raise click.UsageError(str(err)) from None


def load_factories(request: RunRequest) -> tuple[EngineFactory, ...]:
    """The factories of the engines the request names (run_plan.load_engines)."""
    # A console script does not put the working directory on sys.path, yet
    # `--engine my_adapter:make_engine` run from an engine's repo should just
    # work, as it does for pytest or uvicorn.
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    with usage_errors():
        return load_engines(request)


def load_engine(name: str) -> EngineFactory:
    """The factory --engine names."""
    (factory,) = load_factories(RunRequest(engines=one_engine(name)))
    return factory


def require_for(needed_by: str, *dependencies: OptionalDependency) -> None:
    """A usage error naming what brings a missing optional dependency."""
    with usage_errors():
        require(needed_by, *dependencies)


def load_trace(path: Path) -> Trace:
    from schedspec.traces.trace import Trace, TraceError

    try:
        return Trace.load(path)
    except TraceError as err:
        raise click.BadParameter(str(err), param_hint="'TRACE'") from None
