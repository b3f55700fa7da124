"""pytest plugin: hold an engine to the invariant suite from any test run.

Registered through the `pytest11` entry point, so installing schedspec is
enough. Two ways in:

- `pytest --schedspec-engine my_adapter:make_engine` adds one test item,
  `schedspec[my_adapter:make_engine:vllm-v1]`, that runs the suite;
- the `schedspec_suite` fixture runs it from a test of your own:

      def test_my_engine_meets_the_spec(schedspec_suite):
          schedspec_suite(make_engine)

- fuzz_target(ENGINE) is the suite's state machine as a test of its own, one that
  HypoFuzz can fuzz (`hypothesis fuzz -- tests/test_fuzz.py`, docs/CAMPAIGNS.md):

      TestMyEngine = fuzz_target("my_adapter:make_engine")

A failure shows the violations, the shrunk counterexample step by step
and the path of its trace file.
"""

from __future__ import annotations

import os
import unittest
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from schedspec.engines.registry import ENGINE_FORMS

if TYPE_CHECKING:
    # The plugin loads in every pytest run of an environment that has
    # schedspec installed; the harness is imported only when used.
    from schedspec.engines.protocol import EngineFactory
    from schedspec.properties.suite import SuiteResult, SuiteSettings
    from schedspec.spec.invariants import Profile

# schedspec.spec.invariants.PROFILES, not imported here
PROFILE_CHOICES = ("safety", "vllm-v1", "sglang")


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("schedspec", "schedspec invariant suite")
    group.addoption(
        "--schedspec-engine",
        metavar="ENGINE",
        default=None,
        help=f"Add a test that checks this engine: {ENGINE_FORMS}.",
    )
    group.addoption(
        "--schedspec-profile",
        choices=PROFILE_CHOICES,
        default=None,
        help="Invariants to check (vllm-v1 and sglang also pick the engine's policy family) "
        "[default: the family profile the engine claims, else safety].",
    )
    group.addoption(
        "--schedspec-examples",
        type=int,
        default=None,
        metavar="N",
        help="Hypothesis examples [default: 100, or 2000 with SCHEDSPEC_LONG=1].",
    )
    group.addoption(
        "--schedspec-seed",
        type=int,
        default=None,
        metavar="S",
        help="Repeat a run exactly [default: a fresh seed, shown on failure].",
    )


@dataclass(frozen=True)
class SuiteOptions:
    """The command-line options, shared by the added item and the fixture."""

    profile: Profile | None
    examples: int | None
    seed: int | None

    @staticmethod
    def of(config: pytest.Config) -> SuiteOptions:
        examples = config.getoption("schedspec_examples")
        if examples is not None and examples < 1:
            raise pytest.UsageError(f"--schedspec-examples: must be >= 1, got {examples}")
        return SuiteOptions(
            config.getoption("schedspec_profile"), examples, config.getoption("schedspec_seed")
        )

    def settings(self) -> SuiteSettings:
        from schedspec.properties.suite import SuiteSettings

        long = os.environ.get("SCHEDSPEC_LONG") == "1"
        chosen = SuiteSettings.long() if long else SuiteSettings.quick()
        if self.examples is not None:
            chosen = replace(chosen, examples=self.examples)
        return replace(chosen, seed=self.seed)


def resolve_profile(factory: EngineFactory, name: str, requested: Profile | None) -> Profile:
    """The profile to check; ProfileError (a ValueError) if the engine does not claim
    the one asked for, or declares none; ValueError if it does not follow the family
    the profile asks for."""
    from schedspec.engines.profiles import choose_profile, probe_profiles
    from schedspec.engines.registry import run_family

    family = run_family([name], requested)
    return choose_profile([probe_profiles(factory, family)], requested)


def run_and_report(
    factory: EngineFactory, name: str, profile: Profile, options: SuiteOptions, trace_dir: Path
) -> tuple[SuiteResult, str | None]:
    """Run the suite, on the configs a registered engine runs by default; the failure
    report as one text, or None when it passed."""
    from schedspec.engines.registry import default_configs, load_config_strategy
    from schedspec.properties.failure_report import failure_report
    from schedspec.properties.suite import run_suite

    configs_name = default_configs((name,))
    configs = load_config_strategy(configs_name) if configs_name is not None else None
    result = run_suite(factory, profile, options.settings(), configs, trace_dir)
    if result.passed:
        return result, None
    header = f"schedspec: {name} broke profile {profile} (seed {result.seed})"
    return result, "\n".join([header, *failure_report(result, factory, name)])


# ----------------------------------------------------------- the added item


class SuiteFailedError(Exception):
    """The suite found a violation or a crash; the message is the whole report."""


class SchedspecItem(pytest.Item):
    def __init__(
        self, *, factory: EngineFactory, engine: str, profile: Profile, **kwargs: Any
    ) -> None:
        super().__init__(**kwargs)  # name, parent, nodeid: pytest's own
        self.factory = factory
        self.engine = engine
        self.profile = profile

    def runtest(self) -> None:
        # The invocation directory: where CI picks up artifacts, and where the
        # printed `schedspec replay` command is run from.
        trace_dir = self.config.invocation_params.dir
        options = SuiteOptions.of(self.config)
        _, report = run_and_report(self.factory, self.engine, self.profile, options, trace_dir)
        if report is not None:
            raise SuiteFailedError(report)

    def repr_failure(
        self,
        excinfo: pytest.ExceptionInfo[BaseException],
        style: object = None,
    ) -> str:
        if isinstance(excinfo.value, SuiteFailedError):
            return str(excinfo.value)  # the report says it all; pytest's traceback would not
        return str(super().repr_failure(excinfo))

    def reportinfo(self) -> tuple[Path, int | None, str]:
        return self.path, None, self.name


@pytest.hookimpl(tryfirst=True)  # before -k and -m deselect, so they apply to our item too
def pytest_collection_modifyitems(
    session: pytest.Session, config: pytest.Config, items: list[pytest.Item]
) -> None:
    engine = config.getoption("schedspec_engine")
    if engine is None:
        return
    from schedspec.engines.registry import load_engine_factory

    try:
        factory = load_engine_factory(engine)
        profile = resolve_profile(factory, engine, SuiteOptions.of(config).profile)
    except ValueError as err:
        # ProfileError's field: "profile" is the option's fault, "profiles" the adapter's.
        flag = (
            "--schedspec-profile"
            if getattr(err, "field", "") == "profile"
            else "--schedspec-engine"
        )
        raise pytest.UsageError(f"{flag}: {err}") from None
    name = f"schedspec[{engine}:{profile}]"
    item = SchedspecItem.from_parent(
        session, name=name, nodeid=name, factory=factory, engine=engine, profile=profile
    )
    items.append(item)
    # No collector produced the item, so report it as one would: the terminal's
    # "collected N items" (and any plugin counting collection) then includes it.
    report = pytest.CollectReport(name, "passed", None, [item])
    session.ihook.pytest_collectreport(report=report)


# ---------------------------------------------------------------- the fixture


class SuiteRunner:
    """Runs the suite on a factory; fails the calling test with the report on a violation."""

    def __init__(self, options: SuiteOptions, trace_dir: Path) -> None:
        self.options = options
        self.trace_dir = trace_dir

    def __call__(
        self,
        factory: EngineFactory | str,
        profile: Profile | None = None,
        *,
        examples: int | None = None,
        seed: int | None = None,
    ) -> SuiteResult:
        from schedspec.engines.registry import load_engine_factory

        if isinstance(factory, str):
            name, factory = factory, load_engine_factory(factory)
        else:
            name = f"{factory.__module__}:{getattr(factory, '__qualname__', factory)}"
        options = replace(
            self.options,
            examples=examples if examples is not None else self.options.examples,
            seed=seed if seed is not None else self.options.seed,
        )
        chosen = resolve_profile(factory, name, profile if profile is not None else options.profile)
        result, report = run_and_report(factory, name, chosen, options, self.trace_dir)
        if report is not None:
            pytest.fail(report, pytrace=False)
        return result


@pytest.fixture
def schedspec_suite(request: pytest.FixtureRequest, tmp_path: Path) -> SuiteRunner:
    """A callable: schedspec_suite(factory, profile=None, *, examples=None, seed=None).

    The --schedspec-profile/-examples/-seed options apply unless the call
    overrides them; a failure's trace goes to the test's tmp_path.
    """
    return SuiteRunner(SuiteOptions.of(request.config), tmp_path)


# ------------------------------------------------------- the test HypoFuzz runs


def fuzz_target(
    engine: str,
    profile: Profile | None = None,
    *,
    configs: str | None = None,
    settings: SuiteSettings | None = None,
) -> type[unittest.TestCase]:
    """The suite's state machine on `engine` as a unittest TestCase: assign it to a
    Test* name in a test module, and pytest runs it as one test, which HypoFuzz
    (`hypothesis fuzz -- THAT_MODULE`) can fuzz open-ended, coverage-guided.

    `engine` is a name as --schedspec-engine takes it, `profile` as
    --schedspec-profile (default: the family profile the engine claims, else safety),
    `configs` a module:strategy [default: the engine's own, else the suite's];
    `settings` give the examples and actions per example of a pytest run [default:
    SuiteSettings.quick(), the long profile with SCHEDSPEC_LONG=1] (HypoFuzz runs
    examples until it is stopped). The database is left to Hypothesis' default:
    HypoFuzz fuzzes only tests that use it. Engine calls have no step time limit here.
    """
    import hypothesis
    from hypothesis import HealthCheck

    from schedspec.engines.registry import (
        default_configs,
        load_config_strategy,
        load_engine_factory,
    )
    from schedspec.properties.harness import SingleEngine
    from schedspec.properties.state_machine import make_target_machine, rules_for
    from schedspec.properties.suite import ALL_PHASES, NO_SHRINK

    factory = load_engine_factory(engine)
    chosen_profile = resolve_profile(factory, engine, profile)
    configs_name = configs if configs is not None else default_configs((engine,))
    strategy = load_config_strategy(configs_name) if configs_name is not None else None
    chosen = settings if settings is not None else SuiteOptions(None, None, None).settings()
    machine = make_target_machine(SingleEngine(factory, chosen_profile), strategy)
    # Hypothesis names the test after the machine, HypoFuzz its dashboard's entry.
    machine.__name__ = machine.__qualname__ = f"Schedspec[{engine}:{chosen_profile}]"
    case: type[unittest.TestCase] = machine.TestCase
    case.settings = hypothesis.settings(  # type: ignore[attr-defined]
        max_examples=chosen.examples,
        stateful_step_count=rules_for(chosen.rules_per_example),
        deadline=None,
        suppress_health_check=list(HealthCheck),
        # The suite's phases: no explain phase (its tracing slows shrinking many times).
        phases=ALL_PHASES if chosen.shrink else NO_SHRINK,
    )
    return case
