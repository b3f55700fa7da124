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

A failure's trace goes to --schedspec-trace-dir where given (CI uploads that folder),
else the added item's to the directory pytest was started from and the fixture's to the
test's tmp_path.

Each resolves its run as the command line does (properties/run_plan.py: the engine,
the profile it claims, its default configs, the seed and the settings); a refusal of
the added item's is a usage error naming the option at fault. A failure shows the
violations, the shrunk counterexample step by step and the path of its trace file.
"""

from __future__ import annotations

import unittest
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from schedspec.engines.registry import ENGINE_FORMS
from schedspec.files import OutputPathError, prepare_output_dir
from schedspec.properties.run_plan import (
    RunPlan,
    RunPlanError,
    RunRequest,
    one_engine,
    resolve_plan,
)

if TYPE_CHECKING:
    # The plugin loads in every pytest run of an environment that has schedspec
    # installed; the harness (Hypothesis) is imported only when used, and run_plan
    # imports it only when a plan is completed.
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
    group.addoption(
        "--schedspec-trace-dir",
        type=Path,
        default=None,
        metavar="DIR",
        help="Write failure traces here, for the added test and the schedspec_suite fixture "
        "alike (created if missing) [default: the added test's to the directory pytest was "
        "started from, the fixture's to the test's tmp_path].",
    )


@dataclass(frozen=True)
class SuiteOptions:
    """The command-line options, shared by the added item and the fixture."""

    profile: Profile | None
    examples: int | None
    seed: int | None
    trace_dir: Path | None = None  # None: each way in has its own default

    @staticmethod
    def of(config: pytest.Config) -> SuiteOptions:
        examples = config.getoption("schedspec_examples")
        if examples is not None and examples < 1:
            raise pytest.UsageError(f"--schedspec-examples: must be >= 1, got {examples}")
        trace_dir: Path | None = config.getoption("schedspec_trace_dir")
        if trace_dir is not None:
            # Checked before any suite runs, so a finding is never lost to a bad path.
            try:
                prepare_output_dir(trace_dir)
            except OutputPathError as err:
                raise pytest.UsageError(f"--schedspec-trace-dir: {err}") from None
        return SuiteOptions(
            config.getoption("schedspec_profile"),
            examples,
            config.getoption("schedspec_seed"),
            trace_dir,
        )

    def request(self, engine: str) -> RunRequest:
        """What the options name for a run of `engine`, for run_plan to resolve."""
        return RunRequest(
            engines=one_engine(engine), profile=self.profile, seed=self.seed, examples=self.examples
        )


def usage_error(err: ValueError) -> pytest.UsageError:
    """A refusal to plan the run as a usage error naming the option at fault: the
    profile is --schedspec-profile's; the engine, what it claims, its default configs,
    or its refusal to be built in the family are --schedspec-engine's."""
    at_fault = isinstance(err, RunPlanError) and err.field == "profile"
    option = "--schedspec-profile" if at_fault else "--schedspec-engine"
    return pytest.UsageError(f"{option}: {err}")


def run_and_report(plan: RunPlan, trace_dir: Path) -> tuple[SuiteResult, str | None]:
    """Run the suite as planned; the failure report as one text, or None when it passed."""
    from schedspec.properties.failure_report import failure_report
    from schedspec.properties.suite import run_suite

    (factory,) = plan.factories
    (name,) = plan.request.names
    result = run_suite(factory, plan.profile, plan.settings, plan.config_strategy, trace_dir)
    if result.passed:
        return result, None
    header = f"schedspec: {name} broke profile {plan.profile} (seed {result.seed})"
    return result, "\n".join([header, *failure_report(result, factory, name)])


# ----------------------------------------------------------- the added item


class SuiteFailedError(Exception):
    """The suite found a violation or a crash; the message is the whole report."""


class SchedspecItem(pytest.Item):
    def __init__(self, *, plan: RunPlan, trace_dir: Path | None, **kwargs: Any) -> None:
        super().__init__(**kwargs)  # name, parent, nodeid: pytest's own
        self.plan = plan
        self.trace_dir = trace_dir

    def runtest(self) -> None:
        # By default the invocation directory: where the printed `schedspec replay`
        # command is run from.
        trace_dir = self.trace_dir or self.config.invocation_params.dir
        _, report = run_and_report(self.plan, trace_dir)
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
    options = SuiteOptions.of(config)
    try:
        plan = resolve_plan(options.request(engine))
    except ValueError as err:
        raise usage_error(err) from None
    name = f"schedspec[{engine}:{plan.profile}]"
    item = SchedspecItem.from_parent(
        session, name=name, nodeid=name, plan=plan, trace_dir=options.trace_dir
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
        if isinstance(factory, str):
            name, factories = factory, None
        else:
            name = f"{factory.__module__}:{getattr(factory, '__qualname__', factory)}"
            factories = (factory,)
        options = replace(
            self.options,
            profile=profile if profile is not None else self.options.profile,
            examples=examples if examples is not None else self.options.examples,
            seed=seed if seed is not None else self.options.seed,
        )
        plan = resolve_plan(options.request(name), factories)
        result, report = run_and_report(plan, self.trace_dir)
        if report is not None:
            pytest.fail(report, pytrace=False)
        return result


@pytest.fixture
def schedspec_suite(request: pytest.FixtureRequest, tmp_path: Path) -> SuiteRunner:
    """A callable: schedspec_suite(factory, profile=None, *, examples=None, seed=None).

    The --schedspec-profile/-examples/-seed options apply unless the call
    overrides them; a failure's trace goes to --schedspec-trace-dir, else to the test's
    tmp_path.
    """
    options = SuiteOptions.of(request.config)
    return SuiteRunner(options, options.trace_dir or tmp_path)


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

    from schedspec.properties.harness import SingleEngine
    from schedspec.properties.state_machine import make_target_machine, rules_for
    from schedspec.properties.suite import ALL_PHASES, NO_SHRINK

    plan = resolve_plan(RunRequest(engines=one_engine(engine), profile=profile, configs=configs))
    (factory,) = plan.factories
    chosen = settings if settings is not None else plan.settings
    machine = make_target_machine(SingleEngine(factory, plan.profile), plan.config_strategy)
    # Hypothesis names the test after the machine, HypoFuzz its dashboard's entry.
    machine.__name__ = machine.__qualname__ = f"Schedspec[{engine}:{plan.profile}]"
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
