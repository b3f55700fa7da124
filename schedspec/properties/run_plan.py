"""A run's plan: what the user named, resolved into what runs.

Every way into the suite names the same things: the `check` and `diff` commands and
swarm mode, the pytest plugin's item and fixture, and fuzz_target. Those things are the
engines, the profile, the configs, the seed, how hard to look (examples, actions per
example, the long profile, shrinking) and where (the backend: workers, Ray, a time
budget, an example database). A RunRequest holds them as they were named.
resolve_plan turns it into a frozen RunPlan: the factories loaded, the policy family,
the profile chosen from what the engines claim (engines/profiles.py), the config
strategy loaded, the seed chosen and the SuiteSettings built. The callers only
translate a refusal into their own usage error and print.

Refusals are RunPlanError, a ValueError whose `field` names the RunRequest field at
fault (an engine by its EngineNamed.field, the interpreter it runs in by its
python_field), its message the library's own refusal (engines/registry.py,
engines/profiles.py, engines/dependencies.py, engines/remote/) unchanged. Whatever
else building an engine raises is the engine's own failure, raised as it is.

The commands resolve the plan in steps. They record the profile in their report
before the configs load, and report an engine that cannot even be built as the
engine's failure. Those steps are load_engines, choose_run_profile and complete_plan,
the same functions resolve_plan calls in turn.
"""

from __future__ import annotations

import os
import random
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple

from schedspec.engines.capabilities import (
    ALL_CAPABILITIES,
    KNOBS,
    Capability,
    CapabilityError,
    claimed_capabilities,
    unmet_capabilities,
)
from schedspec.engines.profiles import (
    ProfileError,
    choose_profile,
    claimed_profiles,
    probe_config,
)
from schedspec.engines.registry import (
    default_configs,
    load_config_strategy,
    run_family,
)
from schedspec.engines.remote.engine import engine_factory
from schedspec.engines.remote.errors import RemoteSetupError
from schedspec.spec import Family, SchedulerConfig
from schedspec.spec.invariants import Profile

if TYPE_CHECKING:
    # Imported when a plan is completed, not with this module: the pytest plugin (in
    # every pytest run) and `schedspec run` (a fast start) import it without Hypothesis.
    from hypothesis.strategies import SearchStrategy

    from schedspec.engines.protocol import EngineAdapter, EngineFactory
    from schedspec.properties.suite import SuiteSettings

# The field of a refusal that no one field of the request is to blame for: the engines
# named share no policy family.
ENGINES_FIELD = "engines"


class RunPlanError(ValueError):
    """A request that cannot be planned. `field` names the RunRequest field at fault:
    an engine's field ("engine"; "left" or "right") or its interpreter's ("python";
    "left_python" or "right_python"), "profile", "configs", "ray", or
    ENGINES_FIELD when no one field is. `needs_choice`: the field was left to its
    default and no default fits (the engines' defaults differ), so it must be given."""

    def __init__(self, field: str, message: str, *, needs_choice: bool = False) -> None:
        super().__init__(message)
        self.field = field
        self.needs_choice = needs_choice


class EngineNamed(NamedTuple):
    """An engine of the request: the field that names it, the name, and the Python it
    runs in (engines/remote/: None, this process)."""

    field: str  # "engine"; "left" and "right" for a pair
    name: str  # as engines/registry.py reads it: a registered engine or module:factory
    python: str | None = None  # another interpreter (a venv's bin/python)

    @property
    def python_field(self) -> str:
        """The field naming its interpreter: "python"; "left_python", "right_python"."""
        return "python" if self.field == "engine" else f"{self.field}_python"


def one_engine(name: str, python: str | None = None) -> tuple[EngineNamed]:
    """The engines of a run that checks one engine."""
    return (EngineNamed("engine", name, python),)


def engine_pair(
    left: str, right: str, left_python: str | None = None, right_python: str | None = None
) -> tuple[EngineNamed, EngineNamed]:
    """The engines of a run that drives two in lockstep."""
    return EngineNamed("left", left, left_python), EngineNamed("right", right, right_python)


@dataclass(frozen=True)
class BackendChoice:
    """Where a run's examples go, and for how long (campaign/backend.py opens it)."""

    workers: int | None = None  # None: 1 local process, or the Ray cluster's CPUs
    ray: str | None = None  # a Ray cluster's address, "local" for one started here
    duration: float | None = None  # seconds: a campaign with a time budget
    example_db: Path | None = None  # Hypothesis' example database

    @property
    def parallel(self) -> bool:
        """More than one worker, Ray, or a time budget: the run is a campaign's
        (campaign/plan.py), in chunks, rather than one run in this process."""
        return (self.workers or 1) > 1 or self.ray is not None or self.duration is not None


@dataclass(frozen=True, kw_only=True)
class RunRequest:
    """What the user named for a run, nothing resolved yet; None: the default."""

    engines: tuple[EngineNamed, ...]
    profile: Profile | None = None
    configs: str | None = None  # module:strategy; None: the engines' default, or the suite's
    seed: int | None = None
    examples: int | None = None
    max_steps: int | None = None  # actions per example
    long: bool = False  # the long profile (also SCHEDSPEC_LONG=1)
    shrink: bool = True
    backend: BackendChoice = BackendChoice()  # frozen: one default serves every request

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(engine.name for engine in self.engines)


@dataclass(frozen=True)
class RunPlan:
    """A request resolved: everything a run needs, decided."""

    request: RunRequest
    factories: tuple[EngineFactory, ...]  # one per engine of the request, in its order
    family: Family  # the policy family the engines run in together
    profile: Profile
    # What every engine has (engines/capabilities.py): the configs drawn stay within it.
    capabilities: frozenset[Capability]
    configs: str | None  # module:strategy the configs come from; None: the suite's own
    config_strategy: SearchStrategy[SchedulerConfig] | None  # configs, loaded
    seed: int
    seed_drawn: bool  # the request gave none: show it before the run, so it can be repeated
    settings: SuiteSettings  # the seed's, with the request's examples and actions


class ChosenProfile(NamedTuple):
    family: Family
    profile: Profile
    # What every engine declares it has (read with its claims).
    capabilities: frozenset[Capability] = ALL_CAPABILITIES


class ChosenSeed(NamedTuple):
    seed: int
    drawn: bool  # at random, none being given


def resolve_plan(request: RunRequest, factories: Sequence[EngineFactory] | None = None) -> RunPlan:
    """The request resolved in one go; `factories` replace the engines' names when the
    caller built them already (a factory of its own, or guarded ones)."""
    loaded = tuple(factories) if factories is not None else load_engines(request)
    return complete_plan(request, loaded, choose_run_profile(request, loaded))


def load_engines(request: RunRequest) -> tuple[EngineFactory, ...]:
    """Step one: the factory of each engine named (engines/registry.py), none built yet;
    an engine in another interpreter has its process started and the engine loaded
    there (engines/remote/), so what that interpreter lacks is refused here too."""
    factories = []
    for engine in request.engines:
        try:
            factories.append(engine_factory(engine.name, engine.python))
        except RemoteSetupError as err:
            at_fault = engine.field if err.blame == "engine" else engine.python_field
            raise RunPlanError(at_fault, str(err)) from err
        except ValueError as err:  # MissingDependencyError too: the engine needs it
            raise RunPlanError(engine.field, str(err)) from err
    return tuple(factories)


def choose_run_profile(request: RunRequest, factories: Sequence[EngineFactory]) -> ChosenProfile:
    """Step two: the family the engines run in, and the profile to check: the one asked
    for if every engine claims it, else the family profile they all claim, else safety.
    Each engine is built once, at its family's smallest config, to read its claims."""
    family = run_family_of(request)
    claims = _claims(request, factories, family)
    profile = profile_of(request, [profiles for profiles, _ in claims])
    shared = frozenset.intersection(ALL_CAPABILITIES, *(c for _, c in claims))
    return ChosenProfile(family, profile, shared)


def complete_plan(
    request: RunRequest, factories: Sequence[EngineFactory], chosen: ChosenProfile
) -> RunPlan:
    """Step three: the configs, the seed and the settings, into the plan."""
    configs = configs_of(request)
    seed = choose_seed(request.seed)
    return RunPlan(
        request,
        tuple(factories),
        chosen.family,
        chosen.profile,
        chosen.capabilities,
        configs,
        load_configs(configs),
        seed.seed,
        seed.drawn,
        suite_settings(request, seed.seed),
    )


def run_family_of(request: RunRequest) -> Family:
    """The policy family the engines run in together (engines/registry.run_family)."""
    try:
        return run_family(request.names, request.profile)
    except ProfileError as err:  # the family asked for, or none the engines share
        at_fault = "profile" if err.field == "profile" else ENGINES_FIELD
        raise RunPlanError(at_fault, str(err)) from err


def claims_for_trace(
    request: RunRequest, factories: Sequence[EngineFactory], config: SchedulerConfig
) -> list[frozenset[Profile]]:
    """What each engine claims, built once at the smallest config of the trace's family
    (build_engine), each held to the capabilities the trace's config needs
    (require_capabilities)."""
    claims = _claims(request, factories, config.family)
    for engine, (_, declared) in zip(request.engines, claims, strict=True):
        require_capabilities(engine, declared, config)
    return [profiles for profiles, _ in claims]


def require_capabilities(
    engine: EngineNamed, declared: frozenset[Capability], config: SchedulerConfig
) -> None:
    """Refuse, on the engine's field, a trace whose config needs a capability the
    engine does not declare: a config it cannot run, told before any event runs rather
    than as the engine's failure at its first call."""
    missing = unmet_capabilities(declared, config)
    if missing:
        names = ", ".join(
            f"{capability.name} ({KNOBS[capability]})"
            for capability in sorted(missing, key=lambda c: c.name)
        )
        raise RunPlanError(
            engine.field,
            f"{engine.name!r} cannot run the trace's config: it needs {names}, which the "
            "engine does not declare in its `capabilities`",
        )


def _claims(
    request: RunRequest, factories: Sequence[EngineFactory], family: Family
) -> list[tuple[frozenset[Profile], frozenset[Capability]]]:
    """What each engine claims and declares, built once at the family's smallest config."""
    config = probe_config(family)
    claims = []
    for engine, factory in zip(request.engines, factories, strict=True):
        built, profiles = build_engine(engine.field, factory, config)
        claims.append((profiles, claimed_capabilities(built)))
    return claims


def build_engine(
    field: str, factory: EngineFactory, config: SchedulerConfig
) -> tuple[EngineAdapter, frozenset[Profile]]:
    """The engine a factory builds at `config`, and the profiles it claims. An adapter
    that declares no profiles, or capabilities its methods do not back, is refused on
    its `field`; whatever else building it raises is the engine's own failure, raised
    as it is."""
    try:
        engine = factory(config)
        claimed_capabilities(engine)  # refused at load, not when a run draws the knob
        return engine, claimed_profiles(engine)
    except (ProfileError, CapabilityError) as err:
        raise RunPlanError(field, str(err)) from err


def profile_of(request: RunRequest, claimed: Sequence[frozenset[Profile]]) -> Profile:
    """The profile to check given what each engine of the request claims
    (engines/profiles.choose_profile; a pair's refusal names the side by its field)."""
    sides = [engine.field for engine in request.engines] if len(request.engines) > 1 else [""]
    try:
        return choose_profile(claimed, request.profile, sides)
    except ProfileError as err:
        raise RunPlanError("profile", str(err)) from err


def configs_of(request: RunRequest) -> str | None:
    """The configs to draw: the request's, else what its engines run by default
    (engines/registry.py), else None: the suite's own."""
    if request.configs is not None:
        return request.configs
    try:
        return default_configs(request.names)
    except ValueError as err:
        raise RunPlanError("configs", str(err), needs_choice=True) from err


def load_configs(name: str | None) -> SearchStrategy[SchedulerConfig] | None:
    """The strategy `name` names (engines/registry.load_config_strategy); None: the
    suite's own, which the state machine picks for the profile's family."""
    if name is None:
        return None
    try:
        return load_config_strategy(name)
    except ValueError as err:
        raise RunPlanError("configs", str(err)) from err


def choose_seed(given: int | None) -> ChosenSeed:
    """The seed given, else one at random. It is chosen here, not in run_suite, so a
    caller can show it before the run starts: a run killed half-way can be repeated."""
    if given is not None:
        return ChosenSeed(given, drawn=False)
    return ChosenSeed(random.randrange(2**32), drawn=True)


def is_long(long: bool) -> bool:
    """The long profile: asked for, or SCHEDSPEC_LONG=1 in the environment."""
    return long or os.environ.get("SCHEDSPEC_LONG") == "1"


def suite_settings(request: RunRequest, seed: int) -> SuiteSettings:
    """The quick or long profile's settings, with the request's examples, actions per
    example and shrinking, on `seed`."""
    from schedspec.properties.suite import SuiteSettings

    chosen = SuiteSettings.long() if is_long(request.long) else SuiteSettings.quick()
    return replace(
        chosen,
        examples=request.examples if request.examples is not None else chosen.examples,
        rules_per_example=(
            request.max_steps if request.max_steps is not None else chosen.rules_per_example
        ),
        seed=seed,
        shrink=request.shrink,
    )
