"""What the commands load by name, with the library's refusals turned into usage errors.

The library raises ValueError subclasses that name the field at fault
(engines/registry.py, profiles.py, dependencies.py, trace.py); here each
becomes a click usage error (exit 2) naming the flag, with no traceback.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple

import click

from schedspec.engines.dependencies import MissingDependencyError, OptionalDependency, require
from schedspec.engines.profiles import (
    ProfileError,
    choose_profile,
    claimed_profiles,
    probe_config,
)
from schedspec.engines.registry import (
    default_configs,
    load_config_strategy,
    load_engine_factory,
    run_family,
)

if TYPE_CHECKING:
    from hypothesis.strategies import SearchStrategy

    from schedspec.engines.protocol import EngineAdapter, EngineFactory
    from schedspec.spec import Family, SchedulerConfig
    from schedspec.spec.invariants import Profile
    from schedspec.traces.trace import Trace


def load_engine(name: str, flag: str = "--engine") -> EngineFactory:
    """The factory a flag names, or a usage error naming the flag."""
    # A console script does not put the working directory on sys.path, yet
    # `--engine my_adapter:make_engine` run from an engine's repo should just
    # work, as it does for pytest or uvicorn.
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        return load_engine_factory(name)
    except ValueError as err:
        raise click.BadParameter(str(err), param_hint=f"'{flag}'") from None


class ChosenConfigs(NamedTuple):
    name: str | None  # module:strategy; None: the suite's own
    strategy: SearchStrategy[SchedulerConfig] | None

    def described(self) -> str:
        """What a run's first line adds about them: nothing for the suite's own."""
        return "" if self.name is None else f", configs from {self.name}"


def pick_family(engines: Sequence[str], requested: Profile | None) -> Family:
    """The policy family the engines run in (properties/engines.run_family), or a
    usage error on --profile."""
    try:
        return run_family(engines, requested)
    except ProfileError as err:
        if err.field == "profile":
            raise click.BadParameter(str(err), param_hint="'--profile'") from None
        raise click.UsageError(str(err)) from None


def load_configs(name: str | None, engines: Sequence[str]) -> ChosenConfigs:
    """The configs to draw: --configs, else what the engines run by default
    (engines/registry.py), else the suite's own."""
    try:
        chosen = name if name is not None else default_configs(tuple(engines))
    except ValueError as err:
        raise click.UsageError(f"{err}: choose one with --configs") from None
    if chosen is None:
        return ChosenConfigs(None, None)
    try:
        return ChosenConfigs(chosen, load_config_strategy(chosen))
    except ValueError as err:
        raise click.BadParameter(str(err), param_hint="'--configs'") from None


def build_engine(
    factory: EngineFactory, config: SchedulerConfig, flag: str
) -> tuple[EngineAdapter, frozenset[Profile]]:
    """The engine the factory builds, and the profiles it claims. An adapter that
    declares no profiles is a usage error on `flag`; anything else building it raises
    is the engine's own failure, for the caller to report (callers let
    click.UsageError through first)."""
    try:
        engine = factory(config)  # the harness's wrappers read the profiles, too
        return engine, claimed_profiles(engine)
    except ProfileError as err:
        raise click.BadParameter(str(err), param_hint=f"'{flag}'") from None


def probe(factory: EngineFactory, flag: str, family: Family) -> frozenset[Profile]:
    """The profiles the factory's engine claims, built at PROBE_CONFIG in the family
    (as build_engine)."""
    return build_engine(factory, probe_config(family), flag)[1]


def pick_profile(
    claimed: Sequence[frozenset[Profile]], requested: Profile | None, sides: Sequence[str] = ("",)
) -> Profile:
    """The profile to check (engines/profiles.py), or a usage error on --profile."""
    try:
        return choose_profile(claimed, requested, sides)
    except ProfileError as err:
        raise click.BadParameter(str(err), param_hint="'--profile'") from None


def require_for(needed_by: str, *dependencies: OptionalDependency) -> None:
    """A usage error naming what brings a missing optional dependency."""
    try:
        require(needed_by, *dependencies)
    except MissingDependencyError as err:
        raise click.UsageError(str(err)) from None


def load_trace(path: Path) -> Trace:
    from schedspec.traces.trace import Trace, TraceError

    try:
        return Trace.load(path)
    except TraceError as err:
        raise click.BadParameter(str(err), param_hint="'TRACE'") from None
